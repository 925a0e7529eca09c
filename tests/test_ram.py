"""xlnet_tf.ram: the estimator's arithmetic on known cases, against the real models' variables, and its CLI.

The measured side (allocator / XLA peaks of real training steps) lives in benchmarks/memory_levers.py; here only
fast checks: parameter counts equal the real models' (Base/Large built without allocating their weights),
trainable subsets equal what the trainer selects, and each lever moves the estimate the way the model says.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from xlnet_tf import ram
from xlnet_tf.config import XLNetConfig
from xlnet_tf.ram import (HeadSize, backbone_param_counts, block_activations, block_param_count, cli_head, estimate,
                          main, trainable_param_counts)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _count(weights) -> int:
    return int(sum(int(np.prod(w.shape)) for w in weights))


@contextlib.contextmanager
def _shapes_only():
    """Variables with shapes and no values (``keras.StatelessScope(initialize_variables=False)``), forgotten on
    exit: Keras keeps such variables in a process-wide list and initialises all of them at the next model built
    anywhere in the process (XLNet-Base's and -Large's 477M weights: 5-15 s and 1.9 GB in whatever test came next)."""
    import keras
    from keras.src.backend.common import global_state

    pending = list(global_state.get_global_attribute("uninitialized_variables") or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute("uninitialized_variables", pending)


# --------------------------------------------------------------------------- parameters vs the real models
@pytest.mark.parametrize("preset,expected", [("base", 116_750_338), ("large", 360_300_802)])
def test_backbone_count_equals_real_model(preset, expected):
    from keras.src.backend.common import global_state

    from xlnet_tf.modeling import XLNetModel

    cfg = XLNetConfig.preset(preset)
    with _shapes_only():  # no 1.4 GB of Large weights
        model = XLNetModel(cfg)
    assert not global_state.get_global_attribute("uninitialized_variables")  # none left for the next build
    assert model.count_params() == expected
    assert backbone_param_counts(cfg)["total"] == expected
    e = estimate(cfg, 512, 1)
    assert e["param_groups"]["total"] == expected
    # float32 variables (+ the int64 [2] dropout seed)
    assert e["parameters"] == 4 * (e["param_count"] - 2) + 16


def test_tied_biases_count_equals_real_model():
    from xlnet_tf.modeling import XLNetModel

    cfg = XLNetConfig.preset("tiny", untie_r=False)
    with _shapes_only():
        model = XLNetModel(cfg)
    assert backbone_param_counts(cfg)["total"] == model.count_params()
    assert backbone_param_counts(cfg)["shared_r_biases"] == 3 * cfg.n_head * cfg.d_head


def _features(seq, squad=False):
    f = {"input_ids": np.ones((1, seq), np.int32), "segment_ids": np.zeros((1, seq), np.int32),
         "padding_mask": np.ones((1, seq), np.int32), "label": np.zeros((1,), np.int32)}
    if squad:
        f.update(p_mask=np.zeros((1, seq), np.float32), cls_index=np.array([seq - 1], np.int32),
                 start_position=np.array([1], np.int32), end_position=np.array([2], np.int32),
                 is_impossible=np.zeros((1,), np.float32))
    return f


def _task_model(cfg, head):
    from xlnet_tf.task_model import TaskModel

    model = TaskModel(cfg, head, seed=0)
    model.build_with(_features(8, squad=head.name == "squad_head"))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [(), (48, 32)])
def test_classification_head_count(hidden):
    """The head's self-description (``ClassificationHead.size``) and the CLI's --head=classification give the
    built head's weights."""
    from xlnet_tf.heads.classification import ClassificationHead

    cfg = XLNetConfig.preset("tiny")
    model = _task_model(cfg, ClassificationHead(cfg.d_model, 3, hidden_sizes=hidden))
    own = ClassificationHead.size(cfg, d_model=cfg.d_model, num_labels=3, hidden_sizes=hidden)
    assert _count(model.head.trainable_weights) == model.head.count_params() == own.params
    assert _count(model.head.trainable_weights) == cli_head("classification", cfg, 3, hidden).params


