"""Greedy generation speed: ours (``xlnet_tf/generation.py``) vs HuggingFace's ``XLNetLMHeadModel.generate``, side by
side in one process on the same CPU and the same weights.

    python benchmarks/generation.py            # XLNet-Base shape, ~30-60 min on 2 quiet cores
    python benchmarks/generation.py --quick    # a smoke run: a tiny model, 4 new tokens (~2 min)

Weights: random, made by HF (``XLNetLMHeadModel(config)``, XLNet-Base's shape: 12 layers x 768, 12 heads, d_inner
3072, 32,000 tokens; ``mem_len=None`` as the released configs), saved and read by ``XLNetModel.from_pretrained``.
Prompts: random ids of 32 and 256 pieces, batch 1 and 8, 64 new tokens, greedy, no early stop (``eos`` off on
both sides). Each case: one warm-up call per side (our trace), then ``--reps`` interleaved calls (ours, HF, ours,
HF, ...); new tokens/s = batch x new tokens / median seconds. The ids of both sides are compared (``same_ids``).
Both run with their default threads (TensorFlow with oneDNN, PyTorch's intra-op pool; ``--torch_threads``),
recorded.

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
    ap.add_argument("--torch_threads", type=int, default=None,
                    help="PyTorch intra-op threads (default: its own; on a loaded machine 1 avoids its threads "
                         "spinning against each other: measured 5x faster there)")
    args = ap.parse_args()
    import numpy as np
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    from xlnet_tf.generation import GenerationOptions, Generator

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

            def run_hf():
                with torch.no_grad():
                    out = hf.generate(torch.from_numpy(ids.astype(np.int64)), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False)
                return out[:, plen:].numpy()

            same = bool(np.array_equal(run_ours(), run_hf()))  # also the warm-up (our trace)
            times = {"ours": [], "hf": []}
            for _ in range(reps):
                for name, fn in (("ours", run_ours), ("hf", run_hf)):
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"prompt": plen, "batch": bsz, "new_tokens": new_tokens, "same_ids": same,
                   "ours_s": med["ours"], "hf_s": med["hf"],
                   "ours_tok_s": bsz * new_tokens / med["ours"], "hf_tok_s": bsz * new_tokens / med["hf"],
                   "speedup": med["hf"] / med["ours"], "times": times}
            rows.append(row)
            print(f"prompt {plen:4d} batch {bsz}: ours {row['ours_tok_s']:8.1f} tok/s  HF {row['hf_tok_s']:8.1f} "
                  f"tok/s  x{row['speedup']:.2f}  same ids: {same}", flush=True)
    print("\n| prompt | batch | new tokens | ours tok/s | HF tok/s | speedup | same ids |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {r['batch']} | {r['new_tokens']} | {r['ours_tok_s']:.1f} | {r['hf_tok_s']:.1f} | "
              f"{r['speedup']:.2f}x | {r['same_ids']} |")
    name = "generation_quick.json" if args.quick else "generation.json"
    write_json(os.path.join(ROOT, "benchmarks", "results", name), {
        "shape": shape, "reps": reps, "cpu": cpu_model(), "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "versions": versions(["tensorflow", "torch", "transformers"]),
        "rows": rows})


if __name__ == "__main__":
    main()
