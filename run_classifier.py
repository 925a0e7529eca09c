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


def main(_):
    F = FLAGS
    import tensorflow as tf

    from data import classification as cls_data
    from heads.classification import ClassificationHead
    from tasks.metrics import compute_metrics
    from xlnet_tf import finetune

    if not (F.do_train or F.do_eval or F.do_predict or F.export_dir):
        raise ValueError("nothing to do: pass --do_train, --do_eval, --do_predict and/or --export_dir")
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

    def features(split):
        return cls_data.task_features(task, F.data_dir, split, tokenizer, L, paths["cache_dir"],
                                      progress=F.progress, overwrite=F.overwrite_data)

    def make_head():
        return ClassificationHead(config.d_model, 1 if task.regression else task.num_labels,
                                  regression=task.regression, task_name=task.name, summary_type=F.summary_type,
                                  hidden_sizes=run_common.head_hidden_sizes(F), dropout=F.dropout,
                                  n_head=config.n_head, d_head=config.d_head)

    spec = cls_data.feature_spec(L, task.regression)
    ft = finetune.FineTuner(config=config, head_fn=make_head, feature_spec=spec, strategy=strategy,
                            init_checkpoint=F.init_checkpoint, seed=F.seed)

    if F.do_train:
        train_path, n_train = features("train")
        # every input is read before the first step: a bad dev or test file fails now, not after training
        for split, wanted in (("dev", F.do_eval), ("test", F.do_predict)):
            if wanted:
                features(split)
        log.info("train: %d examples in %s", n_train, train_path)
        ft.train(lambda bs, ctx: cls_data.make_dataset(train_path, bs, is_training=True, seed=F.seed,
                                                       input_context=ctx),
                 F.train_batch_size, run_common.train_config(F, paths["model_dir"]))

    def evaluate(model, step):
        dev_path, n_dev = features("dev")
        ds = cls_data.make_dataset(dev_path, F.eval_batch_size, is_training=False)
        out = finetune.predict_with_labels(model, ds, strategy)
        preds = out["score"] if task.regression else out["label_pred"]
        metrics = compute_metrics(task, out["label"], preds)
        metrics.update(loss=float(out["loss"].mean()), step=int(step), num_examples=int(len(out["loss"])))
        return metrics

    if F.do_eval:
        results = ft.evaluate_checkpoints(paths["model_dir"], evaluate, all_checkpoints=F.eval_all_ckpt,
                                          main_metric=task.main_metric)
        run_common.write_json(os.path.join(F.output_dir, "eval_results.json"), results)
        log.info("eval: %s", {k: v for k, v in results.items() if k != "all_checkpoints"})

    if F.do_predict:
        from tasks.glue import write_glue_predictions

        test_path, _ = features("test")
        model = ft.model_for_inference(paths["model_dir"])
        ds = cls_data.make_dataset(test_path, F.predict_batch_size or F.eval_batch_size, is_training=False)
        out = finetune.predict_with_labels(model, ds, strategy)
        preds = out["score"] if task.regression else out["label_pred"]
        os.makedirs(os.path.join(F.output_dir, "predict"), exist_ok=True)
        out_file = os.path.join(F.output_dir, "predict", f"{task.name.upper()}.tsv")
        write_glue_predictions(task, preds, out_file)
        log.info("predictions: %s", out_file)

    if F.export_dir:
        from xlnet_tf.export import ClassifierServing

        model = ft.model_for_inference(paths["model_dir"])
        labels = None if task.regression else list(task.labels)
        ClassifierServing(model, tokenizer, L, label_names=labels).export(F.export_dir, pair=task.is_pair)
        log.info("exported SavedModel to %s (signatures: serving_default(text_a%s), serve_ids)", F.export_dir,
                 ", text_b" if task.is_pair else "")


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(run_common.main_wrapper(main))
