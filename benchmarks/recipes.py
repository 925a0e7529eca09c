#!/usr/bin/env python
"""Every README recipe at small scale, from random initialisation, on the real data: does each one LEARN?

Each recipe runs its real CLI (``run_classifier.py``, ``run_squad.py``, ``run_race.py``, ``run_pretrain.py``)
with its DEFAULT flags except size (model, sequence length, batch), steps and learning rate, and is scored
against the baseline a collapsed run reaches (majority class, all "no answer", chance). No pretrained XLNet
exists here, so the numbers say that the recipe learns, not what XLNet reaches.

    python benchmarks/recipes.py --quick          # <= 15 min on 2 cores -> results/recipes_quick.json
    python benchmarks/recipes.py                  # <= 90 min on 2 cores -> results/recipes.json
    python benchmarks/recipes.py --only=sts-b,race --workdir=/tmp/recipes

Data (``../shared/data``): GLUE SST-2 / CoLA / MRPC / RTE / STS-B (train -> dev), IMDB (train -> test),
SQuAD v1.1 and v2.0 dev split BY ARTICLE (the first 80% of the articles train, the rest is scored), RACE
(a train subset -> a dev subset), and pretrain -> fine-tune (``run_pretrain.py`` with its own 4,000-piece
SentencePiece model on the SST-2 train text without labels, then SST-2 from that backbone, heads reading the
mean of the tokens as the README advises for briefly pretrained backbones). Tokenizer: XLNet's released spiece.model. Each row: the metric, its baseline, the
run's health verdict (``eval_results.json["health"]``: collapse and loss-trend checks), steps, wall time.
The last line of stdout is one JSON object {recipe: {metric, value, baseline, healthy, ...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from bench_util import cpu_model, shared_dir, versions, write_json  # noqa: E402

MODELS = {  # random initialisation; XLNet's 32,000-piece vocabulary
    "quick": {"n_layer": 2, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512},
    "full": {"n_layer": 4, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512},
}
COMMON = {"ff_activation": "gelu", "untie_r": True, "n_token": 32000}


def log(msg: str) -> None:
    sys.stderr.write(f"[recipes {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------- baselines
def gold_shares(res: Dict) -> Dict[str, float]:
    return res["health"]["predictions"]["gold"]


def majority(res: Dict) -> float:
    return max(gold_shares(res).values())


def all_positive_f1(res: Dict) -> float:
    p = gold_shares(res)["1"]
    return 2 * p / (1 + p)


def all_null_f1(res: Dict) -> float:
    return 100.0 * res["NoAns_total"] / res["total"]


# ---------------------------------------------------------------------------------------------- data
def squad_split(work: str, version: str) -> Dict[str, str]:
    """dev-v{version}.json split by article: the first 80% of the articles train, the rest is scored."""
    src = os.path.join(shared_dir(), "squad", f"dev-v{version}.json")
    out = {"train": os.path.join(work, "data", f"squad{version}-train.json"),
           "dev": os.path.join(work, "data", f"squad{version}-heldout.json")}
    if not all(os.path.isfile(p) for p in out.values()):
        with open(src, encoding="utf-8") as f:
            obj = json.load(f)
        k = int(round(0.8 * len(obj["data"])))
        os.makedirs(os.path.dirname(out["train"]), exist_ok=True)
        for name, arts in (("train", obj["data"][:k]), ("dev", obj["data"][k:])):
            with open(out[name], "w", encoding="utf-8") as f:
                json.dump(dict(obj, data=arts), f)
    return out


def pretrain_corpus(work: str) -> str:
    """Task-adaptive pretraining text: the SST-2 TRAIN sentences without their labels (in-domain, never dev),
    20 sentences a document (one per line, a blank line between documents)."""
    path = os.path.join(work, "data", "sst2-train-text.txt")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(os.path.join(shared_dir(), "glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
            lines = [ln.rsplit("\t", 1)[0].strip() for ln in f.read().splitlines()[1:] if ln.strip()]
        docs = ["\n".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- recipes
class Recipe:
    """One README recipe: the CLI, its data flags, the size/steps/LR set here, the metric and its baseline."""

    def __init__(self, name: str, script: str, data: Callable[[str], List[str]], metric: str,
                 baseline: Callable[[Dict], float], baseline_name: str, L, steps: Dict[str, int],
                 lr: float = 1e-3, batch: int = 32, extra: Optional[List[str]] = None, scale: float = 1.0):
        self.name, self.script, self.data, self.metric = name, script, data, metric
        self.baseline, self.baseline_name, self.L, self.steps = baseline, baseline_name, L, steps
        self.lr, self.batch, self.extra, self.scale = lr, batch, list(extra or []), scale


def glue(folder: str, task: str) -> Callable[[str], List[str]]:
    return lambda work: [f"--task={task}", f"--data_dir={os.path.join(shared_dir(), 'glue', folder)}"]


def squad_data(version: str) -> Callable[[str], List[str]]:
    def fn(work):
        files = squad_split(work, version)
        v2 = ["--version_2_with_negative"] if version == "2.0" else []
        return [f"--train_file={files['train']}", f"--predict_file={files['dev']}"] + v2
    return fn


def race_data(work: str) -> List[str]:
    return [f"--data_dir={os.path.join(shared_dir(), 'race', 'RACE.tar.gz')}", "--train_subset=6000",
            "--eval_subset=1000"]


RECIPES = [
    Recipe("sst-2", "run_classifier.py", glue("SST-2", "sst-2"), "accuracy", majority, "majority", 64,
           {"quick": 300, "full": 1000}),
    Recipe("cola", "run_classifier.py", glue("CoLA", "cola"), "mcc", lambda r: 0.0, "constant (MCC 0)", 64,
           {"quick": 200, "full": 600}),
    Recipe("mrpc", "run_classifier.py", glue("MRPC", "mrpc"), "f1", all_positive_f1, "all positive", 128,
           {"quick": 150, "full": 400}),
    Recipe("rte", "run_classifier.py", glue("RTE", "rte"), "accuracy", majority, "majority", 128,
           {"quick": 100, "full": 300}),
    Recipe("sts-b", "run_classifier.py", glue("STS-B", "sts-b"), "pearson", lambda r: 0.0, "constant (r 0)", 128,
           {"quick": 200, "full": 600}),
    Recipe("imdb", "run_classifier.py", lambda w: ["--task=imdb", f"--data_dir="
                                                   f"{os.path.join(shared_dir(), 'imdb', 'aclImdb_v1.tar.gz')}"],
           "accuracy", majority, "majority", {"quick": 128, "full": 256}, {"quick": 150, "full": 600}),
    Recipe("squad-v1.1", "run_squad.py", squad_data("1.1"), "f1", lambda r: 0.0, "no answer (F1 0)", 192,
           {"quick": 200, "full": 1200}, batch=16, scale=100.0),
    Recipe("squad-v2.0", "run_squad.py", squad_data("2.0"), "best_f1", all_null_f1, "all no-answer", 192,
           {"quick": 200, "full": 1200}, batch=16, scale=100.0),
    Recipe("race", "run_race.py", race_data, "accuracy", lambda r: 0.25, "chance", {"quick": 128, "full": 256},
           {"quick": 150, "full": 400}, batch=16),
    Recipe("pretrain->sst-2", "run_classifier.py", glue("SST-2", "sst-2"), "accuracy", majority, "majority", 64,
           {"quick": 300, "full": 1000}, lr=5e-4, extra=["--summary_type=mean"]),
]
PRETRAIN_STEPS = {"quick": 600, "full": 4000}
PRETRAIN_VOCAB = 4000


def pretrain(work: str, mode: str, in_process: bool = False) -> str:
    """``run_pretrain.py`` (PLM, defaults but size/steps/LR, its own SentencePiece model) on the SST-2 train
    text; returns the backbone dir. Briefly pretrained backbones need ``--summary_type=mean`` downstream (README:
    no pretraining loss shapes ``<cls>``). On out-of-domain text with the 32k vocabulary a short PLM run stays at its
    unigram stage and fine-tuning from it collapses (500 steps on WikiText-2, loss 6.2); on the task's own text with
    a 4k vocabulary 600 steps (loss 6.3) transfer (PERFORMANCE.md "Recipes at small scale")."""
    out = os.path.join(work, mode, "pretrain")
    steps = PRETRAIN_STEPS[mode]
    config_path = os.path.join(work, mode, "pretrain_config.json")
    with open(config_path, "w") as f:
        json.dump(dict(MODELS[mode], **dict(COMMON, n_token=PRETRAIN_VOCAB)), f)
    args = ["run_pretrain.py", f"--train_input={pretrain_corpus(work)}", "--train_spm",
            f"--vocab_size={PRETRAIN_VOCAB}", f"--model_config_path={config_path}", f"--model_dir={out}/train",
            f"--output_dir={out}/backbone", f"--record_dir={out}/records", "--seq_len=64", "--reuse_len=32",
            "--mem_len=32", "--perm_size=32", "--num_predict=11", "--train_batch_size=16", "--learning_rate=1e-3",
            f"--train_steps={steps}", f"--warmup_steps={steps // 10}", f"--save_steps={steps}", "--progress=false"]
    shutil.rmtree(out, ignore_errors=True)
    run_cli(args, os.path.join(work, mode, "pretrain.log"), in_process)
    return os.path.join(out, "backbone")


def run_cli(args: List[str], log_path: str, in_process: bool = False) -> float:
    """Runs ``args`` ([script, flags...]) as a process, or (``in_process``) through the script's ``main`` in this
    process (what tests/test_recipes.py does: the same code path without a Python start and a TensorFlow import
    per run); its output into ``log_path``. Returns the seconds it took."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as err:
        if in_process:
            import contextlib
            import importlib

            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
                code = importlib.import_module(os.path.splitext(args[0])[0]).main(args).code
        else:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
            code = subprocess.run([sys.executable] + args, env=env, cwd=ROOT, stdout=err,
                                  stderr=subprocess.STDOUT).returncode
    if code:
        raise SystemExit(f"{args[0]} failed (exit {code}); log {log_path}")
    return time.time() - t0


