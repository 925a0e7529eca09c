"""run_classifier.py end to end on the real GLUE / IMDB data (small models from random initialisation)."""

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, shared_path, tiny
from tests.subprocess_util import run_like_a_server

pytestmark = pytest.mark.slow  # every test here runs a CLI or a subprocess

TINY = tiny()


def run_cli(script, args, timeout=900, check=True):
    r = subprocess.run([sys.executable, script] + args, cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if check and r.returncode != 0:
        raise AssertionError(f"{script} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("cfg") / "config.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def base_args(task, data_dir, config_file, out, L=48, steps=20, extra=()):
    return [f"--task={task}", f"--data_dir={data_dir}", f"--model_config_path={config_file}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            f"--max_seq_length={L}", "--train_batch_size=32", f"--train_steps={steps}",
            f"--warmup_steps={max(steps // 10, 1)}", "--learning_rate=5e-4", "--progress=false",
            f"--save_steps={steps}", "--iterations=10"] + list(extra)


@pytest.fixture(scope="module")
def sst2_cache(tmp_path_factory):
    """The --cache_dir of the module's SST-2 runs: its 67,349 training sentences are tokenized once per
    --max_seq_length, not once per run (a run reuses only records valid for its data: task_features)."""
    return tmp_path_factory.mktemp("sst2_cache")


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory, config_file, sst2_cache):
    out = tmp_path_factory.mktemp("sst2")
    export = out / "export"
    args = base_args("SST-2", shared_path("glue", "SST-2"), config_file, out / "run", L=48, steps=400,
                     extra=["--do_train", "--do_eval", "--do_predict", f"--export_dir={export}",
                            f"--cache_dir={sst2_cache}"])
    run_cli("run_classifier.py", args)
    return out / "run", export


def test_sst2_learns_and_predicts(sst2_run):
    out, _ = sst2_run
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


def test_forced_collapse_warns_in_log_and_eval_results(config_file, sst2_cache, tmp_path):
    """A far too high learning rate (0.5) from random initialisation: every dev sentence gets one label. The run
    finishes (exit 0) but says so: a WARNING naming the collapse and its likely cause, and the JSON field."""
    r = run_cli("run_classifier.py", base_args("SST-2", shared_path("glue", "SST-2"), config_file, tmp_path, L=48,
                                               steps=60, extra=["--do_train", "--do_eval", "--learning_rate=0.5",
                                                                f"--cache_dir={sst2_cache}"]))
    health = json.loads((tmp_path / "eval_results.json").read_text())["health"]
    assert not health["healthy"], health
    assert any(w.startswith("collapsed predictions") for w in health["warnings"]), health
    assert max(health["predictions"]["predicted"].values()) >= 0.95
    assert any("learning rate 0.5 is high" in c for c in health["causes"]), health
    warned = [ln for ln in r.stderr.splitlines() if "NOT LEARNING?" in ln]
    assert warned and "learning rate 0.5" in warned[0], r.stderr[-3000:]


def test_export_fresh_process_matches_in_process_model(sst2_run, config_file, tmp_path):
    out, export = sst2_run
    dev = list(csv.reader(open(shared_path("glue", "SST-2", "dev.tsv")), delimiter="\t", quoting=csv.QUOTE_NONE))
    texts = [r[0] for r in dev[1:201]]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    run_like_a_server(
        f"m = tf.saved_model.load({str(export)!r})\n"
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        "out = m.signatures['serving_default'](text_a=tf.constant(texts))\n"
        f"np.save({str(tmp_path / 'probs.npy')!r}, out['probabilities'].numpy())", tmp_path)
    served = np.load(tmp_path / "probs.npy")

    import tensorflow as tf

    from tasks.classification.features import encode_texts
    from heads.classification import ClassificationHead
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
def test_glue_tasks_end_to_end(task, folder, metrics, predict, config_file, tmp_path):
    extra = ["--do_train", "--do_eval", "--jit=false"] + (["--do_predict"] if predict else [])
    run_cli("run_classifier.py", base_args(task, shared_path("glue", folder), config_file, tmp_path, L=32,
                                           steps=10, extra=extra))
    res = json.loads((tmp_path / "eval_results.json").read_text())
    assert metrics <= set(res) and res["step"] == 10
    assert all(np.isfinite(res[m]) for m in metrics)
    if predict:
        name = {"mrpc": "MRPC", "sts-b": "STS-B"}[task]
        rows = list(csv.reader(open(tmp_path / "predict" / f"{name}.tsv"), delimiter="\t"))
        assert len(rows) == {"mrpc": 1726, "sts-b": 1380}[task]


def test_imdb_end_to_end_from_tarball(config_file, tmp_path):
    tar = shared_path("imdb", "aclImdb_v1.tar.gz")
    run_cli("run_classifier.py", base_args("imdb", tar, config_file, tmp_path, L=32, steps=5,
                                           extra=["--do_train", "--do_eval", "--jit=false"]))
    res = json.loads((tmp_path / "eval_results.json").read_text())
    assert res["num_examples"] == 25000 and {"accuracy", "error_rate"} <= set(res)


def _model_tensors(prefix):
    """Every saved tensor (weights, optimizer slots, step, dropout seed) except the input iterator's state."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    names = [n for n in reader.get_variable_to_shape_map()
             if "iterator" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {n: reader.get_tensor(n) for n in names}


def test_killed_run_resumes_to_the_same_weights(config_file, sst2_cache, tmp_path):
    data = shared_path("glue", "SST-2")
    cache = sst2_cache
    common = ["--do_train", "--save_steps=10", f"--cache_dir={cache}", "--dropout=0.1", "--jit=false"]
    ref = base_args("sst-2", data, config_file, tmp_path / "ref", L=32, steps=30, extra=common)
    run_cli("run_classifier.py", ref + ["--save_steps=10"])
    # the same run, killed (SIGKILL) after its second checkpoint, then started again
    args = base_args("sst-2", data, config_file, tmp_path / "int", L=32, steps=30, extra=common)
    args += ["--save_steps=10"]
    proc = subprocess.Popen([sys.executable, "run_classifier.py"] + args, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "int" / "model" / "ckpt-20.index"
    deadline = time.time() + 600
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "int" / "model" / "ckpt-30.index").exists(), "the run finished before the kill"
    run_cli("run_classifier.py", args)
    a = _model_tensors(str(tmp_path / "ref" / "model" / "ckpt-30"))
    b = _model_tensors(str(tmp_path / "int" / "model" / "ckpt-30"))
    assert a.keys() == b.keys() and len(a) > 100
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_mirrored_two_cpus_matches_default_loss_curve(config_file, sst2_cache, tmp_path):
    """Fixed-shape batches (--length_buckets=false): a global batch of 32 is then exactly two per-replica batches
    of 16 (length groups would fill per replica batch size, so the batches would differ by construction)."""
    data = shared_path("glue", "SST-2")
    common = ["--do_train", "--dropout=0", "--dropatt=0", f"--cache_dir={sst2_cache}", "--jit=false",
              "--length_buckets=false"]
    run_cli("run_classifier.py", base_args("sst-2", data, config_file, tmp_path / "d", L=32, steps=15,
                                           extra=common))
    run_cli("run_classifier.py", base_args("sst-2", data, config_file, tmp_path / "m", L=32, steps=15,
                                           extra=common + ["--strategy=mirrored", "--num_cpu_devices=2"]))
    d = json.loads((tmp_path / "d" / "model" / "train_history.json").read_text())
    m = json.loads((tmp_path / "m" / "model" / "train_history.json").read_text())
    assert [s for s, _ in d] == [s for s, _ in m] == list(range(1, 16))
    # same global batches; only the order of float additions differs (per-replica sums, all-reduce)
    np.testing.assert_allclose([l for _, l in m], [l for _, l in d], rtol=1e-4, atol=1e-5)


def _digest(path):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            h.update(f.encode())
            h.update(open(os.path.join(root, f), "rb").read())
    return h.hexdigest()


def test_bad_inputs_fail_clearly_and_damage_nothing(sst2_run, config_file, tmp_path):
    out, export = sst2_run
    before = {p: _digest(p) for p in (out / "eval_results.json", export, out / "model")}

    def fail(args, *needles):
        r = run_cli("run_classifier.py", args, check=False)
        assert r.returncode == 2, r.stderr[-2000:]
        for n in needles:
            assert n in r.stderr, (n, r.stderr[-2000:])

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


def test_mirrored_with_accumulation_and_dropout_trains(config_file, sst2_cache, tmp_path):
    """Regression: advancing the dropout seed inside the accumulation loop must not need a cross-replica merge.
    Then the default length-grouped batches (each replica's of its own padded length) under the same strategy."""
    run_cli("run_classifier.py", base_args("sst-2", shared_path("glue", "SST-2"), config_file, tmp_path, L=32,
                                           steps=3, extra=["--do_train", "--grad_accum_steps=2", "--dropout=0.1",
                                                           "--strategy=mirrored", "--num_cpu_devices=2",
                                                           f"--cache_dir={sst2_cache}"]))
    history = json.loads((tmp_path / "model" / "train_history.json").read_text())
    assert [s for s, _ in history] == [1, 2, 3] and all(np.isfinite(l) for _, l in history)
    run_cli("run_classifier.py", base_args("sst-2", shared_path("glue", "SST-2"), config_file, tmp_path / "b", L=32,
                                           steps=3, extra=["--do_train", "--strategy=mirrored", "--num_cpu_devices=2",
                                                           f"--cache_dir={sst2_cache}"]))
    history = json.loads((tmp_path / "b" / "model" / "train_history.json").read_text())
    assert [s for s, _ in history] == [1, 2, 3] and all(np.isfinite(l) for _, l in history)
