"""XLNet's layers: positional encoding, relative attention (two streams), feed-forward, the block.

Batch-major ([batch, len, ...]) with the original's math (checked against HF's port in the tests).

Accelerations beside the math (each measured: PERFORMANCE.md "Backbone speed"): small XLA clusters with
hand-written gradients (``XLA_FUSIONS``), the compiled attention kernels (``FUSED_ATTENTION``) and query chunking
(``ATTN_CHUNK``). A model chooses them with its ``accelerate`` run option (``XLNetConfig.accelerate``; False: the
plain TensorFlow ops of the math only, the same outputs within float32 rounding); the three module constants are
the developer switches ``benchmarks/ab_switches.py`` measures one at a time.
Dropout is stateless: the model draws one seed per forward pass and every dropout site folds in its own salt,
so a recomputed block (``recompute``) replays identical masks and a resumed run replays the same masks.
"""

from __future__ import annotations

import contextlib
import math
from typing import Dict, NamedTuple, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.masks import mask_value


# Small XLA clusters. The matmuls run on oneDNN (XLA's CPU matmuls are ~15% slower), but the memory-bound
# elementwise chains between them are each compiled as one small XLA cluster, which fuses ~10 TensorFlow ops
# (one pass over memory each) into one or two passes: the attention score chain at inference (shift, adds,
# selects; the softmax stays on oneDNN), LayerNorm (forward and a hand-written backward), and in a training
# step the GELU, dropout and the residual add, each with its neighbours (see ``dropout``).
# Same formulas; outputs within ~2e-6 of the plain ops at Base size. Off (``accelerate=False`` or
# ``XLA_FUSIONS = False``): plain TensorFlow ops everywhere, except the dropout mask's random bits, which are
# always XLA's ThreeFry so that both settings draw the same masks. Measurements: PERFORMANCE.md "Backbone speed".
XLA_FUSIONS = True
_plain = False  # set while a model with ``accelerate=False`` traces (``plain_ops``)


@contextlib.contextmanager
def plain_ops(enabled: bool = True):
    """Functions traced inside use the math's plain TensorFlow ops only: no XLA cluster, compiled kernel or
    query chunking (what ``XLNetConfig.accelerate=False`` selects)."""
    global _plain
    old, _plain = _plain, bool(enabled) or _plain
    try:
        yield
    finally:
        _plain = old


def _fusions() -> bool:
    return XLA_FUSIONS and not _plain


def _xla(fn):
    return tf.function(fn, jit_compile=True, reduce_retracing=True)


# The fused attention kernels (``xlnet_tf/kernels``, built per machine by ``python -m xlnet_tf.kernels build``):
# on a CPU-only host, float32, without bi_data, a block's whole attention core (content and query stream) -- the
# biased queries, AC, BD with the relative shift, EF, the mask, the softmax (and in training the attention
# dropout) and P.V -- is one op that keeps each tile's scores in cache and reads/writes the heads in their
# [b, len, n, h] layout (no head transposes). At inference one op; in training a forward op that also returns
# the probabilities and a backward op that computes every gradient from them, with the dropout mask drawn as
# the graph path draws it. Same formulas, different summation order (outputs within ~2e-6 of the graph at Base
# size). They are skipped inside XLA-compiled functions (XLA cannot compile a custom op) and while tracing for a
# SavedModel (``portable_graph``), so exported models need nothing beyond TensorFlow and tensorflow-text.
# Off with ``accelerate=False`` (or ``FUSED_ATTENTION = False``). Measurements: PERFORMANCE.md "Backbone speed".
FUSED_ATTENTION = True
_portable = False


@contextlib.contextmanager
def portable_graph():
    """Functions traced inside use TensorFlow's own ops only (no compiled kernel): for SavedModels."""
    global _portable
    old, _portable = _portable, True
    try:
        yield
    finally:
        _portable = old


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # cannot tell: stay on TensorFlow ops
        return True
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def fused_attention_op(d_head: int, dtype):
    """The compiled relative-attention op when this trace may use it, else None."""
    if not FUSED_ATTENTION or _portable or _plain or tf.as_dtype(dtype) != tf.float32:
        return None
    from xlnet_tf import kernels

    if d_head % kernels.D_HEAD_MULTIPLE or _in_xla_context() or accelerator_visible():
        return None
    return kernels.load()


def accelerator_visible() -> bool:
    """Whether a GPU/TPU is visible (then the graph's attention runs there: the kernel is CPU-only, and the
    inference streams of ``modeling`` are off)."""
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def gelu_tanh(x):
    """The original's GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).

    Written through ``tf.nn.gelu(approximate=True)`` (the same formula, op for op) so TensorFlow's graph
    optimiser recognises it and fuses MatMul + BiasAdd + GELU into one oneDNN kernel (inference).
    """
    return tf.nn.gelu(x, approximate=True)


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh_value(u):
    return 0.5 * u * (1.0 + tf.tanh(_GELU_C * (u + 0.044715 * u * u * u)))


def _gelu_tanh_grad(u, dy):
    """dy * d/du of the tanh GELU: 0.5(1 + t) + 0.5u(1 - t^2) sqrt(2/pi)(1 + 3 * 0.044715u^2)."""
    u2 = u * u
    t = tf.tanh(_GELU_C * (u + 0.044715 * u * u2))
    return dy * (0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * (_GELU_C * (1.0 + 3.0 * 0.044715 * u2)))


_gelu_tanh_value_xla = _xla(_gelu_tanh_value)
_gelu_tanh_grad_xla = _xla(_gelu_tanh_grad)


@tf.custom_gradient
def gelu_tanh_train(u):
    """The tanh GELU of a training step: forward and backward each one XLA-fused pass over [tokens, d_inner].

    Differentiated op by op, ``tf.nn.gelu`` makes ~10 elementwise passes over the block's largest activation
    in the backward (and the forward is no longer fused into the matmul, since the backward needs the
    pre-activation).
    """
    def grad(dy):
        return _gelu_tanh_grad_xla(u, dy)

    return _gelu_tanh_value_xla(u), grad


