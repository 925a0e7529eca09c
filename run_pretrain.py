r"""Pretrain XLNet with permutation language modelling (the original ``train_gpu.py``), from raw text.

    python run_pretrain.py --train_input=corpus/*.txt --train_spm --vocab_size=8000 --uncased \
      --model_config_path=small --seq_len=128 --reuse_len=64 --mem_len=96 --num_predict=21 --perm_size=64 \
      --bi_data --train_batch_size=16 --learning_rate=5e-4 --train_steps=2000 --warmup_steps=100 \
      --model_dir=OUT/train --output_dir=OUT/pretrained --heldout_input=heldout.txt --heldout_every=250

Steps: (1) SentencePiece model (``--spiece_model_file``, or trained on ``--train_input`` with ``--train_spm``);
(2) corpus -> TFRecords of raw sequences in ``--record_dir`` (``data/pretrain_records.py``; cached: reused while the
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

import json
import logging
import os

import run_common
import run_flags
import run_main
from xlnet_tf.tasks.pretrain.run import PretrainSpec  # (no TensorFlow: its defaults are the flags')
from xlnet_tf.tasks.pretrain.run import PretrainPlan, check_dirs, expand_inputs, run, spiece_model
from xlnet_tf import XLNetTokenizer, ram


def define_flags(fv) -> None:
    d = run_flags.Definer(fv, "Pretraining")
    # --- data
    d.enum("objective", PretrainSpec.objective, ["plm", "mlm"], "plm: the permutation LM (two streams, span targets);"
           " mlm: BERT-style masked LM on the content stream (15% of the pieces: 80% <mask>, 10% random, 10% kept), "
           "same backbone, memory and records.")
    d.string("train_input", None, "Training corpus: text files, comma-separated and/or globs.")
    d.string("record_dir", None, "Pretraining TFRecords: written here from --train_input, or read from "
             "here when --train_input is absent (default MODEL_DIR/data).")
    d.string("heldout_input", None, "Held-out text files (comma-separated/globs) for the held-out PLM loss.")
    d.bool("train_spm", False, "Train a SentencePiece model on --train_input first (written to "
           "--spiece_model_file if given, else MODEL_DIR/spiece.model; reused while unchanged).")
    d.integer("vocab_size", 32000, "Vocabulary of the SentencePiece model trained with --train_spm.")
    d.integer("seq_len", None, "Sequence length (default: --max_seq_length).")
    d.integer("reuse_len", PretrainSpec.reuse_len, "Tokens at the start of each sequence whose hidden states become "
              "memory.")
    d.integer("mem_len", PretrainSpec.mem_len, "Memory length (0: no recurrence).")
    d.integer("perm_size", None, "Factorisation-order block length (default: the whole part).")
    d.integer("num_predict", None, "Targets per sequence (default: seq_len * mask_beta / mask_alpha; "
              "mlm: 15% of seq_len).")
    d.float("mask_alpha", PretrainSpec.mask_alpha, "Context length (in words) per span-length unit.")
    d.float("mask_beta", PretrainSpec.mask_beta, "Span length units per context.")
    d.integer("max_span", PretrainSpec.max_span, "Longest span, in words.")
    d.bool("bi_data", PretrainSpec.bi_data, "Half of each replica's batch reads the streams backwards.")
    d.bool("use_eod", PretrainSpec.use_eod, "Append <eod> to every document.")
    d.bool("use_eop", PretrainSpec.use_eop, "Mark paragraph (line) ends inside a document with <eop>.")
    d.integer("data_seed", PretrainSpec.data_seed, "Seed of the A/B splits (record writing) and of the "
              "target/permutation sampler.")
    d.integer("heldout_batch_size", PretrainSpec.heldout_batch_size, "Held-out streams (rows of a held-out batch).")
    d.integer("heldout_steps", PretrainSpec.heldout_steps, "Held-out batches scored per evaluation (<= 0: one pass).")
    d.integer("heldout_every", PretrainSpec.heldout_every, "Evaluate the held-out loss every N steps (0: at the start"
              " and end).")
    d.integer("heldout_seed", PretrainSpec.heldout_seed, "Seed of the held-out sampler (fixed: the same targets every"
              " time).")
    run_flags.define_common_flags(fv, default_seq_len=512, default_lr=1e-4)
    run_flags.define_health_flag(fv, "pretrain_results.json")
    # with --train_spm, --spiece_model_file is where the trained model goes: an input path only without it
    run_flags.mark_input_path(fv, "spiece_model_file", lambda v: not v.train_spm)
    fv.set_default("train_steps", 100000)


log = logging.getLogger("run_pretrain")


def build_config(F, tokenizer):
    spec = F.model_config_path
    run = dict(mem_len=F.mem_len, reuse_len=F.reuse_len, bi_data=F.bi_data)
    if spec and not (os.path.exists(spec) or spec.endswith(".json")):  # presets get the tokenizer's vocabulary
        run["n_token"] = tokenizer.vocab_size
    config = run_common.model_config(F, **run)
    if config.n_token < tokenizer.vocab_size:
        raise ValueError(f"model n_token={config.n_token} < the SentencePiece vocabulary ({tokenizer.vocab_size})")
    return config


def job(F):
    strategy = run_common.strategy(F)  # first: logical CPU devices must exist before TF initialises

    spec = PretrainSpec(
        seq_len=F.seq_len or F.max_seq_length, objective=F.objective, reuse_len=F.reuse_len, mem_len=F.mem_len,
        perm_size=F.perm_size, num_predict=F.num_predict, mask_alpha=F.mask_alpha, mask_beta=F.mask_beta,
        max_span=F.max_span, bi_data=F.bi_data, use_eod=F.use_eod, use_eop=F.use_eop, data_seed=F.data_seed,
        uncased=F.uncased, heldout_batch_size=F.heldout_batch_size, heldout_steps=F.heldout_steps,
        heldout_every=F.heldout_every, heldout_seed=F.heldout_seed)
    record_dir = check_dirs(F.model_dir, F.output_dir, F.record_dir)
    spec.check()
    train_paths = expand_inputs(F.train_input, "train_input")
    heldout_paths = expand_inputs(F.heldout_input, "heldout_input")
    spiece = spiece_model(F.model_dir, train_paths, F.spiece_model_file, F.train_spm, F.vocab_size, F.uncased)
    tokenizer = XLNetTokenizer(spiece, lower=F.uncased)
    config = build_config(F, tokenizer)
    run_common.start_run(F, F.model_dir, "run_pretrain", "pretrain", config, tokenizer, training=True,
                         train_sources=train_paths or None, data=spec.data_settings(), work_dirs=[F.model_dir],
                         # the LM head's weights are the backbone's (tied embedding, lm_bias)
                         memory={"head": ram.NO_HEAD, "length_flag": "seq_len" if F.seq_len else "max_seq_length"})
    plan = PretrainPlan(train=run_common.train_config(F, F.model_dir), output_dir=F.output_dir, record_dir=record_dir,
                        train_paths=train_paths, heldout_paths=heldout_paths, train_batch_size=F.train_batch_size,
                        init_checkpoint=F.init_checkpoint, fail_if_unhealthy=F.fail_if_unhealthy)
    plan.make_dirs()  # once the run may start: a refused start leaves no empty folders
    summary = run(spec, plan, config, tokenizer, spiece, strategy)
    print(json.dumps(summary))
    return summary


def main(argv=None) -> run_main.Exit:
    return run_main.main(argv, define_flags, job, __doc__)


if __name__ == "__main__":
    run_main.exit(main())
