"""``xla``: the elementwise chains between the matmuls as small XLA clusters with hand-written gradients.

The matmuls stay on oneDNN (XLA's CPU matmuls are ~15% slower), but each memory-bound chain of ~10 TensorFlow
ops between them (one pass over memory each) becomes one or two passes: the attention score chain (shift,
adds, selects; the softmax stays on oneDNN, XLA's CPU exp made it 8% slower at 2x512), LayerNorm, and in a
training step the GELU, the dropout masks and the residual add, each with its neighbours. Forward and backward
are one cluster each (``tf.custom_gradient``); differentiated op by op, ``tf.nn.gelu`` alone makes ~10 passes in
the backward and TensorFlow's BiasAddGrad and bias-gradient reductions are slow next to the matmuls.
Same formulas as ``xlnet_tf.ops`` (``FUSED`` has the names of ``ops.PLAIN``) and, for the score, as
``attention.rel_attn_core`` (``rel_attn_core`` here has its signature); outputs within ~2e-6 of the plain ops at
Base size. Measured gain (PERFORMANCE.md "Accelerations",
XLNet-Base): 1.04x per training step at 8x128. Used in training passes only (``accel.choose``): at inference
they measured 0.99-1.05x in the table there and 0.98-1.0x on AVX-512 BF16 EPYC, and every new batch shape compiles
them again (a served request's first call at each new length: ~0.3 s of compiling against ~7 ms of work).
"""

from __future__ import annotations

import math
import sys
from typing import Optional

import tensorflow as tf

from xlnet_tf import ops
from xlnet_tf.attention import positional_scores, rel_shift
from xlnet_tf.masks import mask_value
from xlnet_tf.ops import apply_keep, keep_mask, site, xla

_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh_value(u):
    return 0.5 * u * (1.0 + tf.tanh(_GELU_C * (u + 0.044715 * u * u * u)))


def _gelu_tanh_grad(u, dy):
    """dy * d/du of the tanh GELU: 0.5(1 + t) + 0.5u(1 - t^2) sqrt(2/pi)(1 + 3 * 0.044715u^2)."""
    u2 = u * u
    t = tf.tanh(_GELU_C * (u + 0.044715 * u * u2))
    return dy * (0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * (_GELU_C * (1.0 + 3.0 * 0.044715 * u2)))


def _column_sum(x, dtype=None):
    """Sum over every axis but the last (a bias, gamma or beta gradient), accumulated in float32, returned in
    ``dtype`` (default: x's)."""
    x32 = tf.reshape(tf.cast(x, tf.float32), tf.concat([[-1], tf.shape(x)[-1:]], axis=0))
    return tf.cast(tf.reduce_sum(x32, axis=0), dtype or x.dtype)


def _dropout_fwd(x, site_seed, rate):
    keep = keep_mask(tf.shape(x), site_seed, rate)
    return apply_keep(x, keep, rate), keep


def _gelu_dropout_fwd(u, bias, site_seed, rate):
    keep = keep_mask(tf.shape(u), site_seed, rate)
    return apply_keep(_gelu_tanh_value(u + bias), keep, rate), keep


def _gelu_dropout_bwd(u, bias, keep, dy, rate):
    du = _gelu_tanh_grad(u + bias, apply_keep(dy, keep, rate))
    return du, _column_sum(du)


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


def _dropout_add_ln_fwd(h, bias, x, gamma, beta, site_seed, rate, eps):
    """s = dropout(h + bias) + x; LayerNorm(s), all [tokens, d]. Returns the output, s, the row mean and
    1/std, and the keep mask."""
    keep = keep_mask(tf.shape(h), site_seed, rate)
    s = apply_keep(h if bias is None else h + bias, keep, rate) + x
    y, mean, rstd = _ln_forward(s, gamma, beta, eps)
    return y, s, mean, rstd, keep


def _dropout_add_ln_bwd(s, mean, rstd, gamma, keep, dy, rate, bias):
    """Gradients for h, x, gamma, beta (and bias) of ``_dropout_add_ln_fwd``."""
    ds, dgamma, dbeta = _ln_backward(s, mean, rstd, gamma, dy)
    dh = apply_keep(ds, keep, rate)
    return (dh, ds, dgamma, dbeta) + (() if bias is None else (_column_sum(dh),))


def _query_terms(q, biases, scale: float):
    """The biased, scaled queries ((q + b) s for each bias b [n, h]) of ``attention.rel_attn_core``."""
    s = tf.cast(scale, q.dtype)
    qs = q * s
    return tuple(qs + tf.expand_dims(b, 1) * s for b in biases)


