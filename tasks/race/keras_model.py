"""``XLNetMultipleChoice``: RACE-style multiple choice as a Keras model on raw text. Raw input: a tuple
``(articles [n], questions [n], options [n, 4])`` of strings, laid out as ``run_race.py`` lays them out (the
question's blank filled by each option, ``article <sep> question+option <sep> <cls>`` per option, left-padded);
labels: the index of the right option, or its letter "A"-"D" as RACE writes it. ``predict`` gives the choice
scores (logits) [n, 4]. The base class (``tasks/keras_task.py``) says what every task model shares."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.export import SEG_PAD_CLASSIFIER
from xlnet_tf.tasks import keras_inputs as door
from xlnet_tf.tasks.keras_task import XLNetTask
from xlnet_tf.tasks.race import features as race_data
from xlnet_tf.tasks.race.serving import NUM_CHOICES, RaceServing


@keras.saving.register_keras_serializable("xlnet_tf")
class XLNetMultipleChoice(XLNetTask):
    """``XLNetMultipleChoice.from_pretrained(path, max_seq_length=512, max_qa_length=128)``."""

    segment_pad = SEG_PAD_CLASSIFIER
    TEXT_INPUTS, REQUIRED_TEXTS = ("article", "question", "options"), 3
    predicts_logits = True
    export_kind = "race"  # every export format (tasks/export_formats.py)

    def __init__(self, config, max_qa_length: int = 128, **kwargs):
        self.max_qa_length = door.whole_number("max_qa_length", max_qa_length, 1)
        super().__init__(config, **kwargs)

    def check_lengths(self, max_seq_length: int) -> None:
        race_data.check_lengths(max_seq_length, self.max_qa_length)

    def make_head(self, config, **head_options):
        from xlnet_tf.heads.multiple_choice import MultipleChoiceHead

        return MultipleChoiceHead(config.d_model, n_head=config.n_head, d_head=config.d_head, **head_options)

    def task_config(self):
        return {"max_qa_length": self.max_qa_length}

    def feature_spec(self, length):
        return race_data.race_feature_spec(length)

    def default_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def make_serving(self):
        return RaceServing(self, self.tokenizer, self.max_seq_length, self.max_qa_length)

    num_labels = NUM_CHOICES

    # raw text
    def raw_inputs(self, x):
        """``(articles, questions, options)``: n texts, n texts, n rows of 4 texts (``tasks/keras_inputs.py``)."""
        if not (isinstance(x, tuple) and len(x) == 3):
            raise TypeError("XLNetMultipleChoice reads a tuple (articles, questions, options [n, 4]) of strings")
        article, question = door.texts(x[0], "articles"), door.texts(x[1], "questions")
        door.same_length("articles", article, "questions", question)
        rows = door.options(x[2], len(article), NUM_CHOICES)
        options = np.empty((len(rows), NUM_CHOICES), dtype=object)
        for i, row in enumerate(rows):
            options[i] = row
        return article, question, options

    def check_labels(self, y, n: int) -> np.ndarray:
        """The right option of each question: an index 0-3 or RACE's own letter "A"-"D"."""
        labels = door.choice_labels(y, NUM_CHOICES, "y")
        door.same_length("articles", range(n), "y", labels)
        return labels

    def empty_prediction(self) -> np.ndarray:
        return np.zeros((0, NUM_CHOICES), np.float32)

    def is_raw(self, element_spec) -> bool:
        first = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        first = first[0] if isinstance(first, tuple) else first
        return isinstance(first, tf.TensorSpec) and first.dtype == tf.string

    def labelled(self, element) -> bool:
        # ((articles, questions, options), labels[, weights]); a bare (articles, questions, options) is not
        return len(element) in (2, 3) and isinstance(element[0], tuple)

    def text_features(self, texts, length=None):
        article, question, options = texts
        features = self.serving_module().features(article, question, options)
        return features if length is not None else self.on_length_grid(features, left=self.pads_left)

    def metric_pair(self, features, outputs):
        return features["label"], tf.cast(outputs["logits"], tf.float32)

    def predict_outputs(self, features, outputs):
        return tf.cast(outputs["logits"], tf.float32)
