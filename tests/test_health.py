"""tasks/health.py: the checks that say when a run is not learning (pure numpy; the CLI runs that force a
collapse and the healthy runs that must not warn are in test_run_classifier.py / test_quickstart.py)."""

import numpy as np

from xlnet_tf.tasks import health
from xlnet_tf.tasks.runner import health_context
from xlnet_tf.train_config import auto_bias_correction
from xlnet_tf.training import TrainConfig


def test_loss_trend_windows_and_verdict():
    falling = [(i + 1, 2.0 - i / 100) for i in range(100)]
    t = health.loss_trend(falling)
    assert t["window"] == 10 and t["judged"] and t["fell"]
    assert abs(t["first_steps_mean"] - np.mean([2.0 - i / 100 for i in range(10)])) < 1e-4
    flat = [(i + 1, 1.79 + 0.05 * np.sin(i)) for i in range(600)]
    assert health.loss_trend(flat)["fell"] is False
    short = health.loss_trend([(1, 2.0), (2, 2.0)])
    assert short["judged"] is False and short["fell"] is None
    assert health.loss_trend([]) is None


def test_label_collapse_needs_one_label_over_95_percent_and_gold_under_80():
    gold = np.array([0] * 50 + [1] * 50)
    collapsed = health.label_check(np.zeros(100, int), gold, ["neg", "pos"])
    assert collapsed["predicted"] == {"neg": 1.0, "pos": 0.0} and collapsed["gold"] == {"neg": 0.5, "pos": 0.5}
    assert len(collapsed["warnings"]) == 1 and "'neg'" in collapsed["warnings"][0]
    healthy = health.label_check(np.r_[np.zeros(60, int), np.ones(40, int)], gold, ["neg", "pos"])
    assert healthy["warnings"] == []
    # a task whose gold is 90% one label may predict it 96% of the time without a warning
    skewed = np.array([0] * 90 + [1] * 10)
    assert health.label_check(np.r_[np.zeros(96, int), np.ones(4, int)], skewed, ["a", "b"])["warnings"] == []


def test_regression_and_null_checks():
    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, 200)
    assert health.regression_check(gold + rng.normal(0, 1, 200), gold)["warnings"] == []
    flat = health.regression_check(np.full(200, 2.5) + rng.normal(0, 0.01, 200), gold)
    assert len(flat["warnings"]) == 1 and flat["gold_std"] > 1
    gold_null = np.array([True, False] * 50)
    assert health.null_check(np.ones(100, bool), gold_null)["warnings"]
    assert health.null_check(np.zeros(100, bool), gold_null)["warnings"]
    assert health.null_check(gold_null[::-1], gold_null)["warnings"] == []


def test_assess_names_the_likely_causes():
    check = health.add_input_check(health.label_check(np.zeros(10, int), np.array([0, 1] * 5), ["a", "b"]),
                                   np.array([2] * 10))
    ctx = {"learning_rate": 1e-3, "bias_correction": False, "weight_decay": 0.01, "pretrained": False,
           "train_steps": 100, "warmup_steps": 200}
    out = health.assess(check, health.loss_trend([(i, 1.0) for i in range(1, 51)]), ctx)
    assert not out["healthy"] and len(out["warnings"]) == 2
    causes = " ".join(out["causes"])
    for words in ("bias correction is off", "no --init_checkpoint", "warmup_steps=200", "hold no text"):
        assert words in causes, (words, causes)
    assert out["predictions"]["share_without_text"] == 1.0
    # fine-tuning at a rate far above the published ones
    assert "far above" in " ".join(health.likely_causes({"learning_rate": 1e-3, "pretrained": True}))
    ok = health.assess(health.label_check(np.array([0, 1] * 5), np.array([0, 1] * 5), ["a", "b"]), None, ctx)
    assert ok["healthy"] and ok["warnings"] == [] and ok["causes"] == []


def test_bias_correction_auto_rule():
    # fine-tuning pretrained weights: the original's rule (AdamWeightDecay has no bias correction)
    assert auto_bias_correction(0.01, pretrained=True) is False
    assert auto_bias_correction(0.0, pretrained=True) is True
    # from random initialisation: always on
    assert auto_bias_correction(0.01, pretrained=False) is True
    assert auto_bias_correction(0.0, pretrained=False) is True
    ctx = health_context(TrainConfig(weight_decay=0.01), init_checkpoint="ckpt")
    assert ctx["bias_correction"] is False and ctx["pretrained"] is True


