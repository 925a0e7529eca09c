#!/usr/bin/env python
"""The time / memory / accuracy trade-off study of fine-tuning on limited hardware, as a tool.

For a fixed step budget, sweeps one knob at a time around a baseline and, for every point, runs the task's own
CLI (``run_squad.py`` by default, ``run_classifier.py`` with ``--task=classification``) in a fresh subprocess,
then records: seconds per iteration (from the run's progress lines: the trainer's steps/s, which excludes the
first, compiling step), examples/s, the subprocess's peak RSS (``os.wait4`` rusage of that child), TensorFlow's
allocator peak over the whole run (GPU:0 on a GPU machine = the device peak, else CPU:0; read at exit by a
small wrapper that runs the script unchanged; it also covers initialisation and prediction), the memory
estimator's prediction for the training step (``xlnet_tf.ram.estimate``; it counts tensors, the RSS also holds
the TensorFlow runtime, XLA executables and the input pipeline), and the task metric (SQuAD v2: the official
scorer's ``best_f1`` (+ ``f1``, ``exact``, and ``HasAns_span_f1``: the answerable questions scored on the best
non-null span, which moves before the answerability head learns to beat "no answer"); classification: the
task's main metric).

Knobs (``--knobs``, each swept with the others at the baseline):
  seq_len               --max_seq_length (SQuAD: doc_stride = seq/2, max_query_length = min(query, seq/2))
  num_trainable_layers  train only the top N blocks (+ head); -1 = all
  head                  original | deep: --head_hidden_sizes=512,384 (SQuAD also --answer_class_hidden_sizes=256)
  precision             float32 | mixed_bfloat16 | mixed_float16
  recompute             off | on
  grad_accum_steps      same examples per update, split in k micro-batches
Data: SQuAD v2.0 = the shared dev set split by article (every 5th article held out for evaluation, as
``tasks.squad.reader.split_by_article``), written to ``WORK_DIR/data/{train,eval}.json``; classification = a GLUE folder
(SST-2 by default; its dev split is the evaluation).

Outputs: ``benchmarks/results/tradeoff_<task>[_quick].{csv,json}`` and one figure per knob
``tradeoff_<task>[_quick]_<knob>.png`` (metric (+ span F1 on a second axis), seconds/iteration and peak memory vs
the knob).

    python benchmarks/tradeoff.py --quick                                # tiny model, no XLA, minutes
    python benchmarks/tradeoff.py --knobs=seq_len,head                   # the study's defaults
    python benchmarks/tradeoff.py --model_config_path=base --init_checkpoint=xlnet_cased_L-12_H-768_A-12 \\
        --train_steps=2000 --knobs=seq_len,num_trainable_layers,head     # a real study (GPU)
    python benchmarks/tradeoff.py --task=classification --knobs=seq_len --seq_len_values=64,128

Without pretrained weights (none here) the model trains from random initialisation, so on a small budget the
metric differences between points are small and noisy: the time and memory columns are the informative ones.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as the run_*.py entry points

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")
KNOBS = ("seq_len", "num_trainable_layers", "head", "precision", "recompute", "grad_accum_steps")
RATE_RE = re.compile(r"step\s+(\d+)/(\d+) loss (\S+) lr \S+ ([\d.]+) steps/s")
MiB = 2.0 ** 20


# ====================================================================== data
def split_squad(src: str, out_dir: str, eval_every: int = 5, max_train_articles: Optional[int] = None,
                max_eval_articles: Optional[int] = None) -> Dict[str, object]:
    """Writes train.json / eval.json: every ``eval_every``-th article of ``src`` is held out for evaluation."""
    with open(src, encoding="utf-8") as f:
        obj = json.load(f)
    arts = obj["data"]
    held = [a for i, a in enumerate(arts) if i % eval_every == eval_every - 1]
    train = [a for i, a in enumerate(arts) if i % eval_every != eval_every - 1]
    if max_train_articles:
        train = train[:max_train_articles]
    if max_eval_articles:
        held = held[:max_eval_articles]
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, part in (("train", train), ("eval", held)):
        path = os.path.join(out_dir, f"{name}.json")
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": obj.get("version", "v2.0"), "data": part}, f)
        os.replace(tmp, path)
        paths[name] = path
        paths[f"{name}_questions"] = sum(len(p["qas"]) for a in part for p in a["paragraphs"])
        paths[f"{name}_articles"] = [a["title"] for a in part]
    return paths


# ====================================================================== points
def baseline(args) -> Dict:
    return {"seq_len": args.seq_len, "num_trainable_layers": args.num_trainable_layers, "head": "original",
            "precision": "float32", "recompute": False, "grad_accum_steps": 1}


def knob_values(args, knob: str) -> List:
    if knob == "seq_len":
        return [int(x) for x in args.seq_len_values.split(",")]
    if knob == "num_trainable_layers":
        return [int(x) for x in args.num_trainable_layers_values.split(",")]
    if knob == "head":
        return ["original", "deep"]
    if knob == "precision":
        return args.precision_values.split(",")
    if knob == "recompute":
        return [False, True]
    if knob == "grad_accum_steps":
        return [int(x) for x in args.grad_accum_values.split(",")]
    raise ValueError(f"unknown knob {knob!r}; expected one of {KNOBS}")


def point_name(p: Dict) -> str:
    return (f"L{p['seq_len']}_ntl{p['num_trainable_layers']}_{p['head']}_{p['precision']}"
            f"{'_rc' if p['recompute'] else ''}"
            f"{'_acc' + str(p['grad_accum_steps']) if p['grad_accum_steps'] > 1 else ''}")


def sizes(s: str):
    return tuple(int(x) for x in s.split(",") if x.strip())


# Runs the task script as __main__ and, at exit, writes TensorFlow's allocator peak of the process (GPU:0 when
# there is a GPU: the device peak; else CPU:0) to $XLNET_TRADEOFF_MEM. The script itself is unchanged.
WRAPPER = """
import atexit, json, os, runpy, sys
def _report():
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return
    try:
        dev = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
        info = tf.config.experimental.get_memory_info(dev)
        with open(os.environ["XLNET_TRADEOFF_MEM"], "w") as f:
            json.dump({"device": dev, "peak": int(info["peak"]), "current": int(info["current"])}, f)
    except Exception as e:
        print("tradeoff wrapper: no allocator statistics:", e, file=sys.stderr)
