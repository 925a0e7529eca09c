"""Pretrain XLNet with permutation language modelling (the original ``train_gpu.py``), from raw text.

    python run_pretrain.py --train_input=corpus/*.txt --train_spm --vocab_size=8000 --uncased \
      --model_config_path=small --seq_len=128 --reuse_len=64 --mem_len=96 --num_predict=21 --perm_size=64 \
      --bi_data --train_batch_size=16 --learning_rate=5e-4 --train_steps=2000 --warmup_steps=100 \
      --model_dir=OUT/train --output_dir=OUT/pretrained --heldout_input=heldout.txt --heldout_every=250

Steps: (1) SentencePiece model (``--spiece_model_file``, or trained on ``--train_input`` with ``--train_spm``);
(2) corpus -> TFRecords of raw sequences in ``--record_dir`` (``data/pretrain.py``; cached: reused while the
sources and settings are unchanged), one stream per row of the global micro-batch, grouped per replica;
(3) the one training loop (``xlnet_tf/training.py``) on ``PretrainModel`` (tied LM head, memory carried from
step to step in the model); (4) the backbone saved to ``--output_dir`` in our format (with the
SentencePiece model beside it), which ``run_classifier.py`` / ``run_squad.py`` / ``run_race.py`` accept as
``--init_checkpoint`` (tokenizer: ``--spiece_model_file=OUTPUT_DIR/spiece.model``).

Corpus format: one sentence/paragraph per line, blank lines between documents.
``--train_batch_size`` is the global batch of one update; ``--grad_accum_steps`` k splits it into k
consecutive steps of the streams (memory stays aligned). Held-out: ``--heldout_input`` is cut into
``--heldout_batch_size`` streams and scored with the same sampler and a fixed seed (identical targets and
permutations at every evaluation), memory carried; the unigram baseline is the cross-entropy of the training
corpus' unigram distribution (add-one) over the same targets.

TensorBoard (``--model_dir``): ``train/`` loss, perplexity (= exp of the logged loss window), learning_rate,
grad_norm, steps_per_sec; ``heldout/`` loss, perplexity, unigram_loss. Results: ``MODEL_DIR/pretrain_results.json``.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import shutil
import time

from absl import app, flags

import run_common

FLAGS = flags.FLAGS
# --- data
flags.DEFINE_string("train_input", None, "Training corpus: text files, comma-separated and/or globs.")
flags.DEFINE_string("record_dir", None, "Pretraining TFRecords: written here from --train_input, or read from "
                    "here when --train_input is absent (default MODEL_DIR/data).")
flags.DEFINE_string("heldout_input", None, "Held-out text files (comma-separated/globs) for the held-out PLM loss.")
flags.DEFINE_bool("train_spm", False, "Train a SentencePiece model on --train_input first (written to "
                  "--spiece_model_file if given, else MODEL_DIR/spiece.model; reused while unchanged).")
flags.DEFINE_integer("vocab_size", 32000, "Vocabulary of the SentencePiece model trained with --train_spm.")
flags.DEFINE_integer("seq_len", None, "Sequence length (default: --max_seq_length).")
flags.DEFINE_integer("reuse_len", 256, "Tokens at the start of each sequence whose hidden states become memory.")
flags.DEFINE_integer("mem_len", 384, "Memory length (0: no recurrence).")
flags.DEFINE_integer("perm_size", None, "Factorisation-order block length (default: the whole part).")
flags.DEFINE_integer("num_predict", None, "Targets per sequence (default: seq_len * mask_beta / mask_alpha).")
flags.DEFINE_float("mask_alpha", 6, "Context length (in words) per span-length unit.")
flags.DEFINE_float("mask_beta", 1, "Span length units per context.")
flags.DEFINE_integer("max_span", 5, "Longest span, in words.")
flags.DEFINE_bool("bi_data", True, "Half of each replica's batch reads the streams backwards.")
flags.DEFINE_bool("use_eod", True, "Append <eod> to every document.")
flags.DEFINE_bool("use_eop", False, "Mark paragraph (line) ends inside a document with <eop>.")
flags.DEFINE_integer("data_seed", 0, "Seed of the A/B splits (record writing) and of the target/permutation "
                     "sampler.")
flags.DEFINE_integer("heldout_batch_size", 8, "Held-out streams (rows of a held-out batch).")
flags.DEFINE_integer("heldout_steps", 50, "Held-out batches scored per evaluation (<= 0: one pass).")
flags.DEFINE_integer("heldout_every", 0, "Evaluate the held-out loss every N steps (0: at the start and end).")
flags.DEFINE_integer("heldout_seed", 1234, "Seed of the held-out sampler (fixed: the same targets every time).")
run_common.define_common_flags(default_seq_len=512, default_lr=1e-4)
FLAGS.set_default("train_steps", 100000)
FLAGS.set_default("iterations", 100)

log = logging.getLogger("run_pretrain")


def expand_inputs(spec: str):
    """Comma-separated paths and globs -> sorted-per-glob list of existing files."""
    out = []
    for part in [p.strip() for p in (spec or "").split(",") if p.strip()]:
        matches = sorted(glob.glob(part)) if any(c in part for c in "*?[") else [part]
        if not matches:
            raise FileNotFoundError(f"no file matches {part!r}")
        for p in matches:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"input file not found: {p}")
            out.append(p)
    return out


def spiece_model(F, model_dir: str, train_paths) -> str:
    """The SentencePiece model path: given, or trained (and cached) with --train_spm."""
    if not F.train_spm:
        if not F.spiece_model_file:
            raise ValueError("pass --spiece_model_file, or --train_spm (with --train_input) to train one")
        if not os.path.isfile(F.spiece_model_file):
            raise FileNotFoundError(f"--spiece_model_file not found: {F.spiece_model_file}")
        return F.spiece_model_file
    if not train_paths:
        raise ValueError("--train_spm needs --train_input")
    from xlnet_tf import spm_train

    path = F.spiece_model_file or os.path.join(model_dir, "spiece.model")
    if not path.endswith(".model"):
        raise ValueError(f"--spiece_model_file must end with .model when training one, got {path}")
    from xlnet_tf.fileutil import stat_identity

    meta = {"inputs": [stat_identity(p) for p in train_paths],
            "vocab_size": F.vocab_size, "lower": bool(F.uncased)}
    meta_path = path[:-len(".model")] + ".train.json"
    try:
        with open(meta_path, encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = None
    if cached == meta and os.path.isfile(path):
        log.info("reusing SentencePiece model %s", path)
        return path
    t0 = time.time()
    spm_train.train_spm(train_paths, path[:-len(".model")], vocab_size=F.vocab_size, lower=F.uncased,
                        quiet=True)
    run_common.write_json(meta_path, meta)
    log.info("trained SentencePiece model %s (%d pieces) in %.1fs", path, F.vocab_size, time.time() - t0)
    return path


def local_replicas(strategy) -> int:
    """Replicas fed by this host's input pipeline."""
    try:
        return len(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):  # the default strategy
        return strategy.num_replicas_in_sync


