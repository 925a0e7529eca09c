"""A diverging run (issue #52): a loss that stops being finite ends training in one ``error:`` line that keeps the
last finite checkpoint and exports nothing; a loss that ends far above where it started is reported as divergence
by the health check (tasks/health.py). Through run_classifier's ``main`` in-process on the suite's tiny model."""

import json
import math

import pytest

import run_classifier
from tests.cli_util import call, refused
from tests.conftest import shared_path


def clf_args(glue, out, *extra, steps=4):
    return ["--task=SST-2", f"--data_dir={glue / 'SST-2'}", f"--model_config_path={glue / 'cfg.json'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            "--max_seq_length=32", "--train_batch_size=8", f"--train_steps={steps}", "--progress=false",
            "--do_train", "--do_eval", f"--export_dir={out / 'export'}", *extra]


@pytest.mark.slow
def test_non_finite_loss_is_one_line_keeping_the_last_finite_checkpoint(glue, tmp_path):
    import tensorflow as tf

    out = tmp_path / "out"
    line = refused(run_classifier, *clf_args(glue, out, "--learning_rate=1e30", "--clip=0", "--save_steps=1"))
    assert line.startswith("error: training diverged: loss nan at step 2, the last finite loss 0.69"), line
    assert "the last checkpoint (" in line and "ckpt-1) is kept and nothing is exported" in line, line
    assert "lower --learning_rate (now 1e+30) or clip the gradients (--clip=1.0; now off)" in line, line
    kept = tf.train.latest_checkpoint(str(out / "model"))
    assert kept.endswith("ckpt-1"), kept  # the step whose loss was nan is not saved
    reader = tf.train.load_checkpoint(kept)
    assert all(math.isfinite(float(abs(reader.get_tensor(n)).max())) for n, s in reader.get_variable_to_shape_map()
               .items() if "iterator" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH" and s)
    assert not (out / "export").exists() and not (out / "eval_results.json").exists()


@pytest.mark.slow
def test_a_loss_that_ends_far_above_its_start_is_divergence(glue, tmp_path):
    out = tmp_path / "out"
    r = call(run_classifier, *clf_args(glue, out, "--learning_rate=1e6", "--clip=0", "--fail_if_unhealthy",
                                       steps=20))
    assert r.code == 3, r.stderr[-3000:]
    assert r.error.startswith("sst-2: diverging (--fail_if_unhealthy): "), r.error
    assert "the training loss diverged: 0.69" in r.error and "at the first step" in r.error, r.error
    assert any(ln.startswith("W") and "DIVERGING: the training loss diverged" in ln for ln in r.stderr.splitlines())
    health = json.loads((out / "eval_results.json").read_text())["health"]
    assert health["status"] == "diverging" and not health["healthy"], health
    assert health["loss_trend"]["diverged"] and health["loss_trend"]["last_steps_mean"] > 1000, health
    assert not (out / "export").exists()


def test_the_rule_in_numbers():
    from xlnet_tf.tasks import health

    rising = [(i + 1, 0.69 * 10 ** i) for i in range(5)]
    trend = health.loss_trend(rising)
    assert trend["diverged"] and not trend["judged"]  # short, yet a loss that multiplies is judged
    assert health.assess(None, trend, {})["status"] == "diverging"
    falling = [(i + 1, 0.69 - 0.01 * i) for i in range(30)]
    assert health.assess(None, health.loss_trend(falling), {})["status"] == "learning"
    flat = [(i + 1, 0.69) for i in range(30)]
    assert health.assess(None, health.loss_trend(flat), {})["status"] == "not learning"
