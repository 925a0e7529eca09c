"""Two-stream relative multi-head attention (the original's ``rel_attn``), with its output projection, residual
and LayerNorm.

For a query row i and a key j (memory first, then the segment) the score per head is

    (q_i + r_w) . k_j  +  (q_i + r_r) . kr[distance(i, j)]  +  (q_i + r_s) . seg_embed[diff(i, j)]

scaled by 1/sqrt(d_head), -1e30 where blocked (``masks.py``), softmax over j, attention dropout, times v_j;
kr = the block's ``r`` projection of the relative positional encodings. ``rel_attn_core`` below is the whole
core, every input explicit, top to bottom. ``RelativeAttention.call`` projects the keys and values once and runs
the content stream h (over memory and content) and the query stream g (pretraining: the same keys and values, its
own mask) through it; the call's ``LayerInputs.paths`` may hand in another core of the same signature (fused,
query-chunked) or the compiled attention (``xlnet_tf/paths.py``): one visible branch each.

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

from xlnet_tf.encodings import PositionalBasis, SegmentEncoding
from xlnet_tf.masks import mask_value
from xlnet_tf.ops import dropout, normal_init
from xlnet_tf.paths import Paths


@dataclasses.dataclass(frozen=True)
class LayerInputs:
    """What every block reads besides its hidden states, built once per forward pass in ``XLNetModel.call``.

    pos_emb: the relative positional encodings, [pb, r, d_model] after dropout (pb = batch with per-example
    dropout, 2 with bi_data, else 1) or, without dropout on them, a ``PositionalBasis``; ef_diff: [b, q, klen] bool
    (key in another segment) or None (no segment term); content_blocked / query_blocked: bool [b|1, q, klen]
    (True = may not attend) or None; target_mapping: [b, m, q] in the compute dtype or None; seed: this block's
    dropout seed (None: no dropout); training: the model's flag; paths: what this pass runs (``xlnet_tf/paths.py``);
    last_query: this block's content stream queries the last position only (``XLNetModel.call``'s
    ``last_position_only``; its keys and values still span every position).
    """
    pos_emb: Union[tf.Tensor, PositionalBasis]
    ef_diff: Optional[tf.Tensor]
    content_blocked: Optional[tf.Tensor]
    query_blocked: Optional[tf.Tensor]
    target_mapping: Optional[tf.Tensor]
    seed: Optional[tf.Tensor]
    training: bool
    paths: Paths
    last_query: bool = False

    def for_block(self, index: int) -> "LayerInputs":
        """The same inputs with block ``index``'s own dropout seed."""
        seed = None if self.seed is None else tf.random.experimental.stateless_fold_in(self.seed, 100 + index)
        return dataclasses.replace(self, seed=seed)

    def at_last_query(self) -> "LayerInputs":
        """These inputs for the content stream's last query row alone: its rows of the segment term and the mask
        (the keys' side unchanged). Its relative positions need no change: ``rel_shift`` (and the compiled
        attention) read a query's distances from the end of the encodings, and a single query over klen keys
        reads the rows the last of qlen queries reads."""
        last = lambda t: None if t is None else t[:, -1:]  # noqa: E731
        return dataclasses.replace(self, ef_diff=last(self.ef_diff), content_blocked=last(self.content_blocked))


class KeyValueMemory(NamedTuple):
    """A layer's memory already projected by that layer: keys and values [b, mlen, n*h] in the compute dtype
    (``RelativeAttention.memory_kv``). Generation keeps these, so that a step projects only its new positions;
    the keys do not depend on position (relative positions enter through kr), so this equals projecting the
    memory's hidden states in every step. ``own``: the keys and values of the call's own positions (a
    ``KeyValueMemory``), which ``XLNetModel.call`` projects before the block and returns (``own_kv``): the
    caller's next memory rows are taken from them, not projected a second time."""
    k: tf.Tensor
    v: tf.Tensor
    own: Optional["KeyValueMemory"] = None


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