def build_config(F, tokenizer):
    from xlnet_tf.config import XLNetConfig

    run = dict(mem_len=F.mem_len, reuse_len=F.reuse_len, bi_data=F.bi_data)
    spec = F.model_config_path
    is_preset = spec and not (os.path.exists(spec) or spec.endswith(".json"))
    if is_preset:  # presets get the tokenizer's vocabulary
        run["n_token"] = tokenizer.vocab_size
    config = run_common.model_config(F, **run)
    if config.n_token < tokenizer.vocab_size:
        raise ValueError(f"model n_token={config.n_token} < the SentencePiece vocabulary ({tokenizer.vocab_size})")
    assert isinstance(config, XLNetConfig)
    return config


def heldout_dataset(files, seq_len, reuse_len, batch, sampler):
    from data.pretrain import make_pretrain_dataset

    return make_pretrain_dataset(files, seq_len, reuse_len, batch, repeat=False, **sampler)


def main(_):
    F = FLAGS
    strategy = run_common.strategy(F)  # first: logical CPU devices must exist before TF initialises
    import numpy as np
    import tensorflow as tf

    from data import pretrain as P
    from xlnet_tf import XLNetTokenizer, checkpoint
    from xlnet_tf.pretrain_model import PretrainModel, evaluate_plm, unigram_log_probs
    from xlnet_tf.training import Trainer, write_scalar

    if not F.model_dir:
        raise ValueError("--model_dir is required (training checkpoints, TensorBoard, records by default)")
    model_dir = F.model_dir
    out_dir = os.path.abspath(F.output_dir)
    record_dir = F.record_dir or os.path.join(model_dir, "data")
    for p in (model_dir, record_dir):
        ap = os.path.abspath(p)
        if ap == out_dir or ap.startswith(out_dir + os.sep):
            raise ValueError(f"--output_dir ({F.output_dir}) is replaced by the saved backbone: it must not contain "
                             f"{p}")
    os.makedirs(model_dir, exist_ok=True)
    os.makedirs(record_dir, exist_ok=True)

    seq_len = F.seq_len or F.max_seq_length
    if not 0 <= F.reuse_len <= seq_len - 5:
        raise ValueError(f"--reuse_len must be in [0, seq_len - 5], got {F.reuse_len} (seq_len {seq_len})")
    train_paths = expand_inputs(F.train_input) if F.train_input else []
    spiece = spiece_model(F, model_dir, train_paths)
    tokenizer = XLNetTokenizer(spiece, lower=F.uncased)
    config = build_config(F, tokenizer)
    data_flags = ("seq_len", "reuse_len", "perm_size", "mask_alpha", "mask_beta", "num_predict", "bi_data",
                  "max_span", "use_eod", "use_eop", "data_seed", "uncased")
    run_common.start_run(F, model_dir, "run_pretrain", "pretrain", config, tokenizer, training=True,
                         train_sources=train_paths or None,
                         data={k: getattr(F, k) for k in data_flags if hasattr(F, k)}, work_dirs=[model_dir])

    # --- batch layout: global update batch -> k micro-steps of num_streams rows -> one group per replica
    workers = max(strategy.num_replicas_in_sync // local_replicas(strategy), 1)
    replicas = local_replicas(strategy)
    k = F.grad_accum_steps
    if F.train_batch_size % (k * workers):
        raise ValueError(f"--train_batch_size={F.train_batch_size} must divide into {k} micro-steps x {workers} "
                         "worker(s)")
    num_streams = F.train_batch_size // (k * workers)
    if num_streams % replicas:
        raise ValueError(f"{num_streams} streams per micro-step do not split over {replicas} replicas")
    per_replica = num_streams // replicas
    if F.bi_data and per_replica % 2:
        raise ValueError(f"--bi_data needs an even per-replica batch, got {per_replica}")
    sampler = dict(num_predict=F.num_predict, perm_size=F.perm_size, mask_alpha=F.mask_alpha,
                   mask_beta=F.mask_beta, bi_data=F.bi_data, max_span=F.max_span, sep_id=tokenizer.sep_id,
                   cls_id=tokenizer.cls_id)

    # --- records
    prefix = os.path.join(record_dir, "train")
    if train_paths:
        files = P.create_pretrain_tfrecords(train_paths, prefix, tokenizer, seq_len, F.reuse_len, num_streams,
                                            bi_data=F.bi_data, num_groups=replicas, use_eod=F.use_eod,
                                            use_eop=F.use_eop, seed=F.data_seed, progress=F.progress)
    else:
        files = P.pretrain_files(prefix)
    with open(prefix + ".index.json", encoding="utf-8") as f:
        index = json.load(f)
    log.info("training records: %d file(s), %d steps of %d streams (%d tokens) in %s", len(files), index["steps"],
             num_streams, index["num_tokens"], record_dir)
    if index["meta"]["num_groups"] != replicas or index["meta"]["num_streams"] != num_streams:
        raise ValueError(f"{prefix}: records were written for {index['meta']['num_streams']} streams in "
                         f"{index['meta']['num_groups']} group(s); this run needs {num_streams} in {replicas} "
                         "(pass --train_input to rewrite them)")

    log.info("model: %s", config.to_dict())

    heldout_files, uni_logp = None, None
    if F.heldout_input:
        heldout_files = P.create_pretrain_tfrecords(
            expand_inputs(F.heldout_input), os.path.join(record_dir, "heldout"), tokenizer, seq_len, F.reuse_len,
            F.heldout_batch_size, bi_data=F.bi_data, num_groups=1, use_eod=F.use_eod, use_eop=F.use_eop,
            seed=F.heldout_seed, progress=F.progress)
        if train_paths:
            stream = P.encode_corpus(train_paths, tokenizer, use_eod=F.use_eod, use_eop=F.use_eop, progress=False)
            uni_logp = unigram_log_probs(stream.ids, config.n_token)

    def model_fn():
        model = PretrainModel(config, per_replica, seed=F.seed)
        if F.init_checkpoint:
            checkpoint.load_backbone_weights(model.backbone, F.init_checkpoint)
            log.info("initialised the backbone from %s", F.init_checkpoint)
        return model

    dataset_fn = P.make_train_dataset_fn(files, seq_len, F.reuse_len, per_replica, k,
                                       seed=F.data_seed, **sampler)
    trainer = Trainer(model_fn, dataset_fn, run_common.train_config(F, model_dir), strategy)
    if trainer.restored_from:
        log.info("resumed from %s", trainer.restored_from)
    model = trainer.model

    is_chief = trainer.is_chief
    heldout_writer = tf.summary.create_file_writer(os.path.join(model_dir, "heldout")) if is_chief else None
    extra_writer = tf.summary.create_file_writer(os.path.join(model_dir, "train")) if is_chief else None
    results_path = os.path.join(model_dir, "pretrain_results.json")
    previous = {}
    if trainer.restored_from and os.path.isfile(results_path):
        with open(results_path, encoding="utf-8") as f:
            previous = json.load(f)
    heldout_log = list(previous.get("heldout", []))
    history = [tuple(x) for x in previous.get("train_history", [])]

    def evaluate(step):
        if not heldout_files:
            return None
        t0 = time.time()
        ds = heldout_dataset(heldout_files, seq_len, F.reuse_len, F.heldout_batch_size,
                             dict(sampler, seed=F.heldout_seed))
        res = evaluate_plm(model, ds, F.heldout_steps if F.heldout_steps > 0 else None, uni_logp)
        res["step"] = int(step)
        heldout_log.append(res)
        log.info("held-out step %d: loss %.4f ppl %.1f over %d targets%s (%.1fs)", step, res["loss"],
                 res["perplexity"], res["tokens"],
                 f"; unigram {res['unigram_loss']:.4f}" if "unigram_loss" in res else "", time.time() - t0)
        if heldout_writer:
            with heldout_writer.as_default():
                write_scalar("loss", res["loss"], step)
                write_scalar("perplexity", res["perplexity"], step)
                if "unigram_loss" in res:
                    write_scalar("unigram_loss", res["unigram_loss"], step)
            heldout_writer.flush()
        return res

    def write_results(done: bool):
        out = {
            "step": int(trainer.step.numpy()), "done": done, "config": config.to_dict(),
            "spiece_model_file": os.path.abspath(spiece), "uncased": bool(F.uncased),
            "seq_len": seq_len, "reuse_len": F.reuse_len, "mem_len": F.mem_len, "bi_data": F.bi_data,
            "num_predict": F.num_predict or int(round(seq_len * F.mask_beta / F.mask_alpha)),
            "train_batch_size": F.train_batch_size, "per_replica_batch": per_replica, "replicas": replicas,
            "train_tokens": index["num_tokens"], "heldout": heldout_log, "train_history": history,
            "backbone_dir": out_dir if done else None,
        }
        if heldout_log:
            out["heldout_loss_start"] = heldout_log[0]["loss"]
            out["heldout_loss_end"] = heldout_log[-1]["loss"]
            if "unigram_loss" in heldout_log[-1]:
                out["unigram_loss"] = heldout_log[-1]["unigram_loss"]
        if is_chief:
            run_common.write_json(results_path, out)
        return out

    step = int(trainer.step.numpy())
    if not heldout_log or heldout_log[-1]["step"] != step:
        evaluate(step)
    every = F.heldout_every if F.heldout_every > 0 else F.train_steps
    log_steps = max(F.iterations, 1)
    while step < F.train_steps:
        stop = min((step // every + 1) * every, F.train_steps)
        result = trainer.train(stop_at=stop)
        history.extend((int(s), float(l)) for s, l in result.history)
        if extra_writer:  # perplexity of the same windows the loop logs its loss over
            with extra_writer.as_default():
                window = []
                for s, l in result.history:
                    window.append(l)
                    if s % log_steps == 0 or s == stop:
                        write_scalar("perplexity", math.exp(min(float(np.mean(window)), 700.0)), s)
                        window = []
            extra_writer.flush()
        step = int(trainer.step.numpy())
        evaluate(step)
        write_results(done=False)

    if is_chief:
        model.save_backbone(out_dir)
        shutil.copyfile(spiece, os.path.join(out_dir, "spiece.model"))
        log.info("saved the pretrained backbone to %s (with spiece.model)", out_dir)
    out = write_results(done=True)
    if is_chief:
        run_common.write_json(os.path.join(out_dir, "pretrain_results.json"),
                              {k: v for k, v in out.items() if k != "train_history"})
    summary = {k: out[k] for k in ("step", "heldout_loss_start", "heldout_loss_end", "unigram_loss") if k in out}
    print(json.dumps(summary))


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(run_common.main_wrapper(main))