def _query_terms_grad(dys, scale):
    """Gradients of ``_query_terms`` for q and each bias (bias sums over batch and rows in float32)."""
    s = tf.cast(scale, dys[0].dtype)
    dbs = [tf.cast(tf.reduce_sum(tf.cast(dy, tf.float32), axis=[0, 2]) * scale, dy.dtype) for dy in dys]
    return (tf.add_n(list(dys)) * s,) + tuple(dbs)


def _attention_scores(ac, bd, ef, ef_diff, blocked):
    """``attention.rel_attn_core``'s score before the softmax, float32 [b, n, q, k]: ac + shifted bd + the segment
    term (ef [b, n, q, 2]: same, different) picked by ef_diff, blocked keys masked."""
    score = ac + rel_shift(bd, tf.shape(ac)[-1])
    if ef is not None:
        ef_same, ef_other = tf.split(ef, 2, axis=-1)
        score = score + tf.where(tf.expand_dims(ef_diff, 1), ef_other, ef_same)
    if blocked is not None:
        score = tf.where(tf.expand_dims(blocked, 1), tf.cast(mask_value(score.dtype), score.dtype), score)
    return tf.cast(score, tf.float32)


def _rel_shift_grad(d, rlen):
    """The gradient of ``attention.rel_shift``: [b, n, q, klen] -> [b, n, q, rlen] (zeros where nothing was read)."""
    b, n, q, k = tf.unstack(tf.shape(d))
    d = tf.pad(d, tf.stack([[0, 0], [0, 0], [0, 0], [0, rlen - 1 - k]]))
    d = tf.reshape(d, tf.stack([b, n, rlen - 1, q]))
    d = tf.pad(d, [[0, 0], [0, 0], [1, 0], [0, 0]])
    return tf.reshape(d, tf.stack([b, n, q, rlen]))


def _attention_probs_bwd(prob, keep, dy, ef_diff, blocked, rate):
    """Gradients of dropout(softmax(scores)) for the scores and the two segment terms [b, n, q, 2]."""
    g = tf.cast(dy, tf.float32)
    if keep is not None:
        g = apply_keep(g, keep, rate)
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


_gelu_tanh_value_xla = xla(_gelu_tanh_value)
_gelu_tanh_grad_xla = xla(_gelu_tanh_grad)
_ln_forward_xla = xla(_ln_forward)
_ln_backward_xla = xla(_ln_backward)
_query_terms_xla = xla(_query_terms)
_query_terms_grad_xla = xla(_query_terms_grad)
_apply_keep_xla = xla(apply_keep)
_dropout_fwd_xla = xla(_dropout_fwd)
_gelu_dropout_fwd_xla = xla(_gelu_dropout_fwd)
_gelu_dropout_bwd_xla = xla(_gelu_dropout_bwd)
_dropout_add_ln_fwd_xla = xla(_dropout_add_ln_fwd)
_dropout_add_ln_bwd_xla = xla(_dropout_add_ln_bwd)
_attention_scores_xla = xla(_attention_scores)
_attention_probs_bwd_xla = xla(_attention_probs_bwd)


@tf.custom_gradient
def gelu_tanh(u):
    """The tanh GELU with forward and backward each one XLA-fused pass over [tokens, d_inner]."""
    return _gelu_tanh_value_xla(u), lambda dy: _gelu_tanh_grad_xla(u, dy)


def dropout(x, rate: float, seed: Optional[tf.Tensor], salt: int):
    """``ops.dropout`` with the mask drawn, and the backward applied, in one cluster each."""
    if seed is None or rate <= 0.0:
        return x
    site_seed = site(seed, salt)

    @tf.custom_gradient
    def drop(x):
        y, keep = _dropout_fwd_xla(x, site_seed, rate)
        return y, lambda dy: _apply_keep_xla(dy, keep, rate)

    return drop(x)


def gelu_dropout(u, bias, rate: float, seed: Optional[tf.Tensor], salt: int):
    """``ops.gelu_dropout``; in a training step forward and backward (incl. the bias gradient) are one cluster
    each. At inference (``seed`` None) the plain ops: oneDNN fuses MatMul + BiasAdd + GELU into one kernel."""
    if seed is None:
        return ops.gelu_dropout(u, bias, rate, seed, salt)
    if rate <= 0.0:
        return gelu_tanh(tf.nn.bias_add(u, bias))
    site_seed = site(seed, salt)

    @tf.custom_gradient
    def f(u, bias):
        y, keep = _gelu_dropout_fwd_xla(u, bias, site_seed, rate)
        return y, lambda dy: _gelu_dropout_bwd_xla(u, bias, keep, dy, rate)

    return f(u, bias)