def positional_scores(qr, kr):
    """qr [b, n, q, h] against kr [pb, n, r, h] -> [b, n, q, r]: the consecutive b/pb examples of each group of
    the batch read their group's encodings ([pb, b/pb, n, q, h] x [pb, 1, n, r, h])."""
    shape, pb = tf.shape(qr), tf.shape(kr)[0]
    qr = tf.reshape(qr, tf.concat([[pb, shape[0] // pb], shape[1:]], axis=0))
    bd = tf.matmul(qr, tf.expand_dims(kr, 1), transpose_b=True)
    return tf.reshape(bd, tf.concat([shape[:3], tf.shape(bd)[-1:]], axis=0))


def rel_attn_core(q, k, v, kr, r_w, r_r, r_s, seg_embed, ef_diff, blocked, scale: float, dropatt: float, seed,
                  salt: int):
    """Relative attention for queries q [b, n, q, h] over keys and values k, v [b, n, k, h]: [b, n, q, h].

    kr: [pb, n, r, h] projected positional encodings, consecutive examples grouped per encoding (pb = 1 shared
    by the batch, 2 one per half with bi_data, b one per example); r_w, r_r, r_s: [n, h]; seg_embed: [2, n, h];
    ef_diff: [b, q, k] bool or None (no segment term); blocked: bool [b|1, q, k] or None; dropout ``dropatt``
    with ``seed`` (None: none) at site ``salt``. The scale goes on the (small) query side, not on the scores.
    """
    s = tf.cast(scale, q.dtype)
    qs = q * s
    biased = lambda b: qs + tf.expand_dims(b, 1) * s  # noqa: E731  (q + b) s, b [n, h]
    # AC: content term
    ac = tf.matmul(biased(r_w), k, transpose_b=True)  # [b, n, q, k]
    # BD: position term, every query against every distance, then shifted to (query, key)
    bd = positional_scores(biased(r_r), kr)  # [b, n, q, r]
    score = ac + rel_shift(bd, tf.shape(ac)[-1])
    # EF: segment term, one score for "same segment" and one for "different", picked per key
    if ef_diff is not None:
        ef = tf.matmul(biased(r_s), tf.transpose(seg_embed, [1, 2, 0]))  # [b, n, q, 2]
        ef_same, ef_other = tf.split(ef, 2, axis=-1)
        score = score + tf.where(tf.expand_dims(ef_diff, 1), ef_other, ef_same)
    if blocked is not None:
        score = tf.where(tf.expand_dims(blocked, 1), tf.cast(mask_value(score.dtype), score.dtype), score)
    prob = tf.cast(tf.nn.softmax(tf.cast(score, tf.float32), axis=-1), q.dtype)  # softmax in float32
    prob = dropout(prob, dropatt, seed, salt)
    return tf.matmul(prob, v)  # [b, n, q, h]


class RelativeAttention(keras.layers.Layer):
    """``call(h, g, mem, inputs)`` -> (LayerNorm(h + dropout(attention(h) W_o)), the same for g or None).

    h: [b, q, d] content; g: [b, m, d] query stream or None; mem: [b, mlen, d] or None; inputs: ``LayerInputs``
    (with target_mapping the query-stream rows attend at their positions; with ``inputs.last_query`` the content
    stream's output is its last position's, [b, 1, d]). Dropout salts: content 1 (attention) and 2 (output), query
    stream 5 and 6.
    """

    def __init__(self, config, shared_biases: Optional[Dict] = None, index: int = 0, **kwargs):
        super().__init__(name="rel_attn", **kwargs)
        self.config = c = config
        self.index = index  # the block's: its tables in a ``PositionalBasis.projected``
        proj = (c.d_model, c.n_head, c.d_head)
        for n in "qkvro":  # (each its own draw: ``normal_init``)
            setattr(self, n, self.add_weight(name=n, shape=proj, initializer=normal_init(c.initializer_range)))
        if c.untie_r:
            for n in ("r_w_bias", "r_r_bias", "r_s_bias"):
                setattr(self, n, self.add_weight(name=n, shape=(c.n_head, c.d_head),
                                                 initializer=normal_init(c.initializer_range)))
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
        """The factored projections (sin |d|f) W_sin and (cos |d|f) W_cos, each [R, n*h] (this block's from
        ``basis.projected`` where they were multiplied once for a loop of steps)."""
        if basis.projected is not None:
            return tuple(tf.cast(t, dtype) for t in basis.projected[self.index])
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
        if inputs.last_query:  # the keys and values over every position, the queries at the last one
            h, inputs = h[:, -1:], inputs.at_last_query()
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
        [pb, n, r, h], or the compiled attention's (``paths.kernel.keys``)."""
        if isinstance(mem, KeyValueMemory):
            own = mem.own if mem.own is not None else self.memory_kv(h)
            k, v = tf.concat([mem.k, own.k], axis=1), tf.concat([mem.v, own.v], axis=1)
        else:
            cat = h if mem is None else tf.concat([tf.cast(mem, h.dtype), h], axis=1)
            k, v = self.project(cat, self.k), self.project(cat, self.v)
        if inputs.paths.kernel is not None:  # the compiled attention, its own layout
            return inputs.paths.kernel.keys(self, k, v, inputs)
        return (self.split_heads(k), self.split_heads(v),
                self.split_heads(self.positional_rows(inputs.pos_emb, k.dtype)))

    def attend(self, q, keys, blocked, inputs: LayerInputs, salt: int):
        """Queries [b, s, n*h] over ``keys`` -> [b, s, n*h]: ``rel_attn_core`` (or the core of the same signature
        the paths hand in), or the compiled attention."""
        if inputs.paths.kernel is not None:
            return inputs.paths.kernel.attend(self, q, keys, blocked, inputs, salt)
        core = inputs.paths.core or rel_attn_core
        k, v, kr = keys
        r_w, r_r, r_s, seg_embed = self.biases()
        vec = core(self.split_heads(q), k, v, kr, r_w, r_r, r_s, seg_embed, inputs.ef_diff, blocked, self.scale,
                   self.config.dropatt, inputs.seed, salt)
        return self.merge_heads(vec)

    def output(self, x, vec, inputs: LayerInputs, salt: int):
        """vec [b, s, n*h] -> output projection, dropout, residual, LayerNorm: [b, s, d]."""
        c = self.config
        return inputs.paths.ops.dropout_add_layer_norm(self.project(vec, self.o, transpose=True), x, self.ln_gamma,
                                                       self.ln_beta, c.layer_norm_eps, c.dropout, inputs.seed, salt)
