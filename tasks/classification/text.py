"""Document classification: IMDB, the char-CNN csv sets (Yelp, DBpedia, AG, Amazon) and ``generic``.

* ``imdb``: the ``aclImdb/{train,test}/{pos,neg}/*.txt`` layout, or ``aclImdb_v1.tar.gz`` read as a stream.
  ``data_dir`` may be the aclImdb folder, its parent, the tar.gz or a folder holding it. ``<br />`` becomes a
  space. There is no dev set: ``dev`` reads ``test`` (as the original XLNet did).
* char-CNN sets (Zhang et al. 2015): header-less ``train.csv``/``test.csv``, label index first (1-based), then
  the text columns, joined with a space; ``\\n`` escapes become spaces. ``dev`` reads ``test.csv``.
* ``generic``: the user's own csv / tsv (with a header) / jsonl files, columns named by options. A train file of
  one class is refused (``--allow_single_class``), one with fewer than ``FEW_PER_CLASS`` examples per class on
  average is said in one WARNING line.
"""

from __future__ import annotations

import functools
import logging
import os
import tarfile
from typing import Dict, List, Optional, Sequence, Tuple

from xlnet_tf.tasks.classification.reader import ClassificationTask, Col, Columns, Example, read_jsonl, read_table
from xlnet_tf.tasks.errors import DataError

log = logging.getLogger("data")

DOC_METRICS = ("accuracy", "error_rate")
FEW_PER_CLASS = 5  # fewer training examples per class than this on average: said in one WARNING line


