#!/usr/bin/env python
"""Where a short step and a served request go: TensorFlow's profiler trace of XLNet-Base work, each op's own time
summed by part, set against the part's FLOPs.

    python benchmarks/profile_parts.py                 # XLNet-Base -> results/profile_parts.json
    python benchmarks/profile_parts.py --quick         # 2 layers (a smoke run of the script)

Cases (each in a process of its own, random weights: the cost does not depend on the values):

* ``train_T{8,16,32}``: one fine-tuning step through the ``Trainer`` (forward, loss, backward, clip 1.0, AdamW;
  dropout 0.1), batch 32 at padded length T (an SST-2 epoch's batches are 8-32 long);
* ``serve_b1``: the classifier SavedModel (``ClassifierServing``, L 128, in-graph tokenizer) called with one real
  SST-2 dev sentence at a time, and the same model in-process (``model(features)``, the compiled kernels on)
  on the same ids, to show what the SavedModel loses;
* ``serve_b1_ort``: ONNX Runtime (``benchmarks/setup_peer_onnxruntime.sh``) on HF's classifier of the same shape
  exported to ONNX as ``real_lengths.py`` exports it (float32, every graph optimisation, 2 threads), the same
  sentences one at a time through HF's tokenizer, with ORT's own profiler (``SessionOptions.enable_profiling``):
  per node kind its time, the nodes a call runs, and the run's time outside the nodes (ORT's executor);
* ``serve_paths``: one classifier call at batch 1 (T 32 and 128) as the plain graph an export runs, XLA-compiled
  for the shape, and with the compiled attention kernels (what a SavedModel could carry instead);
* ``gen_b1``: greedy generation, prompt 32, batch 1, 32 new tokens (``Generator``), per new token.

For each case: warm-up calls, then ``tf.profiler.experimental`` traces ``--steps`` calls. From the trace's host
plane, every TensorFlow op event (``name:Type``) contributes its own time (its duration less the op events nested
in it on the same thread) to a part, by op type and name scope: matmuls (MatMul/BatchMatMul/Einsum, oneDNN's
fused forms), the compiled attention kernels, XLA clusters (``ops`` fusions, the AdamW update), LayerNorm, GELU,
softmax, dropout (its random numbers and masks), layout (reshape/transpose/concat/pad/slice/gather), the
tokenizer, and the rest. Ops run on two threads at once: each instant is shared equally by the ops running then,
so the parts add up to ``busy``, the union of the op intervals over all threads; ``wall - busy`` is the time no op
runs (Python, dispatch, the executor's scheduling, waiting for the input pipeline).

FLOPs are counted from the shapes (2 per multiply-add): the twelve layers' projections, attention (AC, BD over
the 2T relative positions, P.V), the feed-forward, and 2x the forward for the backward; ``matmul GFLOP/s`` is
that over the matmul part's time, next to the machine's rate on one large float32 matmul (``peak``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_util import cpu_flags, cpu_model, versions, write_json  # noqa: E402

BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)
QUICK = dict(n_layer=2, d_model=768, n_head=12, d_head=64, d_inner=3072)
CASES = ("train_T8", "train_T16", "train_T32", "serve_b1", "serve_b1_ort", "serve_paths", "gen_b1")
BATCH = 32
GEN_PROMPT, GEN_NEW = 32, 32

MATMUL_TYPES = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "_MklMatMul",
                "_MklFusedMatMul", "_FusedMatMul", "_MklBatchMatMul", "_MklBatchMatMulV2", "_MklEinsum",
                "_MklNativeFusedMatMul", "_MklFusedBatchMatMulV2", "_MklNativeBatchMatMulV2"}
LAYOUT_TYPES = {"Reshape", "Transpose", "_MklTranspose", "ConcatV2", "Pad", "PadV2", "Slice", "StridedSlice",
                "GatherV2", "ResourceGather", "Tile", "ExpandDims", "Squeeze", "Pack", "Unpack", "Split",
                "SplitV", "Identity", "ScatterNd", "TensorScatterUpdate", "StridedSliceGrad", "UnsortedSegmentSum",
                "ReverseV2", "GatherNd", "Fill", "BroadcastTo", "OneHot", "Range", "Shape", "ZerosLike",
                "OnesLike", "Cast", "Where", "SelectV2", "Select", "DynamicStitch", "ConcatOffset"}
RANDOM_TYPES = {"RandomUniform", "RandomUniformInt", "StatelessRandomUniformV2", "StatelessRandomUniform",
                "StatelessRandomBitsV2", "RngReadAndSkip", "StatelessRandomGetKeyCounter",
                "StatelessRandomUniformFullIntV2", "RandomStandardNormal", "StatelessRandomNormalV2"}
CONTROL_TYPES = {"While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall",
                 "__inference", "_Send", "_Recv", "NoOp", "Const", "_Arg", "_Retval", "ReadVariableOp",
                 "AssignVariableOp", "AssignAddVariableOp", "VarHandleOp", "Enter", "Exit", "Merge", "Switch",
                 "NextIteration", "LoopCond", "_HostSend", "_HostRecv", "IteratorGetNext", "Placeholder"}


def part_of(name: str, op_type: str) -> str:
    """The part an op belongs to, by its type and name scope."""
    low = name.lower()
    if op_type.startswith("Xlnet"):
        return "attention kernels (compiled)"
    if op_type in ("_XlaRun", "XlaLaunch", "_XlaCompile", "XlaCompile", "_XlaMerge") or "xla" in op_type.lower():
        return "XLA clusters (fused elementwise, update)"
    if "sentencepiece" in op_type.lower() or "tokeniz" in low:
        return "tokenizer"
    if op_type in MATMUL_TYPES or "MatMul" in op_type or "Einsum" in op_type:
        return "matmul"
    if op_type in RANDOM_TYPES or "dropout" in low:
        return "dropout (random numbers, masks)"
    if "layer_norm" in low or "layernorm" in low or op_type in ("_MklLayerNorm", "FusedBatchNormV3"):
        return "LayerNorm"
    if "gelu" in low or op_type in ("Erf", "Erfc", "Tanh", "TanhGrad"):
        return "GELU"
    if "softmax" in low or op_type in ("Softmax", "_MklSoftmax", "LogSoftmax"):
        return "softmax"
    if any(k in low for k in ("adam", "clip_by_global_norm", "global_norm", "optimizer")):
        return "optimizer update"
    if op_type in CONTROL_TYPES or op_type.startswith("__inference"):
        return "control, variables, function calls"
    if op_type in LAYOUT_TYPES:
        return "layout (reshape, transpose, concat, slice, gather)"
    return "other elementwise"


# an XLA cluster's work (its launch, and its thunks on whichever thread runs them); not ``BlockUntilReady``: the
# launching thread waiting, while the work is counted where it runs
XLA_EVENTS = ("CpuExecutable::ExecuteAsyncOnStream", "ThunkExecutor::Execute")


def _segments(line, meta):
    """One thread's innermost-event segments: (start_ps, end_ps, part, op type) for op events (``name:Type``) and
    XLA executions (an XLA cluster runs asynchronously: launched and waited for on the op's thread, executed on
    the intra-op pool's threads)."""
    events = []
    for e in line.events:
        name = meta[e.metadata_id].name
        if name in XLA_EVENTS:
            op_name, op_type, part = name, "XLA", "XLA clusters (fused elementwise, update)"
        elif ":" in name and "::" not in name and not name.startswith("EagerLocalExecute"):
            op_name, _, op_type = name.rpartition(":")
            if not op_type or " " in op_type:
                continue
            part = part_of(op_name, op_type)
        else:
            continue
        start = line.timestamp_ns * 1000 + e.offset_ps
        events.append((start, start + e.duration_ps, part, op_type))
    events.sort(key=lambda t: (t[0], -t[1]))
    out, stack, cursor = [], [], None  # stack: open events; cursor: where the innermost one's segment began

    def emit(until):
        if stack and until > cursor:
            out.append((cursor, until, stack[-1][2], stack[-1][3]))
    for ev in events:
        while stack and stack[-1][1] <= ev[0]:
            emit(stack[-1][1])
            cursor = stack.pop()[1]
        emit(ev[0])
        stack.append(ev)
        cursor = ev[0]
    while stack:
        emit(stack[-1][1])
        cursor = stack.pop()[1]
    return out


def op_times(xplane_path: str):
    """Per part: the time (s) its ops ran, concurrent ops sharing each instant equally (so the parts add up to
    ``busy``, the union of all op intervals); per op type the same."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    segments = []
    for plane in space.planes:
        if plane.name == "/host:CPU":
            for line in plane.lines:
                segments += _segments(line, plane.event_metadata)
    bounds = sorted([(s, 1, i) for i, (s, _, _, _) in enumerate(segments)]
                    + [(e, -1, i) for i, (_, e, _, _) in enumerate(segments)])
    parts, by_type, active, busy, last = collections.Counter(), collections.Counter(), set(), 0, None
    for t, kind, i in bounds:
        if active and t > last:
            share = (t - last) / len(active)
            busy += t - last
            for j in active:
                parts[segments[j][2]] += share
                by_type[segments[j][3]] += share
        last = t
        (active.add if kind == 1 else active.discard)(i)
    return ({k: v / 1e12 for k, v in parts.items()}, {k: v / 1e12 for k, v in by_type.most_common(25)},
            busy / 1e12)


def op_counts(xplane_path: str, layer_scope: str = r"/layer_0(_\d+)?/"):
    """How many TensorFlow op events (``name:Type``, not control or variable reads) the trace holds, and how many
    of them are in block 0's name scope (one layer's ops), by op type too."""
    import re

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    total, layer, layer_types = 0, 0, collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                if ":" not in name or "::" in name or name.startswith("EagerLocalExecute"):
                    continue
                op_name, _, op_type = name.rpartition(":")
                if not op_type or " " in op_type or op_type in CONTROL_TYPES or op_type.startswith("__inference"):
                    continue
                total += 1
                if re.search(layer_scope, op_name):
                    layer += 1
                    layer_types[op_type] += 1
    return total, layer, dict(layer_types.most_common())


def forward_flops(cfg, B: int, T: int, klen: int = None, rlen: int = None, r_rows: int = None) -> dict:
    """Multiply-add FLOPs (x2) of one forward by part: projections, attention, feed-forward."""
    d, di, L = cfg["d_model"], cfg["d_inner"], cfg["n_layer"]
    klen = T if klen is None else klen
    rlen = klen + T if rlen is None else rlen
    r_rows = B if r_rows is None else r_rows
    proj = 2 * B * T * d * d * 4 + 2 * r_rows * rlen * d * d
    attn = 2 * B * T * klen * d * 2 + 2 * B * T * rlen * d
    ff = 2 * 2 * B * T * d * di
    return {"projections": L * proj, "attention": L * attn, "feed_forward": L * ff}


def profile(fn, steps: int, logdir: str):
    """Traces ``steps`` calls of ``fn``; returns (wall s per call, parts, top op types, busy s) per call."""
    import tensorflow as tf

    walls = []
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    tf.profiler.experimental.stop()
    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)[-1]
    parts, types, busy = op_times(path)
    ops, layer_ops, layer_types = op_counts(path)
    return {"ops_per_call": ops / steps, "ops_per_call_layer_0": layer_ops / steps,
            "op_types_layer_0": {k: v / steps for k, v in layer_types.items()},
            "wall_s": statistics.median(walls), "wall_all_s": walls,
            "parts_s": {k: v / steps for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
            "top_types_s": {k: v / steps for k, v in types.items()}, "busy_s": busy / steps}


def timed(fn, reps: int):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def peak_matmul():
    """The machine's float32 matmul rate, GFLOP/s: [512, 768] x [768, 3072] (a feed-forward's shape at 512
    tokens), the better of one at a time and two independent ones at once (a step's graph runs two ops at once)."""
    import tensorflow as tf

    a, b, c = tf.random.normal([512, 768]), tf.random.normal([768, 3072]), tf.random.normal([768, 3072])
    one = tf.function(lambda: tf.matmul(a, b))
    two = tf.function(lambda: (tf.matmul(a, b), tf.matmul(a, c)))
    flops = 2 * 512 * 768 * 3072
    one(), two()
    return max(flops / timed(lambda: one().numpy(), 30), 2 * flops / timed(lambda: [t.numpy() for t in two()], 30)) / 1e9


def run_train(cfg, T, steps, logdir):
    import real_lengths

    step, parts, jit = real_lengths.build_ours({"batch": BATCH, "schedule": [T] * (steps + 40), "config": cfg})
    for _ in range(4):
        step()
    plain = timed(step, 5)
    out = profile(step, steps, logdir)
    out["untraced_wall_s"] = plain
    fwd = forward_flops(cfg, BATCH, T)
    out["flops"] = {k: 3 * v for k, v in fwd.items()}
    p = parts(T)
    for name in ("forward", "forward_backward", "update"):
        p[name]()
        out[f"{name}_s"] = timed(p[name], 5)
    if T != 16:
        return out
    # a new padded length each step, as an epoch meets them (oneDNN primitives and XLA clusters per shape):
    # the same lengths cycled, after one pass has compiled them
    cycle = [8, 16, 24, 32, 40, 48]
    cyc_step, _, _ = real_lengths.build_ours({"batch": BATCH, "schedule": cycle * 6, "config": cfg})
    for _ in cycle:
        cyc_step()
    rounds = [timed(cyc_step, 1) for _ in cycle * 2]
    out["cycled_lengths"] = cycle
    out["cycled_step_s"] = dict(zip(map(str, cycle), [statistics.median(rounds[i::len(cycle)])
                                                      for i in range(len(cycle))]))
    return out


def sst2_dev_sentences(n):
    import csv

    path = os.path.join(ROOT, "..", "shared", "data", "glue", "SST-2", "dev.tsv")
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows[:n]]


