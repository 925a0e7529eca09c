#!/usr/bin/env python
"""Memory levers of fine-tuning, measured: peak memory and seconds per iteration of one training step of an
XLNet-Base-shaped model (12 layers, 768, 12 heads, d_inner 3072, vocab 32000, random weights) with the
classification head (TaskModel + ClassificationHead, 2 labels, dropout 0.1), through the project's Trainer
(AdamW, clipping, XLA on one device as its default), next to ``xlnet_tf.ram.estimate``'s prediction.

Configurations (same examples per optimizer update in every row, ``--batch``, default 2):
  float32 baseline | recompute | mixed_bfloat16 | mixed_float16 | num_trainable_layers=2 |
  grad_accum 2 (micro-batch batch/2) | all levers (recompute + mixed_bfloat16 + 2 trainable layers + accum 2)

Each configuration runs in its OWN fresh subprocess, one after the other (``--runs`` subprocesses each).
A worker imports TensorFlow, runs one op and records its RSS (the baseline), builds the Trainer, runs
``--warmup`` steps (the first one traces and compiles), then releases freed heap pages (``malloc_trim``), resets
the kernel's peak-RSS mark (``/proc/self/clear_refs``) and TensorFlow's allocator statistics, and times
``--reps`` single steps. Memory figures per row:

* ``alloc peak``: TensorFlow's CPU allocator peak during the timed steps (``tf.config.experimental.
  get_memory_info``): every tensor, including the variables and optimizer slots. This is what the estimator
  models, and what the error column compares with.
* ``XLA peak``: XLA's own heap simulation of the compiled step (buffer-assignment dump), variables included.
* ``RSS peak``: the process's ``ru_maxrss`` over its whole life (compilation included) minus the baseline after
  importing TensorFlow; ``RSS steady``: the peak RSS during the timed steps minus the same baseline. The
  difference to ``alloc peak`` is the framework (XLA executable, compiler leftovers, allocator pools).

    python benchmarks/memory_levers.py                 # the table above -> results/memory_levers.{json,md}
    python benchmarks/memory_levers.py --quick         # 4-layer model at seq 128, two configurations (~3 min)
    python benchmarks/memory_levers.py --configs baseline,recompute --batch 1 --runs 2
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as the run_*.py entry points

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import cpu_model, versions  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, n_token=32000)
PROTO = "@@"

CONFIGS = {  # name -> (label, overrides of the worker spec)
    "baseline": ("float32 baseline", {}),
    "recompute": ("--recompute", {"recompute": True}),
    "bf16": ("mixed_bfloat16", {"precision": "mixed_bfloat16"}),
    "fp16": ("mixed_float16", {"precision": "mixed_float16"}),
    "frozen": ("num_trainable_layers=2", {"num_trainable_layers": 2}),
    "accum": ("grad_accum 2 (half micro-batch)", {"grad_accum_steps": 2}),
    "all": ("all levers (recompute, bf16, 2 layers, accum 2)",
            {"recompute": True, "precision": "mixed_bfloat16", "num_trainable_layers": 2, "grad_accum_steps": 2}),
}
DEFAULT_CONFIGS = "baseline,recompute,bf16,fp16,frozen,accum,all"
JIT_TEXT = {True: "whole-step XLA (--jit=true)", "update": "TF graph mode + XLA optimizer update (--jit=update, the "
            "CPU default)", False: "TF graph mode (--jit=false)"}


# ====================================================================== worker side
def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def xla_peak_bytes(dump_dir: str):
    """Peak of XLA's heap simulation for the training step (variables included), from the buffer assignment."""
    best = None
    for path in glob.glob(os.path.join(dump_dir, "*replica_step*buffer-assignment.txt")):
        with open(path) as f:
            m = re.search(r"Stack trace breakdown for peak usage: ([\d ]+) bytes", f.read())
        if m:
            val = int(m.group(1).replace(" ", ""))
            best = val if best is None else max(best, val)
    return best


