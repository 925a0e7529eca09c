"""Mixed precision: the host detection behind ``--jit=auto`` and the precision warning (xlnet_tf/hardware.py,
injected cpuinfo text and GPU capabilities), and the numerics of mixed_bfloat16 against float32 on real text.

Tolerance of the backbone outputs (derived, then checked): bfloat16 keeps 8 significant bits, so one rounding to
nearest has a relative error of at most u = 2^-8 (3.9e-3), RMS u/sqrt(3) (2.3e-3) for an error spread evenly.
Under ``mixed_bfloat16`` a block rounds about k = 8 tensors on the path of a token's hidden state (its input,
q/k/v and the positional projection, the attention output, the FFN input, hidden and output); the weights are
rounded as well, but matmuls accumulate in float32 and LayerNorm/softmax statistics stay float32, so no error
grows with the sum length. Independent roundings add in quadrature and the residual stream carries them through
LayerNorm (which rescales a vector, not its relative error): after L blocks the RMS relative error of a token's
hidden state is about EPS = (u/sqrt(3)) * sqrt(1 + k L) (L = 2: 9.3e-3). The test holds the mean per-token
relative L2 error to EPS (the mean is at most the RMS), the worst token to 2 EPS, and the cosine similarity of
the whole output to >= 1 - EPS^2 / 2 (the cosine of a vector with a perpendicular relative error EPS); measured
here (128 SST-2 dev sentences, 3,583 tokens): mean 4.9e-3, worst 7.2e-3, cosine 1 - 1.2e-5. It also requires the
mean error to be above u / 8, so a model that silently ran in float32 fails.
"""

from __future__ import annotations

import math
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, shared_path, tiny
from tests.subprocess_util import run_like_a_server
from xlnet_tf import XLNetConfig, hardware, training

HERE = os.path.join(REPO, "tests")  # train_toy.py