def run_serve(cfg, steps, logdir):
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece op, as a serving process does)

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification.serving import ClassifierServing
    from xlnet_tf import XLNetConfig, accel
    from xlnet_tf.task_model import TaskModel
    from xlnet_tf.tokenizer import XLNetTokenizer

    tok = XLNetTokenizer(os.path.join(ROOT, "..", "shared", "data", "spiece", "spiece.model"))
    xcfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0, **cfg)
    model = TaskModel(xcfg, ClassificationHead(xcfg.d_model, 2, n_head=xcfg.n_head, d_head=xcfg.d_head), seed=1)
    model.build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    tf.get_logger().setLevel("ERROR")  # the in-process model traces once per padded length, on purpose
    export_dir = ClassifierServing(model, tok, 128, label_names=["0", "1"]).export(
        os.path.join(tempfile.mkdtemp(), "serve"))
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    texts = sst2_dev_sentences(steps)
    it = itertools.cycle(texts)
    call = lambda: fn(text_a=tf.constant([next(it)]))["probabilities"].numpy()
    for _ in texts:  # warm-up: every padded length met once
        call()
    out = profile(call, steps, logdir)
    # Untraced, on the same texts: the SavedModel from raw text, and the same ids through the in-process model
    # (its graph as exported, and with the compiled attention kernels on): what the SavedModel loses
    feats = []
    for t in texts:
        ids = tok.encode(t)[:126] + [tok.sep_id, tok.cls_id]
        n = -(-len(ids) // 8) * 8
        pad = n - len(ids)
        feats.append({"input_ids": np.array([[0] * pad + ids], np.int32),
                      "segment_ids": np.array([[4] * pad + [0] * (len(ids) - 1) + [2]], np.int32),
                      "padding_mask": np.array([[1] * pad + [0] * len(ids)], np.float32)})

    def portable(f):
        with accel.portable_graph():
            return model(f, training=False)
    fns = {"in_process_model_s": tf.function(lambda f: model(f, training=False)),
           "in_process_export_graph_s": tf.function(portable)}
    for f in feats:
        for g in fns.values():
            g(f)
    walls = {k: [] for k in ["untraced_wall_s", *fns]}
    for _ in range(3):
        t = time.perf_counter()
        for _ in texts:
            call()
        walls["untraced_wall_s"].append((time.perf_counter() - t) / len(texts))
        for k, g in fns.items():
            t = time.perf_counter()
            for f in feats:
                g(f)["logits"].numpy()
            walls[k].append((time.perf_counter() - t) / len(feats))
    out.update({k: statistics.median(v) for k, v in walls.items()})
    lengths = [f["input_ids"].shape[1] for f in feats]
    out["mean_padded_length"] = float(np.mean(lengths))
    T = int(round(np.mean(lengths)))
    out["flops"] = forward_flops(cfg, 1, T, r_rows=1)
    return out


def run_serve_ort(cfg, steps, logdir):
    """``serve_b1_ort`` (the module doc): ORT's per-node profile of ``steps`` batch-1 calls on SST-2 sentences."""
    import numpy as np
    import transformers

    import real_lengths

    hcfg = transformers.XLNetConfig(vocab_size=32000, d_model=cfg["d_model"], n_layer=cfg["n_layer"],
                                    n_head=cfg["n_head"], d_inner=cfg["d_inner"], ff_activation="gelu",
                                    untie_r=True, num_labels=2)
    hf_dir = os.path.join(logdir, "hf")
    transformers.XLNetForSequenceClassification(hcfg).save_pretrained(hf_dir)
    paths = real_lengths.export_onnx(hf_dir, os.path.join(logdir, "onnx"))
    tok = transformers.XLNetTokenizer(os.path.join(ROOT, "..", "shared", "data", "spiece", "spiece.model"))
    texts = sst2_dev_sentences(steps)
    feeds = []
    for t in texts:
        enc = tok([t], padding="longest", truncation=True, max_length=128, return_tensors="np")
        feeds.append({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})
    out = {}
    for name in ("onnx", "onnx_int8"):
        plain = real_lengths.ort_session(paths[name])
        for f in feeds:
            plain.run(None, f)
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            for f in feeds:
                plain.run(None, f)
            walls.append((time.perf_counter() - t) / len(feeds))
        sess = real_lengths.ort_session(paths[name], profile_prefix=os.path.join(logdir, name))
        for f in feeds:  # warm-up (every length once), then the profiled calls: the last len(feeds) runs
            sess.run(None, f)
        t = time.perf_counter()
        for f in feeds:
            sess.run(None, f)
        traced_wall = (time.perf_counter() - t) / len(feeds)
        with open(sess.end_profiling()) as fh:
            events = json.load(fh)
        runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"][-len(feeds):]
        t0 = runs[0]["ts"]
        nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
                 and e["ts"] >= t0]
        by_kind, count_kind = collections.Counter(), collections.Counter()
        for e in nodes:
            by_kind[e["args"].get("op_name", "?")] += e["dur"] / 1e6 / len(feeds)
            count_kind[e["args"].get("op_name", "?")] += 1 / len(feeds)
        run_s = sum(e["dur"] for e in runs) / 1e6 / len(feeds)
        node_s = sum(by_kind.values())
        out[name] = {"untraced_wall_s": statistics.median(walls), "traced_wall_s": traced_wall,
                     "model_run_s": run_s, "nodes_s": node_s, "outside_nodes_s": run_s - node_s,
                     "nodes_per_call": len(nodes) / len(feeds),
                     "node_kinds_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
                     "node_kinds_per_call": dict(count_kind)}
    lengths = [f["input_ids"].shape[1] for f in feeds]
    out["mean_length"] = float(np.mean(lengths))
    return {"ort": out}


