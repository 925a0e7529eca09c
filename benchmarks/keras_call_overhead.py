#!/usr/bin/env python
"""What one ``predict`` / ``evaluate`` / ``fit`` call on a few raw texts costs a Keras task model beyond its
compute: a tiny ``XLNetClassifier`` (2 layers, d_model 32: the model's own work is milliseconds), 9 real SST-2
dev sentences, each call repeated after the first (which traces and compiles); the median of the repeats, per
checkout. Each checkout runs in a process of its own, the checkouts alternating round by round.

    python benchmarks/keras_call_overhead.py                          # this checkout
    python benchmarks/keras_call_overhead.py --also /path/to/other    # and another checkout of the project

Results: benchmarks/results/keras_call_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_util import cpu_flags, cpu_model, versions, write_json  # noqa: E402

TINY = dict(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, n_token=32000)
CALLS = ("predict", "evaluate", "fit")


def worker(root: str, repeats: int) -> None:
    """One checkout's figures, printed as one JSON line."""
    sys.path.insert(0, root)
    import numpy as np

    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.tasks import XLNetClassifier

    data = os.environ.get("SHARED_DATA", os.path.join(os.path.dirname(root), "shared", "data"))
    rows = [line.split("\t") for line in open(os.path.join(data, "glue", "SST-2", "dev.tsv"),
                                              encoding="utf-8").read().splitlines()[1:10]]
    texts, labels = [r[0] for r in rows], np.array([int(r[1]) for r in rows])
    model = XLNetClassifier(XLNetConfig(**TINY), num_classes=2, max_seq_length=64,
                            tokenizer=os.path.join(data, "spiece", "spiece.model"))
    model.compile(learning_rate=1e-4)
    run = {"predict": lambda: model.predict(texts, verbose=0),
           "evaluate": lambda: model.evaluate(texts, labels, verbose=0),
           "fit": lambda: model.fit(texts, labels, batch_size=4, verbose=0)}
    from xlnet_tf.tasks import keras_task

    out = {"code": os.path.dirname(os.path.dirname(os.path.abspath(keras_task.__file__)))}  # the checkout measured
    for name in CALLS:
        times = []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            run[name]()
            times.append(time.perf_counter() - t)
        out[name] = {"first_s": times[0], "median_s": statistics.median(times[1:]), "repeats_s": times[1:]}
    print("RESULT " + json.dumps(out), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--also", default="", help="other checkouts, comma-separated")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of each kind after the first")
    ap.add_argument("--rounds", type=int, default=2, help="processes per checkout, alternating")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.repeats)
        return 0
    roots = [ROOT] + [os.path.abspath(p) for p in args.also.split(",") if p]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    results = {root: [] for root in roots}
    for _ in range(args.rounds):
        for root in roots:
            # (-S and the site-packages on the path without their .pth files: no editable install's finder
            # sends the worker to another checkout's code)
            r = subprocess.run([sys.executable, "-S", os.path.abspath(__file__), "--worker", root, "--repeats",
                                str(args.repeats)], capture_output=True, text=True, check=True,
                               env=dict(env, PYTHONPATH=os.pathsep.join(site.getsitepackages())))
            results[root].append(json.loads(r.stdout.split("RESULT ")[-1]))
    table = {root: {name: statistics.median(x[name]["median_s"] for x in runs) for name in CALLS}
             for root, runs in results.items()}
    print("| checkout | " + " | ".join(f"{n} (s/call)" for n in CALLS) + " |")
    print("|---|" + "---:|" * len(CALLS))
    for root, row in table.items():
        print(f"| {root} | " + " | ".join(f"{row[n]:.3f}" for n in CALLS) + " |")
    write_json(os.path.join(HERE, "results", "keras_call_overhead.json"),
               {"cpu": cpu_model(), "flags": cpu_flags(), "versions": versions(["tensorflow", "keras"]),
                "model": TINY, "texts": 9, "repeats": args.repeats, "rounds": args.rounds, "median_s": table,
                "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
