"""Fine-tune XLNet on a classification / regression task, evaluate, predict and export a SavedModel.

    python run_classifier.py --task=sst-2 --data_dir=glue/SST-2 --spiece_model_file=spiece.model \
      --model_config_path=config.json --output_dir=OUT --max_seq_length=64 --train_batch_size=32 \
      --train_steps=600 --warmup_steps=60 --learning_rate=5e-4 --do_train --do_eval --export_dir=EXPORT

Tasks (case-insensitive): sst-2 cola mrpc rte sts-b mnli mnli-mm qnli qqp wnli imdb yelp-2 yelp-5 dbpedia ag
amazon-2 amazon-5 generic. Outputs in OUTPUT_DIR: eval_results.json, predict/<task>.tsv (GLUE format).
"""

from __future__ import annotations

import logging
import os

from absl import app, flags

import run_common
import runner

FLAGS = flags.FLAGS
flags.DEFINE_string("task", None, "Task name (see the module docstring).")
flags.DEFINE_string("task_name", None, "Alias of --task (the original's flag name).")
flags.DEFINE_string("data_dir", None, "The task's data (GLUE folder, aclImdb folder or tarball, csv folder).")
flags.DEFINE_string("text_a_column", "text", "generic task: column/key of the first text.")
flags.DEFINE_string("text_b_column", None, "generic task: column/key of the second text (pair tasks).")
flags.DEFINE_string("label_column", "label", "generic task: column/key of the label.")
flags.DEFINE_list("labels", None, "generic task: the label set (default: discovered from train).")
flags.DEFINE_bool("regression", False, "generic task: the label is a real number.")
run_common.define_common_flags(default_seq_len=128, default_lr=2e-5)

log = logging.getLogger("run_classifier")


def build_task(F):
    from tasks.registry import get_task

    name = F.task or F.task_name
    if not name:
        raise ValueError("--task is required")
    options = {}
    if name.lower() == "generic":
        options = dict(text_a_column=F.text_a_column, text_b_column=F.text_b_column,
                       label_column=F.label_column, labels=F.labels, regression=F.regression)
    return get_task(name, **options)


class ClassifierRun(runner.TaskSpec):
    """A classification / regression task for the runner (plain arguments)."""

    def __init__(self, task, data_dir, tokenizer, config, max_seq_length, cache_dir, eval_batch_size,
                 predict_batch_size, head_options, seed=42, progress=True, overwrite_data=False):
        self.task, self.data_dir, self.tokenizer, self.config = task, data_dir, tokenizer, config
        self.L, self.cache_dir, self.head_options, self.seed = max_seq_length, cache_dir, head_options, seed
        self.eval_batch_size, self.predict_batch_size = eval_batch_size, predict_batch_size or eval_batch_size
        self.progress, self.overwrite_data = progress, overwrite_data
        self.name, self.main_metric = task.name, task.main_metric
        self._features = {}

    def features(self, split):
        """(TFRecord path, count) of ``split`` ("train", "dev", "test"), built once per run."""
        from data import classification as cls_data

        if split not in self._features:
            self._features[split] = cls_data.task_features(
                self.task, self.data_dir, split, self.tokenizer, self.L, self.cache_dir, progress=self.progress,
                overwrite=self.overwrite_data)
        return self._features[split]

    def head(self):
        from heads.classification import ClassificationHead

        t, c = self.task, self.config
        return ClassificationHead(c.d_model, 1 if t.regression else t.num_labels, regression=t.regression,
                                  task_name=t.name, n_head=c.n_head, d_head=c.d_head, **self.head_options)

    def feature_spec(self):
        from data import classification as cls_data

        return cls_data.feature_spec(self.L, self.task.regression)

    def prepare(self, splits):
        for split in splits:
            path, n = self.features({"eval": "dev", "predict": "test"}.get(split, split))
            log.info("%s: %d examples in %s", split, n, path)

    def train_dataset(self, batch_size, input_context):
        from data import classification as cls_data

        return cls_data.make_dataset(self.features("train")[0], batch_size, is_training=True, seed=self.seed,
                                     input_context=input_context)

    def _predict(self, model, split, batch_size):
        from data import classification as cls_data
        from xlnet_tf import finetune

        ds = cls_data.make_dataset(self.features(split)[0], batch_size, is_training=False)
        out = finetune.predict_with_labels(model, ds, self.finetuner.strategy)
        return out, out["score"] if self.task.regression else out["label_pred"]

    def evaluate(self, model, step):
        from tasks.metrics import compute_metrics

        out, preds = self._predict(model, "dev", self.eval_batch_size)
        metrics = compute_metrics(self.task, out["label"], preds)
        metrics.update(loss=float(out["loss"].mean()), step=int(step), num_examples=int(len(out["loss"])))
        return metrics

    def predict(self, model, output_dir):
        from tasks.glue import write_glue_predictions

        _, preds = self._predict(model, "test", self.predict_batch_size)
        os.makedirs(os.path.join(output_dir, "predict"), exist_ok=True)
        path = os.path.join(output_dir, "predict", f"{self.task.name.upper()}.tsv")
        write_glue_predictions(self.task, preds, path)
        return path

    def export(self, model, export_dir):
        from xlnet_tf.export import ClassifierServing

        labels = None if self.task.regression else list(self.task.labels)
        serving = ClassifierServing(model, self.tokenizer, self.L, label_names=labels)
        serving.export(export_dir, pair=self.task.is_pair)
        log.info("exported SavedModel to %s (signatures: serving_default(text_a%s), serve_ids)", export_dir,
                 ", text_b" if self.task.is_pair else "")


def main(_):
    F = FLAGS
    plan = run_common.plan(F)
    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    task = build_task(F)
    tokenizer = run_common.tokenizer(F)
    config = run_common.model_config(F)
    if not F.data_dir:
        raise ValueError("--data_dir is required")
    if hasattr(task, "discover_labels"):
        task.discover_labels(F.data_dir)
    L = F.max_seq_length
    run_common.start_run(F, paths["output_dir"], "run_classifier", task.name, config, tokenizer, F.do_train,
                         train_sources=task.source_files(F.data_dir, "train") if F.do_train else (),
                         data={"max_seq_length": L}, work_dirs=[paths["model_dir"], paths["cache_dir"]])
    head_options = dict(summary_type=F.summary_type, hidden_sizes=run_common.head_hidden_sizes(F), dropout=F.dropout)
    spec = ClassifierRun(task, F.data_dir, tokenizer, config, L, paths["cache_dir"], F.eval_batch_size,
                         F.predict_batch_size, head_options, seed=F.seed, progress=F.progress,
                         overwrite_data=F.overwrite_data)
    run_common.run_task(F, spec, plan, config, strategy)


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(run_common.main_wrapper(main))