def run_serve_paths(cfg, reps):
    """What a SavedModel could carry instead of TensorFlow's plain ops: one classifier call at batch 1, T 32 and
    128, as the plain graph (what an export runs), XLA-compiled for the call's shape (``jit_compile``: what an
    export could carry per padded length) and with the compiled attention kernels (in-process only), the same
    weights, interleaved repetitions."""
    import numpy as np
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    tf.get_logger().setLevel("ERROR")
    models = {}
    for name, accelerate in (("plain", False), ("kernels", True)):
        xcfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0,
                           accelerate=accelerate, **cfg)
        models[name] = TaskModel(xcfg, ClassificationHead(xcfg.d_model, 2, n_head=xcfg.n_head, d_head=xcfg.d_head),
                                 seed=1)
        models[name].build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    models["kernels"].set_weights(models["plain"].get_weights())
    fns = {"plain graph (the export)": tf.function(lambda f: models["plain"](f, training=False)),
           "XLA for the shape": tf.function(lambda f: models["plain"](f, training=False), jit_compile=True),
           "compiled kernels (in-process)": tf.function(lambda f: models["kernels"](f, training=False))}
    out = {}
    for T in (32, 128):
        f = {"input_ids": tf.constant(np.random.default_rng(T).integers(10, 32000, (1, T)), tf.int32),
             "segment_ids": tf.zeros([1, T], tf.int32), "padding_mask": tf.zeros([1, T], tf.float32)}
        ref = fns["plain graph (the export)"](f)["logits"].numpy()
        times = {k: [] for k in fns}
        diffs = {k: float(np.abs(fn(f)["logits"].numpy() - ref).max()) for k, fn in fns.items()}
        for _ in range(reps):
            for k, fn in fns.items():
                t = time.perf_counter()
                fn(f)["logits"].numpy()
                times[k].append(time.perf_counter() - t)
        out[f"T{T}"] = {k: {"s": statistics.median(v), "max_logit_diff": diffs[k]} for k, v in times.items()}
    return out