def test_train_config_resolves_its_options_once():
    """"auto" bias correction by the backbone's start (run_common passes --init_checkpoint's presence), and the
    flags' sentinels: a clip <= 0, a negative num_trainable_layers, the jit names."""
    assert TrainConfig(adam_bias_correction="auto", weight_decay=0.01, pretrained=False).adam_bias_correction is True
    assert TrainConfig(adam_bias_correction="auto", weight_decay=0.01, pretrained=True).adam_bias_correction is False
    assert TrainConfig(adam_bias_correction="true", weight_decay=0.01).adam_bias_correction is True
    c = TrainConfig(clip_norm=0.0, num_trainable_layers=-1, jit_compile="false")
    assert (c.clip_norm, c.num_trainable_layers, c.jit_compile) == (None, None, "off")
    assert TrainConfig(jit_compile="auto").jit_compile is None and TrainConfig(jit_compile=True).jit_compile == "step"
    assert abs(float(TrainConfig(learning_rate=1e-3, warmup_steps=10).schedule()(5)) - 5e-4) < 1e-9


def test_history_file_covers_every_step_of_a_resumed_run(tmp_path):
    """train_history.json (what the loss trend reads): a resumed process replaces the steps from its first one
    on and keeps the earlier ones; a process with nothing left to train keeps the file (it used to empty it,
    and a rerun after a kill during the export then reported no loss trend)."""
    import json

    from xlnet_tf.training import write_history

    path = str(tmp_path / "train_history.json")
    write_history(path, [(1, 2.0), (2, 1.9), (3, 1.8), (4, 1.7)])  # killed after step 4 (checkpoint at 3)
    write_history(path, [(4, 1.75), (5, 1.6)])
    assert json.load(open(path)) == [[1, 2.0], [2, 1.9], [3, 1.8], [4, 1.75], [5, 1.6]]
    write_history(path, [])
    assert len(json.load(open(path))) == 5


def test_overfitting_is_a_note_not_a_warning():
    """The demo's numbers (training loss 0.0097 over its last steps, dev loss 0.74): the run is healthy and the
    health block says it overfits; a run whose losses agree gets no note."""
    history = [(i + 1, 1.8 * (1 - i / 600) + 0.0097) for i in range(600)]
    history[-60:] = [(s, 0.0097) for s, _ in history[-60:]]
    trend = health.loss_trend(history)
    out = health.assess(health.label_check(np.array([0, 1] * 5), np.array([0, 1] * 5), ["a", "b"]), trend,
                        {"pretrained": False, "learning_rate": 1e-3}, eval_loss=0.74)
    assert out["healthy"] and out["warnings"] == [] and out["causes"] == []
    assert out["fit"] == {"train_loss": 0.0097, "eval_loss": 0.74, "overfitting": True}
    assert len(out["notes"]) == 1 and out["notes"][0].startswith("overfitting: the training loss ended at 0.0097")
    assert health.failure(out, "demo") is None  # --fail_if_unhealthy does not fail an overfitting run
    close = health.assess(None, trend, {"pretrained": True}, eval_loss=0.02)
    assert close["fit"]["overfitting"] is False and close["notes"] == []
    assert "fit" not in health.assess(None, trend, {"pretrained": True})  # no evaluation loss, no fit
    flat = health.assess(None, health.loss_trend([(i, 1.0) for i in range(1, 51)]), {"pretrained": True})
    failure = health.failure(flat, "sst-2")
    assert isinstance(failure, health.NotLearning) and str(failure).startswith(
        "sst-2: not learning (--fail_if_unhealthy): the training loss did not fall")
    # pretraining passes no "pretrained": the fine-tuning causes (learning rate ranges, no checkpoint) stay out
    assert health.likely_causes({"learning_rate": 1e-5, "train_steps": 10, "warmup_steps": 20}) == [
        "--warmup_steps=20 >= --train_steps=10: the peak learning rate is never reached"]
