"""``export(path, format=...)``: the ONNX and OpenVINO exports (``tasks/export_formats.py``) answer raw text in a
process that imports neither TensorFlow nor xlnet_tf (only numpy and the runtime: onnxruntime +
onnxruntime-extensions, openvino + openvino-tokenizers), with the SavedModel's answers on real SST-2 sentences,
MRPC pairs, RACE and SQuAD v2.0 dev questions (float32: scores within 1e-5; the same labels, dtypes and shapes; the
same SQuAD answer texts and character offsets); formats they cannot hold, and unknown ones, are refused in one
line. One tiny model per task (random weights, the real spiece.model) and its three exports, shared by the
module."""

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
    answers.append({k: [str(v.dtype), list(v.shape), [x.decode() if isinstance(x, bytes) else x for x in v.tolist()]]
                    for k, v in out.items()})
last = {"ids": served.encode(request["encode"])}
if "squad" in request:  # each context piece's characters in its context, the windows' rows and max-context positions
    tokens = serve.context_tokens(served, request["squad"]["context"])
    rows, windows = serve.squad_windows([t[0] for t in tokens], served.encode(request["squad"]["question"]),
                                        served.layout)
    last["squad"] = [[list(t[1:]) for t in tokens], [list(r) for r in rows],
                     [w[:3] + [sorted(w[3])] for w in windows]]
    try:  # one context instead of a list
        served(question=["Who?"], context="Ann did.")
    except ValueError as e:
        last["squad"].append(str(e))
for kwargs in request.get("refusals", []):  # what the SavedModel's signature refuses, refused in one line
    try:
        served(**kwargs)
        last.setdefault("refused", []).append(None)
    except (TypeError, ValueError) as e:
        last.setdefault("refused", []).append(f"{type(e).__name__}: {e}")
answers.append(last)
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
    refusals = [{"text_a": sst2[:2]}, {"text_a": ["a", None], "text_b": ["b", "c"]}]
    (root / "requests.json").write_text(json.dumps({"calls": [{"text_a": a, "text_b": b} for a, b in requests],
                                                    "encode": sst2[:8], "refusals": refusals}))
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


def _squad_questions():
    """Real SQuAD v2.0 dev questions: unanswerable and answerable ones, contexts with accents or other non-ASCII
    characters, with digit-comma numbers ("1,000,"); each context several windows of the model below."""
    import re

    from xlnet_tf.tasks.squad.reader import read_squad

    picks = {"impossible": [], "answerable": [], "unicode": [], "digits": []}
    for ex in read_squad(shared_path("squad", "dev-v2.0.json")):
        kind = ("unicode" if not ex.context.isascii() else "digits" if re.search(r"\d,\d", ex.context)
                else "impossible" if ex.is_impossible else "answerable")
        if len(picks[kind]) < 5 and all(ex.context != e.context for e in picks[kind]):
            picks[kind].append(ex)
    return [(e.question, e.context) for kind in picks.values() for e in kind]


# Edge cases beside the real questions: an empty and a blank context, accents, LaTeX quotes, Greek capitals, digit
# commas, SentencePiece's own normalisation (a zero-width space, a byte-order mark, "½", an unknown character run).
SQUAD_EDGES = [("What?", ""), ("Who?", " \t "),
               ("Who wrote it?", "Caf\u00e9 na\u00efve \u00bd ``quoted'' \u03a3\u0391\u03a3 \u039f\u0394\u039f\u03a3 "
                                 "wrote 1,000,000, pages in 12, 3,4, days."),
               ("Where?", "x\u200b\u200by \ufeffin \u2603\u2604 the \u00c5ngstr\u00f6m lab, 1,5,")]


