r"""Continues text prompts with a pretrained XLNet's LM head (``xlnet_tf/generation.py``), greedy or sampled.

    python generate.py --init_checkpoint=DIR --spiece_model_file=spiece.model --prompt="The cat" \
      --max_new_tokens=32 [--do_sample --temperature=0.8 --top_k=50 --top_p=0.9 --seed=1] [--output_file=OUT.jsonl]

``--init_checkpoint``: any format ``XLNetModel.from_pretrained`` reads (original TF1 checkpoint with
``xlnet_config.json`` or ``--model_config_path``, HuggingFace directory, our own). ``--input_file``: one prompt a
line (blank lines skipped). A prompt is its SentencePiece pieces alone: no special tokens and no filler text
(HF's pipeline prepends one); the ids equal HF's ``generate`` on the same ids. Each continuation is printed;
``--output_file`` gets one JSON object per prompt: ``prompt``, ``prompt_ids``, ``generated_ids`` (up to and
including ``</s>`` when generated), ``generated_text``. A prompt longer than ``--max_prompt_length`` pieces keeps
its last ones (logged). ``--export_dir`` writes a SavedModel with the ``generate`` (greedy) and ``sample``
signatures over raw text; ``--max_new_tokens``, ``--max_prompt_length`` and ``--mem_len`` are fixed in it
(recorded in its ``serving_info.json`` under ``generation``).
"""

from __future__ import annotations

import json
import logging
import os

import run_common
import run_flags
import run_main
from xlnet_tf import XLNetConfig, ram
from xlnet_tf.fileutil import atomic_write
from xlnet_tf.generation_options import BATCH_SIZE, MAX_PROMPT_LENGTH, GenerationOptions
from xlnet_tf.tokenizer import SPIECE_UNDERLINE

PROGRESS_SECONDS = 10.0  # a long generation's progress line, at most this often
log = logging.getLogger("generate")


def define_flags(fv) -> None:
    d = run_flags.Definer(fv, "Generation")
    run_flags.define_model_flags(fv)
    d.string("prompt", None, "One prompt.")
    d.string("input_file", None, "Prompts, one per line.", input_path=True)
    d.string("output_file", None, "Where the results go (.jsonl).")
    d.string("export_dir", None, "Write a SavedModel generating from raw text here.")
    d.integer("max_new_tokens", GenerationOptions.max_new_tokens, "New tokens per prompt (the export's: fixed at "
              "export, in serving_info.json).")
    d.bool("do_sample", GenerationOptions.do_sample, "Sample (default: greedy).")
    d.float("temperature", GenerationOptions.temperature, "Sampling temperature (> 0).")
    d.integer("top_k", GenerationOptions.top_k, "Sample among the k most likely tokens (0 = all).")
    d.float("top_p", GenerationOptions.top_p, "Sample among the most likely tokens holding this mass (1 = all).")
    d.integer("seed", GenerationOptions.seed, "Sampling seed (same seed, same ids).")
    d.integer("mem_len", GenerationOptions.mem_len, "Memory kept, in positions (the last ones; default: all), as "
              "--mem_len means in every script; HuggingFace's config.mem_len keeps 2 fewer (its mem_len = this + 2).")
    d.integer("batch_size", BATCH_SIZE, "Prompts per batch.")
    d.integer("max_prompt_length", MAX_PROMPT_LENGTH, "Longer prompts keep their last pieces (logged; the export's: "
              "fixed).")
    d.bool("progress", True, f"Log how far a long generation is (at most every {PROGRESS_SECONDS:g} s).")
    d.bool("check_memory", True, "Refuse a generation whose estimated memory (xlnet_tf.ram.generation_estimate: the "
           "model, each layer's memory of the prompt and every new token) exceeds the machine's.")


