"""kill -9 at the moments where a run writes (TFRecords, training, a checkpoint, the export) and at random
times: the next run of the same command picks up what the killed one left, and the last one finishes with exactly
the uninterrupted run's results, export and every saved tensor (weights, Adam slots, step, dropout seed), or
refuses with one clear line; nothing half-written is trusted. One folder takes the kills in turn (each run after a
kill starts from what the killed one left, so each kill's leftovers are read by a real rerun, and one training run
carries every check); the killed runs are processes (kill -9 is the point), and so are the uninterrupted reference
(its duration sets the random kill times; started in the background while the first kill runs) and the last rerun,
every one with TensorFlow's own thread pools as a user's run has them (not the suite workers' share of the CPUs:
``conftest.default_threads``). Ctrl-C (SIGINT) ends a run in one line saying where to resume from, and the run
resumes from any working directory."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.conftest import REPO, TINIEST, default_threads, glue_args, shared_path
from tests.subprocess_util import ctrl_c_reaches_it

pytestmark = pytest.mark.slow  # every test here kills a process

SENTENCES = ["a gripping, beautifully acted film", "dull and far too long"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    (d / "cfg.json").write_text(json.dumps(TINIEST))
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


# The kill loop's processes: TensorFlow's default thread pools, in which a killed run's exact resume is the promise.
ENV = default_threads(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def rerun(cmd):
    """The same command again, a process (``cmd`` as ``command`` gives it: [python, script, flags...])."""
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=ENV, timeout=900)


def saved_tensors(model_dir):
    """Every tensor of the latest checkpoint (weights, optimizer slots, step, dropout seed) except the input
    iterator's state."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    names = [n for n in reader.get_variable_to_shape_map()
             if "iterator" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {n: reader.get_tensor(n) for n in names}


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
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
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
def started_reference(setup):
    """The uninterrupted run, a process started in the background (``reference`` waits for it)."""
    out, cmd = command(setup, "reference")
    err = open(setup / "reference.stderr", "w+")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True, env=ENV)
    t0, ended = time.time(), []
    waiter = threading.Thread(target=lambda: (proc.wait(), ended.append(time.time())), daemon=True)
    waiter.start()
    yield out, proc, err, waiter, lambda: ended[0] - t0
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    err.close()


@pytest.fixture(scope="module")
def reference(started_reference):
    out, proc, err, waiter, seconds = started_reference
    waiter.join(timeout=900)
    err.seek(0)
    assert proc.returncode == 0, err.read()[-3000:]
    return {"seconds": seconds(), "eval": json.loads((out / "run" / "eval_results.json").read_text()),
            "served": serve(out / "export"), "tensors": saved_tensors(out / "run" / "model")}


# The kills in the order one folder takes them: each named write is caught under way; the random ones fall within the
# first 60% of the uninterrupted run's duration and come after the checkpoint kill (a random kill late in the run may
# find training finished, and a finished run writes no checkpoint; every run, finished or not, writes the export).
KILLS = ["tfrecords", "checkpoint", "random-1", "random-2", "export"]


def test_killed_runs_then_rerun_give_the_uninterrupted_result(setup, started_reference, request):
    out, cmd = command(setup, "killed")
    seen = []
    for phase in KILLS:
        if phase.startswith("random"):
            seconds = request.getfixturevalue("reference")["seconds"]
            when, deadline = random.Random(phase).uniform(0.5, 0.6 * seconds), seconds * 3
        else:
            when, deadline = phase, 600
        seen.append(kill_during(cmd, out, when, deadline=deadline))
        print(f"\n{phase}: killed while {seen[-1] or 'nothing was being written'}")
    # each named write was under way when its kill came (the random ones may find any moment, or none)
    assert [w for p, w in zip(KILLS, seen) if not p.startswith("random")] == ["tfrecords", "checkpoint", "export"], seen
    reference = request.getfixturevalue("reference")
    r = rerun(cmd)
    if r.returncode == 2:  # a refusal is allowed, as one clear line
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        pytest.fail(f"the rerun refused: {r.stderr.strip().splitlines()[-1]}")  # not expected of the same command
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "run" / "eval_results.json").read_text()) == reference["eval"]
    np.testing.assert_array_equal(serve(out / "export"), reference["served"])
    tensors = saved_tensors(out / "run" / "model")
    assert tensors.keys() == reference["tensors"].keys() and len(tensors) > 40
    for name, value in reference["tensors"].items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    leftovers = [os.path.join(root, n) for root, dirs, files in os.walk(out) for n in dirs + files
                 if ".tmp-" in n or n.endswith("_temp")]
    assert not leftovers, leftovers


# -------------------------------------------------------------------------- Ctrl-C, and resuming from another directory
def _start(args, cwd):
    """The CLI in the background, its stderr into a file (a pipe read only at the end could fill and block it)."""
    err = open(os.path.join(cwd, "stderr.log"), "w+")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "run_classifier.py")] + [str(a) for a in args],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), preexec_fn=ctrl_c_reaches_it)
    proc.err_file = err
    return proc


def _steps_saved(model_dir):
    return [int(p.name[len("ckpt-"):-len(".index")]) for p in model_dir.glob("ckpt-*.index")]


def _stderr(proc):
    proc.err_file.seek(0)
    return proc.err_file.read()


def _interrupt_after(proc, model_dir, step, timeout=900):
    """SIGINT (Ctrl-C) once a checkpoint of ``step`` or later exists; returns the stderr of the ended run. The run
    is killed whatever happens (it was started for 100,000 steps)."""
    try:
        deadline = time.time() + timeout
        while max(_steps_saved(model_dir), default=0) < step:
            assert proc.poll() is None and time.time() < deadline, _stderr(proc)[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:  # stuck: its threads' Python stacks (run_main.setup_logging) say where
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError("no exit within 300 s of Ctrl-C:\n" + _stderr(proc)[-6000:]) from None
        err = _stderr(proc)
        assert proc.returncode == 130, err[-3000:]
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
        return err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.err_file.close()


@pytest.mark.slow
def test_ctrl_c_says_where_to_resume_and_a_relative_output_dir_resumes_from_anywhere(glue, tmp_path):
    """Started with a relative --output_dir from one directory, interrupted, resumed with the absolute path from
    another: it continues from its checkpoint (the input iterator's saved state names absolute files)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    args = glue_args(glue, "SST-2", "relout", steps=100000)
    args.remove("--do_eval")
    model = a / "relout" / "model"
    err = _interrupt_after(_start(args, a), model, 4)
    lines = [l for l in err.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and lines[0].startswith("error: interrupted at step "), err[-3000:]
    import tensorflow as tf

    last = int(tf.train.latest_checkpoint(str(model)).rsplit("-", 1)[1])
    assert f"; the last checkpoint is step {last} in {model}: rerun the same command to resume" in lines[0]
    absolute = [x if not str(x).startswith("--output_dir=") else f"--output_dir={a / 'relout'}" for x in args]
    proc = _start(absolute, b)
    err = _interrupt_after(proc, model, last + 4)
    assert f"resumed from {model / f'ckpt-{last}'}" in err, err[-3000:]
    assert not (b / "relout").exists()
