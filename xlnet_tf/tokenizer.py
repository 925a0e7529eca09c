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
"""

from __future__ import annotations

import os
import unicodedata
from typing import Iterable, List, Sequence

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


def preprocess_text(text: str, lower: bool = False, remove_space: bool = True,
                    keep_accents: bool = False) -> str:
    """The original XLNet text normalisation (before SentencePiece)."""
    if remove_space:
        out = " ".join(text.strip().split())
    else:
        out = text
    out = out.replace("``", '"').replace("''", '"')
    if not keep_accents:
        out = unicodedata.normalize("NFKD", out)
        out = "".join(c for c in out if not unicodedata.combining(c))
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
        return preprocess_text(text, lower=self.lower, remove_space=self.remove_space,
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
        return [self.sp.IdToPiece(int(i)) for i in ids]

    def encode(self, text: str, sample: bool = False) -> List[int]:
        """Text -> ids (no special tokens added; the data layouts add <sep>/<cls> themselves)."""
        return self.convert_tokens_to_ids(self.tokenize(text, sample=sample))

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Ids -> text. Control symbols (<cls>, <sep>, <pad>, ...) are dropped when ``skip_special``."""
        ids = [int(i) for i in ids]
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