def activation_fn(name: str):
    if name == "gelu":
        return gelu_tanh
    if name == "gelu_exact":
        return lambda x: tf.nn.gelu(x, approximate=False)
    if name == "relu":
        return tf.nn.relu
    raise ValueError(f"unknown activation {name!r}")


# ---------------------------------------------------------------------------------------------- dropout
# One mask convention for every dropout site. A site's seed is ``stateless_fold_in(seed, salt)``; its keep mask
# is ``bits >= round(rate * 2^32)`` over uint32 bits from XLA's ThreeFry for that seed and the tensor's shape
# (P(drop) = rate to within 2^-32), and kept values are scaled by 1 / (1 - rate). The bits are drawn inside XLA
# clusters because XLA's CPU ThreeFry is ~2x faster than TensorFlow's Philox kernel (and XLA's own Philox is
# ~100x slower); with ``XLA_FUSIONS`` the mask is fused with the op next to it (GELU; the residual add and
# LayerNorm; or alone), the forward cluster also returns the mask and the backward is one more cluster.


def _drop_threshold(rate: float) -> int:
    return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def _keep_mask(shape, site, rate: float):
    """The keep mask of a dropout site (bool, ``shape``); traced inside XLA clusters only."""
    bits = tf.random.stateless_uniform(shape, site, minval=None, maxval=None, dtype=tf.uint32, alg="threefry")
    return bits >= tf.constant(_drop_threshold(rate), tf.uint32)


def _apply_keep(x, keep, rate: float):
    return tf.where(keep, x * tf.cast(1.0 / (1.0 - rate), x.dtype), tf.zeros_like(x))


def _dropout_fwd(x, site, rate):
    keep = _keep_mask(tf.shape(x), site, rate)
    return _apply_keep(x, keep, rate), keep


def _gelu_dropout_fwd(u, bias, site, rate):
    keep = _keep_mask(tf.shape(u), site, rate)
    return _apply_keep(_gelu_tanh_value(u + bias), keep, rate), keep


def _gelu_dropout_bwd(u, bias, keep, dy, rate):
    du = _gelu_tanh_grad(u + bias, _apply_keep(dy, keep, rate))
    return du, _column_sum(du)


def _column_sum(x, dtype=None):
    """Sum over every axis but the last (a bias, gamma or beta gradient), accumulated in float32, returned in
    ``dtype`` (default: x's)."""
    x32 = tf.reshape(tf.cast(x, tf.float32), tf.concat([[-1], tf.shape(x)[-1:]], axis=0))
    return tf.cast(tf.reduce_sum(x32, axis=0), dtype or x.dtype)


def _dropout_add_ln_fwd(h, bias, x, gamma, beta, site, rate, eps):
    """s = dropout(h + bias) + x; LayerNorm(s), all [tokens, d]. Returns the output, s, the row mean and
    1/std, and the keep mask."""
    keep = _keep_mask(tf.shape(h), site, rate)
    s = _apply_keep(h if bias is None else h + bias, keep, rate) + x
    y, mean, rstd = _ln_forward(s, gamma, beta, eps)
    return y, s, mean, rstd, keep


def _dropout_add_ln_bwd(s, mean, rstd, gamma, keep, dy, rate, bias):
    """Gradients for h, x, gamma, beta (and bias) of ``_dropout_add_ln_fwd``."""
    ds, dgamma, dbeta = _ln_backward(s, mean, rstd, gamma, dy)
    dh = _apply_keep(ds, keep, rate)
    return (dh, ds, dgamma, dbeta) + (() if bias is None else (_column_sum(dh),))


def _site(seed, salt: int):
    return tf.random.experimental.stateless_fold_in(seed, salt)


def dropout(x, rate: float, seed: Optional[tf.Tensor], salt: int):
    """Stateless dropout; a no-op when ``seed`` is None (inference) or the rate is 0."""
    if seed is None or rate <= 0.0:
        return x
    site = _site(seed, salt)
    if not _fusions():
        return _apply_keep(x, _keep_mask_xla(tf.shape(x), site, rate), rate)

    @tf.custom_gradient
    def drop(x):
        y, keep = _dropout_fwd_xla(x, site, rate)
        return y, lambda dy: _apply_keep_xla(dy, keep, rate)

    return drop(x)


def gelu_dropout_train(u, bias, rate: float, seed: tf.Tensor, salt: int):
    """dropout(tanh GELU(u + bias)) in a training step, u [tokens, d_inner]: with ``XLA_FUSIONS`` the forward
    and the backward (incl. the bias gradient) are each one XLA-fused pass; differentiated op by op,
    ``tf.nn.gelu`` alone makes ~10 passes in the backward, and TensorFlow's BiasAddGrad is slow next to the
    matmuls."""
    if not _fusions():
        return dropout(gelu_tanh(tf.nn.bias_add(u, bias)), rate, seed, salt)
    if rate <= 0.0:
        return gelu_tanh_train(tf.nn.bias_add(u, bias))
    site = _site(seed, salt)

    @tf.custom_gradient
    def f(u, bias):
        y, keep = _gelu_dropout_fwd_xla(u, bias, site, rate)
        return y, lambda dy: _gelu_dropout_bwd_xla(u, bias, keep, dy, rate)

    return f(u, bias)


