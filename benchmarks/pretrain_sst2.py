#!/usr/bin/env python
"""Does pretraining help downstream? The paper's objective against BERT's and against none, at small scale.

Pretraining text (in-domain, never a test split): the 25,000 IMDB TRAIN reviews (``imdb/aclImdb_v1.tar.gz``,
train/pos + train/neg, labels unused; one sentence per line, one document per review) plus the WikiText-2
valid articles, documents shuffled together with a fixed seed; held out: WikiText-2 test. Uncased.
1. SentencePiece model (unigram, vocab 8000) trained on that text (``run_pretrain.py --train_spm``), the
   records written once and shared by both objectives;
2. the same small backbone (3 layers, d_model 128), data, steps, batch and learning rate pretrained with
   (a) ``--objective=plm`` (the permutation LM: two streams, span targets, partial prediction) and
   (b) ``--objective=mlm`` (BERT-style masked LM on the content stream: 15% of the pieces, 80% <mask>,
   10% random, 10% kept); held-out loss of each objective at the start, every ``heldout_every`` steps and
   at the end, next to the unigram baseline (the PLM run's). Curves: ``results/pretrain_curve[_quick].png``;
3. fine-tuning (``run_classifier.py``) identical for the three arms (a) PLM, (b) MLM, (c) none = random
   initialisation of the same config: the same tokenizer, sequence length, batch, steps, learning rate,
   dropout, over ``--seeds`` fine-tuning seeds: SST-2 (dev accuracy) and, in full mode, IMDB (a balanced
   subset of train; scored on a balanced subset of the TEST split). Curves:
   ``results/pretrain_finetune_curve[_quick].png``.

    python benchmarks/pretrain_sst2.py            # full (~80 min on 2 cores) -> results/pretrain_sst2.json
    python benchmarks/pretrain_sst2.py --quick    # <= 15 min (~10 idle), SST-2 only -> results/pretrain_sst2_quick.json
    python benchmarks/pretrain_sst2.py --summary_type=last   # every arm's head reads <cls>, not the mean

The last line of stdout is one JSON object: heldout_loss_start, heldout_loss_end, unigram_loss (PLM run),
mlm_heldout_loss_start / _end, sst2_acc_pretrained (PLM), sst2_acc_mlm, sst2_acc_scratch (means over the
seeds), each with its per-seed list (``..._seeds``), and in full mode imdb_acc_* the same way.
Work files go to ``--workdir``; its SentencePiece model and records are reused by a later run with the same
text and settings (a full run after a quick one in the same ``--workdir`` skips both).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)

from bench_util import shared_dir  # noqa: E402

MODEL = {"n_layer": 3, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 384, "ff_activation": "gelu",
         "untie_r": True, "n_token": 8000}
PRETRAIN = dict(vocab_size=8000, seq_len=64, reuse_len=32, mem_len=32, perm_size=32, plm_num_predict=11,
                bi_data=False, train_batch_size=16, learning_rate=1e-3, dropout=0.0, dropatt=0.0,
                heldout_batch_size=8)
# pretrain_docs: the first documents of the shuffled text that pretraining reads (records for what the budget
# reaches: steps x 16 streams x 32 new tokens); spm_sentences: lines sampled for the SentencePiece model.
MODES = {
    "quick": dict(train_steps=1000, warmup_steps=50, heldout_every=250, heldout_steps=5, pretrain_docs=4000,
                  spm_sentences=20000, sst2_steps=400, seeds=(1,), imdb_steps=0),
    "full": dict(train_steps=12000, warmup_steps=600, heldout_every=2000, heldout_steps=10, pretrain_docs=20000,
                 spm_sentences=100000, sst2_steps=1000, seeds=(1, 2, 3), imdb_steps=300, imdb_seeds=(1,),
                 imdb_train=2560, imdb_test=1000),
}
FINETUNE = dict(train_batch_size=32, learning_rate=5e-4, warmup_fraction=0.1, dropout=0.1, summary_type="mean")
TASKS = {"sst2": dict(task="sst-2", max_seq_length=64), "imdb": dict(task="imdb", max_seq_length=128)}
ARMS = ("pretrained", "mlm", "scratch")  # (a) PLM, (b) MLM, (c) none


def log(msg: str) -> None:
    sys.stderr.write(f"[pretrain_sst2 {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def run(args, what: str, log_path: str | None = None) -> str:
    """Runs a project CLI (its log on our stderr, or in ``log_path``); returns its stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    log(f"{what}: started")
    t0 = time.time()
    err = open(log_path, "w") if log_path else None
    try:
        proc = subprocess.run([sys.executable] + args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                              text=True)
    finally:
        if err:
            err.close()
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode})" + (f"; log {log_path}" if log_path else ""))
    log(f"{what}: done in {time.time() - t0:.0f}s")
    return proc.stdout


