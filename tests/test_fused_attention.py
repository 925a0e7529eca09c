"""The compiled relative-attention kernels (xlnet_tf/accel/kernels): same numbers as the TensorFlow ops, used only
where they may be (inference, float32, no XLA, no SavedModel), clear errors, and a build stamp that is checked.
HF parity through the kernel: tests/test_parity_hf.py (the "fused" cases)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import tiny
from xlnet_tf import XLNetConfig, XLNetModel, accel, ops
from xlnet_tf.accel import chunks, kernels
from xlnet_tf.attention import rel_shift
from xlnet_tf.masks import attention_masks, mask_value, segment_diff

OP = kernels.load()
NO_KERNELS = "xla,chunks"  # every acceleration but the kernels
needs_kernel = pytest.mark.skipif(OP is None, reason=f"fused attention kernel: {kernels.status()}")


def reference_attention(q, k, v, kr, rw, rr, rs, seg, diff, blocked, scale, keep=None, rate=0.0):
    """The graph's attention core (``attention.rel_attn_core``' ops, heads transposed) on [b, len, n, h] inputs,
    kr [r, n, h]; with ``keep`` [b, n, q, k] the attention dropout. Returns the output and the probabilities."""
    t = lambda x: tf.transpose(x, [0, 2, 1, 3])
    s = tf.cast(scale, q.dtype)
    qs = t(q) * s
    ac = tf.matmul(qs + tf.expand_dims(rw, 1) * s, t(k), transpose_b=True)
    bd = tf.matmul(qs + tf.expand_dims(rr, 1) * s, tf.transpose(kr, [1, 0, 2]), transpose_b=True)
    score = ac + rel_shift(bd, tf.shape(ac)[-1])
    if diff is not None:
        ef = tf.matmul(qs + tf.expand_dims(rs, 1) * s, tf.transpose(seg, [1, 2, 0]))
        score += tf.where(tf.expand_dims(diff, 1), ef[..., 1:], ef[..., :1])
    if blocked is not None:
        score = tf.where(tf.expand_dims(blocked, 1), tf.cast(mask_value(score.dtype), score.dtype), score)
    prob = tf.nn.softmax(score, axis=-1)
    dropped = prob if keep is None else ops.apply_keep(prob, keep, rate)
    return t(tf.matmul(dropped, t(v))), prob


def factored_positions(rng, rlen, n, h):
    """Positional tables in the op's factored form and the [r, n, h] rows they stand for."""
    n_rows = rlen // 2 + 2
    sin = rng.normal(0, 1.0, (n_rows, n * h)).astype(np.float32)
    cos = rng.normal(0, 1.0, (n_rows, n * h)).astype(np.float32)
    index = rng.integers(0, n_rows, rlen).astype(np.int32)
    sign = rng.choice([-1.0, 0.0, 1.0], rlen).astype(np.float32)
    rows = (cos[index] + sign[:, None] * sin[index]).reshape(rlen, n, h)
    return (tf.constant(sin), tf.constant(cos), tf.constant(index), tf.constant(sign)), tf.constant(rows)


