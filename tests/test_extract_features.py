"""extract_features.py: raw text in, per-token and pooled vectors of chosen layers out (.npz and .tfrecord), equal
to the backbone's hidden states on the same ids; runs through the one runner (its ``main`` in-process)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import extract_features
from tests.cli_util import refused, succeeds
from tests.conftest import SHARED, shared_path, tiny

SPM = os.path.join(SHARED, "spiece", "spiece.model")  # the fixture skips the tests when it is absent
TINY = tiny(n_layer=3, d_model=32, d_head=16, d_inner=64)
TEXTS = ["A gripping, beautifully shot film.", "It is long ||| and it is dull, very dull indeed.",
         "Ünïcode and numbers 1,234 too."]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    shared_path("spiece", "spiece.model")  # skips without it
    from xlnet_tf import XLNetConfig, XLNetModel

    d = tmp_path_factory.mktemp("pretrained")
    XLNetModel(XLNetConfig(**TINY), seed=1).save_pretrained(str(d))
    (d / "texts.txt").write_text("\n".join(TEXTS) + "\n\n", encoding="utf-8")
    return d


def extract(d, out, *extra):
    return succeeds(extract_features, f"--input_file={d / 'texts.txt'}", f"--output_file={out}",
                    f"--spiece_model_file={SPM}", f"--init_checkpoint={d}", f"--output_dir={d / 'run'}",
                    "--max_seq_length=24", "--predict_batch_size=2", *extra)


@pytest.mark.slow
def test_vectors_equal_the_backbone_hidden_states(pretrained, tmp_path):
    from xlnet_tf.tasks.classification.features import encode_texts
    from xlnet_tf import XLNetModel
    from xlnet_tf.tokenizer import XLNetTokenizer

    extract(pretrained, tmp_path / "f.npz", "--layers=-1,0,1", "--pooling=mean")
    got = np.load(tmp_path / "f.npz")
    assert got["pooled"].shape == (3, 3, 32) and got["tokens"].shape == (3, 24, 3, 32)
    assert list(got["layers"]) == [3, 0, 1]
    feats = encode_texts(XLNetTokenizer(SPM), [t.split(" ||| ")[0] for t in TEXTS],
                         [t.split(" ||| ")[1] if " ||| " in t else "" for t in TEXTS], 24)
    np.testing.assert_array_equal(got["input_ids"], feats["input_ids"])
    assert (feats["segment_ids"][1] == 1).any()  # the pair has its B segment
    model = XLNetModel.from_pretrained(str(pretrained), dropout=0.0, dropatt=0.0)
    hidden = model(feats["input_ids"], segment_ids=feats["segment_ids"], padding_mask=feats["padding_mask"],
                   output_hidden_states=True)["hidden_states"]
    mask = feats["padding_mask"].astype(bool)
    for k, layer in enumerate([3, 0, 1]):
        h = hidden[layer].numpy()
        np.testing.assert_allclose(got["tokens"][:, :, k][mask], h[mask], atol=1e-5)
        assert not got["tokens"][:, :, k][~mask].any()
        mean = np.stack([h[i][mask[i]].mean(0) for i in range(3)])
        np.testing.assert_allclose(got["pooled"][:, k], mean, atol=1e-5)
    assert np.abs(got["pooled"][0, 0] - got["pooled"][1, 0]).max() > 1e-3  # different texts, different vectors


@pytest.mark.slow
def test_tfrecord_and_last_token_pooling(pretrained, tmp_path):
    extract(pretrained, tmp_path / "a.npz", "--layers=-1", "--pooling=last")
    extract(pretrained, tmp_path / "a.tfrecord", "--layers=-1", "--pooling=last")
    ref = np.load(tmp_path / "a.npz")
    np.testing.assert_allclose(ref["pooled"][:, 0], ref["tokens"][:, -1, 0])  # the CLS ends every row
    records = list(tf.data.TFRecordDataset(str(tmp_path / "a.tfrecord")))
    assert len(records) == 3
    for i, raw in enumerate(records):
        ex = tf.train.Example.FromString(raw.numpy()).features.feature
        real = ref["padding_mask"][i].astype(bool)
        assert list(ex["input_ids"].int64_list.value) == list(ref["input_ids"][i][real])
        np.testing.assert_allclose(np.reshape(ex["tokens"].float_list.value, (-1, 32)), ref["tokens"][i][real][:, 0],
                                   rtol=1e-6)
        np.testing.assert_allclose(ex["pooled"].float_list.value, ref["pooled"][i, 0], rtol=1e-6)


def test_bad_input_is_one_line(pretrained, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("fine\nleft ||| \n", encoding="utf-8")
    line = refused(extract_features, f"--input_file={bad}", f"--output_file={tmp_path}/x.npz",
                   f"--spiece_model_file={SPM}", f"--init_checkpoint={pretrained}", f"--output_dir={tmp_path}/o")
    assert f"{bad}:2: expected 'text' or 'text A ||| text B'" in line
    assert not (tmp_path / "x.npz").exists()


def test_a_line_that_is_not_utf8_is_named(pretrained, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\na review with a stray byte here: \xff and more\n")
    line = refused(extract_features, f"--input_file={bad}", f"--output_file={tmp_path}/x.npz",
                   f"--spiece_model_file={SPM}", f"--init_checkpoint={pretrained}", f"--output_dir={tmp_path}/o")
    assert line == f"error: {bad}, line 3: not valid UTF-8 (invalid start byte at byte 33)", line
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_nul_byte_is_said_once_with_its_line(pretrained, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "texts.txt").write_text(TEXTS[0] + "\nwith a \x00 inside\n" + TEXTS[1] + "\nand \x00 again\n",
                                 encoding="utf-8")
    r = extract(d, tmp_path / "n.npz", f"--init_checkpoint={pretrained}")
    said = [ln for ln in r.stderr.splitlines() if "NUL byte" in ln]
    assert len(said) == 1 and said[0].startswith("W"), r.stderr[-3000:]
    assert said[0].endswith(f"{d / 'texts.txt'}, line 2: a NUL byte (\\x00), which the tokenizer reads as <unk> "
                            f"(and 1 more line(s) with one)"), said


@pytest.mark.slow
def test_blank_lines_are_counted_and_rows_map_back_to_lines(pretrained, tmp_path):
    """Blank and whitespace-only lines are skipped, the log says how many, and ``line_index`` gives each row's
    0-based input line (in .npz and .tfrecord); the rows are those of the same texts without the blank lines."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "texts.txt").write_text("\n" + TEXTS[0] + "\n   \n\t\n" + TEXTS[1] + "\n\n" + TEXTS[2] + "\n",
                                 encoding="utf-8")
    r = extract(d, tmp_path / "b.npz", "--layers=-1", f"--init_checkpoint={pretrained}")
    assert "4 blank line(s) skipped; 3 texts" in r.stderr, r.stderr[-3000:]
    got = np.load(tmp_path / "b.npz")
    assert got["line_index"].tolist() == [1, 4, 6]
    extract(pretrained, tmp_path / "ref.npz", "--layers=-1")  # the fixture's file: TEXTS on lines 0-2
    ref = np.load(tmp_path / "ref.npz")
    assert ref["line_index"].tolist() == [0, 1, 2]
    np.testing.assert_array_equal(got["input_ids"], ref["input_ids"])
    extract(d, tmp_path / "b.tfrecord", "--layers=-1", f"--init_checkpoint={pretrained}")
    rows = [tf.train.Example.FromString(x.numpy()).features.feature["line_index"].int64_list.value[0]
            for x in tf.data.TFRecordDataset(str(tmp_path / "b.tfrecord"))]
    assert rows == [1, 4, 6]


def test_an_output_file_that_is_a_directory_is_refused(pretrained, tmp_path):
    texts = tmp_path / "t.txt"
    texts.write_text("fine\n", encoding="utf-8")
    target = tmp_path / "vectors.npz"
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    line = refused(extract_features, f"--input_file={texts}", f"--output_file={target}",
                   f"--spiece_model_file={SPM}", f"--init_checkpoint={pretrained}", f"--output_dir={tmp_path}/o")
    assert line == f"error: --output_file={target}: is a directory; pass the path of a file to write", line
    assert (target / "mine.txt").read_text() == "keep"
