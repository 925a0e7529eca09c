"""Is a Keras ``fit`` learning? The command lines' health rules (``tasks/health.py``) watching ``fit``.

``FitHealth`` is a callback every task model's ``fit`` adds (``tasks/keras_task.py``):

* a **non-finite loss** stops ``fit`` at once with ``training.Diverged`` (one line: the step, the last finite
  loss, what to lower);
* at the end, the per-step losses go through ``health.loss_trend`` (a **divergence**: the last 10% of the steps
  at >= 3x the first step's loss; a loss that **did not fall** over >= 20 steps), and, with ``validation_data``,
  the last validation pass's predicted classes through ``health.label_check`` (a **collapse**: one class for
  nearly everything); ``health.assess`` adds the likely causes from the compile options (a fine-tuning learning
  rate on a model that starts from random weights, ...), and ``health.report`` logs one WARNING per finding, as
  the command lines do. The verdict is the model's ``fit_health`` (the command lines' ``eval_results.json["health"]``).

``LabelCounts`` is the metric behind the collapse check: the predicted and the gold class counts of the examples
the last ``evaluate`` / validation pass saw (kept out of the logs).
"""

from __future__ import annotations

import math
from typing import List, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.training import Diverged, diverged
from xlnet_tf.tasks import health


class LabelCounts(keras.metrics.Metric):
    """Predicted (argmax of the logits) and gold class counts, [2, num_classes], weighted by sample weights."""

    def __init__(self, num_classes: int, name: str = "label_counts", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = int(num_classes)
        self.counts = self.add_variable(shape=(2, self.num_classes), initializer="zeros", name="counts")

    def update_state(self, y_true, logits, sample_weight=None):
        if y_true is None:
            return
        n = self.num_classes
        weight = tf.ones_like(tf.cast(y_true, tf.float32)) if sample_weight is None else \
            tf.cast(sample_weight, tf.float32)
        predicted = tf.one_hot(tf.argmax(logits, -1, output_type=tf.int32), n)
        gold = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), n)
        self.counts.assign_add(tf.stack([tf.reduce_sum(predicted * weight[:, None], 0),
                                         tf.reduce_sum(gold * weight[:, None], 0)]))

    def result(self):
        return tf.convert_to_tensor(self.counts)

    def reset_state(self):
        self.counts.assign(tf.zeros_like(self.counts))


class FitHealth(keras.callbacks.Callback):
    """The module docstring's checks over one ``fit`` call of ``task`` (trained with ``train_config``)."""

    def __init__(self, task, train_config, validating: bool):
        super().__init__()
        self.task, self.train_config, self.validating = task, train_config, validating
        self.losses: List[float] = []
        self._mean, self._batches = 0.0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._mean, self._batches = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        if not logs or "loss" not in logs:
            return
        mean = float(logs["loss"])  # Keras' running mean over the epoch: the step's own loss is recovered
        k = self._batches + 1
        step_loss = k * mean - (k - 1) * self._mean
        self._mean, self._batches = mean, k
        if not math.isfinite(mean):
            self.task.stop_training = True
            raise self.diverged(len(self.losses) + 1, step_loss)
        self.losses.append(step_loss)

    def on_test_begin(self, logs=None):
        counts = self.task.health_counts()
        if counts is not None:
            counts.reset_state()

    def on_train_end(self, logs=None):
        trend = health.loss_trend(list(enumerate(self.losses, 1))) if self.losses else None
        check = self.validation_check() if self.validating else None
        cfg = self.train_config
        context = {"learning_rate": cfg.learning_rate, "bias_correction": cfg.adam_bias_correction,
                   "weight_decay": cfg.weight_decay, "pretrained": cfg.pretrained, "train_steps": cfg.train_steps,
                   "warmup_steps": cfg.warmup_steps}
        verdict = health.assess(check, trend, context)
        object.__setattr__(self.task, "fit_health", verdict)
        health.report(verdict, type(self.task).__name__)

    def validation_check(self) -> Optional[dict]:
        counts = self.task.health_counts()
        if counts is None:
            return None
        predicted, gold = np.asarray(counts.result()).round().astype(np.int64)
        if gold.sum() == 0:
            return None
        names = self.task.class_names()
        return health.label_check(np.repeat(np.arange(len(names)), predicted),
                                  np.repeat(np.arange(len(names)), gold), names, what="class")

    def diverged(self, step: int, loss: float) -> Diverged:
        return diverged(f"loss {loss:g}", step, list(enumerate(self.losses, 1)), self.train_config,
                        "fit stopped and the model's weights hold that step's update (build it again)",
                        ("compile(learning_rate=...)", "clip_norm"))