@needs_kernel
@pytest.mark.parametrize("b,q,mlen,n,h,attn,same_length,seg,mask", [
    (2, 37, 0, 3, 16, "bi", False, True, True),     # rows not a multiple of the 32-row tile, keys of 16
    (3, 10, 6, 2, 64, "bi", False, True, True),     # memory columns
    (2, 20, 5, 2, 32, "uni", True, True, True),     # causal + same_length: shifted rows past the table
    (1, 70, 0, 2, 16, "uni", False, False, True),
    (2, 33, 0, 4, 16, "bi", False, False, False),   # no segment term, nothing blocked
    (2, 9, 0, 2, 16, "bi", False, True, False),
])
def test_kernel_matches_graph_ops(b, q, mlen, n, h, attn, same_length, seg, mask):
    rng = np.random.default_rng(q * 7 + mlen)
    klen = q + mlen
    rlen = klen + q if attn == "bi" else klen + 1
    f = lambda *shape: tf.constant(rng.normal(0, 1.0, shape).astype(np.float32))
    qh, kh, vh = f(b, q, n, h), f(b, klen, n, h), f(b, klen, n, h)
    tables, kr = factored_positions(rng, rlen, n, h)
    rw, rr, rs, seg_embed = f(n, h), f(n, h), f(n, h), f(2, n, h)
    padding = np.ones((b, q), np.int32)
    padding[0, :3] = 0  # left padding in the first row
    _, blocked = attention_masks(q, mlen, b, tf.constant(padding) if mask else None, None, attn, same_length)
    diff = segment_diff(tf.constant(rng.integers(0, 3, (b, q)), tf.int32), mlen) if seg else None
    scale = 1.0 / np.sqrt(h)
    ref = reference_attention(qh, kh, vh, kr, rw, rr, rs, seg_embed, diff, blocked, scale)[0].numpy()
    none = tf.zeros([0, 0, 0], tf.bool)
    got = OP.xlnet_rel_attention(qh, kh, vh, *tables, rw, rr, rs, seg_embed, none if diff is None else diff,
                                 none if blocked is None else blocked, scale=scale).numpy()
    assert np.std(ref) > 0.3  # far from uniform attention
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


@needs_kernel
def test_kernel_errors_name_the_shapes():
    z = lambda *s: tf.zeros(s, tf.float32)
    none = tf.zeros([0, 0, 0], tf.bool)

    def call(q, k, nh=32, r=8, index=None, blocked=none):
        h = q[-1]
        pos = (z(5, nh), z(5, nh), tf.zeros([r], tf.int32) if index is None else tf.constant(index, tf.int32),
               z(r))
        return OP.xlnet_rel_attention(z(*q), z(*k), z(*k), *pos, z(2, h), z(2, h), z(2, h), z(2, 2, h), none,
                                      blocked, scale=0.25)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"shapes do not agree: q \[1,4,2,16\], k \[1,5,2,8\]"):
        call((1, 4, 2, 16), (1, 5, 2, 8))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"d_head must be a multiple of \d+, got 12"):
        call((1, 4, 2, 12), (1, 4, 2, 12), nh=24)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"blocked must be \[b\|1, q, k\], got \[2,4,3\]"):
        call((2, 4, 2, 16), (2, 4, 2, 16), blocked=tf.zeros([2, 4, 3], tf.bool))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positional tables must be sin, cos \[R, 32\]"):
        call((1, 4, 2, 16), (1, 4, 2, 16), nh=24)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positional index\[2\] = 7 outside \[0, 5\)"):
        call((1, 4, 2, 16), (1, 4, 2, 16), r=4, index=[0, 1, 7, 2])


def two_stream_inputs(b, q, n_predict=3, seed=2):
    """perm_mask (random factorisation order) and target_mapping (one-hot rows, the last one all zero)."""
    rng = np.random.default_rng(seed)
    perm = np.zeros((b, q, q), np.float32)
    for i in range(b):
        order = rng.permutation(q)
        rank = np.argsort(order)
        perm[i] = rank[None, :] >= rank[:, None]  # i may not see j unless j comes earlier in the order
    tm = np.zeros((b, n_predict, q), np.float32)
    for i in range(b):
        tm[i, np.arange(n_predict - 1), rng.choice(q, n_predict - 1, replace=False)] = 1.0
    return dict(perm_mask=tf.constant(perm), target_mapping=tf.constant(tm))


# The kernels' test model: the suite's tiny model with 4 heads of 16 and 50 tokens.
SHAPE = tiny(n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128, n_token=50)


def small_model(**run):
    run = {"dropout": 0.1, "dropatt": 0.1, **run}
    cfg = XLNetConfig(**SHAPE, initializer_range=0.3, **run)
    return XLNetModel(cfg, seed=3)


def graph_op_types(graph_def):
    """Op types of a GraphDef, including its function library (tf.cond branches, nested functions)."""
    return {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}


