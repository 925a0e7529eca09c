#!/usr/bin/env python
"""Export's traces, A/B: an XLNet-Base classifier (random weights, L 128) exported by ``ClassifierServing`` twice in
one process, once with an older checkout's ``run_in_groups`` (argv[2]) and once with this one's; export seconds,
then both SavedModels served from raw SST-2 dev sentences, interleaved (REPS passes of N texts at batch 1 and 32):
the largest output difference and texts/s medians.

    python benchmarks/export_trace_ab.py export OLD_CHECKOUT /tmp/ab/e     # writes /tmp/ab/e_old, /tmp/ab/e_new
    REPS=9 N=96 python benchmarks/export_trace_ab.py serve /tmp/ab/e_old /tmp/ab/e_new

PERFORMANCE.md "Evaluation and export: one trace" holds the figures."""
import os, sys, time, statistics, importlib.util  # noqa: E401
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import shared_dir  # noqa: E402

SHARED = shared_dir()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MODE = sys.argv[1]
if MODE == "export":
    sys.path.insert(0, ROOT)
    import tensorflow as tf
    import xlnet_tf.export as ex
    from xlnet_tf import XLNetConfig, XLNetTokenizer
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.task_model import TaskModel
    from xlnet_tf.tasks.classification.serving import ClassifierServing
    x = XLNetConfig(n_token=32000, ff_activation="gelu", untie_r=True, dropout=0.0, dropatt=0.0,
                    n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072)
    m = TaskModel(x, ClassificationHead(x.d_model, 2, n_head=x.n_head, d_head=x.d_head), seed=1)
    m.build_with({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    tok = XLNetTokenizer(os.path.join(SHARED, "spiece", "spiece.model"))
    spec = importlib.util.spec_from_file_location("old_export", os.path.join(sys.argv[2], "xlnet_tf", "export.py"))
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    new_run = ex.run_in_groups
    for name, run in (("old", old.run_in_groups), ("new", new_run)):
        ex.run_in_groups = run
        t = time.time()
        ClassifierServing(m, tok, 128).export(f"{sys.argv[3]}_{name}")
        print(f"{name} export seconds {time.time() - t:.1f}")
else:
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the exports' tokenizer ops)
    fa = tf.saved_model.load(sys.argv[2]).signatures["serving_default"]
    fb = tf.saved_model.load(sys.argv[3]).signatures["serving_default"]
    lines = open(os.path.join(SHARED, "glue", "SST-2", "dev.tsv"), encoding="utf-8").read().splitlines()[1:]
    texts = [ln.rsplit("\t", 1)[0] for ln in lines][:int(os.environ.get("N", 96))]
    for f in (fa, fb):
        f(text_a=tf.constant(texts[:1]))
        f(text_a=tf.constant(texts[:32]))
    ra, rb = fa(text_a=tf.constant(texts[:32])), fb(text_a=tf.constant(texts[:32]))
    print("largest output difference", max(float(np.abs(ra[k].numpy() - rb[k].numpy()).max())
                                           for k in ra if ra[k].dtype.is_floating))
    for batch in (1, 32):
        ta, tb = [], []
        for rep in range(int(os.environ.get("REPS", 3))):
            for f, acc in ((fa, ta), (fb, tb)) if rep % 2 == 0 else ((fb, tb), (fa, ta)):
                t = time.perf_counter()
                for i in range(0, len(texts), batch):
                    f(text_a=tf.constant(texts[i:i + batch]))
                acc.append(len(texts) / (time.perf_counter() - t))
        print(f"batch {batch}: old {statistics.median(ta):.2f} texts/s, new {statistics.median(tb):.2f} texts/s")
