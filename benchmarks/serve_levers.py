#!/usr/bin/env python
"""Batch-1 serving levers in one process (issue #53): the plain graph an export runs, the same XLA-compiled for the
call's shape (``jit_compile``), and with the positional tables projected once (``XLNetModel.position_tables``,
what a classifier export now carries), XLNet-Base random weights, [1, T] for T 32 and 128, REPS interleaved calls
each, medians (ms) and the largest logit difference from the plain graph.

    python benchmarks/serve_levers.py            # TensorFlow's default threads
    python benchmarks/serve_levers.py inter1     # one inter-op thread

Prints one line per T; PERFORMANCE.md "Serving at batch 1 against ONNX Runtime" holds the figures.
"""
import os, sys, time, statistics  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
if len(sys.argv) > 1 and sys.argv[1] == "inter1":
    tf.config.threading.set_inter_op_parallelism_threads(1)
from xlnet_tf.heads.classification import ClassificationHead  # noqa: E402
from xlnet_tf import XLNetConfig, accel  # noqa: E402
from xlnet_tf.task_model import TaskModel  # noqa: E402
tf.get_logger().setLevel("ERROR")
cfg = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)
x = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0, **cfg)
m = TaskModel(x, ClassificationHead(x.d_model, 2, n_head=x.n_head, d_head=x.d_head), seed=1)
m.build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
def portable(f, **kw):
    with accel.portable_graph():
        return m(f, training=False, **kw)["logits"]
plain = tf.function(portable)
xla = tf.function(portable, jit_compile=True)
bb = m.backbone
tables = bb.projected_positions(tf.constant(512), tf.constant(512)).projected  # once, at "export"
def with_tables(f):
    with accel.portable_graph():
        T = tf.shape(f["input_ids"])[1]
        basis = bb.positional_encoding(T, T, tf.constant(1))
        R = tf.shape(basis.sin)[0]
        basis = basis._replace(projected=tuple((s[:R], c[:R]) for s, c in tables))
        out = bb(f["input_ids"], segment_ids=f["segment_ids"], padding_mask=f["padding_mask"], training=False, positions=basis)
        return m.head(out, f, training=False)["logits"]
pos_pre = tf.function(with_tables)
out = {}
for T in (32, 128):
    f = {"input_ids": tf.constant(np.random.default_rng(T).integers(10, 32000, (1, T)), tf.int32),
         "segment_ids": tf.zeros([1, T], tf.int32), "padding_mask": tf.zeros([1, T], tf.float32)}
    fns = {"plain": lambda: plain(f), "xla": lambda: xla(f), "pos_tables": lambda: pos_pre(f)}
    ref = plain(f).numpy()
    d = {k: float(np.abs(fn().numpy() - ref).max()) for k, fn in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(int(os.environ.get("REPS", 15))):
        for k, fn in fns.items():
            t = time.perf_counter(); fn().numpy(); times[k].append(time.perf_counter() - t)
    out[T] = {k: round(1e3 * statistics.median(v), 1) for k, v in times.items()}
    print(sys.argv[1:], "T", T, out[T], "diff", d, flush=True)
