"""The SQuAD span head: shapes, masking, beam consistency, a numpy re-computation, loss, precision, config."""

import numpy as np
import pytest
import tensorflow as tf

from xlnet_tf.heads.squad import SquadHead

B, L, D = 3, 16, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(B, L, D)).astype(np.float32)
    p = np.ones((B, L), np.int32)
    p[:, :9] = 0            # paragraph tokens 0..8
    p[:, 12] = 0            # CLS at 12
    feats = {"p_mask": p, "cls_index": np.full(B, 12), "start_position": np.array([1, 12, 4]),
             "end_position": np.array([3, 12, 4]), "is_impossible": np.array([0, 1, 0])}
    return h, feats


def _head(seed=0, **kw):
    kw.setdefault("start_n_top", 3)
    kw.setdefault("end_n_top", 2)
    kw.setdefault("dropout", 0.0)
    head = SquadHead(**kw)
    h, feats = _inputs()
    head({"sequence_output": h}, feats)
    rng = np.random.default_rng(seed + 1)
    for v in head.weights:  # non-trivial biases / LayerNorm parameters too
        v.assign(rng.normal(scale=0.3, size=v.shape).astype(np.float32))
    return head


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _numpy_head(head, h, feats):
    w = {v.path.split("/", 1)[1]: v.numpy() for v in head.weights}
    p = feats["p_mask"].astype(np.float64)
    start = (h @ w["start_logits/kernel"])[..., 0] + w["start_logits/bias"][0]
    start = start * (1 - p) - 1e30 * p
    sf = h[np.arange(B), feats["start_position"]]
    x = np.concatenate([h, np.repeat(sf[:, None], L, 1)], -1) @ w["end_logits_dense_0/kernel"]
    x = np.tanh(x + w["end_logits_dense_0/bias"])
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    x = x * w["end_logits_LayerNorm/gamma"] + w["end_logits_LayerNorm/beta"]
    end = (x @ w["end_logits_dense_1/kernel"])[..., 0] + w["end_logits_dense_1/bias"][0]
    end = end * (1 - p) - 1e30 * p
    sp = np.exp(_log_softmax(start))
    feat = np.concatenate([(sp[..., None] * h).sum(1), h[np.arange(B), feats["cls_index"]]], -1)
    a = np.tanh(feat @ w["answer_class_dense_0/kernel"] + w["answer_class_dense_0/bias"])
    cls = (a @ w["answer_class_dense_1/kernel"])[:, 0]
    return _log_softmax(start), _log_softmax(end), cls


def test_numpy_recomputation_and_loss():
    head = _head()
    h, feats = _inputs()
    out = head({"sequence_output": h}, feats, training=True)
    start_lp, end_lp, cls = _numpy_head(head, h.astype(np.float64), feats)
    real = feats["p_mask"] == 0
    np.testing.assert_allclose(out["start_log_probs"].numpy()[real], start_lp[real], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["end_log_probs"].numpy()[real], end_lp[real], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["cls_logits"].numpy(), cls, rtol=1e-4, atol=1e-4)
    assert np.all(out["start_log_probs"].numpy()[~real] < -1e29)
    loss = head.loss(feats, out).numpy()
    imp = feats["is_impossible"]
    bce = np.maximum(cls, 0) - cls * imp + np.log1p(np.exp(-np.abs(cls)))
    ce = -start_lp[np.arange(B), feats["start_position"]] - end_lp[np.arange(B), feats["end_position"]]
    assert loss.shape == (B,) and np.all(np.isfinite(loss))
    np.testing.assert_allclose(loss, 0.5 * ce + 0.5 * bce, rtol=1e-4, atol=1e-4)


def test_inference_shapes_masking_and_beam_consistency():
    head = _head()
    h, feats = _inputs()
    serving = {k: feats[k] for k in ("p_mask", "cls_index")}
    out = head({"sequence_output": h}, serving, training=False)
    assert out["start_top_index"].shape == (B, 3) and out["end_top_log_probs"].shape == (B, 6)
    assert "end_log_probs" not in out and out["cls_logits"].shape == (B,)
    blocked = feats["p_mask"].astype(bool)
    s_ix, e_ix = out["start_top_index"].numpy(), out["end_top_index"].numpy()
    assert not blocked[np.arange(B)[:, None], s_ix].any() and not blocked[np.arange(B)[:, None], e_ix].any()
    # starts: the top of start_log_probs, best first
    lp = out["start_log_probs"].numpy()
    np.testing.assert_allclose(np.take_along_axis(lp, s_ix, 1), out["start_top_log_probs"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.sort(lp, 1)[:, ::-1][:, :3], out["start_top_log_probs"].numpy(), rtol=1e-6)
    # ends for start k = the teacher-forced end distribution with start_position = start k
    for k in range(3):
        forced = head({"sequence_output": h}, dict(serving, start_position=s_ix[:, k]), training=False)
        end_lp = forced["end_log_probs"].numpy()
        cols = slice(2 * k, 2 * k + 2)
        np.testing.assert_array_equal(np.argsort(-end_lp, 1)[:, :2], e_ix[:, cols])
        np.testing.assert_allclose(np.sort(end_lp, 1)[:, ::-1][:, :2], out["end_top_log_probs"].numpy()[:, cols],
                                   rtol=1e-5, atol=1e-5)
    assert set(head.predictions(out)) == {"start_top_log_probs", "start_top_index", "end_top_log_probs",
                                          "end_top_index", "cls_logits"}


def test_training_and_inference_agree_without_dropout_and_dropout_acts():
    head = _head()
    h, feats = _inputs()
    a = head({"sequence_output": h}, feats, training=True)
    b = head({"sequence_output": h}, feats, training=False)
    for k in ("start_logits", "start_log_probs", "end_log_probs", "cls_logits"):
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-6)
    drop = _head(dropout=0.5)
    a = drop({"sequence_output": h}, feats, training=True)["cls_logits"].numpy()
    b = drop({"sequence_output": h}, feats, training=False)["cls_logits"].numpy()
    assert not np.allclose(a, b)


