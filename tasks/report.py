"""What a finished run shows beside its metrics: per-class scores with the confusion matrix (classification and
RACE, in ``eval_results.json``), and the training curve as a PNG (every fine-tuning run in ``OUTPUT_DIR``,
pretraining in ``MODEL_DIR``).

* ``class_scores(gold, predicted, names)``: ``per_class`` {name: precision, recall, f1, support}, ``macro_f1``
  (the mean F1 of the classes found in the gold labels or the predictions, as sklearn's ``average="macro"``) and
  ``confusion_matrix`` {``labels``, ``counts``: rows the gold class, columns the predicted one}. A class never
  predicted has precision 0, one never in the gold recall 0 (sklearn's ``zero_division=0``).
* ``class_table(results)``: those scores as the log lines a user reads.
* ``learning_rates(train_config, steps)``: the schedule's rate at each step of the history (update ``s`` uses the
  schedule's value after ``s - 1`` updates, as the optimizer).
* ``write_curve(path, history, rates, evaluations, metric, title)``: the loss at every step (and its moving mean)
  with the evaluation loss at each evaluation; the learning rate; ``metric`` at each evaluation. matplotlib is
  imported on first use (its Figure API, which renders with Agg: no GUI backend); a plot that fails is one logged warning, never a failed run.
"""

from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from xlnet_tf.fileutil import atomic_path

log = logging.getLogger("report")

CURVE_FILE = "training_curve.png"
LOGGED_CLASSES = 20  # the log's per-class table and confusion matrix show at most this many classes


def class_scores(gold, predicted, names: Sequence[str]) -> Dict:
    """Per-class precision / recall / F1 / support, macro-F1 and the confusion matrix of class indices in
    ``range(len(names))``."""
    y, p = np.asarray(gold, np.int64).reshape(-1), np.asarray(predicted, np.int64).reshape(-1)
    k = len(names)
    counts = np.zeros((k, k), np.int64)
    np.add.at(counts, (y, p), 1)
    tp, gold_n, pred_n = np.diag(counts), counts.sum(1), counts.sum(0)
    per_class, f1s = {}, []
    for i, name in enumerate(names):
        precision = float(tp[i] / pred_n[i]) if pred_n[i] else 0.0
        recall = float(tp[i] / gold_n[i]) if gold_n[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[str(name)] = {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
                                "support": int(gold_n[i])}
        if gold_n[i] or pred_n[i]:
            f1s.append(f1)
    return {"macro_f1": round(float(np.mean(f1s)), 4) if f1s else 0.0, "per_class": per_class,
            "confusion_matrix": {"labels": [str(n) for n in names], "counts": counts.tolist()}}


def class_table(results: Dict, limit: int = LOGGED_CLASSES) -> List[str]:
    """The per-class scores and the confusion matrix of ``results`` as aligned lines (none without them). Past
    ``limit`` classes, the ``limit`` most frequent gold classes only (a line says so: the whole table and matrix
    stay in ``eval_results.json``), so a log stays readable with a thousand classes."""
    per_class, matrix = results.get("per_class"), results.get("confusion_matrix")
    if not per_class or not matrix:
        return []
    names, counts = matrix["labels"], np.asarray(matrix["counts"], np.int64)
    shown = np.arange(len(names))
    lines = []
    if len(names) > limit:
        shown = np.sort(np.argsort(-counts.sum(1), kind="stable")[:limit])
        lines.append(f"{len(names):,} classes: the {limit} most frequent gold classes below (every class and the "
                     f"whole confusion matrix: eval_results.json)")
    w = max(8, max(len(names[i]) for i in shown) + 2)
    lines.append(f"{'class':{w}s} precision  recall      f1  support")
    for i in shown:
        sc = per_class[names[i]]
        lines.append(f"{names[i]:{w}s} {sc['precision']:9.3f} {sc['recall']:7.3f} {sc['f1']:7.3f} {sc['support']:8d}")
    lines.append(f"{'macro-F1':{w}s} {'':9s} {'':7s} {results['macro_f1']:7.3f}")
    cw = max(6, max(len(names[i]) for i in shown) + 1)
    lines.append("confusion matrix (rows: gold, columns: predicted)")
    lines.append(f"{'':{w}s}" + "".join(f"{names[i]:>{cw}s}" for i in shown))
    lines += [f"{names[i]:{w}s}" + "".join(f"{c:{cw}d}" for c in counts[i, shown]) for i in shown]
    return lines


def learning_rates(train_config, steps: Sequence[int]) -> np.ndarray:
    """The learning rate of ``train_config``'s schedule at each of ``steps`` (1-based update numbers)."""
    schedule = train_config.schedule()
    return np.asarray(schedule(np.asarray(steps, np.float32) - 1.0), np.float64).reshape(-1)


def write_curve(path: str, history: Sequence, rates: Optional[Sequence[float]] = None,
                evaluations: Sequence[Dict] = (), metric: Optional[str] = None, title: str = "",
                eval_name: str = "eval") -> Optional[str]:
    """The training curve PNG at ``path``: ``history`` [(step, loss)], ``rates`` the learning rate per history
    entry, ``evaluations`` [{"step", "loss", metric}] (``eval_name`` labels them). Returns the path, or None
    (nothing to plot, or the plot failed: logged)."""
    if not history:
        return None
    try:
        _plot(path, history, rates, evaluations, metric, title, eval_name)
    except Exception as e:  # noqa: BLE001 - a missing or broken matplotlib must not fail a finished run
        log.warning("the training curve was not drawn (%s: %s); the numbers are in the run's json files",
                    type(e).__name__, str(e).strip().splitlines()[0][:200] if str(e).strip() else "")
        return None
    log.info("training curve: %s", path)
    return path


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _plot(path, history, rates, evaluations, metric, title, eval_name) -> None:
    # matplotlib's Figure without pyplot renders a PNG with Agg whatever the process's backend: no GUI, no global
    # figure state, and a caller's own plotting backend is left alone
    from matplotlib.figure import Figure

    steps = np.asarray([h[0] for h in history], np.float64)
    loss = np.asarray([h[1] for h in history], np.float64)
    evals = [e for e in evaluations if _finite(e.get("step"))]
    scores = [(e["step"], e[metric]) for e in evals if metric and _finite(e.get(metric))]
    panels = 1 + (rates is not None) + bool(scores)
    fig = Figure(figsize=(8, 2.4 * panels + 0.6), dpi=100)
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    ax = axes[0]
    ax.plot(steps, loss, lw=0.6, alpha=0.35, color="tab:blue", label="training loss (each step)")
    window = max(1, len(loss) // 50)
    if window > 1:
        mean = np.convolve(loss, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], mean, lw=1.6, color="tab:blue", label=f"training loss (mean of {window} steps)")
    points = [(e["step"], e["loss"]) for e in evals if _finite(e.get("loss"))]
    if points:
        ax.plot(*zip(*points), "o-", color="tab:red", label=f"{eval_name} loss")
    ax.set_ylabel("loss")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    i = 1
    if rates is not None:
        axes[i].plot(steps, rates, color="tab:green")
        axes[i].set_ylabel("learning rate")
        axes[i].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        axes[i].grid(alpha=0.3)
        i += 1
    if scores:
        axes[i].plot(*zip(*scores), "o-", color="tab:purple")
        axes[i].set_ylabel(f"{eval_name} {metric}")
        axes[i].grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
