"""The small protocol every task head follows (Estimator-style: logits, loss, predictions, serving outputs).

A head is a Keras layer called on the backbone's outputs and the batch's features:

    outputs = head(backbone_outputs, features, training=...)   # dict of tensors (logits, ...)
    head.loss(features, outputs)        -> float32 [batch] per-example loss (the loop averages/scales it)
    head.predictions(outputs)           -> dict of tensors written by --do_predict / used for metrics
    head.serving_outputs(outputs)       -> dict of tensors returned by the exported SavedModel
    head.original_names()               -> {our variable path suffix: original TF1 checkpoint name}

``backbone_outputs`` is the dict XLNetModel returns (``sequence_output`` [batch, seq, d_model], ...).
Losses are computed in float32 whatever the compute dtype.
"""

from __future__ import annotations

from typing import Dict

import keras
import tensorflow as tf


class Head(keras.layers.Layer):
    """Base class; subclasses implement ``call`` and ``loss``."""

    def loss(self, features: Dict[str, tf.Tensor], outputs: Dict[str, tf.Tensor]) -> tf.Tensor:
        raise NotImplementedError

    def predictions(self, outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        return dict(outputs)

    def serving_outputs(self, outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        return self.predictions(outputs)

    def original_names(self) -> Dict[str, str]:
        """Maps each of this head's variable paths (relative to the head) to its original checkpoint name."""
        return {}
