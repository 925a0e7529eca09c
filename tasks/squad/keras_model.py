"""``XLNetQuestionAnswerer``: SQuAD v1.1 / v2.0 (span plus answerability) as a Keras model. ``predict`` takes raw
``(questions, contexts)`` and answers as the ``run_squad.py`` export does (the same in-graph windows, beams and
post-processing, ``tasks/squad/serving.py``): ``answer_text``, ``answer_start`` / ``answer_end`` (characters of
the context), ``score``, ``null_odds``, ``no_answer_probability`` and ``has_answer`` (v2.0's null decision:
``null_odds <= null_threshold``, by default 0.0 as ``run_squad.py``'s ``--null_score_diff_threshold``;
``null_threshold=None`` for a v1.1 model: every span found is an answer). ``fit`` / ``evaluate`` take raw
``(questions, contexts)`` with answers as SQuAD writes them (``{"text": ..., "answer_start": character}``, lists
of each as HuggingFace datasets write them, or None for a v2.0 question without one; ``evaluate`` then adds the
official ``exact`` / ``f1``), windowed by ``run_squad.py``'s Python features
(``tasks.squad.features.build_squad_features``, in memory), or the command line's features (numpy dicts or a
tf.data Dataset of them, e.g. ``tasks.squad.features.squad_dataset`` on ``run_squad.py``'s cached records). The
base class (``tasks/keras_task.py``) says what every task model shares."""

from __future__ import annotations

from typing import Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.tasks import keras_inputs as door
from xlnet_tf.tasks.keras_task import XLNetTask, checked_batch_size
from xlnet_tf.tasks.squad import metrics as squad_metrics
from xlnet_tf.tasks.squad.features import build_squad_features, squad_feature_spec
from xlnet_tf.tasks.squad.features import check_lengths as check_squad_lengths
from xlnet_tf.tasks.squad.reader import SquadExample
from xlnet_tf.tasks.squad.run import SquadOptions
from xlnet_tf.tasks.squad.serving import SquadServing


