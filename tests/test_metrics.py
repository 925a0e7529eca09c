"""Metrics: hand-computed cases, numpy cross-checks, and scipy/sklearn when installed."""

import math

import numpy as np
import pytest

from xlnet_tf.tasks.classification.metrics import (accuracy, compute_metrics, error_rate, f1, matthews_corrcoef, pearson,
                                          rankdata, spearman)
from xlnet_tf.tasks.classification.registry import get_task


def test_hand_computed():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert error_rate([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    # tp=2, 3 predicted positives, 3 true positives -> 2*2/6
    assert f1([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(2 / 3)
    # tp=2 tn=1 fp=1 fn=1 -> (2*1 - 1*1) / sqrt(3*3*2*2)
    assert matthews_corrcoef([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(1 / 6)
    # 3 classes: confusion diag 2,1,2 and one 1->2 error: (5*6-12)/sqrt(22*24)
    assert matthews_corrcoef([0, 0, 1, 1, 2, 2], [0, 0, 1, 2, 2, 2]) == pytest.approx(18 / math.sqrt(528))
    assert pearson([1, 2, 3, 4, 5], [2, 4, 5, 4, 5]) == pytest.approx(6 / math.sqrt(60))
    # y ranks with ties averaged: [1, 2.5, 4.5, 2.5, 4.5]
    assert spearman([1, 2, 3, 4, 5], [2, 4, 5, 4, 5]) == pytest.approx(7 / math.sqrt(90))
    np.testing.assert_array_equal(rankdata([10, 20, 10, 30, 20, 20]), [1.5, 4, 1.5, 6, 4, 4])


def test_degenerate_cases():
    assert f1([0, 0], [0, 0]) == 0.0
    assert matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    assert matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="3 labels but 2 predictions"):
        accuracy([0, 1, 1], [0, 1])


def test_random_against_numpy_forms():
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    tp, tn = np.sum((y == 1) & (p == 1)), np.sum((y == 0) & (p == 0))
    fp, fn = np.sum((y == 0) & (p == 1)), np.sum((y == 1) & (p == 0))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert matthews_corrcoef(y, p) == pytest.approx(mcc)
    x, z = rng.normal(size=300), rng.normal(size=300)
    assert pearson(x, z) == pytest.approx(np.corrcoef(x, z)[0, 1])
    xi, zi = np.round(x), np.round(z)  # many ties: brute-force average ranks
    def brute(v):
        return np.array([np.sum(v < e) + (np.sum(v == e) + 1) / 2 for e in v])
    np.testing.assert_allclose(rankdata(xi), brute(xi))
    assert spearman(xi, zi) == pytest.approx(np.corrcoef(brute(xi), brute(zi))[0, 1])


def test_against_scipy_sklearn():
    stats = pytest.importorskip("scipy.stats")
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    y, p = rng.integers(0, 3, 500), rng.integers(0, 3, 500)
    assert matthews_corrcoef(y, p) == pytest.approx(skm.matthews_corrcoef(y, p))
    yb, pb = y % 2, p % 2
    assert f1(yb, pb) == pytest.approx(skm.f1_score(yb, pb))
    x, z = np.round(rng.normal(size=400), 1), np.round(rng.normal(size=400), 1)
    assert pearson(x, z) == pytest.approx(stats.pearsonr(x, z)[0])
    assert spearman(x, z) == pytest.approx(stats.spearmanr(x, z)[0])


def test_compute_metrics_per_task():
    m = compute_metrics(get_task("mrpc"), ["1", "1", "0", "0", "1"], [1, 0, 0, 1, 1])
    assert set(m) == {"accuracy", "f1"} and m["f1"] == pytest.approx(2 / 3) and m["accuracy"] == 0.6
    logits = np.array([[0, 1], [1, 0], [1, 0], [0, 1], [0, 1]])
    m = compute_metrics(get_task("CoLA"), [1, 1, 0, 0, 1], logits)
    assert set(m) == {"mcc", "accuracy"} and m["mcc"] == pytest.approx(1 / 6)
    m = compute_metrics(get_task("sts-b"), [1, 2, 3, 4, 5], [2, 4, 5, 4, 5])
    assert set(m) == {"pearson", "spearman"} and m["spearman"] == pytest.approx(7 / math.sqrt(90))
    m = compute_metrics(get_task("imdb"), ["neg", "pos", "pos", "neg"], ["neg", "pos", "neg", "neg"])
    assert m == {"accuracy": 0.75, "error_rate": 0.25}
    assert compute_metrics(get_task("rte"), ["entailment"], [0]) == {"accuracy": 1.0}
    # positive class is the label "1", whatever its id
    from xlnet_tf.tasks.classification.text import GenericTask

    t = GenericTask(labels=["1", "0"])
    assert compute_metrics(t, ["1", "0", "1"], ["1", "1", "0"])["f1"] == pytest.approx(0.5)
