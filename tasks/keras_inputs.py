"""The Keras task models' door: what a user hands ``fit`` / ``evaluate`` / ``predict`` (texts, pairs, labels,
weights), checked once and turned into arrays, or refused in one line naming the argument, the row and what was
expected (a ``ValueError`` for a wrong value, a ``TypeError`` for a wrong kind). No TensorFlow here: each task model
calls these before any dataset is built.

* **Texts**: a list, tuple, numpy array or pandas Series of ``str`` (UTF-8 ``bytes`` are decoded); ``None``, numbers
  or invalid UTF-8 are refused naming the row. A single string is refused (a list is expected). Texts come back
  as an object array of UTF-8 ``bytes``: what ``tf.constant`` reads as is (numpy's fixed-width ``str`` arrays would
  drop trailing NUL characters, which the export keeps).
* **Pairs**: a tuple ``(texts_a, texts_b)`` of equal lengths, or a list of ``(a, b)`` pairs (HF's habit).
* **Texts by name**: a dict keyed by the export's input names (``text_a`` / ``text_b``, ...: ``texts_by_name``),
  read as the task's tuple, so one request serves the model and its export.
* **Labels**: class indices in ``[0, num_classes)`` (integral floats accepted, 0.5 refused), or strings mapped
  through the model's ``label_names``; regression targets are finite numbers; RACE answers are indices 0-3 or the
  letters "A"-"D" (RACE's own format).
* **Sample weights** and **class weights**: finite, non-negative numbers, one per example / one per class.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

CHOICE_LETTERS = "ABCD"


def _rows(values, name: str, what: str = "texts") -> list:
    """One entry per example; ``what`` names them in a refusal. Numbers (labels, weights) may come as a column
    ``[n, 1]``, as Keras takes them; RACE's options as an ``[n, 4]`` array of texts."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name}: a list of {what} is expected, got one {type(values).__name__} (wrap it in a list)")
    if isinstance(values, np.ndarray):
        if values.ndim == 2 and values.shape[1] == 1 and what != "texts":
            values = values[:, 0]
        if values.ndim != 1 and not (what == "rows of options" and values.ndim == 2):
            hint = " (one-hot rows? pass their argmax, the class indices)" if what == "labels" and values.ndim == 2 \
                else ""
            raise ValueError(f"{name}: a 1-D list of {what} is expected, one per example, got an array of shape "
                             f"{values.shape}{hint}")
        return values.tolist()
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):  # pandas Series and the like
        values = values.tolist()
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{name}: a list of {what} is expected, got {type(values).__name__}") from None


def texts(values, name: str = "x") -> np.ndarray:
    """``values`` -> object array of UTF-8 bytes (module docstring); refused in one line naming the row."""
    rows = _rows(values, name)
    out = np.empty(len(rows), dtype=object)
    for i, t in enumerate(rows):
        if isinstance(t, bytes):
            try:
                t.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{name}[{i}]: bytes that are not valid UTF-8 ({e.reason} at byte {e.start}); "
                                 f"decode the text yourself") from None
            out[i] = t
        elif isinstance(t, str):
            out[i] = t.encode("utf-8", "surrogatepass")
        else:
            raise TypeError(f"{name}[{i}]: a text (str) is expected, got {type(t).__name__} {t!r}")
    return out


def pair_columns(x, name: str = "x") -> Optional[Tuple]:
    """``(texts_a, texts_b)`` or a list of ``(a, b)`` pairs -> the two columns; None when ``x`` is no pair input."""
    if isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], (str, bytes)):
        return x
    if isinstance(x, (list, tuple)) and x and all(isinstance(p, (tuple, list)) and len(p) == 2 and
                                                  isinstance(p[0], (str, bytes)) for p in x):
        return [p[0] for p in x], [p[1] for p in x]
    return None