@pytest.mark.parametrize("hidden,answer", [((), ()), ((48, 40), (24,))])
@pytest.mark.slow
def test_squad_head_count(hidden, answer):
    from xlnet_tf.heads.squad import SquadHead

    cfg = XLNetConfig.preset("tiny")
    model = _task_model(cfg, SquadHead(cfg.d_model, hidden_sizes=hidden, answer_class_hidden_sizes=answer))
    own = SquadHead.size(cfg, d_model=cfg.d_model, hidden_sizes=hidden, answer_class_hidden_sizes=answer)
    assert _count(model.head.trainable_weights) == model.head.count_params() == own.params
    assert _count(model.head.trainable_weights) == cli_head("squad", cfg, hidden_sizes=hidden,
                                                            answer_class_hidden_sizes=answer).params


@pytest.mark.parametrize("summary_type", ["last", "attn"])
def test_every_head_describes_its_own_weights(summary_type):
    """Each head's ``size`` (what a run hands the estimator) equals its built Keras layer's ``count_params()``."""
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.heads.features import FeatureHead
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead

    cfg = XLNetConfig.preset("tiny")
    h = {"sequence_output": tf.zeros([4, 8, cfg.d_model]),
         "hidden_states": [tf.zeros([4, 8, cfg.d_model])] * (cfg.n_layer + 1)}
    f = {"padding_mask": tf.ones([4, 8], tf.int32)}
    heads = [(ClassificationHead, dict(d_model=cfg.d_model, num_labels=5, summary_type=summary_type, n_head=2,
                                       d_head=8, hidden_sizes=(12,))),
             (ClassificationHead, dict(d_model=cfg.d_model, num_labels=3, regression=True)),
             (MultipleChoiceHead, dict(d_model=cfg.d_model, summary_type=summary_type, n_head=2, d_head=8)),
             (FeatureHead, dict(n_layer=cfg.n_layer, layers=(0, -1)))]
    for cls, args in heads:
        head = cls(**args)
        head(h, f, training=False)
        assert head.count_params() == cls.size(cfg, **args).params, (cls.__name__, args)


def test_cli_heads_are_the_heads_own_descriptions():
    """The CLI's --head names are shorthands for what the heads say of themselves (weights and activations)."""
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.heads.squad import SquadHead

    cfg = XLNetConfig.base()
    for labels, hidden in ((2, ()), (3, (512, 384))):
        assert cli_head("classification", cfg, labels, hidden) == ClassificationHead.size(
            cfg, d_model=cfg.d_model, num_labels=labels, hidden_sizes=hidden)
    for hidden, answer in (((), ()), ((512, 384), (256,))):
        assert cli_head("squad", cfg, hidden_sizes=hidden, answer_class_hidden_sizes=answer) == SquadHead.size(
            cfg, d_model=cfg.d_model, hidden_sizes=hidden, answer_class_hidden_sizes=answer)
    assert cli_head("none", cfg) == ram.NO_HEAD


@pytest.mark.slow
def test_a_new_head_is_estimated_without_editing_ram(monkeypatch):
    """A head defined here, unknown to xlnet_tf/ram.py, describes itself; the estimate and the runs' memory
    check (``run_common.check_memory``) count it from that description alone."""
    import keras
    import tensorflow as tf

    import run_common
    from xlnet_tf.head import Head

    class TwoTowerHead(Head):
        def __init__(self, d_model, width, **kwargs):
            super().__init__(**kwargs)
            self.tower, self.out = keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(1)

        @classmethod
        def size(cls, config, d_model=None, width=8, **_):
            d = d_model or config.d_model
            return HeadSize("two_towers", ram.dense_params(d, width) + ram.dense_params(width, 1),
                            per_token=2 * width, per_row_float32=3)

        def call(self, backbone_outputs, features=None, training=None):
            return {"score": self.out(self.tower(backbone_outputs["sequence_output"]))[:, :, 0]}

    cfg = XLNetConfig.base()
    head = TwoTowerHead(cfg.d_model, 40)
    head({"sequence_output": tf.zeros([1, 4, cfg.d_model])})
    desc = TwoTowerHead.size(cfg, d_model=cfg.d_model, width=40)
    assert desc.params == head.count_params()
    e, bare = estimate(cfg, 512, 4, head=desc), estimate(cfg, 512, 4)
    assert e["head"] == "two_towers" and e["head_param_count"] == desc.params
    assert e["activations_head"] == 4 * (512 * 2 * 40 * 4 + 3 * 4) and bare["activations_head"] == 0
    assert e["gradients"] - bare["gradients"] == 4 * desc.params
    assert e["optimizer_state"] - bare["optimizer_state"] == 2 * 4 * desc.params
    F = type("Flags", (), dict(check_memory=True, max_seq_length=512, train_batch_size=4, precision="float32",
                               recompute=False, num_trainable_layers=-1, grad_accum_steps=1))
    monkeypatch.setattr(ram, "machine_memory", lambda: e["total"])
    run_common.check_memory(F, cfg, True, desc)                      # fits exactly
    monkeypatch.setattr(ram, "machine_memory", lambda: e["total"] - 1)
    with pytest.raises(ValueError, match="estimated to need"):
        run_common.check_memory(F, cfg, True, desc)