def op_types(fn, *args):
    return graph_op_types(fn.get_concrete_function(*args).graph.as_graph_def())


@pytest.mark.slow
@needs_kernel
@pytest.mark.parametrize("run", [dict(), dict(mem_len=5), dict(attn_type="uni", same_length=True, mem_len=4),
                                 dict(two_stream=True)])
def test_model_same_outputs_with_and_without_kernel(run, monkeypatch):
    """Whole model, inference, segments + left padding (+ memory, + the query stream with perm_mask and
    target_mapping): the kernel's forward equals the graph's."""
    run = dict(run)
    two_stream = run.pop("two_stream", False)
    model = small_model(**run)
    rng = np.random.default_rng(0)
    ids = tf.constant(rng.integers(0, 50, (4, 12)), tf.int32)
    seg = tf.constant(rng.integers(0, 2, (4, 12)), tf.int32)
    mask = np.ones((4, 12), np.int32)
    mask[1, :5] = 0
    mems = [tf.constant(rng.normal(0, 1, (4, 3, 64)), tf.float32) for _ in range(2)] if run.get("mem_len") else None
    outs, graphs = {}, {}
    for fused in (False, True):
        monkeypatch.setattr(model.config, "accelerate", True if fused else NO_KERNELS)
        kw = two_stream_inputs(4, 12) if two_stream else {}
        fn = tf.function(lambda: model(ids, segment_ids=seg, padding_mask=tf.constant(mask), mems=mems, **kw))
        graphs[fused] = op_types(fn)
        outs[fused] = fn()
    assert "XlnetRelAttention" in graphs[True] and "XlnetRelAttention" not in graphs[False]
    h = outs[True]["sequence_output"].numpy()
    assert np.std(h) > 0.3
    np.testing.assert_allclose(h, outs[False]["sequence_output"].numpy(), atol=1e-5, rtol=0)
    if two_stream:
        g = outs[True]["query_output"].numpy()
        assert np.std(g) > 0.3
        np.testing.assert_allclose(g, outs[False]["query_output"].numpy(), atol=1e-5, rtol=0)
    for a, b in zip(outs[True].get("new_mems", []), outs[False].get("new_mems", [])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
@needs_kernel
def test_kernel_only_where_it_may_run(monkeypatch):
    """Training uses the training pair of ops (never the inference op, which has no gradient: also with dropout
    0, where no seed is drawn); bi_data, XLA-compiled functions, SavedModel tracing and bfloat16 use TensorFlow's
    ops."""
    model = small_model()
    ids = tf.constant(np.arange(24).reshape(2, 12) % 50, tf.int32)
    tm = tf.one_hot([[3, 5], [0, 11]], 12)
    perm = tf.zeros([2, 12, 12])
    kernel_ops = {"XlnetRelAttention", "XlnetRelAttentionTrain", "XlnetRelAttentionGrad"}
    uses = lambda fn: "XlnetRelAttention" in op_types(fn)
    uses_any = lambda fn: bool(kernel_ops & op_types(fn))
    assert uses(tf.function(lambda: model(ids)["sequence_output"]))
    no_dropout = small_model(dropout=0.0, dropatt=0.0)  # training without dropout: no seed
    shared = small_model(pos_dropout="shared")  # one positional-dropout mask for the batch
    for m in (shared, no_dropout):
        types = op_types(tf.function(lambda: m(ids, training=True)["sequence_output"]))
        assert "XlnetRelAttentionTrain" in types and "XlnetRelAttention" not in types
    # the original's per-example positional dropout: each example has its own projected encodings
    assert not uses_any(tf.function(lambda: model(ids, training=True)["sequence_output"]))

    @tf.function
    def grads(training):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(no_dropout(ids, training=training)["sequence_output"] ** 2)
        return tape.gradient(loss, no_dropout.trainable_variables[3])

    assert float(tf.reduce_sum(tf.abs(grads(True)))) > 0
    with pytest.raises(ValueError, match="has no gradient.*training=True"):
        grads(False)
    two = op_types(tf.function(lambda: model(ids, perm_mask=perm, target_mapping=tm)["query_output"]))
    assert "XlnetRelAttention" in two  # both streams: the query stream at the target positions
    bi_data = small_model(bi_data=True)
    assert not uses_any(tf.function(lambda: bi_data(ids)["sequence_output"]))
    with accel.portable_graph():
        assert not uses_any(tf.function(lambda: model(ids)["sequence_output"]))
        assert not uses_any(tf.function(lambda: model(ids, training=True)["sequence_output"]))
    xla = tf.function(lambda: model(ids)["sequence_output"], jit_compile=True)
    plain = tf.function(lambda: model(ids)["sequence_output"])
    np.testing.assert_allclose(xla().numpy(), plain().numpy(), atol=1e-5, rtol=0)  # compiles: no custom op inside

    @tf.function(jit_compile=True)
    def xla_grad():  # compiles: a training step under XLA keeps the graph's attention too
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(no_dropout(ids, training=True)["sequence_output"] ** 2)
        return tape.gradient(loss, no_dropout.trainable_variables[3])

    np.testing.assert_allclose(xla_grad().numpy(), grads(True).numpy(), atol=1e-5, rtol=1e-5)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half = small_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert not uses_any(tf.function(lambda: half(ids)["sequence_output"]))
    assert not uses_any(tf.function(lambda: half(ids, training=True)["sequence_output"]))


def test_stamp_is_checked(tmp_path, monkeypatch):
    """A library built for another TensorFlow, source or CPU is not loaded; the status says which and how to fix."""
    lib, stamp = tmp_path / "_rel_attention.so", tmp_path / "_rel_attention.so.json"
    monkeypatch.setattr(kernels, "LIBRARY", str(lib))
    monkeypatch.setattr(kernels, "STAMP", str(stamp))
    monkeypatch.setattr(kernels, "_loaded", None)
    assert "not built" in kernels.status() and kernels.load() is None
    lib.write_bytes(b"not a library")
    stamp.write_text(json.dumps(dict(kernels.expected_stamp(), tensorflow="2.0.0")))
    monkeypatch.setattr(kernels, "_loaded", None)
    assert kernels.status().startswith("stale build (differs in tensorflow)") and kernels.load() is None
    assert "python -m xlnet_tf.accel.kernels build" in kernels.status()


@pytest.mark.slow
@needs_kernel
def test_saved_models_never_contain_the_kernel(tmp_path, monkeypatch):
    """``export.save_atomically`` traces under ``portable_graph``: a SavedModel loads where the op library is
    absent (TF Serving, a process that never built it), even when the same model uses the kernel in Python."""
    from tensorflow.core.protobuf import saved_model_pb2

    from xlnet_tf.export import save_atomically

    model = small_model()
    ids = tf.constant(np.arange(24).reshape(2, 12) % 50, tf.int32)
    eager_out = model(ids)["sequence_output"].numpy()  # uses the kernel
    module = tf.Module()
    module.model = model
    module.serve = tf.function(lambda input_ids: {"h": model(input_ids)["sequence_output"]},
                               input_signature=[tf.TensorSpec([None, None], tf.int32)])
    assert "XlnetRelAttention" in op_types(module.serve)
    module.serve = tf.function(lambda input_ids: {"h": model(input_ids)["sequence_output"]},
                               input_signature=[tf.TensorSpec([None, None], tf.int32)])
    save_atomically(module, str(tmp_path / "sm"), {"serving_default": module.serve})
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((tmp_path / "sm" / "saved_model.pb").read_bytes())
    types = graph_op_types(sm.meta_graphs[0].graph_def)
    assert "XlnetRelAttention" not in types and "BatchMatMulV2" in types  # the graph's attention instead
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.signatures["serving_default"](input_ids=ids)["h"].numpy(), eager_out,
                               atol=1e-5, rtol=0)


