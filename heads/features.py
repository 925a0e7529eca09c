"""A head without weights that returns hidden states: per-token vectors of chosen layers and a pooled vector each
(feature extraction, ``extract_features.py``)."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from xlnet_tf.head import Head
from xlnet_tf.ram import HeadSize

POOLINGS = ("mean", "last")


class FeatureHead(Head):
    """``layers``: indices into the backbone's n_layer + 1 hidden states (0 = the embeddings, -1 = the last
    block, Python-style). Outputs: ``tokens`` [b, s, len(layers), d] (padding positions zeroed) and ``pooled``
    [b, len(layers), d]: the mean over real tokens, or the last token (the CLS of XLNet's layout)."""
    reads_hidden_states = True

    def __init__(self, n_layer: int, layers: Sequence[int] = (-1,), pooling: str = "mean", **kwargs):
        super().__init__(name="features", **kwargs)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {POOLINGS}, got {pooling!r}")
        n = n_layer + 1
        bad = [i for i in layers if not -n <= int(i) < n]
        if bad or not layers:
            raise ValueError(f"layers: expected indices in [{-n}, {n - 1}] (0 = embeddings, -1 = last block), "
                             f"got {list(layers)}")
        self.layers = [int(i) % n for i in layers]
        self.pooling = pooling

    @classmethod
    def size(cls, config, n_layer: int = None, layers: Sequence[int] = (-1,), **_) -> HeadSize:
        """No weights; kept: the backbone's n_layer + 1 hidden states it reads, the chosen layers' tokens (stacked,
        then masked; float32) and their pooled vectors."""
        d, k = config.d_model, len(layers)
        return HeadSize("features", 0, per_token=((n_layer or config.n_layer) + 1) * d,
                        per_token_float32=2 * k * d, per_row_float32=k * d)

    def call(self, backbone_outputs, features, training=False):
        hidden = backbone_outputs["hidden_states"]
        tokens = tf.stack([tf.cast(hidden[i], tf.float32) for i in self.layers], axis=2)  # [b, s, k, d]
        mask = tf.cast(features.get("padding_mask", tf.ones(tf.shape(tokens)[:2])), tf.float32)[:, :, None, None]
        tokens = tokens * mask
        return {"tokens": tokens, "pooled": self.pool(tokens, mask),
                "padding_mask": tf.cast(mask[:, :, 0, 0], tf.int32)}

    def pool(self, tokens, mask):
        """Masked tokens [b, s, k, d] and the float mask [b, s, 1, 1] -> the pooled vectors [b, k, d] (also a long
        document's, over the tokens of all its windows: ``extract_features.document_vectors``)."""
        if self.pooling == "last":
            return tokens[:, -1]
        return tf.reduce_sum(tokens, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)

    def loss(self, features, outputs):
        raise ValueError("FeatureHead extracts features; it has no loss to train")
