"""SQuAD preprocessing speed (examples -> TFRecord) and the alignment / windowing ceilings.

    python benchmarks/squad_preprocess.py [--data dev-v2.0.json] [--workers 2] [--no-quality]

Speed, on one file (default: SQuAD v2.0 dev, 11,873 questions), read + features + TFRecord write:
  * ours: each paragraph tokenised once for all its questions, ``--workers`` processes;
  * ours, 1 process;
  * naive: one example at a time, the context tokenised for every question, 1 process.
"features only" rows time the same without writing (the TFRecord serialisation is ``tfrecord_io``'s).
Quality, on dev v1.1 and v2.0: gold answers that do not survive the char -> piece -> char round trip
(official normalisation), and the EM/F1 of oracle head outputs through windows + post-processing (the
ceiling), also with the original's last-paragraph-token off-by-one. Prints a table, writes
benchmarks/results/squad_preprocess.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xlnet_tf.tasks.squad import features as squad_data  # noqa: E402
from xlnet_tf.data import tfrecord_io  # noqa: E402
from xlnet_tf.tasks.squad import reader as squad_task  # noqa: E402
from xlnet_tf.tasks.squad import metrics as squad_eval
from xlnet_tf.tasks.squad import postprocess as squad_postprocess  # noqa: E402
from xlnet_tf.tokenizer import XLNetTokenizer  # noqa: E402

SHARED = os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def speed(path: str, tok: XLNetTokenizer, workers: int, tmp: str, naive: bool = True) -> list:
    examples, t_read = _timed(lambda: squad_task.read_squad(path))
    n = len(examples)
    spec = squad_data.squad_feature_spec(512)
    rows = []

    def add(name, procs, seconds, features):
        rows.append({"pipeline": name, "workers": procs, "seconds": round(seconds, 3),
                     "examples_per_s": round(n / seconds, 1), "features": features})

    def features_only(num_workers, per_question=False):
        idx = squad_data.SquadFeatureIndex()
        return sum(1 for _ in squad_data.iter_squad_features(examples, tok, idx, num_workers=num_workers,
                                                             per_question=per_question))

    for procs in sorted({workers, 1}, reverse=True):
        out = os.path.join(tmp, f"ours{procs}.tfrecord")
        idx, sec = _timed(lambda: squad_data.write_squad_features(examples, out, tok, num_workers=procs,
                                                                  progress=False))
        add("ours: read + features + TFRecord", procs, sec + t_read, len(idx.features))
        f, sec = _timed(lambda: features_only(procs))
        add("ours: features only", procs, sec, f)
    if naive:
        def naive_write():
            idx = squad_data.SquadFeatureIndex()
            recs = squad_data.iter_squad_features(examples, tok, idx, num_workers=1, per_question=True)
            return tfrecord_io.write_tfrecords(os.path.join(tmp, "naive.tfrecord"), recs, spec, progress=False)
        f, sec = _timed(naive_write)
        add("naive: read + features + TFRecord", 1, sec + t_read, f)
        f, sec = _timed(lambda: features_only(1, per_question=True))
        add("naive: features only", 1, sec, f)
    return rows


def quality(path: str, tok: XLNetTokenizer) -> dict:
    examples, version = squad_task.read_squad_with_version(path)
    checked, failures = squad_data.answer_mapping_failures(examples, tok)
    records, index = squad_data.build_squad_features(examples, tok)
    results = squad_postprocess.oracle_results(records, index, [e.is_impossible for e in examples])
    dataset = squad_task.load_dataset(path)
    out = {"file": os.path.basename(path), "version": version, "questions": len(examples),
           "features": len(records), "answers_checked": checked, "answers_not_exact": len(failures),
           "examples_not_exact": failures[:30]}
    for key, allow in (("oracle_last_token_allowed", True), ("oracle", False)):
        preds = squad_postprocess.postprocess(index, results, allow_last_paragraph_token=allow)
        scores = squad_eval.evaluate(dataset, preds.predictions, preds.null_odds if version == "2.0" else None)
        out[key] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in scores.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(SHARED, "squad", "dev-v2.0.json"))
    p.add_argument("--spiece", default=os.path.join(SHARED, "spiece", "spiece.model"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-naive", action="store_true")
    p.add_argument("--no-quality", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "squad_preprocess.json"))
    a = p.parse_args()
    for f in (a.data, a.spiece):
        if not os.path.isfile(f):
            sys.exit(f"missing {f} (set SHARED_DATA or pass --data/--spiece)")
    tok = XLNetTokenizer(a.spiece)
    with tempfile.TemporaryDirectory() as tmp:
        rows = speed(a.data, tok, a.workers, tmp, naive=not a.no_naive)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"\nSQuAD preprocessing, {os.path.basename(a.data)} ({os.cpu_count()} CPUs, load average {load})")
    print(f"{'pipeline':<36} {'workers':>7} {'seconds':>8} {'examples/s':>11} {'features':>9}")
    for r in rows:
        print(f"{r['pipeline']:<36} {r['workers']:>7} {r['seconds']:>8.2f} {r['examples_per_s']:>11.0f} "
              f"{r['features']:>9}")
    report = {"data": os.path.basename(a.data), "cpus": os.cpu_count(), "load_average_1min": load,
              "python": platform.python_version(),
              "speed": rows, "quality": []}
    if not a.no_quality:
        for name in ("dev-v1.1.json", "dev-v2.0.json"):
            path = os.path.join(os.path.dirname(a.data), name)
            if not os.path.isfile(path):
                continue
            q = quality(path, tok)
            report["quality"].append(q)
            print(f"\n{name}: {q['questions']} questions -> {q['features']} features; answers not exact after "
                  f"char->piece->char: {q['answers_not_exact']} of {q['answers_checked']}")
            for qid, gold, got in q["examples_not_exact"][:8]:
                print(f"   {qid}: gold {gold!r} -> {got!r}")
            for key in ("oracle", "oracle_last_token_allowed"):
                s = q[key]
                main_keys = ("exact_match", "f1") if "exact_match" in s else ("exact", "f1", "HasAns_exact",
                                                                               "HasAns_f1", "best_f1")
                print(f"  {key:<28} " + "  ".join(f"{k} {s[k]:.3f}" for k in main_keys))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    tmp_out = f"{a.out}.tmp-{os.getpid()}"
    with open(tmp_out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    os.replace(tmp_out, a.out)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