@needs_kernel
@pytest.mark.parametrize("run,chunk,segments", [
    (dict(), 0, True), (dict(), 5, False),                       # query chunks: per-chunk dropout masks
    (dict(mem_len=3), 0, True),
    (dict(attn_type="uni", same_length=True, mem_len=4), 0, True),
    (dict(dropout=0.0, dropatt=0.0), 0, False),                  # training without dropout (no seed)
    (dict(untie_r=False), 0, True),                              # biases shared by the layers
    (dict(two_stream=True), 0, False), (dict(two_stream=True, mem_len=3), 5, True),  # query stream: perm_mask, targets
])  # segments on and off each with chunks, memory-free and the query stream (not the whole cross product)
@pytest.mark.slow
def test_training_kernels_same_outputs_and_gradients(run, chunk, segments, monkeypatch):
    """A training step through the training kernels (forward + backward op) equals the graph's: outputs and
    every gradient, with the same attention-dropout masks, segments, left padding and memory."""
    monkeypatch.setattr(chunks, "CHUNK", chunk)
    cfg = dict(run)
    untie = cfg.pop("untie_r", True)
    two_stream = cfg.pop("two_stream", False)
    model = small_model(pos_dropout="shared", **cfg)  # the kernels take one set of encodings for the batch
    if not untie:
        model = XLNetModel(XLNetConfig(**dict(SHAPE, untie_r=False), initializer_range=0.3, dropout=0.1,
                                       dropatt=0.1, pos_dropout="shared"), seed=3)
    rng = np.random.default_rng(1)
    b, q = 3, 13
    ids = tf.constant(rng.integers(0, 50, (b, q)), tf.int32)
    seg = tf.constant(rng.integers(0, 3, (b, q)), tf.int32) if segments else None
    mask = np.ones((b, q), np.int32)
    mask[1, :4] = 0
    mems = [tf.constant(rng.normal(0, 1, (b, 3, 64)), tf.float32) for _ in range(2)] if run.get("mem_len") else None
    results, graphs = {}, {}
    for fused in (False, True):
        monkeypatch.setattr(model.config, "accelerate", True if fused else NO_KERNELS)
        model.dropout_seed.assign([7, 0])
        kw = two_stream_inputs(b, q) if two_stream else {}
        step = tf.function(lambda: _model_step_graph(model, ids, seg, tf.constant(mask), mems, **kw))
        graphs[fused] = op_types(step)
        results[fused] = step()
    assert "XlnetRelAttentionGrad" in graphs[True] and "XlnetRelAttentionTrain" in graphs[True]
    assert not {"XlnetRelAttentionTrain", "XlnetRelAttention"} & graphs[False]
    (h0, g0), (h1, g1) = results[False], results[True]
    assert np.std(h0.numpy()) > 0.3
    np.testing.assert_allclose(h1.numpy(), h0.numpy(), atol=1e-5, rtol=0)
    names = [v.path for v in model.trainable_variables]
    assert len(g0) == len(g1)
    for name, a, c in zip(names, g0, g1):
        assert (a is None) == (c is None), name
        if a is not None:
            a, c = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(c).numpy()
            scale = max(np.abs(a).max(), 1e-3)
            # Both sides sum in float32 in different orders (TF's threaded reductions vary from run to run):
            # single elements were seen 2.9e-5 off relative to themselves, and 2.3e-5, 2.6e-5 (one of 4,096 in layer
            # 1's q, a whole-suite run on AVX2) and 5.0e-5 (AVX-512) of the largest: rtol, and atol 1e-4 of the
            # largest.
            np.testing.assert_allclose(c, a, atol=1e-4 * scale, rtol=1e-4, err_msg=name)


