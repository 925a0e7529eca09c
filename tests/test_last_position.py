"""``last_position_only``: the last block computes the last position alone (what a "last" summary head reads), with
the same numbers as the whole output's last row: every attention path (the plain graph, the compiled kernels in
inference and training), memory, segments and padding, gradients, and the task models that use it."""

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import tiny
from xlnet_tf import XLNetConfig, XLNetModel
from xlnet_tf.accel import kernels

TINY = tiny(d_model=32, d_head=16, d_inner=64, n_token=60, dropout=0.0, dropatt=0.0)
PATHS = {"plain": False, "kernels": True, "graph, xla clusters": "xla,chunks"}


def _inputs(b=3, q=9, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 60, (b, q)).astype(np.int32)
    mask = np.ones((b, q), np.int32)
    mask[0, :3] = 0
    ids[0, :3] = 0
    seg = np.zeros((b, q), np.int32)
    seg[:, 5:] = 1
    seg[:, -1] = 2
    return ids, seg, mask


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("mem", [False, True])
def test_last_row_equals_the_whole_outputs_last_row(path, mem):
    if path == "kernels" and kernels.load() is None:
        pytest.skip(f"fused attention kernel: {kernels.status()}")
    model = XLNetModel(XLNetConfig(**TINY, accelerate=PATHS[path], mem_len=4 if mem else 0), seed=1)
    ids, seg, mask = _inputs()
    kw = dict(segment_ids=seg, padding_mask=mask)
    if mem:  # memory from a first window (hidden states), then the window read with it
        kw["mems"] = model(ids[:, :4], segment_ids=seg[:, :4], padding_mask=mask[:, :4])["new_mems"]
    whole = model(ids, **kw)
    last = model(ids, last_position_only=True, **kw)
    assert last["sequence_output"].shape == (3, 1, 32)
    np.testing.assert_allclose(last["sequence_output"][:, 0], whole["sequence_output"][:, -1], atol=2e-6)
    if mem:  # the next memory is every position's, as before
        for a, b in zip(last["new_mems"], whole["new_mems"]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", list(PATHS))
def test_same_loss_and_gradients_in_training(path):
    """Without dropout a training step through the last row gives the whole output's loss and gradients (the other
    rows of the last block never reach a "last" head)."""
    if path == "kernels" and kernels.load() is None:
        pytest.skip(f"fused attention kernel: {kernels.status()}")
    model = XLNetModel(XLNetConfig(**TINY, accelerate=PATHS[path]), seed=2)
    ids, seg, mask = _inputs(seed=1)
    direction = tf.constant(np.random.default_rng(3).normal(size=(3, 32)), tf.float32)
    results = []
    for last in (False, True):
        with tf.GradientTape() as tape:  # (a random direction: a squared error of LayerNorm's output has tiny gradients)
            out = model(ids, segment_ids=seg, padding_mask=mask, training=True, last_position_only=last)
            loss = tf.reduce_sum(out["sequence_output"][:, -1] * direction)
        grads = tape.gradient(loss, model.trainable_variables)
        results.append((float(loss), [None if g is None else tf.convert_to_tensor(g).numpy() for g in grads]))
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) < 1e-5 * max(abs(l0), 1.0)
    for v, a, b in zip(model.trainable_variables, g0, g1):
        if a is None:
            assert b is None, v.path
            continue
        scale = float(np.abs(a).max())  # float32 sums in another order: differences at the last digits
        assert np.abs(b - a).max() <= 1e-4 * scale + 1e-7, (v.path, np.abs(b - a).max(), scale)


def test_refused_where_other_positions_are_asked_for():
    model = XLNetModel(XLNetConfig(**TINY))
    ids, _, _ = _inputs()
    tm = np.eye(9, dtype=np.float32)[None, 2:4].repeat(3, 0)
    for kw in (dict(target_mapping=tm), dict(output_hidden_states=True)):
        with pytest.raises(ValueError, match="last_position_only: not with target_mapping"):
            model(ids, last_position_only=True, **kw)


def test_task_models_ask_for_the_last_row_only_where_the_head_reads_it():
    from heads.classification import ClassificationHead
    from heads.multiple_choice import MultipleChoiceHead
    from xlnet_tf.task_model import TaskModel

    config = XLNetConfig(**TINY)
    ids, seg, mask = _inputs(b=4)
    features = {"input_ids": ids, "segment_ids": seg, "padding_mask": mask}
    for head, reads_last in ((ClassificationHead(32, 3), True), (ClassificationHead(32, 3, summary_type="mean"), False),
                             (MultipleChoiceHead(32, num_choices=2), True)):
        assert head.reads_last_position is reads_last
        model = TaskModel(config, head, seed=4)
        feats = features if not isinstance(head, MultipleChoiceHead) else \
            {k: v.reshape(2, 2, -1) for k, v in features.items()}
        got = model(feats)["logits"].numpy()
        model._last_only = lambda hidden: False  # the whole output, then the head's row
        np.testing.assert_allclose(got, model(feats)["logits"].numpy(), atol=2e-6)
