"""In-graph XLNet tokenizer (TensorFlow + tensorflow-text): the same ids as ``XLNetTokenizer.encode``.

Every step of :func:`xlnet_tf.tokenizer.preprocess_text` and of the digit-comma piece rule is rebuilt from
vectorised string/ragged ops, so it runs eagerly, in ``tf.function`` and in an exported SavedModel (load it
after ``import tensorflow_text``, which registers the SentencePiece ops). The SentencePiece model proto is
embedded in the graph. Character classes (Python's whitespace, ``unicodedata.combining != 0``,
``str.isdigit``) are built from the running Python's ``unicodedata`` and frozen into the graph.

Known gaps:
* SentencePiece itself: tensorflow-text bundles its own SentencePiece build. Its unigram Viterbi breaks exact
  score ties (the same pieces in another order: "e"+"ee" vs "ee"+"e") and float32 near-ties of the running
  path score as the Python ``sentencepiece`` package up to 0.2.1 does, which requirements.txt therefore pins
  (``>=0.2.0,<0.2.2``): 0 of 92,268 real strings differ (``benchmarks/tokenizer_parity.py``: SST-2, SQuAD
  v1.1 dev, RACE, WikiText-2). 0.2.2 and 0.2.3 break them the other way (12 of the 92,268 strings: one word
  each segmented differently, e.g. "e"+"ee"); :class:`TFXLNetTokenizer` warns when it finds 0.2.2 or newer.
* Unicode versions (no case seen on real text): NFKD comes from tensorflow-text's ICU, which knows characters
  newer than Python's ``unicodedata`` (3.11: Unicode 14), so code points unassigned for Python may decompose
  in-graph. ``lower=True`` uses ``tf.strings.lower`` (TensorFlow's ICU: full case mapping with the
  final-sigma rule, as ``str.lower``), which predates Unicode 14: the ~40 letters added in 14.0 (U+2C2F,
  Vithkuqi, ...) are not lower-cased, and marks added or recategorised in 14.0 can change the final-sigma
  context. Its locale tailoring (tr/az/lt) and its truncation at NUL are worked around here.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import unicodedata
import warnings

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text
from tensorflow_text.python.ops.sentencepiece_tokenizer import gen_sentencepiece_tokenizer as _spm_ops

SPIECE_UNDERLINE = "\u2581"

# Letters whose ICU lower-casing depends on the default locale (tr, az, lt): mapped to their root-locale
# (= Python) lower case first, so the result does not depend on LANG.
_LOCALE_TAILORED = (("I", "i"), ("J", "j"), ("\u012e", "\u012f"), ("\u00cc", "\u00ec"),
                    ("\u00cd", "\u00ed"), ("\u0128", "\u0129"), ("\u0130", "i\u0307"))


def _char_class(codepoints) -> str:
    """An RE2 character class matching exactly ``codepoints`` (sorted ints)."""
    ranges = []
    for cp in codepoints:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "[" + "".join(f"\\x{{{a:x}}}" + (f"-\\x{{{b:x}}}" if b > a else "") for a, b in ranges) + "]"


@functools.lru_cache(maxsize=None)
def char_classes() -> dict:
    """RE2 classes for Python's ``str.isspace``, ``unicodedata.combining(c) != 0`` and ``str.isdigit``."""
    space, comb, digit = [], [], []
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if c.isspace():
            space.append(cp)
        if unicodedata.combining(c):
            comb.append(cp)
        if c.isdigit():
            digit.append(cp)
    return {"space": _char_class(space), "combining": _char_class(comb), "digit": _char_class(digit)}


def _lower(x: tf.Tensor) -> tf.Tensor:
    """``str.lower`` in-graph, locale-independent and NUL-safe.

    ``tf.strings.lower`` stops at the first NUL: NUL is escaped as "\\x01\\x03" (and "\\x01" as "\\x01\\x02")
    around it; both are uncased, non-case-ignorable controls, so the final-sigma context is unchanged.
    """
    x = tf.strings.regex_replace(x, r"\x01", "\x01\x02")
    x = tf.strings.regex_replace(x, r"\x00", "\x01\x03")
    for upper, lower in _LOCALE_TAILORED:
        x = tf.strings.regex_replace(x, upper, lower)
    x = tf.strings.lower(x, encoding="utf-8")
    x = tf.strings.regex_replace(x, r"\x01\x03", "\x00")
    return tf.strings.regex_replace(x, r"\x01\x02", "\x01")