def dropout_add_layer_norm(h, x, gamma, beta, eps: float, rate: float, seed: Optional[tf.Tensor], salt: int,
                           bias=None):
    """LayerNorm(dropout(h + bias) + x) over [tokens, d]: the residual sub-layer ending. In a training step with
    ``XLA_FUSIONS`` the forward (bias, mask, add, LayerNorm) and the backward are one XLA cluster each."""
    if not _fusions() or seed is None or rate <= 0.0:
        if bias is not None:
            h = tf.nn.bias_add(h, bias)
        return layer_norm(dropout(h, rate, seed, salt) + x, gamma, beta, eps)
    site = _site(seed, salt)

    @tf.custom_gradient
    def f(h, x, gamma, beta, *bias_arg):
        b = bias_arg[0] if bias_arg else None
        y, s, mean, rstd, keep = _dropout_add_ln_fwd_xla(h, b, x, gamma, beta, site, rate, eps)
        return y, lambda dy: _dropout_add_ln_bwd_xla(s, mean, rstd, gamma, keep, dy, rate, b)

    return f(h, x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta),
             *(() if bias is None else (tf.convert_to_tensor(bias),)))


def _query_terms(q, biases, scale):
    """q [b, n, q, h] -> (q + bias) * scale for each [n, h] bias: the queries of the AC, BD (and EF) terms."""
    qs = q * tf.cast(scale, q.dtype)
    return tuple(qs + tf.expand_dims(b, 1) * tf.cast(scale, q.dtype) for b in biases)


def _query_terms_grad(dys, scale):
    """Gradients of ``_query_terms`` for q and each bias (bias sums over batch and rows in float32)."""
    s = tf.cast(scale, dys[0].dtype)
    dbs = [tf.cast(tf.reduce_sum(tf.cast(dy, tf.float32), axis=[0, 2]) * scale, dy.dtype) for dy in dys]
    return (tf.add_n(list(dys)) * s,) + tuple(dbs)


def query_terms(q, biases, scale: float):
    """The biased, scaled queries of relative attention, ((q + r_w) s, (q + r_r) s[, (q + r_s) s]) with
    s = 1/sqrt(d_head). With ``XLA_FUSIONS`` forward and backward are one XLA cluster each (the backward sums
    the bias gradients over batch and rows in the same pass; as separate ops they were slow reductions)."""
    if not _fusions():
        return _query_terms(q, biases, scale)

    @tf.custom_gradient
    def f(q, *biases):
        outs = _query_terms_xla(q, biases, scale)

        def grad(*dys):
            dys = [tf.zeros_like(o) if d is None else d for d, o in zip(dys, outs)]
            return _query_terms_grad_xla(dys, scale)

        return outs, grad

    return f(q, *biases)


def layer_norm(x, gamma, beta, eps: float):
    """LayerNorm over the last axis, statistics in float32 (safe under float16 compute).

    With ``XLA_FUSIONS`` the forward is one XLA cluster that also returns the row mean and 1/std, and the
    backward is a second cluster (the closed-form LayerNorm gradient); otherwise plain TensorFlow ops.
    """
    if not _fusions():
        return layer_norm_ops(x, gamma, beta, eps)

    @tf.custom_gradient
    def ln(x, gamma, beta):
        y, mean, rstd = _ln_forward_xla(x, gamma, beta, eps)

        def grad(dy):
            return _ln_backward_xla(x, mean, rstd, gamma, dy)

        return y, grad

    return ln(x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta))


def _ln_forward(x, gamma, beta, eps):
    x32 = tf.cast(x, tf.float32)
    mean = tf.reduce_mean(x32, axis=-1, keepdims=True)
    xc = x32 - mean
    rstd = tf.math.rsqrt(tf.reduce_mean(xc * xc, axis=-1, keepdims=True) + eps)
    y = xc * rstd * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32)
    return tf.cast(y, x.dtype), mean, rstd


def _ln_backward(x, mean, rstd, gamma, dy):
    """Gradients of ``_ln_forward`` for x, gamma and beta: with xhat = (x - mean) * rstd and g = dy * gamma,
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dgamma = sum(dy * xhat), dbeta = sum(dy)."""
    x32, dy32 = tf.cast(x, tf.float32), tf.cast(dy, tf.float32)
    xhat = (x32 - mean) * rstd
    g = dy32 * tf.cast(gamma, tf.float32)
    dx = rstd * (g - tf.reduce_mean(g, axis=-1, keepdims=True)
                 - xhat * tf.reduce_mean(g * xhat, axis=-1, keepdims=True))
    return tf.cast(dx, x.dtype), _column_sum(dy32 * xhat, gamma.dtype), _column_sum(dy32, gamma.dtype)


_ln_forward_xla = _xla(_ln_forward)
_ln_backward_xla = _xla(_ln_backward)
_query_terms_xla = _xla(_query_terms)
_query_terms_grad_xla = _xla(_query_terms_grad)
_keep_mask_xla = _xla(_keep_mask)
_apply_keep_xla = _xla(_apply_keep)
_dropout_fwd_xla = _xla(_dropout_fwd)
_gelu_dropout_fwd_xla = _xla(_gelu_dropout_fwd)
_gelu_dropout_bwd_xla = _xla(_gelu_dropout_bwd)
_dropout_add_ln_fwd_xla = _xla(_dropout_add_ln_fwd)
_dropout_add_ln_bwd_xla = _xla(_dropout_add_ln_bwd)


def layer_norm_ops(x, gamma, beta, eps: float):
    """LayerNorm over the last axis, statistics in float32 (safe under float16 compute)."""
    dtype = x.dtype
    x32 = tf.cast(x, tf.float32)
    mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
    y = (x32 - mean) * tf.math.rsqrt(var + eps)
    y = y * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32)
    return tf.cast(y, dtype)


def _relative_distances(qlen, klen, attn_type: str, bi_data: bool, clamp_len: int) -> tf.Tensor:
    """The relative distances the encodings stand for, float32 [pb, rlen] (see below)."""
    beg = tf.cast(klen, tf.float32)
    end = tf.cast(-qlen if attn_type == "bi" else -1, tf.float32)
    fwd = tf.range(beg, end, -1.0, dtype=tf.float32)
    pos = tf.stack([fwd, -fwd] if bi_data else [fwd], axis=0)
    if clamp_len is not None and clamp_len > 0:
        pos = tf.clip_by_value(pos, -float(clamp_len), float(clamp_len))
    return pos


