"""Train a SentencePiece model for a new corpus with XLNet's settings.

The recipe of the original README: unigram model, ``character_coverage=0.99995``, control symbols
``<cls>,<sep>,<pad>,<mask>,<eod>``, user-defined symbols ``<eop>,.,(,),",-,–,£,€``, shuffled input sentences.
With sentencepiece's default ``<unk>``/``<s>``/``</s>`` at 0/1/2 the ids 0..8 are then
``<unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop>``, exactly as in the released ``spiece.model``
(checked after training, before the model is moved into place).

Differences from the original recipe (both switchable):
* ``preprocess=True`` trains on the text after XLNet's own normalisation (``tokenizer.preprocess_text``:
  whitespace collapsed, LaTeX quotes, accents stripped unless ``keep_accents``, optional lower-casing), the
  form the tokenizer will feed the model, so no pieces are wasted on characters it never sees;
* the model is written atomically: trained under ``<prefix>.tmp-<pid>``, checked, then renamed.

CLI: ``python -m xlnet_tf.spm_train --input=a.txt,b.txt --model_prefix=out/sp --vocab_size=32000``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from xlnet_tf.tokenizer import SPECIAL_PIECES, XLNetTokenizer, preprocess_text

CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
USER_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")  # – £ €
EXPECTED_IDS = ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>")


def _preprocessed_copy(inputs: Sequence[str], out_path: str, lower: bool, keep_accents: bool) -> None:
    with open(out_path, "w", encoding="utf-8") as out:
        for path in inputs:
            with open(path, "r", encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = preprocess_text(line, lower=lower, keep_accents=keep_accents)
                    if line:
                        out.write(line + "\n")


def check_special_ids(model_file: str) -> None:
    """Raises ValueError unless ids 0..8 are XLNet's special pieces (as in the released model)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.Load(model_file)
    got = tuple(sp.IdToPiece(i) for i in range(len(EXPECTED_IDS)))
    if got != EXPECTED_IDS:
        raise ValueError(f"{model_file}: special ids 0..8 are {got}, expected {EXPECTED_IDS}")
    XLNetTokenizer(model_file)  # also runs the tokenizer's own special-piece checks
    assert set(SPECIAL_PIECES.values()) == set(EXPECTED_IDS)


def train_spm(inputs: Sequence[str] | str, model_prefix: str, vocab_size: int = 32000,
              input_sentence_size: int = 10_000_000, shuffle_input_sentence: bool = True,
              character_coverage: float = 0.99995, model_type: str = "unigram", preprocess: bool = True,
              lower: bool = False, keep_accents: bool = False, num_threads: Optional[int] = None,
              max_sentence_length: Optional[int] = None, hard_vocab_limit: bool = True,
              seed_sentencepiece_size: Optional[int] = None, quiet: bool = False) -> str:
    """Trains ``<model_prefix>.model`` / ``.vocab`` with XLNet's settings; returns the ``.model`` path.

    ``inputs``: text files (a list or a comma-separated string), one sentence/paragraph per line.
    ``input_sentence_size``: at most this many lines are sampled (0 = all), shuffled when
    ``shuffle_input_sentence``.
    """
    import sentencepiece as spm

    if isinstance(inputs, str):
        inputs = [p for p in inputs.split(",") if p]
    for p in inputs:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"input file not found: {p}")
    out_dir = os.path.dirname(os.path.abspath(model_prefix))
    os.makedirs(out_dir, exist_ok=True)
    tmp_prefix = f"{model_prefix}.tmp-{os.getpid()}"
    tmp_text = f"{tmp_prefix}.txt"
    leftovers = [tmp_text, tmp_prefix + ".model", tmp_prefix + ".vocab"]
    try:
        train_inputs = list(inputs)
        if preprocess:
            _preprocessed_copy(inputs, tmp_text, lower=lower, keep_accents=keep_accents)
            train_inputs = [tmp_text]
        kwargs = dict(
            input=train_inputs, model_prefix=tmp_prefix, vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, control_symbols=list(CONTROL_SYMBOLS),
            user_defined_symbols=list(USER_SYMBOLS), input_sentence_size=input_sentence_size,
            shuffle_input_sentence=shuffle_input_sentence, hard_vocab_limit=hard_vocab_limit,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        )
        if num_threads:
            kwargs["num_threads"] = num_threads
        if max_sentence_length:
            kwargs["max_sentence_length"] = max_sentence_length
        if seed_sentencepiece_size:
            kwargs["seed_sentencepiece_size"] = seed_sentencepiece_size
        if quiet:
            kwargs["minloglevel"] = 2
        spm.SentencePieceTrainer.Train(**kwargs)
        check_special_ids(tmp_prefix + ".model")
        os.replace(tmp_prefix + ".vocab", model_prefix + ".vocab")
        os.replace(tmp_prefix + ".model", model_prefix + ".model")  # the model last: it is what users load
    finally:
        for p in leftovers:
            if os.path.exists(p):
                os.remove(p)
    return model_prefix + ".model"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help="comma-separated text files, one sentence per line")
    ap.add_argument("--model_prefix", required=True)
    ap.add_argument("--vocab_size", type=int, default=32000)
    ap.add_argument("--input_sentence_size", type=int, default=10_000_000)
    ap.add_argument("--no_shuffle", action="store_true", help="do not shuffle the sampled sentences")
    ap.add_argument("--character_coverage", type=float, default=0.99995)
    ap.add_argument("--no_preprocess", action="store_true", help="train on the raw text (the original recipe)")
    ap.add_argument("--lower", action="store_true", help="lower-case (for uncased models)")
    ap.add_argument("--keep_accents", action="store_true")
    ap.add_argument("--num_threads", type=int, default=None)
    ap.add_argument("--max_sentence_length", type=int, default=None)
    args = ap.parse_args(argv)
    path = train_spm(args.input, args.model_prefix, vocab_size=args.vocab_size,
                     input_sentence_size=args.input_sentence_size, shuffle_input_sentence=not args.no_shuffle,
                     character_coverage=args.character_coverage, preprocess=not args.no_preprocess,
                     lower=args.lower, keep_accents=args.keep_accents, num_threads=args.num_threads,
                     max_sentence_length=args.max_sentence_length)
    print(f"wrote {path} ({XLNetTokenizer(path).vocab_size} pieces; ids 0..8 = {' '.join(EXPECTED_IDS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
