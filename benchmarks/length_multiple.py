#!/usr/bin/env python
"""Which length multiple makes a fine-tuning run shortest, by model size, on a CPU (``xlnet_tf/lengths.py``).

    python benchmarks/length_multiple.py            # five model sizes -> results/length_multiple.json
    python benchmarks/length_multiple.py --quick    # tiny and Base only, fewer lengths
    python benchmarks/length_multiple.py --sizes demo,small --out results/length_multiple_mid.json

Batches are padded to their longest example rounded up to a multiple m (``--length_multiple``). A length not met
before costs once: the training step's small XLA clusters compile for the new shape. A padded position costs the
model's per-token work in every step. For each model size, in a worker process of its own (the runner's
``Trainer`` on random weights: the cost does not depend on the values), this measures

* the step time at padded lengths T on a grid (median of ``--reps`` interleaved rounds), and
* the compilation a new length costs (the first step at a length minus its median);

then composes the cost of a run on SST-2's real lengths (the released spiece.model, ``A <sep> <cls>``, batch 32,
max_seq_length 128, examples grouped by their rounded length as ``data.lengths.length_buckets`` does): steps at
each padded length + one compilation per length met, for a whole epoch (2,104 steps) and for a short run of 400
steps, at m = 2, 4, 8, 16, 32. The model's training FLOPs per token (``xlnet_tf.lengths.train_flops_per_token``)
sit beside each row: the sizes at which each multiple wins set ``CPU_MULTIPLES``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import real_lengths  # noqa: E402
from bench_util import cpu_model, shared_dir, versions, write_json  # noqa: E402

SIZES = {  # name: the shape keys of XLNetConfig
    "tiny": dict(n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=128),
    "recipes-quick": dict(n_layer=2, d_model=128, n_head=4, d_head=32, d_inner=512),
    "demo": dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512),
    "small": dict(n_layer=4, d_model=256, n_head=4, d_head=64, d_inner=1024),
    "base": dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072),
}
MULTIPLES = (2, 4, 8, 16, 32)
EPOCH_STEPS, SHORT_STEPS = 2104, 400


def measure(config, batch, grid, reps, log):
    """(median step seconds by T, compilation seconds per new length) of our Trainer on ``config``."""
    schedule = list(grid) + [T for _ in range(reps) for T in grid]
    w = real_lengths.Worker(dict(impl="ours", config=config, batch=batch, schedule=schedule), log)
    first, times = {}, {T: [] for T in grid}
    for i, T in enumerate(schedule):
        sec = float(w.ask("step", "TIME"))
        (times[T].append(sec) if i >= len(grid) else first.__setitem__(T, sec))
    w.ask("stop", "DONE")
    med = {T: statistics.median(v) for T, v in times.items()}
    compile_s = statistics.median([max(first[T] - med[T], 0.0) for T in grid])
    return med, compile_s


def run_cost(plan, med, compile_s, steps):
    """Seconds of a run of ``steps`` batches drawn as ``plan`` ({T: batches per epoch}) says, with one compilation
    per length it meets (a short run meets the lengths holding at least one of its batches, in expectation)."""
    total = sum(plan.values())
    seconds = sum(n / total * steps * real_lengths.step_time(med, T) for T, n in plan.items())
    met = sum(1 - (1 - n / total) ** steps for n in plan.values())
    return seconds + met * compile_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max_seq_length", type=int, default=128)
    ap.add_argument("--sizes", help=f"comma list of {','.join(SIZES)} (default: all; --quick: tiny,base)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "length_multiple.json"))
    args = ap.parse_args(argv)
    from xlnet_tf import XLNetConfig, XLNetTokenizer
    from xlnet_tf.lengths import train_flops_per_token

    L, B = args.max_seq_length, args.batch
    tok = XLNetTokenizer(os.path.join(shared_dir(), "spiece", "spiece.model"))
    lengths = [min(len(r) + 2, L) for r in real_lengths.sst2_ids(tok)]
    plans = {m: {int(k): v for k, v in real_lengths.epoch_plans(lengths, B, L)[f"ours_m{m}"].items()}
             for m in (1, 2, 4, 8)}
    for m in (16, 32):
        import numpy as np

        keys, counts = np.unique([real_lengths.ceil_to(int(x), m, L) for x in lengths], return_counts=True)
        plans[m] = {int(k): c / B for k, c in zip(keys, counts)}
    names = args.sizes.split(",") if args.sizes else ["tiny", "base"] if args.quick else list(SIZES)
    unknown = sorted(set(names) - set(SIZES))
    if unknown:
        ap.error(f"--sizes: unknown {unknown}; expected some of {list(SIZES)}")
    sizes = {k: SIZES[k] for k in names}
    grid = (8, 16, 32, 64, 128) if args.quick else (8, 16, 24, 32, 48, 64, 96, 128)
    rows = {}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.splitext(args.out)[0] + ".log", "w") as log:
        for name, shape in sizes.items():
            med, compile_s = measure(shape, B, grid, args.reps, log)
            flops = train_flops_per_token(XLNetConfig(n_token=32000, **shape))
            row = {"train_flops_per_token": flops, "compile_seconds_per_length": round(compile_s, 3),
                   "step_seconds_by_length": {T: round(v, 4) for T, v in med.items()}}
            for label, steps in (("epoch", EPOCH_STEPS), ("short", SHORT_STEPS)):
                cost = {m: run_cost(plans[m], med, compile_s, steps) for m in MULTIPLES}
                row[f"{label}_seconds"] = {m: round(float(c), 1) for m, c in cost.items()}
                row[f"{label}_best_multiple"] = min(cost, key=cost.get)
            rows[name] = row
            print(f"{name}: {flops / 1e6:.1f} MFLOP/token, compile {compile_s:.2f} s/length, epoch s by m "
                  f"{row['epoch_seconds']} (best {row['epoch_best_multiple']}), {SHORT_STEPS} steps "
                  f"{row['short_seconds']} (best {row['short_best_multiple']})", flush=True)
    print("\n| model | MFLOP/token | compile s / new length | epoch: m=2 | m=16 | best m | 400 steps: m=2 | m=16 | "
          "best m |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        e, s = r["epoch_seconds"], r["short_seconds"]
        print(f"| {name} | {r['train_flops_per_token'] / 1e6:.1f} | {r['compile_seconds_per_length']:.2f} | "
              f"{e[2]:.0f} s | {e[16]:.0f} s | {r['epoch_best_multiple']} | {s[2]:.0f} s | {s[16]:.0f} s | "
              f"{r['short_best_multiple']} |")
    write_json(args.out, {
        "batch": B, "max_seq_length": L, "rows": rows, "reps": args.reps, "grid": list(grid),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()}, "versions": versions(["tensorflow", "keras"]),
        "command": " ".join(["python benchmarks/length_multiple.py"] + list(argv or sys.argv[1:]))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