atexit.register(_report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def command(args, p: Dict, out_dir: str, data: Dict) -> List[str]:
    L = p["seq_len"]
    cmd = [sys.executable, "-c", WRAPPER,
           os.path.join(ROOT, "run_squad.py" if args.task == "squad" else "run_classifier.py")]
    common = [f"--spiece_model_file={args.spiece_model_file}", f"--model_config_path={args.model_config_path}",
              f"--output_dir={out_dir}", f"--cache_dir={os.path.join(args.work_dir, 'cache')}",
              f"--max_seq_length={L}", f"--train_batch_size={args.train_batch_size}",
              f"--train_steps={args.train_steps}", f"--warmup_steps={args.warmup_steps}",
              f"--learning_rate={args.learning_rate}", f"--eval_batch_size={args.eval_batch_size}",
              f"--precision={p['precision']}", f"--num_trainable_layers={p['num_trainable_layers']}",
              f"--grad_accum_steps={p['grad_accum_steps']}", "--recompute" if p["recompute"] else "--norecompute",
              "--save_steps=0", "--keep_checkpoint_max=1", f"--iterations={max(1, args.train_steps // 10)}",
              f"--seed={args.seed}", f"--jit={args.jit}", "--do_train"]
    if args.init_checkpoint:
        common.append(f"--init_checkpoint={args.init_checkpoint}")
    if p["head"] == "deep":
        common.append(f"--head_hidden_sizes={args.deep_head}")
    if args.task == "squad":
        q = min(args.max_query_length, L // 2)
        cmd += common + [f"--train_file={data['train']}", f"--predict_file={data['eval']}",
                         "--version_2_with_negative", f"--max_query_length={q}", f"--doc_stride={max(1, L // 2)}",
                         "--do_predict"]
        if p["head"] == "deep" and args.deep_answer_class:
            cmd.append(f"--answer_class_hidden_sizes={args.deep_answer_class}")
    else:
        cmd += common + [f"--task={args.glue_task}", f"--data_dir={args.glue_dir}", "--do_eval"]
    return cmd + list(args.extra_flag or [])


def span_scores(res: Dict, out_dir: str, data: Dict) -> None:
    """SQuAD v2: adds HasAns_span_f1 / _exact (the answerable questions scored on the best non-null span; see
    tasks.squad_eval.span_scores) to ``res["eval"]`` when the run's output lacks them (runs made before
    run_squad.py reported them)."""
    ev = res.get("eval")
    path = os.path.join(out_dir, "non_null_predictions.json")
    if ev is None or "HasAns_span_f1" in ev or not data.get("eval") or not os.path.isfile(path):
        return
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from xlnet_tf.tasks.squad import metrics as squad_eval

    with open(path) as f:
        preds = json.load(f)
    with open(data["eval"], encoding="utf-8") as f:
        dataset = json.load(f)["data"]
    ev.update(squad_eval.span_scores(dataset, preds))


def run_point(args, p: Dict, data: Dict, log_dir: str) -> Dict:
    name = point_name(p)
    out_dir = os.path.join(args.work_dir, "runs", name)
    saved = os.path.join(out_dir, "tradeoff_point.json")
    cmd = command(args, p, out_dir, data)
    if args.resume and os.path.isfile(saved):
        with open(saved) as f:
            old = json.load(f)
        if old.get("command") == cmd[3:]:
            print(f"    reusing {saved}", flush=True)
            span_scores(old, out_dir, data)
            old["estimate"] = estimate_point(args, p)  # the current estimator
            return old
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    log_path = os.path.join(log_dir, f"{name}.log")
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    mem_path = os.path.join(out_dir, "allocator_peak.json")
    env["XLNET_TRADEOFF_MEM"] = mem_path
    load0 = os.getloadavg()[0]
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd[3:]) + "\n\n")
        log.flush()
        import subprocess

        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (peak RSS), not a running max
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    with open(log_path) as f:
        text = f.read()
    rates = RATE_RE.findall(text)
    res = {"point": p, "name": name, "command": cmd[3:], "returncode": proc.returncode, "wall_s": wall,
           "peak_rss_mib": usage.ru_maxrss / 1024.0, "load1_start": load0, "load1_end": os.getloadavg()[0],
           "log": os.path.relpath(log_path, ROOT)}
    if os.path.isfile(mem_path):
        with open(mem_path) as f:
            mem = json.load(f)
        res["allocator_device"], res["allocator_peak_mib"] = mem["device"], mem["peak"] / MiB
    if rates:
        step, total, loss, rate = rates[-1]
        rate = float(rate)
        res.update(steps_done=int(step), final_logged_loss=float(loss), steps_per_s=rate,
                   s_per_iter=1.0 / rate if rate > 0 else None,
                   examples_per_s=args.train_batch_size * rate)
    m = re.search(r"trained (\d+) steps in ([\d.]+)s", text)
    if m:
        res["train_seconds_incl_compile"] = float(m.group(2))
    eval_path = os.path.join(out_dir, "eval_results.json")
    if os.path.isfile(eval_path):
        with open(eval_path) as f:
            ev = json.load(f)
        res["eval"] = {k: v for k, v in ev.items() if not isinstance(v, (list, dict))}
        key = args.metric or ("best_f1" if args.task == "squad" else "accuracy")
        res["metric_name"], res["metric"] = key, ev.get(key)
        span_scores(res, out_dir, data)
    hist = os.path.join(out_dir, "model", "train_history.json")
    if os.path.isfile(hist):
        with open(hist) as f:
            h = json.load(f)
        res["first_loss"], res["last_loss"] = (h[0][1], h[-1][1]) if h else (None, None)
    res["estimate"] = estimate_point(args, p)
    if proc.returncode != 0:
        res["error"] = text.strip().splitlines()[-1][-300:] if text.strip() else "no output"
    with open(saved, "w") as f:
        json.dump(res, f, indent=1)
    if not args.keep_checkpoints:
        _drop_checkpoints(out_dir)
    return res


