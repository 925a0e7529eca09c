"""Two-stream relative multi-head attention (the original's ``rel_attn``), with its output projection, residual
and LayerNorm.

For a query row i and a key j (memory first, then the segment) the score per head is

    (q_i + r_w) . k_j  +  (q_i + r_r) . kr[distance(i, j)]  +  (q_i + r_s) . seg_embed[diff(i, j)]

scaled by 1/sqrt(d_head), -1e30 where blocked (``masks.py``), softmax over j, attention dropout, times v_j;
kr = the block's ``r`` projection of the relative positional encodings. ``rel_attn_core`` below is the whole
core, every input explicit. ``RelativeAttention.call`` projects the keys and values once and runs the content
stream h (over memory and content) and the query stream g (pretraining: the same keys and values, its own mask)
through it, or through the acceleration ``LayerInputs.accel`` chose (``xlnet_tf.accel``).

Weights follow the original checkpoint: q/k/v/r/o kernels [d_model, n_head, d_head] (no biases), the
r_w/r_r/r_s biases [n_head, d_head] (this block's with ``untie_r``, else the model's shared ones), the block's
``SegmentEncoding`` and a LayerNorm.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, NamedTuple, Optional, Union

import keras
import tensorflow as tf

from xlnet_tf.accel import Choice, chunks, fused_attention
from xlnet_tf.encodings import PositionalBasis, SegmentEncoding
from xlnet_tf.ops import OpsTable


@dataclasses.dataclass(frozen=True)
class LayerInputs:
    """What every block reads besides its hidden states, built once per forward pass in ``XLNetModel.call``.

    pos_emb: the relative positional encodings, [pb, r, d_model] after dropout (pb = batch with per-example
    dropout, 2 with bi_data, else 1) or, without dropout on them, a ``PositionalBasis``; ef_diff: [b, q, klen] bool
    (key in another segment) or None (no segment term); content_blocked / query_blocked: bool [b|1, q, klen]
    (True = may not attend) or None; target_mapping: [b, m, q] in the compute dtype or None; seed: this block's
    dropout seed (None: no dropout); training: the model's flag; accel: the accelerations chosen for this pass.
    """
    pos_emb: Union[tf.Tensor, PositionalBasis]
    ef_diff: Optional[tf.Tensor]
    content_blocked: Optional[tf.Tensor]
    query_blocked: Optional[tf.Tensor]
    target_mapping: Optional[tf.Tensor]
    seed: Optional[tf.Tensor]
    training: bool
    accel: Choice

    def for_block(self, index: int) -> "LayerInputs":
        """The same inputs with block ``index``'s own dropout seed."""
        seed = None if self.seed is None else tf.random.experimental.stateless_fold_in(self.seed, 100 + index)
        return dataclasses.replace(self, seed=seed)


class KeyValueMemory(NamedTuple):
    """A layer's memory already projected by that layer: keys and values [b, mlen, n*h] in the compute dtype
    (``RelativeAttention.memory_kv``). Generation keeps these, so that a step projects only its new positions;
    the keys do not depend on position (relative positions enter through kr), so this equals projecting the
    memory's hidden states in every step."""
    k: tf.Tensor
    v: tf.Tensor


