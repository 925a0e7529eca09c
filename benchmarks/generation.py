"""Greedy generation speed: ours (``xlnet_tf/generation.py``) vs HuggingFace's ``XLNetLMHeadModel.generate``, side by
side in one run on the same CPU and the same weights, each side in a worker process of its own.

    python benchmarks/generation.py            # XLNet-Base shape (8 to 30 min on 2 quiet cores, by CPU)
    python benchmarks/generation.py --quick    # a smoke run: a tiny model, 4 new tokens (~1 min)

Weights: random, made by HF (``XLNetLMHeadModel(config)``, XLNet-Base's shape: 12 layers x 768, 12 heads, d_inner
3072, 32,000 tokens; ``mem_len=None`` as the released configs), saved once and read by every worker (ours through
``XLNetModel.from_pretrained``). Prompts: random ids of 32 and 256 pieces, batch 1 and 8, 64 new tokens, greedy, no
early stop (``eos`` off on both sides). Workers: ours (TensorFlow's default threads, oneDNN) and one HF worker per
``--torch_threads`` entry, each a process of its own, so that PyTorch's OpenMP threads, which spin after each op,
never run beside TensorFlow's. Each case: one warm-up call per worker (our trace), then ``--reps`` rounds of one
call per worker, the order alternating between rounds; new tokens/s = batch x new tokens / median seconds; HF's
figure is its fastest worker (the peer). The ids of every side are compared (``same_ids``). ``--also DIR,...``
adds one of our workers per other checkout of this project (``git worktree add /tmp/before COMMIT``), each
importing its own ``xlnet_tf``: a before/after of ours, interleaved with the rest (``--torch_threads ''``: no HF).

Prints a table and writes benchmarks/results/generation.json (``--quick``: generation_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import PROTO, Worker, cpu_model, versions, write_json  # noqa: E402

BASE = dict(d_model=768, n_layer=12, n_head=12, d_inner=3072)
TINY = dict(d_model=64, n_layer=2, n_head=2, d_inner=128)


def make_weights(shape, directory):
    """HF's random XLNetLMHeadModel of ``shape``, saved to ``directory`` (in a process of its own: the driver
    imports neither framework)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=32000, ff_activation="gelu_new", untie_r=True, dropout=0.0,
                                   mem_len=None, **shape)
    transformers.XLNetLMHeadModel(cfg).save_pretrained(directory)


def prompt_ids(plen, bsz):
    import numpy as np

    return np.random.default_rng(plen * 1000 + bsz).integers(10, 32000, (bsz, plen)).astype(np.int32)