@pytest.fixture(scope="module")
def squad_exports(tmp_path_factory):
    """A tiny SQuAD model (random weights; windows of 64 pieces, stride 24), its SavedModel answers to real dev
    questions and the edge cases, its ONNX export (``export(format=)``) and its OpenVINO one (``run_squad.py``'s
    path, ``SquadRun.export``)."""
    import keras
    import tensorflow as tf

    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.tasks import XLNetQuestionAnswerer
    from xlnet_tf.tasks.runner import TaskOptions
    from xlnet_tf.tasks.squad.run import SquadOptions, SquadRun

    keras.utils.set_random_seed(7)
    options = SquadOptions(max_query_length=16, doc_stride=24, max_answer_length=8)
    model = XLNetQuestionAnswerer(XLNetConfig(**tiny()), tokenizer=shared_path("spiece", "spiece.model"),
                                  max_seq_length=64, max_query_length=16, doc_stride=24, max_answer_length=8)
    pairs = _squad_questions() + SQUAD_EDGES
    calls = [{"question": [q for q, _ in pairs], "context": [c for _, c in pairs]},
             {"question": [pairs[0][0]], "context": [pairs[0][1]]}, {"question": [], "context": []}]
    root = tmp_path_factory.mktemp("squad_formats")
    model.export(str(root / "saved"))
    served = tf.saved_model.load(str(root / "saved")).signatures["serving_default"]
    expected = [{k: v.numpy() for k, v in served(**{n: tf.constant(x, tf.string) for n, x in c.items()}).items()}
                for c in calls]
    model.export(str(root / "onnx"), format="onnx")
    spec = SquadRun(None, None, True, options, TaskOptions(tokenizer=model.tokenizer, config=model.config,
                                                             max_seq_length=64, cache_dir=str(root)))
    spec.check_export("openvino")  # the command line's check before any work: SQuAD takes every format now
    spec.export(model, str(root / "openvino"), "openvino")
    (root / "requests.json").write_text(json.dumps({"calls": calls, "encode": calls[0]["question"][:4],
                                                    "squad": calls[0]}))
    return root, expected, [model.tokenizer.encode(q) for q in calls[0]["question"][:4]], _squad_layout(model,
                                                                                                       calls[0])


def _squad_layout(model, call):
    """The SavedModel's in-graph pieces' character spans and windows (``SquadServing.features``), as the runner
    gives them: [[starts, ends] per context], [(tokens, segments, p_mask) per window], [[example, doc_start,
    paragraph_len, max-context positions] per window], and the runner's refusal of one string for a list."""
    feats, windows, tokens = model.serving_module().features(call["question"], call["context"])
    f = {k: v.numpy().tolist() for k, v in feats.items()}
    n = [sum(m) for m in f["padding_mask"]]
    rows = [[f[k][w][:n[w]] for k in ("input_ids", "segment_ids", "p_mask")] for w in range(len(n))]
    info = [[int(windows[k][w]) for k in ("example_index", "doc_start", "paragraph_len")]
            + [[p for p, mine in enumerate(windows["max_context"][w].numpy().tolist()) if mine]] for w in range(len(n))]
    return [[list(t) for t in zip(tokens["starts"].to_list(), tokens["ends"].to_list())], rows, info,
            "context: expected a list of rows, got one string 'Ann did.'"]


