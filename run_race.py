r"""Fine-tune XLNet on RACE (multiple-choice reading comprehension), evaluate, predict and export a SavedModel.

    python run_race.py --data_dir=RACE.tar.gz --spiece_model_file=spiece.model --model_config_path=config.json \
      --output_dir=OUT --max_seq_length=512 --max_qa_length=128 --train_batch_size=32 --train_steps=12000 \
      --warmup_steps=1000 --learning_rate=2e-5 --do_train --do_eval --export_dir=EXPORT

``--data_dir``: the ``RACE`` folder (``{train,dev,test}/{middle,high}/N.txt``), its parent, or ``RACE.tar.gz``
itself (streamed, never extracted). ``--high_only`` / ``--middle_only`` keep one level (train and eval).

Each option of a question is one sequence ``article <sep> qa <sep> <cls>`` (see tasks/race/features.py); a batch of
``train_batch_size`` questions runs ``4 * train_batch_size`` sequences through the backbone.

Outputs in OUTPUT_DIR:
* ``eval_results.json`` (--do_eval, on dev or ``--eval_split=test``): ``accuracy``, ``accuracy_middle``,
  ``accuracy_high`` (a level absent from the split has no key), ``num_examples``, ``num_middle``, ``num_high``,
  mean ``loss``, ``step``, ``split``. Unlabelled questions are left out of every number.
* ``model/train_history.json`` (--do_train, written by FineTuner): [[step, loss], ...] for every update.
* ``predict/race-test.tsv`` (--do_predict): ``id``, ``answer`` (A-D) and the four probabilities per question.
* ``data/``: cached TFRecords (reused while their manifest matches: source, tokenizer, lengths, levels, subset).

CPU-sized runs: ``--train_subset=N`` / ``--eval_subset=N`` keep N questions of the split: a fixed (seed 0) random
choice of whole files, the last one cut so exactly N remain, kept in the split's order (so both levels stay
represented in proportion). ``--eval_subset`` also applies to --do_predict. Default: the whole split (train
87,866 / dev 4,887 / test 4,934 questions). Features are written once (train at --max_seq_length=128: ~2 min on
2 cores, 170 MB of TFRecords), then reused.
"""

from __future__ import annotations

import logging

import run_common
import run_flags
import run_main
from xlnet_tf.tasks.race import features as race_data
from xlnet_tf.tasks.race import reader as race_task
from xlnet_tf.tasks.race.run import RaceData, RaceRun, race_train_sources  # (no TensorFlow: RaceData's defaults are the flags')


def define_flags(fv) -> None:
    d = run_flags.Definer(fv, "RACE")
    d.string("data_dir", None, "RACE folder (or its parent) or RACE.tar.gz.", input_path=True)
    d.integer("max_qa_length", RaceData.max_qa_length, "Question+option pieces kept (the last ones).")
    d.bool("high_only", RaceData.high_only, "Use only the high-school questions.")
    d.bool("middle_only", RaceData.middle_only, "Use only the middle-school questions.")
    d.integer("train_subset", None, "Train on N questions of train only (CPU-sized runs; default: all).")
    d.integer("eval_subset", None, "Evaluate/predict on N questions only (default: all).")
    d.enum("eval_split", RaceData.eval_split, ["dev", "test"], "Split scored by --do_eval.")
    d.integer("num_workers", None, "Processes tokenising RACE (default: CPU count, at most 8).")
    run_flags.define_long_doc_flags(fv, "article", "per option, the article's earlier windows run left to right "
                                    "as memory; the last window holds the article's tail, the question and option, "
                                    "and the CLS the head reads; only the last window gets gradients")
    run_flags.define_common_flags(fv, default_seq_len=512, default_lr=2e-5)
    run_flags.define_health_flag(fv)


log = logging.getLogger("run_race")


# ---------------------------------------------------------------------------------------------- main
def job(F):
    plan = run_common.plan(F)
    if not F.data_dir and (F.do_train or F.do_eval or F.do_predict):
        raise ValueError("--data_dir is required")
    levels = race_task.select_levels(F.high_only, F.middle_only)  # exclusive flags, checked before any work
    for name in ("train_subset", "eval_subset"):
        if getattr(F, name) is not None and getattr(F, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    if run_common.head_hidden_sizes(F):
        raise ValueError("--head_hidden_sizes is not supported by the RACE head")
    L, QA = F.max_seq_length, F.max_qa_length
    race_data.check_lengths(L, QA, flags=True)
    memory, mem_len, long_doc_data = run_common.long_doc_options(F)
    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    tokenizer = run_common.tokenizer(F)
    config = run_common.model_config(F, mem_len=mem_len) if memory else run_common.model_config(F)
    subsets = {"train": F.train_subset, F.eval_split: F.eval_subset, "test": F.eval_subset}
    head_options = dict(summary_type=F.summary_type, dropout=F.dropout, dropatt=F.dropatt)
    data = RaceData(data_dir=F.data_dir, max_qa_length=QA, high_only=F.high_only, middle_only=F.middle_only,
                    eval_split=F.eval_split, subsets=subsets)
    spec = RaceRun(data, run_common.task_options(F, tokenizer, config, paths["cache_dir"], head_options, memory))
    run_common.check_export(F, spec)
    run_common.start_run(F, paths["output_dir"], "run_race", "race", config, tokenizer, F.do_train,
                         train_sources=race_train_sources(F.data_dir, levels) if F.do_train else (),
                         data=dict({"max_seq_length": L, "max_qa_length": QA, "train_subset": F.train_subset},
                                   **long_doc_data),
                         work_dirs=[paths["model_dir"], paths["cache_dir"]],
                         memory={"head": spec.head_size(), "rows": race_task.NUM_CHOICES})
    run_common.run_task(F, spec, plan, config, strategy)


def main(argv=None) -> run_main.Exit:
    return run_main.main(argv, define_flags, job, __doc__)


if __name__ == "__main__":
    run_main.exit(main())
