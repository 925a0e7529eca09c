"""run_classifier.py end to end on the real GLUE / IMDB data (small models from random initialisation), through its
``main`` in-process (tests/cli_util.py); a process only where it is the point (logical CPU devices for
MirroredStrategy, a fresh process serving the SavedModel). The finished SST-2 run is the session's
(``conftest.sst2_run``); kill -9 and exact resume: tests/test_faults.py."""

import csv
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import REPO, classifier_args as base_args, shared_path, tiny
from tests.subprocess_util import run_like_a_server

TINY = tiny()


@pytest.fixture(scope="module")
def config_file(tiny_config_file):
    return tiny_config_file


@pytest.mark.outcome
def test_sst2_learns_and_predicts(sst2_run):
    out = sst2_run.dir
    res = json.loads((out / "eval_results.json").read_text())
    assert res["step"] == 400 and res["num_examples"] == 872
    # majority class on SST-2 dev: 444/872 = 0.509. Measured: ~0.78 at 400 steps, 0.80 at 600 (seq 64).
    assert res["accuracy"] > 0.70, res
    rows = list(csv.reader(open(out / "predict" / "SST-2.tsv"), delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 1822
    assert {r[1] for r in rows[1:]} <= {"0", "1"}
    history = json.loads((out / "model" / "train_history.json").read_text())
    assert np.mean([l for _, l in history[-50:]]) < np.mean([l for _, l in history[:20]]) - 0.1
    # a healthy run does not warn (tasks/health.py)
    health = res["health"]
    assert health["healthy"] and health["warnings"] == [] and health["loss_trend"]["fell"], health
    assert set(health["predictions"]["predicted"]) == {"0", "1"} and health["predictions"]["share_without_text"] == 0


@pytest.mark.slow
def test_forced_collapse_warns_in_log_and_eval_results(config_file, sst2_cache, tmp_path):
    """A far too high learning rate (0.5) from random initialisation: every dev sentence gets one label. The run
    finishes (exit 0) but says so: a WARNING naming the collapse and its likely cause, and the JSON field."""
    r = succeeds(run_classifier, *base_args("SST-2", shared_path("glue", "SST-2"), config_file, tmp_path, L=48,
                                            steps=60, extra=["--do_train", "--do_eval", "--learning_rate=0.5",
                                                             f"--cache_dir={sst2_cache}"]))
    health = json.loads((tmp_path / "eval_results.json").read_text())["health"]
    assert not health["healthy"], health
    assert any(w.startswith("collapsed predictions") for w in health["warnings"]), health
    assert max(health["predictions"]["predicted"].values()) >= 0.95
    assert any("learning rate 0.5 is high" in c for c in health["causes"]), health
    warned = [ln for ln in r.stderr.splitlines() if "NOT LEARNING?" in ln]
    assert warned and "learning rate 0.5" in warned[0], r.stderr[-3000:]


@pytest.mark.slow
def test_export_fresh_process_matches_in_process_model(sst2_run, config_file, tmp_path):
    """The SavedModel in a fresh process with only tensorflow + tensorflow_text: the in-process model's
    probabilities on 200 raw dev sentences, and a request that is not UTF-8 refused naming its row."""
    out, export = sst2_run.dir, sst2_run.export
    dev = list(csv.reader(open(shared_path("glue", "SST-2", "dev.tsv")), delimiter="\t", quoting=csv.QUOTE_NONE))
    texts = [r[0] for r in dev[1:201]]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    run_like_a_server(
        f"m = tf.saved_model.load({str(export)!r})\n"
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        "serve = m.signatures['serving_default']\n"
        "out = serve(text_a=tf.constant(texts))\n"
        f"np.save({str(tmp_path / 'probs.npy')!r}, out['probabilities'].numpy())\n"
        "try:\n"
        "    serve(text_a=tf.constant([b'a fine film', b'\\xff\\xfe bad']))\n"
        "    raise SystemExit('invalid UTF-8 got a label')\n"
        "except tf.errors.InvalidArgumentError as e:\n"
        "    assert 'input is not valid UTF-8: row 1' in e.message, e.message\n", tmp_path)
    served = np.load(tmp_path / "probs.npy")

    import tensorflow as tf

    from xlnet_tf.tasks.classification.features import encode_texts
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf import XLNetConfig, XLNetTokenizer
    from xlnet_tf.finetune import FineTuner

    cfg = XLNetConfig.from_json_file(config_file)
    tok = XLNetTokenizer(shared_path("spiece", "spiece.model"))
    ft = FineTuner(cfg, lambda: ClassificationHead(cfg.d_model, 2, task_name="sst-2"),
                   {"input_ids": ("int64", (48,)), "segment_ids": ("int64", (48,)),
                    "padding_mask": ("int64", (48,))})
    model = ft.model_for_inference(str(out / "model"))
    feats = encode_texts(tok, texts, None, 48)
    probs = tf.nn.softmax(model(feats)["logits"]).numpy()
    assert np.abs(probs - served).max() <= 1e-5


@pytest.mark.parametrize("task,folder,metrics,predict", [
    ("cola", "CoLA", {"mcc", "accuracy"}, False),
    ("mrpc", "MRPC", {"accuracy", "f1"}, True),
    ("rte", "RTE", {"accuracy"}, False),
    ("sts-b", "STS-B", {"pearson", "spearman"}, True),
])
@pytest.mark.slow
def test_glue_tasks_end_to_end(task, folder, metrics, predict, config_file, tmp_path):
    extra = ["--do_train", "--do_eval", "--jit=false"] + (["--do_predict"] if predict else [])
    succeeds(run_classifier, *base_args(task, shared_path("glue", folder), config_file, tmp_path, L=32, steps=10,
                                        extra=extra))
    res = json.loads((tmp_path / "eval_results.json").read_text())
    assert metrics <= set(res) and res["step"] == 10
    assert all(np.isfinite(res[m]) for m in metrics)
    if predict:
        name = {"mrpc": "MRPC", "sts-b": "STS-B"}[task]
        rows = list(csv.reader(open(tmp_path / "predict" / f"{name}.tsv"), delimiter="\t"))
        assert len(rows) == {"mrpc": 1726, "sts-b": 1380}[task]


@pytest.mark.slow
def test_imdb_end_to_end_from_tarball(config_file, tmp_path):
    tar = shared_path("imdb", "aclImdb_v1.tar.gz")
    succeeds(run_classifier, *base_args("imdb", tar, config_file, tmp_path, L=32, steps=5,
                                        extra=["--do_train", "--do_eval", "--jit=false"]))
    res = json.loads((tmp_path / "eval_results.json").read_text())
    assert res["num_examples"] == 25000 and {"accuracy", "error_rate"} <= set(res)


MIRRORED = """
import json, sys
import run_classifier
for args in json.loads(sys.argv[1]):
    result = run_classifier.main(["run_classifier.py"] + args)
    assert result.code == 0, result
"""


@pytest.mark.slow
def test_mirrored_two_cpus(config_file, glue, tmp_path):
    """MirroredStrategy over 2 logical CPUs (a process of its own: logical devices exist only before TensorFlow
    initialises), two runs in that one process:
    (1) fixed-shape batches (--length_buckets=false), no dropout: the loss curve equals the default strategy's
    (in-process here): a global batch of 32 is exactly two per-replica batches of 16;
    (2) the default length-grouped batches (each replica's of its own padded length) with dropout and gradient
    accumulation (regression: advancing the dropout seed inside the accumulation loop must not need a
    cross-replica merge).
    On the ``glue`` fixture's 40 SST-2 sentences: the point is the strategy, not the data."""
    data = glue / "SST-2"
    common = ["--do_train", "--dropout=0", "--dropatt=0", "--jit=false", "--length_buckets=false"]
    mirrored = ["--strategy=mirrored", "--num_cpu_devices=2"]
    runs = [base_args("sst-2", data, config_file, tmp_path / "m", L=32, steps=15, extra=common + mirrored),
            base_args("sst-2", data, config_file, tmp_path / "acc", L=32, steps=3,
                      extra=["--do_train", "--grad_accum_steps=2", "--dropout=0.1"] + mirrored)]
    proc = subprocess.Popen([sys.executable, "-c", MIRRORED, json.dumps([[str(a) for a in r] for r in runs])],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        succeeds(run_classifier, *base_args("sst-2", data, config_file, tmp_path / "d", L=32, steps=15,
                                            extra=common))
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    history = {name: json.loads((tmp_path / name / "model" / "train_history.json").read_text())
               for name in ("d", "m", "acc")}
    d, m = history["d"], history["m"]
    assert [s for s, _ in d] == [s for s, _ in m] == list(range(1, 16))
    # same global batches; only the order of float additions differs (per-replica sums, all-reduce)
    np.testing.assert_allclose([l for _, l in m], [l for _, l in d], rtol=1e-4, atol=1e-5)
    assert [s for s, _ in history["acc"]] == [1, 2, 3] and all(np.isfinite(l) for _, l in history["acc"])


def _digest(path):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            h.update(f.encode())
            h.update(open(os.path.join(root, f), "rb").read())
    return h.hexdigest()


@pytest.mark.slow
def test_bad_inputs_fail_clearly_and_damage_nothing(sst2_run, config_file, tmp_path):
    out, export = sst2_run.dir, sst2_run.export
    before = {p: _digest(p) for p in (out / "eval_results.json", export, out / "model")}

    def fail(args, *needles):
        line = refused(run_classifier, *args)
        for n in needles:
            assert n in line, (n, line)

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.tsv").write_text("sentence\tlabel\ngood movie\t1\nno label column here\n")
    (bad / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    common = ["--do_train", "--do_eval", f"--export_dir={export}"]
    # into the finished run's directory: refused (another training set), nothing touched
    fail(base_args("sst-2", bad, config_file, out, extra=common), "differs in: train_data")
    fresh = tmp_path / "fresh"
    fail(base_args("sst-2", bad, config_file, fresh, extra=common), str(bad / "train.tsv"), "line 3")
    (bad / "train.tsv").write_text("sentence\tlabel\ngood movie\t7\n")
    fail(base_args("sst-2", bad, config_file, fresh, extra=common), "line 2", "'label'", "'7'")
    (bad / "train.tsv").write_text("")
    fail(base_args("sst-2", bad, config_file, fresh, extra=common), str(bad / "train.tsv"))
    fail(base_args("no-such-task", bad, config_file, out, extra=common), "no-such-task", "sst-2")
    # a checkpoint of the wrong size: our format saved from a d_model=32 model
    from xlnet_tf import XLNetConfig, XLNetModel

    small = tmp_path / "small_ckpt"
    XLNetModel(XLNetConfig(**dict(TINY, d_model=32, d_head=16))).save_pretrained(str(small))
    fail(base_args("sst-2", shared_path("glue", "SST-2"), config_file, tmp_path / "fresh2",
                   extra=common + [f"--init_checkpoint={small}"]), "d_model", "64", "32")
    after = {p: _digest(p) for p in before}
    assert after == before
