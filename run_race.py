"""Fine-tune XLNet on RACE (multiple-choice reading comprehension), evaluate, predict and export a SavedModel.

    python run_race.py --data_dir=RACE.tar.gz --spiece_model_file=spiece.model --model_config_path=config.json \
      --output_dir=OUT --max_seq_length=512 --max_qa_length=128 --train_batch_size=32 --train_steps=12000 \
      --warmup_steps=1000 --learning_rate=2e-5 --do_train --do_eval --export_dir=EXPORT

``--data_dir``: the ``RACE`` folder (``{train,dev,test}/{middle,high}/N.txt``), its parent, or ``RACE.tar.gz``
itself (streamed, never extracted). ``--high_only`` / ``--middle_only`` keep one level (train and eval).

Each option of a question is one sequence ``article <sep> qa <sep> <cls>`` (see data/race.py); a batch of
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

import dataclasses
import logging
import os
import random
import time

from absl import app, flags

import run_common

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "RACE folder (or its parent) or RACE.tar.gz.")
flags.DEFINE_integer("max_qa_length", 128, "Question+option pieces kept (the last ones).")
flags.DEFINE_bool("high_only", False, "Use only the high-school questions.")
flags.DEFINE_bool("middle_only", False, "Use only the middle-school questions.")
flags.DEFINE_integer("train_subset", None, "Train on N questions of train only (CPU-sized runs; default: all).")
flags.DEFINE_integer("eval_subset", None, "Evaluate/predict on N questions only (default: all).")
flags.DEFINE_enum("eval_split", "dev", ["dev", "test"], "Split scored by --do_eval.")
flags.DEFINE_integer("num_workers", None, "Processes tokenising RACE (default: CPU count, at most 8).")
run_common.define_common_flags(default_seq_len=512, default_lr=2e-5)

log = logging.getLogger("run_race")


# ---------------------------------------------------------------------------------------------- data
def subset_documents(docs, n, seed: int = 0):
    """A fixed random choice of whole documents holding exactly ``n`` questions (the last one cut), in the
    original order. ``n`` None or >= the total: all documents."""
    if n is None or n >= sum(len(d.examples) for d in docs):
        return list(docs)
    if n < 1:
        raise ValueError(f"subset size must be >= 1, got {n}")
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    keep, total = {}, 0
    for i in order:
        if total >= n:
            break
        k = min(len(docs[i].examples), n - total)
        keep[i], total = k, total + k
    return [dataclasses.replace(docs[i], examples=docs[i].examples[:keep[i]]) for i in sorted(keep)]


def race_features(F, split: str, subset, tokenizer, cache_dir: str):
    """(TFRecord path, question count) of ``split`` (cached)."""
    from data import race as race_data
    from data import tfrecord_io
    from tasks import race as race_task

    L, QA = F.max_seq_length, F.max_qa_length
    levels = "-".join(race_task.select_levels(F.high_only, F.middle_only))
    sub = f"-sub{subset}" if subset else ""
    path = os.path.join(cache_dir, f"race-{split}-{levels}-{L}-{QA}{sub}.tfrecord")
    if F.overwrite_data:
        for p in (path, tfrecord_io.manifest_path(path)):
            if os.path.exists(p):
                os.remove(p)
    t0 = time.time()
    if not subset:
        n = race_data.write_race_features(F.data_dir, split, path, tokenizer, L, QA, high_only=F.high_only,
                                          middle_only=F.middle_only, num_workers=F.num_workers,
                                          progress=F.progress)
    else:
        meta = race_data.features_meta(F.data_dir, split, tokenizer, L, QA, F.high_only, F.middle_only)
        meta["subset"] = {"n": int(subset), "seed": 0}

        def build():
            docs = subset_documents(race_task.read_race_documents(F.data_dir, split, F.high_only, F.middle_only),
                                    subset)
            return race_data.iter_features(docs, tokenizer, L, QA, F.num_workers)

        n = tfrecord_io.cached_tfrecords(path, build, race_data.race_feature_spec(L), meta=meta, total=subset,
                                         desc=f"RACE {split}", progress=F.progress)
    log.info("%s: %d questions in %s (%.1fs)", split, n, path, time.time() - t0)
    return path, n


def race_train_sources(data_dir: str, levels):
    """What the training split is read from: the archive, or the train/<level> folders."""
    if os.path.isfile(data_dir):
        return [data_dir]
    return [p for p in (os.path.join(data_dir, "train", lv) for lv in levels) if os.path.exists(p)] or [data_dir]


def levels_of(dataset):
    import numpy as np

    return np.concatenate([b.numpy() for b in dataset.map(lambda f: f["level"])])


# ---------------------------------------------------------------------------------------------- main
def main(_):
    F = FLAGS
    import numpy as np

    from data import race as race_data
    from heads.multiple_choice import MultipleChoiceHead
    from tasks import race as race_task
    from xlnet_tf import finetune

    if not (F.do_train or F.do_eval or F.do_predict or F.export_dir):
        raise ValueError("nothing to do: pass --do_train, --do_eval, --do_predict and/or --export_dir")
    if not F.data_dir and (F.do_train or F.do_eval or F.do_predict):
        raise ValueError("--data_dir is required")
    race_task.select_levels(F.high_only, F.middle_only)  # exclusive flags, checked before any work
    for name in ("train_subset", "eval_subset"):
        if getattr(F, name) is not None and getattr(F, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    if run_common.head_hidden_sizes(F):
        raise ValueError("--head_hidden_sizes is not supported by the RACE head")
    L, QA = F.max_seq_length, F.max_qa_length
    if QA < 1 or L - 3 < QA:
        raise ValueError(f"need 1 <= --max_qa_length <= --max_seq_length - 3 (got {QA}, {L})")
    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    tokenizer = run_common.tokenizer(F)
    config = run_common.model_config(F)
    levels = race_task.select_levels(F.high_only, F.middle_only)
    run_common.start_run(F, paths["output_dir"], "run_race", "race", config, tokenizer, F.do_train,
                         train_sources=race_train_sources(F.data_dir, levels) if F.do_train else (),
                         data={"max_seq_length": L, "max_qa_length": QA, "train_subset": F.train_subset},
                         work_dirs=[paths["model_dir"], paths["cache_dir"]])

    def make_head():
        return MultipleChoiceHead(config.d_model, summary_type=F.summary_type, dropout=F.dropout,
                                  n_head=config.n_head, d_head=config.d_head, dropatt=F.dropatt)

    ft = finetune.FineTuner(config=config, head_fn=make_head, feature_spec=race_data.race_feature_spec(L),
                            strategy=strategy, init_checkpoint=F.init_checkpoint, seed=F.seed)

    if F.do_train:
        train_path, n_train = race_features(F, "train", F.train_subset, tokenizer, paths["cache_dir"])
        # every input is read before the first step: a bad dev or test file fails now, not after training
        for split, wanted in ((F.eval_split, F.do_eval), ("test", F.do_predict)):
            if wanted:
                race_features(F, split, F.eval_subset, tokenizer, paths["cache_dir"])
        t0 = time.time()
        result = ft.train(lambda bs, ctx: race_data.race_dataset(train_path, L, bs, is_training=True, seed=F.seed,
                                                                 input_context=ctx),
                          F.train_batch_size, run_common.train_config(F, paths["model_dir"]))
        seconds = time.time() - t0
        if result.history:
            log.info("trained %d steps in %.1fs (%.2f steps/s incl. compilation); loss %.4f -> %.4f",
                     len(result.history), seconds, len(result.history) / seconds, result.history[0][1],
                     result.history[-1][1])

    def evaluate(model, step):
        path, _ = race_features(F, F.eval_split, F.eval_subset, tokenizer, paths["cache_dir"])
        ds = race_data.race_dataset(path, L, F.eval_batch_size, is_training=False)
        out = finetune.predict_with_labels(model, ds, strategy)
        levels = levels_of(ds)
        keep = out["label"] >= 0
        if not keep.any():
            raise ValueError(f"RACE {F.eval_split}: no labelled questions to score (use --do_predict)")
        labels, choices, levels = out["label"][keep], out["choice"][keep], levels[keep]
        metrics = race_task.race_accuracy(labels, choices, levels)
        metrics.update(loss=float(out["loss"][keep].mean()), step=int(step), split=F.eval_split,
                       num_examples=int(keep.sum()), num_middle=int((levels == 0).sum()),
                       num_high=int((levels == 1).sum()))
        return metrics

    if F.do_eval:
        results = ft.evaluate_checkpoints(paths["model_dir"], evaluate, all_checkpoints=F.eval_all_ckpt,
                                          main_metric="accuracy")
        run_common.write_json(os.path.join(F.output_dir, "eval_results.json"), results)
        log.info("eval: %s", {k: v for k, v in results.items() if k != "all_checkpoints"})

    if F.do_predict:
        path, n = race_features(F, "test", F.eval_subset, tokenizer, paths["cache_dir"])
        docs = subset_documents(race_task.read_race_documents(F.data_dir, "test", F.high_only, F.middle_only),
                                F.eval_subset)
        examples = [ex for d in docs for ex in d.examples]
        if len(examples) != n:
            raise ValueError(f"cached test features hold {n} questions, the source {len(examples)}: "
                             f"rerun with --overwrite_data")
        model = ft.model_for_inference(paths["model_dir"])
        ds = race_data.race_dataset(path, L, F.predict_batch_size or F.eval_batch_size, is_training=False)
        out = finetune.predict_with_labels(model, ds, strategy)
        os.makedirs(os.path.join(F.output_dir, "predict"), exist_ok=True)
        out_file = os.path.join(F.output_dir, "predict", "race-test.tsv")
        from xlnet_tf.fileutil import atomic_write

        with atomic_write(out_file) as f:
            f.write("id\tanswer\tp_A\tp_B\tp_C\tp_D\n")
            for ex, c, p in zip(examples, out["choice"], out["probabilities"]):
                f.write(f"{ex.example_id}\t{race_task.ANSWER_LETTERS[int(c)]}\t"
                        + "\t".join(f"{x:.6f}" for x in np.asarray(p, np.float64)) + "\n")
        log.info("predictions: %s", out_file)

    if F.export_dir:
        from tasks.race_serving import RaceServing

        model = ft.model_for_inference(paths["model_dir"])
        RaceServing(model, tokenizer, L, QA).export(F.export_dir)
        log.info("exported SavedModel to %s (signatures: serving_default(article, question, options[4]), "
                 "serve_ids)", F.export_dir)


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(run_common.main_wrapper(main))
