#!/usr/bin/env python
"""Time per SST-2 epoch on real text lengths: batches padded to max_seq_length vs to their own longest example,
ours against HuggingFace PyTorch's dynamic padding, side by side in one run (XLNet-Base shape, random weights:
the cost does not depend on the values), and where a step's time goes.

    python benchmarks/real_lengths.py                  # XLNet-Base, batch 32, L 128 -> results/real_lengths.json
    python benchmarks/real_lengths.py --quick          # 2 layers (a smoke run of the script)

An epoch is 2,104 batches of 32 SST-2 sentences; what it costs is the sum over its batches of one fine-tuning
step (forward, loss, backward, clipping, AdamW update; dropout 0.1) at the batch's padded length T. So:

1. **Epoch plans** (no model): every sampler draws a whole epoch of the real SST-2 train sentences (XLNet's
   spiece.model, ``A <sep> <cls>``) and yields its padded lengths:
   * ``ours_fixed``: every batch [32, 128] (the TFRecords' layout);
   * ``ours_m{1,2,4,8}``: ``--length_buckets`` (``data/lengths.py``): examples grouped by their length rounded
     up to a multiple of m, each batch padded to that length (``--length_multiple``: the trainer's default is 2
     on a CPU and 8 with a GPU or TPU, ``data.lengths.default_multiple``; 1 and 4 show the cost of the other
     roundings: fewer padded tokens, more lengths to compile);
   * ``hf_dynamic``: random batches padded to their longest (``Trainer`` + ``DataCollatorWithPadding``);
   * ``hf_grouped``: the same with ``group_by_length`` (mega-batches of 50 batches sorted by length).
2. **Step time by padded length**: each implementation in its OWN worker process (two frameworks' thread pools
   in one process slow each other: OpenMP threads spin after a step), fed [32, T] batches for T on a grid, in
   interleaved rounds (ours, then HF, alternating who goes first); medians per T, linear in between. Ours also
   pays once per new padded length to compile its small XLA clusters (first step at a length minus the median).
3. **Epoch time** = sum over the plan's batches of the step time at T (+ ours' compilations per length met).
4. **Where the time goes**: forward, forward + backward, and the optimizer update (clip + AdamW) alone, timed
   in each worker at T = 16 (a typical SST-2 batch).
Serving: texts/s from raw text: our SavedModel (each request in length groups, ``xlnet_tf.export.run_in_groups``;
and as one call padded to the request's longest, ``ours_one_call``; and the export computing in bfloat16,
``ours_bf16``, with its probabilities' largest difference from the float32 export's) against HF padded to each
call's longest and to max_seq_length, and against ONNX Runtime (``--ort_variants ort,ort_int8``: HF's model
exported by ``torch.onnx.export``, float32 and int8 dynamic quantisation, every graph optimisation, 2 threads,
HF's tokenizer; install it with ``benchmarks/setup_peer_onnxruntime.sh``), OpenVINO on that same graph
(``--ov_variants ov,ov_bf16``), and our own ONNX / OpenVINO exports served by their ``serve.py`` without TensorFlow
(``--ours_variants ours_onnx,ours_openvino,ours_openvino_bf16``; PERFORMANCE.md "Serving in other runtimes"). A short serving-only run:
``--training 0 --serving_reps 1 --hf_variants hf --hf_threads 2``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import resource
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import bench_util  # noqa: E402
from bench_util import PROTO, cpu_flags, cpu_model, shared_dir, versions, write_json  # noqa: E402

BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)
QUICK = dict(n_layer=2, d_model=768, n_head=12, d_head=64, d_inner=3072)
MULTIPLES = (1, 2, 4, 8)


def sst2_ids(tok):
    """Token ids of every SST-2 train sentence, as the classifier lays them out (A <sep> <cls>), truncated."""
    from xlnet_tf.tasks.classification.registry import get_task

    task = get_task("sst-2")
    exs = task.get_examples(os.path.join(shared_dir(), "glue", "SST-2"), "train")
    return [tok.encode(ex.text_a) for ex in exs]


# ============================================================================================ epoch plans
def ceil_to(n: int, m: int, cap: int) -> int:
    return min(cap, -(-n // m) * m)


def epoch_plans(lengths, batch: int, L: int, seed: int = 1):
    """{sampler: {padded length T: batches of an epoch}} for one epoch of ``lengths`` (see the module doc)."""
    import numpy as np

    lengths = np.minimum(np.asarray(lengths), L)
    rng = np.random.default_rng(seed)
    n = len(lengths) // batch
    plans = {"ours_fixed": {L: float(n)}}
    for m in MULTIPLES:  # group_by_window: every batch holds one rounded length; an epoch holds count / batch
        keys, counts = np.unique([ceil_to(int(x), m, L) for x in lengths], return_counts=True)
        plans[f"ours_m{m}"] = {int(k): c / batch for k, c in zip(keys, counts)}

    def tally(batches):
        out = {}
        for b in batches:
            T = int(lengths[b].max())
            out[T] = out.get(T, 0) + 1
        return out

    order = rng.permutation(len(lengths))
    plans["hf_dynamic"] = tally(order[i * batch:(i + 1) * batch] for i in range(n))
    mega = 50 * batch  # transformers' LengthGroupedSampler (mega-batches sorted by length, longest first)
    grouped = np.concatenate([sorted(order[i:i + mega], key=lambda j: -lengths[j])
                              for i in range(0, len(order), mega)])
    plans["hf_grouped"] = tally(grouped[i * batch:(i + 1) * batch] for i in range(n))
    return plans


def step_time(grid_times, T: int) -> float:
    """Median step seconds at T, linear between grid lengths (and beyond the ends)."""
    xs = sorted(grid_times)
    i = min(max(bisect.bisect_left(xs, T), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = grid_times[x0], grid_times[x1]
    return max(y0 + (y1 - y0) * (T - x0) / (x1 - x0), 1e-6)


# ================================================================================================ workers
def build_ours(spec):
    """One training step of our classifier through the Trainer (the runner's path), on the schedule's shapes;
    ``spec["root"]``: another checkout's library (``--also``)."""
    if spec.get("root"):
        sys.path.insert(0, spec["root"])
    import numpy as np
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel
    from xlnet_tf.training import TrainConfig, Trainer
    try:
        from xlnet_tf.train_step import loss_fn
    except ImportError:  # a checkout from before xlnet_tf/train_step.py (--also)
        from xlnet_tf.training import loss_fn

    B, schedule = spec["batch"], spec["schedule"]
    cfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.1, dropatt=0.1, **spec["config"])
    rng = np.random.default_rng(0)

    def batch(T):
        return {"input_ids": rng.integers(10, 32000, (B, T)).astype(np.int32),
                "segment_ids": np.zeros((B, T), np.int32), "padding_mask": np.ones((B, T), np.int32),
                "label": rng.integers(0, 2, B).astype(np.int32)}

    sig = {k: tf.TensorSpec([B, None], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")}
    sig["label"] = tf.TensorSpec([B], tf.int32)
    dataset_fn = lambda ctx: tf.data.Dataset.from_generator(lambda: (batch(T) for T in schedule),
                                                            output_signature=sig)
    model_fn = lambda: TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head),
                                 seed=1)
    trainer = Trainer(model_fn, dataset_fn, TrainConfig(learning_rate=2e-5, train_steps=10 ** 9, progress=False,
                                                       seed=1, clip_norm=1.0))

    def step():
        trainer.train(stop_at=int(trainer.step.numpy()) + 1)

    model, tvars = trainer.model, trainer.train_vars
    sources, per_example = [v.value for v in tvars], loss_fn(model)

    @tf.function
    def forward(f):
        return tf.reduce_mean(per_example(f, model(f, training=True)))

    @tf.function
    def forward_backward(f):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(sources)
            loss = tf.reduce_mean(per_example(f, model(f, training=True)))
        return [None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(loss, sources)]

    def parts(T):
        f = {k: tf.constant(v) for k, v in batch(T).items()}
        grads = forward_backward(f)
        live = [v for v, g in zip(tvars, grads) if g is not None]
        grads = [g for g in grads if g is not None]

        live_index = tuple(i for i, v in enumerate(tvars) if any(v is w for w in live))

        @tf.function
        def update(grads):  # the trainer's own update after the gradients: norm, clip, AdamW
            if hasattr(trainer, "apply_update"):
                return trainer.apply_update(grads, live_index)
            return jit_update(grads)  # a checkout from before Trainer.apply_update (--also): its update then

        @tf.function(jit_compile=trainer.jit == "update")
        def jit_update(grads):
            grads, _ = tf.clip_by_global_norm(grads, 1.0)
            trainer.optimizer.apply(grads, live)

        return {"forward": lambda: forward(f).numpy(), "forward_backward": lambda: forward_backward(f)[-1].numpy(),
                "update": lambda: (update(grads), tvars[0].numpy())}

    return step, parts, trainer.jit


