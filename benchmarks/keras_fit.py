#!/usr/bin/env python
"""Per-step time of Keras ``fit`` on ``XLNetClassifier`` against the command lines' loop (``training.Trainer``) on
the same SST-2 batches: the same model (XLNet-Base shape, random weights: the cost does not depend on the
values), the same update (``xlnet_tf/train_step.py``), the same batches in the same order (real SST-2 train
sentences through the task model's raw-text preprocessing, each batch padded to its longest on the run's length
grid), each side in its own worker process.

    python benchmarks/keras_fit.py                 # XLNet-Base, batch 32, L 128, 20 timed steps, 2 rounds
    python benchmarks/keras_fit.py --quick         # 2 layers (a smoke run of the script)

Each worker runs ``--steps`` steps once to compile every length it meets (XLA clusters per padded length), then
the same ``--steps`` batches again, timed: the CLI side by ``Trainer.train`` (its loop: history, progress,
summaries off), the Keras side by ``fit(steps_per_epoch=...)`` (its callbacks: the History and a silent
progress bar). Rounds alternate which side goes first; the table gives each side's median per-step time and the
ratio. Results: benchmarks/results/keras_fit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_util import cpu_model, versions, write_json  # noqa: E402

BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)


def cpu_family() -> str:
    """The vector extensions that tell this project's CPU families apart (AVX2 only, AVX-512 + BF16, + AMX)."""
    flags = set(open("/proc/cpuinfo").read().split())
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)


def worker(args) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from xlnet_tf import training
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.tasks import XLNetClassifier

    lines = open(os.path.join(args.data, "glue", "SST-2", "train.tsv"), encoding="utf-8").read().splitlines()[1:]
    rows = [line.split("\t") for line in lines[:args.steps * args.batch]]
    x, y = [r[0] for r in rows], np.array([int(r[1]) for r in rows])
    config = XLNetConfig(**dict(BASE, n_layer=args.n_layer, n_token=32000))
    keras.utils.set_random_seed(0)
    model = XLNetClassifier(config, num_classes=2, tokenizer=os.path.join(args.data, "spiece", "spiece.model"),
                            max_seq_length=args.max_seq_length)
    options = dict(learning_rate=2e-5, train_steps=2 * args.steps, warmup_steps=0)
    batches = model.as_dataset(x, y, args.batch, shuffle=True, training=True).cache()
    list(batches)  # the preprocessing done once, outside both timings
    if args.side == "keras":
        model.compile(**options)
        model.fit(batches, epochs=1, steps_per_epoch=args.steps, verbose=0)
        t = time.perf_counter()
        model.fit(batches, epochs=1, steps_per_epoch=args.steps, verbose=0)
        seconds = time.perf_counter() - t
    else:
        flat = batches.map(lambda f, label: dict(f, label=label)).repeat()
        cfg = training.TrainConfig(progress=False, **options)
        trainer = training.Trainer(lambda: model, lambda ctx: flat, cfg)
        trainer.train(stop_at=args.steps)
        t = time.perf_counter()
        trainer.train(stop_at=2 * args.steps)
        seconds = time.perf_counter() - t
    lengths = [int(f["input_ids"].shape[1]) for f, _ in batches.take(args.steps)]
    return {"side": args.side, "seconds_per_step": seconds / args.steps, "lengths": lengths}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 layers")
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--data", default=os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data"))
    p.add_argument("--side", choices=("keras", "cli"), help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(HERE, "results", "keras_fit.json"))
    args = p.parse_args()
    if args.quick:
        args.n_layer = 2
    if args.side:
        print(json.dumps(worker(args)))
        return
    results = {"keras": [], "cli": []}
    for r in range(args.rounds):
        for side in (("cli", "keras") if r % 2 == 0 else ("keras", "cli")):
            cmd = [sys.executable, __file__, f"--side={side}", f"--n_layer={args.n_layer}", f"--steps={args.steps}",
                   f"--batch={args.batch}", f"--max_seq_length={args.max_seq_length}", f"--data={args.data}"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            res = json.loads(out)
            results[side].append(res["seconds_per_step"])
            print(f"round {r + 1} {side:5s} {res['seconds_per_step']:.3f} s/step  (padded lengths {res['lengths']})",
                  flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n| side | s/step (median of {args.rounds}) |\n|---|---:|")
    print(f"| command line (Trainer) | {med['cli']:.3f} |\n| Keras fit | {med['keras']:.3f} |")
    print(f"fit / command line: {med['keras'] / med['cli']:.3f}  ({cpu_model()}, {cpu_family()})")
    write_json(args.out, {"command": " ".join(sys.argv), "cpu": cpu_model(), "cpu_family": cpu_family(),
                          "versions": versions(["tensorflow", "keras"]),
                          "n_layer": args.n_layer, "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
                          "seconds_per_step": results, "median": med, "ratio": med["keras"] / med["cli"]})


if __name__ == "__main__":
    main()