def run_recipe(r: Recipe, work: str, mode: str, config_path: str, seed: Optional[int] = None,
               flags: Sequence[str] = (), in_process: bool = False) -> Dict:
    out = os.path.join(work, mode, r.name.replace(">", "") + ("" if seed is None else f"-seed{seed}"))
    shutil.rmtree(out, ignore_errors=True)
    steps = r.steps[mode]
    init = []
    t_pre = 0.0
    if r.name.startswith("pretrain->"):
        t0 = time.time()
        backbone = pretrain(work, mode, in_process)
        t_pre = time.time() - t0
        init = [f"--init_checkpoint={backbone}", f"--spiece_model_file={backbone}/spiece.model"]
    else:
        init = [f"--model_config_path={config_path}",
                f"--spiece_model_file={os.path.join(shared_dir(), 'spiece', 'spiece.model')}"]
    L = r.L[mode] if isinstance(r.L, dict) else r.L
    seq = [f"--max_seq_length={L}"]
    if r.script == "run_race.py":
        seq += [f"--max_qa_length={L // 4}"]
    args = [r.script] + r.data(work) + init + seq + [
        f"--output_dir={out}", f"--cache_dir={os.path.join(work, 'cache', r.name.split('>')[-1])}",
        f"--train_batch_size={r.batch}", f"--train_steps={steps}", f"--warmup_steps={steps // 10}",
        f"--learning_rate={r.lr}", f"--save_steps={steps}", "--eval_batch_size=64", "--progress=false",
        "--do_train", "--do_predict" if r.script == "run_squad.py" else "--do_eval"] + r.extra + list(flags)
    if seed is not None:
        args.append(f"--seed={seed}")
    log(f"{r.name}: {steps} steps of {r.batch} at length {L}")
    seconds = run_cli(args, os.path.join(out + ".log"), in_process)
    with open(os.path.join(out, "eval_results.json"), encoding="utf-8") as f:
        res = json.load(f)
    value, base = float(res[r.metric]) / r.scale, float(r.baseline(res)) / r.scale
    health = res.get("health", {})
    row = {"metric": r.metric, "value": round(value, 4), "baseline": round(base, 4), "baseline_name": r.baseline_name,
           "margin": round(value - base, 4), "healthy": health.get("healthy"), "warnings": health.get("warnings"),
           "steps": steps, "batch": r.batch, "max_seq_length": L, "learning_rate": r.lr,
           "seconds": round(seconds + t_pre, 1), "pretrain_seconds": round(t_pre, 1) or None,
           "loss_trend": health.get("loss_trend"), "num_eval": res.get("num_examples", res.get("total"))}
    if r.script == "run_squad.py":
        row.update({k: res[k] for k in ("f1", "exact", "HasAns_span_f1", "best_f1") if k in res})
    log(f"{r.name}: {r.metric} {value:.4f} vs {r.baseline_name} {base:.4f} "
        f"({'healthy' if row['healthy'] else 'WARNINGS: ' + '; '.join(row['warnings'] or [])}) in {row['seconds']:.0f}s")
    return row


