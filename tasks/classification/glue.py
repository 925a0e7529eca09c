"""GLUE tasks (tsv layouts of the GLUE distribution) and the GLUE submission writer.

Columns are found by header name, so the tasks read the official files as distributed: CoLA train/dev have
no header (source, label, original label, sentence), its test has one; test files have no label column;
MNLI dev/test come as ``*_matched``/``*_mismatched`` (``mnli`` = matched, ``mnli-mm`` = mismatched).
"""

from __future__ import annotations

import functools
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from xlnet_tf.tasks.classification.reader import ClassificationTask, Columns, Example, read_table
from xlnet_tf.fileutil import atomic_write


class GlueTask(ClassificationTask):
    """A GLUE task: files per split, the column layout of train/dev and of test, labels, metrics."""

    def __init__(self, name: str, labels: Optional[Tuple[str, ...]], columns: Columns, test_columns: Columns,
                 metrics: Tuple[str, ...] = ("accuracy",), main_metric: str = "accuracy",
                 files: Optional[dict] = None, submission: Optional[str] = None):
        self.name = name
        self.labels = labels
        self.regression = labels is None
        self.columns, self.test_columns = columns, test_columns
        self.is_pair = columns.text_b is not None
        self.metrics, self.main_metric = metrics, main_metric
        self.files = files or {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
        self.submission = submission or name

    def source_files(self, data_dir: str, split: str) -> List[str]:
        return [os.path.join(data_dir, self.files[split])]

    def _read(self, data_dir: str, split: str) -> List[Example]:
        cols = self.test_columns if split == "test" else self.columns
        return read_table(self.source_files(data_dir, split)[0], "tsv", cols, self, split)


_BIN = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
_PAIR = Columns("sentence1", "sentence2", "label")
_G = functools.partial
TASKS = {
    "sst-2": _G(GlueTask, "sst-2", _BIN, Columns("sentence", None, "label"), Columns("sentence"),
                submission="SST-2"),
    "cola": _G(GlueTask, "cola", _BIN, Columns(3, None, 1, header=False, ncols=4), Columns("sentence"),
               metrics=("mcc", "accuracy"), main_metric="mcc", submission="CoLA"),
    "mrpc": _G(GlueTask, "mrpc", _BIN, Columns("#1 String", "#2 String", "Quality"),
               Columns("#1 String", "#2 String"), metrics=("accuracy", "f1"), submission="MRPC"),
    "rte": _G(GlueTask, "rte", _NLI2, _PAIR, _PAIR, submission="RTE"),
    "wnli": _G(GlueTask, "wnli", _BIN, _PAIR, _PAIR, submission="WNLI"),
    "sts-b": _G(GlueTask, "sts-b", None, Columns("sentence1", "sentence2", "score"), _PAIR,
                metrics=("pearson", "spearman"), main_metric="pearson", submission="STS-B"),
    "qnli": _G(GlueTask, "qnli", _NLI2, Columns("question", "sentence", "label"),
               Columns("question", "sentence"), submission="QNLI"),
    "qqp": _G(GlueTask, "qqp", _BIN, Columns("question1", "question2", "is_duplicate"),
              Columns("question1", "question2"), metrics=("accuracy", "f1"), submission="QQP"),
    "mnli": _G(GlueTask, "mnli", ("contradiction", "entailment", "neutral"),
               Columns("sentence1", "sentence2", "gold_label"), _PAIR, submission="MNLI-m",
               files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"}),
    "mnli-mm": _G(GlueTask, "mnli-mm", ("contradiction", "entailment", "neutral"),
                  Columns("sentence1", "sentence2", "gold_label"), _PAIR, submission="MNLI-mm",
                  files={"train": "train.tsv", "dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"}),
}


def write_glue_predictions(task: ClassificationTask, predictions, path: str,
                           indices: Optional[Sequence[int]] = None) -> str:
    """Writes a GLUE submission file ``index<TAB>prediction`` (with that header), atomically.

    ``predictions``: label ids, label strings or logits [n, C] (classification); floats (regression).
    Classification rows hold the label string (``entailment``, ``1``...), regression rows the score.
    The GLUE site expects the file to be named ``<task.submission>.tsv`` (e.g. ``MNLI-m.tsv``).
    """
    preds = np.asarray(predictions)
    if task.regression:
        values = [f"{float(v):.6g}" for v in preds.reshape(len(preds), -1)[:, 0]] if preds.size else []
    else:
        if preds.ndim == 2:
            preds = preds.argmax(-1)
        values = []
        for p in preds.tolist():
            if isinstance(p, str):
                if p not in task.labels:
                    raise ValueError(f"prediction {p!r} not in the labels of {task.name}: {list(task.labels)}")
                values.append(p)
            elif isinstance(p, int) and 0 <= p < len(task.labels):
                values.append(task.labels[p])
            else:
                raise ValueError(f"prediction {p!r} is not a label id of {task.name} (0..{len(task.labels) - 1})")
    indices = list(range(len(values))) if indices is None else list(indices)
    if len(indices) != len(values):
        raise ValueError(f"{len(indices)} indices for {len(values)} predictions")
    with atomic_write(path) as f:
        f.write("index\tprediction\n")
        for i, v in zip(indices, values):
            f.write(f"{i}\t{v}\n")
    return path