def build_hf(spec):
    """HF ``XLNetForSequenceClassification``: what ``Trainer``'s training step does (loss, backward, clip 1.0,
    torch AdamW, zero_grad), on the schedule's shapes."""
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(1)
    B, schedule = spec["batch"], iter(spec["schedule"])
    c = spec["config"]
    hcfg = transformers.XLNetConfig(vocab_size=32000, d_model=c["d_model"], n_layer=c["n_layer"], n_head=c["n_head"],
                                    d_inner=c["d_inner"], ff_activation="gelu_new", untie_r=True, dropout=0.1,
                                    num_labels=2)
    model = transformers.XLNetForSequenceClassification(hcfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    rng = np.random.default_rng(0)

    def batch(T):
        return dict(input_ids=torch.from_numpy(rng.integers(10, 32000, (B, T))),
                    attention_mask=torch.ones(B, T, dtype=torch.long),
                    token_type_ids=torch.zeros(B, T, dtype=torch.long),
                    labels=torch.from_numpy(rng.integers(0, 2, B)))

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    def step():
        model(**batch(next(schedule))).loss.backward()
        update()

    def parts(T):
        f = batch(T)

        def forward_backward():
            model(**f).loss.backward()

        def upd():
            for p in model.parameters():
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        return {"forward": lambda: model(**f).loss.item(), "forward_backward": forward_backward, "update": upd}

    return step, parts, None


def worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    if spec.get("serving"):
        serve, jit = build_serving(spec), None
        with open(spec["texts"]) as f:
            texts = json.load(f)
    else:
        step, parts, jit = (build_ours if spec["impl"] == "ours" else build_hf)(spec)
    print(f"{PROTO}READY " + json.dumps({"jit": jit}), flush=True)
    for line in sys.stdin:
        cmd = line.split(maxsplit=4)
        if cmd[0] == "serve":
            L, batch, calls, name = int(cmd[1]), int(cmd[2]), int(cmd[3]), json.loads(cmd[4])
            chunks = [texts[name][i * batch:(i + 1) * batch] for i in range(calls)]
            t = time.perf_counter()
            probs = [p for c in chunks for p in serve(L, c).tolist()]
            print(f"{PROTO}SERVED " + json.dumps({"seconds": time.perf_counter() - t, "probabilities": probs}),
                  flush=True)
        elif cmd[0] == "step":
            t = time.perf_counter()
            step()
            print(f"{PROTO}TIME {time.perf_counter() - t!r}", flush=True)
        elif cmd[0] == "parts":
            out = {}
            for name, fn in parts(int(cmd[1])).items():
                fn()
                times = []
                for _ in range(int(cmd[2])):
                    t = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t)
                out[name] = statistics.median(times)
            print(f"{PROTO}PARTS " + json.dumps(out), flush=True)
        elif cmd[0] == "stop":
            break
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{PROTO}DONE " + json.dumps({"peak_rss_mb": rss}), flush=True)


