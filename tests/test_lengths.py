"""Batches padded to their own longest example (data/lengths.py, the serving graph's batch_length): the same
example gives the same outputs at any padded length, per task layout, and the tf.data pipelines keep every
example (evaluation: in order) while padding each batch to a multiple of --length_multiple (8 by default in the
library, 2 on a CPU run)."""

import numpy as np
import pytest
import tensorflow as tf

from xlnet_tf.data import lengths, tfrecord_io
from xlnet_tf import XLNetConfig
from xlnet_tf.lengths import padded_length
from xlnet_tf.task_model import TaskModel
from tests.conftest import tiny

CFG = tiny(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, n_token=120, dropout=0.0, dropatt=0.0)


def left_padded(rng, n_real, L, choices=None):
    """Random classifier-layout examples (A <sep> <cls>), left-padded to L: [b, (choices,) L]."""
    shape = (len(n_real),) + ((choices,) if choices else ())
    ids = np.zeros(shape + (L,), np.int32)
    seg = np.full(shape + (L,), 4, np.int32)
    mask = np.zeros(shape + (L,), np.int32)
    for idx in np.ndindex(*shape):
        n = n_real[idx[0]] - (idx[1] if choices else 0)
        ids[idx + (slice(L - n, L),)] = np.r_[rng.integers(9, 120, n - 2), 4, 3]
        seg[idx + (slice(L - n, L),)] = np.r_[np.zeros(n - 1, int), 2]
        mask[idx + (slice(L - n, L),)] = 1
    return {"input_ids": ids, "segment_ids": seg, "padding_mask": mask}


def test_padded_length_rounds_up_to_8_within_max():
    assert [padded_length(n, 128, 8) for n in (0, 1, 8, 9, 100, 127, 128, 500)] == [8, 8, 8, 16, 104, 128, 128, 128]
    assert [int(padded_length(tf.constant(n), 36, 8)) for n in (1, 17, 33, 36)] == [8, 24, 36, 36]


@pytest.mark.parametrize("splits_dtype", [tf.int64, tf.int32])
def test_keep_first_and_last_cut_each_row_as_python_slices(splits_dtype):
    """The served layouts' row cuts (``export.keep_first`` / ``keep_last``): lengths over, under and at a row's own,
    zero and negative, empty rows and an empty batch."""
    from xlnet_tf.export import keep_first, keep_last

    rows = [[1, 2, 3, 4, 5], [], [6, 7], [8, 9, 10], [11]]
    lengths = [3, 2, 5, 0, -1]
    rt = tf.ragged.constant(rows, dtype=tf.int64, row_splits_dtype=splits_dtype)
    clip = [min(max(n, 0), len(r)) for r, n in zip(rows, lengths)]
    first, last = keep_first(rt, tf.constant(lengths)), keep_last(rt, tf.constant(lengths, tf.int64))
    assert first.to_list() == [r[:k] for r, k in zip(rows, clip)]
    assert last.to_list() == [r[len(r) - k:] for r, k in zip(rows, clip)]
    assert first.row_splits.dtype == last.row_splits.dtype == splits_dtype
    empty = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), tf.zeros([1], splits_dtype))
    none = tf.zeros([0], tf.int32)
    assert keep_first(empty, none).to_list() == keep_last(empty, none).to_list() == []


@pytest.mark.slow
@pytest.mark.parametrize("head_kind,summary", [("classification", "last"), ("classification", "mean"),
                                               ("race", "last")])
def test_same_logits_at_any_padded_length(head_kind, summary):
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead

    rng = np.random.default_rng(0)
    config = XLNetConfig(**CFG)
    if head_kind == "race":
        head = MultipleChoiceHead(config.d_model, summary_type=summary, n_head=2, d_head=16)
        feats = left_padded(rng, [20, 9, 13], 64, choices=4)
    else:
        head = ClassificationHead(config.d_model, 3, summary_type=summary, n_head=2, d_head=16)
        feats = left_padded(rng, [20, 5, 11], 64)
    model = TaskModel(config, head, seed=1)
    model.build_with(feats)
    full = model(feats, training=False)["logits"].numpy()
    trimmed = lengths.trim_batch({k: tf.constant(v) for k, v in feats.items()}, True, 8)
    assert trimmed["input_ids"].shape[-1] == 24  # longest 20 -> 24
    np.testing.assert_allclose(model(trimmed, training=False)["logits"].numpy(), full, atol=1e-5, rtol=1e-5)
    exact = {k: v[..., -20:] for k, v in feats.items()}  # no padding left in the longest row
    np.testing.assert_allclose(model(exact, training=False)["logits"].numpy(), full, atol=1e-5, rtol=1e-5)


def _records(tmp_path, n_real, L):
    spec = {"input_ids": ("int64", (L,)), "segment_ids": ("int64", (L,)), "padding_mask": ("int64", (L,)),
            "label": ("int64", ())}
    feats = left_padded(np.random.default_rng(1), n_real, L)
    rows = [{k: feats[k][i].tolist() for k in feats} | {"label": i} for i in range(len(n_real))]
    path = str(tmp_path / "r.tfrecord")
    tfrecord_io.write_tfrecords(path, rows, spec)
    return path, spec, feats