def worker(spec: dict) -> None:
    dump_dir = None
    if spec["jit"] is True and spec.get("xla_dump", True):
        dump_dir = tempfile.mkdtemp(prefix="xlnet_memlev_xla_")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump_dir}").strip()
    sys.path.insert(0, ROOT)
    import xlnet_tf  # noqa: F401  (oneDNN / log environment before TensorFlow loads)
    import ctypes

    import numpy as np
    import tensorflow as tf

    float(tf.reduce_sum(tf.ones([8])))  # runtime, thread pools and allocator exist
    rss_import = _status_mb("VmRSS")
    device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"  # whose allocator to read

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.task_model import TaskModel
    from xlnet_tf.training import TrainConfig, Trainer

    B, S, k = spec["batch"], spec["seq"], spec["grad_accum_steps"]
    cfg = XLNetConfig(**spec["shape"], recompute=spec["recompute"], dropout=0.1, dropatt=0.1,
                      accelerate=spec.get("accelerate", True))
    rng = np.random.default_rng(0)
    n = max(8, 2 * B)
    a_len = (S - 3) // 2
    seg = np.concatenate([np.zeros(a_len + 1), np.ones(S - a_len - 2), [2]]).astype(np.int32)  # A SEP B SEP CLS
    feats = {"input_ids": rng.integers(10, cfg.n_token, (n, S)).astype(np.int32),
             "segment_ids": np.tile(seg, (n, 1)), "padding_mask": np.ones((n, S), np.int32),
             "label": rng.integers(0, 2, (n,)).astype(np.int32), "is_real_example": np.ones((n,), np.int32)}

    def model_fn():
        model = TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=0)
        model.build_with({key: v[:1] for key, v in feats.items()})
        return model

    def dataset_fn(ctx):
        return tf.data.Dataset.from_tensor_slices(feats).repeat().batch(B // k, drop_remainder=True)

    ntl = spec["num_trainable_layers"]
    tc = TrainConfig(learning_rate=1e-5, train_steps=10 ** 6, grad_accum_steps=k, precision=spec["precision"],
                     num_trainable_layers=None if ntl < 0 else ntl, jit_compile=spec["jit"], progress=False,
                     model_dir=None, seed=0)
    t0 = time.perf_counter()
    trainer = Trainer(model_fn, dataset_fn, tc)
    build_s = time.perf_counter() - t0
    rss_built = _status_mb("VmRSS")
    alloc_built = tf.config.experimental.get_memory_info(device)["current"]
    warm = []
    for i in range(spec["warmup"]):
        t = time.perf_counter()
        trainer.train(stop_at=i + 1)
        warm.append(time.perf_counter() - t)
    rss_maxrss_warm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_ready = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM / ru_maxrss to the current RSS
        f.write("5")
    tf.config.experimental.reset_memory_stats(device)
    times, loads = [], []
    for i in range(spec["reps"]):
        t = time.perf_counter()
        trainer.train(stop_at=spec["warmup"] + i + 1)
        times.append(time.perf_counter() - t)
        loads.append(os.getloadavg()[0])
    mem = tf.config.experimental.get_memory_info(device)
    from xlnet_tf import accel  # did the step run the kernels? (the estimate models them)

    fused = (spec["jit"] is not True and spec["precision"] == "float32"
             and accel.choose(cfg, tf.float32, True, False).kernel is not None)
    out = {"device": device, "fused_attention": bool(fused), "rss_import_mb": rss_import, "rss_built_mb": rss_built,
           "rss_ready_mb": rss_ready,
           "rss_maxrss_mb": max(rss_maxrss_warm, _status_mb("VmHWM")), "rss_steady_peak_mb": _status_mb("VmHWM"),
           "alloc_built_bytes": alloc_built, "alloc_peak_bytes": mem["peak"], "alloc_current_bytes": mem["current"],
           "build_s": build_s, "warmup_s": warm, "times_s": times, "load1": loads,
           "trainable_variables": int(sum(int(np.prod(v.shape)) for v in trainer.train_vars)),
           "param_count": int(trainer.model.count_params())}
    if dump_dir:
        out["xla_peak_bytes"] = xla_peak_bytes(dump_dir)
        shutil.rmtree(dump_dir, ignore_errors=True)
    print(PROTO + "RESULT " + json.dumps(out), flush=True)


# ====================================================================== driver side
def machine_info() -> dict:
    cpu = cpu_model()
    mem_total = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) / 1024.0 / 1024.0
    vers = versions(("tensorflow", "keras", "numpy"))
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "mem_total_gib": mem_total,
            "python": platform.python_version(), "versions": vers,
            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (set by this benchmark)")}


def run_worker(spec: dict, log) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(PROTO + "RESULT "):
            res = json.loads(line[len(PROTO) + 7:])
            res["wall_s"] = time.time() - t0
            return res
    raise RuntimeError(f"worker {spec} failed (rc={proc.returncode}); see the worker log")


def predict(spec: dict, cpu: bool = True, fused_attention: bool = False) -> dict:
    sys.path.insert(0, ROOT)
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.ram import cli_head, estimate

    cfg = XLNetConfig(**spec["shape"], recompute=spec["recompute"])
    ntl = spec["num_trainable_layers"]
    return estimate(cfg, spec["seq"], spec["batch"], spec["precision"], spec["recompute"],
                    None if ntl < 0 else ntl, spec["grad_accum_steps"], head=cli_head("classification", cfg),
                    jit=spec["jit"] is True, cpu=cpu, fused_attention=fused_attention)


