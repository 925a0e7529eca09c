"""A run's output directory, through the CLIs' own ``main`` as a user runs them (tiny model, few steps, in-process:
tests/cli_util.py): a directory of another run (its manifest differs, or it has none) is refused with one line
naming what differs, one run at a time holds it (a second process where two processes are the point), a dead run's
temporaries are removed, outputs get normal permissions, and a full disk keeps the last checkpoint. Nothing written
is lost. (Bad inputs and flags: tests/test_flag_checks.py.)"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import REPO, TINIEST, glue_args


@pytest.fixture(scope="module")
def sst2_dir(glue, tmp_path_factory):
    """One finished SST-2 run; tests copy it."""
    out = tmp_path_factory.mktemp("runs") / "sst2"
    succeeds(run_classifier, *glue_args(glue, "SST-2", out))
    return out


def copy_run(sst2_dir, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(sst2_dir, out)
    return out


# ------------------------------------------------------------------------------------------- the manifest
@pytest.mark.slow
def test_other_task_other_length_edited_data_refuse_and_overwrite_replaces(glue, sst2_dir, tmp_path):
    out = copy_run(sst2_dir, tmp_path)
    before = (out / "eval_results.json").read_text()
    line = refused(run_classifier, *glue_args(glue, "CoLA", out))
    assert "differs in: task" in line and "--overwrite_output_dir" in line and "--output_dir" in line
    line = refused(run_classifier, *glue_args(glue, "STS-B", out))  # a regression head: another shape
    assert "task" in line and "model_shape" not in line
    line = refused(run_classifier, *glue_args(glue, "SST-2", out, "--max_seq_length=48"))
    assert "data.max_seq_length" in line
    assert (out / "eval_results.json").read_text() == before  # nothing overwritten
    # an edited training file is a difference (a resumed iterator would replay the old data)
    data = tmp_path / "sst_edited"
    shutil.copytree(glue / "SST-2", data)
    assert "train_data" in refused(run_classifier, *glue_args(glue, "SST-2", out), f"--data_dir={data}")
    (data / "train.tsv").write_text((data / "train.tsv").read_text().replace("\t1\n", "\t0\n", 1))
    # the same run again resumes (0 steps), as before
    r = succeeds(run_classifier, *glue_args(glue, "SST-2", out))
    assert "resumed from" in r.stderr
    # --overwrite_output_dir replaces the run: CoLA trains from scratch and is scored with its own metric
    succeeds(run_classifier, *glue_args(glue, "CoLA", out, "--overwrite_output_dir"))
    res = json.loads((out / "eval_results.json").read_text())
    assert res["step"] == 4 and "mcc" in res, res
    assert json.loads((out / "run_manifest.json").read_text())["task"] == "cola"


@pytest.mark.slow
def test_checkpoints_without_manifest_and_foreign_checkpoint(glue, sst2_dir, tmp_path):
    out = copy_run(sst2_dir, tmp_path)
    os.remove(out / "run_manifest.json")  # an older run's directory
    assert "no run_manifest.json" in refused(run_classifier, *glue_args(glue, "SST-2", out))
    # another run's checkpoints reached through --model_dir (the trainer's own check: tests/test_training.py)
    cfg = dict(TINIEST, d_model=32, d_head=16)
    (tmp_path / "cfg32.json").write_text(json.dumps(cfg))
    line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "new"), f"--model_dir={out / 'model'}",
                   f"--model_config_path={tmp_path / 'cfg32.json'}")
    assert "holds checkpoints but no run_manifest.json" in line


# ------------------------------------------------------------------------------------------- one run per dir
@pytest.mark.slow  # a second process holds the directory
def test_second_run_fails_fast_and_a_killed_holder_is_taken_over(glue, sst2_dir, tmp_path):
    out = copy_run(sst2_dir, tmp_path)
    args = glue_args(glue, "SST-2", out, "--overwrite_output_dir", steps=100000)
    first = subprocess.Popen([sys.executable, "run_classifier.py"] + [str(a) for a in args], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        deadline = time.time() + 120
        while (out / ".lock").read_text().strip() != str(first.pid):
            assert time.time() < deadline and first.poll() is None, first.stderr.read()[-2000:]
            time.sleep(0.2)
        t0 = time.time()
        line = refused(run_classifier, *glue_args(glue, "SST-2", out, steps=100000))
        assert f"in use by another run (pid {first.pid})" in line and time.time() - t0 < 60
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # kill -9 does not block the next run: the dead holder's lock is taken over (its run was killed before its
    # first checkpoint, so its manifest binds nothing)
    r = succeeds(run_classifier, *glue_args(glue, "SST-2", out, steps=2))
    assert "took over the lock" in r.stderr and f"pid {first.pid}" in r.stderr


@pytest.mark.slow
def test_dead_runs_temporaries_are_removed_and_outputs_get_normal_permissions(glue, sst2_dir, tmp_path):
    out = copy_run(sst2_dir, tmp_path)
    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    stale = [out / "data" / f"sst-2-train-32.tfrecord.tmp-{dead}", out / "model" / "ckpt-9_temp",
             tmp_path / f".tmp-{dead}-abcd"]
    stale[0].write_bytes(b"x" * 1000)
    stale[1].mkdir()
    (stale[1] / "part-00000").write_bytes(b"x")
    stale[2].mkdir()
    live = out / "data" / f"other.tmp-{os.getpid()}"  # a live process's temporary stays
    live.write_bytes(b"x")
    old = os.umask(0o022)
    try:
        r = succeeds(run_classifier, *glue_args(glue, "SST-2", out), f"--export_dir={tmp_path / 'export'}")
    finally:
        os.umask(old)
    assert "removed 3 temporaries" in r.stderr
    assert not any(p.exists() for p in stale) and live.exists()
    for root, dirs, files in os.walk(tmp_path / "export"):
        for d in dirs + [""]:
            assert stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode) == 0o755, os.path.join(root, d)
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode) == 0o644, os.path.join(root, f)


# ------------------------------------------------------------------------------------------- a full disk
@pytest.mark.slow
def test_disk_full_is_one_line_and_keeps_the_last_checkpoint(glue, tmp_path):
    mnt = tmp_path / "small_disk"
    mnt.mkdir()
    # a checkpoint of this tiny model (embeddings + Adam slots + the input pipeline's state) is ~10 MB:
    # 16 MB hold the first one and not the second
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): the disk-full case is not exercised")
    try:
        out = mnt / "out"
        line = refused(run_classifier, *glue_args(glue, "SST-2", out, steps=6))
        assert "no space left on device" in line
        # the failed save's partial files do not stay on the full disk (issue #42)
        assert "ckpt-4 (its partial files removed)" in line, line
        assert not [p.name for p in (out / "model").iterdir() if p.name.startswith("ckpt-4")]
        import tensorflow as tf
        latest = tf.train.latest_checkpoint(str(out / "model"))
        assert latest and latest.endswith("ckpt-2"), latest
        assert tf.train.load_checkpoint(latest).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 2
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.slow
def test_a_finished_run_leaves_none_of_its_files_open(glue, tmp_path):
    """Training lets go of its input when it ends (``Trainer.close``): once the call returns, no descriptor of this
    process names a file in the run's folders, with Python's cyclic collector off (nothing closed by chance). And
    the check ``run_main`` makes before collecting after a failed job sees a file left open, and one closed."""
    import gc

    import run_main

    gc.disable()
    try:
        succeeds(run_classifier, *glue_args(glue, "SST-2", tmp_path / "out", f"--cache_dir={tmp_path / 'cache'}"))
        still_open = [target for _, target in run_main.open_descriptors() if target.startswith(str(tmp_path))]
    finally:
        gc.enable()
    assert still_open == []
    before = run_main.open_descriptors()
    f = open(tmp_path / "left-open.txt", "w")
    assert run_main.left_open(before)
    f.close()
    assert not run_main.left_open(before)


# ------------------------------------------------------------------------------------------- we delete only ours
def test_an_export_directory_holding_files_of_the_user_is_refused_before_any_work(glue, tmp_path):
    """--export_dir / --export_huggingface replace a directory whole: one that holds anything but an earlier export
    is refused in one line naming it, before training (nothing written, nothing removed)."""
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub" / "other.bin").write_bytes(b"\1" * 8)
    out = tmp_path / "out"
    for flag in ("--export_dir", "--export_huggingface"):
        line = refused(run_classifier, *glue_args(glue, "SST-2", out, f"{flag}={mine}"))
        assert f"{flag}={mine}" in line and "notes.txt" in line and "nothing is written" in line, line
    assert not out.exists()
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "sub" / "other.bin").read_bytes() == b"\1" * 8


@pytest.mark.slow
def test_an_earlier_export_is_replaced_and_overwrite_keeps_what_runs_did_not_write(glue, tmp_path):
    """An earlier export of ours is replaced; --overwrite_output_dir removes what runs wrote in the work
    directories (checkpoints, summaries, history, cached features) and nothing else."""
    out, export = tmp_path / "out", tmp_path / "export"
    model_dir = tmp_path / "model"
    succeeds(run_classifier, *glue_args(glue, "SST-2", out, f"--export_dir={export}", f"--model_dir={model_dir}"))
    first = (export / "saved_model.pb").stat().st_mtime_ns
    (model_dir / "my_notes.txt").write_text("mine")
    (out / "data" / "my_data.csv").write_text("a,b\n")
    succeeds(run_classifier, *glue_args(glue, "CoLA", out, f"--export_dir={export}", f"--model_dir={model_dir}",
                                        "--overwrite_output_dir"))
    assert (export / "saved_model.pb").stat().st_mtime_ns != first
    assert (model_dir / "my_notes.txt").read_text() == "mine" and (out / "data" / "my_data.csv").exists()


def test_many_classes_with_few_examples_are_said_and_the_log_table_is_bounded(tmp_path):
    from xlnet_tf.tasks.report import LOGGED_CLASSES, class_scores, class_table

    names = [f"c{i}" for i in range(1000)]
    gold = np.repeat(np.arange(1000), 2)
    lines = class_table(class_scores(gold, np.roll(gold, 1), names))
    assert len(lines) <= 2 * LOGGED_CLASSES + 6 and "1,000 classes" in lines[0] and "eval_results.json" in lines[0]
    assert max(len(line) for line in lines) < 400
    small = class_table(class_scores([0, 1, 1], [0, 1, 0], ["neg", "pos"]))
    assert small[0].startswith("class") and len(small) == 8
