"""``XLNetMultipleChoice``: RACE-style multiple choice as a Keras model on raw text. Raw input: a tuple
``(articles [n], questions [n], options [n, 4])`` of strings, laid out as ``run_race.py`` lays them out (the
question's blank filled by each option, ``article <sep> question+option <sep> <cls>`` per option, left-padded);
labels: the index of the right option. ``predict`` gives the choice scores (logits) [n, 4]. The base class
(``tasks/keras_task.py``) says what every task model shares."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.export import SEG_PAD_CLASSIFIER
from xlnet_tf.tasks.keras_task import XLNetTask
from xlnet_tf.tasks.race import features as race_data
from xlnet_tf.tasks.race.serving import NUM_CHOICES, RaceServing


@keras.saving.register_keras_serializable("xlnet_tf")
class XLNetMultipleChoice(XLNetTask):
    """``XLNetMultipleChoice.from_pretrained(path, max_seq_length=512, max_qa_length=128)``."""

    segment_pad = SEG_PAD_CLASSIFIER
    export_kind = "race"  # every export format (tasks/export_formats.py)

    def __init__(self, config, max_qa_length: int = 128, **kwargs):
        self.max_qa_length = int(max_qa_length)
        super().__init__(config, **kwargs)

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

    # raw text
    def raw_inputs(self, x):
        if not (isinstance(x, tuple) and len(x) == 3):
            raise TypeError("XLNetMultipleChoice reads (articles, questions, options [n, 4]) of strings")
        article, question, options = (np.asarray(t, dtype=object).astype(str) for t in x)
        if options.ndim != 2 or options.shape[1] != NUM_CHOICES or not len(article) == len(question) == len(options):
            raise ValueError(f"options must be [n, {NUM_CHOICES}] for n articles and questions; got articles "
                             f"{article.shape}, questions {question.shape}, options {options.shape}")
        return article, question, options

    def is_raw(self, element_spec) -> bool:
        first = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        first = first[0] if isinstance(first, tuple) else first
        return isinstance(first, tf.TensorSpec) and first.dtype == tf.string

    def labelled(self, element) -> bool:
        return len(element) == 2 and isinstance(element[0], tuple)

    def _preprocess(self, *element, length=None):
        if len(element) == 3:  # an unlabelled (articles, questions, options) batch
            return self.text_features(element, length=length)
        return super()._preprocess(*element, length=length)

    def text_features(self, texts, length=None):
        article, question, options = texts
        features = self.serving_module().features(article, question, options)
        return features if length is not None else self.on_length_grid(features, left=True)

    def metric_pair(self, features, outputs):
        return features["label"], tf.cast(outputs["logits"], tf.float32)

    def predict_outputs(self, features, outputs):
        return tf.cast(outputs["logits"], tf.float32)
