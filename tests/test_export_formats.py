"""``export(path, format=...)``: the ONNX and OpenVINO exports (``tasks/export_formats.py``) answer raw text in a
process that imports neither TensorFlow nor xlnet_tf (only numpy and the runtime: onnxruntime +
onnxruntime-extensions, openvino + openvino-tokenizers), with the SavedModel's answers on real SST-2 sentences and
MRPC pairs (float32: logits and probabilities within 1e-5, the same labels); formats they cannot hold, and
unknown ones, are refused in one line. One tiny pair classifier (random weights, the real spiece.model) and its
three exports, shared by the module."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, shared_path, tiny
from tests.subprocess_util import finish

SERVED = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import serve
served = serve.load(sys.argv[1])
request = json.load(open(sys.argv[2]))
answers = []
for kwargs in request["calls"]:
    out = served(**kwargs)
    answers.append({k: [x.decode() if isinstance(x, bytes) else x for x in v.tolist()] for k, v in out.items()})
answers.append({"ids": served.encode(request["encode"])})
leaked = [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "xlnet_tf", "keras", "tensorflow_text")]
assert not leaked, leaked
print(json.dumps(answers))
"""


def _rows(task, n):
    lines = open(shared_path("glue", task, "dev.tsv"), encoding="utf-8-sig").read().splitlines()[1:n + 1]
    cells = [line.split("\t") for line in lines]
    return [c[0] for c in cells] if task == "SST-2" else [(c[3], c[4]) for c in cells]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """The tiny pair classifier, its SavedModel answers to the requests, and its ONNX and OpenVINO exports."""
    import keras
    import tensorflow as tf

    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.tasks import XLNetClassifier

    keras.utils.set_random_seed(7)
    model = XLNetClassifier(XLNetConfig(**tiny()), num_classes=2, tokenizer=shared_path("spiece", "spiece.model"),
                            max_seq_length=64, label_names=["negative", "positive"], pair=True)
    sst2, mrpc = _rows("SST-2", 40), _rows("MRPC", 40)
    # single texts (text_b empty: the single-text layout), pairs in length groups, one pair alone (its own length)
    requests = [(sst2, [""] * len(sst2)), ([a for a, _ in mrpc], [b for _, b in mrpc]), ([mrpc[3][0]], [mrpc[3][1]])]
    root = tmp_path_factory.mktemp("formats")
    model.export(str(root / "saved"))
    served = tf.saved_model.load(str(root / "saved")).signatures["serving_default"]
    expected = [{k: v.numpy() for k, v in served(text_a=tf.constant(a), text_b=tf.constant(b)).items()}
                for a, b in requests]
    for fmt in ("onnx", "openvino"):
        model.export(str(root / fmt), format=fmt)
    (root / "requests.json").write_text(json.dumps({"calls": [{"text_a": a, "text_b": b} for a, b in requests],
                                                    "encode": sst2[:8]}))
    ids = [model.tokenizer.encode(t) for t in sst2[:8]]
    return root, expected, ids


@pytest.fixture(scope="module")
def race_exports(tmp_path_factory):
    """A tiny RACE model (random weights), its SavedModel answers to real dev questions, its two exports."""
    import keras
    import tensorflow as tf

    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.tasks import XLNetMultipleChoice
    from xlnet_tf.tasks.race.reader import read_race

    keras.utils.set_random_seed(7)
    model = XLNetMultipleChoice(XLNetConfig(**tiny()), tokenizer=shared_path("spiece", "spiece.model"),
                                max_seq_length=128, max_qa_length=32)
    exs = read_race(shared_path("race", "RACE.tar.gz"), "dev")[::97][:12]
    calls = [{"article": [e.article for e in exs], "question": [e.question for e in exs],
              "options": [list(e.options) for e in exs]}, {"article": [exs[0].article],
              "question": [exs[0].question], "options": [list(exs[0].options)]}]
    root = tmp_path_factory.mktemp("race_formats")
    model.export(str(root / "saved"))
    served = tf.saved_model.load(str(root / "saved")).signatures["serving_default"]
    expected = [{k: v.numpy() for k, v in served(**{n: tf.constant(x) for n, x in c.items()}).items()} for c in calls]
    for fmt in ("onnx", "openvino"):
        model.export(str(root / fmt), format=fmt)
    (root / "requests.json").write_text(json.dumps({"calls": calls, "encode": calls[1]["question"]}))
    return root, expected, [model.tokenizer.encode(calls[1]["question"][0])]