@pytest.mark.slow
@pytest.mark.parametrize("ntl", [None, 0, 1, 2])
def test_trainable_subset_equals_trainer_selection(ntl):
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf import optimization

    cfg = XLNetConfig.preset("tiny")
    model = _task_model(cfg, ClassificationHead(cfg.d_model, 2))
    selected = optimization.select_trainable(model, ntl)
    head = ClassificationHead.size(cfg, d_model=cfg.d_model, num_labels=2)
    hp = head.params
    assert _count(selected) == trainable_param_counts(cfg, ntl, hp)["total"]
    e = estimate(cfg, 16, 2, num_trainable_layers=ntl, head=head)
    assert e["trainable_param_count"] == _count(selected)
    assert e["optimizer_state"] == 2 * 4 * _count(selected)            # Adam m and v, float32
    assert estimate(cfg, 16, 2, num_trainable_layers=ntl, optimizer="sgd")["optimizer_state"] == 0


def test_frozen_layers_arithmetic():
    cfg = XLNetConfig.base()
    cls = cli_head("classification", cfg)
    full = estimate(cfg, 512, 1, head=cls)
    two = estimate(cfg, 512, 1, num_trainable_layers=2, head=cls)
    none = estimate(cfg, 512, 1, num_trainable_layers=0, head=cls)
    assert two["trainable_blocks"] == 2 and none["trainable_blocks"] == 0
    # gradients: 2 blocks + classification head + lm_bias (head-level), no embedding gradient
    hp = cls.params
    assert two["gradients"] == 4 * (2 * block_param_count(cfg) + hp + cfg.n_token)
    assert none["gradients"] == 4 * (hp + cfg.n_token)
    assert two["activations"] < full["activations"] / 4
    assert none["activations_kept_per_block"] * none["trainable_blocks"] == 0
    assert full["total"] > two["total"] > none["total"]
    # with XLA's up-front dropout draws, the frozen forward holds every block's draws at the first block
    assert two["peak_phase"] == "forward, first block"
    assert two["phases"]["forward, first block"] >= cfg.n_layer * two["dropout_draws_per_block"]
    assert estimate(cfg, 512, 1, num_trainable_layers=2, rng_hoisting=False, head=cls)["total"] < two["total"]


# --------------------------------------------------------------------------- activations and levers
def test_known_block_activations_base_512():
    """XLNet-Base, seq 512, batch 1, float32, XLA: 84,942,848 bytes kept per block. This is also what XLA's
    buffer assignment of the real training step holds per block (measured with benchmarks/memory_levers.py's
    dump: softmax, dropped probs and their uniform draws 3 x 12.6 MB; FFN pre-activation, tanh, dropped activation
    and draws 4 x 6.3 MB; twelve [1, 512, 768] float32 tensors; kr [12, 1024, 64])."""
    items = block_activations(XLNetConfig.base(), 512, 1, "float32", jit=True)
    total = sum(v for _, v, _ in items)
    score, ffn, bqd, kr = 12 * 512 * 512 * 4, 512 * 3072 * 4, 512 * 768 * 4, 12 * 1024 * 64 * 4
    lnstats = 4 * 512 * 4
    assert total == 3 * score + 4 * ffn + 12 * bqd + kr + lnstats == 84_942_848


