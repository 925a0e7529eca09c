"""Damaged feature caches (issue #52): every cached TFRecord is checked against what its manifest recorded when
it was written (record count, size, CRC32) before any work; a damaged one is rebuilt from the source data with a
WARNING naming it, or refused in one line when the cache is shared read-only. The same for pretraining records."""

import json
import os
import shutil
import subprocess

import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import shared_path


def flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def write_small(path, n=50):
    from xlnet_tf.data import tfrecord_io

    spec = {"x": ("int64", (4,))}
    return tfrecord_io.write_tfrecords(str(path), ({"x": [i, i, i, i]} for i in range(n)), spec,
                                       meta={"k": 1}, progress=False)


def test_damage_names_what_changed_since_the_file_was_written(tmp_path):
    from xlnet_tf.data import tfrecord_io

    path = tmp_path / "a.tfrecord"
    write_small(path)
    manifest = json.loads((tmp_path / "a.tfrecord.json").read_text())
    assert manifest["count"] == 50 and manifest["bytes"] == os.path.getsize(path) and len(manifest["crc32"]) == 8
    assert tfrecord_io.damage(str(path)) is None and tfrecord_io.is_valid_cache(str(path), {"k": 1})
    shutil.copy(path, tmp_path / "b.tfrecord")
    shutil.copy(tmp_path / "a.tfrecord.json", tmp_path / "b.tfrecord.json")
    flip_byte(path)
    assert "CRC32 differs" in tfrecord_io.damage(str(path))
    os.truncate(tmp_path / "b.tfrecord", 400)
    assert tfrecord_io.damage(str(tmp_path / "b.tfrecord")).endswith("when written (truncated)")
    legacy = dict(manifest)
    del legacy["bytes"], legacy["crc32"]  # an older writer's manifest: the records are read back and counted
    (tmp_path / "b.tfrecord.json").write_text(json.dumps(legacy))
    assert "broken record framing" in tfrecord_io.damage(str(tmp_path / "b.tfrecord"))


def clf_args(glue, out, cache, *extra):
    return ["--task=SST-2", f"--data_dir={glue / 'SST-2'}", f"--model_config_path={glue / 'cfg.json'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            f"--cache_dir={cache}", "--max_seq_length=32", "--train_batch_size=8", "--train_steps=2",
            "--progress=false", "--do_train", "--do_eval", *extra]


@pytest.mark.slow
def test_damaged_classifier_cache_is_rebuilt_before_training(glue, tmp_path):
    cache = tmp_path / "cache"
    succeeds(run_classifier, *clf_args(glue, tmp_path / "a", cache))
    train, dev = cache / "sst-2-train-32.tfrecord", cache / "sst-2-dev-32.tfrecord"
    whole = train.read_bytes(), dev.read_bytes()
    os.truncate(train, int(os.path.getsize(train) * 0.4))
    flip_byte(dev)
    r = succeeds(run_classifier, *clf_args(glue, tmp_path / "b", cache))
    lines = r.stderr.splitlines()
    warned = [i for i, ln in enumerate(lines) if ln.startswith("W") and "damaged cached records" in ln]
    assert len(warned) == 2, r.stderr[-3000:]
    assert f"{train}: damaged cached records (" in lines[warned[0]] and "when written (truncated)): rebuilding " \
        "them from the source data" in lines[warned[0]], lines[warned[0]]
    assert f"{dev}: damaged cached records (its CRC32 differs" in lines[warned[1]], lines[warned[1]]
    said = [i for i, ln in enumerate(lines) if "train: 40 examples in" in ln]
    assert said and said[0] > warned[0] and "train: " not in " ".join(lines[:warned[0]])  # never a wrong count
    assert (train.read_bytes(), dev.read_bytes()) == whole  # rebuilt exactly


@pytest.fixture
def read_only_copy(tmp_path):
    """``copy(src)`` -> a read-only copy of the folder ``src`` (a read-only tmpfs as root, else permissions)."""
    mounted = []

    def copy(src):
        d = tmp_path / f"ro{len(mounted)}"
        if os.geteuid() != 0:
            shutil.copytree(src, d)
            d.chmod(0o555)
            mounted.append(None)
            return d
        mounted.append(d)
        d.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(d)], capture_output=True).returncode:
            mounted.pop()
            pytest.skip("cannot mount a tmpfs here")
        shutil.copytree(src, d, dirs_exist_ok=True)
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        return d

    yield copy
    for i, d in enumerate(mounted):
        if d is None:
            (tmp_path / f"ro{i}").chmod(0o755)
        else:
            subprocess.run(["umount", str(d)], check=True)


@pytest.mark.slow
def test_damaged_cache_in_a_read_only_cache_dir_is_refused(glue, tmp_path, read_only_copy):
    cache = tmp_path / "cache"
    succeeds(run_classifier, *clf_args(glue, tmp_path / "a", cache))
    succeeds(run_classifier, *clf_args(glue, tmp_path / "b", read_only_copy(cache)))  # a whole shared cache: read
    flip_byte(cache / "sst-2-dev-32.tfrecord")
    ro = read_only_copy(cache)
    line = refused(run_classifier, *clf_args(glue, tmp_path / "c", ro))
    assert line.startswith(f"error: {ro / 'sst-2-dev-32.tfrecord'}: damaged cached records (its CRC32 differs"), line
    assert line.endswith("in a read-only directory: rebuild them in a --cache_dir (pretraining: --record_dir) this "
                         "run can write"), line
    assert not (tmp_path / "c" / "model" / "checkpoint").exists()  # refused before training


def test_damaged_pretraining_records_are_rewritten_or_refused(tiny_corpus, tmp_path, caplog):
    from xlnet_tf.data import pretrain_records

    prefix = str(tmp_path / "train")
    kw = dict(seq_len=24, reuse_len=8, num_streams=2, progress=False)
    files = pretrain_records.create_pretrain_tfrecords(tiny_corpus["corpus"], prefix, tiny_corpus["spm"], **kw)
    whole = open(files[0], "rb").read()
    flip_byte(files[0])
    with pytest.raises(ValueError, match=r"train-00000-of-00001\.tfrecord: damaged pretraining records \(its CRC32 "
                                         r"differs.*\); pass --train_input to rewrite them"):
        pretrain_records.pretrain_files(prefix)
    with caplog.at_level("WARNING"):
        again = pretrain_records.create_pretrain_tfrecords(tiny_corpus["corpus"], prefix, tiny_corpus["spm"], **kw)
    assert again == files and open(files[0], "rb").read() == whole
    assert any("damaged cached records" in r.getMessage() and files[0] in r.getMessage() for r in caplog.records)
