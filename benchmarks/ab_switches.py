#!/usr/bin/env python
"""A/B of the model's run options on the XLNet-Base backbone, interleaved in ONE process.

Each variant is a comma list of ``config.NAME=VALUE`` settings of the model's run options (``XLNetConfig``), for
example ``config.accelerate=xla+chunks`` (every acceleration but the kernels: names joined by ``+``),
``config.accelerate=0`` (the plain ops) or ``config.pos_dropout=shared``; ``base`` = no change. The options are
read when a function is traced, so every variant gets its own ``tf.function``, traced with its settings in
place and timed with them restored: all variants share one model, one process and one machine state, and their
timed repetitions take turns (rep 1 of every variant, then rep 2, ...). This resolves differences of a few
percent that separate processes on a shared VM cannot. Medians are reported; the first variant is the
reference.

* ``--mode infer``: forward, ``training=False`` (no dropout);
* ``--mode train``: forward + backward to every weight the forward uses (loss = mean(h^2), dropout 0.1), no
  optimizer update (see ``backbone.py`` for the full step).
* ``--mode pretrain``: the same with both streams, as in pretraining: a random factorisation order per row
  (perm_mask) and seq * 85 / 512 predicted positions (target_mapping); loss = mean(h^2) + mean(g^2).

    python benchmarks/ab_switches.py --mode train --shape 8x128 config.accelerate=kernels+chunks base
    python benchmarks/ab_switches.py --mode infer --shape 2x512 config.accelerate=xla+kernels base --reps 9
    python benchmarks/ab_switches.py --mode pretrain --shape 2x512 config.accelerate=xla+chunks base --reps 5
    python benchmarks/ab_switches.py --mode train --shape 8x128 base config.pos_dropout=shared
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from backbone import BASE, _inputs  # noqa: E402
from bench_util import cpu_model, versions, write_json  # noqa: E402


def parse_variant(text: str):
    """'A=1,B=0' -> [('A', '1'), ('B', '0')]; 'base' -> []."""
    if text == "base":
        return []
    out = []
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"variant {text!r}: expected NAME=VALUE[,NAME=VALUE] or 'base', got {item!r}")
        out.append((name, value))
    return out


def option_value(old, text: str):
    """A run option's value from the command line, typed as its current value (accelerate: names joined by +)."""
    if text.lower() in ("0", "1", "true", "false") and isinstance(old, bool):
        return text.lower() in ("1", "true")
    if isinstance(old, bool):  # accelerate: a list of names
        return text.replace("+", ",")
    return type(old)(text)