# ---------------------------------------------------------------------------------------------- corpus
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def imdb_reviews(tar_path: str, split: str):
    """[(label, file name, text)] of one split, ``<br />`` as spaces, in the archive's order."""
    out = []
    with tarfile.open(tar_path, "r:*") as tar:
        for m in tar:
            parts = m.name.split("/")
            if m.isfile() and len(parts) >= 3 and parts[-3] == split and parts[-2] in ("pos", "neg") \
                    and parts[-1].endswith(".txt"):
                text = tar.extractfile(m).read().decode("utf-8").replace("<br />", " ").strip()
                out.append((parts[-2], parts[-1], text))
    return out


def wikitext_articles(path: str):
    """WikiText articles (a top-level `` = Title = `` line starts one), each a list of non-empty lines."""
    docs, cur = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if re.fullmatch(r"= [^=].* =", line) and cur:
                docs.append(cur)
                cur = []
            if line:
                cur.append(line)
    if cur:
        docs.append(cur)
    return docs


def write_corpus(work: str, data: str, imdb_train, n_docs: int):
    """IMDB train reviews (one sentence per line) + WikiText-2 valid articles, shuffled as documents (seed 0).
    Returns (the whole text: the SentencePiece model's, the first ``n_docs`` documents: the pretraining text)."""
    whole = os.path.join(work, "corpus", "imdb_train_wikitext.txt")
    part = os.path.join(work, "corpus", f"imdb_train_wikitext_first{n_docs}.txt")
    if os.path.isfile(whole) and os.path.isfile(part):
        return whole, part
    docs = [[s for s in _SENTENCE_END.split(text) if s.strip()] for _, _, text in imdb_train]
    docs += wikitext_articles(os.path.join(data, "text", "wikitext2-valid.tokens"))
    random.Random(0).shuffle(docs)
    os.makedirs(os.path.dirname(whole), exist_ok=True)
    for path, chosen in ((whole, docs), (part, docs[:n_docs])):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for doc in chosen:
                f.write("\n".join(doc) + "\n\n")
        os.replace(path + ".tmp", path)
    return whole, part


def train_spiece(work: str, whole: str, sentences: int) -> str:
    """The SentencePiece model of the whole text (``sentences`` lines sampled), uncased; reused when present."""
    prefix = os.path.join(work, f"spiece_{PRETRAIN['vocab_size']}_{sentences}")
    if not os.path.isfile(prefix + ".model"):
        run(["-m", "xlnet_tf.spm_train", f"--input={whole}", f"--model_prefix={prefix}",
             f"--vocab_size={PRETRAIN['vocab_size']}", f"--input_sentence_size={sentences}", "--lower"],
            "SentencePiece model")
    return prefix + ".model"