class Worker(bench_util.Worker):
    def __init__(self, spec, log):
        self.impl = spec.get("name", spec["impl"])
        super().__init__(__file__, spec, log, self.impl + (f" {spec['threads']}t" if "threads" in spec else ""))
        self.ready = json.loads(self.expect("READY"))


def time_grid(config, batch, grid, reps, log, also=(), hf=True):
    """{impl: {T: [seconds...]}}, {impl: {T: first-step seconds}}, {impl: parts at T=16}, {impl: peak RSS};
    ``also``: {name: checkout} of more of our workers (a before/after); ``hf``: HF's worker too."""
    schedule = list(grid) + [T for _ in range(reps) for T in grid]  # a warm-up step at each length, then rounds
    workers = [Worker(dict(impl=impl, config=config, batch=batch, schedule=schedule), log)
               for impl in (("ours", "hf") if hf else ("ours",))]
    workers += [Worker(dict(impl="ours", name=name, root=root, config=config, batch=batch, schedule=schedule), log)
                for name, root in dict(also).items()]
    times = {w.impl: {T: [] for T in grid} for w in workers}
    first = {w.impl: {} for w in workers}
    for i, T in enumerate(schedule):
        for w in (workers if i % 2 == 0 else workers[::-1]):  # interleaved, alternating who goes first
            sec = float(w.ask("step", "TIME"))
            if i < len(grid):
                first[w.impl][T] = sec  # first step at this length: ours compiles its XLA clusters
                continue
            times[w.impl][T].append(sec)
        if i >= len(grid):
            print(f"T={T}: " + ", ".join(f"{w.impl} {times[w.impl][T][-1]:.3f}s" for w in workers
                                          if times[w.impl][T]), flush=True)
    parts = {w.impl: json.loads(w.ask(f"parts 16 {max(reps, 3)}", "PARTS")) for w in workers}
    rss = {w.impl: json.loads(w.ask("stop", "DONE"))["peak_rss_mb"] for w in workers}
    return times, first, parts, rss, workers[0].ready["jit"]