def run_gen(cfg, steps, logdir):
    import numpy as np

    from xlnet_tf import XLNetConfig, XLNetModel
    from xlnet_tf.generation import GenerationOptions, Generator

    xcfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0, **cfg)
    model = XLNetModel(xcfg, seed=1)
    gen = Generator(model)
    ids = np.random.default_rng(0).integers(10, 32000, (1, GEN_PROMPT)).astype(np.int32)
    options = GenerationOptions(max_new_tokens=GEN_NEW, eos_id=None)
    call = lambda: gen(ids, None, options)
    call()
    call()
    out = profile(call, steps, logdir)
    per = {k: v / GEN_NEW for k, v in out["parts_s"].items()}
    out.update(parts_s=per, busy_s=out["busy_s"] / GEN_NEW, wall_s=out["wall_s"] / GEN_NEW,
               untraced_wall_s=timed(call, steps) / GEN_NEW,
               top_types_s={k: v / GEN_NEW for k, v in out["top_types_s"].items()})
    # a step: 3 positions (the previous token, the newest, the placeholder) over the memory's fixed slots; the
    # positional tables are projected once per generation (not counted)
    klen = GEN_PROMPT + GEN_NEW + 1
    f = forward_flops(cfg, 1, 3, klen=klen, rlen=klen + 3, r_rows=0)
    f["lm_head"] = 2 * cfg["d_model"] * 32000
    out["flops"] = f
    out["weight_bytes"] = 4 * (cfg["n_layer"] * (4 * cfg["d_model"] ** 2 + 2 * cfg["d_model"] * cfg["d_inner"])
                               + 32000 * cfg["d_model"])
    return out


