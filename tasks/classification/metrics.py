"""Classification / regression metrics in numpy (no scipy / sklearn at runtime).

``compute_metrics(task, labels, predictions)`` returns the task's metrics by name: ``accuracy``, ``f1``
(binary, positive class "1"), ``mcc``, ``pearson``, ``spearman`` (ranks with ties averaged), ``error_rate``.
Degenerate inputs follow sklearn / scipy: F1 with no positive predictions nor labels is 0.0, MCC of a
constant prediction is 0.0, Pearson/Spearman of a constant vector is nan.
"""

from __future__ import annotations

from typing import Dict

import numpy as np


def _pair(labels, predictions):
    y, p = np.asarray(labels).reshape(-1), np.asarray(predictions).reshape(-1)
    if y.shape != p.shape:
        raise ValueError(f"{y.size} labels but {p.size} predictions")
    if y.size == 0:
        raise ValueError("no examples to score")
    return y, p


def accuracy(labels, predictions) -> float:
    y, p = _pair(labels, predictions)
    return float(np.mean(y == p))


def error_rate(labels, predictions) -> float:
    return 1.0 - accuracy(labels, predictions)


def f1(labels, predictions, positive=1) -> float:
    """Binary F1 of the ``positive`` class."""
    y, p = _pair(labels, predictions)
    tp = np.sum((p == positive) & (y == positive))
    denom = np.sum(p == positive) + np.sum(y == positive)
    return float(2 * tp / denom) if denom else 0.0


def matthews_corrcoef(labels, predictions) -> float:
    """Matthews correlation; multi-class via the confusion-matrix (Gorodkin) form, as sklearn."""
    y, p = _pair(labels, predictions)
    classes, idx = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = len(classes)
    cm = np.zeros((k, k), dtype=np.float64)
    np.add.at(cm, (idx[: y.size], idx[y.size:]), 1)
    t, pk = cm.sum(1), cm.sum(0)  # true / predicted counts per class
    c, s = np.trace(cm), cm.sum()
    cov_yp = c * s - t @ pk
    cov_pp, cov_yy = s * s - pk @ pk, s * s - t @ t
    return float(cov_yp / np.sqrt(cov_pp * cov_yy)) if cov_pp * cov_yy > 0 else 0.0


def pearson(x, y) -> float:
    x, y = (np.asarray(v, dtype=np.float64) for v in _pair(x, y))
    xm, ym = x - x.mean(), y - y.mean()
    denom = np.sqrt((xm @ xm) * (ym @ ym))
    return float(np.clip(xm @ ym / denom, -1.0, 1.0)) if denom > 0 else float("nan")


def rankdata(x) -> np.ndarray:
    """1-based ranks, ties get the average of their ranks (scipy's 'average')."""
    x = np.asarray(x).reshape(-1)
    order = np.argsort(x, kind="mergesort")
    sx = x[order]
    starts = np.r_[True, sx[1:] != sx[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], x.size] - 1
    avg = (first + last) / 2.0 + 1.0
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = avg[group]
    return ranks


def spearman(x, y) -> float:
    x, y = _pair(x, y)
    return pearson(rankdata(x.astype(np.float64)), rankdata(y.astype(np.float64)))


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson,
           "spearman": spearman, "error_rate": error_rate}


def _to_ids(task, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 2 and not task.regression:  # logits / probabilities
        return arr.argmax(-1)
    if arr.dtype.kind in "US" or arr.dtype == object:
        return np.asarray([task.label_id(str(v)) for v in arr.reshape(-1)])
    return arr.reshape(-1)


def compute_metrics(task, labels, predictions) -> Dict[str, float]:
    """The task's metrics. ``task``: a ClassificationTask (``tasks.classification.registry.get_task``). Classification
    labels/predictions may be ids, label strings, or (predictions) logits [n, C]; regression ones are floats."""
    y, p = _to_ids(task, labels), _to_ids(task, predictions)
    out: Dict[str, float] = {}
    for name in task.metrics:
        if name == "f1":
            positive = task.labels.index("1") if task.labels and "1" in task.labels else 1
            out[name] = f1(y, p, positive=positive)
        else:
            out[name] = METRICS[name](y, p)
    return out
