"""Greedy generation speed: ours (``xlnet_tf/generation.py``) vs HuggingFace's ``XLNetLMHeadModel.generate``, side by
side in one process on the same CPU and the same weights.

    python benchmarks/generation.py            # XLNet-Base shape, ~30-60 min on 2 quiet cores
    python benchmarks/generation.py --quick    # a smoke run: a tiny model, 4 new tokens (~2 min)

Weights: random, made by HF (``XLNetLMHeadModel(config)``, XLNet-Base's shape: 12 layers x 768, 12 heads, d_inner
3072, 32,000 tokens; ``mem_len=None`` as the released configs), saved and read by ``XLNetModel.from_pretrained``.
Prompts: random ids of 32 and 256 pieces, batch 1 and 8, 64 new tokens, greedy, no early stop (``eos`` off on
both sides). Each case: one warm-up call per side (our trace), then ``--reps`` interleaved calls (ours, HF at
each of ``--torch_threads``, ours, ...); new tokens/s = batch x new tokens / median seconds; HF's figure is its
fastest thread count (the peer). The ids of every side are compared (``same_ids``). TensorFlow runs with its
default threads and oneDNN.

Prints a table and writes benchmarks/results/generation.json (``--quick``: generation_quick.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import cpu_model, versions, write_json  # noqa: E402

BASE = dict(d_model=768, n_layer=12, n_head=12, d_inner=3072)
TINY = dict(d_model=64, n_layer=2, n_head=2, d_inner=128)


def build(shape, directory):
    import torch
    import transformers

    from xlnet_tf import XLNetModel

    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=32000, ff_activation="gelu_new", untie_r=True, dropout=0.0,
                                   mem_len=None, **shape)
    hf = transformers.XLNetLMHeadModel(cfg).eval()
    hf.generation_config.eos_token_id = None  # every row runs to max_new_tokens, as ours with eos_id=None
    hf.generation_config.pad_token_id = 5
    hf.save_pretrained(directory)
    return hf, XLNetModel.from_pretrained(directory, dropout=0.0, dropatt=0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 4 new tokens, short prompts")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per side and case (default 3, quick 2)")
    ap.add_argument("--torch_threads", default="default,1",
                    help="PyTorch intra-op thread counts to time HF with ('default' = its own); the fastest is "
                         "the peer (on a busy 2-core machine its default threads spun against each other: 1 "
                         "thread measured 5x faster there)")
    args = ap.parse_args()
    import numpy as np
    import torch

    from xlnet_tf.generation import GenerationOptions, Generator

    default_threads = torch.get_num_threads()
    thread_counts = [default_threads if t.strip() == "default" else int(t) for t in args.torch_threads.split(",")]
    shape = TINY if args.quick else BASE
    lengths, batches = ((8, 32), (1, 2)) if args.quick else ((32, 256), (1, 8))
    new_tokens = 4 if args.quick else 64
    reps = args.reps or (2 if args.quick else 3)
    with tempfile.TemporaryDirectory() as d:
        hf, ours = build(shape, d)
    gen = Generator(ours)
    options = GenerationOptions(max_new_tokens=new_tokens, eos_id=None)
    rng = np.random.default_rng(0)
    rows = []
    for plen in lengths:
        for bsz in batches:
            ids = rng.integers(10, 32000, (bsz, plen)).astype(np.int32)

            def run_ours():
                return gen(ids, None, options)

            def run_hf(threads):
                torch.set_num_threads(threads)
                with torch.no_grad():
                    out = hf.generate(torch.from_numpy(ids.astype(np.int64)), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False)
                return out[:, plen:].numpy()

            sides = {"ours": run_ours}
            sides.update({f"hf_t{t}": (lambda t=t: run_hf(t)) for t in thread_counts})
            first = {name: fn() for name, fn in sides.items()}  # also the warm-up (our trace)
            same = all(np.array_equal(first["ours"], v) for v in first.values())
            times = {name: [] for name in sides}
            for _ in range(reps):
                for name, fn in sides.items():
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            peer = min((k for k in med if k != "ours"), key=med.get)
            row = {"prompt": plen, "batch": bsz, "new_tokens": new_tokens, "same_ids": same, "hf_peer": peer,
                   "ours_s": med["ours"], "hf_s": med[peer],
                   "ours_tok_s": bsz * new_tokens / med["ours"], "hf_tok_s": bsz * new_tokens / med[peer],
                   "speedup": med[peer] / med["ours"], "medians_s": med, "times": times}
            rows.append(row)
            print(f"prompt {plen:4d} batch {bsz}: ours {row['ours_tok_s']:8.1f} tok/s  HF {row['hf_tok_s']:8.1f} "
                  f"tok/s ({peer})  x{row['speedup']:.2f}  same ids: {same}", flush=True)
    print("\n| prompt | batch | new tokens | ours tok/s | HF tok/s (threads) | speedup | same ids |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {r['batch']} | {r['new_tokens']} | {r['ours_tok_s']:.1f} | {r['hf_tok_s']:.1f} "
              f"({r['hf_peer'][4:]}) | "
              f"{r['speedup']:.2f}x | {r['same_ids']} |")
    name = "generation_quick.json" if args.quick else "generation.json"
    write_json(os.path.join(ROOT, "benchmarks", "results", name), {
        "shape": shape, "reps": reps, "cpu": cpu_model(), "cores": os.cpu_count(),
        "torch_threads": thread_counts, "torch_default_threads": default_threads,
        "versions": versions(["tensorflow", "torch", "transformers"]),
        "rows": rows})


if __name__ == "__main__":
    main()