def _drop_checkpoints(out_dir: str) -> None:
    """Keeps train_history.json and the summaries, drops the checkpoint files (disk)."""
    model = os.path.join(out_dir, "model")
    if not os.path.isdir(model):
        return
    for fn in os.listdir(model):
        if fn.startswith("ckpt") or fn == "checkpoint":
            os.remove(os.path.join(model, fn))


def _has_gpu() -> bool:
    """Whether the runs will see an NVIDIA GPU (decides the estimator's CPU mode without importing TF here)."""
    return os.path.exists("/proc/driver/nvidia/version") and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != ""


def estimate_point(args, p: Dict) -> Dict:
    sys.path.insert(0, ROOT)
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.ram import cli_head, estimate

    cfg = XLNetConfig.load(args.model_config_path, recompute=p["recompute"])
    deep = p["head"] == "deep"
    ntl = p["num_trainable_layers"]
    head = cli_head("squad" if args.task == "squad" else "classification", cfg, num_labels=2,
                    hidden_sizes=sizes(args.deep_head) if deep else (),
                    answer_class_hidden_sizes=sizes(args.deep_answer_class) if deep and args.task == "squad" else ())
    e = estimate(cfg, p["seq_len"], args.train_batch_size, p["precision"], p["recompute"],
                 None if ntl < 0 else ntl, p["grad_accum_steps"], head=head,
                 jit=args.jit == "true" or (args.jit == "auto" and (_has_gpu() or p["precision"] == "mixed_float16")),
                 cpu=not _has_gpu())  # auto = the trainer's default_jit: whole-step XLA on GPU and for float16
    return {"total_mib": e["total"] / MiB, "persistent_mib": e["persistent"] / MiB,
            "step_peak_mib": e["step_peak"] / MiB, "activations_mib": e["activations"] / MiB}