# -------------------------------------------------------------------- IMDB
class ImdbTask(ClassificationTask):
    name = "imdb"
    labels = ("neg", "pos")
    metrics = DOC_METRICS
    SPLIT_DIR = {"train": "train", "dev": "test", "test": "test"}

    @staticmethod
    def locate(data_dir: str) -> str:
        """The aclImdb folder or the tar.gz that ``data_dir`` points at."""
        for cand in (data_dir, os.path.join(data_dir, "aclImdb")):
            if os.path.isdir(os.path.join(cand, "train")) or os.path.isdir(os.path.join(cand, "test")):
                return cand
        for cand in (data_dir, os.path.join(data_dir, "aclImdb_v1.tar.gz")):
            if os.path.isfile(cand) and cand.endswith((".tar.gz", ".tgz", ".tar")):
                return cand
        raise FileNotFoundError(f"{data_dir}: no aclImdb folder (train/, test/) and no aclImdb_v1.tar.gz")

    def source_files(self, data_dir: str, split: str) -> List[str]:
        src = self.locate(data_dir)
        if os.path.isfile(src):
            return [src]
        return [os.path.join(src, self.SPLIT_DIR[split], lab) for lab in self.labels]

    @staticmethod
    def _clean(raw: bytes, where: str) -> str:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(where, None, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
        return text.strip().replace("<br />", " ")

    def _read(self, data_dir: str, split: str) -> List[Example]:
        src = self.locate(data_dir)
        sub = self.SPLIT_DIR[split]
        docs: List[Tuple[int, str, str]] = []  # (label index, file name, text)
        if os.path.isfile(src):
            with tarfile.open(src, "r:*") as tar:
                for m in tar:  # streamed: one pass, no extraction
                    parts = m.name.split("/")
                    if (m.isfile() and len(parts) >= 3 and parts[-3] == sub and parts[-2] in self.labels
                            and parts[-1].endswith(".txt")):
                        text = self._clean(tar.extractfile(m).read(), f"{src}:{m.name}")
                        docs.append((self.labels.index(parts[-2]), parts[-1], text))
        else:
            for li, lab in enumerate(self.labels):
                folder = os.path.join(src, sub, lab)
                if not os.path.isdir(folder):
                    raise FileNotFoundError(f"IMDB folder not found: {folder}")
                for fn in os.listdir(folder):
                    if fn.endswith(".txt"):
                        with open(os.path.join(folder, fn), "rb") as f:
                            docs.append((li, fn, self._clean(f.read(), os.path.join(folder, fn))))
        docs.sort(key=lambda d: (d[0], d[1]))
        return [Example(f"{split}-{i}", text, None, self.labels[li]) for i, (li, _, text) in enumerate(docs)]


# -------------------------------------------------------------------- char-CNN csv sets
def _clean_charcnn(text: str) -> str:
    return " ".join(text.replace("\\n", " ").replace('\\"', '"').split())


class CharCnnTask(ClassificationTask):
    """Header-less csv: label (1-based index), then ``n_text`` text columns."""

    metrics = DOC_METRICS
    files = {"train": "train.csv", "dev": "test.csv", "test": "test.csv"}

    def __init__(self, name: str, num_classes: int, n_text: int):
        self.name = name
        self.labels = tuple(str(i) for i in range(1, num_classes + 1))
        self.columns = Columns(tuple(range(1, n_text + 1)), None, 0, header=False, ncols=n_text + 1)

    def source_files(self, data_dir: str, split: str) -> List[str]:
        return [os.path.join(data_dir, self.files[split])]

    def _read(self, data_dir: str, split: str) -> List[Example]:
        return read_table(self.source_files(data_dir, split)[0], "csv", self.columns, self, split,
                          clean=_clean_charcnn)


# -------------------------------------------------------------------- generic
_EXT = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def _label_sort_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


class GenericTask(ClassificationTask):
    """The user's own data: csv / tsv (first line = header) or jsonl files in ``data_dir``.

    Args:
      text_a_column, text_b_column, label_column: column names (or 0-based indices with ``header=False``);
        ``text_b_column`` None = single-sentence task.
      labels: the label list (order = label ids); None: the sorted distinct labels of the train file.
      regression: float labels (metrics pearson/spearman) instead of classes.
      files: split -> file name inside ``data_dir``; default ``{split}.{tsv,csv,jsonl}``, whichever exists.
      fmt: "csv" | "tsv" | "jsonl"; default from the file extension.
      metrics, main_metric: default accuracy (+ f1 for labels {"0","1"}), pearson/spearman for regression.
      allow_single_class: train even when the train file holds one class only (``check_labels`` refuses it).
    """

    def __init__(self, text_a_column: Col = "text", text_b_column: Optional[Col] = None,
                 label_column: Optional[Col] = "label", labels: Optional[Sequence[str]] = None,
                 regression: bool = False, files: Optional[Dict[str, str]] = None, fmt: Optional[str] = None,
                 header: bool = True, metrics: Optional[Sequence[str]] = None, main_metric: Optional[str] = None,
                 name: str = "generic", allow_single_class: bool = False):
        self.name, self.allow_single_class = name, allow_single_class
        self.text_a_column, self.text_b_column, self.label_column = text_a_column, text_b_column, label_column
        self.labels = tuple(str(x) for x in labels) if labels is not None else None
        self.regression = regression
        self.is_pair = text_b_column is not None
        self.files = dict(files or {})
        self.fmt, self.header = fmt, header
        self._metrics, self._main = metrics, main_metric

    @property
    def metrics(self) -> Tuple[str, ...]:
        if self._metrics:
            return tuple(self._metrics)
        if self.regression:
            return ("pearson", "spearman")
        return ("accuracy", "f1") if self.labels is not None and set(self.labels) == {"0", "1"} else ("accuracy",)

    @property
    def main_metric(self) -> str:
        return self._main or self.metrics[0]

    def source_files(self, data_dir: str, split: str) -> List[str]:
        if split in self.files:
            return [os.path.join(data_dir, self.files[split])]
        for ext in _EXT:
            p = os.path.join(data_dir, split + ext)
            if os.path.isfile(p):
                return [p]
        raise FileNotFoundError(f"{data_dir}: no {split}.tsv / {split}.csv / {split}.jsonl (or pass files=)")

    def _read_file(self, path: str, split: str) -> List[Example]:
        fmt = self.fmt or _EXT.get(os.path.splitext(path)[1].lower())
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the format from the extension; pass fmt='csv'|'tsv'|'jsonl'")
        if fmt == "jsonl":
            return read_jsonl(path, self.text_a_column, self.text_b_column, self.label_column, self, split)
        cols = Columns(self.text_a_column, self.text_b_column, self.label_column, header=self.header)
        return read_table(path, fmt, cols, self, split)

    def discover_labels(self, data_dir: str) -> Tuple[str, ...]:
        """The sorted distinct labels of the train file (numeric labels sorted by value)."""
        if self.labels is None and not self.regression:
            found = {ex.label for ex in self._read_file(self.source_files(data_dir, "train")[0], "train")}
            self.labels = tuple(sorted((x for x in found if x is not None), key=_label_sort_key))
        return self.labels

    def check_labels(self, data_dir: str, splits: Sequence[str]) -> None:
        """Before any feature is written: each of ``splits`` read (a label outside the label set refused, naming
        its line), and the train split holding at least two classes (unless ``allow_single_class``)."""
        self.discover_labels(data_dir)
        if self.regression:
            return
        for split in splits:
            path = self.source_files(data_dir, split)[0]
            examples = self._read_file(path, split)
            classes = sorted({ex.label for ex in examples if ex.label is not None})
            if split == "train" and len(classes) < 2 and not self.allow_single_class:
                raise DataError(path, None, f"one class only ({', '.join(map(repr, classes)) or 'no labels'} on every "
                                            f"line): a classifier learns nothing from it (loss 0 from the first "
                                            f"step); add examples of the other classes, or pass "
                                            f"--allow_single_class to train anyway")
            if split == "train" and len(classes) >= 2:
                labelled = sum(ex.label is not None for ex in examples)
                if labelled < FEW_PER_CLASS * len(classes):
                    log.warning("%s: %s classes with %.1f training examples each on average: too few for a "
                                "classifier to learn them (check --label_column, or merge rare classes)", path,
                                f"{len(classes):,}", labelled / len(classes))

    def _read(self, data_dir: str, split: str) -> List[Example]:
        self.discover_labels(data_dir)
        return self._read_file(self.source_files(data_dir, split)[0], split)

    def describe(self) -> dict:
        d = super().describe()
        d.update(columns=[self.text_a_column, self.text_b_column, self.label_column], files=self.files,
                 fmt=self.fmt, header=self.header)
        return d


_C = functools.partial
TASKS = {
    "imdb": ImdbTask,
    "yelp-2": _C(CharCnnTask, "yelp-2", 2, 1),
    "yelp-5": _C(CharCnnTask, "yelp-5", 5, 1),
    "dbpedia": _C(CharCnnTask, "dbpedia", 14, 2),
    "ag": _C(CharCnnTask, "ag", 4, 2),
    "amazon-2": _C(CharCnnTask, "amazon-2", 2, 2),
    "amazon-5": _C(CharCnnTask, "amazon-5", 5, 2),
    "generic": GenericTask,
}