class _SpieceModel(tf.saved_model.experimental.TrackableResource):
    """The SentencePiece model resource, with the proto embedded in its creation op.

    tensorflow-text's own resource is private to its kernel, so clearing the eager kernel cache (which
    ``tf.random.set_seed`` does) deletes it. A ``shared_name`` derived from the proto's hash keeps it in the
    device's resource manager instead: reseeding is harmless and equal protos share one instance.
    """

    def __init__(self, proto: bytes):
        super().__init__()
        self._proto = proto
        self._shared_name = "xlnet_spiece_" + hashlib.sha256(proto).hexdigest()[:32]
        _ = self.resource_handle

    def _create_resource(self):
        return _spm_ops.sentencepiece_op(model=self._proto, shared_name=self._shared_name)


def _warn_if_ties_differ(version: str) -> None:
    """Warn when the Python ``sentencepiece`` breaks unigram score ties unlike tensorflow-text's build (0.2.2+)."""
    try:
        release = tuple(int(x) for x in version.split(".")[:3])
    except ValueError:
        return
    if release >= (0, 2, 2):
        warnings.warn(f"sentencepiece {version}: its unigram Viterbi breaks score ties unlike tensorflow-text's "
                      f"bundled SentencePiece, so ~1 in 8,000 real strings get other ids in-graph than "
                      f"XLNetTokenizer.encode; install sentencepiece<0.2.2 (requirements.txt) for identical ids",
                      stacklevel=3)


# What the UTF-8 check decodes bad bytes to: a surrogate, which valid UTF-8 never encodes.
_NOT_UTF8 = 0xD800


def assert_utf8(texts) -> tf.Tensor:
    """``texts`` (a string tensor of any shape) unchanged, checked when the graph runs: a string that is not valid
    UTF-8 raises ``InvalidArgumentError`` "input is not valid UTF-8" with its (flattened) row. Every in-graph
    tokenisation reads its text through this check (``preprocess``, SQuAD's ``preprocess_with_origin``), so a
    serving signature never answers for undecodable bytes."""
    texts = tf.convert_to_tensor(texts, tf.string)
    codepoints = tf.strings.unicode_decode(tf.reshape(texts, [-1]), "UTF-8", errors="replace",
                                           replacement_char=_NOT_UTF8)
    bad = tf.reduce_any(tf.equal(codepoints, _NOT_UTF8), axis=1)
    # the first bad row (only read when there is one; the sentinel keeps an empty request's argmax defined)
    first = tf.argmax(tf.concat([tf.cast(bad, tf.int32), [1]], 0))
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)),
                                [tf.strings.format("input is not valid UTF-8: row {}", first)], name="utf8_check")
    with tf.control_dependencies([check]):
        return tf.identity(texts)


