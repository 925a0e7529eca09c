"""Multiple-choice head (RACE): one score per (question, option) sequence, softmax over the options.

The backbone runs on the flattened choices (``xlnet_tf.task_model.TaskModel`` reshapes [batch, 4, seq] to
[batch*4, seq]); this head takes its ``sequence_output`` [batch*4, seq, d], summarises each sequence
(``SequenceSummary``, "last" = the ``<cls>`` at the end of the left-padded layout, tanh projection, dropout),
scores it with ``Dense_1`` and reshapes to [batch, 4].
Loss: softmax cross-entropy per example in float32 (a label of -1, i.e. unlabelled, gives 0).

Original checkpoint names: ``model/sequnece_summary/summary/{kernel,bias}`` and ``logits/dense/{kernel,bias}``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import keras
import tensorflow as tf

from xlnet_tf.heads import DEFAULT_SUMMARY
from xlnet_tf.heads.summary import SequenceSummary
from xlnet_tf.head import Head, hf_linear
from xlnet_tf.ram import HeadSize, dense_params


class MultipleChoiceHead(Head):
    def __init__(self, d_model: int, num_choices: int = 4, summary_type: str = DEFAULT_SUMMARY, use_proj: bool = True,
                 dropout: float = 0.1, n_head: Optional[int] = None, d_head: Optional[int] = None,
                 dropatt: float = 0.1, initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_choices = d_model, num_choices
        self._summary_args = dict(summary_type=summary_type, use_proj=use_proj, dropout=dropout, n_head=n_head,
                                  d_head=d_head, dropatt=dropatt, initializer_range=initializer_range)
        self.summary = SequenceSummary(d_model, name="sequence_summary", dtype=self.dtype_policy,
                                       **self._summary_args)
        self.logits_dense = keras.layers.Dense(
            1, kernel_initializer=keras.initializers.RandomNormal(stddev=initializer_range), name="logits",
            dtype=self.dtype_policy)

    @classmethod
    def size(cls, config, d_model: int = None, summary_type: str = DEFAULT_SUMMARY, use_proj: bool = True,
             n_head=None, d_head=None, **_) -> HeadSize:
        """Weights: the summary and one score per option; kept: a few [d_model] float32 vectors per sequence."""
        d = d_model or config.d_model
        return HeadSize("multiple_choice", SequenceSummary.param_count(d, summary_type, use_proj, n_head, d_head)
                        + dense_params(d, 1), per_row_float32=8 * d)

    @property
    def reads_last_position(self) -> bool:
        return self.summary.summary_type == "last"

    def build(self, input_shape=None):
        # Variables are created on the first call (they only depend on d_model).
        pass

    def call(self, backbone_outputs, features=None, training=None):
        hidden = backbone_outputs["sequence_output"]  # [batch*num_choices, seq, d]
        mask = None
        if features is not None and "padding_mask" in features and self.summary.summary_type in ("mean", "attn"):
            mask = tf.reshape(features["padding_mask"], tf.shape(hidden)[:2])
        summary = self.summary(hidden, padding_mask=mask, training=training)
        logits = tf.reshape(self.logits_dense(summary), [-1, self.num_choices])
        return {"logits": logits}

    def loss(self, features: Dict[str, tf.Tensor], outputs: Dict[str, tf.Tensor]) -> tf.Tensor:
        logits = tf.cast(outputs["logits"], tf.float32)
        labels = tf.reshape(tf.cast(features["label"], tf.int32), [-1])
        one_hot = tf.one_hot(labels, self.num_choices, dtype=tf.float32)
        return -tf.reduce_sum(tf.nn.log_softmax(logits, axis=-1) * one_hot, axis=-1)

    def predictions(self, outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        logits = tf.cast(outputs["logits"], tf.float32)
        return {"choice": tf.argmax(logits, axis=-1, output_type=tf.int32),
                "probabilities": tf.nn.softmax(logits, axis=-1)}

    def original_names(self) -> Dict[str, str]:
        names = {f"sequence_summary/{k}": v for k, v in self.summary.original_names().items()}
        names.update({"logits/kernel": "logits/dense/kernel", "logits/bias": "logits/dense/bias"})
        return names

    def huggingface_config(self) -> Dict[str, object]:
        """``XLNetForMultipleChoice``: summary -> ``logits_proj`` (one score per option)."""
        return dict(self.summary.huggingface_config(), architectures=["XLNetForMultipleChoice"])

    def huggingface_weights(self) -> Dict[str, Tuple[object, bool]]:
        return dict(self.summary.huggingface_weights(), **hf_linear("logits_proj", self.logits_dense))

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_choices=self.num_choices, **self._summary_args)
        return config