def test_graph_mode_dynamic_batch():
    head = _head()
    h, feats = _inputs()

    @tf.function(input_signature=[tf.TensorSpec([None, L, D]), tf.TensorSpec([None, L], tf.int32),
                                  tf.TensorSpec([None], tf.int32)])
    def serve(x, p, c):
        return head({"sequence_output": x}, {"p_mask": p, "cls_index": c}, training=False)

    out = serve(h, feats["p_mask"], feats["cls_index"].astype(np.int32))
    eager = head({"sequence_output": h}, {"p_mask": feats["p_mask"], "cls_index": feats["cls_index"]})
    np.testing.assert_array_equal(out["end_top_index"].numpy(), eager["end_top_index"].numpy())


def test_mixed_float16_no_overflow():
    ref = _head()
    half = SquadHead(start_n_top=3, end_n_top=2, dropout=0.0, dtype="mixed_float16")
    h, feats = _inputs()
    half({"sequence_output": h}, feats)
    for v, w in zip(half.weights, ref.weights):
        v.assign(w.numpy())
    out = half({"sequence_output": tf.constant(h, tf.float16)}, feats, training=True)
    assert all(v.dtype == tf.float32 for k, v in out.items())
    loss = half.loss(feats, out).numpy()
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(out["start_log_probs"].numpy()))
    np.testing.assert_allclose(loss, ref.loss(feats, ref({"sequence_output": h}, feats, training=True)).numpy(),
                               rtol=2e-2, atol=2e-2)


def test_names_config_and_deep_variant():
    head = _head()
    ours = {v.path.split("/", 1)[1] for v in head.weights}
    names = head.original_names()
    assert set(names) == ours and len(ours) == len(head.weights) == 11
    assert names["end_logits_dense_0/kernel"] == "end_logits/dense_0/kernel"
    assert names["answer_class_dense_1/kernel"] == "answer_class/dense_1/kernel"
    assert not any(k.startswith("answer_class_dense_1/bias") for k in names)
    clone = SquadHead.from_config(head.get_config())
    assert clone.get_config() == head.get_config()
    deep = _head(hidden_sizes=(12, 10), answer_class_hidden_sizes=(6,))
    h, feats = _inputs()
    out = deep({"sequence_output": h}, feats, training=False)
    assert out["end_top_index"].shape == (B, 6) and deep.original_names() == {}
    shapes = {v.path.split("/", 1)[1]: tuple(v.shape) for v in deep.weights}
    assert shapes["end_logits_hidden_0/kernel"] == (2 * D, 12) and shapes["answer_class_out/kernel"] == (6, 1)
    assert np.all(np.isfinite(deep.loss(feats, deep({"sequence_output": h}, feats, training=True)).numpy()))


def test_tf_checkpoint_round_trip(tmp_path):
    """Every sublayer is visible to tf.train.Checkpoint (d_model given: layers made at construction)."""
    h, feats = _inputs()
    src = _head(d_model=D, hidden_sizes=(12,), answer_class_hidden_sizes=(6, 5))
    path = tf.train.Checkpoint(head=src).write(str(tmp_path / "ckpt"))
    saved = [n for n, _ in tf.train.list_variables(path) if n.startswith("head/")]
    assert len(saved) == len(src.weights) == 17
    for built_first in (True, False):  # restored at once, or deferred until the variables are made
        dst = SquadHead(d_model=D, start_n_top=3, end_n_top=2, dropout=0.0, hidden_sizes=(12,),
                        answer_class_hidden_sizes=(6, 5))
        if built_first:
            dst({"sequence_output": h}, feats)
        status = tf.train.Checkpoint(head=dst).read(path)
        a, b = (m({"sequence_output": h}, feats, training=False) for m in (src, dst))
        status.assert_consumed()
        for k in a:
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())


def test_bad_arguments():
    with pytest.raises(ValueError, match="start_n_top"):
        SquadHead(start_n_top=0)
    with pytest.raises(ValueError, match="dropout"):
        SquadHead(dropout=1.0)
    head = _head()
    h, feats = _inputs()
    out = head({"sequence_output": h}, {"p_mask": feats["p_mask"], "cls_index": feats["cls_index"]})
    with pytest.raises(KeyError, match="end_log_probs"):
        head.loss(feats, out)
