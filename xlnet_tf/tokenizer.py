"""XLNet's SentencePiece tokenizer: the original preprocessing, in Python.

The preprocessing is the one of the original release (``prepro_utils.py``) and of HuggingFace's
``XLNetTokenizer``:

1. ``remove_space``: collapse whitespace runs to one space and strip the ends (``" ".join(text.split())``);
2. LaTeX-style quotes ``` `` ``` and ``''`` become ``"``;
3. unless ``keep_accents``: NFKD then drop combining characters (``unicodedata.combining(c) != 0``);
4. optional lower-casing;
5. SentencePiece pieces, then the digit-comma rule: a piece of length > 1 ending in ``<digit>,`` is
   re-encoded without the comma and the comma becomes its own piece (so ``"1,000"`` splits as numbers).

``XLNetTokenizer.tf_tokenizer()`` returns the in-graph (tensorflow-text) version that yields the same ids.

**A part of a long text** (``encode(text, first=n)`` / ``last=n``) costs memory and time in proportion to n, not
to the text. Both rest on the model being *whitespace-local* (``XLNetTokenizer.whitespace_local``: no piece holds the
word boundary ``▁`` after its first character, and each text starts a word, SentencePiece's dummy prefix): every
whitespace run then starts a piece, and the preprocessing (step 1 collapses whitespace; steps 2-4 and the digit-comma
rule never reach across it) commutes with a cut where a run starts. XLNet's released spiece.model and the models
``xlnet_tf.spm_train`` trains are; another model's text is encoded whole, then cut.

* ``first=n`` is exactly ``encode(text)[:n]``: a PREFIX ending before a whitespace run is encoded (one twice as long
  while it gives fewer than n ids). SentencePiece's Viterbi pass reads the text from its start, so at every position
  of the prefix it holds what it holds for the whole text, float32 sums included, and the whole text's best path
  passes through the cut (a piece starts there): its first ids are the prefix's.
* ``last=n`` is ``encode(text)[-n:]`` for a text of up to ``WHOLE_CHARS`` characters (encoded whole). A longer text
  is encoded in parts from its end, each part's ids SentencePiece's for that part: the whole text's too, but where
  SentencePiece's float32 path scores, summed from the start of the whole text, round a near-tie (or an exact one,
  e.g. in "!!!!!!!") the other way; the part's choice then scores at least as well (``tests/test_tokenizer.py``).

A stretch of text with no whitespace (e.g. unsegmented Chinese) cannot be cut: it costs in proportion to its length.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

SPIECE_UNDERLINE = "\u2581"

# Special pieces of XLNet's released spiece.model (ids checked against the model at load time).
SPECIAL_PIECES = {
    "unk": "<unk>", "bos": "<s>", "eos": "</s>", "cls": "<cls>", "sep": "<sep>",
    "pad": "<pad>", "mask": "<mask>", "eod": "<eod>", "eop": "<eop>",
}

# Segment ids of the classification layout; padding only needs an id distinct from the rest.
SEG_ID_A = 0
SEG_ID_B = 1
SEG_ID_CLS = 2
SEG_ID_PAD = 4  # classifier padding (the original); SQuAD uses 3 (see tasks/squad/features.py)


_RUN = re.compile(r"(?<!\s)\s")  # the first character of a whitespace run (str.isspace()'s characters: CPython's re
#                                  and str share one table)


WHOLE_CHARS = 1 << 20  # a text this long is encoded in one call when all of its ends count (``last``, SQuAD)


def part_chars(pieces: int) -> int:
    """Characters of raw text encoded at a time when ``pieces`` ids are kept of a longer text."""
    return max(1 << 14, 16 * int(pieces))


def text_parts(text: str, size: int, from_end: bool = False) -> Iterator[Tuple[int, int]]:
    """``[start, end)`` of consecutive parts of ``text`` of at least ``size`` characters (but the last one), each
    after the first starting where a whitespace run starts, so no word and no run is split; ``from_end``: the
    same kind of parts from the end of the text, the last one first."""
    if not from_end:
        start = 0
        while start < len(text):
            m = _RUN.search(text, start + size) if start + size < len(text) else None
            end = m.start() if m else len(text)
            yield start, end
            start = end
        return
    end = len(text)
    while end > 0:
        start, window, hi = 0, 256, end - size
        while hi > 0:  # the last run start at or before ``hi``, searched backwards in growing windows
            lo = max(0, hi - window)
            found = [m.start() for m in _RUN.finditer(text, lo, hi + 1)]
            if found and found[-1] > 0:
                start = found[-1]
                break
            hi, window = lo - 1, window * 2
        yield start, end
        end = start


class _KeepUncombined(dict):
    """``str.translate``'s table for the accent rule: a code point maps to nothing when it is a combining character
    (``unicodedata.combining(c) != 0``), to itself otherwise; filled in as characters are met (a lookup in C per
    character instead of a Python call)."""

    def __missing__(self, code_point: int):
        self[code_point] = None if unicodedata.combining(chr(code_point)) else code_point
        return self[code_point]


_KEEP = _KeepUncombined()


def strip_accents(text: str) -> str:
    """The accent rule: NFKD, then every combining character dropped (ASCII text has none and is its own NFKD)."""
    return text if text.isascii() else unicodedata.normalize("NFKD", text).translate(_KEEP)


def _text(text, call: str) -> str:
    """One text: a str (UTF-8 bytes decoded); anything else refused in one line."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8")
    raise TypeError(f"{call}: one text (str) is expected, got {type(text).__name__}"
                    + (" (one call per text)" if isinstance(text, (list, tuple)) else f" {text!r}"[:200]))


