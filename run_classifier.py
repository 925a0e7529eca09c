r"""Fine-tune XLNet on a classification / regression task, evaluate, predict and export a SavedModel.

    python run_classifier.py --task=sst-2 --data_dir=glue/SST-2 --spiece_model_file=spiece.model \
      --model_config_path=config.json --output_dir=OUT --max_seq_length=64 --train_batch_size=32 \
      --train_steps=600 --warmup_steps=60 --learning_rate=5e-4 --do_train --do_eval --export_dir=EXPORT

Tasks (case-insensitive): sst-2 cola mrpc rte sts-b mnli mnli-mm qnli qqp wnli imdb yelp-2 yelp-5 dbpedia ag
amazon-2 amazon-5 generic. Outputs in OUTPUT_DIR: eval_results.json, predict/<task>.tsv (GLUE format).
"""

from __future__ import annotations

import logging

import run_common
import run_flags
import run_main
from xlnet_tf.tasks.classification.registry import get_task
from xlnet_tf.tasks.classification.run import ClassifierRun
from xlnet_tf.tasks.runner import check_long_doc

log = logging.getLogger("run_classifier")


def define_flags(fv) -> None:
    d = run_flags.Definer(fv, "Task")
    d.string("task", None, "Task name (see the module docstring).")
    d.string("task_name", None, "Alias of --task (the original's flag name).")
    d.string("data_dir", None, "The task's data (GLUE folder, aclImdb folder or tarball, csv folder).",
             input_path=True)
    d.string("text_a_column", "text", "generic task: column/key of the first text.")
    d.string("text_b_column", None, "generic task: column/key of the second text (pair tasks).")
    d.string("label_column", "label", "generic task: column/key of the label.")
    d.list("labels", None, "generic task: the label set (default: discovered from train).")
    d.bool("regression", False, "generic task: the label is a real number.")
    d.bool("allow_single_class", False, "generic task: train even when the train file holds one class only "
           "(refused by default: nothing to learn).")
    run_flags.define_long_doc_flags(fv, "document", "single-text tasks: consecutive windows of max_seq_length run "
                                    "left to right with the previous windows' hidden states as memory; the head "
                                    "reads the CLS at the end of the document; only the last window gets gradients")
    run_flags.define_common_flags(fv, default_seq_len=128, default_lr=2e-5)
    run_flags.define_health_flag(fv)


def build_task(F):
    name = F.task or F.task_name
    if not name:
        raise ValueError("--task is required")
    options = {}
    if name.lower() == "generic":
        options = dict(text_a_column=F.text_a_column, text_b_column=F.text_b_column,
                       label_column=F.label_column, labels=F.labels, regression=F.regression,
                       allow_single_class=F.allow_single_class)
    return get_task(name, **options)


def job(F):
    plan = run_common.plan(F)
    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    task = build_task(F)
    tokenizer = run_common.tokenizer(F)
    memory, mem_len, long_doc_data = run_common.long_doc_options(F)
    config = run_common.model_config(F, mem_len=mem_len) if memory else run_common.model_config(F)
    if not F.data_dir:
        raise ValueError("--data_dir is required")
    if hasattr(task, "check_labels"):  # every split this run reads, before any feature is written
        task.check_labels(F.data_dir, [s for s, wanted in (("train", F.do_train), ("dev", F.do_eval),
                                                           ("test", F.do_predict)) if wanted])
    elif hasattr(task, "discover_labels"):
        task.discover_labels(F.data_dir)

    check_long_doc(task.name, config, F.max_segments if memory else None, pair=task.is_pair)  # before start_run
    run_common.check_text_room(F, task.is_pair, memory)
    L = F.max_seq_length
    head_options = dict(summary_type=F.summary_type, hidden_sizes=run_common.head_hidden_sizes(F), dropout=F.dropout)
    spec = ClassifierRun(task, F.data_dir,
                         run_common.task_options(F, tokenizer, config, paths["cache_dir"], head_options, memory))
    run_common.check_export(F, spec)
    run_common.start_run(F, paths["output_dir"], "run_classifier", task.name, config, tokenizer, F.do_train,
                         train_sources=task.source_files(F.data_dir, "train") if F.do_train else (),
                         data=dict({"max_seq_length": L}, **long_doc_data),
                         work_dirs=[paths["model_dir"], paths["cache_dir"]], memory={"head": spec.head_size()})
    run_common.run_task(F, spec, plan, config, strategy)


def main(argv=None) -> run_main.Exit:
    return run_main.main(argv, define_flags, job, __doc__)


if __name__ == "__main__":
    run_main.exit(main())