def test_activations_scale_with_batch_and_seq():
    cfg = XLNetConfig.base()
    a1 = estimate(cfg, 256, 1)["activations_per_block"]
    a2 = estimate(cfg, 256, 2)["activations_per_block"]
    assert 2 * a1 == a2                           # per-example positional dropout: kr is per example too
    shared = XLNetConfig.base(pos_dropout="shared")
    s1, s2 = (estimate(shared, 256, b)["activations_per_block"] for b in (1, 2))
    kr = cfg.n_head * (2 * 256) * cfg.d_head * 4
    assert 2 * s1 - s2 == kr                      # one kr = R.W_r [n, r, d_head] for the batch
    a_long = estimate(cfg, 512, 1)["activations_per_block"]
    assert 2 * a1 < a_long < 4 * a1               # linear parts + quadratic attention scores


def test_recompute_reduces_activations():
    cfg = XLNetConfig.base()
    plain = estimate(cfg, 512, 2)
    bqd = 2 * 512 * cfg.d_model * 4
    ideal = estimate(cfg, 512, 2, recompute=True, rng_hoisting=False)
    assert ideal["activations_kept_per_block"] == bqd          # only the block input is kept
    assert ideal["activations"] < plain["activations"] / 4
    # XLA draws every block's dropout randoms up front: they stay alive until each block is recomputed
    rec = estimate(cfg, 512, 2, recompute=True)
    assert rec["rng_hoisting"] and rec["activations_kept_per_block"] == bqd + rec["dropout_draws_per_block"]
    assert ideal["step_peak"] < rec["step_peak"] < plain["step_peak"]
    assert rec["parameters"] == plain["parameters"] and rec["gradients"] == plain["gradients"]
    assert not estimate(cfg, 512, 2, recompute=True, jit=False)["rng_hoisting"]


def test_precision_halves_compute_dtype_activations():
    cfg = XLNetConfig.base()
    f32 = {name: v for name, v, _ in block_activations(cfg, 512, 1, "float32")}
    bf16 = {name: v for name, v, _ in block_activations(cfg, 512, 1, "mixed_bfloat16")}
    for name, v in f32.items():
        if "float32" in name:  # softmax output and LayerNorm statistics stay float32
            assert bf16[name] == v
        else:
            assert bf16[name] * 2 == v, name
    e32, e16 = estimate(cfg, 512, 1), estimate(cfg, 512, 1, precision="mixed_float16")
    assert e16["activations"] < 0.8 * e32["activations"]
    # variables stay float32 (master weights), and so do gradients and Adam slots
    assert e16["parameters"] == e32["parameters"] and e16["optimizer_state"] == e32["optimizer_state"]


def test_cpu_mixed_precision_keeps_float32_activations():
    cfg = XLNetConfig.base()
    f32 = estimate(cfg, 512, 1, cpu=True)
    bf16_cpu = estimate(cfg, 512, 1, precision="mixed_bfloat16", cpu=True)
    bf16_acc = estimate(cfg, 512, 1, precision="mixed_bfloat16")
    assert bf16_cpu["activations"] > f32["activations"] > bf16_acc["activations"]  # + 16-bit weight copies
    # accumulation + mixed precision: XLA keeps a cast copy of every weight the forward reads
    acc = estimate(cfg, 512, 2, precision="mixed_bfloat16", grad_accum_steps=2)
    used = acc["param_groups"]["word_embedding"] + acc["param_groups"]["blocks"] + acc["head_param_count"]
    assert acc["hoisted_weight_casts"] == 2 * used
    assert estimate(cfg, 512, 2, precision="mixed_bfloat16", grad_accum_steps=2, cpu=True)[
        "hoisted_weight_casts"] == 4 * used
    assert estimate(cfg, 512, 2, grad_accum_steps=2)["hoisted_weight_casts"] == 0


def test_grad_accumulation_halves_micro_batch_and_adds_accumulator():
    cfg = XLNetConfig.base()
    one = estimate(cfg, 512, 2)
    acc = estimate(cfg, 512, 2, grad_accum_steps=2)
    assert acc["micro_batch"] == 1 and one["micro_batch"] == 2
    assert acc["gradient_accumulator"] == one["gradients"]
    assert acc["gradients"] == 2 * one["gradients"]
    assert acc["activations"] < 0.55 * one["activations"]
    assert acc["step_peak"] < one["step_peak"]


def test_peak_is_not_the_naive_sum():
    e = estimate("base", 512, 1)
    assert e["total"] == e["persistent"] + e["step_peak"]
    assert e["persistent"] + e["gradients"] <= e["sum_of_components"]
    assert e["total"] < e["sum_of_components"]
    assert e["peak_phase"] in e["phases"]


