"""Is the run learning? Checks of a fine-tuning run's OUTCOME, for every task, in the log and in
``eval_results.json`` (key ``health``).

A collapsed run (one label for everything, a constant regression score, never / always "no answer", a loss that
does not fall) finishes without an error; these checks say so, with the causes the run's settings make likely:

* ``loss_trend(history)``: mean loss of the first and of the last 10% of the steps; a warning when it did not
  fall by at least ``MIN_LOSS_DROP`` (runs shorter than ``MIN_STEPS`` are reported, not judged); ``diverged``
  when the last 10% average ``DIVERGE_RATIO`` times the first step's loss or more (judged from 2 steps on: a
  loss that multiplies is no noise), status "diverging";
* ``label_check``: predicted label (or RACE option) distribution next to the gold one; a warning when one label
  takes >= 95% of the predictions while it is < 80% of the gold;
* ``regression_check``: the predictions' standard deviation next to the gold one; a warning under 10% of it;
* ``null_check`` (SQuAD v2.0): the share of questions answered "no answer" next to the gold share; a warning at
  0% or 100% when the gold has both;
* ``likely_causes(context, ...)``: what the settings and inputs suggest (a learning rate outside the range of
  the run's kind, Adam bias correction off without a pretrained checkpoint, inputs that are nearly all padding,
  a gold label column that is constant, warmup longer than the run).
* ``fit_check(trend, eval_loss)``: overfitting, a NOTE that does not make the run unhealthy (it learned, too
  well): the evaluation loss is at least ``OVERFIT_RATIO`` times the mean loss of the last 10% of the training
  steps and ``OVERFIT_GAP`` above it (the demo: training 0.0097, dev 0.74).

The tasks' ``evaluate`` put the prediction check under ``metrics["health"]``; ``tasks.runner`` adds the loss
trend, the fit and the causes and logs one WARNING per finding and per note. ``NotLearning``: what a run with
``--fail_if_unhealthy`` raises after writing its results (``failure``), exit code 3.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import numpy as np

log = logging.getLogger("health")

MIN_STEPS = 20          # fewer steps: the loss trend is reported but not judged
MIN_LOSS_DROP = 0.10    # the last 10% of the steps must average at least 10% below the first 10%
COLLAPSE_SHARE = 0.95   # one predicted label at >= 95% of the predictions ...
GOLD_SHARE = 0.80       # ... while it is < 80% of the gold labels
MIN_STD_RATIO = 0.10    # regression: std of the predictions >= 10% of the gold std
FEW_TOKENS = 3          # an input with at most this many real pieces holds no text (<sep> <cls> and at most one)
OVERFIT_RATIO = 3.0     # overfitting: evaluation loss >= 3x the last training steps' mean loss ...
OVERFIT_GAP = 0.1       # ... and at least 0.1 above it
DIVERGE_RATIO = 3.0     # diverging: the last steps' mean loss >= 3x the first step's (0.69 -> 2.8e6 at lr 1e6)


class NotLearning(Exception):
    """``--fail_if_unhealthy``: the run finished (its results written) but its health check found a problem;
    the message is the warning. ``run_main`` prints it as the one ``error:`` line, exit code 3."""


def loss_trend(history: Sequence) -> Optional[Dict]:
    """``history``: [(step, loss), ...]. None when empty."""
    losses = np.asarray([float(h[1]) for h in history], np.float64)
    if losses.size == 0:
        return None
    k = max(1, int(round(0.1 * losses.size)))
    first, last = float(losses[:k].mean()), float(losses[-k:].mean())
    out = {"steps": int(losses.size), "first_steps_mean": round(first, 4), "last_steps_mean": round(last, 4),
           "window": k, "judged": bool(losses.size >= MIN_STEPS and np.isfinite(first) and np.isfinite(last))}
    out["fell"] = bool(last <= (1.0 - MIN_LOSS_DROP) * first) if out["judged"] else None
    start = float(losses[0])  # the untrained model's loss (the first window may hold the blow-up already)
    out["first_loss"] = round(start, 4)
    out["diverged"] = bool(losses.size >= 2 and np.isfinite(start) and start > 0
                           and not last < DIVERGE_RATIO * start)
    return out


def _distribution(values: np.ndarray, names: Sequence[str]) -> Dict[str, float]:
    counts = np.bincount(values.astype(np.int64), minlength=len(names))[: len(names)]
    return {str(n): round(float(c) / max(1, values.size), 4) for n, c in zip(names, counts)}


def label_check(predicted, gold, names: Sequence[str], what: str = "label") -> Dict:
    """Predicted vs gold distribution of class indices in ``range(len(names))``."""
    p, y = np.asarray(predicted).reshape(-1), np.asarray(gold).reshape(-1)
    pred_dist, gold_dist = _distribution(p, names), _distribution(y, names)
    top = max(pred_dist, key=pred_dist.get)
    out = {"kind": "labels", "predicted": pred_dist, "gold": gold_dist, "warnings": []}
    if pred_dist[top] >= COLLAPSE_SHARE and gold_dist[top] < GOLD_SHARE:
        out["warnings"].append(
            f"collapsed predictions: {what} {top!r} takes {pred_dist[top]:.0%} of the predictions but only "
            f"{gold_dist[top]:.0%} of the gold {what}s")
    gold_top = max(gold_dist, key=gold_dist.get)
    if gold_dist[gold_top] >= 1.0 and len(names) > 1:
        out["constant_gold"] = gold_top
    return out


def regression_check(predicted, gold) -> Dict:
    p, y = (np.asarray(v, np.float64).reshape(-1) for v in (predicted, gold))
    out = {"kind": "regression", "predicted_mean": round(float(p.mean()), 4),
           "predicted_std": round(float(p.std()), 4), "gold_mean": round(float(y.mean()), 4),
           "gold_std": round(float(y.std()), 4), "warnings": []}
    if y.std() > 0 and not p.std() >= MIN_STD_RATIO * y.std():
        out["warnings"].append(f"collapsed predictions: the scores' standard deviation {p.std():.4g} is under "
                               f"{MIN_STD_RATIO:.0%} of the gold's {y.std():.4g} (nearly one value for every example)")
    if y.std() == 0:
        out["constant_gold"] = float(y[0])
    return out


def null_check(predicted_null, gold_null) -> Dict:
    """SQuAD v2.0: booleans per question (True: "no answer")."""
    p, y = (np.asarray(v, bool).reshape(-1) for v in (predicted_null, gold_null))
    share, gold_share = float(p.mean()), float(y.mean())
    out = {"kind": "null_answers", "predicted_null_share": round(share, 4), "gold_null_share": round(gold_share, 4),
           "warnings": []}
    if 0.0 < gold_share < 1.0 and share in (0.0, 1.0):
        out["warnings"].append(f"collapsed predictions: {'every' if share else 'no'} question is answered "
                               f"\"no answer\" ({share:.0%}; gold {gold_share:.0%})")
    return out


def token_counts(padding_mask) -> np.ndarray:
    """Real pieces per example (every axis but the first summed: windows, options)."""
    m = np.asarray(padding_mask)
    return m.reshape(m.shape[0], -1).sum(axis=1)


def add_input_check(check: Dict, num_tokens) -> Dict:
    """Adds the share of inputs with (nearly) no text to a prediction check."""
    n = np.asarray(num_tokens).reshape(-1)
    if n.size:
        check["mean_real_tokens"] = round(float(n.mean()), 2)
        check["share_without_text"] = round(float((n <= FEW_TOKENS).mean()), 4)
    return check


def likely_causes(context: Dict, check: Optional[Dict] = None) -> List[str]:
    """``context``: learning_rate, bias_correction, weight_decay, pretrained (bool), train_steps, warmup_steps
    (without ``pretrained``: a pretraining run, where only the warmup rule applies)."""
    causes = []
    lr, pretrained = context.get("learning_rate"), context.get("pretrained")
    if "pretrained" not in context:  # pretraining: the fine-tuning rules below do not apply
        lr, pretrained = None, True
    if lr is not None and lr <= 0:
        causes.append(f"the learning rate is {lr:g}: it must be > 0")
    elif lr is not None and pretrained and lr > 2e-4:
        causes.append(f"learning rate {lr:g} is far above the 1e-5..5e-5 the published recipes fine-tune "
                      f"pretrained weights with")
    elif lr is not None and not pretrained and lr > 3e-3:
        causes.append(f"learning rate {lr:g} is high for training from random initialisation (1e-4..1e-3 is "
                      f"the usual range)")
    elif lr is not None and not pretrained and lr < 5e-5:
        causes.append(f"learning rate {lr:g} is a fine-tuning rate, but there is no --init_checkpoint: the model "
                      f"starts from random weights and needs 1e-4..1e-3 (or pass the pretrained checkpoint)")
    if not pretrained and context.get("bias_correction") is False:
        causes.append("Adam bias correction is off (--adam_bias_correction=false) while training from random "
                      "initialisation: the first few hundred updates are 3-6x larger")
    if not pretrained:
        causes.append("no --init_checkpoint: the backbone starts from random weights, which needs far more data "
                      "and steps than fine-tuning a pretrained XLNet")
    steps, warmup = context.get("train_steps"), context.get("warmup_steps")
    if steps and warmup and warmup >= steps:
        causes.append(f"--warmup_steps={warmup} >= --train_steps={steps}: the peak learning rate is never reached")
    if check:
        if check.get("share_without_text", 0) >= 0.5:
            causes.append(f"{check['share_without_text']:.0%} of the evaluated inputs hold no text (at most "
                          f"{FEW_TOKENS} real pieces): check the text column(s) of the data")
        if "constant_gold" in check:
            causes.append(f"the gold labels are constant ({check['constant_gold']!r} everywhere): check the label "
                          f"column of the data")
    return causes


def fit_check(trend: Optional[Dict], eval_loss: Optional[float]) -> Optional[Dict]:
    """The last training steps' mean loss next to the evaluation loss; ``overfitting`` per ``OVERFIT_RATIO`` and
    ``OVERFIT_GAP``. None without both numbers."""
    if not trend or eval_loss is None or not np.isfinite(eval_loss) or not np.isfinite(trend["last_steps_mean"]):
        return None
    train = float(trend["last_steps_mean"])
    over = bool(eval_loss >= OVERFIT_RATIO * train and eval_loss - train >= OVERFIT_GAP)
    return {"train_loss": round(train, 4), "eval_loss": round(float(eval_loss), 4), "overfitting": over}


def assess(check: Optional[Dict], trend: Optional[Dict], context: Dict, eval_loss: Optional[float] = None) -> Dict:
    """The ``health`` entry of eval_results.json: ``status`` ("learning", "not learning" or "diverging"), the
    checks, ``warnings`` (empty when healthy), ``causes``, and
    ``notes`` that do not make a run unhealthy (overfitting, from ``eval_loss``)."""
    warnings = list((check or {}).get("warnings", []))
    diverged = bool(trend and trend.get("diverged"))
    if diverged:
        warnings.append(f"the training loss diverged: {trend['first_loss']:.4g} at the first step, "
                        f"{trend['last_steps_mean']:.4g} over the last {trend['window']} (>= {DIVERGE_RATIO:g}x where "
                        f"it started): lower the learning rate or clip the gradients")
    elif trend and trend["fell"] is False:
        warnings.append(f"the training loss did not fall: {trend['first_steps_mean']:.4f} over the first "
                        f"{trend['window']} steps, {trend['last_steps_mean']:.4f} over the last {trend['window']}")
    status = "diverging" if diverged else "not learning" if warnings else "learning"
    out = {"healthy": not warnings, "status": status, "warnings": warnings, "loss_trend": trend}
    fit = fit_check(trend, eval_loss)
    if fit:
        out["fit"] = fit
    out["notes"] = [f"overfitting: the training loss ended at {fit['train_loss']:.4f} (mean of the last "
                    f"{trend['window']} steps) but the evaluation loss is {fit['eval_loss']:.4f}: the model fits its "
                    f"training examples far better than unseen ones (fewer steps, more dropout or weight decay, or "
                    f"more data would narrow the gap)"] if fit and fit["overfitting"] else []
    if check:
        out["predictions"] = {k: v for k, v in check.items() if k != "warnings"}
    out["causes"] = likely_causes(context, check) if warnings else []
    return out


def report(health: Dict, task: str) -> None:
    """One WARNING per finding (with the likely causes), or one INFO line when the run looks healthy; one WARNING
    per note (the run stays healthy)."""
    if health["healthy"]:
        trend = health.get("loss_trend")
        detail = f"; loss {trend['first_steps_mean']:.4f} -> {trend['last_steps_mean']:.4f}" if trend else ""
        log.info("%s: the run is learning (no collapse found%s)", task, detail)
    else:
        causes = "; ".join(health["causes"]) or "none visible in the settings"
        for w in health["warnings"]:
            shout = "DIVERGING:" if w.startswith("the training loss diverged") else "NOT LEARNING?"
            log.warning("%s: %s %s. Likely causes: %s", task, shout, w, causes)
    for note in health.get("notes", []):
        log.warning("%s: %s", task, note)


def failure(health: Dict, task: str) -> Optional[NotLearning]:
    """What ``--fail_if_unhealthy`` raises for an unhealthy ``health`` (None when healthy): its warnings and
    causes in one message."""
    if health["healthy"]:
        return None
    causes = "; ".join(health["causes"]) or "none visible in the settings"
    return NotLearning(f"{task}: {health.get('status', 'not learning')} (--fail_if_unhealthy): "
                       f"{'; '.join(health['warnings'])}. "
                       f"Likely causes: {causes}")