MB = 2.0 ** 20


def summarize(name, label, spec, runs, est) -> dict:
    times = [t for r in runs for t in r["times_s"]]
    med = statistics.median(times)
    alloc = statistics.median(r["alloc_peak_bytes"] for r in runs)
    row = {"config": name, "label": label, "spec": spec, "runs": runs,
           "median_s_per_iter": med, "min_s": min(times), "max_s": max(times),
           "examples_per_s": spec["batch"] / med,
           "load1_during": [x for r in runs for x in r["load1"]],
           "alloc_peak_mib": alloc / MB,
           "alloc_built_mib": statistics.median(r["alloc_built_bytes"] for r in runs) / MB,
           "rss_import_mib": statistics.median(r["rss_import_mb"] for r in runs),
           "rss_peak_mib": statistics.median(r["rss_maxrss_mb"] for r in runs),
           "rss_steady_peak_mib": statistics.median(r["rss_steady_peak_mb"] for r in runs),
           "first_step_s": statistics.median(r["warmup_s"][0] for r in runs),
           "device": runs[0].get("device", "CPU:0")}
    row["rss_peak_above_import_mib"] = row["rss_peak_mib"] - row["rss_import_mib"]
    row["rss_steady_above_import_mib"] = row["rss_steady_peak_mib"] - row["rss_import_mib"]
    row["measured_step_mib"] = row["alloc_peak_mib"] - row["alloc_built_mib"]
    xla = [r.get("xla_peak_bytes") for r in runs if r.get("xla_peak_bytes")]
    row["xla_peak_mib"] = statistics.median(xla) / MB if xla else None
    set_estimate(row, est)
    return row


def set_estimate(row: dict, est: dict) -> None:
    """The estimator's prediction for a row and its error vs the allocator's peaks."""
    row.update({"estimate_mib": est["total"] / MB, "estimate_persistent_mib": est["persistent"] / MB,
                "estimate_step_peak_mib": est["step_peak"] / MB, "estimate_peak_phase": est["peak_phase"],
                "estimate_components_mib": {k: est[k] / MB for k in ("parameters", "gradients", "optimizer_state",
                                                                      "activations", "workspace")}})
    row["estimate_error_pct"] = 100.0 * (row["estimate_mib"] - row["alloc_peak_mib"]) / row["alloc_peak_mib"]
    row["estimate_step_error_pct"] = (100.0 * (row["estimate_step_peak_mib"] - row["measured_step_mib"])
                                      / row["measured_step_mib"])


