"""``XLNetQuestionAnswerer``: SQuAD v1.1 / v2.0 (span plus answerability) as a Keras model. ``predict`` takes raw
``(questions, contexts)`` and answers as the ``run_squad.py`` export does (the same in-graph windows, beams and
post-processing, ``tasks/squad/serving.py``): ``answer_text``, ``answer_start`` / ``answer_end`` (characters of
the context), ``score``, ``null_odds``, ``no_answer_probability`` and ``has_answer`` (v2.0's null decision with
``null_threshold``). ``fit`` / ``evaluate`` read the command line's SQuAD features (numpy dicts or a tf.data
Dataset of them, e.g. ``tasks.squad.features.make_dataset`` on ``run_squad.py``'s cached records): training
needs the answers' positions in the pieces, which its Python windows compute. The base class
(``tasks/keras_task.py``) says what every task model shares."""

from __future__ import annotations

from typing import Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.tasks.keras_task import XLNetTask
from xlnet_tf.tasks.squad.features import squad_feature_spec
from xlnet_tf.tasks.squad.serving import SquadServing


@keras.saving.register_keras_serializable("xlnet_tf")
class XLNetQuestionAnswerer(XLNetTask):
    """``XLNetQuestionAnswerer.from_pretrained(path, max_seq_length=512)``; the windowing and answer options are
    ``run_squad.py``'s flags of the same names."""

    def __init__(self, config, max_query_length: int = 64, doc_stride: int = 128, max_answer_length: int = 64,
                 null_threshold: Optional[float] = None, allow_last_paragraph_token: bool = False, **kwargs):
        self.squad_options = dict(max_query_length=int(max_query_length), doc_stride=int(doc_stride),
                                  max_answer_length=int(max_answer_length),
                                  null_threshold=None if null_threshold is None else float(null_threshold),
                                  allow_last_paragraph_token=bool(allow_last_paragraph_token))
        super().__init__(config, **kwargs)

    def make_head(self, config, **head_options):
        from xlnet_tf.heads.squad import SquadHead

        return SquadHead(config.d_model, **head_options)

    def task_config(self):
        return dict(self.squad_options)

    def feature_spec(self, length):
        return squad_feature_spec(length)

    def serving_module(self):
        if getattr(self, "_serving", None) is None:
            with tf.init_scope():  # (built eagerly: a dataset map or a traced step reuses it)
                self._make_serving()
        return self._serving

    def _make_serving(self):
        object.__setattr__(self, "_serving", SquadServing(self, self.tokenizer, self.max_seq_length,
                                                              **self.squad_options))
        return self._serving

    def is_raw(self, element_spec) -> bool:
        first = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        if isinstance(first, tf.TensorSpec) and first.dtype == tf.string:
            raise TypeError("XLNetQuestionAnswerer: fit/evaluate read SQuAD features (the answers' positions in "
                            "the pieces); raw (questions, contexts) go to predict")
        return False

    def raw_inputs(self, x):
        raise TypeError("XLNetQuestionAnswerer: fit/evaluate read SQuAD features (a dict of arrays or a "
                        "tf.data.Dataset of them, as run_squad.py writes); raw (questions, contexts) go to predict")

    def metric_pair(self, features, outputs):
        raise ValueError("XLNetQuestionAnswerer has no compiled metrics (the SQuAD scores need the "
                         "post-processing: predict, then tasks.squad.metrics)")

    def predict_outputs(self, features, outputs):
        return self.head.predictions(outputs)

    def predict(self, x, batch_size=None, **kwargs) -> Dict[str, np.ndarray]:
        """Raw ``(questions, contexts)`` -> the export's answers (module docstring), numpy arrays of n rows; SQuAD
        features (a dict or a dataset) -> the head's beams per window, as ``Model.predict``."""
        if not (isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], dict)):
            return super().predict(x, batch_size=batch_size, **kwargs)
        questions, contexts = (np.asarray(t, dtype=object).astype(str) for t in x)
        if questions.shape != contexts.shape or questions.ndim != 1:
            raise ValueError(f"predict((questions, contexts)): two lists of the same length, got "
                             f"{questions.shape} and {contexts.shape}")
        if getattr(self, "_answer_fn", None) is None:
            module = self.serving_module()
            object.__setattr__(self, "_answer_fn", tf.function(module.answer, autograph=False, reduce_retracing=True))
        size = int(batch_size or 8)
        parts = [self._answer_fn(tf.constant(questions[i:i + size]), tf.constant(contexts[i:i + size]))
                 for i in range(0, len(questions), size)]
        out = {k: np.concatenate([p[k].numpy() for p in parts]) for k in parts[0]} if parts else {}
        if "answer_text" in out:
            out["answer_text"] = np.array([t.decode("utf-8") for t in out["answer_text"]], dtype=object)
        return out
