#!/usr/bin/env python
"""Where our OpenVINO export's time goes, and what the runner's levers change (PERFORMANCE.md "Serving in other
runtimes"), on the exports ``benchmarks/real_lengths.py`` wrote in its ``--workdir`` (its ``exports.json``: our
``format_openvino_{L}`` folders and HF's graph ``onnx``, the same weights).

    python benchmarks/real_lengths.py --training 0 --serving_reps 1 --hf_variants "" --ours_variants ours,ours_openvino \
        --ov_variants ov --serving_groups ours --serving_batches 128:1     # writes the exports once
    python benchmarks/openvino_levers.py profile --shape 32x56           # per-op time, ours and HF's graph
    python benchmarks/openvino_levers.py runner --batch 32 --variants '{"pinned": {"ENABLE_CPU_PINNING": true},
        "unpinned": {"ENABLE_CPU_PINNING": false}}'                      # serve.py on real text, interleaved
    python benchmarks/openvino_levers.py ab --folders before=/tmp/a/ours_format_openvino_128 \
        after=/tmp/b/ours_format_openvino_128 --texts 40 --reps 5      # two exports (two checkouts) A/B

``profile``: OpenVINO's performance counters (``PERF_COUNT``, ``get_profiling_info``) summed by node type and
kernel, one call of random ids at ``--shape`` after a warm-up, median of ``--reps`` calls. ``runner``: the export's
own ``serve.py`` on SST-2 dev (L 128) or IMDB test (L 512) texts in ``--batch`` calls, its compiled model swapped
for one compiled with each variant's properties, the variants interleaved; texts/s medians and the probabilities'
largest difference from the first variant. Prints only (quick checks, no results file).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import numpy as np

from xlnet_tf.tasks.export_formats import load_runner  # (no TensorFlow: the runner's process as a deployer's)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def random_ids(b: int, T: int, seed: int = 0):
    """Our ids features (left padding of random amounts) and HF's (its input names, int64, no padding)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 30000, size=(b, T)).astype(np.int32)
    mask = np.ones((b, T), np.int32)
    for r in range(b):
        k = int(rng.integers(0, T // 3 + 1))
        mask[r, :k], ids[r, :k] = 0, 0
    seg = np.where(mask == 1, 0, 4).astype(np.int32)
    seg[:, -1] = 2
    ours = {"input_ids": ids, "segment_ids": seg, "padding_mask": mask}
    hf = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((b, T), np.int64),
          "token_type_ids": np.zeros((b, T), np.int64)}
    return ours, hf


def profile(path: str, feed, reps: int, threads: int = 2):
    """(median seconds of a call, {(node type, kernel): microseconds of the last call})."""
    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True,
                                                     "INFERENCE_NUM_THREADS": threads})
    req = compiled.create_infer_request()
    req.infer(feed)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        req.infer(feed)
        times.append(time.perf_counter() - t)
    by = collections.Counter()
    for p in req.profiling_info:
        by[(p.node_type, p.exec_type)] += p.real_time.total_seconds() * 1e6
    return statistics.median(times), by


def run_profile(dirs, args):
    b, T = (int(x) for x in args.shape.split("x"))
    ours, hf = random_ids(b, T)
    for name, path, feed in (("ours", os.path.join(dirs[f"format_openvino_{args.L}"], "model.xml"), ours),
                             ("HF's graph", dirs["onnx"], hf)):
        med, by = profile(path, feed, args.reps)
        total = sum(by.values())
        print(f"{name} [{b}, {T}]: {med * 1e3:.1f} ms per call (median of {args.reps})")
        for (node, kernel), us in by.most_common(args.top):
            print(f"  {us / 1e3:9.2f} ms {100 * us / total:5.1f}%  {node:18s} {kernel}")


