"""Sequence classification / regression tasks: examples, the task protocol, table readers, the registry.

A task knows its label list (or that it is a regression), its train/dev/test files, whether it is a pair
task, its metrics and main metric. ``get_task(name)`` looks tasks up case-insensitively ("SST-2", "sst2",
"sts_b" all work). GLUE tasks live in ``tasks/classification/glue.py``; IMDB, the char-CNN csv sets and ``generic`` in
``tasks/classification/text.py``. Every malformed input raises :class:`tasks.errors.DataError` naming the
file, the line and the field.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple, Union

from xlnet_tf.tasks.errors import DataError

SPLITS = ("train", "dev", "test")
Label = Union[str, float, None]
Col = Union[str, int]  # a column name (files with a header) or a 0-based index


@dataclass
class Example:
    """One input: ``label`` is a str (classification), a float (regression) or None (unlabeled test)."""

    guid: str
    text_a: str
    text_b: Optional[str] = None
    label: Label = None


class ClassificationTask:
    """Base class. Subclasses set the class attributes and implement ``source_files`` and ``_read``."""

    name: str = ""
    labels: Optional[Tuple[str, ...]] = None
    regression: bool = False
    is_pair: bool = False
    metrics: Tuple[str, ...] = ("accuracy",)
    main_metric: str = "accuracy"

    # ---------------------------------------------------------------- labels
    @property
    def is_regression(self) -> bool:
        return self.regression

    @property
    def num_labels(self) -> int:
        if self.regression:
            return 1
        if self.labels is None:
            raise ValueError(f"task {self.name!r}: labels not known yet (read the train split first or pass labels=)")
        return len(self.labels)

    def label_id(self, label: Label) -> Union[int, float]:
        """Label -> int id (classification) or float (regression); None (unlabeled) -> 0 / 0.0."""
        if self.regression:
            return 0.0 if label is None else float(label)
        if label is None:
            return 0
        try:
            return self.labels.index(label)
        except ValueError:
            raise ValueError(f"task {self.name!r}: label {label!r} not in {list(self.labels)}") from None

    def parse_label(self, value: str, path: str, line: int, field: str) -> Label:
        """A raw label field -> str in ``labels`` or float; DataError otherwise."""
        value = value.strip()
        if self.regression:
            try:
                score = float(value)
            except ValueError:
                raise DataError(path, line, f"expected a numeric score, got {value!r}", field) from None
            if score != score or score in (float("inf"), float("-inf")):
                raise DataError(path, line, f"expected a finite score, got {value!r}", field)
            return score
        if not value:  # an empty cell would otherwise become a class of its own when the labels are discovered
            expected = f"a label in {list(self.labels)}" if self.labels is not None else "a label"
            raise DataError(path, line, f"expected {expected}, got an empty cell", field)
        if self.labels is not None and value not in self.labels:
            raise DataError(path, line, f"expected a label in {list(self.labels)}, got {value!r}", field)
        return value

    # ---------------------------------------------------------------- files and examples
    def source_files(self, data_dir: str, split: str) -> List[str]:
        """The file(s) (or folders) a split is read from: identifies the cache of its features."""
        raise NotImplementedError

    def _read(self, data_dir: str, split: str) -> List[Example]:
        raise NotImplementedError

    def get_examples(self, data_dir: str, split: str) -> List[Example]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        examples = self._read(data_dir, split)
        if not examples:
            raise DataError(", ".join(self.source_files(data_dir, split)), None, "no examples found")
        return examples

    def describe(self) -> dict:
        """JSON-able identity of the task (goes into TFRecord cache manifests)."""
        return {"name": self.name, "labels": list(self.labels) if self.labels is not None else None,
                "regression": self.regression, "is_pair": self.is_pair}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# -------------------------------------------------------------------- table reading
@dataclass(frozen=True)
class Columns:
    """Where the fields of one file layout are. ``text_a`` may be a tuple of columns joined with a space.

    ``header``: the first line names the columns (then columns may be names). Without a header, ``ncols``
    is the expected number of fields. A ``label`` column that is the last one is read from the row's last
    field, so a stray empty field before it (RTE train line 2166) is tolerated, as the original did.
    """

    text_a: Union[Col, Tuple[Col, ...]]
    text_b: Optional[Col] = None
    label: Optional[Col] = None
    header: bool = True
    ncols: Optional[int] = None


def _decode(raw: bytes, path: str, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, line, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None


def iter_rows(path: str, fmt: str) -> Iterator[Tuple[int, List[str]]]:
    """(line number, fields) of a tsv (plain tab split, quotes are text as in GLUE) or csv file.

    Blank lines are skipped; a UTF-8 BOM is dropped. For csv the line number is where the record starts.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if fmt == "tsv":
        with open(path, "rb") as f:
            for i, raw in enumerate(f, 1):
                text = _decode(raw, path, i)
                if i == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                text = text.rstrip("\r\n")
                if text.strip():
                    yield i, text.split("\t")
    elif fmt == "csv":
        csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # long documents (default cap: 128 KiB)
        with open(path, "r", encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            start = 1
            try:
                for row in reader:
                    if any(field.strip() for field in row):
                        yield start, row
                    start = reader.line_num + 1
            except UnicodeDecodeError as e:
                raise DataError(path, start, f"not valid UTF-8 ({e.reason})") from None
            except csv.Error as e:
                raise DataError(path, start, f"malformed csv ({e})") from None
    else:
        raise ValueError(f"unknown table format {fmt!r} (expected tsv or csv)")


def _resolve(col: Col, names: Optional[List[str]], path: str) -> Tuple[int, str]:
    """Column -> (index, display name); DataError when a named column is absent from the header."""
    if isinstance(col, int):
        return col, (names[col] if names and col < len(names) else f"column {col}")
    if names is None:
        raise ValueError(f"{path}: column {col!r} given by name but the layout has no header")
    if col not in names:
        raise DataError(path, 1, f"missing column; the header has {names}", col)
    return names.index(col), col


def read_table(path: str, fmt: str, columns: Columns, task: ClassificationTask, split: str,
               clean: Optional[Callable[[str], str]] = None) -> List[Example]:
    """Reads a tsv/csv file into examples, checking every row (see :class:`Columns`)."""
    rows = iter_rows(path, fmt)
    names: Optional[List[str]] = None
    ncols = columns.ncols
    if columns.header:
        first = next(rows, None)
        if first is None:
            raise DataError(path, None, "empty file; expected a header line and examples")
        names = [n.strip() for n in first[1]]
        ncols = len(names)
    a_cols = columns.text_a if isinstance(columns.text_a, tuple) else (columns.text_a,)
    a_idx = [_resolve(c, names, path) for c in a_cols]
    b_idx = _resolve(columns.text_b, names, path) if columns.text_b is not None else None
    label_idx = None
    if columns.label is not None:
        if split == "test" and names is not None and isinstance(columns.label, str) and columns.label not in names:
            label_idx = None  # GLUE test files have no labels
        else:
            label_idx = _resolve(columns.label, names, path)
    used = [i for i, _ in a_idx] + ([b_idx[0]] if b_idx else []) + ([label_idx[0]] if label_idx else [])
    if ncols is None:
        ncols = max(used) + 1
    label_last = label_idx is not None and label_idx[0] == ncols - 1
    sep = "tab-separated" if fmt == "tsv" else "comma-separated"

    def field(row, idx):
        return row[-1] if (label_last and idx == label_idx[0]) else row[idx]

    out: List[Example] = []
    n_rows = 0
    discovering, numbers = task.labels is None and not task.regression, {}
    for line, row in rows:
        n_rows += 1
        if len(row) != ncols:
            extra = row[ncols - 1:-1] if label_last else row[ncols:]
            if len(row) < ncols or any(x.strip() for x in extra):
                raise DataError(path, line, f"expected {ncols} {sep} fields, got {len(row)}")
        text_a = " ".join(field(row, i) for i, _ in a_idx)
        text_b = field(row, b_idx[0]) if b_idx else None
        if clean is not None:
            text_a = clean(text_a)
            text_b = clean(text_b) if text_b is not None else None
        label = task.parse_label(field(row, label_idx[0]), path, line, label_idx[1]) if label_idx else None
        if discovering and label is not None:
            _check_same_number(numbers, label, path, line, label_idx[1])
        out.append(Example(f"{split}-{len(out)}", text_a, text_b, label))
    if n_rows == 0:
        raise DataError(path, None, "empty file; expected " + ("examples after the header" if names else "examples"))
    return out


def _check_same_number(numbers: dict, label: str, path: str, line: int, field) -> None:
    """While the label set is discovered: two label strings of one number ("1" and "1.0") would silently be two
    classes; ``numbers``: number -> (the first label string of it, its line)."""
    try:
        number = float(label)
    except ValueError:
        return
    first, first_line = numbers.setdefault(number, (label, line))
    if first != label:
        raise DataError(path, line, f"label {label!r} is the same number as label {first!r} on line {first_line}: "
                                    f"they would be two classes; write each label one way, or pass --labels (the "
                                    f"label set, in order)", field)


_KINDS = {str: ("a JSON string", "JSON strings"), int: ("a JSON integer", "JSON integers"),
          float: ("a JSON number with a fraction or exponent", "JSON numbers with a fraction or exponent")}


def _check_label_kind(kinds: dict, value, label: str, path: str, line: int, field: str) -> None:
    """Labels of one JSON kind only while the label set is discovered: the number 1 among "pos" / "neg" would
    silently become a class '1' of its own (and 1 beside 1.0 two classes)."""
    kind = type(value)
    if kinds and kind not in kinds:
        (other, seen), = kinds.items()
        classes = sorted(seen | {label})
        raise DataError(path, line, f"label {value!r} is {_KINDS[kind][0]}, the labels before it are "
                                    f"{_KINDS[other][1]} ({sorted(seen)}): the task would have {len(classes)} "
                                    f"classes {classes}; write every label alike, or pass --labels (the label set, "
                                    f"in order)", field)
    kinds.setdefault(kind, set()).add(label)


def read_jsonl(path: str, text_a: str, text_b: Optional[str], label: Optional[str], task: ClassificationTask,
               split: str) -> List[Example]:
    """One JSON object per line; ``label`` may be absent on test files. Labels may be JSON numbers."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    out: List[Example] = []
    discovering = task.labels is None and not task.regression
    kinds: dict = {}  # while the label set is discovered: the JSON kind of the labels -> the labels of that kind
    numbers: dict = {}  # ... and their numbers (``_check_same_number``)
    with open(path, "rb") as f:
        for line, raw in enumerate(f, 1):
            text = _decode(raw, path, line).lstrip("\ufeff")
            del raw  # a long line is held once as text, then once as its object (no stripped copies)
            if not text or text.isspace():
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise DataError(path, line, f"expected a JSON object ({e})") from None
            del text
            if not isinstance(obj, dict):
                raise DataError(path, line, f"expected a JSON object, got {type(obj).__name__}")
            for key in (text_a, text_b):
                if key is not None and not isinstance(obj.get(key), str):
                    got = "missing" if key not in obj else type(obj[key]).__name__
                    raise DataError(path, line, f"expected a string, got {got}", key)
            lab = None
            if label is not None and (label in obj or split != "test"):
                if label not in obj:
                    raise DataError(path, line, "missing field", label)
                value = obj[label]
                if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                    raise DataError(path, line, f"expected a string or number, got {value!r}", label)
                lab = task.parse_label(str(value), path, line, label)
                if discovering:
                    _check_label_kind(kinds, value, lab, path, line, label)
                    _check_same_number(numbers, lab, path, line, label)
            out.append(Example(f"{split}-{len(out)}", obj[text_a], obj[text_b] if text_b else None, lab))
    if not out:
        raise DataError(path, None, "empty file; expected one JSON object per line")
    return out
