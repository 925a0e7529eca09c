"""The backbone benchmark's goal verdict (benchmarks/backbone.py): which rows are compared and the bootstrap
interval of the ratio. Pure Python; the benchmark itself is run by hand (PERFORMANCE.md "Backbone speed")."""

import os
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import backbone  # noqa: E402


def _row(impl, times, mode="infer", batch=8, seq=128):
    med = sorted(times)[len(times) // 2]
    return {"mode": mode, "batch": batch, "seq": seq, "impl": impl, "times_s": list(times),
            "tokens_per_s": batch * seq / med}


def test_ratio_interval_brackets_the_ratio_of_medians():
    ours = [1.00, 1.05, 0.95, 1.10, 0.90, 1.02, 0.98]
    peer = [t * 1.4 for t in ours]
    lo, hi = backbone.ratio_interval(ours, peer)
    assert lo <= 1.4 <= hi and hi - lo > 0.05  # the scatter of one side alone widens the interval
    assert backbone.ratio_interval([1.0] * 5, [1.3] * 5) == pytest.approx((1.3, 1.3))
    assert backbone.ratio_interval(ours, peer) == (lo, hi)  # seeded: the same run gives the same interval


def test_goal_summary_uses_the_fastest_peer_and_reports_the_interval():
    rows = [_row("tf", [0.70, 0.72, 0.71, 0.69, 0.73]), _row("tf_xla", [0.80] * 5),
            _row("mg", [0.95, 0.97, 0.96, 0.94, 0.98]), _row("mg_noxla", [1.3] * 5),
            _row("torch", [1.2] * 5), _row("torch1", [1.5] * 5)]
    (g,) = backbone.goal_summary(rows)
    assert g["best_ours"] == "tf" and g["best_peer_impl"] == "mg" and g["best_peer_source"] == "measured"
    assert g["ratio_vs_best_peer_same_run"] == pytest.approx(0.96 / 0.71)
    lo, hi = g["ratio_interval_90"]
    assert lo <= g["ratio_vs_best_peer_same_run"] <= hi
    assert g["goal_met_same_run"] and g["goal_met_at_lower_bound"] == (lo >= 1.3)
    # training wants 1.5x: the same times miss it
    (t,) = backbone.goal_summary([dict(r, mode="train") for r in rows])
    assert not t["goal_met_same_run"] and not t["goal_met_at_lower_bound"]


def test_goal_summary_without_model_garden_has_no_interval():
    rows = [_row("tf", [0.7] * 3), _row("torch", [1.0] * 3)]
    (g,) = backbone.goal_summary(rows)
    assert g["best_peer_source"] == "estimate" and "ratio_interval_90" not in g