class TFXLNetTokenizer(tf.Module):
    """In-graph twin of :class:`xlnet_tf.tokenizer.XLNetTokenizer` (same constructor switches).

    ``tokenize``: tf.string [batch] -> int32 RaggedTensor [batch, (ids)], equal to ``encode`` per string
    (with ``sentencepiece`` < 0.2.2 on the Python side; see the module docstring).
    ``preprocess``: the text normalisation alone. ``detokenize``: ids -> text, as ``decode``.
    """

    def __init__(self, spiece_model_file: str, lower: bool = False, remove_space: bool = True,
                 keep_accents: bool = False, name: str = "xlnet_tokenizer"):
        super().__init__(name=name)

        _warn_if_ties_differ(spm.__version__)
        with tf.io.gfile.GFile(spiece_model_file, "rb") as f:
            proto = f.read()
        sp = spm.SentencePieceProcessor(model_proto=proto)
        self.lower, self.remove_space, self.keep_accents = lower, remove_space, keep_accents
        self.vocab_size = sp.GetPieceSize()
        # decode(skip_special=True) drops control symbols and <eod>/<eop>.
        self._skip_ids = tuple(sorted({i for i in range(self.vocab_size) if sp.IsControl(i)}
                                      | {sp.PieceToId("<eod>"), sp.PieceToId("<eop>")}))
        classes = char_classes()
        self._space_re = classes["space"] + "+"
        self._combining_re = classes["combining"] + "+"
        self._digit_comma_re = "(?s).*" + classes["digit"] + ","
        self._spm = _SpieceModel(proto)

    # ------------------------------------------------------------------ text
    def preprocess(self, texts) -> tf.Tensor:
        """``preprocess_text`` on a string tensor of any shape (which must be valid UTF-8: ``assert_utf8``)."""
        x = assert_utf8(texts)
        if self.remove_space:
            x = tf.strings.regex_replace(x, self._space_re, " ")
            x = tf.strings.regex_replace(x, "^ | $", "")
        x = tf.strings.regex_replace(x, "``", '"')
        x = tf.strings.regex_replace(x, "''", '"')
        if not self.keep_accents:
            x = tensorflow_text.normalize_utf8(x, "NFKD")
            x = tf.strings.regex_replace(x, self._combining_re, "")
        if self.lower:
            x = _lower(x)
        return x

    # ------------------------------------------------------------------ pieces and ids
    def _pieces(self, x: tf.Tensor) -> tf.RaggedTensor:
        values, splits = _spm_ops.sentencepiece_tokenize_op(
            self._spm.resource_handle, x, nbest_size=0, alpha=1.0, add_bos=False, add_eos=False,
            reverse=False, out_type=tf.string)
        return tf.RaggedTensor.from_row_splits(values, splits, validate=False)

    def tokenize_to_pieces(self, texts) -> tf.RaggedTensor:
        """tf.string [batch] -> string RaggedTensor [batch, (pieces)], as ``XLNetTokenizer.tokenize``."""
        pieces = self._pieces(self.preprocess(texts))
        flat = pieces.flat_values
        # Digit-comma rule: a piece "<...><digit>," is re-encoded without the comma (and without "▁"),
        # the comma becoming its own piece.
        hit = tf.strings.regex_full_match(flat, self._digit_comma_re)
        src = tf.boolean_mask(flat, hit)
        body = tf.strings.regex_replace(tf.strings.regex_replace(src, ",$", ""), SPIECE_UNDERLINE, "")
        sub = self._pieces(body)
        vals, rows = sub.flat_values, sub.value_rowids()
        is_first = tf.equal(tf.range(tf.size(vals, out_type=tf.int64)), tf.gather(sub.row_starts(), rows))
        src_bare = tf.logical_not(tf.strings.regex_full_match(src, "(?s)\u2581.*"))
        fix = is_first & tf.gather(src_bare, rows) & tf.strings.regex_full_match(vals, "(?s)\u2581.*")
        vals = tf.where(fix, tf.strings.regex_replace(vals, "^\u2581", ""), vals)
        sub = tf.ragged.boolean_mask(sub.with_flat_values(vals),
                                     sub.with_flat_values(~(fix & tf.equal(vals, ""))))
        comma = tf.RaggedTensor.from_tensor(tf.fill(tf.stack([tf.size(src), 1]), ","))
        sub = tf.concat([sub, comma], axis=1)
        # Replace each hit piece by its sub-pieces: rows [0, n) of `table` are the pieces, [n, n+m) the subs.
        n = tf.size(flat, out_type=tf.int64)
        table = tf.concat([tf.RaggedTensor.from_tensor(flat[:, None]), sub], axis=0)
        idx = tf.where(hit, n + tf.cumsum(tf.cast(hit, tf.int64)) - 1, tf.range(n))
        out = tf.gather(table, idx)
        return tf.RaggedTensor.from_row_splits(out.values, tf.gather(out.row_splits, pieces.row_splits),
                                               validate=False)

    def tokenize(self, texts) -> tf.RaggedTensor:
        """tf.string [batch] (or a scalar) -> int32 RaggedTensor [batch, (ids)] (or int32 [ids])."""
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank == 0:
            return self.tokenize(texts[None])[0]
        pieces = self.tokenize_to_pieces(texts)
        return pieces.with_flat_values(self.piece_to_id(pieces.flat_values))

    def piece_to_id(self, pieces) -> tf.Tensor:
        """Pieces (string tensor) -> int32 ids; unknown pieces give ``<unk>`` (0)."""
        return _spm_ops.sentencepiece_string_to_id_op(self._spm.resource_handle, pieces)

    def detokenize(self, ids) -> tf.Tensor:
        """int ids [batch, (len)] (ragged or dense; padding is dropped) -> tf.string [batch], as ``decode``."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
        ids = tf.cast(ids, tf.int32)
        skip = tf.constant(self._skip_ids, tf.int32)
        keep = tf.reduce_all(tf.not_equal(ids.flat_values[:, None], skip[None, :]), axis=1)
        ids = tf.ragged.boolean_mask(ids, ids.with_flat_values(keep))
        return _spm_ops.sentencepiece_detokenize_op(self._spm.resource_handle, ids.flat_values,
                                                    ids.row_splits, add_bos=False, add_eos=False,
                                                    reverse=False)
