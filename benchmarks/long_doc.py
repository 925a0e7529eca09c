"""Long documents on the real IMDB data: truncation vs memory (accuracy), and memory mode's cost vs length.

    python benchmarks/long_doc.py            # ~20 min on 2 quiet cores
    python benchmarks/long_doc.py --quick    # ~10 min: a smoke run of the pipeline (100 steps: neither model
                                             # has learned much yet), no truncation at 512

Part 1, accuracy: the same small model (random init, ``--n_layer`` (2) x d_model 128, the real XLNet spiece.model),
the same budget (steps, batch, learning rate, seed, training documents), trained and evaluated by
``run_classifier.py`` on IMDB (``../shared/data/imdb``; a random subset of the test set as dev) with
``--long_doc_mode=truncate --max_seq_length=128``, ``--long_doc_mode=memory --max_seq_length=128
--max_segments=8`` and ``truncate --max_seq_length=512``.

Part 2, cost: one document of 512, 2,048 and 8,192 pieces (real reviews joined) through the memory-mode model
(windows of 128, inference), each length in its own process: median seconds of ``--reps`` calls and the peak
RSS growth over the process's RSS after building the model. Truncation (one window of the whole length) is
measured at 512 and 2,048 and its 8,192 cost estimated (not run): its attention holds [n_head, L, L] score
tensors.

Prints a table and writes benchmarks/results/long_doc.json (``--quick``: long_doc_quick.json).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import cpu_model, write_json  # noqa: E402

SHARED = os.environ.get("SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
SPIECE = os.path.join(SHARED, "spiece", "spiece.model")
IMDB = os.path.join(SHARED, "imdb", "aclImdb_v1.tar.gz")


def model_config(n_layer):
    return {"n_layer": n_layer, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512, "ff_activation": "gelu",
            "untie_r": True, "n_token": 32000}


# ------------------------------------------------------------------------------------------- part 1: accuracy
def write_slices(work, train_docs, eval_docs, seed=0):
    from xlnet_tf.tasks.classification.registry import get_task

    task = get_task("imdb")
    train = task.get_examples(IMDB, "train")
    test = task.get_examples(IMDB, "test")
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(test)
    train, test = train[:train_docs], test[:eval_docs]
    for split, exs in (("train", train), ("dev", test)):
        with open(os.path.join(work, f"{split}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for ex in exs:
                w.writerow([ex.text_a, ex.label])
    from xlnet_tf import XLNetTokenizer
    from xlnet_tf.tasks.classification.features import encode_many

    lengths = sorted(len(x) + 2 for x in encode_many(XLNetTokenizer(SPIECE), [ex.text_a for ex in test]))
    pct = lambda q: lengths[min(int(q * len(lengths)), len(lengths) - 1)]  # noqa: E731
    return {"eval_docs": len(test), "train_docs": len(train), "pieces_median": pct(0.5), "pieces_p90": pct(0.9),
            "share_over_128": sum(n > 128 for n in lengths) / len(lengths),
            "share_over_1024": sum(n > 1024 for n in lengths) / len(lengths)}


def run_variant(work, name, args, common):
    out = os.path.join(work, name)
    cmd = [sys.executable, os.path.join(ROOT, "run_classifier.py"), "--task=generic", f"--data_dir={work}",
           f"--output_dir={out}", "--do_train", "--do_eval", "--progress=false", "--overwrite_output_dir"]
    cmd += common + args
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
    m = re.search(r"trained (\d+) steps in ([0-9.]+)s", r.stderr)
    res = json.load(open(os.path.join(out, "eval_results.json")))
    return {"variant": name, "args": args, "accuracy": res["accuracy"], "eval_loss": res["loss"],
            "train_seconds": float(m.group(2)) if m else None, "wall_seconds": round(time.time() - t0, 1)}


# ------------------------------------------------------------------------------------------- part 2: cost
def scale_worker(length, mode, n_layer, mem_len, reps):
    """In its own process: seconds per document (median of reps) and peak RSS growth, as json on stdout."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    import numpy as np
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf import XLNetConfig, XLNetTokenizer
    from xlnet_tf.task_model import TaskModel

    tok = XLNetTokenizer(SPIECE)
    from xlnet_tf.tasks.classification.registry import get_task

    exs = get_task("imdb").get_examples(IMDB, "test")[:400]
    ids = []
    for ex in exs:
        ids += tok.encode(ex.text_a)
        if len(ids) >= length:
            break
    ids = ids[: length - 2]
    memory = mode == "memory"
    cfg = XLNetConfig.from_dict(dict(model_config(n_layer), mem_len=mem_len if memory else 0, dropout=0.0,
                                     dropatt=0.0))
    model = TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=1)
    if memory:
        windows = F.build_windows(ids, 128, tok.sep_id, tok.cls_id)
        w = F.right_align(windows, len(windows["input_ids"]))
        w = {k: np.asarray(v, np.int32)[None] for k, v in w.items()}
        model.build_with({k: (v[:, -2:] if v.ndim == 3 else v) for k, v in w.items()})
        feats = w
        spec = {k: tf.TensorSpec([1, None, 128] if v.ndim == 3 else [1], tf.int32) for k, v in w.items()}
    else:
        f = F.build_features(ids, None, length, tok.sep_id, tok.cls_id)
        feats = {k: np.asarray(v, np.int32)[None] for k, v in f.items()}
        model.build_with({k: v[:, -128:] for k, v in feats.items()})
        spec = {k: tf.TensorSpec([1, None], tf.int32) for k in feats}
    fn = tf.function(lambda f: model(f, training=False)["logits"], input_signature=[spec])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn(feats)  # trace
    fn(feats)  # warm (oneDNN primitives)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(feats).numpy()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"length": length, "mode": mode, "seconds": statistics.median(times), "reps": reps,
                      "peak_rss_growth_mb": round((peak - base) / 1024, 1), "peak_rss_mb": round(peak / 1024, 1)}))


