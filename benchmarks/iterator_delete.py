"""How long deleting a tf.data iterator takes after it lived N seconds, tf.data's autotuning on (TensorFlow's
default) and off (``xlnet_tf.datasets.for_iteration``, what the library iterates). The pipeline is the shape of
ours: a parallel map (AUTOTUNE), a batch, a prefetch (AUTOTUNE); it is read every 50 ms while ``--busy`` other
processes (default 2: one per core here) keep the cores busy, as a second job or a test worker does. The wait is
intermittent (PERFORMANCE.md "Deleting a tf.data iterator"): with the cores otherwise idle, or busy with this
process's own matrix products, it did not come (25 s -> 0.2 s).

    python benchmarks/iterator_delete.py [--lifetimes 5,25,60] [--busy 2]
        [--json benchmarks/results/iterator_delete.json]
"""

import argparse
import gc
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from bench_util import cpu_flags, cpu_model, write_json  # noqa: E402
from xlnet_tf import datasets  # noqa: E402


def deletion_seconds(lifetime: float, autotune: bool) -> float:
    ds = tf.data.Dataset.range(10**9).map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(4).prefetch(tf.data.AUTOTUNE)
    it = iter(ds if autotune else datasets.for_iteration(ds))
    t0 = time.time()
    while time.time() - t0 < lifetime:
        next(it)
        time.sleep(0.05)
    t1 = time.time()
    del it
    gc.collect()
    return time.time() - t1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lifetimes", default="5,25,60")
    p.add_argument("--busy", type=int, default=2, help="other processes spinning on the cores meanwhile")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "iterator_delete.json"))
    a = p.parse_args()
    rows = []
    print("| iterator lived | autotune on (TF default): deletion | autotune off (the library): deletion |")
    print("|---:|---:|---:|")
    spin = "while True: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(a.busy)]
    try:
        for lifetime in [float(s) for s in a.lifetimes.split(",")]:
            on, off = deletion_seconds(lifetime, True), deletion_seconds(lifetime, False)
            rows.append({"lifetime_s": lifetime, "autotune_on_s": round(on, 3), "autotune_off_s": round(off, 3)})
            print(f"| {lifetime:.0f} s | {on:.2f} s | {off:.2f} s |", flush=True)
    finally:
        for p in busy:
            p.kill()
    write_json(a.json, {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "tensorflow": tf.__version__,
                        "busy_processes": a.busy, "rows": rows})


if __name__ == "__main__":
    main()
