#!/usr/bin/env python
"""Backbone speed: our XLNet (TF 2 / Keras 3, with and without XLA) vs HuggingFace's PyTorch XLNetModel.

Both sides get the XLNet-Base shape (12 layers, d_model 768, 12 heads x 64, d_inner 3072, vocab 32000, tanh
GELU), random weights and the same inputs (token ids, two segments, an all-ones padding mask).

* inference: dropout off (ours: ``training=False``; HF: ``eval()`` + ``torch.no_grad()``);
* training: one forward + backward + Adam step on every weight the forward uses, loss = mean(sequence_output²),
  dropout 0.1 on both sides (``--train-dropout``).

Implementations: ``tf`` ours in a ``tf.function`` (oneDNN kernels; at inference the fused attention kernel of
``xlnet_tf/accel/kernels`` when it is built, recorded per worker as ``fused_attention``); ``tf_xla`` the same with
``jit_compile=True`` (XLA cannot compile the custom op, so no fused kernel); ``tf_xopt`` (training only) forward + backward in a ``tf.function`` and the Adam update
in a separate XLA-compiled function; ``torch`` HF PyTorch eager with 2 threads; ``torch1`` the same with
1 thread (on a loaded machine two OpenMP threads can be much slower than one; the goals are checked against
the faster of the two); ``mg`` TensorFlow Model Garden's ``official.nlp.modeling.networks.XLNetBase`` (TF2 /
Keras 2 via tf_keras) under ``tf.function(jit_compile=True)`` (training: the whole step, Adam included, is one
XLA cluster); ``mg_noxla`` the same in a plain ``tf.function``.

Model Garden peer: it needs Keras 2, so its workers run in a separate virtualenv made by
``bash benchmarks/setup_peer_model_garden.sh`` (``--mg-python``, default ``$XLNET_TF_MG_PYTHON``, else that
script's default venv ``~/.cache/xlnet_tf_peers/model_garden``). Without it the ``mg`` rows are skipped (listed
under ``skipped`` in the JSON, with the reason), and ``mg`` is left out of the default implementation lists.
Its shape is the same: 12 layers, d_model 768, 12 heads x 64, d_inner 3072, vocab 32000, untied attention
biases (``tie_attention_biases=False``), ``attention_type="bi"``, ``bi_data=False``, ``memory_length=0``,
``clamp_length=-1``, ``reuse_length=0``, no two-stream, no CLS segment mask, layer-norm eps 1e-12 (MG's fixed
value). GELU: ``inner_activation="gelu"`` would give Keras' exact erf GELU, so the worker passes Model Garden's
own ``official.modeling.activations.gelu``, which is the tanh approximation (as ours and HF ``gelu_new``).
Its inputs are the same arrays, in its conventions: ``input_mask`` float32 with 1 = real token (see
``_build_mg``), ``segment_ids`` int32, no permutation mask, target mapping or state. Its Adam is tf_keras's
(lr 1e-5), which turns its own per-variable XLA off on CPU, so ``mg_noxla`` has no XLA anywhere. Every
worker, Model Garden's too, gets ``TF_ENABLE_ONEDNN_OPTS=1``. Its trainable weights are ours less
``mask_emb`` / ``lm_bias`` (which ours does not train here either) and equal HF's less ``mask_emb``.

Precision (``--precisions``, a dimension of every implementation; default ``auto``: float32 plus the 16-bit
precisions the host computes natively, ``xlnet_tf.hardware``): ``float32``; ``mixed_bfloat16`` / ``mixed_float16``
as each side's own mixed-precision path: ours and Model Garden under the Keras mixed policy of that name
(float32 weights, 16-bit compute, float32 softmax statistics and LayerNorm where the layers ask for them);
HF under ``torch.autocast(device, dtype=torch.bfloat16 / torch.float16)``. Training in float16 scales the loss
(Keras ``LossScaleOptimizer``, tf_keras' for Model Garden, ``torch.amp.GradScaler`` for HF). ``torch_compile``
is HF under ``torch.compile`` (inductor; the first call compiles). The table gives each row's speed against our
float32 (``vs our f32``: our fastest float32 variant of the same mode and shape) and the goal check is made per
precision (16-bit: >= 3x our float32 at inference, >= 2x in training, >= 1.5x the best peer in that precision).

Device (``--device``, default ``auto``): a visible GPU when there is one (every worker then runs on it; peak
GPU memory is recorded), else the CPU; ``--device cpu`` hides the GPUs from the workers.

When Model Garden ran, the goal check uses the best peer measured in the same run (the fastest of the HF and
Model Garden variants); otherwise HF scaled by the quoted Model Garden / HF ratio, as an estimate.

Every configuration (implementation x mode x shape) runs in its OWN worker subprocess, so the peak RSS
(``ru_maxrss``) is attributable to it. The workers of one (mode, shape) group live side by side: after their
warm-up the driver asks them for one timed repetition each, in turn, N times (rotating who goes first), so
machine noise hits all implementations alike; medians are reported. Idle workers block on a pipe (no CPU).

    python benchmarks/backbone.py                 # full table -> benchmarks/results/backbone.json
    python benchmarks/backbone.py --quick         # one small configuration, < 2 minutes
    python benchmarks/backbone.py --reps 7 --modes infer --shapes 8x128
    bash benchmarks/setup_peer_model_garden.sh && python benchmarks/backbone.py --impls tf,mg,mg_noxla,torch1
    python benchmarks/backbone.py --precisions float32,mixed_bfloat16 --impls tf,tf_xla,torch,torch_compile
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util  # noqa: E402
from bench_util import PROTO, cpu_model, versions  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, n_token=32000)
IMPLS = {"tf": "ours, tf.function", "tf_xopt": "ours, tf.function, XLA Adam", "tf_xla": "ours, tf.function + XLA",
         "torch": "HF PyTorch eager", "torch1": "HF PyTorch eager, 1 thread", "torch_compile": "HF torch.compile",
         "mg": "Model Garden TF2 + XLA", "mg_noxla": "Model Garden TF2, tf.function"}
for _i in ("tf", "tf_xopt", "tf_xla"):  # the same from another checkout (--baseline-root): before/after in one run
    IMPLS[_i + "_base"] = IMPLS[_i] + ", --baseline-root checkout"
MG_IMPLS = ("mg", "mg_noxla")
MG_VENV = os.environ.get("MG_VENV", os.path.join(os.path.expanduser("~"), ".cache", "xlnet_tf_peers", "model_garden"))
MG_DEFAULT_PYTHON = os.path.join(MG_VENV, "bin", "python")  # where benchmarks/setup_peer_model_garden.sh puts it
# Peers measured earlier on a 2-core AMD EPYC (Zen 3) machine, XLNet-Base shape, medians (tokens/s).
QUOTED_PEERS = {("infer", 8, 128): {"model_garden_tf2_xla": 363, "hf_pytorch": 303},
                ("train", 8, 128): {"model_garden_tf2_xla": 85, "hf_pytorch": 78},
                ("infer", 1, 512): {"hf_pytorch": 255}}
GOALS = {"infer": 1.3, "train": 1.5}  # wanted: ours >= GOAL x the best peer (float32)
GOALS_16BIT = {"infer": 1.5, "train": 1.5}  # the same in bfloat16 / float16, against the best peer in that precision
GOALS_VS_F32 = {"infer": 3.0, "train": 2.0}  # wanted: ours in 16 bits >= GOAL x ours in float32
# Report labels of the precisions (xlnet_tf.hardware.PRECISIONS), in report order.
SHORT = {"float32": "f32", "mixed_bfloat16": "bf16", "mixed_float16": "fp16"}


# ====================================================================== worker side
def _rss_mb(field="VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _inputs(batch, seq, n_token, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(10, n_token, (batch, seq)).astype(np.int64)
    seg = (np.arange(seq)[None, :] >= seq // 2).astype(np.int64).repeat(batch, 0)  # A | B
    mask = np.ones((batch, seq), np.int64)
    return ids, seg, mask


def _build_tf(spec):
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    sys.path.insert(0, spec.get("root") or ROOT)
    import xlnet_tf  # noqa: F401  (sets the oneDNN/log environment before TensorFlow loads)
    import keras
    import tensorflow as tf
    from xlnet_tf import XLNetConfig
    from xlnet_tf.modeling import XLNetModel

    train = spec["mode"] == "train"
    rate = spec["dropout"] if train else 0.0
    cfg = XLNetConfig(**spec["shape"], ff_activation="gelu", untie_r=True, dropout=rate, dropatt=rate)
    precision = spec.get("precision", "float32")
    keras.mixed_precision.set_global_policy(precision)  # the model's layers take the policy when created
    keras.utils.set_random_seed(0)
    model = XLNetModel(cfg, seed=0)
    ids, seg, mask = (tf.constant(x, tf.int32) for x in _inputs(spec["batch"], spec["seq"], cfg.n_token))
    impl = spec["impl"].removesuffix("_base")
    xla = impl == "tf_xla"

    if not train:
        @tf.function(jit_compile=xla)
        def fwd(ids, seg, mask):
            return model(ids, segment_ids=seg, padding_mask=mask, training=False)["sequence_output"]

        return lambda: fwd(ids, seg, mask).numpy()

    # Every weight the forward uses (mask_emb and lm_bias only serve the query stream / LM head).
    unused = {id(model.mask_emb), id(model.lm_bias)}
    tvars = [v for v in model.trainable_variables if id(v) not in unused]
    opt = keras.optimizers.Adam(learning_rate=1e-5)
    if precision == "mixed_float16":  # dynamic loss scaling, as training.py does for float16
        opt = keras.optimizers.LossScaleOptimizer(opt)
    opt.build(tvars)

    def loss_and_grads(ids, seg, mask):
        with tf.GradientTape() as tape:
            h = model(ids, segment_ids=seg, padding_mask=mask, training=True)["sequence_output"]
            loss = tf.reduce_mean(tf.square(tf.cast(h, tf.float32)))
            scaled = opt.scale_loss(loss) if precision == "mixed_float16" else loss
        return loss, tape.gradient(scaled, tvars)

    if impl == "tf_xopt":
        # Forward + backward as a plain graph (oneDNN kernels), the Adam update as a separate XLA cluster
        # (XLA fuses Adam's per-weight elementwise chain; its CPU matmuls are slower than oneDNN's).
        grads_fn = tf.function(loss_and_grads)

        @tf.function(jit_compile=True)
        def apply_fn(grads):
            opt.apply_gradients(zip(grads, tvars))

        def run():
            loss, grads = grads_fn(ids, seg, mask)
            apply_fn(grads)
            return loss.numpy()

        return run

    @tf.function(jit_compile=xla)
    def step(ids, seg, mask):
        loss, grads = loss_and_grads(ids, seg, mask)
        opt.apply_gradients(zip(grads, tvars))
        return loss

    return lambda: step(ids, seg, mask).numpy()


def _build_torch(spec):
    os.environ["USE_TF"] = "0"  # keep TensorFlow out of the PyTorch worker
    os.environ["USE_TORCH"] = "1"
    import torch

    torch.set_num_threads(1 if spec["impl"] == "torch1" else spec["threads"])
    import contextlib

    import transformers

    device = "cuda" if spec.get("device") == "gpu" else "cpu"
    precision = spec.get("precision", "float32")
    dtype = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}.get(precision)
    # The peer's own mixed precision: float32 weights, autocast picks the op dtypes (matmuls in 16 bits).
    autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype else contextlib.nullcontext
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    train = spec["mode"] == "train"
    s = spec["shape"]
    cfg = transformers.XLNetConfig(vocab_size=s["n_token"], d_model=s["d_model"], n_layer=s["n_layer"],
                                   n_head=s["n_head"], d_inner=s["d_inner"], ff_activation="gelu_new",
                                   untie_r=True, dropout=spec["dropout"] if train else 0.0,
                                   layer_norm_eps=1e-12, mem_len=None, use_mems_eval=False,
                                   use_mems_train=False)
    torch.manual_seed(0)
    model = transformers.XLNetModel(cfg).to(device)
    ids, seg, mask = (torch.from_numpy(x).to(device) for x in _inputs(spec["batch"], spec["seq"], s["n_token"]))
    kw = dict(input_ids=ids, token_type_ids=seg, attention_mask=mask, use_mems=False)
    if not train:
        model.eval()
    net = torch.compile(model) if spec["impl"] == "torch_compile" else model
    if not train:
        def fwd():
            with torch.no_grad(), autocast():
                h = net(**kw).last_hidden_state
            sync()
            return h

        return fwd

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    scaler = torch.amp.GradScaler(device) if precision == "mixed_float16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            h = net(**kw).last_hidden_state
        h = h.float()
        loss = (h * h).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.item()

    return step


def _mg_model(shape, rate, precision="float32"):
    """Model Garden's XLNetBase at ``shape``, weights created (one eager call on a 1x8 input). Runs in the Model
    Garden venv: imports only tensorflow, tf_keras and official (no Keras 3, no xlnet_tf)."""
    import tensorflow as tf
    import tf_keras
    from official.modeling import activations
    from official.nlp.modeling.networks import XLNetBase

    tf_keras.mixed_precision.set_global_policy(precision)  # Model Garden's own mixed precision (Keras 2 policy)
    tf_keras.utils.set_random_seed(0)
    model = XLNetBase(vocab_size=shape["n_token"], num_layers=shape["n_layer"], hidden_size=shape["d_model"],
                      num_attention_heads=shape["n_head"], head_size=shape["d_head"], inner_size=shape["d_inner"],
                      dropout_rate=rate, attention_dropout_rate=rate, attention_type="bi", bi_data=False,
                      initializer=tf_keras.initializers.RandomNormal(stddev=0.02), two_stream=False,
                      tie_attention_biases=False,  # untie_r=True: one set of r_w/r_r/r_s biases per layer
                      memory_length=0, clamp_length=-1, reuse_length=0,
                      inner_activation=activations.gelu,  # MG's gelu = tanh approximation ("gelu" would be erf)
                      use_cls_mask=False)
    # seg_embed is created by the first call that has segment ids: make every weight before tracing.
    model(tf.zeros([1, 8], tf.int32), segment_ids=tf.zeros([1, 8], tf.int32),
          input_mask=tf.ones([1, 8], tf.float32), training=False)
    return model


def _build_mg(spec):
    """TensorFlow Model Garden's XLNet (``official.nlp.modeling.networks.XLNetBase``, Keras 2 / tf_keras).

    Runs with the Model Garden venv's python and ``TF_USE_LEGACY_KERAS=1``: imports only tensorflow, tf_keras,
    official and numpy (via ``_inputs``), never Keras 3 or xlnet_tf. Input conventions, read from
    ``official/nlp/modeling/networks/xlnet_base.py`` and checked on a padded input (changing the padded tokens
    leaves the real tokens' outputs unchanged; with the mask inverted they change):
    * ``input_mask``: float32 [B, S], **1 = real token, 0 = padding** (despite the "1 = cannot attend" wording
      of ``_compute_attention_mask``'s docstring: the mask is OR-ed with the identity, padded with ones for
      memory, and fed to Keras' masked softmax, which adds -inf where the mask is 0; MG's classifier data also
      writes 1 for real tokens and its XLNetClassifier casts it to float32). So our all-ones padding mask
      passes as is.
    * ``segment_ids``: int32 [B, S] (0 = A, 1 = B); with ``use_cls_mask=False`` the segment matrix is
      ``seg_i != seg_j``, as in HF and ours.
    * ``permutation_mask``, ``target_mapping``, ``masked_tokens``: None (no PLM, no two-stream); ``state``: None
      (``memory_length=0``: no memory is cached).
    * output: ``(sequence_output [B, S, d_model], new_mems)``.
    """
    import tensorflow as tf
    import tf_keras

    train = spec["mode"] == "train"
    rate = spec["dropout"] if train else 0.0
    precision = spec.get("precision", "float32")
    model = _mg_model(spec["shape"], rate, precision)
    ids, seg, mask = _inputs(spec["batch"], spec["seq"], spec["shape"]["n_token"])
    ids, seg = tf.constant(ids, tf.int32), tf.constant(seg, tf.int32)
    mask = tf.constant(mask, tf.float32)  # 1 = real token (see above)
    xla = spec["impl"] == "mg"

    def forward(ids, seg, mask, training):
        # XLNetBase.call has no `training` argument: tf_keras passes it to the dropout layers via the call context.
        h, _ = model(ids, segment_ids=seg, input_mask=mask, state=None, permutation_mask=None,
                     target_mapping=None, masked_tokens=None, training=training)
        return h

    if not train:
        @tf.function(jit_compile=xla)
        def fwd(ids, seg, mask):
            return forward(ids, seg, mask, False)

        return lambda: fwd(ids, seg, mask).numpy()

    tvars = model.trainable_variables
    opt = tf_keras.optimizers.Adam(learning_rate=1e-5)  # its own per-variable XLA is off on CPU (no GPU found)
    fp16 = precision == "mixed_float16"
    if fp16:  # Keras 2's dynamic loss scaling
        opt = tf_keras.mixed_precision.LossScaleOptimizer(opt)
    opt.build(tvars)

    @tf.function(jit_compile=xla)
    def step(ids, seg, mask):
        with tf.GradientTape() as tape:
            h = forward(ids, seg, mask, True)
            loss = tf.reduce_mean(tf.square(tf.cast(h, tf.float32)))
            scaled = opt.get_scaled_loss(loss) if fp16 else loss
        grads = tape.gradient(scaled, tvars)
        if fp16:
            grads = opt.get_unscaled_gradients(grads)
        # Every weight the forward uses (a None gradient, known at trace time, would mean an unused weight).
        opt.apply_gradients([(g, v) for g, v in zip(grads, tvars) if g is not None])
        return loss

    return lambda: step(ids, seg, mask).numpy()


def matmul_probe(n: int, rounds: int = 7, calls: int = 3) -> dict:
    """GFLOP/s of an n x n ``tf.matmul`` in each 16-bit dtype against float32 on this process's device (oneDNN on):
    ``rounds`` interleaved rounds of ``calls`` calls each, medians. Says in a few seconds whether the host has
    native 16-bit matmuls (a 16-bit / float32 ratio above 1)."""
    import tensorflow as tf

    a = tf.random.stateless_normal([n, n], seed=[1, 2])
    fn = tf.function(lambda x: tf.reduce_sum(tf.cast(tf.matmul(x, x), tf.float32)))
    dtypes = {"float32": tf.float32, "bfloat16": tf.bfloat16, "float16": tf.float16}
    xs = {k: tf.cast(a, d) for k, d in dtypes.items()}
    times = {k: [] for k in dtypes}
    for k in dtypes:
        fn(xs[k]).numpy()  # trace and warm up
    for r in range(rounds):
        for k in (list(dtypes) if r % 2 == 0 else list(dtypes)[::-1]):
            t = time.perf_counter()
            for _ in range(calls):
                fn(xs[k]).numpy()
            times[k].append((time.perf_counter() - t) / calls)
    gflops = {k: 2.0 * n ** 3 / statistics.median(v) / 1e9 for k, v in times.items()}
    return {"n": n, "rounds": rounds, "calls": calls, "gflops": gflops,
            "vs_float32": {k: g / gflops["float32"] for k, g in gflops.items()}, "times_s": times}


def run_matmul_probe(n: int, args, log) -> dict:
    """``matmul_probe`` in a worker process (the workers' environment and device)."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"),
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--matmul-worker", str(n)], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=log, text=True, check=True).stdout
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith(PROTO))[len(PROTO):])
    print(f"matmul {n}x{n} ({args.device}, median of {res['rounds']}x{res['calls']}, interleaved): " +
          ", ".join(f"{k} {g:.1f} GFLOP/s ({res['vs_float32'][k]:.2f}x)" for k, g in res["gflops"].items()),
          flush=True)
    return res


def worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    t0 = time.perf_counter()
    if spec["impl"].startswith("torch"):
        run = _build_torch(spec)
    elif spec["impl"] in MG_IMPLS:
        run = _build_mg(spec)
    else:
        run = _build_tf(spec)
    build_s = time.perf_counter() - t0
    rss_built = _rss_mb()
    warm = []
    for _ in range(spec["warmup"]):
        t = time.perf_counter()
        run()
        warm.append(time.perf_counter() - t)
    out = sys.stdout
    print(f"{PROTO}READY " + json.dumps({"build_s": build_s, "warmup_s": warm, "rss_built_mb": rss_built}),
          file=out, flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "run":
            t, c = time.perf_counter(), time.process_time()
            run()
            print(f"{PROTO}TIME {time.perf_counter() - t!r} {time.process_time() - c!r}", file=out, flush=True)
        elif cmd == "stop":
            break
    info = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "rss_end_mb": _rss_mb()}
    if not spec["impl"].startswith("torch"):
        import tensorflow as tf
        from tensorflow.python.util import _pywrap_util_port

        info["onednn"] = bool(_pywrap_util_port.IsMklEnabled())
        if spec.get("device") == "gpu":
            info["gpu_peak_mb"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2 ** 20
    elif spec.get("device") == "gpu":
        import torch

        info["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
    if spec["impl"].startswith("tf"):  # ours: whether the fused attention kernel was available (used: tf, tf_xopt)
        try:
            from xlnet_tf.accel import kernels
        except ImportError:  # a --baseline-root checkout from before xlnet_tf/accel
            from xlnet_tf import kernels

        info["fused_attention"] = kernels.status()
        info["xlnet_tf"] = os.path.dirname(os.path.dirname(kernels.__file__))
    if spec["impl"] in MG_IMPLS:  # its own venv: record what it ran on
        info["versions"] = versions(("tensorflow", "tf-keras", "tf-models-official"))
        info["python"] = sys.executable
        info["keras3_loaded"] = "keras" in sys.modules  # False with TF_USE_LEGACY_KERAS=1 (see Worker)
    print(f"{PROTO}DONE " + json.dumps(info), file=out, flush=True)


# ====================================================================== driver side
class Worker(bench_util.Worker):
    def __init__(self, spec, log, python=None):
        env = {"CUDA_VISIBLE_DEVICES": ""} if spec.get("device") == "cpu" else {}  # hide any GPU: a CPU measurement
        if python:  # a Model Garden worker, in its own venv
            # Model Garden's documented setting for TF >= 2.16: tf.keras is tf_keras (Keras 2), and `import
            # tensorflow` then does not load Keras 3 at all (without it, it does, though nothing here uses it).
            env["TF_USE_LEGACY_KERAS"] = "1"
        super().__init__(__file__, spec, log, f"{spec['impl']} {spec.get('precision', 'float32')} {spec['mode']} "
                         f"{spec['batch']}x{spec['seq']}", python=python, env=env)


def machine_info():
    cpu = cpu_model()
    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    vers = versions(("tensorflow", "keras", "torch", "transformers", "numpy"))
    try:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "xlnet_tf"], capture_output=True, text=True,
                               cwd=ROOT).stdout.split("\n")
    except OSError:
        git, dirty = "?", []
    return {"git_head": git, "xlnet_tf_uncommitted": [d.strip() for d in dirty if d.strip()],
            "nproc": os.cpu_count(), "cpu_model": cpu,
            "cpu_simd": [f for f in flags if f.startswith(("avx", "amx", "fma"))],
            "python": platform.python_version(), "versions": vers,
            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (set by this benchmark)"),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}


def detect_host(device="auto"):
    """This host's 16-bit capabilities (xlnet_tf.hardware). GPUs are looked up (which imports TensorFlow) only
    where one may be used and ``nvidia-smi`` exists."""
    sys.path.insert(0, ROOT)
    from xlnet_tf import hardware

    look = device != "cpu" and shutil.which("nvidia-smi") is not None
    return hardware.detect(gpus=None if look else ())


def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def run_group(mode, batch, seq, impls, args, log, precisions=("float32",)):
    """Every implementation x precision of one (mode, shape) group, side by side, interleaved."""
    specs = [dict(impl=i, precision=p, device=args.device, mode=mode, batch=batch, seq=seq, shape=args.shape,
                  dropout=args.train_dropout, warmup=args.warmup, threads=args.torch_threads,
                  root=args.baseline_root if i.endswith("_base") else None) for p in precisions for i in impls]
    workers, ready, skipped = [], [], []

    def skip(spec, reason, why=None):
        print(f"    skipping {spec['impl']} {spec['precision']}: {why or reason}", flush=True)
        specs.remove(spec)
        skipped.append({"mode": mode, "batch": batch, "seq": seq, "impl": spec["impl"],
                        "precision": spec["precision"], "reason": reason})

    try:
        for spec in list(specs):  # warm up one at a time (XLA compile times stay clean)
            if spec["impl"] in MG_IMPLS and not args.mg_python_ok:
                skip(spec, f"Model Garden python not found ({args.mg_python or 'no --mg-python'}); "
                           "run benchmarks/setup_peer_model_garden.sh")
                continue
            # The workers of a group stay alive side by side: do not start one without room for it (the machine
            # is shared), rather leave that configuration out and say so.
            if mem_available_mb() < args.min_free_mb:
                skip(spec, f"MemAvailable < {args.min_free_mb} MB", f"only {mem_available_mb():.0f} MB available "
                                                                   f"(--min-free-mb {args.min_free_mb})")
                continue
            mg = spec["impl"] in MG_IMPLS
            w = Worker(spec, log, python=args.mg_python if mg else None)
            try:
                rd = json.loads(w.expect("READY"))
            except RuntimeError as e:
                if not mg:  # our and HF's workers must work; a peer's broken venv should not end the run
                    raise
                w.proc.wait()
                skip(spec, f"Model Garden worker failed before READY ({e})")
                continue
            workers.append(w)
            ready.append(rd)
        times = [[] for _ in workers]
        cpu = [[] for _ in workers]
        load = [os.getloadavg()[0]]
        for r in range(args.reps):
            for k in range(len(workers)):
                idx = (r + k) % len(workers)
                workers[idx].send("run")
                wall, proc = workers[idx].expect("TIME").split()
                times[idx].append(float(wall))
                cpu[idx].append(float(proc))
            load.append(os.getloadavg()[0])
        done = []
        for w in workers:
            w.send("stop")
            done.append(json.loads(w.expect("DONE")))
            w.proc.wait()
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
    rows = []
    for spec, rd, t, ct, dn in zip(specs, ready, times, cpu, done):
        med = statistics.median(t)
        rows.append({"mode": mode, "batch": batch, "seq": seq, "impl": spec["impl"], "label": IMPLS[spec["impl"]],
                     "precision": spec["precision"], "device": spec["device"],
                     "tokens_per_s": batch * seq / med, "median_s": med, "times_s": t,
                     "tokens_per_s_min": batch * seq / max(t), "tokens_per_s_max": batch * seq / min(t),
                     "cpu_s_median": statistics.median(ct), "cpu_s": ct,
                     "first_call_s": rd["warmup_s"][0] if rd["warmup_s"] else None, "build_s": rd["build_s"],
                     "rss_built_mb": rd["rss_built_mb"], **dn, "load1_during": load})
    return rows, skipped


def _precision(r):
    return r.get("precision", "float32")


def _group(r):
    return r["mode"], r["batch"], r["seq"]


def _ours(r):
    return not _is_peer(r["impl"]) and not r["impl"].endswith("_base")


def add_precision_ratios(rows):
    """Per row, in place: ``vs_our_float32`` (tokens/s over our fastest float32 variant of the same mode and
    shape) and ``vs_own_float32`` (over the same implementation in float32), where those rows exist."""
    for r in rows:
        f32 = [x for x in rows if _group(x) == _group(r) and _precision(x) == "float32"]
        ours = [x for x in f32 if _ours(x)]
        own = [x for x in f32 if x["impl"] == r["impl"]]
        if ours:
            r["vs_our_float32"] = r["tokens_per_s"] / max(x["tokens_per_s"] for x in ours)
        if own:
            r["vs_own_float32"] = r["tokens_per_s"] / own[0]["tokens_per_s"]
    return rows


def print_table(rows):
    gpu = any(r.get("device") == "gpu" for r in rows)
    mem = "GPU peak" if gpu else "peak RSS"
    hdr = (f"{'mode':<6}{'shape':>8}  {'implementation':<29}{'prec':<5}{'tok/s':>8}{'min..max':>15}{'s/step':>8}"
           f"{'vs HF':>7}{'vs f32':>8}{'cpu-s':>7}{'1st call':>9}{mem:>10}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        hfs = [x for x in rows if _group(x) == _group(r) and _precision(x) == _precision(r)
               and x["impl"].startswith("torch")]
        hf = max(hfs, key=lambda x: x["tokens_per_s"]) if hfs else None
        ratio = f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f}x" if hf else "-"
        f32 = f"{r['vs_our_float32']:.2f}x" if "vs_our_float32" in r else "-"
        peak = r.get("gpu_peak_mb", float("nan")) if gpu else r["peak_rss_mb"]
        print(f"{r['mode']:<6}{str(r['batch']) + 'x' + str(r['seq']):>8}  {r['label']:<29}"
              f"{SHORT.get(_precision(r), _precision(r)):<5}"
              f"{r['tokens_per_s']:>8.0f}{r['tokens_per_s_min']:>7.0f}..{r['tokens_per_s_max']:<6.0f}"
              f"{r['median_s']:>8.2f}{ratio:>7}{f32:>8}{r['cpu_s_median']:>7.2f}{r['first_call_s']:>8.1f}s"
              f"{peak:>8.0f}MB")
    print("tok/s: batch*seq / median wall time of one step; min..max over the timed repetitions; vs HF: ratio "
          "of medians in the same run, against the faster HF variant in the same precision; vs f32: against our "
          "fastest float32 variant; cpu-s: median process CPU seconds per step (less sensitive to other "
          "load); 1st call: includes tracing/XLA/torch.compile compilation; peak RSS: ru_maxrss of the "
          "configuration's own process (GPU peak: the device allocator's).")