def read_prompts(F):
    if bool(F.prompt) == bool(F.input_file):
        if F.prompt and F.input_file:
            raise ValueError("--prompt and --input_file: give one, not both")
        if not F.export_dir:
            raise ValueError("--prompt or --input_file is required (or --export_dir alone)")
        return []
    if F.prompt:
        return [F.prompt]
    if not os.path.isfile(F.input_file):
        raise FileNotFoundError(f"--input_file: {F.input_file} not found")
    with open(F.input_file, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise ValueError(f"--input_file: {F.input_file}: no prompts (expected one per line)")
    return prompts


def check_memory(F, config, ids) -> None:
    """Says what the generation's memory will hold, and refuses (one line) a generation whose estimate
    (``xlnet_tf.ram.generation_estimate``) exceeds the machine's memory, before the model is loaded."""
    from xlnet_tf.generation import left_pad

    batch = min(F.batch_size, len(ids))
    length = left_pad([max(ids, key=len)], 0)[0].shape[1]  # the longest prompt as the loop pads it
    need = ram.generation_estimate(config, batch, length, F.max_new_tokens, F.mem_len)
    bounded = need["positions"] < max(length - 1 + F.max_new_tokens - 1, 1)
    log.info("generation memory: each layer keeps the keys and values of %s positions (%s), %.1f MiB for %d "
             "prompt(s) at a time; each new token attends to all of them", f"{need['positions']:,}",
             f"the last ones: --mem_len={F.mem_len}" if bounded else "the prompt and every new token",
             need["memory"] / 2 ** 20, batch)
    have = ram.machine_memory()
    if F.check_memory and have and need["total"] > have:
        GiB = 2.0 ** 30
        raise ValueError(f"--max_new_tokens={F.max_new_tokens} with --batch_size={F.batch_size}: generating is "
                         f"estimated to need {need['total'] / GiB:,.1f} GiB (each layer keeps {need['positions']:,} "
                         f"positions; xlnet_tf.ram), this machine has {have / GiB:,.1f} GiB; lower them, keep only "
                         f"the last positions with --mem_len, or pass --nocheck_memory to run anyway")


def job(F):
    if F.output_file and not F.output_file.endswith(".jsonl"):
        raise ValueError(f"--output_file: expected a .jsonl path, got {F.output_file!r}")
    if F.batch_size < 1 or F.max_prompt_length < 1:
        raise ValueError(f"--batch_size and --max_prompt_length: expected >= 1, got {F.batch_size} and "
                         f"{F.max_prompt_length}")
    prompts = read_prompts(F)
    if not F.init_checkpoint:
        raise ValueError("--init_checkpoint is required")
    tokenizer = run_common.tokenizer(F)

    try:
        options = GenerationOptions(max_new_tokens=F.max_new_tokens, do_sample=F.do_sample,
                                    temperature=F.temperature, top_k=F.top_k, top_p=F.top_p, seed=F.seed,
                                    eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, mem_len=F.mem_len)
    except ValueError as e:
        raise ValueError(f"--{e}") from None
    # one piece more than is kept: a longer prompt is then seen (and said) without encoding all of it
    kept = [tokenizer.encode(p, last=F.max_prompt_length + 1) for p in prompts]
    ids = [i[-F.max_prompt_length:] for i in kept]
    cut = [n for n, i in enumerate(kept, 1) if len(i) > F.max_prompt_length]
    if cut:
        logging.getLogger("generate").warning(
            "%d prompt(s) longer than --max_prompt_length=%d pieces keep their last %d (prompt %d%s)",
            len(cut), F.max_prompt_length, F.max_prompt_length, cut[0],
            f"; {len(cut) - 1} more" if len(cut) > 1 else "")
    for n, (p, i) in enumerate(zip(prompts, ids), 1):
        if not i:
            raise ValueError(f"prompt {n} ({p[:40]!r}): no pieces after tokenisation")
    blank = {tokenizer.unk_id, tokenizer.sp.PieceToId(SPIECE_UNDERLINE)}  # <unk> and the bare word boundary
    unknown = [n for n, i in enumerate(ids, 1) if set(i) <= blank]
    if unknown:
        log.warning("%d of %d prompt(s) are <unk> pieces only (the first: prompt %d, %r): the model reads nothing "
                    "of their text (characters its vocabulary lacks, e.g. emoji)", len(unknown), len(ids),
                    unknown[0], prompts[unknown[0] - 1][:40])

    from xlnet_tf.modeling import XLNetModel
    from xlnet_tf.generation import Generator, export_generator

    run = dict(dropout=0.0, dropatt=0.0, bi_data=False)
    config = XLNetConfig.load(F.model_config_path, **run) if F.model_config_path else \
        run_common.checkpoint_config(F.init_checkpoint, run)
    if ids:
        check_memory(F, config, ids)
    model = XLNetModel.from_pretrained(F.init_checkpoint, config=config)
    if model.config.n_token < tokenizer.vocab_size:
        raise ValueError(f"--spiece_model_file: {tokenizer.vocab_size} pieces, more than the model's "
                         f"{model.config.n_token} tokens")
    if prompts:
        results = Generator(model, progress_every=PROGRESS_SECONDS if F.progress else float("inf")).generate(
            ids, options, batch_size=F.batch_size)  # (a report in the loop, so Ctrl-C stops it)
        rows = [{"prompt": p, "prompt_ids": i, "generated_ids": g, "generated_text": tokenizer.decode(g)}
                for p, i, g in zip(prompts, ids, results)]
        for row in rows:
            print(f"{row['prompt']}\n  -> {row['generated_text']}")
        if F.output_file:
            with atomic_write(F.output_file) as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if F.export_dir:
        export_generator(model, F.spiece_model_file, F.export_dir, options, lower=F.uncased,
                         max_prompt_length=F.max_prompt_length)
        print(f"SavedModel written to {F.export_dir}")


def main(argv=None) -> run_main.Exit:
    return run_main.main(argv, define_flags, job, __doc__, required=())


if __name__ == "__main__":
    run_main.exit(main())
