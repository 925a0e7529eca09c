"""``XLNetClassifier``: classification (``num_classes`` >= 2) or regression (``regression=True``: one score per
text; ``num_classes=1`` alone is refused) as a Keras model on raw text: single texts (a list or array of strings)
or pairs (a tuple of two lists, or a list of ``(a, b)``). The base class
(``tasks/keras_task.py``) says what every task model shares; this file says what a classifier reads and gives."""

from __future__ import annotations

from typing import Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.tasks.classification import features as cls_features
from xlnet_tf.export import SEG_PAD_CLASSIFIER
from xlnet_tf.tasks.classification.serving import ClassifierServing, classification_features
from xlnet_tf.tasks import keras_inputs as door
from xlnet_tf.tasks.keras_task import XLNetTask


@keras.saving.register_keras_serializable("xlnet_tf")
class XLNetClassifier(XLNetTask):
    """``XLNetClassifier.from_pretrained(path, num_classes=2)`` or ``XLNetClassifier(config, num_classes=2,
    tokenizer=...)``. ``predict`` gives logits [n, num_classes] (regression: scores [n]); ``label_names`` name
    the classes in the export's ``label_name`` output. Texts are laid out as ``run_classifier.py`` lays them out
    (``A <sep> (B <sep>) <cls>``, left-padded, the longer side trimmed first to ``max_seq_length``)."""

    def __init__(self, config, num_classes: int = 2, regression: bool = False,
                 label_names: Optional[Sequence[str]] = None, pair: bool = False, **kwargs):
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r}: expected an integer >= 2 (or regression=True)")
        if int(num_classes) == 1 and not regression:
            raise ValueError("num_classes=1: a classifier needs >= 2 classes; for one real-valued score per text "
                             "pass regression=True")
        self.regression = bool(regression)
        self.num_classes = 1 if self.regression else int(num_classes)
        self.label_names = None if label_names is None else [str(n) for n in label_names]
        if self.label_names is not None and len(self.label_names) != self.num_classes:
            raise ValueError(f"label_names: {len(self.label_names)} names for {self.num_classes} classes")
        twice = sorted({n for n in self.label_names or () if self.label_names.count(n) > 1})
        if twice:
            raise ValueError(f"label_names: {twice[0]!r} names two classes; each class needs its own name")
        self.pair = bool(pair)
        super().__init__(config, **kwargs)

    @property
    def predicts_logits(self) -> bool:
        return not self.regression

    def check_lengths(self, max_seq_length: int) -> None:
        cls_features.check_text_room(max_seq_length, self.pair)

    def make_head(self, config, **head_options):
        from xlnet_tf.heads.classification import ClassificationHead

        return ClassificationHead(config.d_model, self.num_classes, regression=self.regression,
                                  task_name=head_options.pop("task_name", "task"), n_head=config.n_head,
                                  d_head=config.d_head, **head_options)

    def task_config(self):
        return {"num_classes": self.num_classes, "regression": self.regression, "label_names": self.label_names,
                "pair": self.pair}

    segment_pad = SEG_PAD_CLASSIFIER
    TEXT_INPUTS, REQUIRED_TEXTS = ("text_a", "text_b"), 1

    def feature_spec(self, length):
        return cls_features.feature_spec(length, self.regression)

    def default_metrics(self):
        if self.regression:
            return [keras.metrics.MeanSquaredError(name="mse")]
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    @property
    def num_labels(self) -> int:
        if self.regression:
            raise ValueError("class_weight: a regression model has no classes (use sample_weight)")
        return self.num_classes

    # raw text
    def raw_inputs(self, x):
        """Texts, or pairs: a tuple ``(texts_a, texts_b)`` or a list of ``(a, b)`` (``tasks/keras_inputs.py``)."""
        columns = door.pair_columns(x)
        if columns is None:
            return door.texts(x)
        a, b = door.texts(columns[0], "texts_a"), door.texts(columns[1], "texts_b")
        door.same_length("texts_a", a, "texts_b", b)
        self.pair = True
        self.check_lengths(self.max_seq_length)
        return a, b

    def check_labels(self, y, n: int) -> np.ndarray:
        labels = door.regression_targets(y) if self.regression else \
            door.class_labels(y, self.num_classes, self.label_names)
        door.same_length("x", range(n), "y", labels)
        return labels

    def empty_prediction(self) -> np.ndarray:
        return np.zeros((0,) if self.regression else (0, self.num_classes), np.float32)


    def is_raw(self, element_spec) -> bool:
        first = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        if isinstance(first, tuple):
            self.pair = True
            first = first[0]
        return isinstance(first, tf.TensorSpec) and first.dtype == tf.string

    def labelled(self, element) -> bool:
        # (texts, labels[, weights]) or ((a, b), labels[, weights]); a bare (a, b) pair of string batches is not
        return len(element) in (2, 3) and not (element[1].dtype == tf.string)

    def text_features(self, texts, length=None):
        tok = self._tok
        if tok is None:
            raise ValueError(f"{type(self).__name__} has no tokenizer (tokenizer=PATH/spiece.model)")
        a, b = (texts if isinstance(texts, tuple) else (texts, None))
        ids_b = None if b is None else tok.graph.tokenize(b)
        features = classification_features(tok.graph.tokenize(a), ids_b, self.max_seq_length, tok.python.sep_id,
                                           tok.python.cls_id, length=length)
        return features if length is not None else self.on_length_grid(features, left=self.pads_left)

    def metric_pair(self, features, outputs):
        label = features["label"]
        if self.regression:
            return tf.cast(label, tf.float32), outputs["score"]
        return label, outputs["logits"]

    def predict_outputs(self, features, outputs):
        return tf.cast(outputs["score" if self.regression else "logits"], tf.float32)

    # export
    def make_serving(self):
        return ClassifierServing(self, self.tokenizer, self.max_seq_length, label_names=self.label_names)

    export_kind = "classifier"  # every export format (tasks/export_formats.py)

    def export_options(self):
        return {"pair": self.pair}