def _inv_freq(d_model: int) -> tf.Tensor:
    freq = tf.range(0, d_model, 2.0, dtype=tf.float32)
    return 1.0 / tf.pow(10000.0, freq / d_model)


def relative_positional_encoding(qlen, klen, d_model: int, attn_type: str, bi_data: bool, clamp_len: int,
                                 dtype=tf.float32) -> tf.Tensor:
    """Sinusoid encodings of the relative distances, [pb, rlen, d_model] (pb = 2 with bi_data, else 1).

    bi: distances klen .. -qlen+1; uni: klen .. 1 (rlen = klen + 1). The sin block comes before the cos block.
    With bi_data the second entry holds the backward half's encodings (negated distances).
    """
    sinusoid = _relative_distances(qlen, klen, attn_type, bi_data, clamp_len)[..., None] * _inv_freq(d_model)
    return tf.cast(tf.concat([tf.sin(sinusoid), tf.cos(sinusoid)], axis=-1), dtype)


class PositionalBasis(NamedTuple):
    """The relative encodings in factored form, for a forward pass without dropout on them (inference).

    An encoding is [sin(d f), cos(d f)] and sin is odd, cos even, so the projection of distance d by
    W_r = [W_sin; W_cos] is sign(d) sin(|d| f) W_sin + cos(|d| f) W_cos. Each block then multiplies only the
    sin and cos tables of the distinct |d| (half the rows of the bidirectional encoding, half the columns each:
    a quarter of the multiply-adds of the [rlen, d_model] x [d_model, n*h] projection) and picks rows.
    """
    sin: tf.Tensor    # [R, d_model / 2] for |d| = 0 .. R-1
    cos: tf.Tensor    # [R, d_model / 2]
    index: tf.Tensor  # int32 [pb, rlen]: |d| of each encoding row
    sign: tf.Tensor   # [pb, rlen]: sign(d) (0 for d = 0, where the sin term is 0)


def positional_basis(qlen, klen, d_model: int, attn_type: str, bi_data: bool, clamp_len: int,
                     dtype=tf.float32) -> PositionalBasis:
    """``relative_positional_encoding`` in factored form (see ``PositionalBasis``)."""
    pos = _relative_distances(qlen, klen, attn_type, bi_data, clamp_len)
    mag = tf.abs(pos)
    absd = tf.range(0.0, tf.reduce_max(mag) + 1.0, 1.0, dtype=tf.float32)
    sinusoid = absd[:, None] * _inv_freq(d_model)
    return PositionalBasis(tf.cast(tf.sin(sinusoid), dtype), tf.cast(tf.cos(sinusoid), dtype),
                           tf.cast(mag, tf.int32), tf.cast(tf.sign(pos), dtype))


def rel_shift(x: tf.Tensor, klen) -> tf.Tensor:
    """[b, n, q, r] -> [b, n, q, klen]: afterwards (i, j) holds the score for distance mlen + i - j.

    ``tf.slice`` rather than ``x[...]``: the gradient of Slice is a Pad, the gradient of StridedSlice a
    StridedSliceGrad that was ~8x slower here (the backward of this op dominated the attention's).
    """
    b, n, q, r = tf.unstack(tf.shape(x))
    x = tf.reshape(x, tf.stack([b, n, r, q]))
    x = tf.slice(x, [0, 0, 1, 0], [-1, -1, -1, -1])
    x = tf.reshape(x, tf.stack([b, n, q, r - 1]))
    return tf.slice(x, [0, 0, 0, 0], tf.stack([-1, -1, -1, klen]))


def attention_scores(ac, bd, ef, ef_diff, blocked):
    """The float32 scores [b, n, q, k] that ``attention_probs`` normalises (arguments: see there)."""
    score = ac + rel_shift(bd, tf.shape(ac)[-1])
    if ef is not None:
        ef_same, ef_other = tf.split(ef, 2, axis=-1)  # [b, n, q, 1] each
        score = score + tf.where(tf.expand_dims(ef_diff, 1), ef_other, ef_same)
    if blocked is not None:
        score = tf.where(tf.expand_dims(blocked, 1), tf.cast(mask_value(score.dtype), score.dtype), score)
    return tf.cast(score, tf.float32)


def attention_probs(ac, bd, ef, ef_diff, blocked):
    """Scores -> attention probabilities (before attention dropout), [b, n, q, k].

    ac: [b, n, q, k] content scores; bd: [b, n, q, r] positional scores before ``rel_shift``; ef: [b, n, q, 2]
    segment scores (same, different) or None; ef_diff: [b, q, k] bool; blocked: bool [b|1, q, k] or None.
    Scores arrive already scaled by 1/sqrt(d_head).
    """
    return tf.cast(tf.nn.softmax(attention_scores(ac, bd, ef, ef_diff, blocked), axis=-1), ac.dtype)


# Inference (see XLA_FUSIONS): the score chain (shift, adds, selects) as one XLA cluster, the softmax on
# oneDNN's kernel (XLA's CPU exp made the softmax inside the cluster 8% slower at 2x512). In a training step
# plain ops measured as fast (and a hand-written backward cluster slower), so training keeps them.
_attention_scores_xla = _xla(attention_scores)


def attention_probs_inference(ac, bd, ef, ef_diff, blocked):
    return tf.cast(tf.nn.softmax(_attention_scores_xla(ac, bd, ef, ef_diff, blocked), axis=-1), ac.dtype)


def _rel_shift_grad(d, rlen):
    """The gradient of ``rel_shift``: [b, n, q, klen] -> [b, n, q, rlen] (zeros where nothing was read)."""
    b, n, q, k = tf.unstack(tf.shape(d))
    d = tf.pad(d, tf.stack([[0, 0], [0, 0], [0, 0], [0, rlen - 1 - k]]))
    d = tf.reshape(d, tf.stack([b, n, rlen - 1, q]))
    d = tf.pad(d, [[0, 0], [0, 0], [1, 0], [0, 0]])
    return tf.reshape(d, tf.stack([b, n, q, rlen]))


