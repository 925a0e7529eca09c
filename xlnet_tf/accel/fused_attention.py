"""``kernels``: a block's attention core as compiled CPU ops (``kernels/rel_attention.cc``).

On a CPU-only host, in float32 and without bi_data, the biased queries, AC, BD with the relative shift, EF, the
mask, the softmax (and in training the attention dropout) and P.V of a block are one op that keeps each tile's
scores in cache and reads/writes the heads in their [b, len, n, h] layout (no head transposes). At inference one
op; in training a forward op that also returns the probabilities and a backward op that computes every gradient
from them, with the dropout mask drawn as the graph draws it (per query chunk, the same salts: the masks are
bit-identical). ``CompiledAttention`` is what ``Paths.kernel`` hands the attention layer: its ``keys`` and
``attend`` replace the layer's. Same formulas as ``attention.rel_attn_core``, another summation order (outputs within ~2e-6 of
the graph at Base size). ``accel.choose`` decides where they run: they step aside inside XLA-compiled functions
(XLA cannot compile a custom op), while tracing a SavedModel (``accel.portable_graph``: exports need TensorFlow
and tensorflow-text only), with bi_data, for per-example positional encodings (dropout on them per example) and
when the library is not built for this machine (``python -m xlnet_tf.accel.kernels build``). Measured gain
(PERFORMANCE.md "Accelerations", XLNet-Base): 1.04x at 8x128 and 1.18x at 2x512 inference, 1.07x per training step at 8x128 with
``pos_dropout="shared"``.
"""

from __future__ import annotations

import tensorflow as tf

from xlnet_tf.accel.chunks import chunk_salt, query_chunks
from xlnet_tf.ops import keep_mask_xla, site


def _heads(layer, x):
    """[b, s, n*h] -> [b, s, n, h] (a reshape, no copy: the kernels' layout)."""
    c = layer.config
    return tf.reshape(x, tf.concat([tf.shape(x)[:-1], [c.n_head, c.d_head]], axis=0))


class CompiledAttention:
    """The compiled attention ops (``kernels.load()``) as the attention layer calls them (``Paths.kernel``)."""

    def __init__(self, op):
        self.op = op

    def keys(self, layer, k, v, inputs):
        return keys(layer, k, v, inputs)

    def attend(self, layer, q, keys_, blocked, inputs, salt):
        return attend(self.op, layer, q, keys_, blocked, inputs, salt)


def keys(layer, k, v, inputs):
    """The projected keys and values [b, k, n*h] as [b, k, n, h], and the op's positional input: in training the
    projected rows [r, n*h] (one set for the batch: dropout may have touched the encodings), at inference the
    factored tables (the op combines them)."""
    dtype = k.dtype
    k, v = _heads(layer, k), _heads(layer, v)
    if inputs.training:
        return k, v, (tf.squeeze(layer.positional_rows(inputs.pos_emb, dtype), 0),)
    basis = inputs.pos_emb
    from_sin, from_cos = layer.positional_tables(basis, dtype)
    return k, v, (from_sin, from_cos, basis.index[0], tf.cast(basis.sign[0], dtype))


def _keep(layer, q, klen, seed, salt, chunk):
    """The attention-dropout keep mask [b, n, q, k], drawn per query chunk as the graph draws it."""
    c = layer.config
    if seed is None or c.dropatt <= 0.0:
        return tf.zeros([0, 0, 0, 0], tf.bool)
    shape = tf.shape(q)
    spans = query_chunks(q.shape[1], chunk) or [(0, None)]
    return tf.concat([keep_mask_xla(tf.stack([shape[0], c.n_head, (i1 if i1 else shape[1]) - i0, klen]),
                                    site(seed, chunk_salt(salt, i)), c.dropatt)
                      for i, (i0, i1) in enumerate(spans)], axis=2)


def attend(op, layer, q, keys, blocked, inputs, salt):
    """q [b, s, n*h] over ``keys`` -> [b, s, n*h] through the compiled ops ``op`` (in place of
    ``attention.RelativeAttention.attend``'s core)."""
    c = layer.config
    k, v, pos = keys
    out_shape = tf.shape(q)
    q = _heads(layer, q)
    none = tf.zeros([0, 0, 0], tf.bool)
    diff = none if inputs.ef_diff is None else inputs.ef_diff
    blocked = none if blocked is None else blocked
    rw, rr, rs, seg = layer.biases()
    if not inputs.training:
        out = op.xlnet_rel_attention(q, k, v, *pos, rw, rr, rs, seg, diff, blocked, scale=layer.scale)
        return tf.reshape(out, out_shape)
    keep = _keep(layer, q, tf.shape(k)[1], inputs.seed, salt, inputs.paths.chunk)
    attrs = dict(scale=layer.scale, keep_scale=1.0 / (1.0 - c.dropatt))
    if inputs.ef_diff is None:  # no segment term: r_s and seg_embed are not used (no gradient, as in the graph)
        rs, seg = tf.stop_gradient(rs), tf.stop_gradient(seg)

    @tf.custom_gradient
    def fused(q, k, v, kr, rw, rr, rs, seg):
        out, prob = op.xlnet_rel_attention_train(q, k, v, kr, rw, rr, rs, seg, diff, blocked, keep, **attrs)

        def grad(d_out):
            return op.xlnet_rel_attention_grad(d_out, q, k, v, kr, rw, rr, rs, seg, diff, blocked, keep, prob,
                                               **attrs)

        return out, grad

    return tf.reshape(fused(q, k, v, pos[0], rw, rr, rs, seg), out_shape)
