"""One XLNet layer: two-stream relative attention, then the feed-forward sub-layer on each stream."""

from __future__ import annotations

from typing import Dict, Optional

import keras

from xlnet_tf.attention import LayerInputs, RelativeAttention
from xlnet_tf.feedforward import FeedForward


class XLNetBlock(keras.layers.Layer):
    """``call(h, g, mem, inputs)`` -> (h, g): h [b, q, d] the content stream, g [b, m, d] the query stream (stays
    None when given None), mem [b, mlen, d] or None, inputs the forward pass's ``LayerInputs`` with this block's
    seed. Dropout salts: attention 1, 2 (content) and 5, 6 (query stream); feed-forward 3, 4 and 7, 8."""

    def __init__(self, config, index: int, shared_biases: Optional[Dict] = None, **kwargs):
        super().__init__(name=f"layer_{index}", **kwargs)
        self.config = config
        self.index = index
        with keras.name_scope(self.name):  # variable paths xlnet/layer_{i}/rel_attn/q, ...
            self.rel_attn = RelativeAttention(config, shared_biases, index=index, dtype=self.dtype_policy)
            self.ff = FeedForward(config, dtype=self.dtype_policy)
        self.built = True

    def call(self, h, g, mem, inputs: LayerInputs):
        h, g = self.rel_attn(h, g, mem, inputs=inputs)
        seed, ops = inputs.seed, inputs.paths.ops
        h = self.ff(h, seed=seed, ops=ops, salt=3)
        return h, (None if g is None else self.ff(g, seed=seed, ops=ops, salt=7))
