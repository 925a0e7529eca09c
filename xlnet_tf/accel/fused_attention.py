"""``kernels``: a block's attention core as compiled CPU ops (``kernels/rel_attention.cc``).

On a CPU-only host, in float32 and without bi_data, the biased queries, AC, BD with the relative shift, EF, the
mask, the softmax (and in training the attention dropout) and P.V of a block are one op that keeps each tile's
scores in cache and reads/writes the heads in their [b, len, n, h] layout (no head transposes). At inference one
op; in training a forward op that also returns the probabilities and a backward op that computes every gradient
from them, with the dropout mask drawn as the graph draws it (per query chunk, the same salts: the masks are
bit-identical). Same formulas as ``attention.attend_rows``, another summation order (outputs within ~2e-6 of
the graph at Base size). The kernels step aside inside XLA-compiled functions (XLA cannot compile a custom op),
while tracing a SavedModel (``accel.portable_graph``: exports need TensorFlow and tensorflow-text only), for
per-example positional encodings (dropout on them per example) and when the library is not built for this
machine (``python -m xlnet_tf.accel.kernels build``). Measured gain (PERFORMANCE.md "Accelerations",
XLNet-Base): 1.04x at 8x128 and 1.18x at 2x512 inference, 1.07x per training step at 8x128 with
``pos_dropout="shared"``.
"""

from __future__ import annotations

import tensorflow as tf

from xlnet_tf import accel
from xlnet_tf.accel import kernels
from xlnet_tf.accel.chunks import chunk_salt, query_chunks
from xlnet_tf.encodings import PositionalBasis
from xlnet_tf.ops import keep_mask_xla, site


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # cannot tell: stay on TensorFlow ops
        return True
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def op_for(d_head: int, dtype):
    """The compiled relative-attention op when this trace may use it, else None."""
    if accel.portable() or tf.as_dtype(dtype) != tf.float32 or d_head % kernels.D_HEAD_MULTIPLE:
        return None
    if _in_xla_context() or accel.accelerator_visible():
        return None
    return kernels.load()


class KernelCore:
    """Attention through the kernels, with the methods of ``attention.GraphCore`` in the [b, len, n, h] layout."""
    layout = "bsnh"

    @classmethod
    def create(cls, layer, cat, pos_emb, ef_diff, seed, training, chunk):
        """A core when the kernels apply to this call, else None. The inference op reads the factored
        encodings; in training one set of encodings for the whole batch (the training forward takes projected
        rows)."""
        basis = isinstance(pos_emb, PositionalBasis)
        if layer.config.bi_data or not (basis or (training and pos_emb.shape[0] == 1)):
            return None
        op = op_for(layer.config.d_head, cat.dtype)
        return None if op is None else cls(layer, op, cat, pos_emb, ef_diff, seed, training, chunk)

    def __init__(self, layer, op, cat, pos_emb, ef_diff, seed, training, chunk):
        self.layer, self.op, self.ef_diff, self.seed, self.training, self.chunk = \
            layer, op, ef_diff, seed, training, chunk
        self.k = layer.project(cat, layer.k)  # [b, k, n, h]
        self.v = layer.project(cat, layer.v)
        if training:  # the projected rows [r, n*h] (dropout may have touched the encodings)
            self.pos = (tf.squeeze(layer.positional_rows(pos_emb, cat.dtype), 0),)
        else:  # the factored tables; the op combines them (no gathered [r, n*h] tensor)
            from_sin, from_cos = layer.positional_tables(pos_emb, cat.dtype)
            self.pos = (from_sin, from_cos, pos_emb.index[0], tf.cast(pos_emb.sign[0], cat.dtype))

    def queries(self, x):
        return self.layer.project(x, self.layer.q)

    def merge(self, vec):
        return self.layer.merge_heads(vec)

    def _keep(self, q, salt):
        """The attention-dropout keep mask [b, n, q, k], drawn per query chunk as the graph draws it."""
        c, seed = self.layer.config, self.seed
        if seed is None or c.dropatt <= 0.0:
            return tf.zeros([0, 0, 0, 0], tf.bool)
        shape = tf.shape(q)
        klen = tf.shape(self.k)[1]
        spans = query_chunks(q.shape[1], self.chunk) or [(0, None)]
        return tf.concat([keep_mask_xla(tf.stack([shape[0], c.n_head, (i1 if i1 else shape[1]) - i0, klen]),
                                        site(seed, chunk_salt(salt, i)), c.dropatt)
                          for i, (i0, i1) in enumerate(spans)], axis=2)

    def attend(self, q, blocked, salt):
        """q [b, q, n, h] over the keys and values -> [b, q, n, h]."""
        layer, c = self.layer, self.layer.config
        none = tf.zeros([0, 0, 0], tf.bool)
        diff = none if self.ef_diff is None else self.ef_diff
        blocked = none if blocked is None else blocked
        rw, rr, rs = layer.biases()
        seg = tf.cast(layer.segment.seg_embed, layer.compute_dtype)
        if not self.training:
            return self.op.xlnet_rel_attention(q, self.k, self.v, *self.pos, rw, rr, rs, seg, diff, blocked,
                                               scale=layer.scale)
        keep = self._keep(q, salt)
        attrs = dict(scale=layer.scale, keep_scale=1.0 / (1.0 - c.dropatt))
        if self.ef_diff is None:  # no segment term: r_s and seg_embed are not used (no gradient, as in the graph)
            rs, seg = tf.stop_gradient(rs), tf.stop_gradient(seg)
        op = self.op

        @tf.custom_gradient
        def attend(q, k, v, kr, rw, rr, rs, seg):
            out, prob = op.xlnet_rel_attention_train(q, k, v, kr, rw, rr, rs, seg, diff, blocked, keep, **attrs)

            def grad(d_out):
                return op.xlnet_rel_attention_grad(d_out, q, k, v, kr, rw, rr, rs, seg, diff, blocked, keep, prob,
                                                   **attrs)

            return out, grad

        return attend(q, self.k, self.v, self.pos[0], rw, rr, rs, seg)
