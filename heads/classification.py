"""Sequence classification / regression head over the sequence summary (GLUE, IMDB, Yelp, ...).

The original: ``s = h[:, -1]`` (CLS, thanks to left padding) -> ``tanh(Dense_d)`` -> Dropout -> ``Dense_C``
(regression: ``Dense_1`` and squared error). ``hidden_sizes`` adds a deeper MLP between the summary and the
logit (e.g. ``(512, 256)``: d -> 512 -> 256 -> C, tanh + dropout at each step), as in the 8 GB-GPU study.

Original names: ``model/sequnece_summary/summary/{kernel,bias}`` and
``model/{classification|regression}_{task}/logit/{kernel,bias}`` (only for the shallow head).
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import keras
import tensorflow as tf

from xlnet_tf.heads import DEFAULT_SUMMARY
from xlnet_tf.heads.summary import SequenceSummary
from xlnet_tf.head import Head, hf_linear
from xlnet_tf.ops import normal_init
from xlnet_tf.ram import HeadSize, dense_params


class ClassificationHead(Head):
    def __init__(self, d_model: int, num_labels: int, regression: bool = False, task_name: str = "task",
                 summary_type: str = DEFAULT_SUMMARY, hidden_sizes: Sequence[int] = (), dropout: float = 0.1,
                 initializer_range: float = 0.02, n_head=None, d_head=None, **kwargs):
        super().__init__(**kwargs)
        if regression:
            num_labels = 1
        self.d_model, self.num_labels, self.regression = d_model, int(num_labels), regression
        self.task_name = task_name.lower()  # the original scope uses the flag as given, e.g. "sts-b"
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.summary = SequenceSummary(d_model, summary_type=summary_type, dropout=dropout, n_head=n_head,
                                       d_head=d_head, initializer_range=initializer_range,
                                       name="sequence_summary", dtype=self.dtype_policy)
        self.mlp = []
        for i, size in enumerate(self.hidden_sizes):
            self.mlp.append(keras.layers.Dense(size, activation="tanh",
                                               kernel_initializer=normal_init(initializer_range),
                                               name=f"hidden_{i}", dtype=self.dtype_policy))
            self.mlp.append(keras.layers.Dropout(dropout, dtype=self.dtype_policy))
        for i, layer in enumerate(self.mlp):  # tf.train.Checkpoint does not see layers inside Keras lists
            setattr(self, f"mlp_{i}", layer)
        self.logit = keras.layers.Dense(self.num_labels, kernel_initializer=normal_init(initializer_range),
                                        name="logit", dtype=self.dtype_policy)
        self._config = dict(d_model=d_model, num_labels=num_labels, regression=regression, task_name=task_name,
                            summary_type=summary_type, hidden_sizes=list(self.hidden_sizes), dropout=dropout,
                            initializer_range=initializer_range, n_head=n_head, d_head=d_head)

    @classmethod
    def size(cls, config, d_model: int = None, num_labels: int = 2, regression: bool = False,
             summary_type: str = DEFAULT_SUMMARY, hidden_sizes: Sequence[int] = (), n_head=None, d_head=None,
             **_) -> HeadSize:
        """Weights: the summary, the MLP and the logits; kept: a few [d_model] float32 vectors per row."""
        d = d_model or config.d_model
        n, width = SequenceSummary.param_count(d, summary_type, n_head=n_head, d_head=d_head), d
        for h in hidden_sizes:
            n, width = n + dense_params(width, int(h)), int(h)
        return HeadSize("classification", n + dense_params(width, 1 if regression else int(num_labels)),
                        per_row_float32=8 * d)

    @property
    def reads_last_position(self) -> bool:
        return self.summary.summary_type == "last"

    def build(self, input_shape=None):
        pass  # sublayers build on first call

    def call(self, backbone_outputs, features=None, training=None):
        mask = None if features is None else features.get("padding_mask")
        x = self.summary(backbone_outputs["sequence_output"], padding_mask=mask, training=training)
        for layer in self.mlp:
            x = layer(x, training=training) if isinstance(layer, keras.layers.Dropout) else layer(x)
        logits = tf.cast(self.logit(x), tf.float32)
        if self.regression:
            return {"score": logits[:, 0]}
        return {"logits": logits}

    def loss(self, features: Dict[str, tf.Tensor], outputs: Dict[str, tf.Tensor]) -> tf.Tensor:
        if self.regression:
            return tf.square(outputs["score"] - tf.cast(tf.reshape(features["label"], [-1]), tf.float32))
        labels = tf.cast(tf.reshape(features["label"], [-1]), tf.int32)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs["logits"])

    def predictions(self, outputs):
        if self.regression:
            return {"score": outputs["score"]}
        logits = outputs["logits"]
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
                "label": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    def original_names(self) -> Dict[str, str]:
        names = {f"sequence_summary/{k}": v for k, v in self.summary.original_names().items()}
        if not self.hidden_sizes:
            scope = f"model/{'regression' if self.regression else 'classification'}_{self.task_name}/logit"
            names.update({"logit/kernel": f"{scope}/kernel", "logit/bias": f"{scope}/bias"})
        return names

    def huggingface_config(self) -> Dict[str, object]:
        """``XLNetForSequenceClassification``: summary -> ``logits_proj`` (regression: one label)."""
        if self.hidden_sizes:
            raise ValueError(f"head_hidden_sizes={list(self.hidden_sizes)}: HuggingFace's "
                             f"XLNetForSequenceClassification has no hidden layers between the summary and the logits")
        labels = [f"LABEL_{i}" for i in range(self.num_labels)]
        return dict(self.summary.huggingface_config(), architectures=["XLNetForSequenceClassification"],
                    id2label={str(i): n for i, n in enumerate(labels)}, label2id={n: i for i, n in enumerate(labels)},
                    problem_type="regression" if self.regression else "single_label_classification")

    def huggingface_weights(self) -> Dict[str, Tuple[object, bool]]:
        return dict(self.summary.huggingface_weights(), **hf_linear("logits_proj", self.logit))

    def get_config(self):
        config = super().get_config()
        config.update(self._config)
        return config