def write_imdb_subset(work: str, train, test, n_train: int, n_test: int) -> str:
    """A balanced subset of train and of test in the aclImdb folder layout (fixed seed)."""
    root = os.path.join(work, f"imdb_{n_train}_{n_test}", "aclImdb")
    if os.path.isdir(root):
        return root
    rng = random.Random(0)
    for split, docs, n in (("train", train, n_train), ("test", test, n_test)):
        for label in ("pos", "neg"):
            pool = sorted(d for d in docs if d[0] == label)
            folder = os.path.join(root + ".tmp", split, label)
            os.makedirs(folder, exist_ok=True)
            for _, name, text in rng.sample(pool, n // 2):
                with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                    f.write(text)
    os.replace(root + ".tmp", root)
    return root


# ---------------------------------------------------------------------------------------------- runs
def pretrain(work: str, mode: dict, corpus: str, spiece: str, heldout: str, objective: str) -> dict:
    cfg_path = os.path.join(work, "model_config.json")
    with open(cfg_path, "w") as f:
        json.dump(MODEL, f)
    p = PRETRAIN
    args = [os.path.join(ROOT, "run_pretrain.py"), f"--objective={objective}", f"--train_input={corpus}",
            f"--heldout_input={heldout}", f"--spiece_model_file={spiece}", "--uncased",
            f"--model_config_path={cfg_path}",
            f"--seq_len={p['seq_len']}", f"--reuse_len={p['reuse_len']}", f"--mem_len={p['mem_len']}",
            f"--perm_size={p['perm_size']}", f"--bi_data={p['bi_data']}", f"--train_batch_size={p['train_batch_size']}",
            f"--learning_rate={p['learning_rate']}", f"--train_steps={mode['train_steps']}",
            f"--warmup_steps={mode['warmup_steps']}", f"--dropout={p['dropout']}", f"--dropatt={p['dropatt']}",
            f"--heldout_batch_size={p['heldout_batch_size']}", f"--heldout_steps={mode['heldout_steps']}",
            f"--heldout_every={mode['heldout_every']}", "--iterations=20", "--save_steps=0", "--progress=false",
            f"--record_dir={work}/records", f"--model_dir={work}/pretrain_{objective}",
            f"--output_dir={work}/pretrained_{objective}"]
    if objective == "plm":
        args.append(f"--num_predict={p['plm_num_predict']}")
    for d in (f"pretrain_{objective}", f"pretrained_{objective}"):  # a fresh run; spiece.model and records stay
        shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    t0 = time.time()
    run(args, f"pretraining ({objective})")
    with open(os.path.join(work, f"pretrain_{objective}", "pretrain_results.json")) as f:
        res = json.load(f)
    res["wall_seconds"] = time.time() - t0
    return res


def finetune(work: str, task: str, data_dir: str, arm: str, seed: int, steps: int) -> dict:
    bb = os.path.join(work, "pretrained_plm")  # config and tokenizer of every arm (the MLM run saves the same)
    init = {"pretrained": bb, "mlm": os.path.join(work, "pretrained_mlm"), "scratch": None}[arm]
    out = os.path.join(work, f"{task}_{arm}_s{seed}")
    shutil.rmtree(out, ignore_errors=True)  # a fresh run (an old model_dir would be resumed)
    t, s = TASKS[task], FINETUNE
    args = [os.path.join(ROOT, "run_classifier.py"), f"--task={t['task']}", f"--data_dir={data_dir}",
            f"--spiece_model_file={bb}/spiece.model", "--uncased", f"--output_dir={out}",
            f"--cache_dir={work}/{task}_cache", f"--max_seq_length={t['max_seq_length']}",
            f"--train_batch_size={s['train_batch_size']}", f"--train_steps={steps}",
            f"--warmup_steps={int(steps * s['warmup_fraction'])}", f"--learning_rate={s['learning_rate']}",
            f"--dropout={s['dropout']}", f"--dropatt={s['dropout']}", f"--seed={seed}", "--save_steps=0",
            "--iterations=25", "--do_train", "--do_eval", "--eval_batch_size=64", "--progress=false",
            f"--summary_type={s['summary_type']}"]
    args.append(f"--init_checkpoint={init}" if init else f"--model_config_path={bb}/xlnet_tf_config.json")
    t0 = time.time()
    run(args, f"{task} {arm} seed {seed}", log_path=out + ".log")
    with open(os.path.join(out, "eval_results.json")) as f:
        res = json.load(f)
    with open(os.path.join(out, "model", "train_history.json")) as f:
        res["train_history"] = json.load(f)
    res["wall_seconds"] = time.time() - t0
    return res


def finetune_all(work, task, data_dir, seeds, steps, jobs):
    """{arm: [result per seed]}; the cache of features is built by the first run alone."""
    runs = [(arm, seed) for seed in seeds for arm in ARMS]
    out = {arm: {} for arm in ARMS}
    first = runs[0]
    out[first[0]][first[1]] = finetune(work, task, data_dir, first[0], first[1], steps)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {r: pool.submit(finetune, work, task, data_dir, r[0], r[1], steps) for r in runs[1:]}
        for (arm, seed), fut in futures.items():
            out[arm][seed] = fut.result()
    for arm in ARMS:
        accs = [round(out[arm][s]["accuracy"], 4) for s in seeds]
        log(f"{task} {arm}: accuracy {statistics.mean(accs):.4f} over seeds {list(seeds)}: {accs}")
    return {arm: [out[arm][s] for s in seeds] for arm in ARMS}


# ---------------------------------------------------------------------------------------------- plots
def _smooth(values, k):
    import numpy as np

    k = max(1, min(k, len(values)))
    return np.convolve(values, np.ones(k) / k, mode="valid"), (k - 1) // 2


def plot_pretraining(pre: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    for obj, color in (("plm", "tab:blue"), ("mlm", "tab:orange")):
        res = pre[obj]
        steps = np.array([s for s, _ in res["train_history"]])
        losses = np.array([l for _, l in res["train_history"]])
        smooth, off = _smooth(losses, max(1, len(losses) // 10))
        ax.plot(steps[off:off + len(smooth)], smooth, color=color, lw=1.5, label=f"{obj.upper()} train (moving mean)")
        held = res["heldout"]
        ax.plot([h["step"] for h in held], [h["loss"] for h in held], "o--", color=color, lw=1.5,
                label=f"{obj.upper()} held-out ({held[-1]['tokens']} targets, WikiText-2 test)")
    if "unigram_loss" in pre["plm"]:
        ax.axhline(pre["plm"]["unigram_loss"], color="gray", ls="--", lw=1.0,
                   label=f"unigram baseline {pre['plm']['unigram_loss']:.3f} (PLM targets)")
    c, r = pre["plm"]["config"], pre["plm"]
    ax.set_title(f"Pretraining on IMDB train + WikiText: {c['n_layer']} layers, d_model {c['d_model']}, seq "
                 f"{r['seq_len']} (reuse {r['reuse_len']}), mem {r['mem_len']}, batch {r['train_batch_size']}",
                 fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy over targets (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_finetuning(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(results)
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    colors = {"pretrained": "tab:blue", "mlm": "tab:orange", "scratch": "tab:gray"}
    names = {"pretrained": "PLM-pretrained", "mlm": "MLM-pretrained", "scratch": "no pretraining"}
    for ax, task in zip(axes[0], tasks):
        for arm, runs in results[task].items():
            n = min(len(r["train_history"]) for r in runs)
            losses = np.mean([[l for _, l in r["train_history"][:n]] for r in runs], 0)
            steps = np.array([s for s, _ in runs[0]["train_history"][:n]])
            smooth, off = _smooth(losses, max(1, n // 10))
            accs = [r["accuracy"] for r in runs]
            ax.plot(steps[off:off + len(smooth)], smooth, color=colors[arm], lw=1.6,
                    label=f"{names[arm]}: acc {np.mean(accs):.3f} (min {min(accs):.3f}, max {max(accs):.3f})")
        ax.set_title(f"{task.upper()} fine-tuning: train loss, mean of {len(runs)} seeds", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="<= 15 minutes: shorter pretraining, SST-2 only")
    ap.add_argument("--workdir", default=None, help="work files (default: a temp dir, removed at the end)")
    ap.add_argument("--pretrain_steps", type=int, default=None, help="override the mode's pretraining steps")
    ap.add_argument("--sst2_steps", type=int, default=None, help="override the mode's SST-2 steps")
    ap.add_argument("--imdb_steps", type=int, default=None, help="override the mode's IMDB steps (0: skip)")
    ap.add_argument("--seeds", type=str, default=None, help="fine-tuning seeds, comma-separated")
    ap.add_argument("--jobs", type=int, default=2, help="fine-tuning runs at once")
    ap.add_argument("--summary_type", default=FINETUNE["summary_type"], choices=["last", "first", "mean", "attn"],
                    help="the fine-tuning head's sequence summary, for every arm (mean: the mean over the "
                         "non-padding positions; last: <cls>, the original's default). Neither objective trains "
                         "<cls> (XLNet has no sentence-level task), so the study reads the mean")
    args = ap.parse_args()

    name = "quick" if args.quick else "full"
    mode = dict(MODES[name])
    if args.pretrain_steps:
        mode["train_steps"] = args.pretrain_steps
        mode["warmup_steps"] = max(1, args.pretrain_steps // 10)
        mode["heldout_every"] = max(1, args.pretrain_steps // 5)
    for key in ("sst2_steps", "imdb_steps"):
        if getattr(args, key) is not None:
            mode[key] = getattr(args, key)
    FINETUNE["summary_type"] = args.summary_type
    if args.seeds:
        mode["seeds"] = mode["imdb_seeds"] = tuple(int(s) for s in args.seeds.split(","))
    data = shared_dir()
    tar_path = os.path.join(data, "imdb", "aclImdb_v1.tar.gz")
    sst2 = os.path.join(data, "glue", "SST-2")
    heldout = os.path.join(data, "text", "wikitext2-test.tokens")
    for p in (tar_path, os.path.join(sst2, "dev.tsv"), heldout, os.path.join(data, "text", "wikitext2-valid.tokens")):
        if not os.path.isfile(p):
            raise SystemExit(f"missing {p} (set SHARED_DATA to the shared data folder)")
    work = args.workdir or tempfile.mkdtemp(prefix="xlnet_pretrain_sst2_")
    os.makedirs(work, exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "" if name == "full" else "_quick"
    t0 = time.time()
    try:
        imdb_train = imdb_reviews(tar_path, "train")
        whole, corpus = write_corpus(work, data, imdb_train, mode["pretrain_docs"])
        log(f"text: {len(imdb_train)} IMDB train reviews + WikiText-2 valid -> {whole} "
            f"({os.path.getsize(whole) / 1e6:.1f} MB); pretraining reads its first {mode['pretrain_docs']} "
            f"documents ({os.path.getsize(corpus) / 1e6:.1f} MB)")
        spiece = train_spiece(work, whole, mode["spm_sentences"])
        pre = {obj: pretrain(work, mode, corpus, spiece, heldout, obj) for obj in ("plm", "mlm")}
        curve = os.path.join(RESULTS, f"pretrain_curve{suffix}.png")
        plot_pretraining(pre, curve)
        for obj, res in pre.items():
            log(f"{obj} held-out loss {res['heldout_loss_start']:.3f} -> {res['heldout_loss_end']:.3f}")
        fine = {"sst2": finetune_all(work, "sst2", sst2, mode["seeds"], mode["sst2_steps"], args.jobs)}
        if mode["imdb_steps"] > 0:
            imdb_dir = write_imdb_subset(work, imdb_train, imdb_reviews(tar_path, "test"), mode["imdb_train"],
                                         mode["imdb_test"])
            fine["imdb"] = finetune_all(work, "imdb", imdb_dir, mode["imdb_seeds"], mode["imdb_steps"], args.jobs)
        ft_curve = os.path.join(RESULTS, f"pretrain_finetune_curve{suffix}.png")
        plot_finetuning(fine, ft_curve)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    plm, mlm = pre["plm"], pre["mlm"]
    summary = {
        "heldout_loss_start": round(plm["heldout_loss_start"], 4),
        "heldout_loss_end": round(plm["heldout_loss_end"], 4),
        "unigram_loss": round(plm["unigram_loss"], 4) if "unigram_loss" in plm else None,
        "mlm_heldout_loss_start": round(mlm["heldout_loss_start"], 4),
        "mlm_heldout_loss_end": round(mlm["heldout_loss_end"], 4),
    }
    for task, arms in fine.items():
        for arm, runs in arms.items():
            accs = [round(r["accuracy"], 4) for r in runs]
            summary[f"{task}_acc_{arm}"] = round(statistics.mean(accs), 4)
            summary[f"{task}_acc_{arm}_seeds"] = accs
    report = dict(
        summary, mode=name, wall_minutes=round((time.time() - t0) / 60, 1), seeds=list(mode["seeds"]),
        arms={"pretrained": "(a) PLM (--objective=plm)", "mlm": "(b) MLM (--objective=mlm)",
              "scratch": "(c) no pretraining (random init, same config)"},
        data={"text": ["imdb/aclImdb_v1.tar.gz train/pos + train/neg (25,000 reviews)",
                       "text/wikitext2-valid.tokens"],
              "spiece": f"unigram {PRETRAIN['vocab_size']}, uncased, {mode['spm_sentences']} lines of the whole text",
              "pretrain": f"the first {mode['pretrain_docs']} documents of the shuffled text",
              "heldout": "text/wikitext2-test.tokens", "sst2": "glue/SST-2 (train / dev)",
              "imdb": (f"balanced subsets: {mode['imdb_train']} train, {mode['imdb_test']} test (seed 0)"
                       if "imdb" in fine else None), "uncased": True},
        model=MODEL, pretrain=dict(PRETRAIN, **{k: mode[k] for k in ("train_steps", "warmup_steps",
                                                                    "heldout_every", "heldout_steps")}),
        pretrain_result={obj: {"train_tokens": r["train_tokens"], "heldout": r["heldout"],
                               "final_train_loss_mean_last_50": round(
                                   sum(l for _, l in r["train_history"][-50:]) /
                                   max(1, len(r["train_history"][-50:])), 4),
                               "wall_seconds": round(r["wall_seconds"])} for obj, r in pre.items()},
        finetune={task: {"settings": dict(FINETUNE, **TASKS[task], train_steps=mode[f"{task}_steps"],
                                          seeds=list(mode["seeds" if task == "sst2" else "imdb_seeds"])),
                         **{arm: [{m: r[m] for m in ("accuracy", "loss", "num_examples", "wall_seconds") if m in r}
                                  for r in runs] for arm, runs in arms.items()}}
                  for task, arms in fine.items()},
        plots=[os.path.relpath(curve, ROOT), os.path.relpath(ft_curve, ROOT)],
        machine={"cpus": os.cpu_count(), "python": platform.python_version()})
    with open(os.path.join(RESULTS, f"pretrain_sst2{suffix}.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