def _model_step_graph(model, ids, seg, mask, mems, **kw):
    """Outputs and gradients of a training forward, loss mean(sin(3h)) (+ mean(sin(3g)) with the query stream).
    (Not mean(h^2): after the last LayerNorm that is ~1 whatever the weights, so most gradients would be noise.)"""
    with tf.GradientTape() as tape:
        out = model(ids, segment_ids=seg, padding_mask=mask, mems=mems, training=True, **kw)
        h = out["sequence_output"]
        loss = tf.reduce_mean(tf.sin(3.0 * h))
        if "query_output" in out:
            h = tf.concat([h, out["query_output"]], axis=1)
            loss += tf.reduce_mean(tf.sin(3.0 * out["query_output"]))
    return h, tape.gradient(loss, model.trainable_variables)


@needs_kernel
@pytest.mark.parametrize("b,q,mlen,n,h,attn,seg,mask,rate", [
    (2, 37, 0, 3, 16, "bi", True, True, 0.2),     # rows not a multiple of the 32-row tile
    (2, 70, 6, 2, 64, "bi", True, True, 0.1),     # memory columns, three tiles, d_head 64
    (2, 20, 5, 2, 32, "uni", True, True, 0.0),    # causal, no attention dropout
    (1, 33, 0, 2, 16, "bi", False, False, 0.3),   # no segment term, nothing blocked
])
def test_training_kernels_match_autodiff(b, q, mlen, n, h, attn, seg, mask, rate):
    """The training forward op and its gradient op equal the graph ops and TensorFlow's autodiff of them
    (dropout with the same keep mask), for q, k, v, the positional rows, the three biases and seg_embed."""
    rng = np.random.default_rng(q + mlen)
    klen = q + mlen
    rlen = klen + q if attn == "bi" else klen + 1
    f = lambda *shape: tf.constant(rng.normal(0, 1.0, shape).astype(np.float32))
    args = [f(b, q, n, h), f(b, klen, n, h), f(b, klen, n, h), f(rlen, n, h), f(n, h), f(n, h), f(n, h),
            f(2, n, h)]
    padding = np.ones((b, q), np.int32)
    padding[0, :3] = 0
    _, blocked = attention_masks(q, mlen, b, tf.constant(padding) if mask else None, None, attn, False)
    diff = segment_diff(tf.constant(rng.integers(0, 3, (b, q)), tf.int32), mlen) if seg else None
    keep = tf.constant(rng.random((b, n, q, klen)) >= rate) if rate else None
    scale, ks = 1.0 / np.sqrt(h), 1.0 / (1.0 - rate)
    d_out = f(b, q, n, h)

    with tf.GradientTape() as tape:
        tape.watch(args)
        ref, prob = reference_attention(*args, diff, blocked, scale, keep, rate)
        loss = tf.reduce_sum(ref * d_out)
    ref_grads = [tf.zeros_like(a) if g is None else g for a, g in zip(args, tape.gradient(loss, args))]

    none3, none4 = tf.zeros([0, 0, 0], tf.bool), tf.zeros([0, 0, 0, 0], tf.bool)
    flat = [args[0], args[1], args[2], tf.reshape(args[3], [rlen, n * h])] + args[4:]
    extra = [none3 if diff is None else diff, none3 if blocked is None else blocked, none4 if keep is None else keep]
    out, p = OP.xlnet_rel_attention_train(*flat, *extra, scale=scale, keep_scale=ks)
    np.testing.assert_allclose(p.numpy(), prob.numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-5, rtol=0)
    grads = OP.xlnet_rel_attention_grad(d_out, *flat, *extra, p, scale=scale, keep_scale=ks)
    names = ["q", "k", "v", "kr", "r_w", "r_r", "r_s", "seg_embed"]
    for name, got, want in zip(names, grads, ref_grads):
        want = tf.reshape(want, got.shape).numpy()
        if name in ("r_s", "seg_embed") and diff is None:
            assert not np.any(want) and not np.any(got.numpy()), name
            continue
        assert np.std(want) > 0.05, name  # a real gradient
        tol = 2e-6 * max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got.numpy(), want, atol=tol, rtol=0, err_msg=name)