def _is_peer(impl):
    return impl.startswith("torch") or impl in MG_IMPLS


def ratio_interval(ours_times, peer_times, level=0.90, draws=4000, seed=0):
    """Bootstrap interval of median(peer) / median(ours) (= the tokens/s ratio): each side's timed repetitions
    resampled with replacement, ``draws`` times; the central ``level`` share of the ratios. The repetitions of
    one run scatter by +-15% on this shared VM, so with 7 of them the ratio of medians alone moves by ~5-10%
    from run to run; the interval says how far one run's ratio can be trusted."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(peer_times, k=len(peer_times)))
                    / statistics.median(rng.choices(ours_times, k=len(ours_times))) for _ in range(draws))
    cut = int(round((1.0 - level) / 2.0 * draws))
    return ratios[cut], ratios[draws - 1 - cut]


def goal_summary(rows):
    """Ours (best variant) against the peers, per (mode, shape, precision), two ways: (a) absolute tokens/s
    against the quoted figures (float32, measured on another machine: indicative only); (b) in this run, against
    the best peer measured side by side in the same precision: the fastest of the HF and Model Garden variants
    when Model Garden ran in this group (``best_peer_source`` = "measured"); otherwise in float32 HF scaled by
    the quoted Model Garden / HF ratio where Model Garden was quoted (``"estimate"``), in 16 bits HF alone
    (``"hf_only"``: no quotes exist). 16-bit groups also get ``ratio_vs_our_float32`` (ours best 16-bit over
    ours best float32) against ``GOALS_VS_F32``."""
    out = []
    keys = {_group(r) + (_precision(r),) for r in rows}
    order = {p: i for i, p in enumerate(SHORT)}
    for key in sorted(keys, key=lambda k: k[:3] + (order.get(k[3], 9),)):
        mode, b, s, prec = key
        group = [r for r in rows if _group(r) + (_precision(r),) == key]
        hfs = [r for r in group if r["impl"].startswith("torch")]
        hf = max(hfs, key=lambda r: r["tokens_per_s"]) if hfs else None  # the faster HF variant
        mgs = [r for r in group if r["impl"] in MG_IMPLS]
        mg = max(mgs, key=lambda r: r["tokens_per_s"]) if mgs else None  # the faster Model Garden variant
        ours = [r for r in group if _ours(r)]
        if not ours:
            continue
        best = max(ours, key=lambda r: r["tokens_per_s"])
        goal = (GOALS if prec == "float32" else GOALS_16BIT)[mode]
        quoted = QUOTED_PEERS.get(key[:3], {}) if prec == "float32" else {}
        entry = {"mode": mode, "batch": b, "seq": s, "precision": prec, "best_ours": best["impl"],
                 "ours_tokens_per_s": best["tokens_per_s"], "goal_factor": goal}
        if prec != "float32":
            f32 = [r for r in rows if _group(r) == key[:3] and _precision(r) == "float32" and _ours(r)]
            if f32:
                ref = max(f32, key=lambda r: r["tokens_per_s"])
                ratio = best["tokens_per_s"] / ref["tokens_per_s"]
                lo, hi = ratio_interval(best["times_s"], ref["times_s"])
                entry.update(our_float32_impl=ref["impl"], our_float32_tokens_per_s=ref["tokens_per_s"],
                             ratio_vs_our_float32=ratio, ratio_vs_our_float32_interval_90=[lo, hi],
                             goal_vs_float32=GOALS_VS_F32[mode], goal_vs_float32_met=ratio >= GOALS_VS_F32[mode])
        if hf:
            entry.update(hf_impl=hf["impl"], hf_tokens_per_s=hf["tokens_per_s"],
                         ratio_vs_hf_same_run=best["tokens_per_s"] / hf["tokens_per_s"])
        if mg:
            entry.update(mg_impl=mg["impl"], mg_tokens_per_s=mg["tokens_per_s"],
                         ratio_vs_mg_same_run=best["tokens_per_s"] / mg["tokens_per_s"])
        if mg:  # the best peer, measured side by side
            peer = max([x for x in (hf, mg) if x], key=lambda r: r["tokens_per_s"])
            entry.update(best_peer_source="measured", best_peer_impl=peer["impl"],
                         best_peer_same_run=peer["tokens_per_s"])
        elif hf and prec == "float32":  # fallback: HF scaled by the quoted Model Garden / HF ratio
            scale = max(quoted.values()) / quoted["hf_pytorch"] if quoted else 1.0
            entry.update(best_peer_source="estimate", best_peer_impl=hf["impl"],
                         best_peer_same_run=hf["tokens_per_s"] * scale,
                         best_peer_estimate_same_run=hf["tokens_per_s"] * scale, best_peer_scale_from_quotes=scale)
        elif hf:  # 16 bits: no quoted Model Garden figure to scale by
            peer = hf
            entry.update(best_peer_source="hf_only", best_peer_impl=hf["impl"], best_peer_same_run=hf["tokens_per_s"])
        if "best_peer_same_run" in entry:
            entry["ratio_vs_best_peer_same_run"] = best["tokens_per_s"] / entry["best_peer_same_run"]
            entry["goal_met_same_run"] = entry["ratio_vs_best_peer_same_run"] >= goal
        if entry.get("best_peer_source") in ("measured", "hf_only"):
            lo, hi = ratio_interval(best["times_s"], peer["times_s"])
            entry.update(ratio_interval_90=[lo, hi], goal_met_at_lower_bound=lo >= goal)
        if quoted:
            entry.update(quoted_best_peer=max(quoted.values()),
                         ratio_vs_quoted_best_peer=best["tokens_per_s"] / max(quoted.values()))
            entry["goal_met_vs_quoted"] = entry["ratio_vs_quoted_best_peer"] >= goal
        out.append(entry)
    return out


def print_goals(goals):
    print("\ngoals (ours best variant / best peer in the same precision; wanted >= 1.3x inference, 1.5x training "
          "in float32, 1.5x in 16 bits; 16 bits / our float32: >= 3x inference, 2x training):")
    for g in goals:
        prec = SHORT.get(g["precision"], g["precision"])
        line = (f"  {g['mode']:<6}{g['batch']}x{g['seq']:<5} {prec:<5}{g['best_ours']:<9}"
                f"{g['ours_tokens_per_s']:>7.0f} tok/s")
        if "ratio_vs_our_float32" in g:
            lo, hi = g["ratio_vs_our_float32_interval_90"]
            line += (f" | {g['ratio_vs_our_float32']:.2f}x our float32 ({lo:.2f}-{hi:.2f}) -> "
                     f"{'met' if g['goal_vs_float32_met'] else 'NOT met'}")
        if "ratio_vs_best_peer_same_run" in g:
            parts = []
            if "ratio_vs_hf_same_run" in g:
                parts.append(f"{g['ratio_vs_hf_same_run']:.2f}x HF ({g['hf_impl']})")
            if "ratio_vs_mg_same_run" in g:
                parts.append(f"{g['ratio_vs_mg_same_run']:.2f}x Model Garden ({g['mg_impl']})")
            if g["best_peer_source"] == "measured":
                peer = f"measured best peer {g['best_peer_impl']}"
            elif g["best_peer_source"] == "hf_only":
                peer = f"HF {g['best_peer_impl']} (Model Garden not run)"
            else:
                peer = f"best-peer estimate (HF x {g['best_peer_scale_from_quotes']:.2f}; Model Garden not run)"
            line += (f" | same run: {', '.join(parts)}; {g['ratio_vs_best_peer_same_run']:.2f}x {peer} -> "
                     f"{'met' if g['goal_met_same_run'] else 'NOT met'}")
            if "ratio_interval_90" in g:
                lo, hi = g["ratio_interval_90"]
                line += f" (90% interval {lo:.2f}-{hi:.2f}x)"
        if "ratio_vs_quoted_best_peer" in g:
            line += (f" | vs quoted {g['quoted_best_peer']}: {g['ratio_vs_quoted_best_peer']:.2f}x -> "
                     f"{'met' if g['goal_met_vs_quoted'] else 'NOT met'} (other machine)")
        print(line)


def baseline_summary(rows):
    """This checkout's tokens/s over the --baseline-root checkout's, per implementation and configuration,
    with the 90% bootstrap interval."""
    out = []
    for r in rows:
        base = next((b for b in rows if b["impl"] == r["impl"] + "_base" and _group(b) == _group(r)
                     and _precision(b) == _precision(r)), None)
        if base:
            lo, hi = ratio_interval(r["times_s"], base["times_s"])
            out.append({"mode": r["mode"], "batch": r["batch"], "seq": r["seq"], "impl": r["impl"],
                        "precision": _precision(r),
                        "tokens_per_s": r["tokens_per_s"], "baseline_tokens_per_s": base["tokens_per_s"],
                        "ratio": r["tokens_per_s"] / base["tokens_per_s"], "ratio_90": [lo, hi]})
            print(f"this checkout vs --baseline-root, {r['mode']} {r['batch']}x{r['seq']} {r['impl']} "
                  f"{_precision(r)}: "
                  f"{r['tokens_per_s']:.0f} vs {base['tokens_per_s']:.0f} tok/s = {out[-1]['ratio']:.3f}x "
                  f"(90%: {lo:.3f}-{hi:.3f})")
    return out


def print_skipped(skipped):
    for k in skipped:
        print(f"not run: {k['mode']} {k['batch']}x{k['seq']} {k['impl']} {k.get('precision', 'float32')} "
              f"({IMPLS.get(k['impl'], '?')}): "
              f"{k['reason']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--matmul-worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--matmul", type=int, default=2048,
                   help="first, an N x N tf.matmul in float32 / bfloat16 / float16 (GFLOP/s; shows whether this host "
                        "has native 16-bit matmuls); 0 skips it (--quick skips it)")
    p.add_argument("--quick", action="store_true",
                   help="one small configuration (inference 1x128; ours and HF only), < 2 min")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per configuration (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per worker first (incl. compilation)")
    p.add_argument("--modes", default="infer,train",
                   help="comma list of infer,train; 'matmul' alone: only the --matmul probe")
    p.add_argument("--infer-shapes", default="8x128,2x512,1x512", help="batch x seq list for inference")
    p.add_argument("--train-shapes", default="8x128,2x512", help="batch x seq list for training")
    p.add_argument("--shapes", help="override both shape lists")
    p.add_argument("--impls", help=f"inference: comma list of {','.join(IMPLS)} (default: "
                                   "tf,tf_xla,mg,torch,torch1; mg only if the Model Garden python exists)")
    p.add_argument("--train-impls", help="training: comma list, as --impls (default: tf,tf_xopt,tf_xla,mg,"
                                         "torch,torch1; mg only if the Model Garden python exists)")
    mg_default = os.environ.get("XLNET_TF_MG_PYTHON") or (MG_DEFAULT_PYTHON if os.path.exists(MG_DEFAULT_PYTHON)
                                                          else None)
    p.add_argument("--mg-python", default=mg_default,
                   help="python of the Model Garden venv (benchmarks/setup_peer_model_garden.sh) for the mg and "
                        "mg_noxla workers (default: $XLNET_TF_MG_PYTHON, else %(default)s)")
    p.add_argument("--baseline-root", help="another checkout of this repository (e.g. `git worktree add /tmp/old REV`, "
                                           "its kernels built there): the *_base implementations run its xlnet_tf")
    p.add_argument("--train-dropout", type=float, default=0.1, help="dropout (and dropatt) in the training step")
    p.add_argument("--torch-threads", type=int, default=2, help="threads of the 'torch' worker ('torch1': 1)")
    p.add_argument("--n-layer", type=int, default=BASE["n_layer"])
    p.add_argument("--precisions", default="auto",
                   help="comma list of xlnet_tf.hardware.PRECISIONS, or auto (default): float32 and the 16-bit "
                        "precisions this host's device computes natively (xlnet_tf.hardware)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                   help="auto (default): a visible GPU, else the CPU; cpu hides the GPUs from the workers")
    p.add_argument("--min-free-mb", type=int, default=7000,
                   help="start a worker only with this much MemAvailable (workers of a group run side by side)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "backbone.json"))
    p.add_argument("--log", default=os.path.join(HERE, "results", "backbone_workers.log"))
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.matmul_worker:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
        print(PROTO + json.dumps(matmul_probe(args.matmul_worker)), flush=True)
        return None

    args.shape = dict(BASE, n_layer=args.n_layer)
    host = detect_host(args.device)
    if args.device == "auto":
        args.device = "gpu" if host.gpus else "cpu"
    if args.device == "gpu" and not host.gpus:
        p.error("--device gpu: no GPU found (no nvidia-smi, or TensorFlow sees none)")
    if args.precisions == "auto":
        precisions = list(host.native_precisions(args.device))
    else:
        precisions = [x for x in args.precisions.split(",") if x]
        from xlnet_tf.hardware import PRECISIONS  # this checkout's (detect_host put it on the path)

        bad = set(precisions) - set(PRECISIONS)
        if bad:
            p.error(f"unknown precision(s) {', '.join(sorted(bad))}; known: {', '.join(PRECISIONS)}")
    args.mg_python_ok = bool(args.mg_python) and os.path.isfile(args.mg_python) and os.access(args.mg_python, os.X_OK)
    mg = ",mg" if args.mg_python_ok else ""
    torch1 = ",torch1" if args.device == "cpu" else ""  # a thread setting: CPU only
    user_impls = args.impls
    args.impls = args.impls or f"tf,tf_xla{mg},torch{torch1}"
    args.train_impls = args.train_impls or f"tf,tf_xopt,tf_xla{mg},torch{torch1}"
    parse = lambda s: [tuple(int(v) for v in x.split("x")) for x in s.split(",") if x]  # noqa: E731
    groups = []
    if args.quick:
        args.reps, args.warmup, args.matmul = min(args.reps, 3), 1, 0
        groups = [("infer", 1, 128)]
        args.impls = user_impls or "tf,tf_xla,torch" + torch1
        if args.out == p.get_default("out"):
            args.out = os.path.join(HERE, "results", "backbone_quick.json")
    else:
        modes = args.modes.split(",")
        if set(modes) - {"infer", "train", "matmul"}:
            p.error(f"--modes: expected a comma list of infer,train (or matmul), got {args.modes!r}")
        ishapes = parse(args.shapes or args.infer_shapes)
        tshapes = parse(args.shapes or args.train_shapes)
        groups = [("infer", b, s) for b, s in ishapes if "infer" in modes]
        groups += [("train", b, s) for b, s in tshapes if "train" in modes]
    unknown = {i for i in (args.impls + "," + args.train_impls).split(",") if i} - set(IMPLS)
    if "_base" in args.impls + args.train_impls and not args.baseline_root:
        p.error("the *_base implementations need --baseline-root")
    if unknown:
        p.error(f"unknown implementation(s) {', '.join(sorted(unknown))}; known: {', '.join(IMPLS)}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    info = machine_info()
    print(f"machine: {info['nproc']} cpu(s), {info['cpu_model']}; TF {info['versions'].get('tensorflow')}, "
          f"torch {info['versions'].get('torch')}, transformers {info['versions'].get('transformers')}; "
          f"TF_ENABLE_ONEDNN_OPTS={info['TF_ENABLE_ONEDNN_OPTS']}; load {os.getloadavg()}", flush=True)
    info.update(device=args.device, host=host.describe(), gpu_capabilities=list(host.gpus),
                native_precisions=list(host.native_precisions(args.device)))
    print(f"device: {args.device} ({host.describe()}); precisions: {', '.join(precisions)} "
          f"(native here: {', '.join(info['native_precisions'])})", flush=True)
    print(f"Model Garden python: {args.mg_python if args.mg_python_ok else 'not found'}"
          f"{'' if args.mg_python_ok else ' (mg rows skipped; benchmarks/setup_peer_model_garden.sh makes it)'}",
          flush=True)
    t_start = time.time()
    rows, skipped = [], []
    with open(args.log, "w") as log:
        matmul = run_matmul_probe(args.matmul, args, log) if args.matmul else None
        for mode, b, s in groups:
            impls = [i for i in (args.impls if mode == "infer" else args.train_impls).split(",")
                     if i and (not i.startswith("tf_xopt") or mode == "train")]
            print(f"... {mode} {b}x{s}: {', '.join(impls)} x {', '.join(precisions)} ({args.reps} interleaved reps)",
                  flush=True)
            r, sk = run_group(mode, b, s, impls, args, log, precisions)
            rows += r
            skipped += sk
    add_precision_ratios(rows)
    if rows:
        print()
        print_table(rows)
    print_skipped(skipped)
    goals = goal_summary(rows)
    if goals:
        print_goals(goals)
    baseline = baseline_summary(rows) if args.baseline_root else []
    result = {"command": " ".join([os.path.relpath(sys.executable, ROOT), "benchmarks/backbone.py"] +
                                  (sys.argv[1:] if argv is None else list(argv))),
              "machine": info, "model_garden_python": args.mg_python if args.mg_python_ok else None,
              "model_shape": args.shape, "reps": args.reps, "warmup": args.warmup, "precisions": precisions,
              "matmul": matmul,
              "train_dropout": args.train_dropout, "torch_threads": args.torch_threads,
              "loss": "mean(sequence_output**2); Adam lr 1e-5 on every weight the forward uses",
              "inputs": "random ids, two segments (A|B halves), all-ones padding mask",
              "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
              "wall_s": time.time() - t_start, "load_end": os.getloadavg(), "rows": rows, "skipped": skipped,
              "baseline_root": args.baseline_root, "vs_baseline": baseline,
              "quoted_peers": {f"{m} {b}x{s}": v for (m, b, s), v in QUOTED_PEERS.items()}, "goals": goals}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
