"""XLNet's relative encodings: sinusoid encodings of relative positions, and learned relative segment encodings.

* ``RelativePositionalEncoding`` (no weights): the encodings of the distances a query row may look back/ahead,
  shared by every block; each block projects them with its own ``r`` kernel.
* ``SegmentEncoding`` (one weight per block, ``seg_embed`` [2, n_head, d_head]): whether two positions are in
  the same segment, as one of two learned vectors per head; only same/different matters, never which segment.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import keras
import tensorflow as tf

from xlnet_tf.ops import PLAIN, OpsTable


def relative_distances(qlen, klen, attn_type: str, bi_data: bool, clamp_len: int) -> tf.Tensor:
    """The relative distances the encodings stand for, float32 [pb, rlen] (pb = 2 with bi_data, else 1).

    bi: distances klen .. -qlen+1; uni: klen .. 1 (rlen = klen + 1). With bi_data the second row holds the
    backward half's distances (negated).
    """
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
    """Sinusoid encodings of the relative distances, [pb, rlen, d_model]: the sin block before the cos block."""
    sinusoid = relative_distances(qlen, klen, attn_type, bi_data, clamp_len)[..., None] * _inv_freq(d_model)
    return tf.cast(tf.concat([tf.sin(sinusoid), tf.cos(sinusoid)], axis=-1), dtype)


class PositionalBasis(NamedTuple):
    """The relative encodings in factored form, for a forward pass without dropout on them (inference).

    An encoding is [sin(d f), cos(d f)] and sin is odd, cos even, so the projection of distance d by
    W_r = [W_sin; W_cos] is sign(d) sin(|d| f) W_sin + cos(|d| f) W_cos. Each block then multiplies only the
    sin and cos tables of the distinct |d| (half the rows of the bidirectional encoding, half the columns each:
    a quarter of the multiply-adds of the [rlen, d_model] x [d_model, n*h] projection) and picks rows.

    ``projected``: every block's tables already multiplied, (sin W_sin, cos W_cos) [R, n*h] each, block i's at i
    (``XLNetModel.projected_positions``): a loop of steps of one shape (generation: the same query and key lengths
    in every step) multiplies them once, not in every step. None: each block multiplies its own.
    """
    sin: tf.Tensor    # [R, d_model / 2] for |d| = 0 .. R-1
    cos: tf.Tensor    # [R, d_model / 2]
    index: tf.Tensor  # int32 [pb, rlen]: |d| of each encoding row
    sign: tf.Tensor   # [pb, rlen]: sign(d) (0 for d = 0, where the sin term is 0)
    projected: Optional[Tuple[Tuple[tf.Tensor, tf.Tensor], ...]] = None


def positional_basis(qlen, klen, d_model: int, attn_type: str, bi_data: bool, clamp_len: int,
                     dtype=tf.float32) -> PositionalBasis:
    """``relative_positional_encoding`` in factored form (see ``PositionalBasis``)."""
    pos = relative_distances(qlen, klen, attn_type, bi_data, clamp_len)
    mag = tf.abs(pos)
    absd = tf.range(0.0, tf.reduce_max(mag) + 1.0, 1.0, dtype=tf.float32)
    sinusoid = absd[:, None] * _inv_freq(d_model)
    return PositionalBasis(tf.cast(tf.sin(sinusoid), dtype), tf.cast(tf.cos(sinusoid), dtype),
                           tf.cast(mag, tf.int32), tf.cast(tf.sign(pos), dtype))


class RelativePositionalEncoding(keras.layers.Layer):
    """The relative positional encodings of one forward pass, for every block.

    ``call(qlen, klen, batch, seed, ops)``: without dropout on them (inference, or rate 0) a ``PositionalBasis``;
    in training [pb, rlen, d_model] after dropout, where ``pos_dropout="per_example"`` (the original: the
    encodings are tiled over the batch, then dropped) gives each example its own mask (pb = batch) and
    ``"shared"`` one mask for the batch.
    """

    def __init__(self, config, **kwargs):
        super().__init__(name="relative_positional_encoding", **kwargs)
        self.config = config
        self.built = True

    def call(self, qlen, klen, batch, seed=None, ops: OpsTable = PLAIN):
        c = self.config
        positions = (qlen, klen, c.d_model, c.attn_type, c.bi_data, c.clamp_len)
        if seed is None or c.dropout <= 0:
            return positional_basis(*positions, dtype=self.compute_dtype)
        pos_emb = relative_positional_encoding(*positions, dtype=self.compute_dtype)  # [pb, r, d]
        if c.pos_dropout == "per_example":
            pos_emb = tf.repeat(pos_emb, batch // tf.shape(pos_emb)[0], axis=0)  # [b, r, d]
        return ops.dropout(pos_emb, c.dropout, seed, 3)


class SegmentEncoding(keras.layers.Layer):
    """One block's relative segment encoding, ``seg_embed`` [2, n_head, d_head]: the two learned vectors
    (same segment, different segment) that ``attention.rel_attn_core`` scores the segment-biased queries against."""

    def __init__(self, config, **kwargs):
        super().__init__(name="segment_encoding", **kwargs)
        c = config
        self.seg_embed = self.add_weight(name="seg_embed", shape=(2, c.n_head, c.d_head),
                                         initializer=keras.initializers.RandomNormal(stddev=c.initializer_range))
        self.built = True

    def weight_roles(self):
        return [(self.seg_embed, "segment_embedding")]