def measure(length, mode, n_layer, mem_len, reps):
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", f"{mode}:{length}", f"--n_layer={n_layer}",
           f"--mem_len={mem_len}", f"--reps={reps}"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if r.returncode:
        raise SystemExit(f"worker {mode}:{length} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def truncation_estimate(n_layer, length=8192, n_head=4, d_model=128):
    """What one window of ``length`` would hold at its peak (inference): the attention's score tensors."""
    scores = n_head * length * length * 4  # one float32 [n_head, L, L] tensor
    return {"length": length, "one_score_tensor_gb": scores / 2 ** 30,
            "live_score_tensors_gb": 4 * scores / 2 ** 30,  # AC, BD (and its relative-shift input), softmax
            "base_12_heads_live_gb": 4 * 12 * length * length * 4 / 2 ** 30}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="training steps (default 300; quick 100)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--train_docs", type=int, default=None, help="default 10000 (quick 3200)")
    p.add_argument("--eval_docs", type=int, default=None, help="default 1000 (quick 400)")
    p.add_argument("--mem_len", type=int, default=384)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--skip_accuracy", action="store_true")
    p.add_argument("--skip_cost", action="store_true")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._worker:
        mode, length = a._worker.split(":")
        return scale_worker(int(length), mode, a.n_layer, a.mem_len, a.reps)
    for path in (SPIECE, IMDB):
        if not os.path.exists(path):
            raise SystemExit(f"missing {path}")
    steps = a.steps or (100 if a.quick else 300)
    train_docs = a.train_docs or (3200 if a.quick else 10000)
    eval_docs = a.eval_docs or (400 if a.quick else 1000)
    result = {"machine": cpu_model(), "cores": os.cpu_count(), "n_layer": a.n_layer, "d_model": 128,
              "steps": steps, "batch": a.batch, "mem_len": a.mem_len, "quick": a.quick,
              "command": "python benchmarks/long_doc.py" + (" --quick" if a.quick else "")}
    if not a.skip_accuracy:
        with tempfile.TemporaryDirectory(prefix="long_doc_") as work:
            result["data"] = write_slices(work, train_docs, eval_docs)
            cfg = os.path.join(work, "config.json")
            json.dump(model_config(a.n_layer), open(cfg, "w"))
            common = [f"--model_config_path={cfg}", f"--spiece_model_file={SPIECE}", f"--train_steps={steps}",
                      f"--warmup_steps={steps // 10}", "--learning_rate=5e-4", f"--train_batch_size={a.batch}",
                      "--eval_batch_size=32", f"--save_steps={steps}", "--seed=42"]
            variants = [("truncate-128", ["--long_doc_mode=truncate", "--max_seq_length=128"]),
                        ("memory-8x128", ["--long_doc_mode=memory", "--max_seq_length=128", "--max_segments=8",
                                          f"--mem_len={a.mem_len}"])]
            if not a.quick:
                variants.append(("truncate-512", ["--long_doc_mode=truncate", "--max_seq_length=512"]))
            result["accuracy"] = []
            for name, args in variants:
                row = run_variant(work, name, args, common)
                print(json.dumps(row), flush=True)
                result["accuracy"].append(row)
    if not a.skip_cost:
        rows = [measure(n, "memory", a.n_layer, a.mem_len, a.reps) for n in (512, 2048, 8192)]
        rows += [measure(n, "truncate", a.n_layer, a.mem_len, a.reps) for n in (512, 2048)]
        result["cost"] = rows
        result["truncate_8192_estimate"] = truncation_estimate(a.n_layer)
        t512, t2048 = (r["seconds"] for r in rows[3:5])
        # seconds = b L + c L^2 through the two measured points, extrapolated to 8192
        c = (t2048 / 2048 - t512 / 512) / (2048 - 512)
        b = t512 / 512 - c * 512
        result["truncate_8192_estimate"]["seconds_extrapolated"] = b * 8192 + c * 8192 ** 2
    print_table(result)
    write_json(os.path.join(ROOT, "benchmarks", "results", "long_doc_quick.json" if a.quick else "long_doc.json"),
               result)


def print_table(r):
    if "accuracy" in r:
        d = r["data"]
        print(f"\nIMDB: {d['train_docs']} train docs, {d['eval_docs']} test docs as dev; pieces per test doc: "
              f"median {d['pieces_median']}, p90 {d['pieces_p90']}; {100 * d['share_over_128']:.0f}% > 128, "
              f"{100 * d['share_over_1024']:.0f}% > 1024")
        print(f"{'variant':<14} {'accuracy':>9} {'train s':>8} {'wall s':>7}   ({r['steps']} steps x {r['batch']})")
        for row in r["accuracy"]:
            print(f"{row['variant']:<14} {row['accuracy']:>9.4f} {row['train_seconds'] or 0:>8.1f} "
                  f"{row['wall_seconds']:>7.1f}")
    if "cost" in r:
        print(f"\n{'mode':<9} {'pieces':>6} {'s/doc':>7} {'peak RSS growth MB':>19}")
        for row in r["cost"]:
            print(f"{row['mode']:<9} {row['length']:>6} {row['seconds']:>7.3f} {row['peak_rss_growth_mb']:>19.1f}")
        e = r["truncate_8192_estimate"]
        print(f"truncate   8192 (estimate, not run): ~{e['seconds_extrapolated']:.1f} s, score tensors "
              f"{e['live_score_tensors_gb']:.1f} GB live per layer (XLNet-Base: {e['base_12_heads_live_gb']:.1f} GB)")


if __name__ == "__main__":
    main()
