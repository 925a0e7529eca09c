"""Training loop, optimizer and strategies on a toy TaskModel (tests/train_toy.py).

Tolerances (float32, CPU): gradient accumulation vs one big batch and MirroredStrategy vs default agree to
1e-5 on the weights after a few Adam steps (summation order only); resume after an interruption is exact.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO

HERE = os.path.join(REPO, "tests")  # train_toy.py, imported (and run) as a script of its own
sys.path.insert(0, HERE)
from subprocess_util import finish  # noqa: E402
from train_toy import make_dataset_fn, make_model, max_diff, toy_data, weights  # noqa: E402

from xlnet_tf import optimization, training  # noqa: E402


def config(**kw):
    base = dict(learning_rate=1e-2, train_steps=3, progress=False, seed=11, jit_compile=False)
    base.update(kw)
    return training.TrainConfig(**base)


# --------------------------------------------------------------------------- optimizer pieces
def test_schedule():
    s = optimization.WarmupLinearDecay(1.0, train_steps=10, warmup_steps=4, min_lr_ratio=0.1)
    got = [float(s(i)) for i in (0, 2, 4, 7, 10, 20)]
    np.testing.assert_allclose(got, [0.0, 0.5, 1.0, 0.55, 0.1, 0.1], atol=1e-6)
    s2 = optimization.WarmupLinearDecay.from_config(s.get_config())
    assert float(s2(7)) == float(s(7))
    assert float(optimization.WarmupLinearDecay(2.0, 4)(0)) == 2.0  # no warmup


def test_weight_decay_uses_rule_and_per_variable_lr():
    model = make_model(dropout=0.0)()
    variables = model.trainable_variables
    opt = optimization.AdamW(learning_rate=0.1, weight_decay=0.5)
    mult = optimization.layer_decay_factors(model, variables, 0.5, "lr")
    decay = optimization.decay_flags(model, variables)
    opt.set_lr_multipliers(variables, mult)
    opt.set_decay_flags(variables, decay)
    before = [v.numpy() for v in variables]
    opt.apply([tf.zeros(v.shape) for v in variables], variables)  # zero gradients: only the decay moves weights
    for v, b, m, d in zip(variables, before, mult, decay):
        expect = b * (1 - 0.1 * 0.5 * m) if d else b
        np.testing.assert_allclose(v.numpy(), expect, rtol=1e-6, err_msg=v.path)
    names = {v.path.split("/")[-1]: d for v, d in zip(variables, decay)}
    assert names == {"embeddings": True, "kernel": True, "bias": False, "r_w_bias": True, "gamma": False,
                     "beta": False}
    by_depth = {model.variable_depth(v): m for v, m in zip(variables, mult)}
    assert by_depth == {0: 0.25, 1: 0.5, 2: 1.0, 3: 1.0}
    with pytest.raises(ValueError, match="no decay flag"):
        optimization.AdamW(weight_decay=0.1).apply([tf.zeros(v.shape) for v in variables], variables)


def test_balanced_groups_cover_every_index_once():
    sizes = [100, 3, 50, 50, 7, 1, 90]
    parts = optimization.balanced_groups(sizes, 2)
    assert sorted(i for p in parts for i in p) == list(range(len(sizes)))
    assert all(p == sorted(p) for p in parts)
    totals = sorted(sum(sizes[i] for i in p) for p in parts)
    assert totals == [150, 151]  # largest first into the lighter group
    assert optimization.balanced_groups([5, 5], 4) == [[0], [1]]  # never an empty group
    assert optimization.balanced_groups([5, 5, 5], 1) == [[0, 1, 2]]


@pytest.mark.slow
@pytest.mark.parametrize("bias_correction", [True, False])
def test_update_in_groups_is_apply_of_the_scaled_gradients(bias_correction):
    """AdamW.apply_in_groups (the Trainer's jit "update": one XLA cluster per group, run at once) gives the same
    weights, moments and step count as apply() on the clipped, layer-scaled gradients, bit for bit (float32:
    the same operations in the same order), over three steps with decay flags and per-variable LR factors. Each
    group's function is traced once, and another optimizer on another model of the same shapes reuses it."""
    optimization.group_update.cache_clear()
    model = make_model(dropout=0.0)()
    variables = model.trainable_variables
    decay, lr_mult = optimization.decay_flags(model, variables), optimization.layer_decay_factors(
        model, variables, 0.5, "lr")
    grad_mult = optimization.layer_decay_factors(model, variables, 0.8, "grad")
    assert len(set(grad_mult)) > 1 and len(set(lr_mult)) > 1

    def make():
        keras.utils.set_random_seed(3)
        m = make_model(dropout=0.0)()
        vs = m.trainable_variables
        opt = optimization.AdamW(learning_rate=optimization.WarmupLinearDecay(0.1, 10, 2), weight_decay=0.3,
                                 bias_correction=bias_correction)
        opt.set_decay_flags(vs, decay)
        opt.set_lr_multipliers(vs, lr_mult)
        opt.build(vs)
        return vs, opt

    (va, a), (vb, b) = make(), make()
    rng = np.random.default_rng(0)

    @tf.function(jit_compile=True)
    def reference(grads, scale):
        a.apply([g * scale * m if m != 1.0 else g * scale for g, m in zip(grads, grad_mult)], va)

    @tf.function
    def grouped(grads, scale):
        b.apply_in_groups(grads, vb, scale, grad_mult, groups=3)

    steps = [([tf.constant(rng.standard_normal(v.shape).astype(np.float32)) for v in va],
              tf.constant(0.25 + step, tf.float32)) for step in range(3)]
    for grads, scale in steps:
        reference(grads, scale)
        grouped(grads, scale)
    assert int(a.iterations.numpy()) == int(b.iterations.numpy()) == 3
    moved = max(float(np.max(np.abs(x.numpy() - y))) for x, y in zip(va, [v.numpy() for v in make()[0]]))
    assert moved > 1e-3  # the steps moved the weights
    for x, y in zip(list(va) + a._momentums + a._velocities, list(vb) + b._momentums + b._velocities):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)
    fns = [optimization.group_update(spec) for _, spec in b.groups(vb, grad_mult, 3)]
    assert [f.experimental_get_tracing_count() for f in fns] == [1, 1, 1]  # built once, reused by every step
    vc, c = make()

    @tf.function
    def another(grads, scale):
        c.apply_in_groups(grads, vc, scale, grad_mult, groups=3)

    for grads, scale in steps:
        another(grads, scale)
    assert [f.experimental_get_tracing_count() for f in fns] == [1, 1, 1]  # the same traces (and XLA executables)
    for x, y in zip(list(vb) + b._momentums + b._velocities, list(vc) + c._momentums + c._velocities):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