def worker(spec_json):
    """One side: reads ``run PROMPT BATCH`` lines, answers ``@@RAN {seconds, ids}``."""
    spec = json.loads(spec_json)
    if spec["side"] == "make_weights":
        make_weights(spec["shape"], spec["dir"])
        print(f"{PROTO}READY {{}}", flush=True)
        return
    new = spec["new_tokens"]
    if spec["side"] == "ours":
        if spec.get("root"):  # another checkout's library (--also)
            sys.path.insert(0, spec["root"])
        from xlnet_tf import XLNetModel
        from xlnet_tf.generation import GenerationOptions, Generator

        gen = Generator(XLNetModel.from_pretrained(spec["dir"], dropout=0.0, dropatt=0.0))
        options = GenerationOptions(max_new_tokens=new, eos_id=None)

        def generate(ids):
            return gen(ids, None, options)
    else:
        import torch
        import transformers

        torch.set_num_threads(spec["threads"])
        hf = transformers.XLNetLMHeadModel.from_pretrained(spec["dir"]).eval()
        hf.generation_config.eos_token_id = None  # every row runs to max_new_tokens, as ours with eos_id=None
        hf.generation_config.pad_token_id = 5

        def generate(ids):
            with torch.no_grad():
                out = hf.generate(torch.from_numpy(ids.astype("int64")), max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False)
            return out[:, ids.shape[1]:].numpy()
    print(f"{PROTO}READY {{}}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "stop":
            break
        ids = prompt_ids(int(cmd[1]), int(cmd[2]))
        t = time.perf_counter()
        out = generate(ids)
        sec = time.perf_counter() - t
        print(f"{PROTO}RAN " + json.dumps({"seconds": sec, "ids": [[int(x) for x in r] for r in out]}), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{PROTO}DONE " + json.dumps({"peak_rss_mb": rss}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 4 new tokens, short prompts")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per worker and case (default 3, quick 2)")
    ap.add_argument("--torch_threads", default="default,1",
                    help="PyTorch intra-op thread counts, one HF worker each ('default' = its own); the fastest "
                         "is the peer")
    ap.add_argument("--also", default="", help="other checkouts of this project, comma-separated: one more of our "
                    "workers each (a before/after)")
    ap.add_argument("--out", default=None, help="results file name under benchmarks/results")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    shape = TINY if args.quick else BASE
    lengths, batches = ((8, 32), (1, 2)) if args.quick else ((32, 256), (1, 8))
    new_tokens = 4 if args.quick else 64
    reps = args.reps or (2 if args.quick else 3)
    threads = [t.strip() for t in args.torch_threads.split(",") if t.strip()]
    also = [os.path.abspath(d) for d in args.also.split(",") if d]
    log_path = os.path.join(tempfile.gettempdir(), "generation_workers.log")
    rows = []
    with tempfile.TemporaryDirectory() as d, open(log_path, "w") as log:
        Worker(__file__, dict(side="make_weights", shape=shape, dir=d), log, "make_weights").expect("READY")
        workers = [Worker(__file__, dict(side="ours", dir=d, new_tokens=new_tokens), log, "ours")]
        workers += [Worker(__file__, dict(side="ours", dir=d, new_tokens=new_tokens, root=r), log, f"ours@{r}")
                    for r in also]
        for t in threads:
            n = os.cpu_count() if t == "default" else int(t)  # torch's default intra-op threads: the cores
            workers.append(Worker(__file__, dict(side="hf", dir=d, new_tokens=new_tokens, threads=n), log,
                                  f"hf_t{n}"))
        for w in workers:
            w.expect("READY")
        for plen in lengths:
            for bsz in batches:
                first = {w.label: json.loads(w.ask(f"run {plen} {bsz}", "RAN"))["ids"] for w in workers}
                same = all(v == first["ours"] for v in first.values())
                times = {w.label: [] for w in workers}
                for r in range(reps):
                    for w in (workers if r % 2 == 0 else workers[::-1]):
                        times[w.label].append(json.loads(w.ask(f"run {plen} {bsz}", "RAN"))["seconds"])
                med = {k: statistics.median(v) for k, v in times.items()}
                tok_s = {k: bsz * new_tokens / v for k, v in med.items()}
                row = {"prompt": plen, "batch": bsz, "new_tokens": new_tokens, "same_ids": same,
                       "ours_s": med["ours"], "ours_tok_s": tok_s["ours"], "tok_s": tok_s, "medians_s": med,
                       "times": times, "loadavg": os.getloadavg()[0]}
                peers = [k for k in med if k.startswith("hf_")]
                if peers:
                    peer = min(peers, key=med.get)
                    row.update(hf_peer=peer, hf_s=med[peer], hf_tok_s=tok_s[peer], speedup=med[peer] / med["ours"])
                rows.append(row)
                print(f"prompt {plen:4d} batch {bsz}: " + "  ".join(f"{k} {v:.1f} tok/s" for k, v in tok_s.items())
                      + (f"  ours/HF x{row['speedup']:.2f}" if peers else "") + f"  same ids: {same}", flush=True)
        rss = {w.label: json.loads(w.ask("stop", "DONE"))["peak_rss_mb"] for w in workers}
    labels = list(rows[0]["tok_s"])
    print("\n| prompt | batch | new tokens | " + " | ".join(f"{k} tok/s" for k in labels) + " | ours / HF | same ids |")
    print("|---|---|---|" + "---|" * len(labels) + "---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {r['batch']} | {r['new_tokens']} | " + " | ".join(f"{r['tok_s'][k]:.1f}"
              for k in labels) + f" | {r.get('speedup', float('nan')):.2f}x | {r['same_ids']} |")
    name = args.out or ("generation_quick.json" if args.quick else "generation.json")
    write_json(os.path.join(ROOT, "benchmarks", "results", name), {
        "shape": shape, "reps": reps, "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": threads,
        "versions": versions(["tensorflow", "torch", "transformers"]), "peak_rss_mb": rss, "rows": rows})


if __name__ == "__main__":
    main()
