"""XLNet's layers: positional encoding, relative attention (two streams), feed-forward, the block.

Batch-major ([batch, len, ...]) with the original's math; see ../shared/reference/xlnet-facts.md section 2.
Dropout is stateless: the model draws one seed per forward pass and every dropout site folds in its own salt,
so a recomputed block (``recompute``) replays identical masks and a resumed run replays the same masks.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.masks import mask_value


def gelu_tanh(x):
    """The original's GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))."""
    return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))


def activation_fn(name: str):
    if name == "gelu":
        return gelu_tanh
    if name == "gelu_exact":
        return lambda x: tf.nn.gelu(x, approximate=False)
    if name == "relu":
        return tf.nn.relu
    raise ValueError(f"unknown activation {name!r}")


def dropout(x, rate: float, seed: Optional[tf.Tensor], salt: int):
    """Stateless dropout; a no-op when ``seed`` is None (inference) or the rate is 0."""
    if seed is None or rate <= 0.0:
        return x
    site = tf.random.experimental.stateless_fold_in(seed, salt)
    return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=site)


def layer_norm(x, gamma, beta, eps: float):
    """LayerNorm over the last axis, statistics in float32 (safe under float16 compute)."""
    dtype = x.dtype
    x32 = tf.cast(x, tf.float32)
    mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
    y = (x32 - mean) * tf.math.rsqrt(var + eps)
    y = y * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32)
    return tf.cast(y, dtype)


def relative_positional_encoding(qlen, klen, d_model: int, attn_type: str, bi_data: bool, clamp_len: int,
                                 dtype=tf.float32) -> tf.Tensor:
    """Sinusoid encodings of the relative distances, [pb, rlen, d_model] (pb = 2 with bi_data, else 1).

    bi: distances klen .. -qlen+1; uni: klen .. 1 (rlen = klen + 1). The sin block comes before the cos block.
    With bi_data the second entry holds the backward half's encodings (negated distances).
    """
    freq = tf.range(0, d_model, 2.0, dtype=tf.float32)
    inv_freq = 1.0 / tf.pow(10000.0, freq / d_model)
    beg = tf.cast(klen, tf.float32)
    end = tf.cast(-qlen if attn_type == "bi" else -1, tf.float32)
    fwd = tf.range(beg, end, -1.0, dtype=tf.float32)
    seqs = [fwd, -fwd] if bi_data else [fwd]
    out = []
    for pos in seqs:
        if clamp_len is not None and clamp_len > 0:
            pos = tf.clip_by_value(pos, -float(clamp_len), float(clamp_len))
        sinusoid = pos[:, None] * inv_freq[None, :]
        out.append(tf.concat([tf.sin(sinusoid), tf.cos(sinusoid)], axis=-1))
    return tf.cast(tf.stack(out, axis=0), dtype)


