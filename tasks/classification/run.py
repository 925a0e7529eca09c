"""Classification / regression for the runner (``tasks.runner``): features, training data, dev metrics, test
predictions (GLUE format) and the SavedModel. Imports no TensorFlow until a method needs the model (the entry
point reads this module's options before its flags are checked)."""

from __future__ import annotations

import logging
import os

from xlnet_tf.tasks import export_formats, health, runner
from xlnet_tf.tasks.classification import features as cls_data
from xlnet_tf.tasks.classification.glue import write_glue_predictions
from xlnet_tf.tasks.classification.metrics import compute_metrics
from xlnet_tf.tasks.report import class_scores

log = logging.getLogger("run_classifier")


class ClassifierRun(runner.TaskSpec):
    """A classification / regression task for the runner (plain arguments)."""

    def __init__(self, task, data_dir: str, options: runner.TaskOptions):
        self.task, self.data_dir = task, data_dir
        self.name, self.main_metric, self.pair = task.name, task.main_metric, task.is_pair
        super().__init__(options)  # (checks memory mode: runner.check_long_doc)

    def build_features(self, split):
        """(TFRecord path, count) of ``split`` ("train", "dev", "test")."""
        o = self.options
        return cls_data.task_features(self.task, self.data_dir, split, o.tokenizer, o.max_seq_length, o.cache_dir,
                                      progress=o.progress, overwrite=o.overwrite_data, max_segments=o.max_segments)

    def head_parts(self):
        from xlnet_tf.heads.classification import ClassificationHead  # TensorFlow: imported when the run needs it

        t, c = self.task, self.options.config
        return ClassificationHead, dict(d_model=c.d_model, num_labels=1 if t.regression else t.num_labels,
                                        regression=t.regression, task_name=t.name, n_head=c.n_head, d_head=c.d_head,
                                        **self.options.head_options)

    def feature_spec(self):
        return cls_data.feature_spec(self.options.max_seq_length, self.task.regression, self.options.max_segments)

    def prepare(self, splits):
        for split in splits:
            path, n = self.features({"eval": "dev", "predict": "test"}.get(split, split))
            log.info("%s: %d examples in %s", split, n, path)

    def train_dataset(self, batch_size, input_context):
        o = self.options
        if o.max_segments:
            return cls_data.make_window_dataset(self.features("train")[0], batch_size, is_training=True,
                                                bucket=o.bucket, seed=o.seed, input_context=input_context)
        return cls_data.make_dataset(self.features("train")[0], batch_size, is_training=True, seed=o.seed,
                                     input_context=input_context, dynamic="left" if o.bucket else None,
                                     length_multiple=o.length_multiple)

    def _predict(self, model, split, batch_size):
        from xlnet_tf import finetune

        if self.options.max_segments:
            ds = cls_data.make_window_dataset(self.features(split)[0], batch_size, is_training=False)
        else:
            ds = cls_data.make_dataset(self.features(split)[0], batch_size, is_training=False, dynamic="left",
                                       length_multiple=self.options.length_multiple)
        out = finetune.predict_with_labels(model, ds, self.finetuner.strategy)
        return out, out["score"] if self.task.regression else out["label_pred"]

    def evaluate(self, model, step):
        out, preds = self._predict(model, "dev", self.options.eval_batch_size)
        metrics = compute_metrics(self.task, out["label"], preds)
        if not self.task.regression:  # per-class precision / recall / F1, macro-F1, confusion matrix
            metrics.update(class_scores(out["label"], preds, list(self.task.labels)))
        metrics.update(loss=float(out["loss"].mean()), step=int(step), num_examples=int(len(out["loss"])))
        metrics["health"] = self.health_check(out, preds)
        return metrics

    def health_check(self, out, preds):
        if self.task.regression:
            check = health.regression_check(preds, out["label"])
        else:
            check = health.label_check(preds, out["label"], list(self.task.labels))
        return health.add_input_check(check, out.get("num_tokens", []))

    def predict(self, model, output_dir):
        _, preds = self._predict(model, "test", self.options.predict_batch_size)
        os.makedirs(os.path.join(output_dir, "predict"), exist_ok=True)
        path = os.path.join(output_dir, "predict", f"{self.task.name.upper()}.tsv")
        write_glue_predictions(self.task, preds, path)
        return path

    export_kind = "classifier"

    def export(self, model, export_dir, fmt="tf_saved_model"):
        from xlnet_tf.tasks.classification.serving import ClassifierServing

        labels = None if self.task.regression else list(self.task.labels)
        serving = ClassifierServing(model, self.options.tokenizer, self.options.max_seq_length, label_names=labels,
                                    memory=bool(self.options.max_segments))  # the export reads the whole text
        export_formats.export(serving, export_dir, fmt, pair=self.task.is_pair)
        log.info("exported %s to %s (serving_default(text_a%s)%s)", fmt, export_dir,
                 ", text_b" if self.task.is_pair else "", ", serve_ids, embed" if fmt == "tf_saved_model" else "")
