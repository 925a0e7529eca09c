"""``XLNetQuestionAnswerer``: SQuAD v1.1 / v2.0 (span plus answerability) as a Keras model. ``predict`` takes raw
``(questions, contexts)`` and answers as the ``run_squad.py`` export does (the same in-graph windows, beams and
post-processing, ``tasks/squad/serving.py``): ``answer_text``, ``answer_start`` / ``answer_end`` (characters of
the context), ``score``, ``null_odds``, ``no_answer_probability`` and ``has_answer`` (v2.0's null decision with
``null_threshold``). ``fit`` / ``evaluate`` take raw ``(questions, contexts)`` with answers as SQuAD writes them
(``{"text": ..., "answer_start": character}``, or None for a v2.0 question without one), windowed by
``run_squad.py``'s Python features (``tasks.squad.features.build_squad_features``, in memory), or the command
line's features (numpy dicts or a tf.data Dataset of them, e.g. ``tasks.squad.features.squad_dataset`` on
``run_squad.py``'s cached records). The base class (``tasks/keras_task.py``) says what every task model shares."""

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

    def make_serving(self):
        return SquadServing(self, self.tokenizer, self.max_seq_length, **self.squad_options)

    def is_raw(self, element_spec) -> bool:
        first = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        if isinstance(first, tf.TensorSpec) and first.dtype == tf.string:
            raise TypeError("XLNetQuestionAnswerer: a dataset of SQuAD features, or raw (questions, contexts) "
                            "with answers as lists")
        return False

    def as_dataset(self, x, y, batch_size, shuffle, training, micro_batches=1):
        if isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], dict):
            if y is None:
                raise TypeError("XLNetQuestionAnswerer: fit/evaluate on (questions, contexts) need the answers "
                                "({'text', 'answer_start'} or None each); predict reads raw text alone")
            x, y = self.squad_features(x, y), None
        return super().as_dataset(x, y, batch_size, shuffle, training, micro_batches)

    def squad_features(self, x, answers) -> Dict[str, np.ndarray]:
        """Raw questions, contexts and answers -> the command line's training windows (numpy, [windows, L])."""
        from xlnet_tf.tasks.squad.features import build_squad_features
        from xlnet_tf.tasks.squad.reader import SquadExample

        questions, contexts = (list(map(str, t)) for t in x)
        answers = list(answers)
        if not len(questions) == len(contexts) == len(answers):
            raise ValueError(f"{len(questions)} questions, {len(contexts)} contexts, {len(answers)} answers")
        context_ids: Dict[str, int] = {}
        examples = []
        for i, (q, c, a) in enumerate(zip(questions, contexts, answers)):
            text = "" if not a else str(a["text"])
            start = int(a["answer_start"]) if text else -1
            if text and c[start:start + len(text)] != text:
                raise ValueError(f"answer {i}: {text!r} is not at character {start} of its context "
                                 f"(found {c[start:start + len(text)]!r})")
            examples.append(SquadExample(qas_id=str(i), question=q, context=c,
                                         context_id=context_ids.setdefault(c, len(context_ids)), answer_text=text,
                                         answer_start=start, is_impossible=not text,
                                         answers=[text] if text else [], answer_starts=[start] if text else []))
        o = self.squad_options
        records, _ = build_squad_features(examples, self.tokenizer, self.max_seq_length, o["doc_stride"],
                                          o["max_query_length"], is_training=True)
        keys = [k for k in records[0] if k != "unique_id"]
        return {k: np.asarray([r[k] for r in records], np.int32) for k in keys}

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
            # Held in a list: a tf.function attribute of the model would be traced once more by every SavedModel
            # export (the saver lists each function attribute's concrete functions), the whole raw-text graph.
            object.__setattr__(self, "_answer_fn", [tf.function(module.answer, autograph=False,
                                                                reduce_retracing=True)])
        size = int(batch_size or 8)
        parts = [self._answer_fn[0](tf.constant(questions[i:i + size]), tf.constant(contexts[i:i + size]))
                 for i in range(0, len(questions), size)]
        out = {k: np.concatenate([p[k].numpy() for p in parts]) for k in parts[0]} if parts else {}
        if "answer_text" in out:
            out["answer_text"] = np.array([t.decode("utf-8") for t in out["answer_text"]], dtype=object)
        return out
