#!/usr/bin/env python
"""In-graph (tensorflow-text) vs Python (``sentencepiece``) tokenizer over a large real sample: how many strings
get different ids, and where.

Sample (from ``$SHARED_DATA``, default ../shared/data): every SST-2 train and dev sentence, every SQuAD v1.1 dev
context and question, the first ``--race`` RACE articles with their questions, and WikiText-2 valid's non-empty
lines. Both tokenizers use XLNet's spiece.model with the default options (cased, accents stripped); the in-graph
one runs in batches of 512. Prints the counts, the first differences (pieces around the first mismatch) and
writes JSON.

    python benchmarks/tokenizer_parity.py                  # -> benchmarks/results/tokenizer_parity.json
    python benchmarks/tokenizer_parity.py --race 200 --out /tmp/parity.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from bench_util import versions, write_json  # noqa: E402


def real_texts(shared: str, race_articles: int):
    """(source, text) pairs of the sample described above."""
    out = []
    for name in ("train.tsv", "dev.tsv"):
        with open(os.path.join(shared, "glue", "SST-2", name), encoding="utf-8") as f:
            out += [("sst2", line.split("\t")[0]) for line in f.read().splitlines()[1:]]
    with open(os.path.join(shared, "squad", "dev-v1.1.json"), encoding="utf-8") as f:
        squad = json.load(f)
    for article in squad["data"]:
        for p in article["paragraphs"]:
            out.append(("squad_context", p["context"]))
            out += [("squad_question", q["question"]) for q in p["qas"]]
    with tarfile.open(os.path.join(shared, "race", "RACE.tar.gz")) as tar:
        n = 0
        for member in tar:
            if n >= race_articles:
                break
            if member.isfile() and member.name.endswith(".txt"):
                doc = json.load(tar.extractfile(member))
                out.append(("race_article", doc["article"]))
                out += [("race_question", q) for q in doc["questions"]]
                n += 1
    with open(os.path.join(shared, "text", "wikitext2-valid.tokens"), encoding="utf-8") as f:
        out += [("wikitext2", line) for line in f.read().splitlines() if line.strip()]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", default=os.environ.get("SHARED_DATA", os.path.join(ROOT, "..", "shared", "data")))
    p.add_argument("--race", type=int, default=2000, help="RACE articles to include")
    p.add_argument("--out", default=os.path.join(HERE, "results", "tokenizer_parity.json"))
    args = p.parse_args(argv)
    spiece = os.path.join(args.shared, "spiece", "spiece.model")
    if not os.path.isfile(spiece):
        raise SystemExit(f"spiece.model not found at {spiece} (set --shared or SHARED_DATA)")

    import sentencepiece
    import tensorflow as tf
    from xlnet_tf import XLNetTokenizer

    t0 = time.time()
    sample = real_texts(args.shared, args.race)
    py = XLNetTokenizer(spiece)
    tt = py.tf_tokenizer()
    diffs = []
    for start in range(0, len(sample), 512):
        batch = sample[start:start + 512]
        got = tt.tokenize(tf.constant([t for _, t in batch])).to_list()
        diffs += [(src, t) for (src, t), g in zip(batch, got) if g != py.encode(t)]
    by_source = {}
    for src, _ in sample:
        by_source.setdefault(src, [0, 0])[0] += 1
    for src, _ in diffs:
        by_source[src][1] += 1
    examples = []
    for src, text in diffs[:10]:
        ours = [x.decode("utf-8") for x in tt.tokenize_to_pieces([text]).to_list()[0]]
        theirs = py.tokenize(text)
        i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        examples.append({"source": src, "in_graph": ours[max(0, i - 2):i + 3], "python": theirs[max(0, i - 2):i + 3]})
    result = {"strings": len(sample), "differ": len(diffs), "by_source": by_source,
              "sentencepiece": sentencepiece.__version__, "tensorflow": tf.__version__,
              "tensorflow_text": versions(("tensorflow-text",))["tensorflow-text"], "seconds": round(time.time() - t0, 1),
              "examples": examples}
    print(f"{'source':<16}{'strings':>9}{'differ':>8}")
    for src, (n, d) in by_source.items():
        print(f"{src:<16}{n:>9}{d:>8}")
    print(f"{'all':<16}{len(sample):>9}{len(diffs):>8}   (sentencepiece {result['sentencepiece']}, "
          f"tensorflow-text {result['tensorflow_text']}, {result['seconds']} s)")
    for e in examples:
        print(f"  {e['source']}: in-graph {e['in_graph']} vs python {e['python']}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
