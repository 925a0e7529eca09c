"""The compiled relative-attention kernel (xlnet_tf/kernels): same numbers as the TensorFlow ops, used only where
it may be (inference, float32, no XLA, no SavedModel), clear errors, and a build stamp that is checked.
HF parity through the kernel: tests/test_parity_hf.py (the "fused" cases)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from xlnet_tf import XLNetConfig, XLNetModel, kernels, layers
from xlnet_tf.masks import attention_masks, segment_diff

OP = kernels.load()
needs_kernel = pytest.mark.skipif(OP is None, reason=f"fused attention kernel: {kernels.status()}")


def reference_attention(q, k, v, kr, rw, rr, rs, seg, diff, blocked, scale):
    """The graph's attention core (``XLNetBlock._attend_rows``' ops, heads transposed) on [b, len, n, h] inputs."""
    t = lambda x: tf.transpose(x, [0, 2, 1, 3])
    biases = [rw, rr] + ([rs] if diff is not None else [])
    qw, qr, *qs = layers._query_terms(t(q), biases, scale)
    ac = tf.matmul(qw, t(k), transpose_b=True)
    bd = tf.matmul(qr, tf.transpose(kr, [1, 0, 2]), transpose_b=True)
    ef = None if diff is None else tf.matmul(qs[0], tf.transpose(seg, [1, 2, 0]))
    prob = layers.attention_probs(ac, bd, ef, diff, blocked)
    return t(tf.matmul(prob, t(v)))


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
    ref = reference_attention(qh, kh, vh, kr, rw, rr, rs, seg_embed, diff, blocked, scale).numpy()
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


def small_model(**run):
    run = {"dropout": 0.1, "dropatt": 0.1, **run}
    cfg = XLNetConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128, n_token=50, ff_activation="gelu",
                      untie_r=True, initializer_range=0.3, **run)
    return XLNetModel(cfg, seed=3)


def graph_op_types(graph_def):
    """Op types of a GraphDef, including its function library (tf.cond branches, nested functions)."""
    return {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}


def op_types(fn, *args):
    return graph_op_types(fn.get_concrete_function(*args).graph.as_graph_def())


@needs_kernel
@pytest.mark.parametrize("run", [dict(), dict(mem_len=5), dict(attn_type="uni", same_length=True, mem_len=4)])
def test_model_same_outputs_with_and_without_kernel(run, monkeypatch):
    """Whole model, inference, segments + left padding (+ memory): the kernel's forward equals the graph's."""
    model = small_model(**run)
    rng = np.random.default_rng(0)
    ids = tf.constant(rng.integers(0, 50, (4, 12)), tf.int32)
    seg = tf.constant(rng.integers(0, 2, (4, 12)), tf.int32)
    mask = np.ones((4, 12), np.int32)
    mask[1, :5] = 0
    mems = [tf.constant(rng.normal(0, 1, (4, 3, 64)), tf.float32) for _ in range(2)] if run.get("mem_len") else None
    outs, graphs = {}, {}
    for fused in (False, True):
        monkeypatch.setattr(layers, "FUSED_ATTENTION", fused)
        fn = tf.function(lambda: model(ids, segment_ids=seg, padding_mask=tf.constant(mask), mems=mems))
        graphs[fused] = op_types(fn)
        outs[fused] = fn()
    assert "XlnetRelAttention" in graphs[True] and "XlnetRelAttention" not in graphs[False]
    h = outs[True]["sequence_output"].numpy()
    assert np.std(h) > 0.3
    np.testing.assert_allclose(h, outs[False]["sequence_output"].numpy(), atol=1e-5, rtol=0)
    for a, b in zip(outs[True].get("new_mems", []), outs[False].get("new_mems", [])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, rtol=0)


@needs_kernel
def test_kernel_only_where_it_may_run(monkeypatch):
    """Training, the query stream, XLA-compiled functions and SavedModel tracing use TensorFlow's ops."""
    monkeypatch.setattr(layers, "FUSED_ATTENTION", True)
    model = small_model()
    ids = tf.constant(np.arange(24).reshape(2, 12) % 50, tf.int32)
    tm = tf.one_hot([[3, 5], [0, 11]], 12)
    perm = tf.zeros([2, 12, 12])
    uses = lambda fn: "XlnetRelAttention" in op_types(fn)
    assert uses(tf.function(lambda: model(ids)["sequence_output"]))
    assert not uses(tf.function(lambda: model(ids, training=True)["sequence_output"]))
    no_dropout = small_model(dropout=0.0, dropatt=0.0)  # training without dropout: no seed, still no kernel
    assert not uses(tf.function(lambda: no_dropout(ids, training=True)["sequence_output"]))

    @tf.function
    def grads(training):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(no_dropout(ids, training=training)["sequence_output"] ** 2)
        return tape.gradient(loss, no_dropout.trainable_variables[3])

    assert float(tf.reduce_sum(tf.abs(grads(True)))) > 0
    with pytest.raises(ValueError, match="has no gradient.*training=True"):
        grads(False)
    assert not uses(tf.function(lambda: model(ids, perm_mask=perm, target_mapping=tm)["query_output"]))
    with layers.portable_graph():
        assert not uses(tf.function(lambda: model(ids)["sequence_output"]))
    xla = tf.function(lambda: model(ids)["sequence_output"], jit_compile=True)
    plain = tf.function(lambda: model(ids)["sequence_output"])
    np.testing.assert_allclose(xla().numpy(), plain().numpy(), atol=1e-5, rtol=0)  # compiles: no custom op inside
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half = small_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert not uses(tf.function(lambda: half(ids)["sequence_output"]))


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
    assert "python -m xlnet_tf.kernels build" in kernels.status()


@needs_kernel
def test_saved_models_never_contain_the_kernel(tmp_path, monkeypatch):
    """``export.save_atomically`` traces under ``portable_graph``: a SavedModel loads where the op library is
    absent (TF Serving, a process that never built it), even when the same model uses the kernel in Python."""
    from tensorflow.core.protobuf import saved_model_pb2

    from xlnet_tf.export import save_atomically

    monkeypatch.setattr(layers, "FUSED_ATTENTION", True)
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
