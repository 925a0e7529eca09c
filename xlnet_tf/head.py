"""The small protocol every task head follows (Estimator-style: logits, loss, predictions, serving outputs).

A head is a Keras layer called on the backbone's outputs and the batch's features:

    outputs = head(backbone_outputs, features, training=...)   # dict of tensors (logits, ...)
    head.loss(features, outputs)        -> float32 [batch] per-example loss (the loop averages/scales it)
    head.predictions(outputs)           -> dict of tensors written by --do_predict / used for metrics
    head.serving_outputs(outputs)       -> dict of tensors returned by the exported SavedModel
    head.original_names()               -> {our variable path suffix: original TF1 checkpoint name}
    head.huggingface_config()           -> transformers' config fields of the same head (its class under
                                           "architectures"), or a ValueError naming what HF lacks
    head.huggingface_weights()          -> {HF key: (variable, transposed)} of the head's weights
    head.huggingface_tensors()          -> {HF key: array} of the head's weights (from huggingface_weights)
    HeadClass.size(config, **args)      -> xlnet_tf.ram.HeadSize: the weights and kept activations of the head
                                           ``HeadClass(**args)`` would build, for the RAM estimate (no layer made)

``backbone_outputs`` is the dict XLNetModel returns (``sequence_output`` [batch, seq, d_model], ...).
Losses are computed in float32 whatever the compute dtype.
"""

from __future__ import annotations

from typing import Dict, Tuple

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.ram import HeadSize


class Head(keras.layers.Layer):
    """Base class; subclasses implement ``call`` and ``loss``. ``reads_last_position``: the head reads only the
    last position of ``sequence_output`` (the ``<cls>`` at the end of the left-padded layouts), so the task model
    asks the backbone for that row alone (``XLNetModel.call``'s ``last_position_only``)."""

    reads_last_position = False

    def loss(self, features: Dict[str, tf.Tensor], outputs: Dict[str, tf.Tensor]) -> tf.Tensor:
        raise NotImplementedError

    @classmethod
    def size(cls, config, **args) -> HeadSize:
        """What ``cls(**args)`` adds to a step of ``config``'s backbone, for ``xlnet_tf.ram.estimate``: its trainable
        weights and the activations it keeps (``HeadSize``). A class method, so a run describes its head before
        making one (a Keras layer made only to be measured would take layer names and seeds)."""
        raise NotImplementedError(f"{cls.__name__}.size: describe the head's weights and activations "
                                  f"(xlnet_tf.ram.HeadSize)")

    def predictions(self, outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        return dict(outputs)

    def serving_outputs(self, outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        return self.predictions(outputs)

    def original_names(self) -> Dict[str, str]:
        """Maps each of this head's variable paths (relative to the head) to its original checkpoint name."""
        return {}

    def huggingface_config(self) -> Dict[str, object]:
        """The config.json fields of transformers' XLNet model with this head (``architectures`` names its
        class); raises ValueError, one line naming what HuggingFace lacks, where it has no such head. Needs no
        weights, so a run can refuse before training."""
        raise ValueError(f"{type(self).__name__}: HuggingFace's XLNet has no such head")

    def huggingface_weights(self) -> Dict[str, Tuple[object, bool]]:
        """{HF state-dict key: (variable, transposed)} of this head's weights: the export reads them, loading an HF
        directory assigns them (``hf_linear``, ``hf_layer_norm``)."""
        raise ValueError(f"{type(self).__name__}: HuggingFace's XLNet has no such head")

    def huggingface_tensors(self) -> Dict[str, np.ndarray]:
        """{HF state-dict key: float32 array} of this head's weights."""
        return {k: (np.asarray(v.numpy()).T if t else np.asarray(v.numpy()))
                for k, (v, t) in self.huggingface_weights().items()}


def hf_linear(prefix: str, dense) -> Dict[str, Tuple[object, bool]]:
    """A Keras Dense as torch's Linear: {HF key: (variable, transposed)} (``weight`` [out, in]; ``bias`` where it
    has one)."""
    out = {f"{prefix}.weight": (dense.kernel, True)}
    if dense.use_bias:
        out[f"{prefix}.bias"] = (dense.bias, False)
    return out


def hf_layer_norm(prefix: str, layer_norm) -> Dict[str, Tuple[object, bool]]:
    """A Keras LayerNormalization as torch's LayerNorm: {HF key: (variable, transposed)}."""
    return {f"{prefix}.weight": (layer_norm.gamma, False), f"{prefix}.bias": (layer_norm.beta, False)}