def epoch_table(plans, times, first, L, default="ours_m2"):
    """Per sampler: batches, padded tokens, shapes met, epoch minutes (steps + ours' compilations); each
    ``--also`` worker's epoch with the default sampler (``{name}_m2``)."""
    med = {impl: {T: statistics.median(v) for T, v in t.items()} for impl, t in times.items()}
    compile_of = {impl: statistics.median([max(first[impl][T] - med[impl][T], 0.0) for T in first[impl]])
                  for impl in med if impl != "hf"}

    def row(plan, impl):
        steps = sum(n * step_time(med[impl], T) for T, n in plan.items())
        compile_total = compile_of.get(impl, 0.0) * len(plan)
        return {"batches": round(sum(plan.values())), "shapes": len(plan),
                "padded_tokens_per_batch": round(sum(n * T for T, n in plan.items()) / sum(plan.values()), 1),
                "compile_s": round(compile_total, 1), "epoch_minutes": round((steps + compile_total) / 60, 1)}

    rows = {name: row(plan, "hf" if name.startswith("hf") else "ours") for name, plan in plans.items()
            if "hf" in med or not name.startswith("hf")}
    rows.update({f"{impl}_m2": row(plans[default], impl) for impl in med if impl not in ("ours", "hf")})
    return rows, {impl: {T: round(v, 4) for T, v in m.items()} for impl, m in med.items()}, compile_of["ours"]


# ================================================================================================ serving
SERVE_BATCHES = {128: ((1, 24), (32, 3)), 512: ((1, 8), (32, 1))}  # (batch size, calls) per max_seq_length
OURS_SERVING = {"ours": "", "ours_one_call": "one_call_", "ours_bf16": "bf16_",  # worker -> export (dirs' prefix)
                "ours_no_tables": "no_tables_", "ours_rounded": "rounded_"}
ORT_SERVING = {"ort": "onnx", "ort_int8": "onnx_int8"}  # ONNX Runtime workers -> their model file (dirs' key)
ORT_THREADS = 2
# Our ONNX / OpenVINO exports (tasks/export_formats.py), served by their own serve.py (no TensorFlow in the
# worker): worker -> (export, precision); dirs' key ``{export}_{L}``.
FORMAT_SERVING = {"ours_onnx": ("format_onnx", "f32"), "ours_openvino": ("format_openvino", "f32"),
                  "ours_openvino_bf16": ("format_openvino", "bf16")}
# OpenVINO on HF's graph (the ONNX file torch.onnx.export wrote for the ``ort`` peer): worker -> precision.
OV_SERVING = {"ov": "f32", "ov_bf16": "bf16"}


def make_serving_models(config, tok, workdir, ours=("ours", "ours_one_call", "ours_bf16")):
    """One random XLNet-Base classifier (``last`` summary, 2 labels), exported as our SavedModels (L 128 and 512,
    in-graph tokenizer; in length groups, as one call: ``one_call_L``, and computing in bfloat16: ``bf16_L``, the
    same weights in a model built under ``mixed_bfloat16`` as ``--export_precision=bfloat16`` builds it; only the
    variants in ``ours``) and as a HuggingFace directory (``save_pretrained(format="huggingface")``): the same
    weights on every side."""
    import keras
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification.serving import ClassifierServing
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    model = serving_model(config)
    cfg = model.config
    dirs = {"hf": os.path.join(workdir, "hf")}
    model.save_pretrained(dirs["hf"], format="huggingface")
    if "ours_bf16" in ours:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            bf16 = TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=1)
            bf16.build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
        finally:
            keras.mixed_precision.set_global_policy("float32")
        bf16.set_weights(model.get_weights())
    for L in SERVE_BATCHES:
        dirs[L] = ClassifierServing(model, tok, L, label_names=["0", "1"]).export(os.path.join(workdir, f"ours_{L}"))
        if "ours_one_call" in ours:
            one_call = ClassifierServing(model, tok, L, label_names=["0", "1"])
            one_call.max_groups = 1
            dirs[f"one_call_{L}"] = one_call.export(os.path.join(workdir, f"ours_one_call_{L}"))
        if "ours_rounded" in ours:  # the export before exact single rows (batch 1 rounded up to a multiple of 8)
            rounded = ClassifierServing(model, tok, L, label_names=["0", "1"])
            rounded.exact_single_row = False
            dirs[f"rounded_{L}"] = rounded.export(os.path.join(workdir, f"ours_rounded_{L}"))
        if "ours_no_tables" in ours:  # the export before its positional tables (each block projects them)
            no_tables = ClassifierServing(model, tok, L, label_names=["0", "1"])
            no_tables.precomputed_positions = False
            dirs[f"no_tables_{L}"] = no_tables.export(os.path.join(workdir, f"ours_no_tables_{L}"))
        if "ours_bf16" in ours:
            dirs[f"bf16_{L}"] = ClassifierServing(bf16, tok, L, label_names=["0", "1"]).export(
                os.path.join(workdir, f"ours_bf16_{L}"))
    formats = sorted({FORMAT_SERVING[v][0] for v in ours if v in FORMAT_SERVING})
    if formats:  # each written by a process of its own (a converter's copies of the graph leave with it)
        import subprocess

        import numpy as np

        weights = os.path.join(workdir, "weights.npz")
        np.savez(weights, *model.get_weights())
        for L in SERVE_BATCHES:
            for fmt in formats:
                dirs[f"{fmt}_{L}"] = os.path.join(workdir, f"ours_{fmt}_{L}")
                subprocess.run([sys.executable, os.path.abspath(__file__), "--export_format",
                                json.dumps(dict(config=config, weights=weights, L=L, format=fmt[len("format_"):],
                                                path=dirs[f"{fmt}_{L}"]))], check=True)
    return dirs


