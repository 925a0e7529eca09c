"""SQuAD v1.1 / v2.0 for the runner (``tasks.runner``): features, training data, predictions of the predict
file (scored when it has answers) and the SavedModel. Imports no TensorFlow until a method needs the model
(``SquadOptions``' defaults are read when run_squad.py's flags are defined)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from xlnet_tf.tasks import export_formats, health, runner
from xlnet_tf.tasks.squad import features as squad_data
from xlnet_tf.tasks.squad import metrics as squad_eval
from xlnet_tf.tasks.squad.postprocess import SquadPredictions, concat_results, postprocess, write_predictions
from xlnet_tf.fileutil import write_json

log = logging.getLogger("run_squad")


@dataclasses.dataclass(frozen=True)
class SquadOptions:
    """SQuAD's window and answer settings (the original's defaults)."""
    max_query_length: int = 64  # question pieces kept (the first ones)
    doc_stride: int = 128  # stride between the context windows, in pieces
    n_best_size: int = 5  # answers kept per question in nbest.json
    max_answer_length: int = 64  # longest answer, in pieces
    allow_last_paragraph_token: bool = False  # the original rejects a span on a window's last paragraph token
    null_score_diff_threshold: float = 0.0  # v2.0: no answer when the null odds exceed this


class SquadRun(runner.TaskSpec):
    """SQuAD v1.1 / v2.0 for the runner. Evaluation predicts the predict file (scoring it when it has answers)
    and writes the best checkpoint's predictions; ``squad``: the window and answer settings."""
    name = "squad"
    export_kind = "squad"  # every export format (tasks/export_formats.py)

    def __init__(self, train, predict, v2: bool, squad: SquadOptions, options: runner.TaskOptions):
        super().__init__(options)
        self.sources = {"train": train, "predict": predict}  # split -> (examples, file) or None
        self.v2, self.squad = v2, squad
        self.main_metric = "best_f1" if v2 else "f1"
        self.null_threshold = squad.null_score_diff_threshold if v2 else None
        self._kept = {}

    def build_features(self, split):
        """(TFRecord path, feature index) of "train" or "predict"."""
        examples, source = self.sources[split]
        o, q = self.options, self.squad
        base = os.path.splitext(os.path.basename(source))[0]
        path = os.path.join(o.cache_dir, f"{base}-{split}-L{o.max_seq_length}-q{q.max_query_length}-"
                                         f"s{q.doc_stride}.tfrecord")
        if o.overwrite_data:
            for p in (path, path + ".json", squad_data.index_path(path)):
                if os.path.exists(p):
                    os.remove(p)
        t0 = time.time()
        index = squad_data.write_squad_features(examples, path, o.tokenizer, o.max_seq_length, q.doc_stride,
                                                q.max_query_length, is_training=split == "train",
                                                num_workers=o.num_workers, progress=o.progress)
        stats = index.stats
        log.info("%s: %d questions -> %d windows in %s (%.1fs; %d with >1 window, %d truncated questions, "
                 "%d answers not mappable to pieces)", split, len(examples), len(index.features), path,
                 time.time() - t0, stats.get("multi_window", 0), stats.get("truncated_questions", 0),
                 len(stats.get("unmappable", [])))
        if not index.features:
            raise ValueError(f"{source}: no {split} features")
        return path, index

    def head_parts(self):
        from xlnet_tf.heads.squad import SquadHead  # TensorFlow: imported when the run needs it

        return SquadHead, dict(d_model=self.options.config.d_model, **self.options.head_options)

    def feature_spec(self):
        return squad_data.squad_feature_spec(self.options.max_seq_length)

    def prepare(self, splits):
        for split in splits:
            self.features("train" if split == "train" else "predict")

    def train_dataset(self, batch_size, input_context):
        o = self.options
        return squad_data.squad_dataset(self.features("train")[0], o.max_seq_length, batch_size, is_training=True,
                                        seed=o.seed, input_context=input_context,
                                        dynamic="right" if o.bucket else None, length_multiple=o.length_multiple)

    @property
    def labelled(self):
        """An unlabelled predict file (a test set) gets predictions but no scores."""
        return any(ex.answers or ex.is_impossible for ex in self.sources["predict"][0])

    def evaluate(self, model, step):
        import tensorflow as tf

        from xlnet_tf.training import predict as run_predict

        o, q = self.options, self.squad
        path, index = self.features("predict")
        examples = self.sources["predict"][0]
        version = "2.0" if self.v2 else "1.1"

        def output_fn(feats, outputs):
            out = dict(model.head.predictions(outputs))
            out["unique_id"] = feats["unique_id"]
            out["loss"] = tf.cast(model.per_example_loss(feats, outputs), tf.float32)
            return out

        ds = squad_data.squad_dataset(path, o.max_seq_length, o.predict_batch_size, is_training=False,
                                      dynamic="right", length_multiple=o.length_multiple)
        t0 = time.time()
        out = run_predict(model, ds, self.finetuner.strategy, output_fn=output_fn)
        preds = postprocess(index, concat_results([out]), n_best_size=q.n_best_size,
                            max_answer_length=q.max_answer_length,
                            allow_last_paragraph_token=q.allow_last_paragraph_token)
        dataset = squad_eval.examples_to_dataset(examples, version)
        if not self.labelled:
            metrics = {}
        elif self.v2:
            metrics = squad_eval.evaluate(dataset, preds.predictions, preds.null_odds, version,
                                          na_prob_thresh=self.null_threshold)
            metrics.update(squad_eval.span_scores(dataset, preds.predictions))
        else:
            metrics = squad_eval.evaluate(dataset, preds.predictions, None, version)
        metrics.update(step=int(step), loss=float(out["loss"].mean()), version=version,
                       num_questions=len(examples), num_features=len(index.features),
                       predict_seconds=round(time.time() - t0, 2))
        if self.v2:
            metrics["null_score_diff_threshold"] = self.null_threshold
            if self.labelled:
                predicted_null = [preds.null_odds[ex.qas_id] > self.null_threshold for ex in examples]
                metrics["health"] = health.null_check(predicted_null, [ex.is_impossible for ex in examples])
        self._kept[int(step)] = preds
        return metrics

    def finish_evaluation(self, results, results_dir):
        """Writes the scored checkpoint's predictions (v2: "" where the null odds exceed the threshold, and the
        non-null answers beside), and ``eval_results.json`` when the predict file has answers."""
        preds = self._kept[int(results["step"])]
        if self.v2:
            non_null = dict(preds.predictions)
            final = SquadPredictions(
                predictions={q: ("" if preds.null_odds[q] > self.null_threshold else t) for q, t in non_null.items()},
                null_odds=preds.null_odds, nbest=preds.nbest)
            write_predictions(final, results_dir)
            write_json(os.path.join(results_dir, "non_null_predictions.json"), non_null)
        else:
            write_predictions(preds, results_dir)
        if self.labelled:
            super().finish_evaluation(results, results_dir)
        else:
            log.info("%s has no gold answers: predictions written to %s, nothing scored", self.sources["predict"][1],
                     results_dir)

    def export(self, model, export_dir, fmt="tf_saved_model"):
        from xlnet_tf.tasks.squad.serving import SquadServing  # TensorFlow

        o, q = self.options, self.squad
        export_formats.export(SquadServing(model, o.tokenizer, o.max_seq_length, q.max_query_length, q.doc_stride,
                                           q.max_answer_length, null_threshold=self.null_threshold,
                                           allow_last_paragraph_token=q.allow_last_paragraph_token), export_dir, fmt)
        log.info("exported %s to %s (serving_default(question, context)%s)", fmt, export_dir,
                 ", serve_ids" if fmt == "tf_saved_model" else "")