@needs_kernel
def test_training_kernel_errors_name_the_shapes():
    z = lambda *s, dt=tf.float32: tf.zeros(s, dt)
    none3, none4 = z(0, 0, 0, dt=tf.bool), z(0, 0, 0, 0, dt=tf.bool)
    base = [z(2, 4, 2, 16), z(2, 6, 2, 16), z(2, 6, 2, 16), z(10, 32), z(2, 16), z(2, 16), z(2, 16), z(2, 2, 16)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positional rows kr must be \[r, 32\], got \[10,16\]"):
        OP.xlnet_rel_attention_train(*base[:3], z(10, 16), *base[4:], none3, none3, none4, scale=0.25, keep_scale=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"keep must be \[2,2,4,6\] or \[0, 0, 0, 0\], got \[2,2,6,4\]"):
        OP.xlnet_rel_attention_train(*base, none3, none3, z(2, 2, 6, 4, dt=tf.bool), scale=0.25, keep_scale=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"r_w, r_r, r_s biases must be \[2, 16\]"):
        OP.xlnet_rel_attention_train(*base[:4], z(3, 16), *base[5:], none3, none3, none4, scale=0.25, keep_scale=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"prob must be \[2,2,4,6\], got \[0,0,0,0\]"):
        OP.xlnet_rel_attention_grad(z(2, 4, 2, 16), *base, none3, none3, none4, z(0, 0, 0, 0), scale=0.25,
                                    keep_scale=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"d_out must be shaped like q \[2,4,2,16\], got \[2,4,2,32\]"):
        OP.xlnet_rel_attention_grad(z(2, 4, 2, 32), *base, none3, none3, none4, z(2, 2, 4, 6), scale=0.25,
                                    keep_scale=1.0)



@pytest.mark.slow
@pytest.mark.parametrize("two_stream", [False, True])
@pytest.mark.parametrize("q,rate", [(300, 0.0), (20, 0.1)])
def test_accelerate_off_is_the_plain_math_with_the_same_outputs_and_gradients(two_stream, q, rate):
    """``accelerate=False`` (one run option): no compiled kernel, no XLA cluster and no query chunking in the
    graph, and the same outputs and gradients as the accelerated model (same weights; with dropout the same
    masks, at a length without query chunks, whose attention masks are drawn per chunk)."""
    rng = np.random.default_rng(2)
    b = 2  # q = 300: long enough for query chunks
    ids = tf.constant(rng.integers(0, 50, (b, q)), tf.int32)
    seg = tf.constant(rng.integers(0, 2, (b, q)), tf.int32)
    mask = np.ones((b, q), np.int32)
    mask[1, :7] = 0
    kw = two_stream_inputs(b, q) if two_stream else {}
    results, graphs = {}, {}
    fast = small_model(pos_dropout="shared", dropout=rate, dropatt=rate)
    for accelerate in (True, False):
        model = fast if accelerate else XLNetModel(fast.config.replace(accelerate=False), seed=3)
        if not accelerate:
            model(ids[:, :4])
            for a, w in zip(model.weights, fast.weights):
                a.assign(w)
        model.dropout_seed.assign([7, 0])
        step = tf.function(lambda: _model_step_graph(model, ids, seg, tf.constant(mask), None, **kw))
        graphs[accelerate] = op_types(step)
        results[accelerate] = step()
    kernels_ops = {"XlnetRelAttention", "XlnetRelAttentionTrain", "XlnetRelAttentionGrad"}
    assert not kernels_ops & graphs[False]
    if q == 20 and OP is not None:  # the accelerated model does use the kernels here
        assert kernels_ops & graphs[True]
    (h0, g0), (h1, g1) = results[True], results[False]
    np.testing.assert_allclose(h1.numpy(), h0.numpy(), atol=2e-5, rtol=0)
    pairs = [(v, tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(c).numpy())
             for v, a, c in zip(fast.trainable_variables, g0, g1) if a is not None]
    floor = 1e-3 * max(np.abs(a).max() for _, a, _ in pairs)
    for v, a, c in pairs:
        np.testing.assert_allclose(c, a, atol=5e-5 * max(np.abs(a).max(), floor), rtol=0, err_msg=v.path)
