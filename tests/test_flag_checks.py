"""Schedule and path flags refused in one line naming the flag, before anything is created (issue #52): through
run_classifier's ``main`` in-process (milliseconds: the flags are checked before any training)."""

import os
import subprocess

import pytest

import run_classifier
from tests.cli_util import refused
from tests.conftest import shared_path


def clf_args(glue, out, *extra):
    return ["--task=SST-2", f"--data_dir={glue / 'SST-2'}", f"--model_config_path={glue / 'cfg.json'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            "--max_seq_length=32", "--train_batch_size=8", "--train_steps=4", "--progress=false", "--do_train",
            "--do_eval", *extra]


@pytest.mark.parametrize("flag, said", [
    ("--train_steps=-5", "error: --train_steps=-5: expected >= 1 to train"),
    ("--train_steps=0", "error: --train_steps=0: expected >= 1 to train"),
    ("--save_steps=-1", "error: flag --save_steps=-1: -1 is not a non-negative integer"),
    ("--max_seq_length=2", "error: --max_seq_length=2: leaves no room for text (a text needs its pieces, <sep> "
                           "and <cls>: at least 3)"),
])
def test_schedule_and_length_flags_refused_before_anything_is_created(glue, tmp_path, flag, said):
    out = tmp_path / "out"
    assert refused(run_classifier, *clf_args(glue, out, flag)) == said
    assert not out.exists()


def test_output_dir_that_is_a_file(glue, tmp_path):
    (tmp_path / "taken").write_text("a user's file\n")
    line = refused(run_classifier, *clf_args(glue, tmp_path / "taken"))
    assert line == f"error: --output_dir={tmp_path / 'taken'}: exists and is not a directory; pass a directory"
    assert (tmp_path / "taken").read_text() == "a user's file\n"
    line = refused(run_classifier, *clf_args(glue, tmp_path / "taken" / "run"))
    assert line == (f"error: --output_dir={tmp_path / 'taken' / 'run'}: cannot be created: {tmp_path / 'taken'} "
                    f"is a file, not a directory")
    line = refused(run_classifier, *clf_args(glue, tmp_path / "out", f"--cache_dir={tmp_path / 'taken'}"))
    assert line.startswith(f"error: --cache_dir={tmp_path / 'taken'}: exists and is not a directory")
    assert sorted(os.listdir(tmp_path)) == ["taken"]


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only file system (a tmpfs mounted read-only, as root), or one without write
    permission (as another user): what the run sees of a read-only mount."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_output_and_cache_dir_on_a_read_only_file_system(glue, tmp_path, read_only_dir):
    line = refused(run_classifier, *clf_args(glue, read_only_dir / "run"))
    assert line == (f"error: --output_dir={read_only_dir / 'run'}: cannot be created: {read_only_dir} is not "
                    f"writable (a read-only file system or no permission); pass a directory this run can write")
    line = refused(run_classifier, *clf_args(glue, read_only_dir))
    assert line.startswith(f"error: --output_dir={read_only_dir}: not writable (a read-only file system")
    line = refused(run_classifier, *clf_args(glue, tmp_path / "out", f"--cache_dir={read_only_dir / 'cache'}"))
    assert line.startswith(f"error: --cache_dir={read_only_dir / 'cache'}: cannot be created: {read_only_dir} is "
                           f"not writable")
    assert not (tmp_path / "out").exists() and os.listdir(read_only_dir) == []