def serving_model(config):
    """The random XLNet-Base-shaped classifier every serving side gets the weights of."""
    import tensorflow as tf

    from xlnet_tf import XLNetConfig
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0, **config)
    model = TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=1)
    model.build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    return model


def export_format(spec):
    """``--export_format SPEC``: the serving model with the saved weights, exported by
    ``tasks/export_formats.py`` in the format asked (its own process); prints the peak RSS."""
    import numpy as np

    from xlnet_tf import XLNetTokenizer
    from xlnet_tf.tasks import export_formats
    from xlnet_tf.tasks.classification.serving import ClassifierServing

    model = serving_model(spec["config"])
    with np.load(spec["weights"]) as w:
        model.set_weights([w[f"arr_{i}"] for i in range(len(w.files))])
    tok = XLNetTokenizer(os.path.join(shared_dir(), "spiece", "spiece.model"))
    t = time.perf_counter()
    export_formats.export(ClassifierServing(model, tok, spec["L"], label_names=["0", "1"]), spec["path"],
                          spec["format"])
    print(f"export {spec['format']} L {spec['L']}: {time.perf_counter() - t:.1f} s, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)


def export_onnx(hf_dir: str, out_dir: str) -> dict:
    """The HF directory's ``XLNetForSequenceClassification`` -> ONNX (``torch.onnx.export``, its default
    exporter; batch and length dynamic; inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` as HF's
    tokenizer returns them, output the softmax ``probabilities``), and its int8 dynamic quantisation
    (``onnxruntime.quantization.quantize_dynamic``, int8 weights): {"onnx": path, "onnx_int8": path}. Run in a
    process of its own (``--export_onnx``): torch and TensorFlow stay apart. The mask goes in as float: the model
    computes ``1.0 - attention_mask``, which the exporter cannot take for an integer tensor."""
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = transformers.XLNetForSequenceClassification.from_pretrained(hf_dir).eval()

    class Probabilities(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            logits = self.m(input_ids=input_ids, attention_mask=attention_mask.float(),
                            token_type_ids=token_type_ids, use_mems=False).logits
            return torch.softmax(logits, -1)

    names = ["input_ids", "attention_mask", "token_type_ids"]
    b, t = torch.export.Dim("batch"), torch.export.Dim("length")
    example = tuple(torch.ones(2, 16, dtype=torch.long) for _ in names)
    paths = {"onnx": os.path.join(out_dir, "model.onnx"), "onnx_int8": os.path.join(out_dir, "model_int8.onnx")}
    os.makedirs(out_dir, exist_ok=True)
    with torch.inference_mode():
        torch.onnx.export(Probabilities(model).eval(), example, paths["onnx"], input_names=names,
                          output_names=["probabilities"], dynamo=True,
                          dynamic_shapes={n: {0: b, 1: t} for n in names})
    quantize_dynamic(paths["onnx"], paths["onnx_int8"], weight_type=QuantType.QInt8)
    return paths


def ort_session(path: str, threads: int = ORT_THREADS, profile_prefix: str = None):
    """An ONNX Runtime CPU session as a deployer sets it up: every graph optimisation, ``threads`` intra-op
    threads, sequential execution (``profile_prefix``: its per-node profile on)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def build_serving(spec):
    """serve(L, texts) -> probabilities [n, 2] for one call, from raw text."""
    import numpy as np

    if spec["impl"] in FORMAT_SERVING:  # the export's own serve.py: numpy + the runtime, no TensorFlow
        import importlib.util

        fmt, precision = FORMAT_SERVING[spec["impl"]]
        served = {}
        for L in SERVE_BATCHES:
            folder = spec["dirs"][f"{fmt}_{L}"]
            mod_spec = importlib.util.spec_from_file_location(f"serve_{L}", os.path.join(folder, "serve.py"))
            serve_py = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(serve_py)
            served[L] = serve_py.load(folder, precision=precision, threads=ORT_THREADS)
        return lambda L, texts: served[L](text_a=texts)["probabilities"]
    if spec["impl"] in OV_SERVING:
        import openvino as ov
        import transformers

        tok = transformers.XLNetTokenizer(spec["spm"])
        compiled = ov.Core().compile_model(spec["dirs"]["onnx"], "CPU", {
            "INFERENCE_PRECISION_HINT": OV_SERVING[spec["impl"]], "INFERENCE_NUM_THREADS": ORT_THREADS})

        def serve(L, texts):
            enc = tok(texts, padding="longest", truncation=True, max_length=L, return_tensors="np")
            out = compiled({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})
            return out[compiled.outputs[0]]
        return serve
    if spec["impl"] in OURS_SERVING:
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece op, as a serving process does)

        prefix = OURS_SERVING[spec["impl"]]
        fns = {L: tf.saved_model.load(spec["dirs"][f"{prefix}{L}"]).signatures["serving_default"]
               for L in SERVE_BATCHES}
        return lambda L, texts: fns[L](text_a=tf.constant(texts))["probabilities"].numpy()
    if spec["impl"] in ORT_SERVING:
        import transformers

        tok = transformers.XLNetTokenizer(spec["spm"])
        sess = ort_session(spec["dirs"][ORT_SERVING[spec["impl"]]])

        def serve(L, texts):
            enc = tok(texts, padding="longest", truncation=True, max_length=L, return_tensors="np")
            return sess.run(None, {k: enc[k].astype(np.int64) for k in
                                   ("input_ids", "attention_mask", "token_type_ids")})[0]
        return serve
    import torch
    import transformers

    torch.set_num_threads(spec["threads"])
    tok = transformers.XLNetTokenizer(spec["spm"])  # XLNet's tokenizer pads on the left, ends A <sep> <cls>
    model = transformers.XLNetForSequenceClassification.from_pretrained(spec["dirs"]["hf"]).eval()
    model.config.use_mems_eval = False  # no memory returned (the pipeline cannot batch-split its tuple)
    if spec["impl"] == "hf_pipeline":
        pipe = transformers.pipeline("text-classification", model=model, tokenizer=tok, device="cpu", top_k=None)

        def serve(L, texts):
            out = pipe(texts, batch_size=len(texts), truncation=True, max_length=L)
            return np.array([[d["score"] for d in sorted(o, key=lambda d: d["label"])] for o in out])
        return serve

    def serve(L, texts):
        with torch.inference_mode():
            enc = tok(texts, padding="max_length" if spec["impl"] == "hf_fixed" else "longest", truncation=True,
                      max_length=L, return_tensors="pt")
            return torch.softmax(model(**enc).logits, -1).numpy()
    return serve


def serving(config, tok, sets, reps, workdir, hf_threads, hf_variants, log, ours=("ours", "ours_one_call", "ours_bf16"),
            ort_variants=(), groups=None, batches=(), ov_variants=(), reuse_exports=False):
    """Texts/s from raw text, each implementation in its own worker, the same weights: our SavedModel (each call
    in length groups; and as one call padded to its longest text) vs HF's tokenizer + model (padded to the
    longest; and to max_seq_length, the per-token reference), HF's pipeline and ONNX Runtime on HF's model
    exported to ONNX (float32, and int8 dynamic quantisation); outputs compared with ours before timing;
    interleaved repetitions. ``groups``: lists of worker labels alive (and interleaved) together, run one group
    after the other (None: all at once); ours' answers from the first group are every group's reference.
    ``batches``: the (max_seq_length, batch size) pairs timed (empty: every one of ``SERVE_BATCHES``)."""
    made = os.path.join(workdir, "exports.json")  # what the last run in ``workdir`` wrote (--reuse_exports)
    if reuse_exports and os.path.exists(made):
        with open(made) as f:
            dirs = json.load(f)
    else:
        dirs = {str(k): v for k, v in make_serving_models(config, tok, workdir, ours).items()}
        if ort_variants or ov_variants:
            import subprocess

            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--export_onnx", dirs["hf"],
                                  os.path.join(workdir, "onnx")], stdout=subprocess.PIPE, stderr=log, text=True,
                                 check=True).stdout
            dirs.update(json.loads([x for x in out.splitlines() if x.startswith(PROTO + "ONNX ")][-1][len(PROTO) + 5:]))
        with open(made, "w") as f:
            json.dump(dirs, f)
    texts_path = os.path.join(workdir, "texts.json")
    with open(texts_path, "w") as f:
        json.dump({name: texts for name, (texts, L) in sets.items()}, f)
    specs = [dict(impl=i) for i in ours] + [dict(impl=i, threads=ORT_THREADS) for i in ort_variants]
    specs += [dict(impl=i, threads=ORT_THREADS) for i in ov_variants]
    specs += [dict(impl=i, threads=t) for t in hf_threads for i in hf_variants]
    label = lambda spec: spec["impl"] + (f" {spec['threads']}t" if "threads" in spec else "")  # noqa: E731
    by_label = {label(sp): sp for sp in specs}
    groups = [list(by_label)] if not groups else groups
    unknown = [x for g in groups for x in g if x not in by_label]
    if unknown:
        raise SystemExit(f"--serving_groups: unknown worker(s) {unknown}; known: {list(by_label)}")
    rows, refs = {}, {}
    for group in groups:
        workers = [Worker(dict(by_label[x], serving=True, dirs={str(k): v for k, v in dirs.items()},
                               texts=texts_path, spm=os.path.join(shared_dir(), "spiece", "spiece.model")), log)
                   for x in group]
        for name, (texts, L) in sets.items():
            for batch, calls in SERVE_BATCHES[L]:
                if batches and (L, batch) not in batches:
                    continue
                cmd = f"serve {L} {batch} {calls} {json.dumps(name)}"
                key = f"{name}, batch {batch}"
                row = rows.setdefault(key, {"max_prob_diff_vs_ours": {}})
                for w in workers:  # warm-up: every padded length met once; outputs compared with ours
                    probs = json.loads(w.ask(cmd, "SERVED"))["probabilities"]
                    ref = refs.setdefault(cmd, probs)
                    row["max_prob_diff_vs_ours"][w.label] = float(
                        f"{max(abs(a - b) for pa, pb in zip(probs, ref) for a, b in zip(pa, pb)):.3g}")
                per = {w.label: [] for w in workers}
                for r in range(reps):
                    for w in (workers if r % 2 == 0 else workers[::-1]):
                        per[w.label].append(batch * calls / json.loads(w.ask(cmd, "SERVED"))["seconds"])
                reps_of = row.setdefault("reps", {})  # a worker in several groups: its reps of all of them
                for lbl, v in per.items():
                    reps_of.setdefault(lbl, []).extend(round(x, 3) for x in v)
                    row[lbl] = round(statistics.median(reps_of[lbl]), 2)
                print(f"serving {key}: {row}", flush=True)
        for w in workers:
            w.ask("stop", "DONE")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=3, help="interleaved timed rounds over the grid")
    ap.add_argument("--grid", default="4,8,16,24,32,48,64,128", help="padded lengths timed")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max_seq_length", type=int, default=128)
    ap.add_argument("--serving_reps", type=int, default=3, help="interleaved repetitions of the serving timings "
                    "(0: no serving part)")
    ap.add_argument("--also", default="", help="other checkouts of this project, comma-separated: one more of our "
                    "training workers each, its epoch with the default sampler (a before/after)")
    ap.add_argument("--hf_training", type=int, default=1, help="0: no HF training worker (e.g. a before/after "
                    "with --also: three Base workers at T 128 need more than 24 GiB)")
    ap.add_argument("--out", default=None, help="results file name under benchmarks/results, without .json")
    ap.add_argument("--training", type=int, default=1, help="0: the serving part only")
    ap.add_argument("--hf_threads", default="2,1", help="torch threads of the HF serving workers (each its own)")
    ap.add_argument("--hf_variants", default="hf,hf_pipeline,hf_fixed", help="HF serving workers: tokenizer + model "
                    "padded to the longest (hf), its pipeline (hf_pipeline), padded to max_seq_length (hf_fixed); empty: none")
    ap.add_argument("--ours_variants", default="ours,ours_one_call,ours_bf16", help="our serving workers: in length "
                    "groups (ours), as one call (ours_one_call), the bfloat16 export (ours_bf16), without the "
                    "export's positional tables (ours_no_tables), batch 1 rounded up to a multiple of 8 (ours_rounded)")
    ap.add_argument("--ort_variants", default="", help="ONNX Runtime serving workers on HF's model exported to ONNX: "
                    "float32 (ort), int8 dynamic quantisation (ort_int8); needs benchmarks/setup_peer_onnxruntime.sh")
    ap.add_argument("--ov_variants", default="", help="OpenVINO serving workers on HF's model exported to ONNX "
                    "(the ort peers' file): float32 (ov), bfloat16 (ov_bf16: native-bf16 CPUs); our own exports are "
                    "ours_onnx, ours_openvino, ours_openvino_bf16 in --ours_variants")
    ap.add_argument("--serving_groups", default="", help="workers alive (and interleaved) together, groups run one "
                    "after the other: labels comma-separated, groups by '/', e.g. 'ours,ort/ours,ort_int8,hf 2t' "
                    "(default: all at once)")
    ap.add_argument("--serving_batches", default="", help="max_seq_length:batch pairs served, e.g. "
                    "'128:1,128:32,512:1' (default: all of SST-2 128:1, 128:32 and IMDB 512:1, 512:32)")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "recipes_work", "real_lengths"))
    ap.add_argument("--export_onnx", nargs=2, metavar=("HF_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--export_format", help=argparse.SUPPRESS)
    ap.add_argument("--reuse_exports", action="store_true", help="serve the exports the last run wrote in --workdir "
                    "(its exports.json) instead of writing them again (the same variants and weights)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.export_format:
        export_format(json.loads(args.export_format))
        return 0
    if args.export_onnx:
        print(PROTO + "ONNX " + json.dumps(export_onnx(*args.export_onnx)), flush=True)
        return 0
    from xlnet_tf import XLNetTokenizer

    config = QUICK if args.quick else BASE
    tok = XLNetTokenizer(os.path.join(shared_dir(), "spiece", "spiece.model"))
    L, B = args.max_seq_length, args.batch
    name = args.out or f"real_lengths{'_quick' if args.quick else ''}"
    path = os.path.join(HERE, "results", f"{name}.json")
    out = {}
    if os.path.exists(path):  # a run of one part keeps the other part of the last run
        with open(path) as f:
            out = json.load(f)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(HERE, "results", f"{name}.log"), "w") as log:
        if args.training:
            out.update(training_part(config, tok, args, L, B, log))
        if args.serving_reps:
            out["serving_texts_per_second"] = serving(
                config, tok, serving_sets(), args.serving_reps, args.workdir,
                [int(t) for t in args.hf_threads.split(",")], [v for v in args.hf_variants.split(",") if v], log,
                [v for v in args.ours_variants.split(",") if v], [v for v in args.ort_variants.split(",") if v],
                [[x.strip() for x in g.split(",") if x.strip()] for g in args.serving_groups.split("/") if g.strip()],
                [tuple(int(n) for n in p.split(":")) for p in args.serving_batches.split(",") if p],
                [v for v in args.ov_variants.split(",") if v], args.reuse_exports)
    out.update({"config": config, "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "flags": cpu_flags()},
                "versions": versions(["tensorflow", "keras", "torch", "transformers", "onnxruntime", "onnx",
                                      "onnxruntime-extensions", "openvino", "openvino-tokenizers", "tf2onnx"]),
                "command": shlex.join(["python", "benchmarks/real_lengths.py"] + list(argv or sys.argv[1:]))})
    write_json(path, out)
    return 0


def serving_sets():
    """SST-2 dev sentences (L 128) and IMDB test reviews (L 512), raw text."""
    import csv
    import tarfile

    with open(os.path.join(shared_dir(), "glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
        sst = [r[0] for r in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]
    reviews = []
    with tarfile.open(os.path.join(shared_dir(), "imdb", "aclImdb_v1.tar.gz"), "r:*") as tar:
        for m in tar:
            if m.isfile() and "/test/pos/" in m.name and m.name.endswith(".txt"):
                reviews.append(tar.extractfile(m).read().decode("utf-8").replace("<br />", " "))
                if len(reviews) >= 32:
                    break
    return {"SST-2 dev, L 128": (sst[:96], 128), "IMDB test, L 512": (reviews, 512)}


def training_part(config, tok, args, L, B, log):
    lengths = [min(len(r) + 2, L) for r in sst2_ids(tok)]
    plans = epoch_plans(lengths, B, L)
    grid = sorted({int(x) for x in args.grid.split(",")} | {L})
    also = {f"ours@{os.path.basename(os.path.normpath(d))}": os.path.abspath(d) for d in args.also.split(",") if d}
    times, first, parts, rss, jit = time_grid(config, B, grid, args.reps, log, also, hf=bool(args.hf_training))
    rows, med, compile_s = epoch_table(plans, times, first, L)
    ref_name = "hf_grouped" if "hf_grouped" in rows else "ours_m2"
    ref = rows[ref_name]["epoch_minutes"]
    print(f"\n| sampler | padded tokens / batch | shapes | epoch (min, {len(lengths) // B} batches of {B}) | "
          f"{ref_name} / this |")
    print("|---|---:|---:|---:|---:|")
    for v, r in rows.items():
        print(f"| {v} | {r['padded_tokens_per_batch']:.1f} | {r['shapes']} | {r['epoch_minutes']} | "
              f"{ref / r['epoch_minutes']:.2f}x |")
    print(f"\nstep seconds by padded length (median of {args.reps}): {json.dumps(med)}")
    print(f"ours: compilation per new padded length {compile_s:.2f} s (median); update jit: {jit}")
    print(f"one step at T=16 by part (s): {json.dumps(parts)}", flush=True)
    return {"batch": B, "max_seq_length": L, "train_examples": len(lengths),
            "real_tokens_per_example": round(statistics.mean(lengths), 2), "epochs": rows,
            "step_seconds_by_length": med, "first_step_seconds_by_length": first,
            "ours_compile_seconds_per_length": round(compile_s, 3), "ours_update_jit": jit,
            "step_parts_seconds_T16": parts, "peak_rss_mb": rss, "reps": args.reps}


if __name__ == "__main__":
    sys.exit(main())