AMX_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
AVX512_BF16_LSCPU = """Architecture:            x86_64
Model name:              AMD EPYC 9R14
Flags:                   fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
"""
AVX2_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 ssse3 fma avx avx2 bmi2
"""
AVX512_NO_BF16 = "flags\t: fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_vnni\n"

U = 2.0 ** -8  # bfloat16 unit roundoff (8 significant bits)


def eps(n_layer, k=8):
    return (U / math.sqrt(3)) * math.sqrt(1 + k * n_layer)


# --------------------------------------------------------------------------- host detection
def test_cpu_flags_from_cpuinfo_and_lscpu():
    assert {"amx_bf16", "avx512_bf16", "avx2"} <= hardware.cpu_flags(AMX_CPUINFO)
    assert "avx512_bf16" in hardware.cpu_flags(AVX512_BF16_LSCPU)
    assert "amx_bf16" not in hardware.cpu_flags(AVX2_CPUINFO) and "avx2" in hardware.cpu_flags(AVX2_CPUINFO)
    assert hardware.cpu_flags("") == frozenset()
    assert hardware.cpu_flags("model name : flags of a kind\n") == frozenset()  # only the flags field counts


@pytest.mark.parametrize("text, native", [(AMX_CPUINFO, True), (AVX512_BF16_LSCPU, True),
                                          (AVX2_CPUINFO, False), (AVX512_NO_BF16, False), ("", False)])
def test_native_bf16_on_the_cpu(text, native):
    host = hardware.detect(cpuinfo=text, gpus=())
    assert host.cpu_bf16 is native
    assert host.native("mixed_bfloat16", "cpu") is native
    assert host.native("float32", "cpu") and not host.native("mixed_float16", "cpu")
    assert host.native_precisions("cpu") == (("float32", "mixed_bfloat16") if native else ("float32",))
    assert host.amx is (text is AMX_CPUINFO)


@pytest.mark.parametrize("caps, bf16, fp16", [([(8, 0)], True, True), ([(9, 0), (8, 6)], True, True),
                                              ([(7, 5)], False, True), ([(7, 0)], False, True),
                                              ([(6, 1)], False, False), ([(8, 0), (7, 5)], False, True),
                                              ([], False, False)])
def test_native_16_bit_on_gpus(caps, bf16, fp16):
    host = hardware.detect(cpuinfo=AMX_CPUINFO, gpus=caps)
    assert host.native("mixed_bfloat16", "gpu") is bf16  # every visible GPU must have it
    assert host.native("mixed_float16", "gpu") is fp16
    assert (hardware.precision_warning("mixed_bfloat16", host, "gpu") is None) is bf16


def test_precision_warning_text():
    slow = hardware.detect(cpuinfo=AVX2_CPUINFO, gpus=())
    fast = hardware.detect(cpuinfo=AMX_CPUINFO, gpus=())
    note = hardware.precision_warning("mixed_bfloat16", slow, "cpu")
    assert "without native bfloat16" in note and "0.70x float32" in note and "--precision=float32" in note
    assert hardware.precision_warning("mixed_bfloat16", fast, "cpu") is None
    assert hardware.precision_warning("float32", slow, "cpu") is None
    assert "0.65x float32" in hardware.precision_warning("mixed_float16", fast, "cpu")  # float16: slow on any CPU
    with pytest.raises(ValueError, match="precision"):
        fast.native("bfloat16")


def test_jit_auto_keeps_bf16_on_the_graph_on_a_cpu():
    """--jit=auto on one CPU: bfloat16 keeps forward and backward on the graph (oneDNN's bf16 kernels are only
    there), float16 compiles the whole step; on a GPU the whole step; several devices: off."""
    one = tf.distribute.get_strategy()
    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    expect = {"float32": "update", "mixed_bfloat16": "update", "mixed_float16": "step"}
    for precision, jit in expect.items():
        assert training.default_jit(one, precision) == ("step" if on_gpu else jit)


def test_trainer_warns_once_on_a_cpu_without_bf16(monkeypatch, caplog):
    sys.path.insert(0, HERE)
    from train_toy import make_dataset_fn, make_model

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("a GPU is visible: the CPU warning does not apply")
    from xlnet_tf import device_policy

    monkeypatch.setattr(device_policy, "_WARNED", set())
    hosts = {"avx2": hardware.detect(cpuinfo=AVX2_CPUINFO, gpus=()),
             "amx": hardware.detect(cpuinfo=AMX_CPUINFO, gpus=())}
    cfg = training.TrainConfig(learning_rate=1e-2, train_steps=1, progress=False, precision="mixed_bfloat16",
                               jit_compile=None)
    expected = hardware.precision_warning("mixed_bfloat16", hosts["avx2"], "cpu")
    for kind, warns in (("amx", []), ("avx2", [expected]), ("avx2", [])):  # the second time: already said
        monkeypatch.setattr(hardware, "detect", lambda *a, **k: hosts[kind])
        caplog.clear()
        with caplog.at_level("WARNING", logger="xlnet_tf.training"):
            tr = training.Trainer(make_model(), make_dataset_fn(4), cfg)
        assert tr.jit == "update"  # graph mode (oneDNN) + XLA optimizer update, on either CPU
        assert [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()] == warns
    assert len(device_policy._WARNED) == 1


# --------------------------------------------------------------------------- numerics on real text
SMALL = tiny(n_layer=2, d_model=128, n_head=4, d_head=32, d_inner=512, n_token=32000, dropout=0.1, dropatt=0.1,
             initializer_range=0.02)
SEQ = 48


@pytest.fixture(scope="module")
def sst2():
    """SST-2 dev (all 872, seq 48: 93% of the sentences whole, median 26 pieces) as classification features
    (real text, the released spiece.model)."""
    from xlnet_tf.tasks.classification.features import encode_texts
    from xlnet_tf.tasks.classification.registry import get_task
    from xlnet_tf import XLNetTokenizer

    spm = shared_path("spiece", "spiece.model")
    data_dir = os.path.dirname(shared_path("glue", "SST-2", "dev.tsv"))
    task = get_task("sst-2")
    tok = XLNetTokenizer(spm)
    examples = task.get_examples(data_dir, "dev")
    feats = encode_texts(tok, [ex.text_a for ex in examples], max_seq_length=SEQ)
    feats["label"] = np.asarray([task.label_id(ex.label) for ex in examples], np.int32)
    return {"dev": feats}


def _with_policy(policy, fn):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        return fn()
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _relative_errors(ref, got, mask):
    """Per real token: ||got - ref|| / ||ref|| over d_model; and the cosine similarity of the whole output."""
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    real = mask.astype(bool)
    rel = np.linalg.norm(got - ref, axis=-1)[real] / np.linalg.norm(ref, axis=-1)[real]
    a, b = ref[real].ravel(), got[real].ravel()
    return rel, float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.slow
def test_bf16_backbone_outputs_within_the_stated_tolerance(sst2):
    from xlnet_tf.modeling import XLNetModel

    cfg = XLNetConfig(**SMALL)
    feats = {k: v[:128] for k, v in sst2["dev"].items()}
    keras.utils.set_random_seed(3)
    f32 = XLNetModel(cfg, seed=0)
    bf16 = _with_policy("mixed_bfloat16", lambda: XLNetModel(cfg, seed=0))
    args = [tf.constant(feats[k]) for k in ("input_ids", "segment_ids", "padding_mask")]

    def run(model):
        fn = tf.function(lambda ids, seg, mask: model(ids, segment_ids=seg, padding_mask=mask,
                                                      training=False)["sequence_output"])
        return fn(*args)

    ref = run(f32)
    run(bf16)  # builds the variables
    bf16.set_weights(f32.get_weights())  # mixed policy: float32 variables, the same values
    got = run(bf16)
    assert got.dtype == tf.bfloat16 and ref.dtype == tf.float32
    rel, cos = _relative_errors(ref.numpy(), got.numpy().astype(np.float32), feats["padding_mask"])
    e = eps(cfg.n_layer)
    print(f"\nbf16 vs float32, {len(rel)} real tokens of {len(args[0])} SST-2 dev sentences: relative L2 error "
          f"mean {rel.mean():.2e} max {rel.max():.2e} (bound {e:.2e}, {2 * e:.2e}); cosine 1 - {1 - cos:.2e} "
          f"(bound 1 - {e * e / 2:.2e})")
    assert rel.mean() <= e and rel.max() <= 2 * e
    assert cos >= 1 - e * e / 2
    assert rel.mean() > U / 8  # the computation did run in bfloat16


@pytest.fixture(scope="module")
def sst2_classifier(sst2_run):
    """The session's finished SST-2 classifier (``conftest.sst2_run``: 400 steps, dev accuracy ~0.78 against 0.51
    for the majority class), read from its checkpoint in float32: its margins make the label comparisons below
    mean something. (config, a factory of the same classifier, the float32 model, its head factory)."""
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification.features import feature_spec
    from xlnet_tf.finetune import FineTuner
    from xlnet_tf.task_model import TaskModel

    assert sst2_run.L == SEQ
    cfg = XLNetConfig.from_json_file(sst2_run.config, dropout=0.0, dropatt=0.0)

    def head():
        return ClassificationHead(cfg.d_model, 2, task_name="SST-2", n_head=cfg.n_head, d_head=cfg.d_head,
                                  dropout=0.0)

    f32 = FineTuner(cfg, head, feature_spec(SEQ)).model_for_inference(str(sst2_run.dir / "model"))
    return cfg, (lambda: TaskModel(cfg, head(), seed=0)), f32, head


@pytest.mark.slow
def test_bf16_classifier_gives_the_float32_label_on_sst2_dev(sst2, sst2_classifier):
    """The float32 classifier's weights in a mixed_bfloat16 model: the same predicted label on >= 99% of SST-2
    dev (measured here: 100%, largest logit difference 3.4e-3 against a median |margin| of 0.25)."""
    cfg, make, f32, _ = sst2_classifier
    dev = {k: v for k, v in sst2["dev"].items()}
    ds = tf.data.Dataset.from_tensor_slices(dev).batch(len(dev["label"]))  # one batch: one trace per model
    bf16 = _with_policy("mixed_bfloat16", make)
    bf16.build_with({k: v[:1] for k, v in dev.items()})
    bf16.set_weights(f32.get_weights())
    ref = training.predict(f32, ds)["logits"]
    got = training.predict(bf16, ds)["logits"]
    pred_ref, pred_got = ref.argmax(-1), got.argmax(-1)
    agree = float(np.mean(pred_ref == pred_got))
    acc = float(np.mean(pred_ref == dev["label"]))
    margin = np.abs(ref[:, 1] - ref[:, 0])
    print(f"\nSST-2 dev ({len(pred_ref)}): float32 accuracy {acc:.3f}; bf16 label = float32 label on {agree:.4f}; "
          f"|logit margin| median {np.median(margin):.3f}, min {margin.min():.2e}; "
          f"logit difference max {np.abs(got - ref).max():.2e}")
    # The margins mean something: the float32 model learned (above chance) and predicts both labels.
    assert acc > 0.6 and 0.1 < pred_ref.mean() < 0.9
    assert agree >= 0.99


# Probabilities of the bf16 export against the float32 export: with two classes p = sigmoid(margin) moves by at
# most |d margin| / 4, and the margin by at most twice the largest logit error (measured in-process above:
# 3.4e-3), so about 2e-3; the test allows 1e-2.
EXPORT_PROB_TOL = 1e-2


@pytest.mark.slow
def test_bf16_export_serves_the_float32_label_from_raw_text(sst2, sst2_classifier, tmp_path):
    """``FineTuner.model_for_inference(precision=...)`` (the runner's export path, ``--export_precision``): a
    float32 and a bfloat16 export of the same trained classifier, loaded in a fresh process with only
    tensorflow + tensorflow_text and given raw real text (the 872 SST-2 dev sentences, and 300 IMDB test reviews,
    read to the export's length), give the same label on >= 99% of each set, float32 outputs, probabilities
    within EXPORT_PROB_TOL, and not identical ones (the bf16 graph computes in bf16)."""
    import json
    import tarfile

    from xlnet_tf.tasks.classification.registry import get_task
    from xlnet_tf.tasks.classification.serving import ClassifierServing
    from xlnet_tf import XLNetTokenizer
    from xlnet_tf.finetune import FineTuner

    cfg, _, f32, head = sst2_classifier
    spec = {k: ("int64", (SEQ,)) for k in ("input_ids", "segment_ids", "padding_mask")}
    ft = FineTuner(cfg, head, spec, seed=0)
    ft.model = f32  # as after --do_train in the same run
    tok = XLNetTokenizer(shared_path("spiece", "spiece.model"))
    exports = {}
    for precision, name in (("float32", "float32"), ("mixed_bfloat16", "bfloat16")):
        model = ft.model_for_inference(None, precision=precision)
        assert model.dtype_policy.name == precision
        assert keras.mixed_precision.global_policy().name == "float32"  # restored after the build
        exports[name] = str(tmp_path / name)
        ClassifierServing(model, tok, SEQ, label_names=["0", "1"]).export(exports[name])
        info = json.loads((tmp_path / name / "serving_info.json").read_text())
        assert info["precision"] == name and info["output_dtype"] == "float32"
    assert ft.model_for_inference(None, precision="float32") is f32  # already float32: the same model

    data_dir = os.path.dirname(shared_path("glue", "SST-2", "dev.tsv"))
    sets = {"sst2": [ex.text_a for ex in get_task("sst-2").get_examples(data_dir, "dev")], "imdb": []}
    with tarfile.open(shared_path("imdb", "aclImdb_v1.tar.gz"), "r:*") as tar:
        for m in tar:
            if m.isfile() and "/test/" in m.name and m.name.endswith(".txt") and len(sets["imdb"]) < 300:
                sets["imdb"].append(tar.extractfile(m).read().decode("utf-8").replace("<br />", " "))
            if len(sets["imdb"]) == 300:
                break
    (tmp_path / "texts.json").write_text(json.dumps(sets))
    run_like_a_server(
        f"sets = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        f"for name, path in {exports!r}.items():\n"
        "    fn = tf.saved_model.load(path).signatures['serving_default']\n"
        "    for set_name, texts in sets.items():\n"
        "        out = fn(text_a=tf.constant(texts))\n"
        "        assert {k: v.dtype.name for k, v in out.items() if v.dtype.is_floating} == "
        "{'logits': 'float32', 'probabilities': 'float32'}, out\n"
        f"        np.savez({str(tmp_path)!r} + f'/{{name}}_{{set_name}}.npz', "
        "**{k: v.numpy() for k, v in out.items()})", tmp_path)
    for set_name, texts in sets.items():
        ref, got = (np.load(tmp_path / f"{n}_{set_name}.npz") for n in ("float32", "bfloat16"))
        agree = float(np.mean(ref["label"] == got["label"]))
        diff = np.abs(ref["probabilities"] - got["probabilities"]).max()
        mean = np.abs(ref["probabilities"] - got["probabilities"]).mean()
        print(f"\nexports on {set_name} ({len(texts)} raw texts): bf16 label = float32 label on {agree:.4f}; "
              f"probabilities differ by at most {diff:.2e}, {mean:.1e} on average (tolerance {EXPORT_PROB_TOL})")
        assert agree >= 0.99
        assert 1e-5 < diff <= EXPORT_PROB_TOL  # bf16 really ran, and within the bound
        if set_name == "sst2":
            acc = float(np.mean(ref["label"] == sst2["dev"]["label"]))
            print(f"float32 accuracy on SST-2 dev {acc:.3f}, bf16 {np.mean(got['label'] == sst2['dev']['label']):.3f}")
            assert len(ref["label"]) == 872 and acc > 0.6
    assert len(sets["imdb"]) == 300


def test_export_refuses_16_bit_signature_outputs(tmp_path):
    from xlnet_tf.export import save_atomically

    module = tf.Module()
    module.f = tf.function(lambda x: {"y": tf.cast(x, tf.bfloat16)}, input_signature=[tf.TensorSpec([None])])
    with pytest.raises(TypeError, match="'y' is bfloat16"):
        save_atomically(module, str(tmp_path / "export"), {"serving_default": module.f})
    assert not os.path.exists(tmp_path / "export")


# --------------------------------------------------------------------------- the benchmark's precision columns
def test_backbone_benchmark_ratios_and_goals_per_precision():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import backbone

    def row(impl, precision, t, mode="infer"):
        return {"mode": mode, "batch": 8, "seq": 128, "impl": impl, "precision": precision, "times_s": [t] * 3,
                "tokens_per_s": 8 * 128 / t}

    rows = [row("tf", "float32", 1.0), row("tf_xla", "float32", 1.2), row("torch", "float32", 2.0),
            row("tf", "mixed_bfloat16", 0.3), row("torch", "mixed_bfloat16", 1.0), row("torch1", "mixed_bfloat16", 0.5)]
    backbone.add_precision_ratios(rows)
    by = {(r["impl"], r["precision"]): r for r in rows}
    assert by["tf", "mixed_bfloat16"]["vs_our_float32"] == pytest.approx(1.0 / 0.3)
    assert by["tf_xla", "float32"]["vs_our_float32"] == pytest.approx(1.0 / 1.2)
    assert by["torch", "mixed_bfloat16"]["vs_own_float32"] == pytest.approx(2.0)
    assert "vs_own_float32" not in by["torch1", "mixed_bfloat16"]  # no float32 torch1 row
    f32, bf16 = backbone.goal_summary(rows)
    assert (f32["precision"], bf16["precision"]) == ("float32", "mixed_bfloat16")
    assert f32["best_peer_source"] == "estimate" and "ratio_vs_our_float32" not in f32
    # bf16: against our float32 (>= 3x at inference) and the best HF variant in bf16 (torch1 here, >= 1.5x)
    assert bf16["ratio_vs_our_float32"] == pytest.approx(1.0 / 0.3) and bf16["goal_vs_float32_met"]
    assert bf16["best_peer_impl"] == "torch1" and bf16["best_peer_source"] == "hf_only"
    assert bf16["ratio_vs_best_peer_same_run"] == pytest.approx(0.5 / 0.3) and bf16["goal_met_same_run"]
    (tb,) = [g for g in backbone.goal_summary([row("tf", "float32", 1.0, "train"),
                                                row("tf", "mixed_bfloat16", 0.6, "train")])
             if g["precision"] == "mixed_bfloat16"]
    assert not tb["goal_vs_float32_met"]  # 1.67x < the 2x wanted in training


def test_export_precision_flag_reaches_the_runner_plan(tmp_path):
    import types

    import run_common

    F = types.SimpleNamespace(output_dir=str(tmp_path), model_dir=None, do_train=False, do_eval=False,
                              do_predict=False, export_dir=str(tmp_path / "export"), eval_all_ckpt=False,
                              train_batch_size=8, export_precision="bfloat16",
                              export_huggingface=None, export_format="tf_saved_model")
    assert run_common.plan(F).export_precision == "mixed_bfloat16"
    F.export_precision = "float32"
    assert run_common.plan(F).export_precision == "float32"