def _serve_without_tensorflow(root, fmt, expected, ids, squad=None, refused=None):
    proc = subprocess.Popen([sys.executable, "-c", SERVED, str(root / fmt), str(root / "requests.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root),
                            env=dict(os.environ, PYTHONPATH=""))
    out, _ = finish(proc, timeout=300)
    answers = json.loads(out.strip().splitlines()[-1])
    last = answers.pop()
    assert last["ids"] == ids  # the runtime's SentencePiece + the runner's rules = XLNetTokenizer.encode
    assert last.get("squad") == squad
    assert last.get("refused") == refused
    assert len(answers) == len(expected)
    for want, got in zip(expected, answers):
        assert set(got) == set(want)
        for k, v in want.items():
            dtype, shape, got[k] = got[k]
            assert (dtype, shape) == (str(v.dtype), list(v.shape)), k
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
    _serve_without_tensorflow(root, fmt, expected, ids, refused=[
        "ValueError: text_b: this export reads pairs (text_a, text_b); text_b is missing",
        "TypeError: text_a[1]: a text (str) is expected, got NoneType None"])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_a_race_export_serves_raw_text_without_tensorflow_as_the_saved_model(race_exports, fmt):
    root, expected, ids = race_exports
    info = json.loads((root / fmt / "serving_info.json").read_text())
    assert info["inputs"] == ["article", "question", "options"] and info["outputs"] == ["choice", "probabilities"]
    _serve_without_tensorflow(root, fmt, expected, ids)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_a_squad_export_answers_as_the_saved_model_without_tensorflow(squad_exports, fmt):
    """The same answer texts and character offsets, has_answer and scores (within 1e-5) on real dev questions
    (contexts of several windows, length groups) and the edge cases; one question alone; an empty request."""
    root, expected, ids, layout = squad_exports
    info = json.loads((root / fmt / "serving_info.json").read_text())
    assert info["inputs"] == ["question", "context"] and set(info["outputs"]) == set(expected[0])
    constants = json.loads((root / fmt / "layout.json").read_text())
    assert (constants["task"], constants["doc_stride"], constants["null_threshold"]) == ("squad", 24, 0.0)
    found = expected[0]["answer_start"] >= 0
    assert found.sum() > 10 and not found[-4:-2].any()  # spans found; none in the empty and blank contexts
    assert max(w[0] for w in layout[2]) == len(found) - 1 and len(layout[2]) > 3 * len(found)  # several windows each
    _serve_without_tensorflow(root, fmt, expected, ids, layout)


@pytest.mark.slow
def test_each_openvino_export_holds_its_layer_norms_as_mvn_nodes(exports, race_exports, squad_exports):
    """``layer_norms_as_mvn``: the classifier's, RACE's and SQuAD's OpenVINO graphs hold two MVN nodes per layer
    (attention and feed-forward LayerNorms) and none of ``tf.nn.moments``' SquaredDifference left in the layers
    (SQuAD's head keeps its Keras LayerNormalization, another form); their answers are the SavedModel's (the
    tests above)."""
    import re

    for root in (exports[0], race_exports[0], squad_exports[0]):
        xml = (root / "openvino" / "model.xml").read_text()
        layers = re.findall(r'<layer [^>]*name="([^"]*)" type="([A-Za-z]+)"', xml)
        assert [t for _, t in layers].count("MVN") == 2 * tiny()["n_layer"], root
        assert not [n for n, t in layers if t == "SquaredDifference" and "/layer_" in n], root


@pytest.mark.slow
def test_each_openvino_export_computes_the_layers_shape_arithmetic_once(exports, race_exports, squad_exports):
    """``shape_arithmetic_shared``: in the classifier's and SQuAD's OpenVINO graphs the layers after the first read
    the first layer's shapes: no ShapeOf of their own (each layer took ``tf.shape`` of its own input again, and
    built its reshape targets from it). RACE's layers run on batch x 4 rows, a product OpenVINO's shape inference
    leaves unnamed: there only the feed-forward's reshape back keeps its own. The classifier's and RACE's last
    layer runs its feed-forward on the last position alone (``last_position_only``): its own shape there. Their
    answers are the SavedModel's (the tests above)."""
    import re

    layer = lambda name: int(re.search(r"/layer_(\d+)", name).group(1))  # noqa: E731
    for root, kept, last_row in ((exports[0], (), True), (race_exports[0], ("/ff_1/Shape",), True),
                                 (squad_exports[0], (), False)):
        xml = (root / "openvino" / "model.xml").read_text()
        shape_of = [n for n, t in re.findall(r'<layer [^>]*name="([^"]*)" type="([A-Za-z]+)"', xml) if t == "ShapeOf"]
        assert [n for n in shape_of if "/layer_0" in n], root  # the first layer's, kept
        last = max(layer(n) for n in re.findall(r'<layer [^>]*name="([^"]*/layer_\d+[^"]*)"', xml))
        own = [n for n in shape_of if re.search(r"/layer_[1-9]", n) and not n.endswith(kept)
               and not (last_row and layer(n) == last and n.endswith("/ff_1/Shape"))]
        assert not own, root


def test_the_runner_finds_sentencepieces_offsets_without_it():
    """``serve.py``'s ``piece_spans`` (the pieces laid over its emulation of SentencePiece's normalizer) gives
    SentencePiece's own offsets on strings of what the normalizer changes: spaces and controls it drops or
    collapses, NFKC, marks it composes (Hangul jamo too), unknown runs; a normalizer it does not know (pieces the
    emulation does not produce) still gets spans in order."""
    import importlib.util
    import random

    from xlnet_tf.tasks.squad.features import _OffsetEncoder
    from xlnet_tf.tokenizer import XLNetTokenizer

    spec = importlib.util.spec_from_file_location("serve_runtime", os.path.join(REPO, "tasks", "serve_runtime.py"))
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    encode = _OffsetEncoder(XLNetTokenizer(shared_path("spiece", "spiece.model")).sp)
    rng = random.Random(0)
    alphabet = list("ab 01,.\t``''") + [chr(c) for c in (0x301, 0x308, 0x327, 0xe9, 0xbd, 0xfb01, 0x3000, 0x7, 0x200b,
                                                        0x200e, 0xfeff, 0x2603, 0x1100, 0x1161, 0x11a8, 0x4e2d)]
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        pieces, ids, spans = encode(text)
        pieces = ["<unk>" if i == 0 else p for p, i in zip(pieces, ids)]  # an unknown run's piece: its surface
        assert runner.piece_spans(text, pieces) == spans, text
    assert runner.piece_spans("x\u00bd y", ["\u2581x", "\u00bd", "\u2581y"]) == [(0, 1), (1, 2), (2, 4)]


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
    with pytest.raises(ValueError, match=r"^export format 'openvino': the generation export is a SavedModel only"):
        check_format("openvino", task="generation")
    assert check_format("onnx", task="race") == check_format("onnx", task="squad") == "onnx"


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
