"""The elementwise math of XLNet's layers as plain TensorFlow ops: activation, dropout, LayerNorm.

The layers call these through an ops table (``OpsTable``: ``PLAIN`` here; ``xlnet_tf.accel.fusions.FUSED`` has the
same functions as XLA clusters with hand-written gradients), the one the forward pass's ``Paths`` hand in
(``xlnet_tf/paths.py``). The attention score is ``attention.rel_attn_core``. Everything is batch-major
([batch, len, ...]).

Dropout convention, one for every site: a site's seed is ``stateless_fold_in(seed, salt)``; its keep mask is
``bits >= round(rate * 2^32)`` over uint32 bits from XLA's ThreeFry for that seed and the tensor's shape
(P(drop) = rate to within 2^-32), and kept values are scaled by 1 / (1 - rate). The model draws one seed per
forward pass, so a recomputed block replays identical masks and a resumed run the same masks. The bits are
always drawn by a small XLA function (XLA's CPU ThreeFry is ~2x faster than TensorFlow's Philox kernel), so
the plain and the accelerated ops draw the same masks.
"""

from __future__ import annotations

import sys
from typing import Optional, Protocol

import keras
import tensorflow as tf


def xla(fn):
    """``fn`` as one XLA-compiled function (traced per input signature)."""
    return tf.function(fn, jit_compile=True, reduce_retracing=True, autograph=False)


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



# The plain table is this module: its functions above have the ``OpsTable`` names.
name = "plain"
PLAIN: OpsTable = sys.modules[__name__]


def normal_init(stddev: float) -> keras.initializers.Initializer:
    """A ``RandomNormal(stddev)`` for ONE weight. Keras 3's initializer draws its seed when it is made and keeps it,
    so one instance gives every weight of a shape the same values (a layer's q, k, v, r and o alike) and weights
    of other shapes the same stream; a fresh one per weight draws its own seed from Python's ``random``
    (reproducible under the task models' ``seed``), as the original's per-variable initializer draws apart."""
    return keras.initializers.RandomNormal(stddev=stddev)
