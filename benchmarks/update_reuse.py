#!/usr/bin/env python
"""The grouped optimizer update shared between runs of one process (``xlnet_tf.optimization.group_update``):
run_classifier.py's ``main`` in-process, several short jobs one after another (what a sweep, a notebook's rerun or
the test suite's in-process CLI tests do), each job's wall seconds, with the shared update ("shared") and with the
cache emptied before each job ("own": every optimizer traces and compiles its own groups, as before the sharing).
The two modes alternate job by job in one process; the first job (imports, first compilations) is left out.

    python benchmarks/update_reuse.py --model tiny --jobs 9     # the suite's CLI model (1 layer, d_model 16)
    python benchmarks/update_reuse.py --model base --jobs 5     # XLNet-Base, 2 steps of 4 x 32 per job

Writes results/update_reuse_<model>.json and prints a table; PERFORMANCE.md "Runs in one process share the
optimizer's update" holds the figures."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_util import cpu_flags, cpu_model, shared_dir, write_json  # noqa: E402

MODELS = {"tiny": dict(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32),
          "base": dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--jobs", type=int, default=9, help="jobs per mode after the first (left-out) job")
    args = ap.parse_args()
    import run_classifier
    from xlnet_tf import optimization

    work = tempfile.mkdtemp(prefix="update_reuse_")
    config = dict(n_token=32000, ff_activation="gelu", untie_r=True, **MODELS[args.model])
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(config, f)
    data = os.path.join(work, "SST-2")
    os.makedirs(data)
    for split, rows in (("train", 41), ("dev", 21)):
        with open(os.path.join(shared_dir(), "glue", "SST-2", f"{split}.tsv"), encoding="utf-8") as f:
            lines = f.read().splitlines()[:rows]
        with open(os.path.join(data, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    def job(i):
        argv = ["run_classifier.py", "--task=SST-2", f"--data_dir={data}",
                f"--model_config_path={os.path.join(work, 'config.json')}",
                f"--spiece_model_file={os.path.join(shared_dir(), 'spiece', 'spiece.model')}",
                f"--output_dir={os.path.join(work, f'run{i}')}", "--max_seq_length=32", "--train_batch_size=4",
                "--train_steps=2", "--save_steps=2", "--progress=false", "--do_train", "--length_buckets=false"]
        t = time.perf_counter()
        assert run_classifier.main(argv).code == 0
        return time.perf_counter() - t

    job(0)
    times = {"shared": [], "own": []}
    for i in range(args.jobs):
        for mode in ("own", "shared"):
            if mode == "own":
                optimization.group_update.cache_clear()
            times[mode].append(job(len(times["own"]) + len(times["shared"]) + 1))
    rows = {m: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3), "max_s": round(max(v), 3),
                "jobs": len(v)} for m, v in times.items()}
    print(f"| {args.model}: job of 2 steps | median s | min..max s | jobs |")
    print("|---|---:|---:|---:|")
    for m, r in rows.items():
        print(f"| {m} | {r['median_s']:.2f} | {r['min_s']:.2f}..{r['max_s']:.2f} | {r['jobs']} |")
    write_json(os.path.join(HERE, "results", f"update_reuse_{args.model}.json"),
               {"command": f"python benchmarks/update_reuse.py --model {args.model} --jobs {args.jobs}",
                "cpu": cpu_model(), "cpu_flags": cpu_flags(), "config": config, "rows": rows, "times": times})


if __name__ == "__main__":
    main()