def _one_step_delta(learning_rate=1e-3, **kw):
    """[((depth, path), weight change)] after one step, in the (stable) order of the trainable variables."""
    kw.setdefault("layer_decay_mode", "lr")
    tr = training.Trainer(make_model(dropout=0.0), make_dataset_fn(8, shuffle=False),
                          config(train_steps=1, learning_rate=learning_rate, **kw))
    before = [v.numpy() for v in tr.train_vars]
    tr.train()
    return [((tr.model.variable_depth(v), v.path), v.numpy() - b) for v, b in zip(tr.train_vars, before)]


def _ratios(num, den, min_den):
    """{(depth, path): ratios of the weight changes where the reference change is above min_den}."""
    out = {}
    for (key, d1), (_, d2) in zip(den, num):
        mask = np.abs(d1) > min_den
        if mask.any():
            out[key] = d2[mask] / d1[mask]
    assert sorted({depth for depth, _ in out}) == [0, 1, 2, 3]
    return out


@pytest.mark.slow
def test_layerwise_decay_lr_mode_vs_original_grad_mode():
    rate, n = 0.5, 2
    ref = _one_step_delta()

    def grad_factor(depth, path):  # toy blocks: ff and LayerNorm are layer-scoped, r_w_bias (attention bias) not
        return rate ** (n - depth) if 1 <= depth <= n and "r_w_bias" not in path else 1.0

    # lr mode: the first Adam step moves each weight by ~lr, so the factor shows directly
    for (depth, path), r in _ratios(_one_step_delta(lr_layer_decay_rate=rate), ref, 5e-4).items():
        np.testing.assert_allclose(r, rate ** max(n - depth, 0), rtol=1e-3, err_msg=path)
    # grad mode: Adam normalises the scaled gradient away (the original's near no-op)
    for (depth, path), r in _ratios(_one_step_delta(lr_layer_decay_rate=rate, layer_decay_mode="grad"), ref,
                                    5e-4).items():
        factor = grad_factor(depth, path)
        assert abs(np.median(r) - 1.0) < 2e-2 and r.min() > factor - 1e-3 and r.max() < 1 + 1e-3, (path, r)
    # ... but the gradients ARE scaled: with a huge epsilon (and lr) Adam's first step is ~SGD
    sgd = dict(adam_epsilon=1e3, learning_rate=1e3)
    big = _one_step_delta(**sgd)
    for (depth, path), r in _ratios(_one_step_delta(lr_layer_decay_rate=rate, layer_decay_mode="grad", **sgd),
                                    big, 1e-4).items():
        np.testing.assert_allclose(r, grad_factor(depth, path), rtol=1e-3, err_msg=path)


