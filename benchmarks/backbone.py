#!/usr/bin/env python
"""Backbone speed: our XLNet (TF 2 / Keras 3, with and without XLA) vs HuggingFace's PyTorch XLNetModel.

Both sides get the XLNet-Base shape (12 layers, d_model 768, 12 heads x 64, d_inner 3072, vocab 32000, tanh
GELU), random weights and the same inputs (token ids, two segments, an all-ones padding mask).

* inference: dropout off (ours: ``training=False``; HF: ``eval()`` + ``torch.no_grad()``);
* training: one forward + backward + Adam step on every weight the forward uses, loss = mean(sequence_output²),
  dropout 0.1 on both sides (``--train-dropout``).

Implementations: ``tf`` ours in a ``tf.function`` (oneDNN kernels); ``tf_xla`` the same with
``jit_compile=True``; ``tf_xopt`` (training only) forward + backward in a ``tf.function`` and the Adam update
in a separate XLA-compiled function; ``torch`` HF PyTorch eager with 2 threads; ``torch1`` the same with
1 thread (on a loaded machine two OpenMP threads can be much slower than one; the goals are checked against
the faster of the two).

Every configuration (implementation x mode x shape) runs in its OWN worker subprocess, so the peak RSS
(``ru_maxrss``) is attributable to it. The workers of one (mode, shape) group live side by side: after their
warm-up the driver asks them for one timed repetition each, in turn, N times (rotating who goes first), so
machine noise hits all implementations alike; medians are reported. Idle workers block on a pipe (no CPU).

    python benchmarks/backbone.py                 # full table -> benchmarks/results/backbone.json
    python benchmarks/backbone.py --quick         # one small configuration, < 2 minutes
    python benchmarks/backbone.py --reps 7 --modes infer --shapes 8x128
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, n_token=32000)
IMPLS = {"tf": "ours, tf.function", "tf_xopt": "ours, tf.function, XLA Adam", "tf_xla": "ours, tf.function + XLA",
         "torch": "HF PyTorch eager", "torch1": "HF PyTorch eager, 1 thread"}
PROTO = "@@"  # prefix of protocol lines on a worker's stdout
# Peers measured earlier on a 2-core AMD EPYC (Zen 3) machine, XLNet-Base shape, medians (tokens/s).
QUOTED_PEERS = {("infer", 8, 128): {"model_garden_tf2_xla": 363, "hf_pytorch": 303},
                ("train", 8, 128): {"model_garden_tf2_xla": 85, "hf_pytorch": 78},
                ("infer", 1, 512): {"hf_pytorch": 255}}
GOALS = {"infer": 1.3, "train": 1.5}  # wanted: ours >= GOAL x the best peer


# ====================================================================== worker side
def _rss_mb(field="VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _inputs(batch, seq, n_token, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(10, n_token, (batch, seq)).astype(np.int64)
    seg = (np.arange(seq)[None, :] >= seq // 2).astype(np.int64).repeat(batch, 0)  # A | B
    mask = np.ones((batch, seq), np.int64)
    return ids, seg, mask


def _build_tf(spec):
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    sys.path.insert(0, ROOT)
    import xlnet_tf  # noqa: F401  (sets the oneDNN/log environment before TensorFlow loads)
    import keras
    import tensorflow as tf
    from xlnet_tf import XLNetConfig
    from xlnet_tf.modeling import XLNetModel

    train = spec["mode"] == "train"
    rate = spec["dropout"] if train else 0.0
    cfg = XLNetConfig(**spec["shape"], ff_activation="gelu", untie_r=True, dropout=rate, dropatt=rate)
    keras.utils.set_random_seed(0)
    model = XLNetModel(cfg, seed=0)
    ids, seg, mask = (tf.constant(x, tf.int32) for x in _inputs(spec["batch"], spec["seq"], cfg.n_token))
    xla = spec["impl"] == "tf_xla"

    if not train:
        @tf.function(jit_compile=xla)
        def fwd(ids, seg, mask):
            return model(ids, segment_ids=seg, padding_mask=mask, training=False)["sequence_output"]

        return lambda: fwd(ids, seg, mask).numpy()

    # Every weight the forward uses (mask_emb and lm_bias only serve the query stream / LM head).
    unused = {id(model.mask_emb), id(model.lm_bias)}
    tvars = [v for v in model.trainable_variables if id(v) not in unused]
    opt = keras.optimizers.Adam(learning_rate=1e-5)
    opt.build(tvars)

    def loss_and_grads(ids, seg, mask):
        with tf.GradientTape() as tape:
            h = model(ids, segment_ids=seg, padding_mask=mask, training=True)["sequence_output"]
            loss = tf.reduce_mean(tf.square(h))
        return loss, tape.gradient(loss, tvars)

    if spec["impl"] == "tf_xopt":
        # Forward + backward as a plain graph (oneDNN kernels), the Adam update as a separate XLA cluster
        # (XLA fuses Adam's per-weight elementwise chain; its CPU matmuls are slower than oneDNN's).
        grads_fn = tf.function(loss_and_grads)

        @tf.function(jit_compile=True)
        def apply_fn(grads):
            opt.apply_gradients(zip(grads, tvars))

        def run():
            loss, grads = grads_fn(ids, seg, mask)
            apply_fn(grads)
            return loss.numpy()

        return run

    @tf.function(jit_compile=xla)
    def step(ids, seg, mask):
        loss, grads = loss_and_grads(ids, seg, mask)
        opt.apply_gradients(zip(grads, tvars))
        return loss

    return lambda: step(ids, seg, mask).numpy()


def _build_torch(spec):
    os.environ["USE_TF"] = "0"  # keep TensorFlow out of the PyTorch worker
    os.environ["USE_TORCH"] = "1"
    import torch

    torch.set_num_threads(1 if spec["impl"] == "torch1" else spec["threads"])
    import transformers

    train = spec["mode"] == "train"
    s = spec["shape"]
    cfg = transformers.XLNetConfig(vocab_size=s["n_token"], d_model=s["d_model"], n_layer=s["n_layer"],
                                   n_head=s["n_head"], d_inner=s["d_inner"], ff_activation="gelu_new",
                                   untie_r=True, dropout=spec["dropout"] if train else 0.0,
                                   layer_norm_eps=1e-12, mem_len=None, use_mems_eval=False,
                                   use_mems_train=False)
    torch.manual_seed(0)
    model = transformers.XLNetModel(cfg)
    ids, seg, mask = (torch.from_numpy(x) for x in _inputs(spec["batch"], spec["seq"], s["n_token"]))
    kw = dict(input_ids=ids, token_type_ids=seg, attention_mask=mask, use_mems=False)
    if not train:
        model.eval()

        def fwd():
            with torch.no_grad():
                return model(**kw).last_hidden_state

        return fwd

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        h = model(**kw).last_hidden_state
        loss = (h * h).mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    t0 = time.perf_counter()
    run = _build_torch(spec) if spec["impl"].startswith("torch") else _build_tf(spec)
    build_s = time.perf_counter() - t0
    rss_built = _rss_mb()
    warm = []
    for _ in range(spec["warmup"]):
        t = time.perf_counter()
        run()
        warm.append(time.perf_counter() - t)
    out = sys.stdout
    print(f"{PROTO}READY " + json.dumps({"build_s": build_s, "warmup_s": warm, "rss_built_mb": rss_built}),
          file=out, flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "run":
            t, c = time.perf_counter(), time.process_time()
            run()
            print(f"{PROTO}TIME {time.perf_counter() - t!r} {time.process_time() - c!r}", file=out, flush=True)
        elif cmd == "stop":
            break
    info = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "rss_end_mb": _rss_mb()}
    if not spec["impl"].startswith("torch"):
        from tensorflow.python.util import _pywrap_util_port

        info["onednn"] = bool(_pywrap_util_port.IsMklEnabled())
    print(f"{PROTO}DONE " + json.dumps(info), file=out, flush=True)


# ====================================================================== driver side
class Worker:
    def __init__(self, spec, log):
        self.spec = spec
        env = dict(os.environ)
        env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     bufsize=1, env=env, cwd=ROOT)

    def expect(self, tag):
        for line in self.proc.stdout:
            if line.startswith(PROTO + tag + " "):
                return line[len(PROTO) + len(tag) + 1:].strip()
        raise RuntimeError(f"worker {self.spec['impl']} {self.spec['mode']} {self.spec['batch']}x"
                           f"{self.spec['seq']} exited (rc={self.proc.wait()}); see the worker log")

    def send(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()


def machine_info():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    from importlib import metadata

    vers = {}
    for dist in ("tensorflow", "keras", "torch", "transformers", "numpy"):
        try:
            vers[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            vers[dist] = None
    try:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "xlnet_tf"], capture_output=True, text=True,
                               cwd=ROOT).stdout.split("\n")
    except OSError:
        git, dirty = "?", []
    return {"git_head": git, "xlnet_tf_uncommitted": [d.strip() for d in dirty if d.strip()],
            "nproc": os.cpu_count(), "cpu_model": cpu,
            "cpu_simd": [f for f in flags if f.startswith(("avx", "amx", "fma"))],
            "python": platform.python_version(), "versions": vers,
            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (set by xlnet_tf)"),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}


def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def run_group(mode, batch, seq, impls, args, log):
    specs = [dict(impl=i, mode=mode, batch=batch, seq=seq, shape=args.shape, dropout=args.train_dropout,
                  warmup=args.warmup, threads=args.torch_threads) for i in impls]
    workers, ready, skipped = [], [], []
    try:
        for spec in list(specs):  # warm up one at a time (XLA compile times stay clean)
            # The workers of a group stay alive side by side: do not start one without room for it (the machine
            # is shared), rather leave that configuration out and say so.
            if mem_available_mb() < args.min_free_mb:
                print(f"    skipping {spec['impl']}: only {mem_available_mb():.0f} MB available "
                      f"(--min-free-mb {args.min_free_mb})", flush=True)
                specs.remove(spec)
                skipped.append({"mode": mode, "batch": batch, "seq": seq, "impl": spec["impl"],
                                "reason": f"MemAvailable < {args.min_free_mb} MB"})
                continue
            w = Worker(spec, log)
            workers.append(w)
            ready.append(json.loads(w.expect("READY")))
        times = [[] for _ in workers]
        cpu = [[] for _ in workers]
        load = [os.getloadavg()[0]]
        for r in range(args.reps):
            for k in range(len(workers)):
                idx = (r + k) % len(workers)
                workers[idx].send("run")
                wall, proc = workers[idx].expect("TIME").split()
                times[idx].append(float(wall))
                cpu[idx].append(float(proc))
            load.append(os.getloadavg()[0])
        done = []
        for w in workers:
            w.send("stop")
            done.append(json.loads(w.expect("DONE")))
            w.proc.wait()
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
    rows = []
    for spec, rd, t, ct, dn in zip(specs, ready, times, cpu, done):
        med = statistics.median(t)
        rows.append({"mode": mode, "batch": batch, "seq": seq, "impl": spec["impl"], "label": IMPLS[spec["impl"]],
                     "tokens_per_s": batch * seq / med, "median_s": med, "times_s": t,
                     "tokens_per_s_min": batch * seq / max(t), "tokens_per_s_max": batch * seq / min(t),
                     "cpu_s_median": statistics.median(ct), "cpu_s": ct,
                     "first_call_s": rd["warmup_s"][0] if rd["warmup_s"] else None, "build_s": rd["build_s"],
                     "rss_built_mb": rd["rss_built_mb"], **dn, "load1_during": load})
    return rows, skipped


def print_table(rows):
    hdr = (f"{'mode':<6}{'shape':>8}  {'implementation':<29}{'tok/s':>8}{'min..max':>15}{'s/step':>8}"
           f"{'vs HF':>7}{'cpu-s':>7}{'1st call':>9}{'peak RSS':>10}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        hfs = [x for x in rows if x["mode"] == r["mode"] and x["batch"] == r["batch"] and x["seq"] == r["seq"]
               and x["impl"].startswith("torch")]
        hf = max(hfs, key=lambda x: x["tokens_per_s"]) if hfs else None
        ratio = f"{r['tokens_per_s'] / hf['tokens_per_s']:.2f}x" if hf else "-"
        print(f"{r['mode']:<6}{str(r['batch']) + 'x' + str(r['seq']):>8}  {r['label']:<29}"
              f"{r['tokens_per_s']:>8.0f}{r['tokens_per_s_min']:>7.0f}..{r['tokens_per_s_max']:<6.0f}"
              f"{r['median_s']:>8.2f}{ratio:>7}{r['cpu_s_median']:>7.2f}{r['first_call_s']:>8.1f}s"
              f"{r['peak_rss_mb']:>8.0f}MB")
    print("tok/s: batch*seq / median wall time of one step; min..max over the timed repetitions; vs HF: ratio "
          "of medians in the same run, against the faster HF thread setting; cpu-s: median process CPU seconds per step (less sensitive to other "
          "load); 1st call: includes tracing/XLA compilation; peak RSS: ru_maxrss of the configuration's own "
          "process.")


def goal_summary(rows):
    """Ours (best variant) against the peers, two ways: (a) absolute tokens/s against the quoted figures
    (measured on another machine: indicative only); (b) in this run, against HF measured side by side,
    scaled by the quoted Model Garden / HF ratio where Model Garden was quoted (the best peer's estimate)."""
    out = []
    for key in sorted({(r["mode"], r["batch"], r["seq"]) for r in rows}):
        mode, b, s = key
        group = [r for r in rows if (r["mode"], r["batch"], r["seq"]) == key]
        hfs = [r for r in group if r["impl"].startswith("torch")]
        hf = max(hfs, key=lambda r: r["tokens_per_s"]) if hfs else None  # the faster HF thread setting
        ours = [r for r in group if not r["impl"].startswith("torch")]
        if not ours:
            continue
        best = max(ours, key=lambda r: r["tokens_per_s"])
        quoted = QUOTED_PEERS.get(key, {})
        entry = {"mode": mode, "batch": b, "seq": s, "best_ours": best["impl"], "ours_tokens_per_s": best["tokens_per_s"],
                 "goal_factor": GOALS[mode]}
        if hf:
            scale = max(quoted.values()) / quoted["hf_pytorch"] if quoted else 1.0
            entry.update(hf_impl=hf["impl"], hf_tokens_per_s=hf["tokens_per_s"], ratio_vs_hf_same_run=best["tokens_per_s"] / hf["tokens_per_s"],
                         best_peer_estimate_same_run=hf["tokens_per_s"] * scale, best_peer_scale_from_quotes=scale)
            entry["ratio_vs_best_peer_same_run"] = best["tokens_per_s"] / entry["best_peer_estimate_same_run"]
            entry["goal_met_same_run"] = entry["ratio_vs_best_peer_same_run"] >= GOALS[mode]
        if quoted:
            entry.update(quoted_best_peer=max(quoted.values()),
                         ratio_vs_quoted_best_peer=best["tokens_per_s"] / max(quoted.values()))
            entry["goal_met_vs_quoted"] = entry["ratio_vs_quoted_best_peer"] >= GOALS[mode]
        out.append(entry)
    return out


def print_goals(goals):
    print("\ngoals (ours best variant / best peer; wanted >= 1.3x inference, 1.5x training):")
    for g in goals:
        line = f"  {g['mode']:<6}{g['batch']}x{g['seq']:<5} {g['best_ours']:<9}{g['ours_tokens_per_s']:>7.0f} tok/s"
        if "ratio_vs_hf_same_run" in g:
            line += (f" | same run: {g['ratio_vs_hf_same_run']:.2f}x HF ({g['hf_impl']}), {g['ratio_vs_best_peer_same_run']:.2f}x "
                     f"best-peer estimate (HF x {g['best_peer_scale_from_quotes']:.2f}) -> "
                     f"{'met' if g['goal_met_same_run'] else 'NOT met'}")
        if "ratio_vs_quoted_best_peer" in g:
            line += (f" | vs quoted {g['quoted_best_peer']}: {g['ratio_vs_quoted_best_peer']:.2f}x -> "
                     f"{'met' if g['goal_met_vs_quoted'] else 'NOT met'} (other machine)")
        print(line)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="one small configuration (inference 1x128), < 2 min")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per configuration (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per worker first (incl. compilation)")
    p.add_argument("--modes", default="infer,train", help="comma list of infer,train")
    p.add_argument("--infer-shapes", default="8x128,2x512,1x512", help="batch x seq list for inference")
    p.add_argument("--train-shapes", default="8x128,2x512", help="batch x seq list for training")
    p.add_argument("--shapes", help="override both shape lists")
    p.add_argument("--impls", default="tf,tf_xla,torch,torch1", help=f"inference: comma list of {','.join(IMPLS)}")
    p.add_argument("--train-impls", default="tf,tf_xopt,tf_xla,torch,torch1", help="training: comma list, as --impls")
    p.add_argument("--train-dropout", type=float, default=0.1, help="dropout (and dropatt) in the training step")
    p.add_argument("--torch-threads", type=int, default=2, help="threads of the 'torch' worker ('torch1': 1)")
    p.add_argument("--n-layer", type=int, default=BASE["n_layer"])
    p.add_argument("--min-free-mb", type=int, default=7000,
                   help="start a worker only with this much MemAvailable (workers of a group run side by side)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "backbone.json"))
    p.add_argument("--log", default=os.path.join(HERE, "results", "backbone_workers.log"))
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)

    args.shape = dict(BASE, n_layer=args.n_layer)
    parse = lambda s: [tuple(int(v) for v in x.split("x")) for x in s.split(",") if x]  # noqa: E731
    groups = []
    if args.quick:
        args.reps, args.warmup = min(args.reps, 3), 1
        groups = [("infer", 1, 128)]
        args.impls = "tf,tf_xla,torch,torch1"
        if args.out == p.get_default("out"):
            args.out = os.path.join(HERE, "results", "backbone_quick.json")
    else:
        modes = args.modes.split(",")
        ishapes = parse(args.shapes or args.infer_shapes)
        tshapes = parse(args.shapes or args.train_shapes)
        groups = [("infer", b, s) for b, s in ishapes if "infer" in modes]
        groups += [("train", b, s) for b, s in tshapes if "train" in modes]

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    info = machine_info()
    print(f"machine: {info['nproc']} cpu(s), {info['cpu_model']}; TF {info['versions'].get('tensorflow')}, "
          f"torch {info['versions'].get('torch')}, transformers {info['versions'].get('transformers')}; "
          f"TF_ENABLE_ONEDNN_OPTS={info['TF_ENABLE_ONEDNN_OPTS']}; load {os.getloadavg()}", flush=True)
    t_start = time.time()
    rows, skipped = [], []
    with open(args.log, "w") as log:
        for mode, b, s in groups:
            impls = [i for i in (args.impls if mode == "infer" else args.train_impls).split(",")
                     if i != "tf_xopt" or mode == "train"]
            print(f"... {mode} {b}x{s}: {', '.join(impls)} ({args.reps} interleaved reps)", flush=True)
            r, sk = run_group(mode, b, s, impls, args, log)
            rows += r
            skipped += sk
    print()
    print_table(rows)
    goals = goal_summary(rows)
    print_goals(goals)
    result = {"command": " ".join([os.path.relpath(sys.executable, ROOT), "benchmarks/backbone.py"] +
                                  (sys.argv[1:] if argv is None else list(argv))),
              "machine": info, "model_shape": args.shape, "reps": args.reps, "warmup": args.warmup,
              "train_dropout": args.train_dropout, "torch_threads": args.torch_threads,
              "loss": "mean(sequence_output**2); Adam lr 1e-5 on every weight the forward uses",
              "inputs": "random ids, two segments (A|B halves), all-ones padding mask",
              "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
              "wall_s": time.time() - t_start, "load_end": os.getloadavg(), "rows": rows, "skipped": skipped,
              "quoted_peers": {f"{m} {b}x{s}": v for (m, b, s), v in QUOTED_PEERS.items()}, "goals": goals}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