def same_length(name_a: str, a, name_b: str, b) -> None:
    if len(a) != len(b):
        raise ValueError(f"{name_a} has {len(a)} rows but {name_b} has {len(b)}: one per example is expected")


def class_labels(y, num_classes: int, label_names: Optional[Sequence[str]] = None, name: str = "y") -> np.ndarray:
    """Class indices int32 [n]: integers (or integral floats) in [0, num_classes), or strings among ``label_names``."""
    rows = np.asarray(_rows(y, name, "labels"), dtype=object)
    if rows.size and all(isinstance(v, (str, bytes, np.str_)) for v in rows):
        names = None if label_names is None else {str(n): i for i, n in enumerate(label_names)}
        if names is None:
            raise ValueError(f"{name}: string labels ({rows[0]!r}, ...) but the model has no label_names to map "
                             f"them; pass class indices, or build the model with label_names=[...]")
        out = np.empty(rows.size, np.int32)
        for i, v in enumerate(rows):
            v = v.decode("utf-8") if isinstance(v, bytes) else str(v)
            if v not in names:
                raise ValueError(f"{name}[{i}]: label {v!r} is not one of the model's label_names {list(names)}")
            out[i] = names[v]
        return out
    values = _numbers(rows, name)
    bad = np.flatnonzero(values != np.round(values))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]: {values[bad[0]]:g} is not a class index: a classifier's labels are "
                         f"integers 0..{num_classes - 1} (for real-valued targets build it with regression=True)")
    bad = np.flatnonzero((values < 0) | (values >= num_classes))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]: label {int(values[bad[0]])} is outside 0..{num_classes - 1} "
                         f"(num_classes={num_classes})")
    return values.astype(np.int32)


def regression_targets(y, name: str = "y") -> np.ndarray:
    return _numbers(np.asarray(_rows(y, name, "targets"), dtype=object), name).astype(np.float32)


def choice_labels(y, num_choices: int = len(CHOICE_LETTERS), name: str = "y") -> np.ndarray:
    """RACE answers: indices 0..3 or letters "A".."D" (case-insensitive) -> int32 [n]."""
    rows = _rows(y, name, "labels")
    out = []
    for i, v in enumerate(rows):
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if isinstance(v, (str, np.str_)):
            letter = str(v).strip().upper()
            if len(letter) != 1 or letter not in CHOICE_LETTERS[:num_choices]:
                raise ValueError(f"{name}[{i}]: answer {v!r}: expected a letter A-{CHOICE_LETTERS[num_choices - 1]} "
                                 f"or an index 0..{num_choices - 1}")
            out.append(CHOICE_LETTERS.index(letter))
        else:
            out.append(v)
    return class_labels(np.asarray(out, dtype=object), num_choices, name=name)


def options(values, n: int, num_choices: int, name: str = "options") -> list:
    """RACE options: ``n`` rows of ``num_choices`` texts each (checked row by row: a ragged list is named)."""
    rows = _rows(values, name, "rows of options")
    same_length("articles", range(n), name, rows)
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != num_choices:
            got = f"{len(row)} options" if hasattr(row, "__len__") and not isinstance(row, (str, bytes)) else \
                repr(row)
            raise ValueError(f"{name}[{i}]: {num_choices} options are expected per question, got {got}")
    return [texts(list(row), f"{name}[{i}]") for i, row in enumerate(rows)]


def sample_weights(w, n: int, name: str = "sample_weight") -> np.ndarray:
    """One finite, non-negative weight per example -> float32 [n]."""
    values = _numbers(np.asarray(_rows(w, name, "weights"), dtype=object), name)
    same_length("x", range(n), name, values)
    bad = np.flatnonzero(values < 0)
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]: {values[bad[0]]:g} is negative: weights are >= 0")
    return values.astype(np.float32)


