#!/usr/bin/env python
"""Evaluation's traces: SST-2 dev (872 sentences, first 128 pieces) through ``xlnet_tf.training.predict``, XLNet-Base
random weights, batches of 32 each padded to its own longest row: seconds and how often the model was traced.

    python benchmarks/eval_traces.py .          # argv[1]: the checkout whose xlnet_tf to time (an older one: A/B)

Prints one line; PERFORMANCE.md "Evaluation and export: one trace" holds the figures."""
import os, sys, time  # noqa: E401
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
from xlnet_tf import XLNetConfig, XLNetTokenizer, training
from xlnet_tf.task_model import TaskModel
from xlnet_tf.heads.classification import ClassificationHead
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import shared_dir  # noqa: E402
print("training from", training.__file__)
SHARED = shared_dir()
tok = XLNetTokenizer(os.path.join(SHARED, "spiece", "spiece.model"))
lines = open(os.path.join(SHARED, "glue", "SST-2", "dev.tsv")).read().splitlines()[1:]
ids = [tok.encode(l.rsplit("\t", 1)[0])[:126] + [tok.sep_id, tok.cls_id] for l in lines]
def gen():
    for r in ids:
        yield {"input_ids": np.array(r, np.int32), "segment_ids": np.zeros(len(r), np.int32), "padding_mask": np.zeros(len(r), np.float32)}
spec = {k: tf.TensorSpec([None], d) for k, d in (("input_ids", tf.int32), ("segment_ids", tf.int32), ("padding_mask", tf.float32))}
ds = tf.data.Dataset.from_generator(gen, output_signature=spec).padded_batch(32, padding_values={"input_ids": 0, "segment_ids": 4, "padding_mask": 1.0})
x = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0, n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)
m = TaskModel(x, ClassificationHead(x.d_model, 2, n_head=x.n_head, d_head=x.d_head), seed=1)
m.build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
shapes = sorted({int(b["input_ids"].shape[1]) for b in ds})
calls = []
orig = m.call
def counted(*a, **k):
    calls.append(1); return orig(*a, **k)
m.call = counted
t = time.time()
out = training.predict(m, ds, output_fn=lambda f, o: {"logits": o["logits"]})
print(f"{len(ids)} sentences, {len(shapes)} distinct batch lengths; predict {time.time() - t:.1f} s, model traced {len(calls)} time(s); logits {out['logits'].shape}")
