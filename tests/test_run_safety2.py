"""Bad input, second round (issue #35), through the CLIs' ``main`` as a user runs them (tiny model, few steps,
in-process): silent misreads become one line or a warning; in processes of their own, Ctrl-C says where to resume
from and a run resumes from any working directory. (Serving refuses text that is not UTF-8:
tests/test_run_classifier.py, on the session's export.)"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import REPO, shared_path
from tests.subprocess_util import ctrl_c_reaches_it
from tests.test_run_safety import clf_args


def records(out):
    return sorted(p.name for p in (out / "data").glob("*.tfrecord*")) if (out / "data").exists() else []


# ------------------------------------------------------------------------------------------- silent misreads
def test_generic_task_refuses_an_empty_label_cell(glue, tmp_path):
    data = tmp_path / "mine"
    shutil.copytree(glue / "SST-2", data)
    lines = (data / "train.tsv").read_text(encoding="utf-8").splitlines()
    text, _ = lines[5].rsplit("\t", 1)
    lines[5] = text + "\t"  # line 6 of the file: an empty label cell
    (data / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    line = refused(run_classifier, *clf_args(glue, "generic", out), f"--data_dir={data}", "--text_a_column=sentence")
    assert f"{data / 'train.tsv'}, line 6: field 'label': expected a label, got an empty cell" in line, line
    assert records(out) == []


def test_every_in_graph_tokenisation_checks_utf8():
    """The one check sits where serving text enters the graph: the tokenizer's ``preprocess`` (classifier, RACE,
    SQuAD questions) and SQuAD's context alignment."""
    import tensorflow as tf

    from xlnet_tf.tasks.squad.serving import preprocess_with_origin
    from xlnet_tf.tf_tokenizer import TFXLNetTokenizer

    tok = TFXLNetTokenizer(shared_path("spiece", "spiece.model"))
    ok = ["plain", "accents \u00e9\u00e8 and \ufffd itself", "\U0001f600"]
    assert tok.tokenize(tf.constant(ok)).nrows() == 3
    for bad in (b"\xff\xfe bad", b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80 beyond U+10FFFF", b"cut \xc3"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="input is not valid UTF-8: row 2"):
            tok.tokenize(tf.constant([b"ok", b"ok", bad]))
        with pytest.raises(tf.errors.InvalidArgumentError, match="not valid UTF-8"):
            preprocess_with_origin(tok, tf.constant([bad]))


# ------------------------------------------------------------------------------------------- one line, at once
@pytest.mark.parametrize("flag", ["train_batch_size", "eval_batch_size", "predict_batch_size", "grad_accum_steps"])
def test_batch_sizes_below_one_are_one_line(glue, tmp_path, flag):
    out = tmp_path / "out"
    line = refused(run_classifier, *clf_args(glue, "SST-2", out), f"--{flag}=0")
    assert f"--{flag}=0" in line and "not a positive integer" in line, line
    assert not out.exists()


def test_schedule_and_checkpoint_flags_are_one_line(glue, tmp_path):
    for lr in ("-1e-3", "0"):
        line = refused(run_classifier, *clf_args(glue, "SST-2", tmp_path / "a"), f"--learning_rate={lr}")
        assert f"--learning_rate={float(lr):g}: expected > 0 to train" in line, line
    assert records(tmp_path / "a") == []
    missing = tmp_path / "nowhere" / "xlnet_model.ckpt"
    line = refused(run_classifier, *clf_args(glue, "SST-2", tmp_path / "b"), f"--init_checkpoint={missing}")
    assert f"--init_checkpoint={missing}: no such checkpoint" in line, line
    assert not (tmp_path / "b").exists()


def test_a_length_beyond_the_machines_memory_is_refused_before_features(glue, tmp_path):
    out = tmp_path / "out"
    line = refused(run_classifier, *clf_args(glue, "SST-2", out), "--max_seq_length=100000")
    assert "--max_seq_length=100000 with --train_batch_size=8: training is estimated to need" in line, line
    assert "GiB (xlnet_tf.ram), this machine has" in line and "--nocheck_memory" in line
    assert records(out) == []


@pytest.mark.slow
def test_legal_but_unintended_settings_warn(glue, tmp_path):
    r = succeeds(run_classifier, *clf_args(glue, "SST-2", tmp_path / "out", steps=2), "--max_seq_length=3",
                 "--warmup_steps=10")
    assert "--warmup_steps=10 > --train_steps=2: the peak learning rate 2e-05 is never reached" in r.stderr
    # a single text keeps max_seq_length - 2 = 1 piece: every sentence of more than one piece is truncated,
    # counted per split as the features are written
    from xlnet_tf import XLNetTokenizer

    tok = XLNetTokenizer(shared_path("spiece", "spiece.model"))
    for split, n in (("train", 40), ("dev", 20)):
        rows = (glue / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        longer = sum(len(tok.encode(row.rsplit("\t", 1)[0])) > 1 for row in rows)
        assert len(rows) == n and 2 * longer > n
        said = [l for l in r.stderr.splitlines()
                if f"sst-2-{split}-3.tfrecord: --max_seq_length=3 truncates {longer} of {n} examples" in l]
        assert len(said) == 1 and said[0].startswith("W"), r.stderr[-3000:]  # a warning


# ------------------------------------------------------------------------------------------- resume from anywhere
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
    args = clf_args(glue, "SST-2", "relout", steps=100000)
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