@keras.saving.register_keras_serializable("xlnet_tf")
class XLNetQuestionAnswerer(XLNetTask):
    """``XLNetQuestionAnswerer.from_pretrained(path, max_seq_length=512)``; the windowing and answer options are
    ``run_squad.py``'s flags of the same names."""

    export_kind = "squad"  # every export format (tasks/export_formats.py)
    TEXT_INPUTS, REQUIRED_TEXTS, LABEL_KEY = ("question", "context"), 2, "start_position"

    def __init__(self, config, max_query_length: int = 64, doc_stride: int = 128, max_answer_length: int = 64,
                 null_threshold: Optional[float] = SquadOptions.null_score_diff_threshold,
                 allow_last_paragraph_token: bool = False, **kwargs):
        self.squad_options = dict(max_query_length=door.whole_number("max_query_length", max_query_length, 1),
                                  doc_stride=door.whole_number("doc_stride", doc_stride, 1),
                                  max_answer_length=door.whole_number("max_answer_length", max_answer_length, 1),
                                  null_threshold=None if null_threshold is None else float(null_threshold),
                                  allow_last_paragraph_token=bool(allow_last_paragraph_token))
        super().__init__(config, **kwargs)

    def check_lengths(self, max_seq_length: int) -> None:
        o = self.squad_options
        check_squad_lengths(max_seq_length, o["max_query_length"], o["doc_stride"])

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

    def as_dataset(self, x, y, batch_size, shuffle, training, micro_batches=1, sample_weight=None,
                   class_weight=None):
        x = self.named_texts(x)
        if _raw(x):
            if y is None:
                raise TypeError("XLNetQuestionAnswerer: fit/evaluate on (questions, contexts) need the answers "
                                "({'text', 'answer_start'} or None each); predict reads raw text alone")
            if sample_weight is not None:
                raise ValueError("XLNetQuestionAnswerer: sample_weight weighs examples, but raw SQuAD questions "
                                 "become several windows each: pass features with a sample_weight per window")
            x, y = self.squad_features(x, y), None
        return super().as_dataset(x, y, batch_size, shuffle, training, micro_batches, sample_weight, class_weight)

    def squad_features(self, x, answers) -> Dict[str, np.ndarray]:
        """Raw questions, contexts and answers -> the command line's training windows (numpy, [windows, L])."""
        questions, contexts = self.questions_and_contexts(x)
        golds = _answers(answers, contexts)
        context_ids: Dict[str, int] = {}
        examples = []
        for i, (q, c, (texts, starts)) in enumerate(zip(questions, contexts, golds)):
            text, start = (texts[0], starts[0]) if texts else ("", -1)
            examples.append(SquadExample(qas_id=str(i), question=q, context=c,
                                         context_id=context_ids.setdefault(c, len(context_ids)), answer_text=text,
                                         answer_start=start, is_impossible=not text, answers=list(texts),
                                         answer_starts=list(starts)))
        o = self.squad_options
        records, _ = build_squad_features(examples, self.tokenizer, self.max_seq_length, o["doc_stride"],
                                          o["max_query_length"], is_training=True)
        keys = [k for k in records[0] if k != "unique_id"]
        return {k: np.asarray([r[k] for r in records], np.int32) for k in keys}

    def questions_and_contexts(self, x):
        """``(questions, contexts)``: two lists of texts of one length (``tasks/keras_inputs.py``) -> str lists."""
        questions, contexts = door.texts(x[0], "questions"), door.texts(x[1], "contexts")
        door.same_length("questions", questions, "contexts", contexts)
        return [t.decode("utf-8") for t in questions], [t.decode("utf-8") for t in contexts]

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, return_dict=True, **kwargs):
        """On raw ``(questions, contexts)`` with answers: the loss over their training windows, and the official
        scores of the answers ``predict`` gives (``exact``, ``f1``, as ``run_squad.py`` reports them; v2.0, when
        some question has no answer: with ``null_threshold``'s no-answer decision and the HasAns / NoAns parts)."""
        x = self.named_texts(x)
        results = super().evaluate(x, y, batch_size=batch_size, sample_weight=sample_weight, return_dict=True,
                                   **kwargs)
        if _raw(x):
            results.update(self.squad_scores(x, y, batch_size))
        return results if return_dict else list(results.values())

    def squad_scores(self, x, answers, batch_size=None) -> Dict[str, float]:
        questions, contexts = self.questions_and_contexts(x)
        golds = _answers(answers, contexts)
        out = self.predict((questions, contexts), batch_size=batch_size)
        v2 = any(not texts for texts, _ in golds)
        qas = [dict(id=str(i), answers=[{"text": t} for t in texts], **({"is_impossible": not texts} if v2 else {}))
               for i, (texts, _) in enumerate(golds)]
        dataset = [{"paragraphs": [{"qas": qas}]}]
        predictions = {str(i): str(t) for i, t in enumerate(out["answer_text"])}
        if not v2:
            return squad_metrics.evaluate(dataset, predictions, version="1.1")
        threshold = self.squad_options["null_threshold"]
        null_odds = {str(i): float(v) for i, v in enumerate(out["null_odds"])}
        return squad_metrics.evaluate(dataset, predictions, null_odds, version="2.0",
                                      na_prob_thresh=np.inf if threshold is None else threshold)

    def metric_pair(self, features, outputs):
        raise ValueError("XLNetQuestionAnswerer has no compiled metrics (the SQuAD scores need the "
                         "post-processing: predict, then tasks.squad.metrics)")

    def predict_outputs(self, features, outputs):
        return self.head.predictions(outputs)

    def predict(self, x, batch_size=None, **kwargs) -> Dict[str, np.ndarray]:
        """Raw ``(questions, contexts)`` -> the export's answers (module docstring), numpy arrays of n rows; SQuAD
        features (a dict or a dataset) -> the head's beams per window, as ``Model.predict``."""
        x = self.named_texts(x)
        if not _raw(x):
            return super().predict(x, batch_size=batch_size, **kwargs)
        questions, contexts = (door.texts(t, name) for t, name in zip(x, ("questions", "contexts")))
        door.same_length("questions", questions, "contexts", contexts)
        if not len(questions):
            return self.empty_prediction()
        if getattr(self, "_answer_fn", None) is None:
            module = self.serving_module()
            # Held in a list: a tf.function attribute of the model would be traced once more by every SavedModel
            # export (the saver lists each function attribute's concrete functions), the whole raw-text graph.
            object.__setattr__(self, "_answer_fn", [tf.function(module.answer, autograph=False,
                                                                reduce_retracing=True)])
        size = checked_batch_size(batch_size, 8)
        parts = [self._answer_fn[0](tf.constant(questions[i:i + size]), tf.constant(contexts[i:i + size]))
                 for i in range(0, len(questions), size)]
        out = {k: np.concatenate([p[k].numpy() for p in parts]) for k in parts[0]}
        out["answer_text"] = np.array([t.decode("utf-8") for t in out["answer_text"]], dtype=object)
        return out

    def empty_prediction(self) -> Dict[str, np.ndarray]:
        """predict's answers for no question (the export's empty answer: its keys and dtypes, 0 rows)."""
        return {"answer_text": np.zeros((0,), object), "answer_start": np.zeros((0,), np.int32),
                "answer_end": np.zeros((0,), np.int32), "score": np.zeros((0,), np.float32),
                "null_odds": np.zeros((0,), np.float32), "no_answer_probability": np.zeros((0,), np.float32),
                "has_answer": np.zeros((0,), bool)}

    def check_labels(self, y, n: int):
        raise TypeError("XLNetQuestionAnswerer reads SQuAD features (their start/end positions inside) or raw "
                        "(questions, contexts) with answers")


def _raw(x) -> bool:
    """Raw SQuAD input: ``(questions, contexts)``, two lists of texts (not feature dicts)."""
    return isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], dict)


def _answers(answers, contexts):
    """Answers as SQuAD writes them, one per question: ``{"text": str, "answer_start": int}`` (or lists of each,
    HuggingFace datasets' form: every gold answer), ``None`` / no text for a v2.0 question without one -> per
    question (texts, starts), each answer checked to stand at its character of its context."""
    rows = list(answers)
    door.same_length("contexts", contexts, "answers", rows)
    out = []
    for i, (a, c) in enumerate(zip(rows, contexts)):
        if a is None:
            out.append(((), ()))
            continue
        if not isinstance(a, dict) or "text" not in a or "answer_start" not in a:
            raise TypeError(f"answers[{i}]: expected {{'text': ..., 'answer_start': ...}} or None, got {a!r}"[:300])
        texts, starts = a["text"], a["answer_start"]
        texts, starts = ([texts], [starts]) if isinstance(texts, str) else (list(texts), list(starts))
        door.same_length(f"answers[{i}]['text']", texts, f"answers[{i}]['answer_start']", starts)
        kept = [(str(t), int(s)) for t, s in zip(texts, starts) if str(t)]
        for t, s in kept:
            if c[s:s + len(t)] != t:
                raise ValueError(f"answer {i}: {t!r} is not at character {s} of its context (found "
                                 f"{c[s:s + len(t)]!r})")
        out.append((tuple(t for t, _ in kept), tuple(s for _, s in kept)))
    return out