def run_runner(dirs, args):
    import openvino as ov

    import real_lengths

    name = "SST-2 dev, L 128" if args.L == 128 else "IMDB test, L 512"
    texts = real_lengths.serving_sets()[name][0]
    folder = dirs[f"format_openvino_{args.L}"]
    core, served = ov.Core(), {}
    for label, props in json.loads(args.variants).items():
        s = load_runner(folder, threads=2)
        s.runtime.model = core.compile_model(os.path.join(folder, "model.xml"), "CPU",
                                             dict({"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2},
                                                  **props))
        served[label] = s
    chunks = [texts[i:i + args.batch] for i in range(0, len(texts), args.batch)]
    run = lambda s: np.concatenate([s(text_a=c)["probabilities"] for c in chunks])  # noqa: E731
    ref = None
    for label, s in served.items():
        p = run(s)
        ref = p if ref is None else ref
        print(f"{label}: largest probability difference from the first variant {float(np.abs(p - ref).max()):.2e}")
    rates = {label: [] for label in served}
    for r in range(args.reps):
        for label in (list(served) if r % 2 == 0 else list(served)[::-1]):
            t = time.perf_counter()
            run(served[label])
            rates[label].append(len(texts) / (time.perf_counter() - t))
    for label, v in rates.items():
        print(f"  {label:20s} {statistics.median(v):7.2f} texts/s (median of {args.reps}: "
              f"{', '.join(f'{x:.2f}' for x in v)}), {name}, batch {args.batch}")


def run_ab(args):
    """Two or more exports' own ``serve.py`` (e.g. one written before a change and one after, each from its own
    checkout) on the first ``--texts`` texts one per call, calls interleaved; texts/s medians and each one's median
    ratio of the reps to the first. (Exports from different random weights: their answers are not compared.)"""
    import real_lengths

    name = "SST-2 dev, L 128" if args.L == 128 else "IMDB test, L 512"
    texts = real_lengths.serving_sets()[name][0][:args.texts]
    served = {}
    for item in args.folders:
        label, folder = item.split("=", 1)
        served[label] = load_runner(folder, precision=args.precision, threads=2)
        for t in texts:  # warm-up: every length met once
            served[label](text_a=[t])
    rates = {label: [] for label in served}
    for r in range(args.reps):
        for label in (list(served) if r % 2 == 0 else list(served)[::-1]):
            t = time.perf_counter()
            for text in texts:
                served[label](text_a=[text])
            rates[label].append(len(texts) / (time.perf_counter() - t))
    first = list(served)[0]
    for label, v in rates.items():
        ratio = statistics.median(a / b for a, b in zip(v, rates[first]))
        print(f"  {label:12s} {statistics.median(v):7.2f} texts/s (median of {args.reps}: "
              f"{', '.join(f'{x:.2f}' for x in v)}), {ratio:.3f}x {first}; {name}, batch 1, {args.precision}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("profile", "runner", "ab"))
    ap.add_argument("--workdir", default=os.path.join(os.path.dirname(HERE), "recipes_work", "real_lengths"))
    ap.add_argument("--L", type=int, default=128, help="the export's max_seq_length (128: SST-2, 512: IMDB)")
    ap.add_argument("--shape", default="32x56", help="profile: batch x length")
    ap.add_argument("--top", type=int, default=12, help="profile: node types shown")
    ap.add_argument("--batch", type=int, default=32, help="runner: texts per call")
    ap.add_argument("--variants", default='{"default": {}}', help="runner: {label: compile properties}")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--folders", nargs="+", default=[], help="ab: label=export folder, two or more")
    ap.add_argument("--texts", type=int, default=40, help="ab: the first texts of the set, one per call")
    ap.add_argument("--precision", default="f32", help="ab: f32 or bf16")
    args = ap.parse_args(argv)
    if args.what == "ab":
        run_ab(args)
        return 0
    with open(os.path.join(args.workdir, "exports.json")) as f:
        dirs = json.load(f)
    (run_profile if args.what == "profile" else run_runner)(dirs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