def print_table(rows, base_name="baseline"):
    base = next((r for r in rows if r["config"] == base_name), rows[0])
    hdr = (f"{'configuration':<48}{'s/iter':>8}{'vs base':>8}{'alloc peak':>12}{'XLA peak':>10}{'estimate':>10}"
           f"{'err':>7}{'step meas':>10}{'step est':>9}{'err':>7}{'RSS peak':>10}{'RSS steady':>11}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        xla = f"{r['xla_peak_mib']:.0f}" if r["xla_peak_mib"] else "-"
        ratio = r["median_s_per_iter"] / base["median_s_per_iter"]
        print(f"{r['label']:<48}{r['median_s_per_iter']:>8.2f}{ratio:>7.2f}x"
              f"{r['alloc_peak_mib']:>12.0f}{xla:>10}{r['estimate_mib']:>10.0f}{r['estimate_error_pct']:>+6.1f}%"
              f"{r['measured_step_mib']:>10.0f}{r['estimate_step_peak_mib']:>9.0f}"
              f"{r['estimate_step_error_pct']:>+6.1f}%"
              f"{r['rss_peak_above_import_mib']:>10.0f}{r['rss_steady_above_import_mib']:>11.0f}")
    print("(MiB; alloc/XLA/estimate include variables + optimizer slots; RSS columns minus the RSS after "
          "importing TensorFlow)")


def markdown(result) -> str:
    rows = result["rows"]
    base = next((r for r in rows if r["config"] == "baseline"), rows[0])
    m = result["machine"]
    s = result["settings"]
    lines = [
        f"### Memory levers, measured (`{result['command']}`)",
        "",
        f"XLNet-Base shape ({s['shape']['n_layer']} layers, d {s['shape']['d_model']}, vocab "
        f"{s['shape']['n_token']}), classification head, seq {s['seq']}, {s['batch']} examples per update, AdamW, "
        f"{JIT_TEXT[s['jit']]}; {m['nproc']} CPU "
        f"({m['cpu_model']}, {m['mem_total_gib']:.0f} GiB), TF {m['versions'].get('tensorflow')}, "
        f"Keras {m['versions'].get('keras')}. {s['runs']} fresh subprocess(es) per configuration, "
        f"{s['reps']} timed steps each after {s['warmup']} warm-up steps; medians. Started {result['started']}; "
        f"1-min load average {result['load_start'][0]:.1f} at start, {result['load_end'][0]:.1f} at the end "
        "(the machine is shared: absolute times are noisy, compare ratios).",
        "",
        "| configuration | s/iter (median) | vs baseline | load during | alloc peak MiB | XLA peak MiB | "
        "estimate MiB (error) | step peak MiB: measured / estimated (error) | RSS peak MiB | RSS steady MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ld = r["load1_during"]
        xla = f"{r['xla_peak_mib']:.0f}" if r["xla_peak_mib"] else "-"
        lines.append(
            f"| {r['label']} | {r['median_s_per_iter']:.2f} | "
            f"{r['median_s_per_iter'] / base['median_s_per_iter']:.2f}x | "
            f"{min(ld):.1f}-{max(ld):.1f} | {r['alloc_peak_mib']:.0f} | {xla} | {r['estimate_mib']:.0f} "
            f"({r['estimate_error_pct']:+.1f}%) | {r['measured_step_mib']:.0f} / {r['estimate_step_peak_mib']:.0f} "
            f"({r['estimate_step_error_pct']:+.1f}%) | {r['rss_peak_above_import_mib']:.0f} | "
            f"{r['rss_steady_above_import_mib']:.0f} |")
    for r in result.get("failed", []):
        lines.append(f"| {r['label']} | failed: {r['error']} | | | | | {r['estimate_mib']:.0f} | | | |")
    errs = [abs(r["estimate_error_pct"]) for r in rows]
    step_errs = [abs(r["estimate_step_error_pct"]) for r in rows]
    first = [r for r in rows if "estimate_at_run_mib" in r and abs(r["estimate_at_run_mib"] - r["estimate_mib"]) > 0.5]
    lines += [
        "",
        "*alloc peak*: TensorFlow's CPU allocator peak over the timed steps (every tensor incl. variables and "
        "optimizer slots; the quantity `xlnet_tf.ram` estimates). *XLA peak*: XLA's heap simulation of the "
        "compiled step. *RSS peak*: `ru_maxrss` over the worker's life (compilation included) minus the RSS after "
        f"importing TensorFlow (median {statistics.median(r['rss_import_mib'] for r in rows):.0f} MiB); "
        "*RSS steady*: the same over the timed steps only (after `malloc_trim` and a `clear_refs` reset). "
        f"Estimator error vs the allocator peak: median {statistics.median(errs):.1f}%, worst {max(errs):.1f}%. "
        "*step peak* = allocator peak minus the allocator's bytes in use after building the trainer (variables, "
        "slots and the allocator's internal fragmentation of them), vs the estimator's step peak: median error "
        f"{statistics.median(step_errs):.1f}%, worst {max(step_errs):.1f}%.",
    ]
    if first:
        lines += ["", "Estimates re-rendered with the current `xlnet_tf.ram`; the estimator as it was when these "
                  "were measured said: " + "; ".join(f"{r['label']} {r['estimate_at_run_mib']:.0f} MiB "
                                                     f"({r['estimate_at_run_error_pct']:+.1f}%)" for r in first)
                  + "."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="4 layers, seq 128, baseline + recompute (~3 min)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma list of {','.join(CONFIGS)}")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2, help="examples per optimizer update (every configuration)")
    p.add_argument("--n-layer", type=int, default=BASE["n_layer"])
    p.add_argument("--reps", type=int, default=3, help="timed steps per worker (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first compiles)")
    p.add_argument("--runs", type=int, default=1, help="fresh subprocesses per configuration")
    p.add_argument("--jit", default="true", choices=["true", "update", "false"],
                   help="whole-step XLA (calibrates xlnet_tf.ram), graph mode + XLA update, or graph mode")
    p.add_argument("--accelerate", default="true",
                   help="the model's accelerate run option (true, false or a comma list such as xla,chunks)")
    p.add_argument("--no-xla-dump", action="store_true", help="skip XLA's buffer-assignment dump")
    p.add_argument("--out", default=None, help="json path (default results/memory_levers[_quick].json)")
    p.add_argument("--render", metavar="JSON", help="only re-render the markdown of a saved result")
    args = p.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.render:  # re-render, with the CURRENT estimator (the estimate of the run itself is kept)
        with open(args.render) as f:
            result = json.load(f)
        for row in result["rows"]:
            if "estimate_at_run_mib" not in row:
                row["estimate_at_run_mib"] = row["estimate_mib"]
                row["estimate_at_run_error_pct"] = row["estimate_error_pct"]
            set_estimate(row, predict(row["spec"], cpu=row.get("device", "CPU:0").startswith("CPU"),
                                      fused_attention=row["runs"][0].get("fused_attention", False)))
        with open(args.render, "w") as f:
            json.dump(result, f, indent=1)
        print_table(result["rows"])
        with open(os.path.splitext(args.render)[0] + ".md", "w") as f:
            f.write(markdown(result))
        return None

    shape = dict(BASE, n_layer=args.n_layer)
    configs = args.configs.split(",")
    if args.quick:
        shape["n_layer"], args.seq, args.reps, args.warmup = 4, 128, 2, 1
        if args.configs == DEFAULT_CONFIGS:
            configs = ["baseline", "recompute"]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s) {unknown}; expected {list(CONFIGS)}")
    if args.batch % 2 and any("grad_accum_steps" in CONFIGS[c][1] for c in configs):
        p.error("--batch must be even for the grad_accum configurations (micro-batch = batch / 2)")
    stem = "memory_levers_quick" if args.quick else "memory_levers"
    out = args.out or os.path.join(HERE, "results", stem + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    info = machine_info()
    load_start = os.getloadavg()
    print(f"machine: {info['nproc']} cpu(s), {info['cpu_model']}, {info['mem_total_gib']:.0f} GiB; "
          f"TF {info['versions']['tensorflow']}; load {load_start}", flush=True)
    t_start = time.time()
    rows, failed = [], []
    log_path = os.path.splitext(out)[0] + "_workers.log"
    with open(log_path, "w") as log:
        for name in configs:
            label, over = CONFIGS[name]
            spec = dict(shape=shape, seq=args.seq, batch=args.batch, precision="float32", recompute=False,
                        num_trainable_layers=-1, grad_accum_steps=1, jit={"true": True, "update": "update", "false": False}[args.jit], reps=args.reps,
                        warmup=args.warmup, xla_dump=not args.no_xla_dump,
                        accelerate={"true": True, "false": False}.get(args.accelerate.lower(), args.accelerate))
            spec.update(over)
            runs = []
            for i in range(args.runs):
                print(f"... {label}: run {i + 1}/{args.runs} (load {os.getloadavg()[0]:.1f})", flush=True)
                log.write(f"===== {name} run {i + 1}\n")
                log.flush()
                try:
                    runs.append(run_worker(spec, log))
                except RuntimeError as e:
                    print(f"    FAILED: {e}", flush=True)
            est = predict(spec, cpu=not runs or runs[0].get("device", "CPU:0").startswith("CPU"),
                          fused_attention=bool(runs) and runs[0].get("fused_attention", False))
            if not runs:
                failed.append({"config": name, "label": label, "spec": spec, "estimate_mib": est["total"] / MB,
                               "error": f"worker failed, see {os.path.relpath(log_path, ROOT)}"})
                continue
            rows.append(summarize(name, label, spec, runs, est))
            r = rows[-1]
            print(f"    {r['median_s_per_iter']:.2f} s/iter, alloc peak {r['alloc_peak_mib']:.0f} MiB, "
                  f"estimate {r['estimate_mib']:.0f} MiB ({r['estimate_error_pct']:+.1f}%), RSS peak "
                  f"{r['rss_peak_above_import_mib']:.0f} MiB above import", flush=True)
    print()
    print_table(rows)
    cmd = " ".join([os.path.relpath(sys.executable, ROOT), "benchmarks/memory_levers.py"]
                   + (sys.argv[1:] if argv is None else list(argv)))
    result = {"command": cmd, "machine": info,
              "settings": {"shape": shape, "seq": args.seq, "batch": args.batch, "reps": args.reps,
                           "warmup": args.warmup, "runs": args.runs, "jit": {"true": True, "update": "update", "false": False}[args.jit],
                           "head": "classification (2 labels)", "dropout": 0.1, "optimizer": "AdamW (Trainer)"},
              "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
              "wall_s": time.time() - t_start, "load_start": load_start, "load_end": os.getloadavg(), "rows": rows,
              "failed": failed}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    md = os.path.splitext(out)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown(result))
    print(f"\nwrote {out} and {md} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
