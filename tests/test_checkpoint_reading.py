"""Checkpoints a run reads (issue #42): a damaged one (truncated, corrupted, its index missing) is named with what
is wrong; resuming passes over it to the previous whole checkpoint with a warning; a damaged init checkpoint or
conversion input is one line; a checkpoint prefix without its config names the flag of the command that gives one.
Through the entry points' ``main`` in-process (tests/cli_util.py); nothing earlier is lost."""

import json
import logging
import os
import shutil

import numpy as np
import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import TINIEST, glue_args


def clf_args(glue, out, *extra, steps=4):
    return glue_args(glue, "SST-2", out, *extra, steps=steps)


def truncate(path, keep=0.5):
    os.truncate(path, int(os.path.getsize(path) * keep))


def flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def data_file(prefix):
    return f"{prefix}.data-00000-of-00001"


def saved_tensors(prefix):
    """Every tensor of a training checkpoint but the input iterator's state (as tests/test_faults.py)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if "iterator" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH"}


# -------------------------------------------------------------------------------------------------- damaged checkpoints
@pytest.fixture(scope="module")
def small_checkpoints(tmp_path_factory):
    """Three checkpoints of a few variables (ckpt-1..3) written by a CheckpointManager, as the trainer's."""
    import tensorflow as tf

    d = tmp_path_factory.mktemp("ckpts")
    v = tf.Variable(np.arange(4000, dtype=np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(d), max_to_keep=5)
    for i in range(1, 4):
        v.assign_add(tf.ones_like(v))
        manager.save(checkpoint_number=i)
    return d


def test_check_readable_names_the_file_and_what_is_wrong(small_checkpoints, tmp_path):
    from xlnet_tf.tf_checkpoint import CheckpointError, check_readable

    d = tmp_path / "c"
    shutil.copytree(small_checkpoints, d)
    check_readable(str(d / "ckpt-3"))  # whole: no error
    truncate(data_file(d / "ckpt-3"))
    with pytest.raises(CheckpointError, match=r"ckpt-3\.data-00000-of-00001: damaged checkpoint: truncated"):
        check_readable(str(d / "ckpt-3"))
    flip_byte(data_file(d / "ckpt-2"))
    with pytest.raises(CheckpointError, match=r"ckpt-2\.data-00000-of-00001: damaged checkpoint: corrupted .*checksum"):
        check_readable(str(d / "ckpt-2"))
    os.remove(d / "ckpt-1.index")
    with pytest.raises(CheckpointError, match=r"ckpt-1\.index: damaged checkpoint: its index file is missing"):
        check_readable(str(d / "ckpt-1"))


def test_resume_point_passes_over_damaged_checkpoints_with_a_warning(small_checkpoints, tmp_path, caplog):
    from xlnet_tf.tf_checkpoint import CheckpointError
    from xlnet_tf.training import resume_point

    d = tmp_path / "c"
    shutil.copytree(small_checkpoints, d)
    assert resume_point(str(d)) == str(d / "ckpt-3")
    truncate(data_file(d / "ckpt-3"))
    flip_byte(data_file(d / "ckpt-2"))
    before = (d / "ckpt-1.index").read_bytes(), (d / data_file("ckpt-1")).read_bytes()
    with caplog.at_level(logging.WARNING):
        assert resume_point(str(d)) == str(d / "ckpt-1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "ckpt-3.data-00000-of-00001: damaged checkpoint: truncated" in warnings[0] \
        and "ckpt-2.data-00000-of-00001: damaged checkpoint: corrupted" in warnings[1], warnings
    assert all("resuming from the previous checkpoint that reads whole, ckpt-1" in w for w in warnings)
    assert ((d / "ckpt-1.index").read_bytes(), (d / data_file("ckpt-1")).read_bytes()) == before  # only read
    truncate(data_file(d / "ckpt-1"))
    with pytest.raises(CheckpointError, match=r"ckpt-3.*truncated.*\(and 2 earlier checkpoint\(s\) are damaged "
                                              r"too\); no checkpoint in .* reads whole"):
        resume_point(str(d))


@pytest.mark.parametrize("before", ["three checkpoints", "none"])
def test_ctrl_c_after_the_manager_named_the_new_checkpoint_leaves_the_directory_as_before(small_checkpoints, tmp_path,
                                                                                         monkeypatch, before):
    """A Ctrl-C between the manager's writing of the ``checkpoint`` file (naming the new one) and its cleanup: the
    partial checkpoint's files are removed and the ``checkpoint`` file says what it said before."""
    import tensorflow as tf

    from xlnet_tf import checkpoint_files

    d = tmp_path / "c"
    shutil.copytree(small_checkpoints, d) if before != "none" else d.mkdir()
    state = (d / "checkpoint").read_bytes() if before != "none" else None
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(np.zeros(4000, np.float32))), str(d),
                                         max_to_keep=5)

    def interrupted_sweep():
        assert "ckpt-4" in (d / "checkpoint").read_text()  # the moment: the new checkpoint is already named
        raise KeyboardInterrupt

    monkeypatch.setattr(manager, "_sweep", interrupted_sweep)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_files.save(manager, 4, str(d))
    assert not list(d.glob("ckpt-4*"))
    if before == "none":
        assert not (d / "checkpoint").exists() and tf.train.latest_checkpoint(str(d)) is None
    else:
        assert (d / "checkpoint").read_bytes() == state and tf.train.latest_checkpoint(str(d)) == str(d / "ckpt-3")
    assert not [p for p in d.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow  # trains twice
def test_rerun_over_a_damaged_latest_checkpoint_resumes_from_the_previous_and_ends_the_same(glue, tmp_path):
    whole = tmp_path / "whole"
    succeeds(run_classifier, *clf_args(glue, whole))
    reference = saved_tensors(whole / "model" / "ckpt-4")
    reference_eval = json.loads((whole / "eval_results.json").read_text())
    damaged = tmp_path / "damaged"
    shutil.copytree(whole, damaged)
    model = damaged / "model"
    truncate(data_file(model / "ckpt-4"))
    ckpt2 = {p.name: p.read_bytes() for p in model.glob("ckpt-2.*")}
    r = succeeds(run_classifier, *clf_args(glue, damaged))
    warning = [line for line in r.stderr.splitlines() if line.startswith("W") and "damaged checkpoint" in line]
    assert len(warning) == 1 and f"{model / 'ckpt-4.data-00000-of-00001'}: damaged checkpoint: truncated" in \
        warning[0] and "resuming from the previous checkpoint that reads whole, ckpt-2" in warning[0], r.stderr
    assert "resumed from" in r.stderr and "Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in model.glob("ckpt-2.*")} == ckpt2  # the intact one is kept as it was
    tensors = saved_tensors(model / "ckpt-4")  # written again, whole
    assert tensors.keys() == reference.keys() and len(tensors) > 20
    for name, value in reference.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    assert json.loads((damaged / "eval_results.json").read_text()) == reference_eval
    history = json.loads((model / "train_history.json").read_text())
    assert [s for s, _ in history] == [1, 2, 3, 4]
    # evaluating every kept checkpoint: a damaged one is one line naming it
    truncate(data_file(model / "ckpt-2"))
    evaluate = [a for a in clf_args(glue, damaged) if a != "--do_train"] + ["--eval_all_ckpt"]
    line = refused(run_classifier, *evaluate)
    assert f"{model / 'ckpt-2.data-00000-of-00001'}: damaged checkpoint: truncated" in line, line
    # every checkpoint damaged: one line, nothing removed
    truncate(data_file(model / "ckpt-4"))
    files = sorted(p.name for p in model.iterdir())
    line = refused(run_classifier, *clf_args(glue, damaged))
    assert "ckpt-4.data-00000-of-00001: damaged checkpoint: truncated" in line and "reads whole" in line, line
    assert sorted(p.name for p in model.iterdir()) == files


@pytest.fixture(scope="module")
def own_format(tmp_path_factory):
    """A TINIEST backbone saved in our format, and a copy with its data file truncated."""
    from xlnet_tf import XLNetConfig, XLNetModel

    d = tmp_path_factory.mktemp("own")
    model = XLNetModel(XLNetConfig(**TINIEST))
    model(np.zeros((1, 4), np.int32))
    model.save_pretrained(str(d / "whole"))
    shutil.copytree(d / "whole", d / "damaged")
    truncate(d / "damaged" / "xlnet_model.ckpt.data-00000-of-00001")
    return d


def test_a_damaged_init_checkpoint_or_conversion_is_one_line(glue, own_format, tmp_path, capsys):
    from xlnet_tf import convert

    damaged = own_format / "damaged"
    want = f"{damaged / 'xlnet_model.ckpt.data-00000-of-00001'}: damaged checkpoint: truncated"
    line = refused(run_classifier, *clf_args(glue, tmp_path / "run"), f"--init_checkpoint={damaged}")
    assert want in line, line
    out = tmp_path / "converted"
    out.mkdir()
    (out / "kept.txt").write_text("an earlier output")
    capsys.readouterr()
    assert convert.main([f"--input={damaged}", f"--output={out}"]) == 2
    err = capsys.readouterr().err
    assert [e for e in err.splitlines() if e.startswith("error:")] == [err.strip().splitlines()[-1]] and want in err
    assert "Traceback" not in err and sorted(os.listdir(out)) == ["kept.txt"]


# -------------------------------------------------------------------------------------- a checkpoint without its config
@pytest.fixture(scope="module")
def bare_prefix(own_format, tmp_path_factory):
    """An original-named checkpoint prefix with no config beside it."""
    d = tmp_path_factory.mktemp("bare")
    for p in (own_format / "whole").glob("xlnet_model.ckpt.*"):
        shutil.copy(p, d / p.name)
    return d / "xlnet_model.ckpt"


def test_a_missing_config_names_the_flag_of_the_command(glue, bare_prefix, tmp_path, capsys):
    from xlnet_tf import XLNetModel, convert
    from xlnet_tf.tf_checkpoint import CheckpointError

    assert convert.main([f"--input={bare_prefix}", f"--output={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "no xlnet_config.json or config.json next to the checkpoint; pass --config=" in err
    assert "XLNetConfig(" not in err
    args = [a for a in clf_args(glue, tmp_path / "run") if not a.startswith("--model_config_path")]
    line = refused(run_classifier, *args, f"--init_checkpoint={bare_prefix}")
    assert "pass --model_config_path" in line and "XLNetConfig(" not in line, line
    with pytest.raises(CheckpointError, match=r"pass config=XLNetConfig\(\.\.\.\)"):  # the Python API's own
        XLNetModel.from_pretrained(str(bare_prefix))


@pytest.mark.slow  # trains two steps
def test_model_config_path_is_honoured_for_a_prefix_without_config(glue, bare_prefix, tmp_path):
    r = succeeds(run_classifier, *clf_args(glue, tmp_path / "run", steps=2), f"--init_checkpoint={bare_prefix}")
    assert "initialised from" in r.stderr
