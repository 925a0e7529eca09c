"""The math of XLNet's layers as plain TensorFlow ops: activation, dropout, LayerNorm, relative attention scores.

The layers call these through an ops table (``OpsTable``: ``PLAIN`` here; ``xlnet_tf.accel.fusions.FUSED`` has the
same functions as XLA clusters with hand-written gradients), the one ``xlnet_tf.accel.choose`` picks for a forward
pass. Everything is batch-major ([batch, len, ...]).

Dropout convention, one for every site: a site's seed is ``stateless_fold_in(seed, salt)``; its keep mask is
``bits >= round(rate * 2^32)`` over uint32 bits from XLA's ThreeFry for that seed and the tensor's shape
(P(drop) = rate to within 2^-32), and kept values are scaled by 1 / (1 - rate). The model draws one seed per
forward pass, so a recomputed block replays identical masks and a resumed run the same masks. The bits are
always drawn by a small XLA function (XLA's CPU ThreeFry is ~2x faster than TensorFlow's Philox kernel), so
the plain and the accelerated ops draw the same masks.
"""

from __future__ import annotations

import sys
from typing import Optional, Protocol, Sequence, Tuple

import tensorflow as tf

from xlnet_tf.masks import mask_value


def xla(fn):
    """``fn`` as one XLA-compiled function (traced per input signature)."""
    return tf.function(fn, jit_compile=True, reduce_retracing=True)


# ---------------------------------------------------------------------------------------------- activation
def gelu_tanh(x):
    """The original's GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).

    Written through ``tf.nn.gelu(approximate=True)`` (the same formula, op for op) so TensorFlow's graph
    optimiser recognises it and fuses MatMul + BiasAdd + GELU into one oneDNN kernel (inference).
    """
    return tf.nn.gelu(x, approximate=True)


def activation_fn(name: str):
    if name == "gelu":
        return gelu_tanh
    if name == "gelu_exact":
        return lambda x: tf.nn.gelu(x, approximate=False)
    if name == "relu":
        return tf.nn.relu
    raise ValueError(f"unknown activation {name!r}")


# ---------------------------------------------------------------------------------------------- dropout
def drop_threshold(rate: float) -> int:
    return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def keep_mask(shape, site, rate: float):
    """The keep mask of a dropout site (bool, ``shape``); traced inside XLA functions only."""
    bits = tf.random.stateless_uniform(shape, site, minval=None, maxval=None, dtype=tf.uint32, alg="threefry")
    return bits >= tf.constant(drop_threshold(rate), tf.uint32)


keep_mask_xla = xla(keep_mask)


def apply_keep(x, keep, rate: float):
    return tf.where(keep, x * tf.cast(1.0 / (1.0 - rate), x.dtype), tf.zeros_like(x))


def site(seed, salt: int):
    """The seed of one dropout site."""
    return tf.random.experimental.stateless_fold_in(seed, salt)


def dropout(x, rate: float, seed: Optional[tf.Tensor], salt: int):
    """Stateless dropout; a no-op when ``seed`` is None (inference) or the rate is 0."""
    if seed is None or rate <= 0.0:
        return x
    return apply_keep(x, keep_mask_xla(tf.shape(x), site(seed, salt), rate), rate)


def gelu_dropout(u, bias, rate: float, seed: Optional[tf.Tensor], salt: int):
    """dropout(tanh GELU(u + bias)), u [tokens, d_inner]."""
    return dropout(gelu_tanh(tf.nn.bias_add(u, bias)), rate, seed, salt)


# ---------------------------------------------------------------------------------------------- LayerNorm
def layer_norm(x, gamma, beta, eps: float):
    """LayerNorm over the last axis, statistics in float32 (safe under float16 compute)."""
    dtype = x.dtype
    x32 = tf.cast(x, tf.float32)
    mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
    y = (x32 - mean) * tf.math.rsqrt(var + eps)
    y = y * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32)
    return tf.cast(y, dtype)


def dropout_add_layer_norm(h, x, gamma, beta, eps: float, rate: float, seed: Optional[tf.Tensor], salt: int,
                           bias=None):
    """LayerNorm(dropout(h + bias) + x) over [tokens, d]: how each residual sub-layer ends."""
    if bias is not None:
        h = tf.nn.bias_add(h, bias)
    return layer_norm(dropout(h, rate, seed, salt) + x, gamma, beta, eps)


# ---------------------------------------------------------------------------------------------- attention
def query_terms(q, biases, scale: float):
    """The biased, scaled queries of relative attention, ((q + r_w) s, (q + r_r) s[, (q + r_s) s]) with
    s = 1/sqrt(d_head); q [b, n, q, h], each bias [n, h]. The scale goes on the (small) query side instead of
    the [b, n, q, k] scores."""
    s = tf.cast(scale, q.dtype)
    qs = q * s
    return tuple(qs + tf.expand_dims(b, 1) * s for b in biases)


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


def attention_probs(ac, bd, ef, ef_diff, blocked, rate: float = 0.0, seed: Optional[tf.Tensor] = None,
                    salt: int = 0):
    """Scores -> attention probabilities after attention dropout, [b, n, q, k].

    ac: [b, n, q, k] content scores; bd: [b, n, q, r] positional scores before ``rel_shift``; ef: [b, n, q, 2]
    segment scores (same, different) or None; ef_diff: [b, q, k] bool; blocked: bool [b|1, q, k] or None.
    Scores arrive already scaled by 1/sqrt(d_head); the softmax runs in float32.
    """
    prob = tf.cast(tf.nn.softmax(attention_scores(ac, bd, ef, ef_diff, blocked), axis=-1), ac.dtype)
    return dropout(prob, rate, seed, salt)


def rows(x, axis: int, start: int, end: int):
    """x[..., start:end, ...] along ``axis`` via ``tf.slice`` (its gradient is a cheap Pad)."""
    begin = [0] * axis + [start]
    size = [-1] * axis + [end - start]
    return tf.slice(x, begin + [0] * (len(x.shape) - axis - 1), size + [-1] * (len(x.shape) - axis - 1))


class OpsTable(Protocol):
    """The ops the layers call: a module with these names (``PLAIN``, this module; ``xlnet_tf.accel.fusions.FUSED``,
    the same math as XLA clusters)."""
    name: str

    def dropout(self, x, rate: float, seed: Optional[tf.Tensor], salt: int) -> tf.Tensor: ...

    def gelu_dropout(self, u, bias, rate: float, seed: Optional[tf.Tensor], salt: int) -> tf.Tensor: ...

    def layer_norm(self, x, gamma, beta, eps: float) -> tf.Tensor: ...

    def dropout_add_layer_norm(self, h, x, gamma, beta, eps: float, rate: float, seed: Optional[tf.Tensor],
                               salt: int, bias=None) -> tf.Tensor: ...

    def query_terms(self, q, biases: Sequence[tf.Tensor], scale: float) -> Tuple[tf.Tensor, ...]: ...

    def attention_probs(self, ac, bd, ef, ef_diff, blocked, rate: float = 0.0, seed: Optional[tf.Tensor] = None,
                        salt: int = 0) -> tf.Tensor: ...


# The plain table is this module: its functions above have the ``OpsTable`` names.
name = "plain"
PLAIN: OpsTable = sys.modules[__name__]