def _attention_probs_bwd(prob, keep, dy, ef_diff, blocked, rate):
    """Gradients of dropout(softmax(scores)) for the scores and the two segment terms [b, n, q, 2]."""
    g = tf.cast(dy, tf.float32)
    if keep is not None:
        g = _apply_keep(g, keep, rate)
    ds = prob * (g - tf.reduce_sum(g * prob, axis=-1, keepdims=True))
    if blocked is not None:
        ds = tf.where(tf.expand_dims(blocked, 1), tf.zeros_like(ds), ds)
    if ef_diff is None:
        return ds, None
    diff = tf.expand_dims(ef_diff, 1)
    zero = tf.zeros_like(ds)
    d_ef = tf.concat([tf.reduce_sum(tf.where(diff, zero, ds), axis=-1, keepdims=True),
                      tf.reduce_sum(tf.where(diff, ds, zero), axis=-1, keepdims=True)], axis=-1)
    return ds, d_ef


_attention_probs_bwd_xla = _xla(_attention_probs_bwd)


def attention_probs_train(ac, bd, ef, ef_diff, blocked, rate: float, seed: tf.Tensor, salt: int):
    """Attention probabilities after attention dropout in a training step. With ``XLA_FUSIONS``: the score
    chain as the inference cluster, oneDNN's softmax, the dropout mask fused with its scaling, and a
    hand-written backward (dropout, softmax, mask and segment terms in one cluster; ``rel_shift``'s gradient
    as two pads)."""
    if not _fusions():
        return dropout(attention_probs(ac, bd, ef, ef_diff, blocked), rate, seed, salt)
    site = _site(seed, salt) if rate > 0.0 else None
    rlen = tf.shape(bd)[-1]

    @tf.custom_gradient
    def f(ac, bd, *ef_arg):
        prob = tf.nn.softmax(_attention_scores_xla(ac, bd, ef_arg[0] if ef_arg else None, ef_diff, blocked),
                             axis=-1)
        out, keep = (tf.cast(prob, ac.dtype), None) if site is None else \
            _dropout_fwd_xla(tf.cast(prob, ac.dtype), site, rate)

        def grad(dy):
            ds, d_ef = _attention_probs_bwd_xla(prob, keep, dy, ef_diff, blocked, rate)
            ds = tf.cast(ds, ac.dtype)
            return (ds, _rel_shift_grad(ds, rlen)) + ((tf.cast(d_ef, ac.dtype),) if ef_arg else ())

        return out, grad

    return f(ac, bd, *(() if ef is None else (ef,)))


# Query chunks. For bidirectional attention the positional scores BD are [q, klen + qlen] per head, but row i
# only reads the klen columns starting at qlen - i (``rel_shift``). Rows [i0, i1) together read the
# klen + (i1 - i0) columns starting at qlen - i1, so computing BD chunk by chunk over the queries does only
# klen + chunk columns per row instead of klen + qlen (at seq 512 with 128-row chunks: 640 instead of 1024),
# and each chunk's score tensors are a quarter of the size. Every score is the same dot product as before
# (outputs bit-identical at Base 2x512; within 1e-6 where oneDNN blocks the smaller products differently).
# Used when the query length is known when tracing, attn_type is "bi" and the query is at least two chunks
# long. ``ATTN_CHUNK`` is the chunk length in rows (0 = never chunk; ``accelerate=False``: never).
ATTN_CHUNK = 128