def whole_number(name: str, value, least: int) -> int:
    """An option that counts something (a length, a batch, epochs): an integer >= ``least``, else refused in one
    line naming it (a float, a string or a bool is not taken for one)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name}={value!r}: expected an integer >= {least}")
    return int(value)


def texts_by_name(x: Mapping, names: Sequence[str], required: int, model: str, name: str = "x"):
    """A dict keyed by the export's text inputs (``serving_default``'s names, ``names`` in the raw form's order; the
    first ``required`` of them needed) -> the task's raw form: the one column, or the tuple of columns. ``None``
    when no key is one of ``names`` (a dict of features). Works on arrays, tensors and their specs alike."""
    keys = set(x)
    if not keys & set(names):
        return None
    missing, unknown = [k for k in names[:required] if k not in keys], sorted(keys - set(names))
    if missing or unknown:
        need = ", ".join(names[:required]) + (f" (and optionally {', '.join(names[required:])})"
                                               if len(names) > required else "")
        raise ValueError(f"{name}: {model} reads a dict of texts keyed {need}; got keys {sorted(keys)}")
    columns = tuple(x[k] for k in names if k in keys)
    return columns[0] if len(columns) == 1 else columns


def _columns(x) -> bool:
    """``x`` is a tuple of columns (``(texts_a, texts_b)``, RACE's three), not a sequence of rows."""
    return isinstance(x, tuple) and bool(x) and not isinstance(x[0], (str, bytes))


def count_rows(x, name: str = "x") -> int:
    """The number of examples of what ``fit`` takes as ``x``: rows, a tuple of columns or a dict of arrays."""
    if isinstance(x, Mapping):
        return rows_of(x, name)
    first = x[0] if _columns(x) else x
    try:
        return len(first)
    except TypeError:
        raise TypeError(f"{name}: a list of texts, a tuple of text columns or a dict of arrays is expected, got "
                        f"{type(x).__name__}") from None


def take_rows(x, start: int, stop: int, columns: bool = True):
    """Rows ``start:stop`` of ``x`` in its own form (a dict and, with ``columns``, a tuple of columns: of each;
    labels and weights are rows whatever their container)."""
    if x is None:
        return None
    if isinstance(x, Mapping):
        return {k: take_rows(v, start, stop) for k, v in x.items()}
    if columns and _columns(x):
        return tuple(take_rows(c, start, stop) for c in x)
    if hasattr(x, "iloc"):  # pandas: by position
        return x.iloc[start:stop]
    return x[start:stop] if isinstance(x, (list, tuple, np.ndarray)) else list(x)[start:stop]


def class_weight_vector(class_weight: Mapping, num_classes: int) -> np.ndarray:
    """Keras' ``class_weight`` ({class index: weight}; a class left out weighs 1) -> float32 [num_classes]."""
    if not isinstance(class_weight, Mapping):
        raise TypeError(f"class_weight: a dict {{class index: weight}} is expected, got {type(class_weight).__name__}")
    out = np.ones(num_classes, np.float32)
    for k, v in class_weight.items():
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= int(k) < num_classes:
            raise ValueError(f"class_weight: key {k!r} is not a class index 0..{num_classes - 1}")
        if not isinstance(v, (int, float, np.number)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"class_weight[{k}]: {v!r} is not a finite weight >= 0")
        out[int(k)] = float(v)
    return out


def _numbers(rows: np.ndarray, name: str) -> np.ndarray:
    out = np.empty(rows.size, np.float64)
    for i, v in enumerate(rows.reshape(-1)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}[{i}]: a number is expected, got {type(v).__name__} {v!r}")
        if not np.isfinite(v):
            raise ValueError(f"{name}[{i}]: {v} is not a finite number")
        out[i] = v
    return out


def rows_of(features: Dict[str, np.ndarray], name: str = "x") -> int:
    """The number of examples of a dict of feature arrays (all the same)."""
    lengths = {k: len(v) for k, v in features.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{name}: the feature arrays have different numbers of rows: {lengths}")
    return next(iter(lengths.values()), 0)