def test_evaluation_batches_are_trimmed_and_keep_order(tmp_path):
    n_real = [5, 40, 7, 9, 60, 3, 18]
    path, spec, feats = _records(tmp_path, n_real, 64)
    batches = list(tfrecord_io.make_dataset(path, spec, 3, is_training=False, dynamic="left", length_multiple=8))
    assert [b["input_ids"].shape[1] for b in batches] == [40, 64, 24]
    finer = tfrecord_io.make_dataset(path, spec, 3, is_training=False, dynamic="left", length_multiple=2)
    assert [b["input_ids"].shape[1] for b in finer] == [40, 60, 18]
    labels = np.concatenate([b["label"].numpy() for b in batches])
    assert labels.tolist() == list(range(7))
    for b in batches:  # the kept columns are the records' last ones
        for row, i in zip(b["input_ids"].numpy(), b["label"].numpy()):
            np.testing.assert_array_equal(row, feats["input_ids"][i][-len(row):])


@pytest.mark.parametrize("multiple", [8, 2])
def test_training_batches_come_from_one_length_group(tmp_path, multiple):
    rng = np.random.default_rng(2)
    n_real = rng.integers(3, 64, 200).tolist()
    path, spec, _ = _records(tmp_path, n_real, 64)
    ds = tfrecord_io.make_dataset(path, spec, 8, is_training=True, seed=3, dynamic="left",
                                  length_multiple=multiple)
    seen, widths = {}, set()
    for b in ds.take(60):
        width = b["input_ids"].shape[1]
        widths.add(width)
        real = b["padding_mask"].numpy().sum(1)
        assert b["input_ids"].shape[0] == 8 and width % multiple == 0 and width <= 64
        assert (padded_length(int(real.max()), 64, multiple) == width) and (real > width - multiple).all()
        for i in b["label"].numpy():
            seen[int(i)] = seen.get(int(i), 0) + 1
    assert len(seen) > 150  # shuffled across the whole file, not one group drained first
    assert len(widths) > 64 // 8 if multiple < 8 else len(widths) <= 64 // 8  # finer groups: more shapes


def test_default_multiple_by_machine_and_model_size():
    """8 where a GPU/TPU compiles whole steps with XLA; on a CPU 2 for a model whose per-token work outweighs
    compiling a new length (XLNet-Base), 8 for a small one, 16 for a tiny one (xlnet_tf/lengths.py)."""
    from xlnet_tf import lengths as rule

    base, tiny_ = XLNetConfig.preset("base"), XLNetConfig(**CFG)
    assert rule.train_flops_per_token(base) == 6 * 12 * (4 * 768 * 768 + 2 * 768 * 3072)
    assert rule.default_multiple(base, accelerated=True) == rule.default_multiple(tiny_, accelerated=True) == 8
    assert rule.default_multiple(base, accelerated=False) == 2
    assert rule.default_multiple(tiny_, accelerated=False) == 16
    small = XLNetConfig(n_token=32000, n_layer=4, d_model=256, n_head=4, d_head=64, d_inner=1024)  # 18.9 MFLOP
    assert rule.default_multiple(small, accelerated=False) == 8
    accelerated = tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU")
    assert lengths.default_multiple(base) == (8 if accelerated else 2)
    with pytest.raises(ValueError, match="length_multiple"):
        tfrecord_io.make_dataset("unused", {}, 2, is_training=False, dynamic="left")


def test_squad_same_predictions_when_right_padding_is_trimmed():
    """SQuAD windows are right-padded (P <sep> Q <sep> <cls> PAD): trimming the trailing columns keeps every
    position, so the head's top starts/ends and answerability logits are the same."""
    from xlnet_tf.heads.squad import SquadHead

    rng = np.random.default_rng(4)
    L, rows = 64, []
    for n_p, n_q in ((20, 6), (9, 4), (30, 8)):
        ids = np.r_[rng.integers(9, 120, n_p), 4, rng.integers(9, 120, n_q), 4, 3]
        n = len(ids)
        rows.append({"input_ids": np.r_[ids, np.zeros(L - n, int)],
                     "segment_ids": np.r_[np.zeros(n_p + 1, int), np.ones(n_q + 1, int), 2, np.full(L - n, 3)],
                     "padding_mask": np.r_[np.ones(n, int), np.zeros(L - n, int)],
                     "p_mask": np.r_[np.zeros(n_p, int), np.ones(n_q + 2, int), 0, np.ones(L - n, int)],
                     "cls_index": n - 1})
    feats = {k: np.stack([r[k] for r in rows]).astype(np.int32) for k in rows[0]}
    config = XLNetConfig(**CFG)
    model = TaskModel(config, SquadHead(config.d_model, dropout=0.0), seed=2)
    model.build_with(feats)
    full = model.head.predictions(model(feats, training=False))
    trimmed = lengths.trim_batch({k: tf.constant(v) for k, v in feats.items()}, False, 8)
    assert trimmed["input_ids"].shape[-1] == 48 and trimmed["cls_index"].shape == (3,)
    got = model.head.predictions(model(trimmed, training=False))
    for k in full:
        if "index" in k:
            np.testing.assert_array_equal(got[k].numpy(), full[k].numpy(), err_msg=k)
        else:
            np.testing.assert_allclose(got[k].numpy(), full[k].numpy(), atol=1e-5, rtol=1e-5, err_msg=k)