def test_num_trainable_layers_freezes_bottom_without_slots():
    tr = training.Trainer(make_model(), make_dataset_fn(4), config(num_trainable_layers=1, train_steps=2))
    model = tr.model
    assert {model.variable_depth(v) for v in tr.train_vars} == {2, 3}
    frozen = [v for v in model.trainable_variables if model.variable_depth(v) < 2]
    before = [v.numpy() for v in frozen]
    moving = [v.numpy() for v in tr.train_vars]
    tr.train()
    for v, b in zip(frozen, before):
        assert np.array_equal(v.numpy(), b), v.path
    assert all(not np.array_equal(v.numpy(), b) for v, b in zip(tr.train_vars, moving) if "gamma" not in v.path)
    assert len(tr.optimizer._momentums) == len(tr.train_vars)
    slot_names = " ".join(v.path for v in tr.optimizer.variables)
    assert "word_embedding" not in slot_names and "layer_0" not in slot_names and "layer_1" in slot_names


# --------------------------------------------------------------------------- loop
@pytest.mark.slow
def test_grad_accumulation_equals_big_batch_under_xla():
    big = training.train(make_model(dropout=0.0), make_dataset_fn(8, shuffle=False), config())
    acc = training.Trainer(make_model(dropout=0.0), make_dataset_fn(2, shuffle=False),
                           config(grad_accum_steps=4, jit_compile=True))
    assert acc.jit == "step"
    acc_res = acc.train()
    assert max_diff(weights(big.model), weights(acc_res.model)) < 1e-5
    np.testing.assert_allclose([l for _, l in big.history], [l for _, l in acc_res.history], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_jit_modes_give_the_same_update(precision):
    """Whole-step XLA, XLA on the optimizer update only, and no XLA: same weights (no dropout; clipping and
    per-layer LR on, so every part of the update runs)."""
    kw = dict(clip_norm=0.05, lr_layer_decay_rate=0.8, weight_decay=0.01, precision=precision)
    results = {mode: training.train(make_model(dropout=0.0), make_dataset_fn(4, shuffle=False),
                                    config(jit_compile=mode, **kw)) for mode in ("off", "update", "step")}
    ref = weights(results["off"].model)
    tol = 1e-5 if precision == "float32" else 5e-4  # measured: 1e-7 and 1e-4
    for mode in ("update", "step"):
        assert max_diff(ref, weights(results[mode].model)) < tol, mode
    keras.utils.set_random_seed(11)  # the trainer's seed: the initial weights
    moved = max_diff(ref, weights(make_model(dropout=0.0)()))
    assert moved > 10 * tol  # the comparison is not vacuous
    with pytest.raises(ValueError, match="jit_compile"):
        config(jit_compile="always")


def test_default_jit_choice():
    cpu = tf.distribute.get_strategy()
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("the CPU choices; this machine has a GPU")
    assert training.default_jit(cpu) == "update" == training.default_jit(cpu, "mixed_bfloat16")
    assert training.default_jit(cpu, "mixed_float16") == "step"  # no fast float16 matmul on CPU outside XLA

    class TwoReplicas:
        num_replicas_in_sync = 2

    assert training.default_jit(TwoReplicas()) == "off"


@pytest.mark.slow
def test_resume_after_interruption_is_exact(tmp_path, capsys):
    """Default strategy, auto XLA (the optimizer update on CPU), dropout, 2 micro-batches, checkpointed tf.data
    iterator ("skip": see Mirrored)."""
    kw = dict(train_steps=6, save_steps=3, log_steps=2, progress=True, jit_compile=None, grad_accum_steps=2)
    full = training.train(make_model(), make_dataset_fn(4), config(model_dir=str(tmp_path / "full"), **kw))
    cut_dir = str(tmp_path / "cut")
    training.Trainer(make_model(), make_dataset_fn(4), config(model_dir=cut_dir, **kw)).train(stop_at=4)
    assert tf.train.latest_checkpoint(cut_dir).endswith("ckpt-3")
    # an interrupted later save leaves partial files but never touches the `checkpoint` state file
    for suffix in (".index", ".data-00000-of-00001"):
        with open(os.path.join(cut_dir, "ckpt-5" + suffix), "wb") as f:
            f.write(b"\0partial")
    resumed_tr = training.Trainer(make_model(), make_dataset_fn(4), config(model_dir=cut_dir, **kw))
    assert resumed_tr.restored_from.endswith("ckpt-3") and resumed_tr.data_resume == "iterator"
    assert resumed_tr.jit == training.default_jit(tf.distribute.get_strategy())
    resumed = resumed_tr.train()
    assert [s for s, _ in resumed.history] == [4, 5, 6]
    assert max_diff(weights(full.model), weights(resumed.model)) <= 1e-6
    assert [l for _, l in resumed.history] == [l for s, l in full.history if s > 3]
    # summaries and progress
    events = glob.glob(str(tmp_path / "full" / "train" / "events.out.tfevents.*"))
    tags = set()
    for path in events:
        for record in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in record.summary.value)
    assert {"loss", "learning_rate", "grad_norm", "steps_per_sec"} <= tags
    err = capsys.readouterr().err
    assert "step 2/6 loss" in err and "steps/s ETA" in err and "step 1/6" not in err


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_runs_and_restores_policy(precision):
    tr = training.Trainer(make_model(), make_dataset_fn(4),
                          config(precision=precision, train_steps=3, initial_loss_scale=2.0 ** 10))
    assert tr.model.blocks[0].ff.compute_dtype == precision.split("_")[1]
    assert keras.mixed_precision.global_policy().name == "float32"
    res = tr.train()
    assert all(np.isfinite(w).all() for w in weights(res.model))
    assert all(np.isfinite(l) for _, l in res.history)
    if precision == "mixed_float16":
        # every step either updated or (overflow) halved the scale; at least one update happened
        skipped = int(np.log2(2.0 ** 10 / float(tr.outer_optimizer.dynamic_scale.numpy())))
        assert int(tr.optimizer.iterations.numpy()) + skipped == 3 and skipped < 2