def rel_attn_core(q, k, v, kr, r_w, r_r, r_s, seg_embed, ef_diff, blocked, scale: float, dropatt: float, seed,
                  salt: int, ops: OpsTable):
    """Relative attention for queries q [b, n, q, h] over keys and values k, v [b, n, k, h]: [b, n, q, h].

    kr: [pb, n, r, h] projected positional encodings, consecutive examples grouped per encoding (pb = 1 shared
    by the batch, 2 one per half with bi_data, b one per example); r_w, r_r, r_s: [n, h]; seg_embed: [2, n, h];
    ef_diff: [b, q, k] bool or None (no segment term); blocked: bool [b|1, q, k] or None; dropout ``dropatt``
    with ``seed`` (None: none) at site ``salt``.
    """
    qw, qr, *qs = ops.query_terms(q, (r_w, r_r, r_s) if ef_diff is not None else (r_w, r_r), scale)
    ac = tf.matmul(qw, k, transpose_b=True)  # [b, n, q, k]
    shape, pb = tf.shape(qr), tf.shape(kr)[0]  # [b, n, q, h] as [pb, b/pb, n, q, h] x [pb, 1, n, r, h]
    qr = tf.reshape(qr, tf.concat([[pb, shape[0] // pb], shape[1:]], axis=0))
    bd = tf.matmul(qr, tf.expand_dims(kr, 1), transpose_b=True)
    bd = tf.reshape(bd, tf.concat([shape[:3], tf.shape(bd)[-1:]], axis=0))  # [b, n, q, r]
    ef = None if ef_diff is None else tf.matmul(qs[0], tf.transpose(seg_embed, [1, 2, 0]))  # [b, n, q, 2]
    prob = ops.attention_probs(ac, bd, ef, ef_diff, blocked, dropatt, seed, salt)
    return tf.matmul(prob, v)  # [b, n, q, h]


class RelativeAttention(keras.layers.Layer):
    """``call(h, g, mem, inputs)`` -> (LayerNorm(h + dropout(attention(h) W_o)), the same for g or None).

    h: [b, q, d] content; g: [b, m, d] query stream or None; mem: [b, mlen, d] or None; inputs: ``LayerInputs``
    (with target_mapping the query-stream rows attend at their positions). Dropout salts: content 1 (attention)
    and 2 (output), query stream 5 and 6.
    """

    def __init__(self, config, shared_biases: Optional[Dict] = None, **kwargs):
        super().__init__(name="rel_attn", **kwargs)
        self.config = c = config
        init = keras.initializers.RandomNormal(stddev=c.initializer_range)
        proj = (c.d_model, c.n_head, c.d_head)
        self.q = self.add_weight(name="q", shape=proj, initializer=init)
        self.k = self.add_weight(name="k", shape=proj, initializer=init)
        self.v = self.add_weight(name="v", shape=proj, initializer=init)
        self.r = self.add_weight(name="r", shape=proj, initializer=init)
        self.o = self.add_weight(name="o", shape=proj, initializer=init)
        if c.untie_r:
            for n in ("r_w_bias", "r_r_bias", "r_s_bias"):
                setattr(self, n, self.add_weight(name=n, shape=(c.n_head, c.d_head), initializer=init))
        else:
            self.r_w_bias, self.r_r_bias, self.r_s_bias = (shared_biases[n] for n in
                                                           ("r_w_bias", "r_r_bias", "r_s_bias"))
        with keras.name_scope(self.name):
            self.segment = SegmentEncoding(config, dtype=self.dtype_policy)
        self.ln_gamma = self.add_weight(name="ln_gamma", shape=(c.d_model,), initializer="ones")
        self.ln_beta = self.add_weight(name="ln_beta", shape=(c.d_model,), initializer="zeros")
        self.scale = 1.0 / math.sqrt(c.d_head)
        self.built = True

    def weight_roles(self):
        roles = [(w, "kernel") for w in (self.q, self.k, self.v, self.r, self.o)]
        roles += [(self.ln_gamma, "norm"), (self.ln_beta, "norm")]
        return roles + [(w, "attention_bias") for w in (self.r_w_bias, self.r_r_bias, self.r_s_bias)]

    def biases(self):
        """r_w, r_r, r_s and seg_embed in the compute dtype."""
        return tuple(tf.cast(w, self.compute_dtype)
                     for w in (self.r_w_bias, self.r_r_bias, self.r_s_bias, self.segment.seg_embed))

    # ------------------------------------------------------------------ projections
    # Projections run as plain 2-D MatMuls on [b*len, d_model] (a reshape, no copy) with the heads side by side,
    # [b, len, n*h]; the graph's attention moves them to [b, n, len, h] once, so every attention product is a
    # BatchMatMul without hidden transposes.
    def flat_kernel(self, kernel):
        """A [d_model, n, h] projection kernel as [d_model, n*h] in the compute dtype."""
        c = self.config
        return tf.reshape(tf.cast(kernel, self.compute_dtype), [c.d_model, c.n_head * c.d_head])

    def project(self, x, kernel, transpose: bool = False):
        """x [b, s, d_model] @ kernel [d_model, n, h] -> [b, s, n*h] (``transpose``: [b, s, n*h] -> [b, s, d_model])
        as one 2-D MatMul (oneDNN's fast path)."""
        shape = tf.shape(x)
        y = tf.matmul(tf.reshape(x, tf.stack([-1, shape[-1]])), self.flat_kernel(kernel), transpose_b=transpose)
        return tf.reshape(y, tf.concat([shape[:-1], tf.shape(y)[-1:]], axis=0))

    def split_heads(self, x):
        """[b, s, n*h] -> [b, n, s, h]."""
        c = self.config
        x = tf.reshape(x, tf.concat([tf.shape(x)[:-1], [c.n_head, c.d_head]], axis=0))
        return tf.transpose(x, [0, 2, 1, 3])

    def merge_heads(self, x):
        """[b, n, s, h] -> [b, s, n*h]."""
        shape = tf.shape(x)
        x = tf.transpose(x, [0, 2, 1, 3])
        return tf.reshape(x, tf.stack([shape[0], shape[2], self.config.n_head * self.config.d_head]))

    def positional_tables(self, basis: PositionalBasis, dtype):
        """The factored projections (sin |d|f) W_sin and (cos |d|f) W_cos, each [R, n*h]."""
        w = self.flat_kernel(self.r)
        half = self.config.d_model // 2
        w_sin = tf.slice(w, [0, 0], [half, -1])
        w_cos = tf.slice(w, [half, 0], [half, -1])
        return tf.matmul(tf.cast(basis.sin, dtype), w_sin), tf.matmul(tf.cast(basis.cos, dtype), w_cos)

    def positional_rows(self, pos_emb, dtype):
        """Projected positional encodings [pb, r, n*h] from a [pb, r, d] tensor or a ``PositionalBasis``."""
        if not isinstance(pos_emb, PositionalBasis):
            return self.project(tf.cast(pos_emb, dtype), self.r)
        from_sin, from_cos = self.positional_tables(pos_emb, dtype)
        from_sin = tf.gather(from_sin, pos_emb.index)  # [pb, r, n*h]
        from_cos = tf.gather(from_cos, pos_emb.index)
        return from_cos + from_sin * tf.expand_dims(tf.cast(pos_emb.sign, dtype), -1)

    # ------------------------------------------------------------------ forward
    def call(self, h, g, mem, inputs: LayerInputs):
        keys = self.keys(h, mem, inputs)
        out_h = self.output(h, self.attend(self.project(h, self.q), keys, inputs.content_blocked, inputs, 1),
                            inputs, 2)
        if g is None:
            return out_h, None
        q_g, tm = self.project(g, self.q), inputs.target_mapping
        if tm is None:
            vec_g = self.attend(q_g, keys, inputs.query_blocked, inputs, 5)
        else:  # the query rows attend at their target positions: [b, m, .] -> [b, q, .], then back
            vec_g = tf.matmul(tm, self.attend(tf.matmul(tm, q_g, transpose_a=True), keys, inputs.query_blocked,
                                              inputs, 5))
        return out_h, self.output(g, vec_g, inputs, 6)

    def memory_kv(self, mem) -> KeyValueMemory:
        """Memory hidden states [b, mlen, d] -> their keys and values (a ``KeyValueMemory``)."""
        mem = tf.cast(mem, self.compute_dtype)
        return KeyValueMemory(self.project(mem, self.k), self.project(mem, self.v))

    def keys(self, h, mem, inputs: LayerInputs):
        """The keys, values and projected positional encodings of this call over the memory (hidden states, a
        ``KeyValueMemory`` or None) and h, shared by both streams: the graph's k, v [b, n, k, h] and kr
        [pb, n, r, h], or the kernels' (``fused_attention.keys``)."""
        if isinstance(mem, KeyValueMemory):
            k = tf.concat([mem.k, self.project(h, self.k)], axis=1)
            v = tf.concat([mem.v, self.project(h, self.v)], axis=1)
        else:
            cat = h if mem is None else tf.concat([tf.cast(mem, h.dtype), h], axis=1)
            k, v = self.project(cat, self.k), self.project(cat, self.v)
        if inputs.accel.kernel is not None:
            return fused_attention.keys(self, k, v, inputs)
        return (self.split_heads(k), self.split_heads(v),
                self.split_heads(self.positional_rows(inputs.pos_emb, k.dtype)))

    def attend(self, q, keys, blocked, inputs: LayerInputs, salt: int):
        """Queries [b, s, n*h] over ``keys`` -> [b, s, n*h]: ``rel_attn_core``, in query chunks when chosen,
        or the kernels."""
        if inputs.accel.kernel is not None:
            return fused_attention.attend(self, q, keys, blocked, inputs, salt)
        k, v, kr = keys
        r_w, r_r, r_s, seg_embed = self.biases()

        def core(q, kr, ef_diff, blocked, salt):
            return rel_attn_core(q, k, v, kr, r_w, r_r, r_s, seg_embed, ef_diff, blocked, self.scale,
                                 self.config.dropatt, inputs.seed, salt, inputs.accel.ops)

        vec = chunks.attend(core, self.split_heads(q), tf.shape(k)[2], kr, inputs.ef_diff, blocked, salt,
                            inputs.accel.chunk)
        return self.merge_heads(vec)

    def output(self, x, vec, inputs: LayerInputs, salt: int):
        """vec [b, s, n*h] -> output projection, dropout, residual, LayerNorm: [b, s, d]."""
        c = self.config
        return inputs.accel.ops.dropout_add_layer_norm(self.project(vec, self.o, transpose=True), x, self.ln_gamma,
                                                       self.ln_beta, c.layer_norm_eps, c.dropout, inputs.seed, salt)
