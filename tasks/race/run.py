"""RACE for the runner (``tasks.runner``): CPU-sized subsets, features, training data, dev/test accuracy by
level, test predictions and the SavedModel. Imports no TensorFlow until a method needs the model (``RaceData``'s
defaults are read when run_race.py's flags are defined)."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from typing import Dict, Optional

import numpy as np

from xlnet_tf.data import tfrecord_io
from xlnet_tf.tasks import export_formats, health, runner
from xlnet_tf.tasks.race import features as race_data
from xlnet_tf.tasks.race import reader as race_task
from xlnet_tf.tasks.report import class_scores
from xlnet_tf.fileutil import atomic_write

log = logging.getLogger("run_race")


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


def race_train_sources(data_dir: str, levels):
    """What the training split is read from: the archive, or the train/<level> folders."""
    if os.path.isfile(data_dir):
        return [data_dir]
    return [p for p in (os.path.join(data_dir, "train", lv) for lv in levels) if os.path.exists(p)] or [data_dir]


@dataclasses.dataclass(frozen=True)
class RaceData:
    """Which RACE questions a run reads. ``subsets``: {split: N questions or None}."""
    data_dir: str
    max_qa_length: int = 128
    high_only: bool = False
    middle_only: bool = False
    eval_split: str = "dev"
    subsets: Dict[str, Optional[int]] = dataclasses.field(default_factory=dict)


class RaceRun(runner.TaskSpec):
    """RACE for the runner: ``data`` which questions, ``options`` the run's. In memory mode (``options.max_segments``)
    long articles run in up to that many windows per option; ``options.bucket``: training batches of questions with
    the same window count."""
    name, main_metric = "race", "accuracy"

    def __init__(self, data: RaceData, options: runner.TaskOptions):
        super().__init__(options)
        self.data = data

    def build_features(self, split):
        """(TFRecord path, question count) of ``split`` ("train", "dev", "test")."""
        o, d = self.options, self.data
        L, QA, subset = o.max_seq_length, d.max_qa_length, d.subsets.get(split)
        levels = "-".join(race_task.select_levels(d.high_only, d.middle_only))
        sub = f"-sub{subset}" if subset else ""
        size = f"{L}x{o.max_segments}" if o.max_segments else f"{L}"
        path = os.path.join(o.cache_dir, f"race-{split}-{levels}-{size}-{QA}{sub}.tfrecord")
        if o.overwrite_data:
            for p in (path, tfrecord_io.manifest_path(path)):
                if os.path.exists(p):
                    os.remove(p)
        t0 = time.time()
        lengths = dict(max_seq_length=L, max_qa_length=QA, max_segments=o.max_segments)
        if not subset:
            n = race_data.write_race_features(d.data_dir, split, path, o.tokenizer, high_only=d.high_only,
                                              middle_only=d.middle_only, num_workers=o.num_workers,
                                              progress=o.progress, **lengths)
        else:
            meta = race_data.features_meta(d.data_dir, split, o.tokenizer, high_only=d.high_only,
                                           middle_only=d.middle_only, **lengths)
            meta["subset"] = {"n": int(subset), "seed": 0}

            def build():
                return race_data.iter_features(self.documents(split), o.tokenizer, num_workers=o.num_workers,
                                               **lengths)

            n = tfrecord_io.cached_tfrecords(path, build, self.feature_spec(), meta=meta, total=subset,
                                             desc=f"RACE {split}", progress=o.progress)
        log.info("%s: %d questions in %s (%.1fs)", split, n, path, time.time() - t0)
        return path, n

    def documents(self, split):
        d = self.data
        docs = race_task.read_race_documents(d.data_dir, split, d.high_only, d.middle_only)
        return subset_documents(docs, d.subsets.get(split))

    def head_parts(self):
        from xlnet_tf.heads.multiple_choice import MultipleChoiceHead  # TensorFlow: imported when the run needs it

        c = self.options.config
        return MultipleChoiceHead, dict(d_model=c.d_model, n_head=c.n_head, d_head=c.d_head,
                                        **self.options.head_options)

    def feature_spec(self):
        return race_data.race_feature_spec(self.options.max_seq_length, max_segments=self.options.max_segments)

    def prepare(self, splits):
        for split in splits:
            self.features({"eval": self.data.eval_split, "predict": "test"}.get(split, split))

    def train_dataset(self, batch_size, input_context):
        o = self.options
        return race_data.race_dataset(self.features("train")[0], o.max_seq_length, batch_size, is_training=True,
                                      max_segments=o.max_segments, bucket=o.bucket, seed=o.seed,
                                      input_context=input_context, length_multiple=o.length_multiple)

    def _predict(self, model, split, batch_size, features_kept=()):
        from xlnet_tf import finetune

        o = self.options
        ds = race_data.race_dataset(self.features(split)[0], o.max_seq_length, batch_size, is_training=False,
                                    max_segments=o.max_segments, length_multiple=o.length_multiple)
        return finetune.predict_with_labels(model, ds, self.finetuner.strategy, features_kept=features_kept)

    def evaluate(self, model, step):
        split = self.data.eval_split
        out = self._predict(model, split, self.options.eval_batch_size, features_kept=("level",))
        keep = out["label"] >= 0
        if not keep.any():
            raise ValueError(f"RACE {split}: no labelled questions to score (use --do_predict)")
        labels, choices, levels = out["label"][keep], out["choice"][keep], out["level"][keep]
        metrics = race_task.race_accuracy(labels, choices, levels)
        metrics.update(class_scores(labels, choices, race_task.ANSWER_LETTERS))  # by gold option A-D
        metrics.update(loss=float(out["loss"][keep].mean()), step=int(step), split=split,
                       num_examples=int(keep.sum()), num_middle=int((levels == 0).sum()),
                       num_high=int((levels == 1).sum()))
        metrics["health"] = health.add_input_check(health.label_check(choices, labels, "ABCD", what="option"),
                                                   out["num_tokens"][keep])
        return metrics

    def predict(self, model, output_dir):
        _, n = self.features("test")
        examples = [ex for d in self.documents("test") for ex in d.examples]
        if len(examples) != n:
            raise ValueError(f"cached test features hold {n} questions, the source {len(examples)}: "
                             f"rerun with --overwrite_data")
        out = self._predict(model, "test", self.options.predict_batch_size)
        os.makedirs(os.path.join(output_dir, "predict"), exist_ok=True)
        path = os.path.join(output_dir, "predict", "race-test.tsv")
        with atomic_write(path) as f:
            f.write("id\tanswer\tp_A\tp_B\tp_C\tp_D\n")
            for ex, c, p in zip(examples, out["choice"], out["probabilities"]):
                f.write(f"{ex.example_id}\t{race_task.ANSWER_LETTERS[int(c)]}\t"
                        + "\t".join(f"{x:.6f}" for x in np.asarray(p, np.float64)) + "\n")
        return path

    export_kind = "race"  # every export format (memory mode: tf_saved_model only)

    def export(self, model, export_dir, fmt="tf_saved_model"):
        from xlnet_tf.tasks.race.serving import RaceServing

        o = self.options
        # memory mode: the export reads the whole article in windows (no max_segments cap)
        export_formats.export(RaceServing(model, o.tokenizer, o.max_seq_length, self.data.max_qa_length,
                                          memory=bool(o.max_segments)), export_dir, fmt)
        log.info("exported %s to %s (serving_default(article, question, options[4])%s)", fmt, export_dir,
                 ", serve_ids" if fmt == "tf_saved_model" else "")