@pytest.mark.slow
def test_float16_overflow_skips_update():
    tr = training.Trainer(make_model(), make_dataset_fn(4),
                          config(precision="mixed_float16", train_steps=1, initial_loss_scale=2.0 ** 100))
    before = weights(tr.model)
    tr.train()
    assert max_diff(before, weights(tr.model)) == 0.0
    assert int(tr.optimizer.iterations.numpy()) == 0
    assert float(tr.outer_optimizer.dynamic_scale.numpy()) == 2.0 ** 99


@pytest.mark.slow
def test_predict_default_strategy():
    model = make_model()()
    data = {k: v[:10] for k, v in toy_data().items()}
    out = training.predict(model, tf.data.Dataset.from_tensor_slices(data).batch(4),
                           output_fn=lambda f, o: {"logits": o["logits"], "label": f["label"]})
    assert out["logits"].shape == (10, 3)
    np.testing.assert_allclose(out["logits"], model(data)["logits"].numpy(), atol=1e-6)
    assert np.array_equal(out["label"], data["label"])


def test_predict_traces_the_model_once_for_batches_of_any_shape():
    """Batches padded to their own longest row (and a short last batch) run through one trace of the model, not
    one per shape; rows come back in order, each its own sum."""
    traces = []

    class Summer(keras.Model):
        def call(self, features, training=False):
            traces.append(1)
            return {"sum": tf.reduce_sum(features["x"], 1)}

    lengths = (3, 5, 7, 2, 9, 4, 6)  # batches of 2: lengths 5, 7, 9 and a last batch of one row of 6
    ds = tf.data.Dataset.from_generator(lambda: ({"x": np.ones([n], np.float32)} for n in lengths),
                                        output_signature={"x": tf.TensorSpec([None], tf.float32)}).padded_batch(2)
    out = training.predict(Summer(), ds)
    np.testing.assert_array_equal(out["sum"], np.array(lengths, np.float32))
    assert len(traces) == 1