# ====================================================================== outputs
def label(knob: str, v) -> str:
    if knob == "recompute":
        return "on" if v else "off"
    if knob == "num_trainable_layers" and v < 0:
        return "all"
    return str(v)


def write_csv(path: str, rows: List[Dict]) -> None:
    cols = ["knob", "value", "name", "seq_len", "num_trainable_layers", "head", "precision", "recompute",
            "grad_accum_steps", "metric_name", "metric", "f1", "exact", "best_f1", "HasAns_span_f1", "s_per_iter",
            "examples_per_s",
            "peak_rss_mib", "allocator_peak_mib", "estimate_mib", "estimate_step_peak_mib", "wall_s", "first_loss",
            "last_loss",
            "load1_start", "load1_end", "returncode"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            ev = r.get("eval", {})
            p = r["point"]
            w.writerow([r["knob"], label(r["knob"], r["value"]), r["name"], p["seq_len"], p["num_trainable_layers"],
                        p["head"], p["precision"], p["recompute"], p["grad_accum_steps"], r.get("metric_name"),
                        r.get("metric"), ev.get("f1"), ev.get("exact"), ev.get("best_f1"), ev.get("HasAns_span_f1"),
                        r.get("s_per_iter"),
                        r.get("examples_per_s"), round(r["peak_rss_mib"], 1),
                        None if r.get("allocator_peak_mib") is None else round(r["allocator_peak_mib"], 1),
                        round(r["estimate"]["total_mib"], 1),
                        round(r["estimate"]["step_peak_mib"], 1), round(r["wall_s"], 1), r.get("first_loss"),
                        r.get("last_loss"), r["load1_start"], r["load1_end"], r["returncode"]])


def plot(rows: List[Dict], knob: str, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r["knob"] == knob]
    xs = [label(knob, r["value"]) for r in pts]
    numeric = knob in ("seq_len", "grad_accum_steps") or (knob == "num_trainable_layers"
                                                          and all(r["value"] >= 0 for r in pts))
    xpos = [r["value"] for r in pts] if numeric else list(range(len(pts)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    metric_name = next((r.get("metric_name") for r in pts if r.get("metric_name")), "metric")
    panels = [(axes[0], [r.get("metric") for r in pts], metric_name, "tab:blue"),
              (axes[1], [r.get("s_per_iter") for r in pts], "seconds / iteration", "tab:red")]
    for ax, ys, name, color in panels:
        ok = [(x, y) for x, y in zip(xpos, ys) if y is not None]
        if ok:
            ax.plot([x for x, _ in ok], [y for _, y in ok], "o-", color=color)
            lo, hi = min(y for _, y in ok), max(y for _, y in ok)
            if ax is axes[0] and hi - lo < 1.0:  # a flat metric: do not blow up noise to full height
                ax.set_ylim((lo + hi) / 2 - 1.0, (lo + hi) / 2 + 1.0)
        ax.set_ylabel(name)
    span = [(x, r.get("eval", {}).get("HasAns_span_f1")) for x, r in zip(xpos, pts)]
    span = [(x, y) for x, y in span if y is not None]
    if span:
        twin = axes[0].twinx()
        twin.plot([x for x, _ in span], [y for _, y in span], "d:", color="tab:orange")
        twin.set_ylabel("HasAns span F1 (no threshold)", color="tab:orange")
    ax = axes[2]
    ax.plot(xpos, [r["peak_rss_mib"] for r in pts], "o-", color="tab:green", label="peak RSS (measured)")
    alloc = [(x, r["allocator_peak_mib"]) for x, r in zip(xpos, pts) if r.get("allocator_peak_mib")]
    if alloc:
        ax.plot([x for x, _ in alloc], [y for _, y in alloc], "^-", color="tab:purple",
                label="allocator peak, whole run (measured)")
    ax.plot(xpos, [r["estimate"]["total_mib"] for r in pts], "s--", color="tab:gray",
            label="training step (xlnet_tf.ram)")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel(knob)
        if not numeric:
            ax.set_xticks(xpos)
            ax.set_xticklabels(xs)
        elif knob != "seq_len":
            ax.set_xticks(xpos)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(rows: List[Dict]) -> None:
    hdr = (f"{'knob':<22}{'value':>9}{'metric':>9}{'spanF1':>8}{'s/iter':>9}{'ex/s':>8}{'RSS MiB':>9}{'alloc MiB':>10}"
           f"{'est MiB':>9}{'loss':>16}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        fmt = lambda v, f: ("-" if v is None else format(v, f))  # noqa: E731
        loss = (f"{r['first_loss']:.2f}->{r['last_loss']:.2f}" if r.get("first_loss") is not None else "-")
        print(f"{r['knob']:<22}{label(r['knob'], r['value']):>9}{fmt(r.get('metric'), '.2f'):>9}"
              f"{fmt(r.get('eval', {}).get('HasAns_span_f1'), '.2f'):>8}"
              f"{fmt(r.get('s_per_iter'), '.3f'):>9}{fmt(r.get('examples_per_s'), '.1f'):>8}"
              f"{r['peak_rss_mib']:>9.0f}{fmt(r.get('allocator_peak_mib'), '.0f'):>10}"
              f"{r['estimate']['total_mib']:>9.0f}{loss:>16}"
              + ("" if r["returncode"] == 0 else f"  FAILED: {r.get('error', '')[:60]}"))


# ====================================================================== main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="squad", choices=["squad", "classification"])
    p.add_argument("--quick", action="store_true", help="tiny model, 2 knobs x 2 values, few steps (~10 min)")
    p.add_argument("--knobs", default="seq_len,num_trainable_layers,head,precision,recompute",
                   help=f"comma list of {','.join(KNOBS)}")
    p.add_argument("--seq_len", type=int, default=192, help="baseline sequence length")
    p.add_argument("--seq_len_values", default="64,128,192,256")
    p.add_argument("--num_trainable_layers", type=int, default=-1, help="baseline (-1: all)")
    p.add_argument("--num_trainable_layers_values", default="1,2,-1")
    p.add_argument("--precision_values", default="float32,mixed_bfloat16,mixed_float16")
    p.add_argument("--grad_accum_values", default="1,2,4")
    p.add_argument("--deep_head", default="512,384", help="--head_hidden_sizes of the 'deep' head")
    p.add_argument("--deep_answer_class", default="256", help="SQuAD: --answer_class_hidden_sizes of 'deep'")
    p.add_argument("--model_config_path", default="small", help="preset or json (the study: base + a checkpoint)")
    p.add_argument("--init_checkpoint", default=None)
    p.add_argument("--spiece_model_file", default=os.path.join(SHARED, "spiece", "spiece.model"))
    p.add_argument("--squad_file", default=os.path.join(SHARED, "squad", "dev-v2.0.json"))
    p.add_argument("--glue_task", default="sst-2")
    p.add_argument("--glue_dir", default=os.path.join(SHARED, "glue", "SST-2"))
    p.add_argument("--max_query_length", type=int, default=48)
    p.add_argument("--train_batch_size", type=int, default=16)
    p.add_argument("--eval_batch_size", type=int, default=32)
    p.add_argument("--train_steps", type=int, default=200)
    p.add_argument("--warmup_steps", type=int, default=20)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--jit", default=None, choices=["auto", "true", "update", "false"],
                   help="XLA in the runs (default auto = the trainer's default; --quick: false, as XLA's compile "
                        "of even a tiny step takes minutes on a loaded 2-core CPU)")
    p.add_argument("--metric", default=None, help="eval_results.json key (default best_f1 / accuracy)")
    p.add_argument("--max_train_articles", type=int, default=None)
    p.add_argument("--max_eval_articles", type=int, default=None)
    p.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "xlnet_tradeoff"),
                   help="data splits, feature cache and the runs' output dirs")
    p.add_argument("--resume", action="store_true", help="reuse a point whose command is unchanged")
    p.add_argument("--keep_checkpoints", action="store_true")
    p.add_argument("--extra_flag", action="append", help="passed to every run (repeatable)")
    p.add_argument("--out_prefix", default=None, help="default benchmarks/results/tradeoff_<task>[_quick]")
    args = p.parse_args(argv)

    knobs = [k for k in args.knobs.split(",") if k]
    if args.quick:
        args.model_config_path = "tiny" if args.model_config_path == p.get_default("model_config_path") \
            else args.model_config_path
        args.train_steps, args.warmup_steps, args.train_batch_size = 30, 3, 8
        args.seq_len, args.seq_len_values = 96, "64,96"
        args.num_trainable_layers_values = "1,-1"
        if args.knobs == p.get_default("knobs"):
            knobs = ["seq_len", "num_trainable_layers"]
        args.max_train_articles = args.max_train_articles or 4
        args.max_eval_articles = args.max_eval_articles or 1
        args.jit = args.jit or "false"
    args.jit = args.jit or "auto"
    for k in knobs:
        if k not in KNOBS:
            p.error(f"unknown knob {k!r}; expected {KNOBS}")
    if not os.path.isfile(args.spiece_model_file):
        p.error(f"--spiece_model_file not found: {args.spiece_model_file}")
    os.makedirs(args.work_dir, exist_ok=True)
    prefix = args.out_prefix or os.path.join(HERE, "results", f"tradeoff_{args.task}{'_quick' if args.quick else ''}")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    log_dir = prefix + "_logs"
    os.makedirs(log_dir, exist_ok=True)

    data: Dict = {}
    if args.task == "squad":
        if not os.path.isfile(args.squad_file):
            p.error(f"--squad_file not found: {args.squad_file}")
        data = split_squad(args.squad_file, os.path.join(args.work_dir, "data"),
                           max_train_articles=args.max_train_articles, max_eval_articles=args.max_eval_articles)
        print(f"SQuAD split: {data['train_questions']} training questions ({len(data['train_articles'])} articles),"
              f" {data['eval_questions']} evaluation questions ({len(data['eval_articles'])} articles)")
    elif not os.path.isdir(args.glue_dir):
        p.error(f"--glue_dir not found: {args.glue_dir}")

    base = baseline(args)
    plan = []  # (knob, value, point)
    for k in knobs:
        for v in knob_values(args, k):
            plan.append((k, v, dict(base, **{k: v})))
    unique = {}
    for _, _, pt in plan:
        unique.setdefault(point_name(pt), pt)
    print(f"{len(plan)} points over {len(knobs)} knob(s), {len(unique)} distinct runs; baseline {base}; "
          f"model {args.model_config_path}, {args.train_steps} steps x {args.train_batch_size}; load "
          f"{os.getloadavg()}", flush=True)
    t_start = time.time()
    done: Dict[str, Dict] = {}
    for i, (name, pt) in enumerate(unique.items()):
        print(f"[{i + 1}/{len(unique)}] {name} (load {os.getloadavg()[0]:.1f})", flush=True)
        r = run_point(args, pt, data, log_dir)
        done[name] = r
        print(f"    rc={r['returncode']} {r.get('metric_name')}={r.get('metric')} s/iter={r.get('s_per_iter')} "
              f"peak RSS {r['peak_rss_mib']:.0f} MiB (tensors est. {r['estimate']['total_mib']:.0f}) "
              f"wall {r['wall_s']:.0f}s", flush=True)
    rows = [dict(done[point_name(pt)], knob=k, value=v) for k, v, pt in plan]
    print()
    print_table(rows)
    init = " + " + os.path.basename(args.init_checkpoint) if args.init_checkpoint else " (random init)"
    title_base = (f"{args.task} · {args.model_config_path}{init}"
                  f" · {args.train_steps} steps x {args.train_batch_size}")
    figures = []
    for k in knobs:
        path = f"{prefix}_{k}.png"
        plot(rows, k, path, f"{title_base} · knob: {k} (others at baseline)")
        figures.append(os.path.relpath(path, ROOT))
    write_csv(prefix + ".csv", rows)
    result = {"command": " ".join([os.path.relpath(sys.executable, ROOT), "benchmarks/tradeoff.py"]
                                  + (sys.argv[1:] if argv is None else list(argv))),
              "settings": {k: v for k, v in vars(args).items()}, "knobs": knobs, "baseline": base,
              "data": {k: v for k, v in data.items()}, "started": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                 time.localtime(t_start)),
              "wall_s": time.time() - t_start, "load_end": os.getloadavg(), "figures": figures, "rows": rows}
    with open(prefix + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {prefix}.csv, {prefix}.json and {len(figures)} figure(s) ({time.time() - t_start:.0f} s)")
    failed = [r["name"] for r in done.values() if r["returncode"] != 0]
    if failed:
        print(f"FAILED runs: {failed} (logs in {os.path.relpath(log_dir, ROOT)})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