def preprocess_text(text: str, lower: bool = False, remove_space: bool = True,
                    keep_accents: bool = False) -> str:
    """The original XLNet text normalisation (before SentencePiece)."""
    if remove_space:
        out = " ".join(text.strip().split())
    else:
        out = text
    out = out.replace("``", '"').replace("''", '"')
    if not keep_accents:
        out = strip_accents(out)
    if lower:
        out = out.lower()
    return out


class XLNetTokenizer:
    """SentencePiece tokenizer with XLNet's preprocessing.

    Args:
      spiece_model_file: path to a SentencePiece model (XLNet's released ``spiece.model`` or one trained with
        ``xlnet_tf.spm_train``).
      lower, remove_space, keep_accents: the original preprocessing switches (defaults: the cased models).
    """

    def __init__(self, spiece_model_file: str, lower: bool = False, remove_space: bool = True,
                 keep_accents: bool = False):
        import sentencepiece as spm

        if not os.path.isfile(spiece_model_file):
            raise FileNotFoundError(f"SentencePiece model not found: {spiece_model_file!r}")
        self.spiece_model_file = spiece_model_file
        self.lower = lower
        self.remove_space = remove_space
        self.keep_accents = keep_accents
        self.sp = spm.SentencePieceProcessor()
        try:
            loaded = self.sp.Load(spiece_model_file)
        except (RuntimeError, OSError) as e:  # "could not parse ModelProto"
            raise ValueError(f"{spiece_model_file}: not a SentencePiece model ({str(e).strip()})") from None
        if not loaded:
            raise ValueError(f"{spiece_model_file}: not a valid SentencePiece model")
        for key, piece in SPECIAL_PIECES.items():
            pid = self.sp.PieceToId(piece)
            if self.sp.IdToPiece(pid) != piece:
                raise ValueError(f"{spiece_model_file}: special piece {piece!r} missing from the vocabulary")
            setattr(self, f"{key}_id", pid)

    # ------------------------------------------------------------------ basic properties
    @property
    def vocab_size(self) -> int:
        return self.sp.GetPieceSize()

    def __len__(self) -> int:
        return self.vocab_size

    def preprocess(self, text: str) -> str:
        return preprocess_text(_text(text, "tokenize"), lower=self.lower, remove_space=self.remove_space,
                               keep_accents=self.keep_accents)

    # ------------------------------------------------------------------ pieces and ids
    def tokenize_preprocessed(self, text: str, sample: bool = False) -> List[str]:
        """Pieces of already-preprocessed text, with the digit-comma rule applied."""
        if sample:
            pieces = self.sp.SampleEncodeAsPieces(text, 64, 0.1)
        else:
            pieces = self.sp.EncodeAsPieces(text)
        out: List[str] = []
        for piece in pieces:
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                sub = self.sp.EncodeAsPieces(piece[:-1].replace(SPIECE_UNDERLINE, ""))
                if piece[0] != SPIECE_UNDERLINE and sub and sub[0][0] == SPIECE_UNDERLINE:
                    if len(sub[0]) == 1:
                        sub = sub[1:]
                    else:
                        sub[0] = sub[0][1:]
                sub.append(piece[-1])
                out.extend(sub)
            else:
                out.append(piece)
        return out

    def tokenize(self, text: str, sample: bool = False) -> List[str]:
        """Text -> SentencePiece pieces, with the original preprocessing."""
        return self.tokenize_preprocessed(self.preprocess(text), sample=sample)

    def convert_tokens_to_ids(self, pieces: Iterable[str]) -> List[int]:
        return [self.sp.PieceToId(p) for p in pieces]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
        return [self.sp.IdToPiece(i) for i in self._ids(ids)]

    def _ids(self, ids: Iterable[int], name: str = "ids") -> List[int]:
        """Piece ids of this model, refused in one line naming the first that is not one."""
        out = [int(i) for i in ids]
        for k, i in enumerate(out):
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"{name}[{k}]: {i} is not a piece id of this tokenizer (0..{self.vocab_size - 1})")
        return out

    def encode(self, text: str, sample: bool = False, first: Optional[int] = None,
               last: Optional[int] = None) -> List[int]:
        """Text -> ids (no special tokens added; the data layouts add <sep>/<cls> themselves).

        ``first=n`` / ``last=n``: only the first / last n ids (n >= 0), ``encode(text)[:n]`` / ``encode(text)[-n:]``,
        at a cost in proportion to n (the module docstring says how, and where ``last`` of a text longer than
        ``WHOLE_CHARS`` may differ). Sampled ids (``sample``) are drawn for the whole text, then cut."""
        text = _text(text, "encode")
        if first is not None and last is not None:
            raise ValueError("encode: pass first= or last=, not both")
        n = first if last is None else last
        if n is None or sample:
            ids = self.convert_tokens_to_ids(self.tokenize(text, sample=sample))
            return ids if n is None else (ids[:n] if last is None else ids[len(ids) - min(n, len(ids)):])
        if n <= 0:
            return []
        size = part_chars(n)
        if len(text) <= (size if last is None else max(size, WHOLE_CHARS)) or not self.whitespace_local:
            ids = self.encode(text)
            return ids[:n] if last is None else ids[-n:]
        if last is None:  # prefixes ending before a whitespace run, each twice the last, until n ids are there
            target = size
            while True:
                m = _RUN.search(text, target) if target < len(text) else None
                end = m.start() if m else len(text)
                ids = self.encode(text[:end])
                if len(ids) >= n or end == len(text):
                    return ids[:n]
                target = 2 * end
        parts, count = [], 0
        for start, end in text_parts(text, size, from_end=True):
            parts.append(self.encode(text[start:end]))
            count += len(parts[-1])
            if count >= n:
                break
        return [i for p in reversed(parts) for i in p][-n:]

    @functools.cached_property
    def whitespace_local(self) -> bool:
        """Whether every whitespace run of a text starts a piece, so the text may be cut there (module docstring):
        the preprocessing collapses whitespace, no piece but the word boundary's own holds ``▁`` after its first
        character, and a text's first piece starts a word (SentencePiece's dummy prefix)."""
        if not self.remove_space:
            return False
        for i in range(self.vocab_size):
            if not (self.sp.IsControl(i) or self.sp.IsUnknown(i)) and SPIECE_UNDERLINE in self.sp.IdToPiece(i)[1:]:
                return False
        return self.sp.EncodeAsPieces("x")[0].startswith(SPIECE_UNDERLINE)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Ids -> text. Control symbols (<cls>, <sep>, <pad>, ...) are dropped when ``skip_special``."""
        ids = self._ids(ids)
        if skip_special:
            ids = [i for i in ids if not (self.sp.IsControl(i) or i in (self.eod_id, self.eop_id))]
            return self.sp.DecodeIds(ids)
        return "".join(self.sp.IdToPiece(i) for i in ids).replace(SPIECE_UNDERLINE, " ").strip()

    # ------------------------------------------------------------------ in-graph version
    def tf_tokenizer(self):
        """The in-graph tokenizer (tensorflow-text) giving the same ids as :meth:`encode`."""
        from xlnet_tf.tf_tokenizer import TFXLNetTokenizer

        return TFXLNetTokenizer(self.spiece_model_file, lower=self.lower, remove_space=self.remove_space,
                                keep_accents=self.keep_accents)
