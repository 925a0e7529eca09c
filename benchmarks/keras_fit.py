#!/usr/bin/env python
"""Per-step time of Keras ``fit`` on ``XLNetClassifier`` against the command lines' loop (``training.Trainer``) on
the same SST-2 batches: two models of the same shape and initial weights (XLNet-Base shape, random weights: the
cost does not depend on the values), the same update (``xlnet_tf/train_step.py``), the same batches (real SST-2
train sentences through the task model's raw-text preprocessing, each batch padded to its longest on the run's
length grid).

    python benchmarks/keras_fit.py                 # XLNet-Base, batch 32, L 128, 12 steps a block, 4 block pairs
    python benchmarks/keras_fit.py --quick         # 2 layers (a smoke run of the script)

Both sides live in ONE process and take turns in blocks of ``--steps`` steps (the same batches in every block):
a warm-up block each (every padded length compiled), then ``--pairs`` pairs of timed blocks in the order
CLI, fit, fit, CLI, CLI, fit, ... so that whatever else runs on the machine weighs on both sides alike. The CLI
side is ``Trainer.train`` (its loop: history, progress and summaries off), the Keras side
``fit(steps_per_epoch=...)`` (its callbacks: the History and a silent progress bar). The figure is the median of
the pairs' ratios (fit / CLI, each pair's two blocks back to back); each side's median per-step time is given
too. Results: benchmarks/results/keras_fit.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_util import cpu_flags, cpu_model, versions, write_json  # noqa: E402

BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)


def run(args) -> dict:
    import keras
    import numpy as np

    from xlnet_tf import training
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.tasks import XLNetClassifier

    lines = open(os.path.join(args.data, "glue", "SST-2", "train.tsv"), encoding="utf-8").read().splitlines()[1:]
    rows = [line.split("\t") for line in lines[:args.steps * args.batch]]
    x, y = [r[0] for r in rows], np.array([int(r[1]) for r in rows])
    config = XLNetConfig(**dict(BASE, n_layer=args.n_layer, n_token=32000))

    def model():
        keras.utils.set_random_seed(0)
        return XLNetClassifier(config, num_classes=2, max_seq_length=args.max_seq_length,
                               tokenizer=os.path.join(args.data, "spiece", "spiece.model"))

    options = dict(learning_rate=2e-5, train_steps=(2 * args.pairs + 1) * args.steps, warmup_steps=0)
    keras_model = model()
    batches = keras_model.as_dataset(x, y, args.batch, shuffle=True, training=True).cache()
    list(batches)  # the preprocessing done once, outside both timings
    keras_model.compile(**options)
    flat = batches.map(lambda f, label: dict(f, label=label)).repeat()
    trainer = training.Trainer(model, lambda ctx: flat, training.TrainConfig(progress=False, **options))
    done = {"cli": 0}

    def block(side: str) -> float:
        t = time.perf_counter()
        if side == "keras":
            keras_model.fit(batches, epochs=1, steps_per_epoch=args.steps, verbose=0)
        else:
            done["cli"] += args.steps
            trainer.train(stop_at=done["cli"])
        return (time.perf_counter() - t) / args.steps

    block("cli"), block("keras")  # warm-up: every padded length compiled on each side
    times, ratios = {"cli": [], "keras": []}, []
    for pair in range(args.pairs):
        order = ("cli", "keras") if pair % 2 == 0 else ("keras", "cli")
        for side in order:
            times[side].append(block(side))
        ratios.append(times["keras"][-1] / times["cli"][-1])
        print(f"pair {pair + 1}: " + "  ".join(f"{s} {times[s][-1]:.3f} s/step" for s in order)
              + f"  fit/cli {ratios[-1]:.3f}", flush=True)
    lengths = [int(f["input_ids"].shape[1]) for f, _ in batches.take(args.steps)]
    return {"seconds_per_step": times, "ratios": ratios, "lengths": lengths}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 layers")
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--data", default=os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data"))
    p.add_argument("--out", default=os.path.join(HERE, "results", "keras_fit.json"))
    args = p.parse_args()
    if args.quick:
        args.n_layer = 2
    res = run(args)
    med = {k: statistics.median(v) for k, v in res["seconds_per_step"].items()}
    ratio = statistics.median(res["ratios"])
    print(f"\npadded lengths {res['lengths']}\n| side | s/step (median of {args.pairs} blocks) |\n|---|---:|")
    print(f"| command line (Trainer) | {med['cli']:.3f} |\n| Keras fit | {med['keras']:.3f} |")
    family = " ".join(cpu_flags())
    print(f"fit / command line: {ratio:.3f} (median of {args.pairs} pairs)  ({cpu_model()}, {family})")
    write_json(args.out, {"command": " ".join(sys.argv), "cpu": cpu_model(), "cpu_family": family,
                          "versions": versions(["tensorflow", "keras"]), "n_layer": args.n_layer,
                          "batch": args.batch, "steps": args.steps, "pairs": args.pairs, "median": med,
                          "ratio": ratio, **res})


if __name__ == "__main__":
    main()