def rel_shift(x: tf.Tensor, klen) -> tf.Tensor:
    """[b, n, q, r] -> [b, n, q, klen]: afterwards (i, j) holds the score for distance mlen + i - j."""
    b, n, q, r = tf.unstack(tf.shape(x))
    x = tf.reshape(x, [b, n, r, q])[:, :, 1:, :]
    x = tf.reshape(x, [b, n, q, r - 1])
    return x[:, :, :, :klen]


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

    def _w(self, var):
        return tf.cast(var, self.compute_dtype)

    # ------------------------------------------------------------------ attention pieces
    def _attend(self, q_head, k_head, v_head, kr, ef_diff, blocked, klen, seed, salt):
        """Core relative attention for queries q_head [b, q, n, h] over keys [b, k, n, h].

        kr: [pb, r, n, h] projected positional encodings; ef_diff: [b, q, k] bool or None.
        Returns the attention vectors [b, q, n, h].
        """
        c = self.config
        rw = self._w(self.r_w_bias)
        rr = self._w(self.r_r_bias)
        ac = tf.einsum("binh,bjnh->bnij", q_head + rw, k_head)
        pb = tf.shape(kr)[0]
        qr = q_head + rr
        qs = tf.shape(qr)
        qr = tf.reshape(qr, tf.stack([pb, qs[0] // pb, qs[1], qs[2], qs[3]]))
        bd = tf.einsum("pbinh,prnh->pbnir", qr, kr)
        bds = tf.shape(bd)
        bd = tf.reshape(bd, tf.stack([bds[0] * bds[1], bds[2], bds[3], bds[4]]))
        bd = rel_shift(bd, klen)
        score = ac + bd
        if ef_diff is not None:
            ef = tf.einsum("binh,snh->bnis", q_head + self._w(self.r_s_bias), self._w(self.seg_embed))
            score = score + tf.where(ef_diff[:, None, :, :], ef[..., 1:2], ef[..., 0:1])
        score = score * tf.cast(self.scale, score.dtype)
        if blocked is not None:
            score = tf.where(blocked[:, None, :, :], tf.cast(mask_value(score.dtype), score.dtype), score)
        prob = tf.nn.softmax(tf.cast(score, tf.float32), axis=-1)
        prob = tf.cast(prob, q_head.dtype)
        prob = dropout(prob, c.dropatt, seed, salt)
        return tf.einsum("bnij,bjnh->binh", prob, v_head)

    def _post_attention(self, x, attn_vec, seed, salt):
        out = tf.einsum("binh,dnh->bid", attn_vec, self._w(self.o))
        out = dropout(out, self.config.dropout, seed, salt)
        return layer_norm(out + x, self.attn_ln_gamma, self.attn_ln_beta, self.config.layer_norm_eps)

    def _ffn(self, x, seed, salt):
        c = self.config
        h = tf.einsum("bid,de->bie", x, self._w(self.ff1_kernel)) + self._w(self.ff1_bias)
        h = self.act(h)
        h = dropout(h, c.dropout, seed, salt)
        h = tf.einsum("bie,ed->bid", h, self._w(self.ff2_kernel)) + self._w(self.ff2_bias)
        h = dropout(h, c.dropout, seed, salt + 1)
        return layer_norm(h + x, self.ff_ln_gamma, self.ff_ln_beta, c.layer_norm_eps)

    def call(self, h, g, mem, pos_emb, ef_diff, content_blocked, query_blocked, target_mapping, seed=None):
        """h: [b, q, d] content; g: [b, m, d] query stream or None; mem: [b, mlen, d] or None.

        pos_emb: [pb, r, d]; ef_diff: [b, q, klen] bool or None; *_blocked: bool [b|1, q, klen] or None;
        target_mapping: [b, m, q] or None (query stream rows -> positions).
        """
        cat = h if mem is None else tf.concat([tf.cast(mem, h.dtype), h], axis=1)
        klen = tf.shape(cat)[1]
        k_head = tf.einsum("bjd,dnh->bjnh", cat, self._w(self.k))
        v_head = tf.einsum("bjd,dnh->bjnh", cat, self._w(self.v))
        kr = tf.einsum("prd,dnh->prnh", tf.cast(pos_emb, h.dtype), self._w(self.r))

        q_head_h = tf.einsum("bid,dnh->binh", h, self._w(self.q))
        vec_h = self._attend(q_head_h, k_head, v_head, kr, ef_diff, content_blocked, klen, seed, 1)
        out_h = self._post_attention(h, vec_h, seed, 2)
        out_h = self._ffn(out_h, seed, 3)

        out_g = None
        if g is not None:
            q_head_g = tf.einsum("bmd,dnh->bmnh", g, self._w(self.q))
            if target_mapping is not None:
                tm = tf.cast(target_mapping, h.dtype)
                q_head_g = tf.einsum("bmnh,bml->blnh", q_head_g, tm)
                vec_g = self._attend(q_head_g, k_head, v_head, kr, ef_diff, query_blocked, klen, seed, 5)
                vec_g = tf.einsum("blnh,bml->bmnh", vec_g, tm)
            else:
                vec_g = self._attend(q_head_g, k_head, v_head, kr, ef_diff, query_blocked, klen, seed, 5)
            out_g = self._post_attention(g, vec_g, seed, 6)
            out_g = self._ffn(out_g, seed, 7)
        return out_h, out_g
