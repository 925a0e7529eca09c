#!/usr/bin/env python
"""Does our pretraining work? A real (small, CPU) pretraining run, then SST-2 from it vs from scratch.

(a) Pretraining on ``$SHARED_DATA/text`` (default ``../shared/data`` next to the project):
    training text = WikiText-2 valid + Tiny Shakespeare; held out = WikiText-2 test. Uncased.
    1. SentencePiece model (unigram, vocab 8000) trained on the training text (``run_pretrain.py --train_spm``);
    2. pretraining TFRecords; 3. ``run_pretrain.py``: a 4-layer d_model-128 XLNet, seq 64 = reuse 32 + 32,
    memory 64, bi_data, 11 targets per sequence, batch 16, Adam 1e-3 with warmup and linear decay, no
    dropout (the budget is well under one pass per parameter; nothing to regularise).
    Held-out PLM loss (same sampler, fixed seed: the same targets and orders every time, memory carried) at
    the start, every ``heldout_every`` steps and at the end, next to the UNIGRAM baseline: the cross-entropy
    of the training text's unigram distribution (add-one) over the same held-out targets. A model that beats
    it uses context. Plot: ``benchmarks/results/pretrain_curve[_quick].png``.
(b) SST-2 (``run_classifier.py``, GLUE dev accuracy): the same model shape, tokenizer, seq length, batch,
    steps, learning rate and seed, once from the pretrained backbone (``--init_checkpoint``) and once from
    random initialisation (``--model_config_path``).

    python benchmarks/pretrain_sst2.py            # full: ~35 min on 2 cores -> results/pretrain_sst2.json
    python benchmarks/pretrain_sst2.py --quick    # < 10 min: pretraining only (SST-2 pair null)
                                                  #   -> results/pretrain_sst2_quick.json

The last line of stdout is one JSON object: heldout_loss_start, heldout_loss_end, unigram_loss,
sst2_acc_pretrained, sst2_acc_scratch. Work files (records, checkpoints) go to ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

MODEL = {"n_layer": 4, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512, "ff_activation": "gelu",
         "untie_r": True, "n_token": 8000}
PRETRAIN = dict(vocab_size=8000, seq_len=64, reuse_len=32, mem_len=64, perm_size=32, num_predict=11,
                train_batch_size=16, learning_rate=1e-3, dropout=0.0, dropatt=0.0, heldout_batch_size=8)
MODES = {
    "quick": dict(train_steps=240, warmup_steps=24, heldout_every=40, heldout_steps=20, sst2_steps=0),
    "full": dict(train_steps=900, warmup_steps=90, heldout_every=150, heldout_steps=40, sst2_steps=250),
}
SST2 = dict(max_seq_length=64, train_batch_size=32, learning_rate=2e-4, warmup_fraction=0.1, dropout=0.1,
            seed=42)


def shared_dir() -> str:
    return os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")


def log(msg: str) -> None:
    sys.stderr.write(f"[pretrain_sst2 {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def run(args, what: str) -> str:
    """Runs a project CLI (its log on our stderr); returns its stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    log(f"{what}: {' '.join(os.path.basename(a) if i < 2 else a for i, a in enumerate(args))}")
    t0 = time.time()
    proc = subprocess.run([sys.executable] + args, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    log(f"{what}: done in {time.time() - t0:.0f}s")
    return proc.stdout


def pretrain(work: str, mode: dict, text: str) -> dict:
    cfg_path = os.path.join(work, "model_config.json")
    with open(cfg_path, "w") as f:
        json.dump(MODEL, f)
    p = PRETRAIN
    args = [os.path.join(ROOT, "run_pretrain.py"),
            f"--train_input={text}/wikitext2-valid.tokens,{text}/tinyshakespeare.txt",
            f"--heldout_input={text}/wikitext2-test.tokens", "--train_spm", f"--vocab_size={p['vocab_size']}",
            "--uncased", f"--model_config_path={cfg_path}", f"--seq_len={p['seq_len']}",
            f"--reuse_len={p['reuse_len']}", f"--mem_len={p['mem_len']}", f"--perm_size={p['perm_size']}",
            f"--num_predict={p['num_predict']}", "--bi_data", f"--train_batch_size={p['train_batch_size']}",
            f"--learning_rate={p['learning_rate']}", f"--train_steps={mode['train_steps']}",
            f"--warmup_steps={mode['warmup_steps']}", f"--dropout={p['dropout']}", f"--dropatt={p['dropatt']}",
            f"--heldout_batch_size={p['heldout_batch_size']}", f"--heldout_steps={mode['heldout_steps']}",
            f"--heldout_every={mode['heldout_every']}", "--iterations=20", "--save_steps=0", "--progress=false",
            f"--model_dir={work}/pretrain", f"--output_dir={work}/pretrained"]
    t0 = time.time()
    run(args, "pretraining")
    with open(os.path.join(work, "pretrain", "pretrain_results.json")) as f:
        res = json.load(f)
    res["wall_seconds"] = time.time() - t0
    return res


def finetune(work: str, name: str, steps: int, sst2_dir: str, init: bool) -> dict:
    bb = os.path.join(work, "pretrained")
    out = os.path.join(work, f"sst2_{name}")
    shutil.rmtree(out, ignore_errors=True)  # a fresh run (an old model_dir would be resumed)
    s = SST2
    args = [os.path.join(ROOT, "run_classifier.py"), "--task=sst-2", f"--data_dir={sst2_dir}",
            f"--spiece_model_file={bb}/spiece.model", "--uncased", f"--output_dir={out}",
            f"--cache_dir={work}/sst2_cache", f"--max_seq_length={s['max_seq_length']}",
            f"--train_batch_size={s['train_batch_size']}", f"--train_steps={steps}",
            f"--warmup_steps={int(steps * s['warmup_fraction'])}", f"--learning_rate={s['learning_rate']}",
            f"--dropout={s['dropout']}", f"--dropatt={s['dropout']}", f"--seed={s['seed']}", "--save_steps=0",
            "--iterations=50", "--do_train", "--do_eval", "--eval_batch_size=64", "--progress=false"]
    args.append(f"--init_checkpoint={bb}" if init else f"--model_config_path={bb}/xlnet_tf_config.json")
    t0 = time.time()
    run(args, f"SST-2 fine-tuning ({name})")
    with open(os.path.join(out, "eval_results.json")) as f:
        res = json.load(f)
    res["wall_seconds"] = time.time() - t0
    return res


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = np.array([s for s, _ in res["train_history"]])
    losses = np.array([l for _, l in res["train_history"]])
    k = max(1, min(25, len(losses) // 10))
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    held = res["heldout"]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(steps, losses, color="tab:blue", alpha=0.25, lw=0.8, label="train PLM loss (per step)")
    ax.plot(steps[(k - 1) // 2:(k - 1) // 2 + len(smooth)], smooth, color="tab:blue", lw=1.8,
            label=f"train (centred moving mean of {k})")
    ax.plot([h["step"] for h in held], [h["loss"] for h in held], "o-", color="tab:red", lw=1.8,
            label=f"held-out PLM loss ({held[-1]['tokens']} targets, WikiText-2 test)")
    if "unigram_loss" in res:
        ax.axhline(res["unigram_loss"], color="gray", ls="--", lw=1.2,
                   label=f"unigram baseline {res['unigram_loss']:.3f}")
    ax.axhline(math.log(res["config"]["n_token"]), color="gray", ls=":", lw=1.0,
               label=f"uniform ln({res['config']['n_token']})")
    c = res["config"]
    ax.set_title(f"XLNet PLM pretraining: {c['n_layer']} layers, d_model {c['d_model']}, seq {res['seq_len']} "
                 f"(reuse {res['reuse_len']}), mem {res['mem_len']}, batch {res['train_batch_size']}", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy over targets (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="pretraining only, < 10 minutes")
    ap.add_argument("--workdir", default=None, help="work files (default: a temp dir, removed at the end)")
    ap.add_argument("--pretrain_steps", type=int, default=None, help="override the mode's pretraining steps")
    ap.add_argument("--sst2_steps", type=int, default=None, help="override the mode's SST-2 steps (0: skip)")
    args = ap.parse_args()

    name = "quick" if args.quick else "full"
    mode = dict(MODES[name])
    if args.pretrain_steps:
        mode["train_steps"] = args.pretrain_steps
        mode["warmup_steps"] = max(1, args.pretrain_steps // 10)
        mode["heldout_every"] = max(1, args.pretrain_steps // 6)
    if args.sst2_steps is not None:
        mode["sst2_steps"] = args.sst2_steps
    data = shared_dir()
    text, sst2 = os.path.join(data, "text"), os.path.join(data, "glue", "SST-2")
    for p in ("wikitext2-valid.tokens", "tinyshakespeare.txt", "wikitext2-test.tokens"):
        if not os.path.isfile(os.path.join(text, p)):
            raise SystemExit(f"missing {os.path.join(text, p)} (set SHARED_DATA to the shared data folder)")
    work = args.workdir or tempfile.mkdtemp(prefix="xlnet_pretrain_sst2_")
    os.makedirs(work, exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)
    t0 = time.time()
    try:
        pre = pretrain(work, mode, text)
        suffix = "" if name == "full" else "_quick"
        plot_path = os.path.join(RESULTS, f"pretrain_curve{suffix}.png")
        plot(pre, plot_path)
        log(f"held-out loss {pre['heldout_loss_start']:.3f} -> {pre['heldout_loss_end']:.3f} "
            f"(unigram {pre.get('unigram_loss', float('nan')):.3f}); plot {plot_path}")
        sst = {}
        if mode["sst2_steps"] > 0:
            if not os.path.isfile(os.path.join(sst2, "dev.tsv")):
                raise SystemExit(f"missing SST-2 in {sst2}")
            for which, init in (("pretrained", True), ("scratch", False)):
                sst[which] = finetune(work, which, mode["sst2_steps"], sst2, init)
                log(f"SST-2 {which}: dev accuracy {sst[which]['accuracy']:.4f}")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    summary = {
        "heldout_loss_start": round(pre["heldout_loss_start"], 4),
        "heldout_loss_end": round(pre["heldout_loss_end"], 4),
        "unigram_loss": round(pre["unigram_loss"], 4) if "unigram_loss" in pre else None,
        "sst2_acc_pretrained": round(sst["pretrained"]["accuracy"], 4) if sst else None,
        "sst2_acc_scratch": round(sst["scratch"]["accuracy"], 4) if sst else None,
    }
    report = dict(summary, mode=name, wall_minutes=round((time.time() - t0) / 60, 1),
                  data={"train": ["text/wikitext2-valid.tokens", "text/tinyshakespeare.txt"],
                        "heldout": "text/wikitext2-test.tokens", "sst2": "glue/SST-2 (train / dev)",
                        "uncased": True},
                  model=MODEL, pretrain=dict(PRETRAIN, **{k: mode[k] for k in
                                                         ("train_steps", "warmup_steps", "heldout_every",
                                                          "heldout_steps")}),
                  pretrain_result={"train_tokens": pre["train_tokens"], "heldout": pre["heldout"],
                                   "final_train_loss_mean_last_50": round(
                                       sum(l for _, l in pre["train_history"][-50:]) /
                                       max(1, len(pre["train_history"][-50:])), 4),
                                   "wall_seconds": round(pre["wall_seconds"])},
                  sst2=None if not sst else {
                      "settings": dict(SST2, train_steps=mode["sst2_steps"]),
                      **{k: {m: v[m] for m in ("accuracy", "loss", "num_examples", "wall_seconds") if m in v}
                         for k, v in sst.items()}},
                  plot=os.path.relpath(plot_path, ROOT),
                  machine={"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load_avg_1m_at_end": round(os.getloadavg()[0], 2)})
    with open(os.path.join(RESULTS, f"pretrain_sst2{suffix}.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
