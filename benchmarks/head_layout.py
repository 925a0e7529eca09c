#!/usr/bin/env python
"""Issue #53's head-layout lever, measured apart: the attention's projections and products of 12 XLNet-Base layers
at batch 1 (d_model 768, 12 heads of 64; no feed-forward, no LayerNorm), in two layouts of the same arithmetic:

* ``flat`` (what ``xlnet_tf/attention.py`` runs): one 2-D MatMul [T, 768] x [768, 768] per projection, then the
  heads moved to the front (reshape + Transpose, ``split_heads``), and back before the output projection
  (``merge_heads``);
* ``head-major``: no Transpose at all: per-head BatchMatMuls of the input broadcast over the heads against the
  kernels stored [n, d, h], and the output projection as [n, T, h] x [n, h, d] summed over the heads.

Random float32 weights, REPS interleaved rounds of 5 calls each (order alternating), medians (ms).

    python benchmarks/head_layout.py             # T 30 (an SST-2 sentence) and 128

Prints one line per T and writes benchmarks/results/head_layout.json; PERFORMANCE.md "Serving at batch 1 against
ONNX Runtime" holds the figures.
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench_util import cpu_flags, cpu_model, versions, write_json  # noqa: E402

D, N, H, LAYERS = 768, 12, 64, 12
REPS = int(os.environ.get("REPS", "15"))


def measure(T: int) -> dict:
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((T, D)).astype("float32"))
    kernels = [tf.constant(rng.standard_normal((D, N * H)).astype("float32") * 0.02) for _ in range(4)]  # q k v r
    out = tf.constant(rng.standard_normal((N * H, D)).astype("float32") * 0.02)
    kernels3 = [tf.constant(tf.transpose(tf.reshape(w, [D, N, H]), [1, 0, 2])) for w in kernels]  # [n, d, h]
    out3 = tf.constant(tf.reshape(out, [N, H, D]))  # [n, h, d]

    @tf.function
    def flat(x):
        for _ in range(LAYERS):
            q, k, v, r = [tf.transpose(tf.reshape(tf.matmul(x, w), [T, N, H]), [1, 0, 2]) for w in kernels]
            p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) + tf.matmul(q, r, transpose_b=True))
            x = tf.matmul(tf.reshape(tf.transpose(tf.matmul(p, v), [1, 0, 2]), [T, N * H]), out)
        return x

    @tf.function
    def head_major(x):
        for _ in range(LAYERS):
            xb = tf.broadcast_to(x[None], [N, T, D])
            q, k, v, r = [tf.matmul(xb, w) for w in kernels3]
            p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) + tf.matmul(q, r, transpose_b=True))
            x = tf.reduce_sum(tf.matmul(tf.matmul(p, v), out3), 0)
        return x

    sides = {"flat": flat, "head_major": head_major}
    diff = float(np.abs(flat(x).numpy() - head_major(x).numpy()).max())
    times = {name: [] for name in sides}
    for rep in range(REPS):
        for name in (list(sides) if rep % 2 == 0 else list(sides)[::-1]):
            t = time.perf_counter()
            for _ in range(5):
                sides[name](x)
            times[name].append((time.perf_counter() - t) / 5 * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"T {T}: flat {med['flat']:.2f} ms, head-major {med['head_major']:.2f} ms, "
          f"head-major speed-up {med['flat'] / med['head_major']:.3f}x (largest difference {diff:.1e})", flush=True)
    return {"T": T, "median_ms": med, "ms": times, "speedup": med["flat"] / med["head_major"], "max_diff": diff}


if __name__ == "__main__":
    rows = [measure(T) for T in (30, 128)]
    write_json(os.path.join(HERE, "results", "head_layout.json"),
               {"command": " ".join(sys.argv), "cpu": cpu_model(), "cpu_flags": sorted(cpu_flags()),
                "versions": versions(["tensorflow"]), "reps": REPS, "rows": rows})
