"""Two-stream relative multi-head attention (the original's ``rel_attn``), with its output projection, residual
and LayerNorm.

For a query row i and a key j (memory first, then the segment) the score per head is

    (q_i + r_w) . k_j  +  (q_i + r_r) . kr[distance(i, j)]  +  (q_i + r_s) . seg_embed[diff(i, j)]

scaled by 1/sqrt(d_head), -1e30 where blocked (``masks.py``), softmax over j, attention dropout, times v_j;
kr = the block's ``r`` projection of the relative positional encodings. The content stream h attends to memory
and content; the query stream g (pretraining) to the same keys and values with its own mask. ``attend_rows``
below is the whole core; ``RelativeAttention.call`` runs both streams through it.

Weights follow the original checkpoint: q/k/v/r/o kernels [d_model, n_head, d_head] (no biases), the
r_w/r_r/r_s biases [n_head, d_head] (this block's with ``untie_r``, else the model's shared ones), the block's
``SegmentEncoding`` and a LayerNorm.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import keras
import tensorflow as tf

from xlnet_tf import accel
from xlnet_tf.accel import chunks, fused_attention
from xlnet_tf.encodings import PositionalBasis, SegmentEncoding


def attend_rows(ops_table, q_head, k_head, v_head, kr, biases, segment, ef_diff, blocked, scale, rate, seed,
                salt):
    """Relative attention for queries q_head [b, n, q, h] over keys/values [b, n, k, h]: [b, n, q, h].

    kr: [pb, n, r, h] projected positional encodings: pb = 1 shared by the batch, 2 one per half with bi_data,
    or b one per example (after dropout on the encodings), consecutive examples grouped; biases: (r_w, r_r, r_s)
    [n, h]; segment: the block's ``SegmentEncoding``; ef_diff: [b, q, k] bool or None (no segment term);
    blocked: bool [b|1, q, k] or None.
    """
    qw, qr, *qs = ops_table.query_terms(q_head, biases if ef_diff is not None else biases[:2], scale)
    ac = tf.matmul(qw, k_head, transpose_b=True)  # [b, n, q, k]
    if kr.shape[0] != 1:  # a group of the batch per encoding: [pb, b/pb, n, q, h] x [pb, 1, n, r, h]
        shape = tf.shape(qr)
        pb = tf.shape(kr)[0]
        qr = tf.reshape(qr, tf.concat([[pb, shape[0] // pb], shape[1:]], axis=0))
        bd = tf.matmul(qr, tf.expand_dims(kr, 1), transpose_b=True)
        bd = tf.reshape(bd, tf.concat([shape[:3], tf.shape(bd)[-1:]], axis=0))
    else:  # one set of encodings broadcast over the batch: [b, n, q, h] x [n, r, h]
        bd = tf.matmul(qr, tf.squeeze(kr, 0), transpose_b=True)  # [b, n, q, r]
    ef = segment(qs[0]) if ef_diff is not None else None  # [b, n, q, 2]
    prob = ops_table.attention_probs(ac, bd, ef, ef_diff, blocked, rate, seed, salt)
    return tf.matmul(prob, v_head)  # [b, n, q, h]


class GraphCore:
    """One call's keys, values and positional rows in the graph's layout ([b, n, len, h]), and attention over
    them (``attend_rows``). ``xlnet_tf.accel`` has cores with the same methods (query chunks, compiled kernels).
    """
    layout = "bnsh"  # einsum letters of a [batch, head, row, d_head] tensor

    def __init__(self, layer, cat, pos_emb, ef_diff, seed, training):
        self.layer, self.ef_diff, self.seed = layer, ef_diff, seed
        self.k = layer.heads(cat, layer.k)  # [b, n, k, h]
        self.v = layer.heads(cat, layer.v)
        self.kr = layer.split_heads(layer.positional_rows(pos_emb, cat.dtype))  # [pb, n, r, h]

    def queries(self, x):
        return self.layer.heads(x, self.layer.q)

    def attend(self, q, blocked, salt):
        return self.attend_part(q, self.kr, self.ef_diff, blocked, salt)

    def attend_part(self, q, kr, ef_diff, blocked, salt):
        layer = self.layer
        return attend_rows(layer.ops, q, self.k, self.v, kr, layer.biases(), layer.segment, ef_diff, blocked,
                           layer.scale, layer.config.dropatt, self.seed, salt)

    def merge(self, vec):
        """[b, n, s, h] -> [b, s, n*h]."""
        return self.layer.merge_heads(tf.transpose(vec, [0, 2, 1, 3]))


class RelativeAttention(keras.layers.Layer):
    """``call(h, g, mem, pos_emb, ef_diff, content_blocked, query_blocked, target_mapping, seed)`` ->
    (LayerNorm(h + dropout(attention(h) W_o)), the same for g or None).

    h: [b, q, d] content; g: [b, m, d] query stream or None; mem: [b, mlen, d] or None; pos_emb: [pb, r, d]
    or a ``PositionalBasis``; ef_diff: [b, q, klen] bool or None; *_blocked: bool [b|1, q, klen] or None;
    target_mapping: [b, m, q] or None (query-stream rows -> positions: the rows attend at their positions).
    Dropout salts: content 1 (attention) and 2 (output), query stream 5 and 6.
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

    @property
    def ops(self):
        """The ops table of the run option ``config.accelerate`` (read when tracing)."""
        return accel.ops_table(self.config.accelerations)

    def weight_roles(self):
        roles = [(w, "kernel") for w in (self.q, self.k, self.v, self.r, self.o)]
        roles += [(self.ln_gamma, "norm"), (self.ln_beta, "norm")]
        return roles + [(w, "attention_bias") for w in (self.r_w_bias, self.r_r_bias, self.r_s_bias)]

    def biases(self):
        return tuple(tf.cast(b, self.compute_dtype) for b in (self.r_w_bias, self.r_r_bias, self.r_s_bias))

    # ------------------------------------------------------------------ projections
    # Projections run as plain 2-D MatMuls on [b*len, d_model] (a reshape, no copy), heads are then moved to
    # [b, n, len, h] once, so every attention product is a BatchMatMul without hidden transposes.
    def kernel_2d(self, kernel):
        """A [d_model, n, h] projection kernel as [d_model, n*h] in the compute dtype."""
        c = self.config
        return tf.reshape(tf.cast(kernel, self.compute_dtype), [c.d_model, c.n_head * c.d_head])

    @staticmethod
    def matmul_2d(x, kernel_2d, transpose_b=False):
        """x [b, s, d_in] @ kernel_2d -> [b, s, d_out] via one 2-D MatMul (oneDNN's fast path)."""
        shape = tf.shape(x)
        y = tf.matmul(tf.reshape(x, tf.stack([-1, shape[-1]])), kernel_2d, transpose_b=transpose_b)
        return tf.reshape(y, tf.concat([shape[:-1], tf.shape(y)[-1:]], axis=0))

    def head_view(self, y):
        """[b, s, n*h] -> [b, s, n, h] (a reshape, no copy)."""
        c = self.config
        return tf.reshape(y, tf.concat([tf.shape(y)[:-1], [c.n_head, c.d_head]], axis=0))

    def split_heads(self, y):
        """[b, s, n*h] -> [b, n, s, h]."""
        return tf.transpose(self.head_view(y), [0, 2, 1, 3])

    def merge_heads(self, x):
        """[b, s, n, h] -> [b, s, n*h] (a reshape, no copy)."""
        shape = tf.shape(x)
        return tf.reshape(x, tf.stack([shape[0], shape[1], self.config.n_head * self.config.d_head]))

    def project(self, x, kernel):
        """x [b, s, d_model] @ kernel [d_model, n, h] -> [b, s, n, h] (no transpose)."""
        return self.head_view(self.matmul_2d(x, self.kernel_2d(kernel)))

    def heads(self, x, kernel):
        """x [b, s, d_model] @ kernel [d_model, n, h] -> [b, n, s, h]."""
        return tf.transpose(self.project(x, kernel), [0, 2, 1, 3])

    def positional_tables(self, basis: PositionalBasis, dtype):
        """The factored projections (sin |d|f) W_sin and (cos |d|f) W_cos, each [R, n*h]."""
        w = self.kernel_2d(self.r)
        half = self.config.d_model // 2
        w_sin = tf.slice(w, [0, 0], [half, -1])
        w_cos = tf.slice(w, [half, 0], [half, -1])
        return tf.matmul(tf.cast(basis.sin, dtype), w_sin), tf.matmul(tf.cast(basis.cos, dtype), w_cos)

    def positional_rows(self, pos_emb, dtype):
        """Projected positional encodings [pb, r, n*h] from a [pb, r, d] tensor or a ``PositionalBasis``."""
        if not isinstance(pos_emb, PositionalBasis):
            return self.matmul_2d(tf.cast(pos_emb, dtype), self.kernel_2d(self.r))
        from_sin, from_cos = self.positional_tables(pos_emb, dtype)
        from_sin = tf.gather(from_sin, pos_emb.index)  # [pb, r, n*h]
        from_cos = tf.gather(from_cos, pos_emb.index)
        return from_cos + from_sin * tf.expand_dims(tf.cast(pos_emb.sign, dtype), -1)

    # ------------------------------------------------------------------ forward
    def _post_attention(self, x, vec, seed, salt):
        """vec [b, q, n*h] -> output projection, dropout, residual, LayerNorm: [b, q, d]."""
        c = self.config
        out = self.matmul_2d(vec, self.kernel_2d(self.o), transpose_b=True)
        return self.ops.dropout_add_layer_norm(out, x, self.ln_gamma, self.ln_beta, c.layer_norm_eps, c.dropout,
                                               seed, salt)

    def _core(self, cat, pos_emb, ef_diff, seed, training):
        """The graph's attention core, or an acceleration's where it is selected and applies."""
        names = self.config.accelerations
        chunk = chunks.CHUNK if "chunks" in names and self.config.attn_type == "bi" else 0
        if "kernels" in names:
            core = fused_attention.KernelCore.create(self, cat, pos_emb, ef_diff, seed, training, chunk)
            if core is not None:
                return core
        core = GraphCore(self, cat, pos_emb, ef_diff, seed, training)
        return chunks.ChunkedCore(core, chunk) if chunk else core

    def call(self, h, g, mem, pos_emb, ef_diff, content_blocked, query_blocked, target_mapping, seed=None,
             training=False):
        cat = h if mem is None else tf.concat([tf.cast(mem, h.dtype), h], axis=1)
        core = self._core(cat, pos_emb, ef_diff, seed, bool(training))
        out_h = self._post_attention(h, core.merge(core.attend(core.queries(h), content_blocked, 1)), seed, 2)
        if g is None:
            return out_h, None
        q_g = core.queries(g)
        if target_mapping is None:
            vec_g = core.attend(q_g, query_blocked, 5)
        else:  # attend at the target positions, then gather the targets' rows
            tm = tf.cast(target_mapping, h.dtype)
            rows = core.layout.replace("s", "m")
            at_pos = core.layout.replace("s", "l")
            vec_g = core.attend(tf.einsum(f"{rows},bml->{at_pos}", q_g, tm), query_blocked, 5)
            vec_g = tf.einsum(f"{at_pos},bml->{rows}", vec_g, tm)
        return out_h, self._post_attention(g, core.merge(vec_g), seed, 6)
