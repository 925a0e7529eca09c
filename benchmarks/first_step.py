"""Time to the first training step of a real command line, AutoGraph off (the library: every ``tf.function`` it
makes passes ``autograph=False``, every function it hands tf.data is wrapped in ``do_not_convert``) against on
(the same code with ``tf.function`` forced to ``autograph=True`` and ``do_not_convert`` an identity: TensorFlow's
defaults). Each run is a fresh process: ``run_classifier.py --task=sst-2`` in-process through its
``main`` on the real SST-2 data, the suite's tiny model (2 layers, d_model 64), length 48, batch 32, training
only, features cached beforehand. Per run: the first step's seconds (its tracing and compilation), the slowest
later step (a new padded length), the median step and the whole ``main``.

    python benchmarks/first_step.py [--runs 3] [--steps 40] [--json benchmarks/results/first_step.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

from bench_util import cpu_flags, cpu_model, shared_dir, write_json  # noqa: E402

CHILD = r"""
import json, os, sys, time
sys.path[:0] = [sys.argv[1]]
import tensorflow as tf
if sys.argv[2] == "on":  # TensorFlow's default for every tf.function the library makes
    _function = tf.function
    def _with_autograph(*a, **k):
        k["autograph"] = True
        return _function(*a, **k)
    tf.function = _with_autograph
    tf.autograph.experimental.do_not_convert = lambda func=None: func  # tf.data converts the maps' functions
from xlnet_tf import training
times, build = [], training.Trainer._build_step
def timed_build(self):
    fn = build(self)
    def step(it):
        t = time.perf_counter(); out = fn(it); float(out[0]); times.append(time.perf_counter() - t); return out
    step.experimental_get_tracing_count = fn.experimental_get_tracing_count
    return step
training.Trainer._build_step = timed_build
import run_classifier
t0 = time.perf_counter()
code = run_classifier.main(["run_classifier.py"] + json.loads(sys.argv[3])).code
assert code == 0, code
print("RESULT " + json.dumps({"main_s": time.perf_counter() - t0, "steps_s": times}))
"""


def run(mode: str, flags) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", CHILD, ROOT, mode, json.dumps(flags)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not lines:
        raise SystemExit(f"run failed ({mode}):\n{r.stderr[-3000:]}")
    res = json.loads(lines[-1][len("RESULT "):])
    steps = res["steps_s"]
    return {"first_step_s": round(steps[0], 3), "slowest_later_step_s": round(max(steps[1:]), 3),
            "median_step_s": round(statistics.median(steps), 4), "main_s": round(res["main_s"], 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json", default=os.path.join(HERE, "results", "first_step.json"))
    a = p.parse_args()
    sst2 = os.path.join(shared_dir(), "glue", "SST-2")
    if not os.path.isdir(sst2):
        raise SystemExit(f"real data not available: {sst2} (set SHARED_DATA)")
    from xlnet_tf.config import XLNetConfig

    work = tempfile.mkdtemp(prefix="first_step_")
    config = os.path.join(work, "config.json")
    with open(config, "w") as f:
        json.dump(XLNetConfig.preset("tiny").to_original_dict(), f)

    def flags(out):
        return ["--task=sst-2", f"--data_dir={sst2}", f"--model_config_path={config}",
                f"--spiece_model_file={os.path.join(shared_dir(), 'spiece', 'spiece.model')}",
                f"--output_dir={os.path.join(work, out)}", f"--cache_dir={os.path.join(work, 'cache')}",
                "--max_seq_length=48", "--train_batch_size=32", f"--train_steps={a.steps}", "--warmup_steps=4",
                "--learning_rate=5e-4", "--progress=false", f"--save_steps={a.steps}", "--do_train"]

    run("off", flags("warm"))  # writes the cached features (not timed)
    rows = {"off": [], "on": []}
    for i in range(a.runs):  # alternating, so both see the same machine
        for mode in ("off", "on"):
            rows[mode].append(run(mode, flags(f"{mode}{i}")))
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in rows.items()}
    print(f"| AutoGraph | first step s | slowest later step s | median step s | whole run_classifier main s "
          f"(median of {a.runs}, {a.steps} steps) |")
    print("|---|---:|---:|---:|---:|")
    for mode, name in (("on", "on (TensorFlow's default)"), ("off", "off (the library)")):
        m = med[mode]
        print(f"| {name} | {m['first_step_s']:.2f} | {m['slowest_later_step_s']:.2f} | {m['median_step_s']:.3f} | "
              f"{m['main_s']:.1f} |")
    write_json(a.json, {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "steps": a.steps, "runs": a.runs,
                        "median": med, "rows": rows,
                        "command": f"python benchmarks/first_step.py --runs {a.runs} --steps {a.steps}"})


if __name__ == "__main__":
    main()