def _two_stream(batch: int, seq: int, seed: int = 0):
    """perm_mask from a random factorisation order per row and target_mapping of seq * 85 / 512 positions."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    n_predict = max(1, round(seq * 85 / 512))
    perm = np.zeros((batch, seq, seq), np.float32)
    tm = np.zeros((batch, n_predict, seq), np.float32)
    for i in range(batch):
        rank = np.argsort(rng.permutation(seq))
        perm[i] = rank[None, :] >= rank[:, None]  # i may not attend to j unless j comes earlier in the order
        tm[i, np.arange(n_predict), rng.choice(seq, n_predict, replace=False)] = 1.0
    return {"perm_mask": tf.constant(perm), "target_mapping": tf.constant(tm)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="config.NAME=VALUE[,config.NAME=VALUE] run options, or 'base'")
    p.add_argument("--mode", choices=("infer", "train", "pretrain"), default="infer")
    p.add_argument("--shape", default="8x128", help="batch x seq")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--n-layer", type=int, default=BASE["n_layer"])
    p.add_argument("--out", default=os.path.join(HERE, "results", "ab_switches.json"))
    args = p.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    batch, seq = (int(v) for v in args.shape.split("x"))

    import keras
    import tensorflow as tf

    from xlnet_tf import XLNetConfig
    from xlnet_tf.modeling import XLNetModel

    holders = {}  # "config" -> the model's config, once the model exists

    def known(name):
        return name.startswith("config.") and hasattr(XLNetConfig, name[7:])

    for v in args.variants:
        for name, _ in parse_variant(v):
            if not known(name):
                raise SystemExit(f"variant {v!r}: {name!r} is not a run option (config.NAME of XLNetConfig)")
    train = args.mode in ("train", "pretrain")
    rate = 0.1 if train else 0.0
    cfg = XLNetConfig(**dict(BASE, n_layer=args.n_layer), ff_activation="gelu", untie_r=True, dropout=rate,
                      dropatt=rate)
    keras.utils.set_random_seed(0)
    model = XLNetModel(cfg, seed=0)
    holders["config"] = model.config
    ids, seg, mask = (tf.constant(x, tf.int32) for x in _inputs(batch, seq, cfg.n_token))
    two_stream = _two_stream(batch, seq) if args.mode == "pretrain" else {}
    unused = {id(model.lm_bias)} | (set() if two_stream else {id(model.mask_emb)})
    tvars = [v for v in model.trainable_variables if id(v) not in unused]

    def make(settings):
        @tf.function
        def step():
            if not train:
                return model(ids, segment_ids=seg, padding_mask=mask, training=False)["sequence_output"]
            with tf.GradientTape() as tape:
                out = model(ids, segment_ids=seg, padding_mask=mask, training=True, **two_stream)
                loss = tf.reduce_mean(tf.square(out["sequence_output"]))
                if two_stream:
                    loss += tf.reduce_mean(tf.square(out["query_output"]))
            grads = tape.gradient(loss, tvars)
            # every gradient is an output, so none of the backward is pruned
            return tf.stack([tf.reduce_sum(tf.square(tf.convert_to_tensor(g))) for g in grads])

        config = holders["config"]
        saved = {name[7:]: getattr(config, name[7:]) for name, _ in settings}
        try:
            for name, value in settings:
                setattr(config, name[7:], option_value(saved[name[7:]], value))
            config.accelerations  # noqa: B018  (checks the names)
            model.dropout_seed.assign([0, 0])
            out = step().numpy()  # traced (and warmed) with the settings in place
        finally:
            for key, old in saved.items():
                setattr(config, key, old)
        return step, out

    fns, outs = {}, {}
    for v in args.variants:
        fns[v], outs[v] = make(parse_variant(v))
    ref = args.variants[0]
    for v in args.variants:
        fns[v]()
    times = {v: [] for v in args.variants}
    for _ in range(args.reps):
        for v in args.variants:
            model.dropout_seed.assign([0, 0])
            t = time.perf_counter()
            fns[v]().numpy()
            times[v].append(time.perf_counter() - t)
    rows = []
    print(f"{args.mode} {args.shape}, {args.reps} interleaved reps, {cpu_model()}, load {os.getloadavg()[0]:.2f}")
    print(f"{'variant':34s} {'median ms':>9s} {'tok/s':>7s} {'vs first':>8s} {'max |diff| vs first':>20s}")
    for v in args.variants:
        med = statistics.median(times[v])
        diff = float(abs(outs[v] - outs[ref]).max())
        rel = statistics.median(times[ref]) / med
        rows.append({"variant": v, "median_s": med, "times_s": times[v], "tokens_per_s": batch * seq / med,
                     "speed_vs_first": rel, "max_abs_diff_vs_first": diff})
        print(f"{v:34s} {med * 1e3:9.0f} {batch * seq / med:7.0f} {rel:7.3f}x {diff:20.3g}")
    result = {"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "mode": args.mode,
              "shape": args.shape, "reps": args.reps, "cpu_model": cpu_model(), "nproc": os.cpu_count(),
              "versions": versions(("tensorflow", "keras")), "rows": rows,
              "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(args.out, result)


if __name__ == "__main__":
    main()