def test_predict_float16_model_on_cpu():
    """A mixed_float16 model predicts through XLA on CPU (graph-mode float16 has no fast CPU kernels): same
    outputs as the model called eagerly, within float16 rounding; the partial last batch recompiles fine."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = make_model()()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert model.dtype_policy.name == "mixed_float16"
    data = {k: v[:10] for k, v in toy_data().items()}
    out = training.predict(model, tf.data.Dataset.from_tensor_slices(data).batch(4))
    assert out["logits"].shape == (10, 3)
    np.testing.assert_allclose(out["logits"], model(data)["logits"].numpy(), atol=5e-3)


def test_the_loop_and_predict_iterate_with_autotune_off(tmp_path, monkeypatch):
    """The training loop and ``predict`` read their datasets through ``datasets.for_iteration`` (tf.data's
    autotuning off: deleting an autotuned iterator waits out its optimisation thread's sleep, up to 60 s;
    benchmarks/iterator_delete.py), and what it returns has autotuning off."""
    from xlnet_tf import datasets

    seen, real = [], datasets.for_iteration

    def recorded(ds):
        seen.append(real(ds))
        return seen[-1]

    monkeypatch.setattr(datasets, "for_iteration", recorded)
    training.train(make_model(), make_dataset_fn(4), config(model_dir=str(tmp_path), train_steps=1))
    assert len(seen) == 1
    data = tf.data.Dataset.from_tensor_slices({k: v[:4] for k, v in toy_data().items()}).batch(4)
    training.predict(make_model()(), data)
    assert len(seen) == 2 and all(ds.options().autotune.enabled is False for ds in seen)


# --------------------------------------------------------------------------- strategies (subprocesses)
def _run(args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    return subprocess.Popen([sys.executable, os.path.join(HERE, "train_toy.py")] + args, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _report(proc, timeout):
    out, err = finish(proc, timeout)
    lines = [l for l in out.splitlines() if l.startswith("REPORT ")]
    assert lines, err[-3000:]
    return json.loads(lines[-1][len("REPORT "):])


@pytest.mark.slow
def test_mirrored_strategy_matches_default():
    """2 logical CPUs: same weights as the default strategy (with accumulation, layer-wise LR, weight decay),
    predict with a partial last batch, exact resume in "skip" mode, and a clear error without a TPU."""
    rep = _report(_run(["mirrored"]), 240)
    for name in ("mirrored_b4", "mirrored_b2_k2"):
        assert rep[name]["weights"] < 1e-5 and rep[name]["loss"] < 1e-5, (name, rep[name])
    assert rep["predict"]["rows"] == 10 and rep["predict"]["diff"] < 1e-5
    assert rep["resume"]["steps"] == [3, 4] and rep["resume"]["weights"] <= 1e-6, rep["resume"]
    assert rep["tpu"].startswith("no TPU available"), rep["tpu"]


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_multi_worker_mirrored_two_local_workers(tmp_path):
    try:
        ports = _free_ports(2)
    except OSError as err:
        pytest.skip(f"cannot bind loopback ports: {err}")
    procs = [_run(["worker", str(ports[0]), str(ports[1]), str(i), str(tmp_path)]) for i in range(2)]
    reps = [_report(p, 180) for p in procs]
    assert reps[0]["replicas"] == 2
    assert len(reps[0]["losses"]) == 3 and reps[0]["losses"] == reps[1]["losses"]
    assert reps[0]["checksum"] == reps[1]["checksum"]
    # the chief (worker 0) keeps the checkpoints and the loss history; the other worker's copies are deleted
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-3")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index",
                                            "ckpt-3.data-00000-of-00001", "ckpt-3.index", "train",
                                            "train_history.json"]


@pytest.mark.slow
def test_checkpoint_of_another_shape_is_one_clear_error(tmp_path):
    from xlnet_tf.tf_checkpoint import CheckpointError

    training.train(make_model(), make_dataset_fn(4), config(model_dir=str(tmp_path), train_steps=1))
    with pytest.raises(CheckpointError, match="ckpt-1: this checkpoint does not fit the model being trained"):
        training.Trainer(make_model(n_layer=3), make_dataset_fn(4), config(model_dir=str(tmp_path), train_steps=2))