def one(case, cfg, steps):
    logdir = tempfile.mkdtemp(prefix="profile_")
    if case.startswith("train_T"):
        out = run_train(cfg, int(case[len("train_T"):]), steps, logdir)
    elif case == "serve_b1":
        out = run_serve(cfg, steps * 4, logdir)
    elif case == "serve_paths":
        return {"paths": run_serve_paths(cfg, 5 * steps)}
    elif case == "serve_b1_ort":
        return run_serve_ort(cfg, steps * 4, logdir)
    else:
        out = run_gen(cfg, max(2, steps // 2), logdir)
    out["peak_matmul_gflops"] = peak_matmul()
    return out


def table(results):
    rows = []
    for case, r in results.items():
        if "ort" in r:
            for name, o in r["ort"].items():
                if not isinstance(o, dict):
                    continue
                rows.append(f"\n{case} {name}: wall {1e3 * o['untraced_wall_s']:.1f} ms per call (mean length "
                            f"{r['ort']['mean_length']:.1f}), model_run {1e3 * o['model_run_s']:.1f} ms, nodes "
                            f"{1e3 * o['nodes_s']:.1f} ms, outside the nodes {1e3 * o['outside_nodes_s']:.2f} ms, "
                            f"{o['nodes_per_call']:.0f} nodes per call")
                for k, v in list(o["node_kinds_s"].items())[:12]:
                    rows.append(f"  {k:32s} {1e3 * v:8.2f} ms {100 * v / o['nodes_s']:5.1f}%  "
                                f"x{o['node_kinds_per_call'][k]:.0f}")
            continue
        if "paths" in r:
            for shape, paths in r["paths"].items():
                rows.append(f"\n{case} batch 1 {shape}: " + ", ".join(
                    f"{k} {1e3 * v['s']:.1f} ms (logits within {v['max_logit_diff']:.1e})" for k, v in paths.items()))
            continue
        total = sum(r["parts_s"].values())
        fl = sum(r["flops"].values())
        mm = r["parts_s"].get("matmul", 0.0) + r["parts_s"].get("attention kernels (compiled)", 0.0)
        if "ops_per_call" in r:
            rows.append(f"\n{case}: {r['ops_per_call']:.0f} TensorFlow ops per call, {r['ops_per_call_layer_0']:.0f} "
                        f"in layer 0: {r['op_types_layer_0']}")
        rows.append(f"\n{case}: wall {1e3 * r['wall_s']:.1f} ms per call, ops busy {1e3 * r['busy_s']:.1f} ms "
                    f"(idle {100 * (1 - r['busy_s'] / r['wall_s']):.0f}%), "
                    f"{fl / 1e9:.2f} GFLOP -> {fl / 1e9 / max(mm, 1e-9):.0f} GFLOP/s in matmuls+kernels "
                    f"(peak {r['peak_matmul_gflops']:.0f})")
        if "weight_bytes" in r:
            rows.append(f"  weights read per step {r['weight_bytes'] / 1e6:.0f} MB -> {r['weight_bytes'] / 1e9 / mm:.1f} "
                        "GB/s in matmuls+kernels")
        for k, v in r["parts_s"].items():
            rows.append(f"  {k:52s} {1e3 * v:8.2f} ms {100 * v / total:5.1f}%")
        for k in ("untraced_wall_s", "forward_s", "forward_backward_s", "update_s", "in_process_model_s",
                  "in_process_export_graph_s"):
            if k in r:
                rows.append(f"  {k}: {1e3 * r[k]:.1f} ms")
        if "cycled_step_s" in r:
            rows.append("  cycled lengths, step s: " + ", ".join(f"T{k} {v:.2f}" for k, v in r["cycled_step_s"].items()))
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 layers instead of 12")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=5, help="traced calls per case (serving: 4x, generation: /2)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else BASE
    if args.one:
        print("@@RESULT " + json.dumps(one(args.one, cfg, args.steps)), flush=True)
        return 0
    results = {}
    for case in args.cases.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", case, "--steps", str(args.steps)]
        cmd += ["--quick"] if args.quick else []
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        line = [x for x in proc.stdout.splitlines() if x.startswith("@@RESULT ")]
        if proc.returncode or not line:
            print(f"{case}: failed (rc {proc.returncode})", file=sys.stderr)
            return 1
        results[case] = json.loads(line[0][len("@@RESULT "):])
        print(table({case: results[case]}), flush=True)
    out = args.out or os.path.join(HERE, "results", "profile_parts_quick.json" if args.quick
                                   else "profile_parts.json")
    if os.path.exists(out):  # a run of some cases updates those, keeping the others
        with open(out) as f:
            results = dict(json.load(f).get("results", {}), **results)
    write_json(out, {"machine": cpu_model(), "cpu_flags": cpu_flags(), "config": cfg, "batch": BATCH, "steps": args.steps,
                     "load_avg": os.getloadavg(), "versions": versions(["tensorflow", "keras", "onnxruntime"]),
                     "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
