#!/usr/bin/env python
"""Time per SST-2 epoch on real text lengths: batches padded to max_seq_length vs to their own longest example,
ours against HuggingFace PyTorch's dynamic padding, side by side in one run (XLNet-Base shape, random weights:
the cost does not depend on the values).

    python benchmarks/real_lengths.py                  # XLNet-Base, batch 32, L 128 -> results/real_lengths.json
    python benchmarks/real_lengths.py --quick          # 2 layers (a smoke run of the script)

Variants (each a fine-tuning step: forward, loss, backward, AdamW update, dropout 0.1):
* ``ours_fixed``   : the TFRecords' fixed layout, every batch [32, 128] (what every run did before);
* ``ours_dynamic`` : ``--length_buckets`` (the default): examples grouped by padded length, each batch padded to
  its longest (multiples of 8; ``data/lengths.py``);
* ``hf_dynamic``   : HF ``XLNetForSequenceClassification``, random batches padded to their longest (what
  ``Trainer`` + ``DataCollatorWithPadding`` does), the same token ids (XLNet's spiece.model);
* ``hf_grouped``   : the same with HF's ``group_by_length`` (mega-batches of 50 batches sorted by length).
Each variant times ``--batches`` batches drawn the way its epoch draws them (after 2 warm-up steps), in
interleaved rounds; the epoch time is the median seconds per batch x batches per epoch (67,349 / 32), plus, for
ours, the one-off compilation of the small XLA clusters at each padded length an epoch meets (a batch of a
length not seen before is timed apart). Tokens per batch are counted too, so a reader sees where the time goes.
Serving: each set's calls are made once untimed (every padded length compiled, dynamic vs fixed outputs
compared), then timed in interleaved repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench_util import cpu_model, versions, write_json  # noqa: E402

BASE = dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)
QUICK = dict(n_layer=2, d_model=768, n_head=12, d_head=64, d_inner=3072)


def shared_dir() -> str:
    return os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")


def sst2_ids(tok):
    """Token ids of every SST-2 train sentence, as the classifier lays them out (A <sep> <cls>), truncated."""
    from tasks.classification.registry import get_task

    task = get_task("sst-2")
    exs = task.get_examples(os.path.join(shared_dir(), "glue", "SST-2"), "train")
    return [tok.encode(ex.text_a) for ex in exs]


def ours(config, records, batch, L, dynamic, seed):
    """A step function over our training pipeline; returns (next_step() -> (seconds, tokens))."""
    from heads.classification import ClassificationHead
    from tasks.classification import features as cls_data
    from xlnet_tf import XLNetConfig
    from xlnet_tf.training import TrainConfig, Trainer
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.1, dropatt=0.1, **config)

    def dataset_fn(ctx):
        return cls_data.make_dataset(records, batch, is_training=True, seed=seed, dynamic="left" if dynamic else None)

    def model_fn():
        m = TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=1)
        return m

    trainer = Trainer(model_fn, dataset_fn, TrainConfig(learning_rate=2e-5, train_steps=10 ** 6, progress=False,
                                                       seed=seed))
    sizes = iter(dataset_fn(None))

    def step():
        width = next(sizes)["input_ids"].shape  # the same seeded pipeline: the shape the trainer sees next
        t0 = time.perf_counter()
        trainer.train(stop_at=int(trainer.step.numpy()) + 1)
        return time.perf_counter() - t0, int(width[0] * width[1]), int(width[1])

    return step


def hf(config, ids, batch, grouped, seed):
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(seed)
    hcfg = transformers.XLNetConfig(vocab_size=32000, d_model=config["d_model"], n_layer=config["n_layer"],
                                    n_head=config["n_head"], d_inner=config["d_inner"], ff_activation="gelu_new",
                                    untie_r=True, dropout=0.1, num_labels=2)
    model = transformers.XLNetForSequenceClassification(hcfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ids))
    if grouped:  # HF's LengthGroupedSampler: mega-batches of 50 batches, each sorted by length (longest first)
        mega = 50 * batch
        order = np.concatenate([sorted(order[i:i + mega], key=lambda j: -len(ids[j]))
                                for i in range(0, len(order), mega)])
    batches = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    rng.shuffle(batches) if grouped else None
    it = iter(batches)

    def step():
        rows = [ids[j] for j in next(it)]
        n = max(len(r) for r in rows)
        inp = np.zeros((len(rows), n), np.int64) + 5  # <pad>, left padding as XLNet's tokenizer
        mask = np.zeros((len(rows), n), np.int64)
        tt = np.full((len(rows), n), 4, np.int64)
        for i, r in enumerate(rows):
            inp[i, n - len(r):], mask[i, n - len(r):] = r, 1
            tt[i, n - len(r):] = [0] * (len(r) - 1) + [2]
        labels = torch.from_numpy(rng.integers(0, 2, len(rows)))
        t0 = time.perf_counter()
        out = model(input_ids=torch.from_numpy(inp), attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.from_numpy(tt), labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0, int(inp.size), None  # eager: no per-shape compilation

    return step


def serving(config, tok, sets, reps):
    """Texts/s from raw text through our export's serving function (in-graph tokenizer, batch padded to its
    longest) against the same function padding every batch to max_seq_length (the previous export)."""
    import tensorflow as tf

    from heads.classification import ClassificationHead
    from tasks.classification.serving import ClassifierServing, classification_features
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0, **config)
    model = TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=1)
    rows = {}
    for name, (texts, L) in sets.items():
        model.build_with({k: tf.zeros([1, L], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
        sv = ClassifierServing(model, tok, L, label_names=["0", "1"])
        dynamic = sv.text_fn(pair=False)
        spec = tf.TensorSpec([None], tf.string)
        fixed = tf.function(lambda t: sv._outputs(classification_features(
            sv.tokenizer.tokenize(t), None, L, sv.sep_id, sv.cls_id, length=L)), input_signature=[spec])
        for batch, n_batches in (((1, 24), (32, 3)) if L <= 128 else ((1, 8), (32, 1))):
            chunks = [tf.constant(texts[i * batch:(i + 1) * batch]) for i in range(n_batches)]
            diff = 0.0
            for c in chunks:  # warm-up: every padded length of these calls compiled once, outputs compared
                a, b = dynamic(c)["probabilities"].numpy(), fixed(c)["probabilities"].numpy()
                diff = max(diff, float(abs(a - b).max()))
            per = {"dynamic": [], "fixed": []}
            for _ in range(reps):  # interleaved
                for key, fn in (("dynamic", dynamic), ("fixed", fixed)):
                    t0 = time.perf_counter()
                    for c in chunks:
                        fn(c)
                    per[key].append(batch * n_batches / (time.perf_counter() - t0))
            rows[f"{name}, batch {batch}"] = {k: round(statistics.median(v), 2) for k, v in per.items()}
            rows[f"{name}, batch {batch}"]["max_prob_diff"] = diff
            print(f"serving {name} batch {batch}: {rows[f'{name}, batch {batch}']}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", type=int, default=8, help="timed batches per variant (after 2 warm-up steps)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max_seq_length", type=int, default=128)
    ap.add_argument("--variants", default="ours_fixed,ours_dynamic,hf_dynamic,hf_grouped")
    ap.add_argument("--serving_reps", type=int, default=3, help="interleaved repetitions of the serving timings "
                    "(0: no serving part)")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "recipes_work", "real_lengths"))
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    from tasks.classification import features as cls_data
    from tasks.classification.registry import get_task
    from xlnet_tf import XLNetTokenizer

    config = QUICK if args.quick else BASE
    tok = XLNetTokenizer(os.path.join(shared_dir(), "spiece", "spiece.model"))
    L, B = args.max_seq_length, args.batch
    records, n_train = cls_data.task_features(get_task("sst-2"), os.path.join(shared_dir(), "glue", "SST-2"), "train",
                                              tok, L, os.path.join(args.workdir, "cache"), progress=False)
    ids = [r[: L - 2] + [4, 3] for r in sst2_ids(tok)]
    makers = {"ours_fixed": lambda: ours(config, records, B, L, False, 1),
              "ours_dynamic": lambda: ours(config, records, B, L, True, 1),
              "hf_dynamic": lambda: hf(config, ids, B, False, 1), "hf_grouped": lambda: hf(config, ids, B, True, 1)}
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    steps, widths, first = {}, {v: set() for v in variants}, {v: [] for v in variants}
    for v in variants:
        steps[v] = makers[v]()
        for _ in range(2):
            steps[v]()  # warm-up: tracing, first allocations

    def timed(v):
        """The next batch of an epoch; a padded length seen for the first time compiles our small XLA clusters
        once per run (<= max_seq_length / 8 lengths an epoch): timed apart, as a per-epoch constant."""
        while True:
            sec, n, width = steps[v]()
            if width is None or width in widths[v]:
                return sec, n
            widths[v].add(width)
            first[v].append(sec)

    times = {v: [] for v in variants}
    tokens = {v: [] for v in variants}
    for _ in range(args.batches):  # interleaved rounds
        for v in variants:
            sec, n = timed(v)
            times[v].append(sec)
            tokens[v].append(n)
    per_epoch = n_train // B
    rows = {}
    for v in variants:
        med = statistics.median(times[v])
        shapes = L // 8 if v == "ours_dynamic" else (1 if v == "ours_fixed" else 0)  # lengths one epoch meets
        compile_s = (statistics.median(first[v]) - med) * shapes if first[v] else 0.0
        rows[v] = {"seconds_per_batch": round(med, 4), "mean_tokens_per_batch": round(statistics.mean(tokens[v]), 1),
                   "first_batch_of_a_length_s": [round(x, 2) for x in first[v]],
                   "epoch_minutes": round((med * per_epoch + max(compile_s, 0.0)) / 60, 1),
                   "batches_timed": args.batches}
    ref = rows.get("ours_dynamic", {}).get("seconds_per_batch")
    print(f"| variant | s / batch of {B} | padded tokens / batch | epoch (min, {per_epoch} batches) | vs ours_dynamic |")
    print("|---|---:|---:|---:|---:|")
    for v, r in rows.items():
        rel = f"{r['seconds_per_batch'] / ref:.2f}x" if ref else "-"
        print(f"| {v} | {r['seconds_per_batch']:.3f} | {r['mean_tokens_per_batch']:.0f} | {r['epoch_minutes']} | {rel} |")
    serve = {}
    if args.serving_reps:
        import csv
        import tarfile

        with open(os.path.join(shared_dir(), "glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
            sst = [r[0] for r in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]
        reviews = []
        with tarfile.open(os.path.join(shared_dir(), "imdb", "aclImdb_v1.tar.gz"), "r:*") as tar:
            for m in tar:
                if m.isfile() and "/test/pos/" in m.name and m.name.endswith(".txt"):
                    reviews.append(tar.extractfile(m).read().decode("utf-8").replace("<br />", " "))
                    if len(reviews) >= 96:
                        break
        serve = serving(config, tok, {"SST-2 dev, L 128": (sst, 128), "IMDB test, L 512": (reviews, 512)},
                        args.serving_reps)
    out = {"config": config, "batch": B, "max_seq_length": L, "train_examples": n_train, "variants": rows,
           "serving_texts_per_second": serve,
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
           "versions": versions(["tensorflow", "keras", "torch", "transformers"]),
           "command": "python benchmarks/real_lengths.py" + (" --quick" if args.quick else "")}
    write_json(os.path.join(HERE, "results", f"real_lengths{'_quick' if args.quick else ''}.json"), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