def _serve_without_tensorflow(root, fmt, expected, ids):
    proc = subprocess.Popen([sys.executable, "-c", SERVED, str(root / fmt), str(root / "requests.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root),
                            env=dict(os.environ, PYTHONPATH=""))
    out, _ = finish(proc, timeout=300)
    answers = json.loads(out.strip().splitlines()[-1])
    assert answers.pop()["ids"] == ids  # the runtime's SentencePiece + the runner's rules = XLNetTokenizer.encode
    for want, got in zip(expected, answers):
        assert set(got) == set(want)
        for k, v in want.items():
            if v.dtype.kind in "SO":
                assert got[k] == [x.decode() for x in v.tolist()], k
            elif v.dtype.kind == "f":
                np.testing.assert_allclose(np.array(got[k]), v, atol=1e-5, rtol=0, err_msg=k)
            else:
                assert got[k] == v.tolist(), k


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_an_export_serves_raw_text_without_tensorflow_as_the_saved_model(exports, fmt):
    root, expected, ids = exports
    info = json.loads((root / fmt / "serving_info.json").read_text())
    assert info["format"] == fmt and info["inputs"] == ["text_a", "text_b"]
    _serve_without_tensorflow(root, fmt, expected, ids)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_a_race_export_serves_raw_text_without_tensorflow_as_the_saved_model(race_exports, fmt):
    root, expected, ids = race_exports
    info = json.loads((root / fmt / "serving_info.json").read_text())
    assert info["inputs"] == ["article", "question", "options"] and info["outputs"] == ["choice", "probabilities"]
    _serve_without_tensorflow(root, fmt, expected, ids)


@pytest.mark.parametrize("fmt, message", [
    ("litert", "export format 'litert': not available (XLNet's in-graph SentencePiece and dynamic lengths have no "
               "TFLite builtin ops); accepted: tf_saved_model, onnx, openvino"),
    ("onnxx", "export format 'onnxx': unknown; accepted: tf_saved_model, onnx, openvino")])
def test_an_unknown_or_unservable_format_is_refused_in_one_line(fmt, message):
    from xlnet_tf.tasks.export_formats import check_format

    with pytest.raises(ValueError) as e:
        check_format(fmt)
    assert str(e.value) == message


def test_memory_mode_and_other_tasks_are_refused_in_one_line():
    from xlnet_tf.tasks.export_formats import check_format

    with pytest.raises(ValueError, match=r"^export format 'onnx': memory mode .* SavedModel only"):
        check_format("onnx", memory=True)
    with pytest.raises(ValueError, match=r"^export format 'openvino': the SQuAD export is a SavedModel only"):
        check_format("openvino", task="SQuAD")
    assert check_format("onnx", task="race") == "onnx"


def test_the_command_line_refuses_a_format_before_any_work(glue, tmp_path):
    """``--export_format``: an unknown or unservable format is one ``error:`` line before any feature or checkpoint
    is written; so is a format the task's export cannot be written in (memory mode here)."""
    import run_classifier
    from tests.cli_util import refused
    from tests.conftest import glue_args, records

    out = tmp_path / "run"
    args = glue_args(glue, "SST-2", out, f"--export_dir={tmp_path / 'export'}")
    line = refused(run_classifier, *args, "--export_format=litert")
    assert line.startswith("error: --export_format: export format 'litert': not available"), line
    line = refused(run_classifier, *args, "--export_format=savedmodel")
    assert line == ("error: --export_format: export format 'savedmodel': unknown; accepted: tf_saved_model, onnx, "
                    "openvino"), line
    line = refused(run_classifier, *args, "--export_format=onnx", "--long_doc_mode=memory", "--max_segments=2")
    assert "export format 'onnx': memory mode" in line, line
    assert records(out) == [] and not (out / "model").exists() and not (tmp_path / "export").exists()