def query_chunks(qlen: Optional[int], chunk: int = None):
    """Static (start, end) row ranges of the query chunks, or None when attention runs in one piece."""
    chunk = (0 if _plain else ATTN_CHUNK) if chunk is None else chunk
    if qlen is None or chunk <= 0 or qlen < 2 * chunk:
        return None
    n = int(round(qlen / chunk))
    bounds = [qlen * c // n for c in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _rows(x, axis: int, start: int, end: int):
    """x[..., start:end, ...] along ``axis`` via ``tf.slice`` (its gradient is a cheap Pad)."""
    begin = [0] * axis + [start]
    size = [-1] * axis + [end - start]
    return tf.slice(x, begin + [0] * (len(x.shape) - axis - 1), size + [-1] * (len(x.shape) - axis - 1))


class XLNetBlock(keras.layers.Layer):
    """One XLNet layer: relative multi-head attention (content + optional query stream) and the FFN.

    Weights follow the original checkpoint's shapes: q/k/v/r/o kernels [d_model, n_head, d_head] (no biases),
    two LayerNorms, layer_1/layer_2 dense, and (with ``untie_r``) this layer's r_w/r_r/r_s biases
    [n_head, d_head] and seg_embed [2, n_head, d_head] (seg_embed is always per layer).
    """

    def __init__(self, config, index: int, shared_biases: Optional[Dict] = None, **kwargs):
        super().__init__(name=f"layer_{index}", **kwargs)
        self.config = config
        self.index = index
        c = config
        init = keras.initializers.RandomNormal(stddev=c.initializer_range)
        proj = (c.d_model, c.n_head, c.d_head)
        self.q = self.add_weight(name="q", shape=proj, initializer=init)
        self.k = self.add_weight(name="k", shape=proj, initializer=init)
        self.v = self.add_weight(name="v", shape=proj, initializer=init)
        self.r = self.add_weight(name="r", shape=proj, initializer=init)
        self.o = self.add_weight(name="o", shape=proj, initializer=init)
        self.attn_ln_gamma = self.add_weight(name="attn_ln_gamma", shape=(c.d_model,), initializer="ones")
        self.attn_ln_beta = self.add_weight(name="attn_ln_beta", shape=(c.d_model,), initializer="zeros")
        self.ff1_kernel = self.add_weight(name="ff1_kernel", shape=(c.d_model, c.d_inner), initializer=init)
        self.ff1_bias = self.add_weight(name="ff1_bias", shape=(c.d_inner,), initializer="zeros")
        self.ff2_kernel = self.add_weight(name="ff2_kernel", shape=(c.d_inner, c.d_model), initializer=init)
        self.ff2_bias = self.add_weight(name="ff2_bias", shape=(c.d_model,), initializer="zeros")
        self.ff_ln_gamma = self.add_weight(name="ff_ln_gamma", shape=(c.d_model,), initializer="ones")
        self.ff_ln_beta = self.add_weight(name="ff_ln_beta", shape=(c.d_model,), initializer="zeros")
        bias_shape = (c.n_head, c.d_head)
        if c.untie_r:
            self.r_w_bias = self.add_weight(name="r_w_bias", shape=bias_shape, initializer=init)
            self.r_r_bias = self.add_weight(name="r_r_bias", shape=bias_shape, initializer=init)
            self.r_s_bias = self.add_weight(name="r_s_bias", shape=bias_shape, initializer=init)
        else:
            self.r_w_bias = shared_biases["r_w_bias"]
            self.r_r_bias = shared_biases["r_r_bias"]
            self.r_s_bias = shared_biases["r_s_bias"]
        self.seg_embed = self.add_weight(name="seg_embed", shape=(2, c.n_head, c.d_head), initializer=init)
        self.act = activation_fn(c.ff_activation)
        self.scale = 1.0 / math.sqrt(c.d_head)
        self.built = True

    def weight_roles(self):
        """(variable, role) for each weight (``optimization.ROLES``)."""
        roles = [(w, "kernel") for w in (self.q, self.k, self.v, self.r, self.o, self.ff1_kernel, self.ff2_kernel)]
        roles += [(w, "norm") for w in (self.attn_ln_gamma, self.attn_ln_beta, self.ff_ln_gamma, self.ff_ln_beta)]
        roles += [(self.ff1_bias, "bias"), (self.ff2_bias, "bias"), (self.seg_embed, "segment_embedding")]
        return roles + [(w, "attention_bias") for w in (self.r_w_bias, self.r_r_bias, self.r_s_bias)]

    def _w(self, var):
        return tf.cast(var, self.compute_dtype)

    # ------------------------------------------------------------------ attention pieces
    # Layout: projections run as plain 2-D MatMuls on [b*len, d_model] (a reshape, no copy), heads are then
    # moved to [b, n, len, h] once, so every attention product is a BatchMatMul without hidden transposes.
    def _matmul_2d(self, x, kernel_2d, transpose_b=False):
        """x [b, s, d_in] @ kernel_2d -> [b, s, d_out] via one 2-D MatMul (oneDNN's fast path)."""
        shape = tf.shape(x)
        y = tf.matmul(tf.reshape(x, tf.stack([-1, shape[-1]])), kernel_2d, transpose_b=transpose_b)
        return tf.reshape(y, tf.concat([shape[:-1], tf.shape(y)[-1:]], axis=0))

    def _kernel_2d(self, kernel):
        """A [d_model, n, h] projection kernel as [d_model, n*h] in the compute dtype."""
        c = self.config
        return tf.reshape(self._w(kernel), [c.d_model, c.n_head * c.d_head])

    def _head_view(self, y):
        """[b, s, n*h] -> [b, s, n, h] (a reshape, no copy)."""
        c = self.config
        return tf.reshape(y, tf.concat([tf.shape(y)[:-1], [c.n_head, c.d_head]], axis=0))

    def _split_heads(self, y):
        """[b, s, n*h] -> [b, n, s, h]."""
        return tf.transpose(self._head_view(y), [0, 2, 1, 3])

    def _heads(self, x, kernel):
        """x [b, s, d_model] @ kernel [d_model, n, h] -> [b, n, s, h]."""
        return self._split_heads(self._matmul_2d(x, self._kernel_2d(kernel)))

    def _positional_tables(self, basis: PositionalBasis, dtype):
        """The factored projections (sin |d|f) W_sin and (cos |d|f) W_cos, each [R, n*h]."""
        w = self._kernel_2d(self.r)
        half = self.config.d_model // 2
        w_sin = tf.slice(w, [0, 0], [half, -1])
        w_cos = tf.slice(w, [half, 0], [half, -1])
        return tf.matmul(tf.cast(basis.sin, dtype), w_sin), tf.matmul(tf.cast(basis.cos, dtype), w_cos)

    def _positional_rows(self, pos_emb, dtype):
        """Projected positional encodings [pb, r, n*h] from a [pb, r, d] tensor or a ``PositionalBasis``."""
        if not isinstance(pos_emb, PositionalBasis):
            return self._matmul_2d(tf.cast(pos_emb, dtype), self._kernel_2d(self.r))
        from_sin, from_cos = self._positional_tables(pos_emb, dtype)
        from_sin = tf.gather(from_sin, pos_emb.index)  # [pb, r, n*h]
        from_cos = tf.gather(from_cos, pos_emb.index)
        return from_cos + from_sin * tf.expand_dims(tf.cast(pos_emb.sign, dtype), -1)

    def _positional_heads(self, pos_emb, dtype):
        """Projected positional encodings [pb, n, r, h]."""
        return self._split_heads(self._positional_rows(pos_emb, dtype))

    def _heads_in_place(self, x, kernel):
        """x [b, s, d_model] @ kernel -> [b, s, n, h] (no transpose)."""
        return self._head_view(self._matmul_2d(x, self._kernel_2d(kernel)))

    def _fused_positions(self, pos_emb, dtype, training: bool):
        """What the kernels read of the positional encodings: at inference the factored tables (from_sin,
        from_cos, index, sign; the op combines them, no gathered [r, n*h] tensor), in training the projected rows
        [r, n*h] (the training forward keeps the [pb, r, d] encodings, which dropout may have touched)."""
        if training:
            return tf.squeeze(self._positional_rows(pos_emb, dtype), 0)
        from_sin, from_cos = self._positional_tables(pos_emb, dtype)
        return from_sin, from_cos, pos_emb.index[0], tf.cast(pos_emb.sign[0], dtype)

    def _fused_attention(self, op, q, k, v, pos, ef_diff, blocked, seed, salt, training: bool):
        """Relative attention through the compiled kernels (see ``FUSED_ATTENTION``): q [b, q, n, h] over k, v
        [b, k, n, h] -> [b, q, n, h]; ``pos`` from ``_fused_positions``. At inference one op. In training the
        forward op also returns the probabilities and the backward op computes every gradient from them; the
        attention-dropout mask is drawn exactly as ``_attend`` draws it (per query chunk, the same salts)."""
        c = self.config
        none = tf.zeros([0, 0, 0], tf.bool)
        diff = none if ef_diff is None else ef_diff
        blocked = none if blocked is None else blocked
        rw, rr = self._w(self.r_w_bias), self._w(self.r_r_bias)
        rs, seg = self._w(self.r_s_bias), self._w(self.seg_embed)
        if not training:
            return op.xlnet_rel_attention(q, k, v, *pos, rw, rr, rs, seg, diff, blocked, scale=self.scale)
        keep = tf.zeros([0, 0, 0, 0], tf.bool)
        if seed is not None and c.dropatt > 0.0:
            shape = tf.shape(q)
            klen = tf.shape(k)[1]
            chunks = (query_chunks(q.shape[1]) if c.attn_type == "bi" else None) or [(0, None)]
            keep = tf.concat([_keep_mask_xla(tf.stack([shape[0], c.n_head, (i1 if i1 else shape[1]) - i0, klen]),
                                             _site(seed, salt if i == 0 else salt + 1000 * i), c.dropatt)
                              for i, (i0, i1) in enumerate(chunks)], axis=2)
        attrs = dict(scale=self.scale, keep_scale=1.0 / (1.0 - c.dropatt))
        if ef_diff is None:  # no segment term: r_s and seg_embed are not used (no gradient, as in the graph)
            rs, seg = tf.stop_gradient(rs), tf.stop_gradient(seg)

        @tf.custom_gradient
        def attend(q, k, v, kr, rw, rr, rs, seg):
            out, prob = op.xlnet_rel_attention_train(q, k, v, kr, rw, rr, rs, seg, diff, blocked, keep, **attrs)

            def grad(d_out):
                return op.xlnet_rel_attention_grad(d_out, q, k, v, kr, rw, rr, rs, seg, diff, blocked, keep, prob,
                                                   **attrs)

            return out, grad

        return attend(q, k, v, pos, rw, rr, rs, seg)

    def _merge_heads(self, x):
        """[b, s, n, h] -> [b, s, n*h] (a reshape, no copy)."""
        shape = tf.shape(x)
        return tf.reshape(x, tf.stack([shape[0], shape[1], self.config.n_head * self.config.d_head]))

    def _attend(self, q_head, k_head, v_head, kr, ef_diff, blocked, seed, salt):
        """Relative attention for queries q_head [b, n, q, h] over keys/values [b, n, k, h]: [b, n, q, h].

        Runs in query chunks where ``query_chunks`` says so (see there); chunk c > 0 folds its index into the
        attention-dropout salt, so its mask is its own.
        """
        qlen = q_head.shape[2]
        chunks = query_chunks(qlen) if self.config.attn_type == "bi" else None
        if chunks is None:
            return self._attend_rows(q_head, k_head, v_head, kr, ef_diff, blocked, seed, salt)
        klen = tf.shape(k_head)[2]
        outs = []
        for c, (i0, i1) in enumerate(chunks):
            # Rows i0..i1-1 read positional encodings qlen - i1 .. qlen - i1 + klen + (i1 - i0) - 1.
            kr_c = tf.slice(kr, tf.stack([0, 0, qlen - i1, 0]), tf.stack([-1, -1, klen + (i1 - i0), -1]))
            outs.append(self._attend_rows(
                _rows(q_head, 2, i0, i1), k_head, v_head, kr_c,
                None if ef_diff is None else _rows(ef_diff, 1, i0, i1),
                None if blocked is None else _rows(blocked, 1, i0, i1),
                seed, salt if c == 0 else salt + 1000 * c))
        return tf.concat(outs, axis=2)

    def _attend_rows(self, q_head, k_head, v_head, kr, ef_diff, blocked, seed, salt):
        """Core relative attention for queries q_head [b, n, q, h] over keys/values [b, n, k, h].

        kr: [pb, n, r, h] projected positional encodings: pb = 1 shared by the batch, 2 one per half with
        bi_data, or b one per example (after dropout on the encodings), consecutive examples grouped;
        ef_diff: [b, q, k] bool or None; blocked: bool [b|1, q, k] or None. Returns [b, n, q, h].
        The 1/sqrt(d_head) scale is applied to the (small) query side instead of the [b, n, q, k] scores.
        """
        c = self.config
        biases = [self._w(self.r_w_bias), self._w(self.r_r_bias)]
        if ef_diff is not None:
            biases.append(self._w(self.r_s_bias))
        qw, qr, *qs = query_terms(q_head, biases, self.scale)
        ac = tf.matmul(qw, k_head, transpose_b=True)  # [b, n, q, k]
        if kr.shape[0] != 1:  # a group of the batch per encoding: [pb, b/pb, n, q, h] x [pb, 1, n, r, h]
            shape = tf.shape(qr)
            pb = tf.shape(kr)[0]
            qr = tf.reshape(qr, tf.concat([[pb, shape[0] // pb], shape[1:]], axis=0))
            bd = tf.matmul(qr, tf.expand_dims(kr, 1), transpose_b=True)
            bd = tf.reshape(bd, tf.concat([shape[:3], tf.shape(bd)[-1:]], axis=0))
        else:  # one set of encodings broadcast over the batch: [b, n, q, h] x [n, r, h]
            bd = tf.matmul(qr, tf.squeeze(kr, 0), transpose_b=True)  # [b, n, q, r]
        ef = None
        if ef_diff is not None:
            seg = tf.transpose(self._w(self.seg_embed), [1, 2, 0])  # [n, h, 2]
            ef = tf.matmul(qs[0], seg)  # [b, n, q, 2]
        if seed is not None:
            prob = attention_probs_train(ac, bd, ef, ef_diff, blocked, c.dropatt, seed, salt)
        elif _fusions():
            prob = attention_probs_inference(ac, bd, ef, ef_diff, blocked)
        else:
            prob = attention_probs(ac, bd, ef, ef_diff, blocked)
        return tf.matmul(prob, v_head)  # [b, n, q, h]

    def _post_attention(self, x, attn_vec, seed, salt):
        """attn_vec [b, n, q, h] (or [b, q, n*h]) -> output projection, dropout, residual, LayerNorm: [b, q, d]."""
        c = self.config
        vec = self._merge_heads(tf.transpose(attn_vec, [0, 2, 1, 3])) if len(attn_vec.shape) == 4 else attn_vec
        out = self._matmul_2d(vec, self._kernel_2d(self.o), transpose_b=True)
        return dropout_add_layer_norm(out, x, self.attn_ln_gamma, self.attn_ln_beta, c.layer_norm_eps,
                                      c.dropout, seed, salt)

    def _ffn(self, x, seed, salt):
        c = self.config
        x2 = tf.reshape(x, [-1, c.d_model])
        h = tf.matmul(x2, self._w(self.ff1_kernel))
        if seed is not None and self.act is gelu_tanh:
            h = gelu_dropout_train(h, self._w(self.ff1_bias), c.dropout, seed, salt)
        else:  # MatMul -> BiasAdd -> activation on 2-D tensors: oneDNN fuses the three into one kernel
            h = dropout(self.act(tf.nn.bias_add(h, self._w(self.ff1_bias))), c.dropout, seed, salt)
        h = tf.matmul(h, self._w(self.ff2_kernel))
        out = dropout_add_layer_norm(h, x2, self.ff_ln_gamma, self.ff_ln_beta, c.layer_norm_eps, c.dropout, seed,
                                     salt + 1, bias=self._w(self.ff2_bias))
        return tf.reshape(out, tf.shape(x))

    def call(self, h, g, mem, pos_emb, ef_diff, content_blocked, query_blocked, target_mapping, seed=None,
             training=False):
        """h: [b, q, d] content; g: [b, m, d] query stream or None; mem: [b, mlen, d] or None.

        pos_emb: [pb, r, d] (pb = 1, 2 or b) or a ``PositionalBasis``; ef_diff: [b, q, klen] bool or None;
        *_blocked: bool [b|1, q, klen] or None; target_mapping: [b, m, q] or None (query stream rows -> positions).
        """
        with plain_ops(not self.config.accelerate):  # read when tracing, also by a recomputed block
            return self._call(h, g, mem, pos_emb, ef_diff, content_blocked, query_blocked, target_mapping, seed,
                              training)

    def _call(self, h, g, mem, pos_emb, ef_diff, content_blocked, query_blocked, target_mapping, seed, training):
        cat = h if mem is None else tf.concat([tf.cast(mem, h.dtype), h], axis=1)
        c = self.config
        # The kernels (see FUSED_ATTENTION): the inference op has no gradient, so training (also with dropout 0,
        # where seed is None) uses the training pair.
        # Per-example encodings (dropout on them in training) are read by the graph path only.
        basis = isinstance(pos_emb, PositionalBasis)
        fusable = not c.bi_data and (basis or (training and pos_emb.shape[0] == 1))
        op = fused_attention_op(c.d_head, h.dtype) if fusable else None
        if op is not None:
            k_in, v_in = self._heads_in_place(cat, self.k), self._heads_in_place(cat, self.v)  # [b, k, n, h]
            pos = self._fused_positions(pos_emb, h.dtype, training)
            attend = lambda q, blocked, salt: self._fused_attention(op, q, k_in, v_in, pos, ef_diff, blocked, seed,
                                                                    salt, training)
            vec_h = self._merge_heads(attend(self._heads_in_place(h, self.q), content_blocked, 1))
        else:
            k_head = self._heads(cat, self.k)  # [b, n, k, h]
            v_head = self._heads(cat, self.v)
            kr = self._positional_heads(pos_emb, h.dtype)  # [pb, n, r, h]
            attend = lambda q, blocked, salt: self._attend(q, k_head, v_head, kr, ef_diff, blocked, seed, salt)
            vec_h = attend(self._heads(h, self.q), content_blocked, 1)
        out_h = self._post_attention(h, vec_h, seed, 2)
        out_h = self._ffn(out_h, seed, 3)

        out_g = None
        if g is not None:
            # Query rows: [b, m, n, h] with the kernels, [b, n, m, h] for the graph's ops (heads axis first).
            q_g = self._heads_in_place(g, self.q) if op is not None else self._heads(g, self.q)
            rows = "bmnh" if op is not None else "bnmh"
            to_pos = rows.replace("m", "l")
            if target_mapping is not None:  # attend at the target positions, then gather the targets' rows
                tm = tf.cast(target_mapping, h.dtype)
                vec_g = attend(tf.einsum(f"{rows},bml->{to_pos}", q_g, tm), query_blocked, 5)
                vec_g = tf.einsum(f"{to_pos},bml->{rows}", vec_g, tm)
            else:
                vec_g = attend(q_g, query_blocked, 5)
            out_g = self._post_attention(g, self._merge_heads(vec_g) if op is not None else vec_g, seed, 6)
            out_g = self._ffn(out_g, seed, 7)
        return out_h, out_g
