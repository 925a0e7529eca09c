"""kill -9 at the moments where a run writes (TFRecords, training, a checkpoint, the export) and at random
times: the next run of the same command finishes with exactly the uninterrupted run's results and export, or
refuses with one clear line; nothing half-written is trusted."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, shared_path, tiny

pytestmark = pytest.mark.slow  # every test here runs a CLI or a subprocess

TINY = tiny(n_layer=1, d_model=16, d_head=8, d_inner=32)
SENTENCES = ["a gripping, beautifully acted film", "dull and far too long"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    (d / "cfg.json").write_text(json.dumps(TINY))
    (d / "data").mkdir()
    for split, rows in (("train", 3001), ("dev", 101)):
        lines = open(shared_path("glue", "SST-2", f"{split}.tsv"), encoding="utf-8").read().splitlines()
        (d / "data" / f"{split}.tsv").write_text("\n".join(lines[:rows]) + "\n", encoding="utf-8")
    return d


def command(d, name):
    out = d / name
    return out, [sys.executable, "run_classifier.py", "--task=SST-2", f"--data_dir={d / 'data'}",
                 f"--model_config_path={d / 'cfg.json'}", f"--spiece_model_file={shared_path('spiece', 'spiece.model')}",
                 f"--output_dir={out / 'run'}", f"--export_dir={out / 'export'}", "--max_seq_length=32",
                 "--train_batch_size=16", "--train_steps=12", "--save_steps=3", "--progress=false", "--do_train",
                 "--do_eval"]


def run(cmd):
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def serve(export):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    fn = tf.saved_model.load(str(export)).signatures["serving_default"]
    return fn(text_a=tf.constant(SENTENCES))["probabilities"].numpy()


def _writing(out, pid):
    """Which write of process ``pid`` is under way, from the temporaries it leaves while writing."""
    tmp = f".tmp-{pid}"
    for root, dirs, files in os.walk(out):
        for name in dirs:
            if name.startswith(tmp + "-"):
                return "export"
            if re.match(r"ckpt-\d+_temp$", name):
                return "checkpoint"
        for name in files:
            if name.endswith(tmp) and ".tfrecord" in name:
                return "tfrecords"
    return None


def kill_during(cmd, out, phase, deadline):
    """Starts ``cmd``, kills it (SIGKILL) when ``phase`` is seen under way (or at ``deadline`` seconds, for a
    phase given as a number); returns what was under way at the kill."""
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    t0, seen = time.time(), None
    while p.poll() is None:
        seen = _writing(out, p.pid)
        elapsed = time.time() - t0
        if (isinstance(phase, str) and seen == phase) or (not isinstance(phase, str) and elapsed >= phase) \
                or elapsed > deadline:
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    p.wait()
    return seen if p.returncode == -signal.SIGKILL else "finished before the kill"


@pytest.fixture(scope="module")
def reference(setup):
    out, cmd = command(setup, "reference")
    t0 = time.time()
    r = run(cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"seconds": time.time() - t0, "eval": json.loads((out / "run" / "eval_results.json").read_text()),
            "served": serve(out / "export")}


@pytest.mark.parametrize("phase", ["tfrecords", "checkpoint", "export", "random-1", "random-2"])
def test_killed_run_then_rerun_gives_the_uninterrupted_result(setup, reference, phase):
    out, cmd = command(setup, f"killed-{phase}")
    seconds = reference["seconds"]
    when = random.Random(phase).uniform(0.5, seconds) if phase.startswith("random") else phase
    seen = kill_during(cmd, out, when, deadline=seconds * 3)
    print(f"\n{phase}: killed while {seen or 'nothing was being written'}")
    r = run(cmd)
    if r.returncode == 2:  # a refusal is allowed, as one clear line
        lines = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        pytest.fail(f"the rerun refused: {lines[0]}")  # not expected for a same-command rerun
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "run" / "eval_results.json").read_text()) == reference["eval"]
    np.testing.assert_array_equal(serve(out / "export"), reference["served"])
    leftovers = [os.path.join(root, n) for root, dirs, files in os.walk(out) for n in dirs + files
                 if ".tmp-" in n or n.endswith("_temp")]
    assert not leftovers, leftovers
