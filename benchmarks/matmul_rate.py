#!/usr/bin/env python
"""Issue #53's last unmeasured part: the matmuls' rate at the few rows of a batch-1 request, TensorFlow against
ONNX Runtime, apart from everything else in the model.

The matmuls of 12 XLNet-Base layers at batch 1 (d_model 768, d_inner 3072) and nothing else: per layer the
q, k, v projections of the input [T, 768] x [768, 768], the output projection of their sum, and the feed-forward
[T, 768] x [768, 3072] + bias, [T, 3072] x [3072, 768] + bias, with residual adds; 12 layers of their own random
float32 weights (85 MB, read from memory at every call as a served model reads them). The same graph three ways,
each in its own process with 2 intra-op threads:

* ``tf_onednn``: a TensorFlow graph (``tf.function`` over variables, as a SavedModel runs it),
  ``TF_ENABLE_ONEDNN_OPTS=1`` (oneDNN's MatMul, what our serving runs);
* ``tf_eigen``: the same, ``TF_ENABLE_ONEDNN_OPTS=0`` (Eigen's contraction);
* ``ort``: the same graph as ONNX (MatMul + Add nodes), ONNX Runtime's CPU provider, ``ORT_ENABLE_ALL``
  (MLAS, what ORT runs for HF's exported XLNet).

The sides take turns (ROUNDS rounds, the order alternating), each a warm-up and CALLS timed calls per T; medians.
Outputs agree (checked per T against numpy's float64 product of the same weights).

    bash benchmarks/setup_peer_onnxruntime.sh          # ONNX Runtime (benchmark-only)
    python benchmarks/matmul_rate.py                   # T 8, 25, 30, 64, 128, 512

Prints a table and writes benchmarks/results/matmul_rate.json; PERFORMANCE.md "Serving at batch 1 against
ONNX Runtime" holds the figures.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_util import PROTO, cpu_flags, cpu_model, versions, write_json  # noqa: E402

D, F, LAYERS = 768, 3072, 12
SIDES = ("tf_onednn", "tf_eigen", "ort")


def weights(seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(LAYERS):
        w = {name: (rng.standard_normal(shape) * 0.02).astype("float32")
             for name, shape in (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("o", (D, D)), ("w1", (D, F)),
                                 ("w2", (F, D)))}
        w["b1"] = (rng.standard_normal(F) * 0.02).astype("float32")
        w["b2"] = (rng.standard_normal(D) * 0.02).astype("float32")
        out.append(w)
    return out


def reference(x, ws):
    """The graph in numpy float64: what every side must return."""
    x = x.astype("float64")
    for w in ws:
        x = x + (x @ w["q"] + x @ w["k"] + x @ w["v"]) @ w["o"]
        x = x + (x @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]
    return x


def tf_side(ws):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    vs = [{k: tf.Variable(v) for k, v in w.items()} for w in ws]

    @tf.function(input_signature=[tf.TensorSpec([None, D], tf.float32)])
    def run(x):
        for w in vs:
            x = x + tf.matmul(tf.matmul(x, w["q"]) + tf.matmul(x, w["k"]) + tf.matmul(x, w["v"]), w["o"])
            x = x + tf.nn.bias_add(tf.matmul(tf.nn.bias_add(tf.matmul(x, w["w1"]), w["b1"]), w["w2"]), w["b2"])
        return x

    fn = run.get_concrete_function()
    return lambda x: fn(tf.constant(x)).numpy()


def ort_side(ws):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], "x"

    def op(kind, a, b, out):
        nodes.append(helper.make_node(kind, [a, b], [out]))
        return out

    for i, w in enumerate(ws):
        for k, v in w.items():
            inits.append(numpy_helper.from_array(v, f"{k}{i}"))
        s = op("Add", op("Add", op("MatMul", x, f"q{i}", f"q_{i}"), op("MatMul", x, f"k{i}", f"k_{i}"), f"qk_{i}"),
               op("MatMul", x, f"v{i}", f"v_{i}"), f"qkv_{i}")
        x = op("Add", x, op("MatMul", s, f"o{i}", f"a_{i}"), f"x1_{i}")
        h = op("Add", op("MatMul", x, f"w1{i}", f"h0_{i}"), f"b1{i}", f"h_{i}")
        x = op("Add", x, op("Add", op("MatMul", h, f"w2{i}", f"f0_{i}"), f"b2{i}", f"f_{i}"), f"x2_{i}")
    graph = helper.make_graph(nodes, "matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", D])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["T", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda a: sess.run(None, {"x": a})[0]


def worker(side: str, Ts, calls: int) -> dict:
    import numpy as np

    ws = weights()
    run = ort_side(ws) if side == "ort" else tf_side(ws)
    out = {}
    for T in Ts:
        x = np.random.default_rng(T).standard_normal((T, D)).astype("float32")
        err = float(np.max(np.abs(run(x) - reference(x, ws))))  # the warm-up call, checked
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            run(x)
            times.append(time.perf_counter() - t0)
        out[str(T)] = {"ms": 1e3 * statistics.median(times), "max_abs_err": err}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="8,25,30,64,128,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "matmul_rate.json"))
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    Ts = [int(t) for t in args.lengths.split(",")]
    if args.worker:
        print(PROTO + json.dumps(worker(args.worker, Ts, args.calls)), flush=True)
        return 0
    rounds = []
    for r in range(args.rounds):
        row = {}
        for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                       TF_ENABLE_ONEDNN_OPTS="0" if side == "tf_eigen" else "1")
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", side, "--lengths",
                                args.lengths, "--calls", str(args.calls)], env=env, capture_output=True, text=True)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith(PROTO)), None)
            if line is None:
                raise SystemExit(f"{side} failed:\n{p.stderr[-3000:]}")
            row[side] = json.loads(line[len(PROTO):])
            sys.stderr.write(f"round {r + 1} {side}: " + ", ".join(f"T {T} {v['ms']:.1f} ms"
                                                                   for T, v in row[side].items()) + "\n")
        rounds.append(row)
    med = {side: {str(T): statistics.median(rd[side][str(T)]["ms"] for rd in rounds) for T in Ts} for side in SIDES}
    err = max(rd[s][str(T)]["max_abs_err"] for rd in rounds for s in SIDES for T in Ts)
    lines = ["| T (rows) | " + " | ".join(f"{s} ms (GFLOP/s)" for s in SIDES) + " | tf_onednn / ort |",
             "|---:|" + "---:|" * (len(SIDES) + 1)]
    for T in Ts:
        flops = 2 * T * LAYERS * (4 * D * D + 2 * D * F)
        cells = [f"{med[s][str(T)]:.2f} ({flops / med[s][str(T)] / 1e6:.0f})" for s in SIDES]
        lines.append(f"| {T} | " + " | ".join(cells) + f" | {med['tf_onednn'][str(T)] / med['ort'][str(T)]:.2f}x |")
    print("\n".join(lines))
    write_json(args.out, {"median_ms": med, "rounds": rounds, "max_abs_err": err, "lengths": Ts,
                          "calls": args.calls, "machine": {"cpu": cpu_model(), "flags": cpu_flags(),
                                                           "cores": os.cpu_count()},
                          "versions": versions(["tensorflow", "onnxruntime"]),
                          "command": "python benchmarks/matmul_rate.py " + " ".join(argv or sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