def table(rows: Dict[str, Dict]) -> str:
    lines = ["| recipe | metric | value | baseline | margin | health | steps x batch, length | wall s |",
             "|---|---|---:|---:|---:|---|---|---:|"]
    for name, r in rows.items():
        health = "ok" if r["healthy"] else "WARN"
        lines.append(f"| {name} | {r['metric']} | {r['value']:.3f} | {r['baseline']:.3f} ({r['baseline_name']}) | "
                     f"{r['margin']:+.3f} | {health} | {r['steps']} x {r['batch']}, {r['max_seq_length']} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2-layer model, fewer steps (<= 15 min)")
    ap.add_argument("--only", default="", help="comma-separated recipe names (default: all)")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "recipes_work"), help="features and runs")
    ap.add_argument("--output", default=None, help="results json (default results/recipes[_quick].json)")
    ap.add_argument("--seeds", default="", help="comma-separated --seed values: each recipe once per seed "
                    "(rows NAME@SEED; default: the scripts' default seed, once)")
    ap.add_argument("--flags", default="", help="extra flags for every run, space-separated (e.g. "
                    "'--nolength_buckets')")
    args = ap.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()] or [None]
    if not os.path.isdir(shared_dir()):
        raise SystemExit(f"real data not available: {shared_dir()} (set SHARED_DATA)")
    mode = "quick" if args.quick else "full"
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - {r.name for r in RECIPES}
    if unknown:
        raise SystemExit(f"--only: unknown recipe(s) {sorted(unknown)}; known: {[r.name for r in RECIPES]}")
    work = os.path.abspath(args.workdir)
    config_path = os.path.join(work, mode, "config.json")
    os.makedirs(os.path.dirname(config_path), exist_ok=True)
    with open(config_path, "w") as f:
        json.dump(dict(MODELS[mode], **COMMON), f)
    t0 = time.time()
    rows = {}
    for r in RECIPES:
        if not only or r.name in only:
            for seed in seeds:
                rows[r.name + ("" if seed is None else f"@{seed}")] = run_recipe(r, work, mode, config_path, seed,
                                                                                  args.flags.split())
    total = time.time() - t0
    print(table(rows))
    result = {"mode": mode, "model": dict(MODELS[mode], **COMMON), "recipes": rows, "total_seconds": round(total, 1),
              "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
              "versions": versions(["tensorflow", "tensorflow-text", "keras"]),
              "command": "python benchmarks/recipes.py" + (" --quick" if args.quick else "")
                         + (f" --only={args.only}" if only else "") + (f" --seeds={args.seeds}" if args.seeds else "")
                         + (f" --flags='{args.flags}'" if args.flags else "")}
    if not only or args.output:
        write_json(args.output or os.path.join(RESULTS, f"recipes{'_quick' if args.quick else ''}.json"), result)
    print(json.dumps({k: {"metric": v["metric"], "value": v["value"], "baseline": v["baseline"],
                          "healthy": v["healthy"]} for k, v in rows.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
