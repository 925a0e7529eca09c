"""Flags and the files they name refused in one line naming the flag, before anything is created (issues #35, #42,
#52): schedule, length, batch-size and path flags, a length beyond the machine's memory, a tokenizer or config file
that does not fit, an empty pretraining corpus; settings that are legal but unintended warn. Through the CLIs'
``main`` in-process (milliseconds: the flags are checked before any training)."""

import json
import os
import shutil
import subprocess

import pytest

import run_classifier
import run_pretrain
from tests.cli_util import refused, succeeds
from tests.conftest import TINIEST, glue_args, records, shared_path


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


# -------------------------------------------------------------------- batch sizes, the schedule, a length beyond memory
@pytest.mark.parametrize("flag", ["train_batch_size", "eval_batch_size", "predict_batch_size", "grad_accum_steps"])
def test_batch_sizes_below_one_are_one_line(glue, tmp_path, flag):
    out = tmp_path / "out"
    line = refused(run_classifier, *glue_args(glue, "SST-2", out), f"--{flag}=0")
    assert f"--{flag}=0" in line and "not a positive integer" in line, line
    assert not out.exists()


def test_schedule_and_checkpoint_flags_are_one_line(glue, tmp_path):
    for lr in ("-1e-3", "0"):
        line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "a"), f"--learning_rate={lr}")
        assert f"--learning_rate={float(lr):g}: expected > 0 to train" in line, line
    assert records(tmp_path / "a") == []
    missing = tmp_path / "nowhere" / "xlnet_model.ckpt"
    line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "b"), f"--init_checkpoint={missing}")
    assert f"--init_checkpoint={missing}: no such checkpoint" in line, line
    assert not (tmp_path / "b").exists()


def test_a_length_beyond_the_machines_memory_is_refused_before_features(glue, tmp_path):
    out = tmp_path / "out"
    line = refused(run_classifier, *glue_args(glue, "SST-2", out), "--max_seq_length=100000")
    assert "--max_seq_length=100000 with --train_batch_size=8: training is estimated to need" in line, line
    assert "GiB (xlnet_tf.ram), this machine has" in line and "--nocheck_memory" in line
    assert records(out) == []


@pytest.mark.slow
def test_legal_but_unintended_settings_warn(glue, tmp_path):
    r = succeeds(run_classifier, *glue_args(glue, "SST-2", tmp_path / "out", steps=2), "--max_seq_length=3",
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


# --------------------------------------------------------------------------------------------- the files the flags name
@pytest.mark.slow
def test_bad_inputs_get_one_line_before_training(glue, tmp_path):
    not_spm = tmp_path / "spiece.model"
    not_spm.write_text("not a model")
    line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "a"), f"--spiece_model_file={not_spm}")
    assert str(not_spm) in line and "not a SentencePiece model" in line
    (tmp_path / "small.json").write_text(json.dumps(dict(TINIEST, n_token=1000)))
    line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "b"),
                   f"--model_config_path={tmp_path / 'small.json'}")
    assert "32000 pieces" in line and "n_token=1000" in line
    (tmp_path / "typo.json").write_text(json.dumps(dict(TINIEST, mem_lne=16)))
    line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "c"),
                   f"--model_config_path={tmp_path / 'typo.json'}")
    assert "'mem_lne'" in line and "did you mean 'mem_len'" in line
    (tmp_path / "str.json").write_text(json.dumps(dict(TINIEST, untie_r="false")))
    line = refused(run_classifier, *glue_args(glue, "SST-2", tmp_path / "d"),
                   f"--model_config_path={tmp_path / 'str.json'}")
    assert "untie_r" in line and "JSON boolean" in line
    # a malformed dev.tsv fails before the first training step
    data = tmp_path / "sst"
    shutil.copytree(glue / "SST-2", data)
    with open(data / "dev.tsv", "a", encoding="utf-8") as f:
        f.write("a sentence without a label\n")
    out = tmp_path / "e"
    line = refused(run_classifier, *glue_args(glue, "SST-2", out), f"--data_dir={data}")
    assert "dev.tsv" in line and not list((out / "model").glob("ckpt-*"))


def test_empty_pretraining_corpus(tmp_path):
    (tmp_path / "blank.txt").write_text("\n   \n\n")
    (tmp_path / "cfg.json").write_text(json.dumps(TINIEST))
    line = refused(
        run_pretrain, f"--train_input={tmp_path / 'blank.txt'}", f"--spiece_model_file={shared_path('spiece', 'spiece.model')}",
        f"--model_config_path={tmp_path / 'cfg.json'}", f"--model_dir={tmp_path / 'run'}",
        f"--output_dir={tmp_path / 'pretrained'}", "--seq_len=32", "--reuse_len=16", "--perm_size=16",
        "--num_predict=5", "--train_batch_size=2", "--train_steps=2", "--progress=false")
    assert "blank.txt" in line and "no text" in line