def layer_norm(x, gamma, beta, eps: float):
    """``ops.layer_norm`` as a forward cluster (which also returns the row mean and 1/std) and a backward
    cluster (the closed-form LayerNorm gradient)."""
    @tf.custom_gradient
    def ln(x, gamma, beta):
        y, mean, rstd = _ln_forward_xla(x, gamma, beta, eps)
        return y, lambda dy: _ln_backward_xla(x, mean, rstd, gamma, dy)

    return ln(x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta))


def dropout_add_layer_norm(h, x, gamma, beta, eps: float, rate: float, seed: Optional[tf.Tensor], salt: int,
                           bias=None):
    """``ops.dropout_add_layer_norm``; in a training step the forward (bias, mask, add, LayerNorm) and the
    backward are one cluster each."""
    if seed is None or rate <= 0.0:
        if bias is not None:
            h = tf.nn.bias_add(h, bias)
        return layer_norm(dropout(h, rate, seed, salt) + x, gamma, beta, eps)
    site_seed = site(seed, salt)

    @tf.custom_gradient
    def f(h, x, gamma, beta, *bias_arg):
        b = bias_arg[0] if bias_arg else None
        y, s, mean, rstd, keep = _dropout_add_ln_fwd_xla(h, b, x, gamma, beta, site_seed, rate, eps)
        return y, lambda dy: _dropout_add_ln_bwd_xla(s, mean, rstd, gamma, keep, dy, rate, b)

    return f(h, x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta),
             *(() if bias is None else (tf.convert_to_tensor(bias),)))


def query_terms(q, biases, scale: float):
    """The biased, scaled queries as one cluster; the backward sums the bias gradients over batch and rows in the
    same pass."""
    @tf.custom_gradient
    def f(q, *biases):
        outs = _query_terms_xla(q, biases, scale)

        def grad(*dys):
            dys = [tf.zeros_like(o) if d is None else d for d, o in zip(dys, outs)]
            return _query_terms_grad_xla(dys, scale)

        return outs, grad

    return f(q, *biases)


def attention_probs(ac, bd, ef, ef_diff, blocked, rate: float = 0.0, seed: Optional[tf.Tensor] = None,
                    salt: int = 0):
    """Scores -> attention probabilities after attention dropout, [b, n, q, k]: the score chain as one cluster,
    oneDNN's softmax. In a training step (``seed`` given) also the dropout mask fused with its scaling and a
    hand-written backward (dropout, softmax, mask and segment terms in one cluster; ``rel_shift``'s gradient as
    two pads)."""
    if seed is None:
        return tf.cast(tf.nn.softmax(_attention_scores_xla(ac, bd, ef, ef_diff, blocked), axis=-1), ac.dtype)
    site_seed = site(seed, salt) if rate > 0.0 else None
    rlen = tf.shape(bd)[-1]

    @tf.custom_gradient
    def f(ac, bd, *ef_arg):
        prob = tf.nn.softmax(_attention_scores_xla(ac, bd, ef_arg[0] if ef_arg else None, ef_diff, blocked),
                             axis=-1)
        out, keep = (tf.cast(prob, ac.dtype), None) if site_seed is None else \
            _dropout_fwd_xla(tf.cast(prob, ac.dtype), site_seed, rate)

        def grad(dy):
            ds, d_ef = _attention_probs_bwd_xla(prob, keep, dy, ef_diff, blocked, rate)
            ds = tf.cast(ds, ac.dtype)
            return (ds, _rel_shift_grad(ds, rlen)) + ((tf.cast(d_ef, ac.dtype),) if ef_arg else ())

        return out, grad

    return f(ac, bd, *(() if ef is None else (ef,)))


def rel_attn_core(q, k, v, kr, r_w, r_r, r_s, seg_embed, ef_diff, blocked, scale: float, dropatt: float, seed,
                  salt: int):
    """``attention.rel_attn_core`` (same signature, same formulas) with the biased queries and the score chain
    (shift, segment term, mask; softmax on oneDNN; attention dropout) as XLA clusters."""
    qw, qr, *qs = query_terms(q, (r_w, r_r, r_s) if ef_diff is not None else (r_w, r_r), scale)
    ac = tf.matmul(qw, k, transpose_b=True)  # [b, n, q, k]
    bd = positional_scores(qr, kr)  # [b, n, q, r]
    ef = None if ef_diff is None else tf.matmul(qs[0], tf.transpose(seg_embed, [1, 2, 0]))  # [b, n, q, 2]
    return tf.matmul(attention_probs(ac, bd, ef, ef_diff, blocked, dropatt, seed, salt), v)


# The fused table is this module: its functions above have the ``ops.OpsTable`` names.
name = "xla"
FUSED: ops.OpsTable = sys.modules[__name__]