def test_bad_arguments():
    with pytest.raises(ValueError):
        estimate("base", 512, 1, precision="float64")
    with pytest.raises(ValueError):
        estimate("base", 512, 1, num_trainable_layers=13)
    with pytest.raises(ValueError):
        estimate("base", 512, 1, optimizer="lion")
    with pytest.raises(ValueError):
        estimate("base", 0, 1)


# --------------------------------------------------------------------------- CLI
def test_cli_table_and_json(capsys, tmp_path):
    assert main(["--config=base", "--seq_len=512", "--batch=1", "--recompute", "--num_trainable_layers=4",
                 "--precision=mixed_bfloat16", "--grad_accum_steps=1"]) == 0
    out = capsys.readouterr().out
    for word in ("parameters", "gradients", "optimizer state", "activations", "workspace", "estimated peak"):
        assert word in out
    cfg_path = tmp_path / "config.json"
    XLNetConfig.preset("small").to_json_file(str(cfg_path), original=True)
    assert main([f"--config={cfg_path}", "--seq_len=128", "--batch=4", "--grad_accum_steps=2", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["micro_batch"] == 2 and e["config"]["n_layer"] == 4
    assert main(["--config=base", "--num_trainable_layers=40"]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_subprocess():
    proc = subprocess.run([sys.executable, "-m", "xlnet_tf.ram", "--config=large", "--seq_len=512", "--batch=1",
                           "--precision=float32", "--optimizer=adamw", "--head=none"], cwd=ROOT, capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "estimated peak" in proc.stdout and "360,300,802" in proc.stdout
    check = subprocess.run([sys.executable, "-c", "import sys, xlnet_tf.ram as m; m.estimate('large', 512, 1); "
                            "print('tensorflow' in sys.modules)"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert check.stdout.strip() == "False"


def test_fused_attention_keeps_fewer_score_tensors(monkeypatch, tmp_path):
    """The compiled attention kernels keep the probabilities and a bool mask per block (no dropped probabilities,
    no biased queries) and need no score-sized workspace; they apply only to CPU graph mode in float32 with a
    built library, with one set of positional encodings per batch."""
    cfg = XLNetConfig.base(pos_dropout="shared")
    plain = estimate(cfg, 512, 2, jit=False, cpu=True)
    fused = estimate(cfg, 512, 2, jit=False, cpu=True, fused_attention=True)
    score, bqd = 2 * 12 * 512 * 512, 2 * 512 * 768
    # dropped probabilities (4 bytes) and two of the five [b, len, n*h] query/key tensors are gone
    assert plain["activations_per_block"] - fused["activations_per_block"] == score * 4 + 2 * bqd * 4
    # no score-sized temporaries: the gradient op's outputs (dq, dk, dv, dkr) and three [b, q, d] gradients
    assert fused["workspace_items"]["forward"] == 0 and fused["workspace_items"]["backward_attention"] == 7 * bqd * 4
    assert fused["step_peak"] < plain["step_peak"] and fused["fused_attention"]
    from xlnet_tf.accel import kernels  # the rule's one home is xlnet_tf.accel (kernel_refusal)

    lib = tmp_path / "_rel_attention.so"
    monkeypatch.setattr(kernels, "LIBRARY", str(lib))
    assert not ram.fused_attention_applies(cfg, "float32", jit=False, cpu=True)   # not built
    lib.write_bytes(b"")
    assert ram.fused_attention_applies(cfg, "float32", jit=False, cpu=True)
    assert not ram.fused_attention_applies(XLNetConfig.base(), "float32", jit=False, cpu=True)  # per example
    assert ram.fused_attention_applies(XLNetConfig.base(dropout=0.0), "float32", jit=False, cpu=True)
    assert not ram.fused_attention_applies(cfg, "float32", jit=True, cpu=True)    # whole-step XLA
    assert not ram.fused_attention_applies(cfg, "mixed_bfloat16", jit=False, cpu=True)
    assert not ram.fused_attention_applies(cfg, "float32", jit=False, cpu=False)  # GPU/TPU
    assert not ram.fused_attention_applies(cfg.replace(accelerate=False), "float32", jit=False, cpu=True)
