"""SQuAD features: exact character <-> piece alignment, sliding windows, TFRecords and the post-processing index.

Alignment (replaces the original's edit-distance match between the raw paragraph and the joined pieces):
``preprocess_with_offsets`` applies XLNet's preprocessing (whitespace collapse, LaTeX quotes, NFKD minus
combining marks, lower-casing) per original character, vectorised, keeping for every output character the
original span it came from; SentencePiece then reports each piece's span in the preprocessed text
(``offset_mapping``), so every piece gets an exact ``[start, end)`` span in the ORIGINAL context (leading
whitespace of ``▁x`` pieces excluded). Pieces and ids are identical to ``XLNetTokenizer.tokenize``. With
lower-casing (context-dependent for a Greek final sigma) the text is checked against
``XLNetTokenizer.preprocess`` and re-aligned with difflib where they differ.

Layout (the original): ``P <sep> Q <sep> <cls> PAD...`` right-padded; segments P+SEP 0, Q+SEP 1, CLS 2,
PAD 3; ``p_mask`` 1 on SEPs, question, padding (0 on paragraph and CLS); ``padding_mask`` 1 = real token.
Windows of ``max_seq_length - len(Q) - 3`` paragraph tokens every ``doc_stride``; the question keeps its
FIRST ``max_query_length`` pieces. ``start/end_position`` are window positions; an impossible question or
an answer outside the window gets ``cls_index`` for both and ``is_impossible = 1``.

Post-processing needs, per feature, the window offset, ``paragraph_len`` and the max-context positions, and
per paragraph the pieces' character spans: :class:`SquadFeatureIndex`, kept in memory or written atomically
next to the TFRecord (``<path>.index.json``, carrying the same ``meta`` as the TFRecord manifest).
"""

from __future__ import annotations

import bisect
import difflib
import hashlib
import json
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from xlnet_tf.data import tfrecord_io
from xlnet_tf.tasks.squad.metrics import normalize_answer
from xlnet_tf import hardware
from xlnet_tf.fileutil import stat_identity, write_json
from xlnet_tf.tokenizer import SPIECE_UNDERLINE, WHOLE_CHARS, XLNetTokenizer, strip_accents, text_parts

LAYOUT_VERSION = 1
SEG_P, SEG_Q, SEG_CLS, SEG_PAD = 0, 1, 2, 3
UNIQUE_ID_BASE = 1_000_000_000
MIN_GROUPS_FOR_POOL = 256  # below this many paragraphs a process pool's start-up costs more than it saves


def check_lengths(max_seq_length: int, max_query_length: int, doc_stride: int, flags: bool = False) -> None:
    """SQuAD's length rule, its one home (run_squad.py's flags, the Keras ``XLNetQuestionAnswerer``): a query piece,
    a stride, and the query with <sep> <sep> <cls> leaving a context piece in each window. ``flags``: name them as
    the command line's flags."""
    if max_query_length < 1 or doc_stride < 1 or max_seq_length < max_query_length + 4:
        dash = "--" if flags else ""
        values = (max_seq_length, max_query_length, doc_stride)
        got = ", ".join(str(v) if flags else f"{k}={v}" for k, v in
                        zip(("max_seq_length", "max_query_length", "doc_stride"), values))
        raise ValueError(f"need {dash}max_query_length >= 1, {dash}doc_stride >= 1 and {dash}max_seq_length > "
                         f"{dash}max_query_length + 3 (got {got})")


def squad_feature_spec(max_seq_length: int) -> tfrecord_io.FeatureSpec:
    seq = ("int64", (max_seq_length,))
    scalar = ("int64", ())
    return {"input_ids": seq, "segment_ids": seq, "padding_mask": seq, "p_mask": seq, "cls_index": scalar,
            "start_position": scalar, "end_position": scalar, "is_impossible": scalar, "unique_id": scalar}


# ---------------------------------------------------------------------------------------------- alignment
_WS_TABLE = np.array([chr(i).isspace() for i in range(0x3001)] + [False])  # every whitespace char is <= U+3000


def _char_out(c: str, lower: bool, keep_accents: bool) -> str:
    if not keep_accents:
        c = strip_accents(c)
    return c.lower() if lower else c


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), np.uint32)


def _is_space(codes: np.ndarray) -> np.ndarray:
    return _WS_TABLE[np.minimum(codes, len(_WS_TABLE) - 1)]


def preprocess_with_offsets(text: str, lower: bool = False, remove_space: bool = True,
                            keep_accents: bool = False) -> Tuple[str, np.ndarray, np.ndarray]:
    """XLNet's ``preprocess_text`` with provenance: (out, starts, ends) where out[k] came from
    ``text[starts[k]:ends[k]]``. Vectorised; exact except for context-dependent lower-casing (Greek final
    sigma), which :func:`align_preprocessed` repairs. (NFKD then dropping combining marks equals doing it
    per character: canonical reordering only moves combining marks, which are all dropped.)"""
    cps = _codes(text)
    n = len(cps)
    if remove_space:
        ws = _is_space(cps)
        word = np.flatnonzero(~ws)
        if not len(word):
            return "", np.zeros(0, np.int64), np.zeros(0, np.int64)
        prev_ws = np.concatenate([[True], ws[:-1]])
        # a kept whitespace char = the first of a run strictly between two words
        sep = ws & ~prev_ws
        sep[word[-1]:] = False
        keep = ~ws | sep
        starts = np.flatnonzero(keep)
        ends = starts + 1
        is_sep = sep[starts]
        ends[is_sep] = word[np.searchsorted(word, starts[is_sep])]
        kept = cps[keep].copy()
        kept[is_sep] = 32
    else:
        starts = np.arange(n)
        ends = starts + 1
        kept = cps
    out = kept.tobytes().decode("utf-32-le")
    if "``" in out or "''" in out:  # LaTeX quotes: two characters -> one '"'
        keep_q = np.ones(len(out), bool)
        i = 0
        while True:
            j = min((k for k in (out.find("``", i), out.find("''", i)) if k >= 0), default=-1)
            if j < 0:
                break
            keep_q[j + 1] = False
            ends[j] = ends[j + 1]
            i = j + 2
        out = out.replace("``", '"').replace("''", '"')
        starts, ends = starts[keep_q], ends[keep_q]
        kept = _codes(out)
    special = np.unique(kept[kept > 127]) if not lower else np.unique(kept)
    if len(special) and (lower or not keep_accents):
        table = {int(c): _char_out(chr(c), lower, keep_accents) for c in special}
        table = {c: v for c, v in table.items() if v != chr(c)}
        if table:
            lens = np.ones(len(kept), np.int64)
            for c, v in table.items():
                lens[kept == c] = len(v)
            out = out.translate(table)
            starts, ends = np.repeat(starts, lens), np.repeat(ends, lens)
    return out, starts, ends


def align_preprocessed(text: str, tokenizer: XLNetTokenizer) -> Tuple[str, np.ndarray, np.ndarray]:
    """``tokenizer.preprocess(text)`` and the original span of each of its characters."""
    mine, starts, ends = preprocess_with_offsets(text, tokenizer.lower, tokenizer.remove_space,
                                                 tokenizer.keep_accents)
    if not tokenizer.lower:  # exact by construction (tests check it on SQuAD)
        return mine, starts, ends
    ref = tokenizer.preprocess(text)
    if mine == ref:
        return ref, starts, ends
    s2: List[int] = []
    e2: List[int] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mine, ref, autojunk=False).get_opcodes():
        if op == "equal":
            s2.extend(starts[i1:i2])
            e2.extend(ends[i1:i2])
        elif op in ("replace", "insert"):
            a = starts[i1] if i1 < len(starts) else len(text)
            b = ends[i2 - 1] if i2 > i1 else a
            s2.extend([a] * (j2 - j1))
            e2.extend([b] * (j2 - j1))
    return ref, np.asarray(s2, np.int64), np.asarray(e2, np.int64)


class _OffsetEncoder:
    """SentencePiece pieces/ids with CHARACTER offsets into the encoded string, from the first output type the
    installed sentencepiece offers: ``"offset_mapping"`` (e.g. 0.2.3), ``"immutable_proto"`` (e.g. 0.2.0/0.2.1)
    or ``"proto"`` (a message in 0.2.3, serialized bytes in 0.2.1). Whether a proto's begin/end count characters
    (0.2.0/0.2.1's Python wrapper) or UTF-8 bytes is probed once on a non-ASCII string."""

    _PROBE = "\u00e9\u00e9 \u00e9"  # "ee e" with accents: 4 characters, 7 bytes
    MODES = ("offset_mapping", "immutable_proto", "proto")

    def __init__(self, sp, modes=MODES):
        self.sp = sp
        self.mode = self.bytes = None
        for mode in modes:
            try:
                end = self._decode(sp.encode(self._PROBE, out_type=mode), mode)[2][-1][1]
            except (ValueError, TypeError, RuntimeError, ImportError, AttributeError):
                continue
            if end not in (len(self._PROBE), len(self._PROBE.encode("utf-8"))):
                raise RuntimeError(f"sentencepiece out_type={mode!r} ends {self._PROBE!r} at {end}: neither its "
                                   f"{len(self._PROBE)} characters nor its {len(self._PROBE.encode('utf-8'))} bytes")
            self.mode, self.bytes = mode, end != len(self._PROBE)
            break
        if self.mode is None:
            raise RuntimeError("this sentencepiece version reports no piece offsets; install sentencepiece>=0.2")

    @staticmethod
    def _decode(encoded, mode):
        """(pieces, ids, [(begin, end)]) of one ``encode`` result, in the unit the output type reports."""
        if mode == "offset_mapping":
            return list(encoded["pieces"]), list(encoded["ids"]), [tuple(o) for o in encoded["offsets"]]
        return ([p.piece for p in encoded.pieces], [p.id for p in encoded.pieces],
                [(p.begin, p.end) for p in encoded.pieces])

    def __call__(self, text: str) -> Tuple[List[str], List[int], List[Tuple[int, int]]]:
        pieces, ids, spans = self._decode(self.sp.encode(text, out_type=self.mode), self.mode)
        if not self.bytes or text.isascii():
            return pieces, ids, spans
        b2c = np.repeat(np.arange(len(text) + 1), [len(c.encode("utf-8")) for c in text] + [1])
        return pieces, ids, [(int(b2c[b]), int(b2c[e])) for b, e in spans]


def _encoder(tokenizer: XLNetTokenizer) -> _OffsetEncoder:
    enc = getattr(tokenizer, "_squad_offset_encoder", None)
    if enc is None:
        enc = _OffsetEncoder(tokenizer.sp)
        tokenizer._squad_offset_encoder = enc
    return enc


@dataclass
class ContextTokens:
    """A paragraph's pieces, ids and the [start, end) span of each piece in the ORIGINAL text."""

    pieces: List[str]
    ids: List[int]
    starts: List[int]
    ends: List[int]


def tokenize_with_offsets(tokenizer: XLNetTokenizer, text: str, part_chars: int = WHOLE_CHARS) -> ContextTokens:
    """Same pieces as ``tokenizer.tokenize(text)`` (digit-comma rule included), each with its original span.

    A context longer than ``part_chars`` (a million characters: SQuAD's paragraphs are thousands) is tokenised in
    parts cut where a whitespace run starts (``xlnet_tf.tokenizer.text_parts``, for a whitespace-local model), so the
    alignment's per-character arrays cost one part, not the whole context. Each part's pieces are SentencePiece's
    for that part (the whole text's but where its float32 sums break a tie the other way, as ``encode(last=)``:
    ``xlnet_tf/tokenizer.py``'s docstring), with the spans the whole would give them."""
    if len(text) <= part_chars or not tokenizer.whitespace_local:
        return _tokenize_part(tokenizer, text)
    out, a = ContextTokens([], [], [], []), 0
    for _, b in text_parts(text, part_chars):
        # a part ends before a whitespace run only where its last word does not end in spaces of the preprocessing
        # (a mark such as "¨" becomes one): else the whole's ``▁`` would span both sides of the cut
        last = tokenizer.preprocess(text[max(a, b - 64):b].split()[-1]) if b < len(text) else "x"
        if not last or last.endswith(" "):
            continue
        part = _tokenize_part(tokenizer, text[a:b], after_space=a > 0)
        out.pieces += part.pieces
        out.ids += part.ids
        out.starts += [x + a for x in part.starts]
        out.ends += [x + a for x in part.ends]
        a = b
    return out


def _tokenize_part(tokenizer: XLNetTokenizer, text: str, after_space: bool = False) -> ContextTokens:
    """``tokenize_with_offsets`` of one text in one pass. ``after_space``: the text is a part of a longer one,
    starting where a whitespace run starts; a first piece that is the word boundary alone (``▁``, or a ``▁x``
    whose ``x`` SentencePiece's normalizer made of nothing) then spans what it spans in the whole: the run and
    the spaces the preprocessing makes of marks before the first word (e.g. of "¨")."""
    prep, ostart, oend = align_preprocessed(text, tokenizer)
    enc = _encoder(tokenizer)
    pieces, ids, offs = enc(prep)
    n = len(prep)
    rule = [k for k, p in enumerate(pieces) if len(p) > 1 and p[-1] == "," and p[-2].isdigit()]
    for k in reversed(rule):  # XLNetTokenizer's digit-comma rule: "1,000," -> "1,000" ","
        piece, (s, e) = pieces[k], offs[k]
        content = piece[:-1].replace(SPIECE_UNDERLINE, "")
        sub, sub_ids, sub_offs = enc(content)
        if piece[0] != SPIECE_UNDERLINE and sub and sub[0][0] == SPIECE_UNDERLINE:
            if len(sub[0]) == 1:
                sub, sub_ids, sub_offs = sub[1:], sub_ids[1:], sub_offs[1:]
            else:
                sub[0] = sub[0][1:]
                sub_ids[0] = tokenizer.sp.PieceToId(sub[0])
        base = max(s, e - 1 - len(content))
        pieces[k:k + 1] = sub + [","]
        ids[k:k + 1] = sub_ids + [tokenizer.sp.PieceToId(",")]
        offs[k:k + 1] = [(min(base + x, e - 1), min(base + y, e - 1)) for x, y in sub_offs] + [(e - 1, e)]
    S = np.asarray([o[0] for o in offs], np.int64).reshape(-1)
    E = np.asarray([o[1] for o in offs], np.int64).reshape(-1)
    space = np.append(_is_space(_codes(prep)), False)
    a = S.copy()
    while True:  # skip the leading whitespace of "▁x" pieces
        adv = (a < E) & space[np.minimum(a, n)]
        if not adv.any():
            break
        a[adv] += 1
    a = np.where(a == E, S, a)  # an all-space piece keeps its whole surface
    ostart = np.append(ostart, len(text))
    oend = np.append(oend, len(text))
    nonempty = a < E
    starts = np.where(nonempty, ostart[np.minimum(a, n)], ostart[np.minimum(S, n)])
    ends = np.where(nonempty, oend[np.maximum(E - 1, 0)], starts)
    starts, ends = starts.tolist(), ends.tolist()
    if after_space and pieces and pieces[0].startswith(SPIECE_UNDERLINE) and (
            pieces[0] == SPIECE_UNDERLINE or starts[0] == ends[0]):  # nothing but the word boundary: its spaces
        lead = len(prep) - len(prep.lstrip(" "))
        starts[0], ends[0] = 0, int(oend[lead - 1]) if lead else len(text) - len(text.lstrip())
    return ContextTokens(pieces, ids, starts, ends)


def char_to_token_span(starts: Sequence[int], ends: Sequence[int], char_start: int,
                       char_end: int) -> Optional[Tuple[int, int]]:
    """Pieces covering characters [char_start, char_end): first non-empty piece ending after char_start, last
    non-empty piece starting before char_end; None when no piece overlaps the span."""
    t = bisect.bisect_right(ends, char_start)
    while t < len(ends) and ends[t] == starts[t]:
        t += 1
    u = bisect.bisect_left(starts, char_end) - 1
    while u >= 0 and ends[u] == starts[u]:
        u -= 1
    if t >= len(ends) or u < t:
        return None
    return t, u


# ---------------------------------------------------------------------------------------------- windows
def doc_spans(n_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> List[Tuple[int, int]]:
    """(start, length) windows as the original: full windows every ``doc_stride`` until the end is covered."""
    spans, start = [], 0
    while start < n_tokens:
        length = min(n_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == n_tokens:
            break
        start += min(length, doc_stride)
    return spans


def max_context_ranges(spans: Sequence[Tuple[int, int]]) -> List[List[Tuple[int, int]]]:
    """Per window, the [a, b) ranges of its positions where it is the max-context window of the token
    (score = min(left, right context) + 0.01 * window length; the first window wins ties, as the original)."""
    if len(spans) == 1:
        return [[(0, spans[0][1])]]
    n = spans[-1][0] + spans[-1][1]
    best = np.full(n, -np.inf)
    owner = np.full(n, -1)
    for k, (st, ln) in enumerate(spans):
        pos = np.arange(st, st + ln)
        score = np.minimum(pos - st, st + ln - 1 - pos) + 0.01 * ln
        better = score > best[st:st + ln]
        best[st:st + ln][better] = score[better]
        owner[st:st + ln][better] = k
    out = []
    for k, (st, ln) in enumerate(spans):
        mine = np.flatnonzero(owner[st:st + ln] == k)
        if not len(mine):
            out.append([])
            continue
        breaks = np.flatnonzero(np.diff(mine) > 1)
        lo = np.concatenate([[mine[0]], mine[breaks + 1]])
        hi = np.concatenate([mine[breaks], [mine[-1]]]) + 1
        out.append([(int(a), int(b)) for a, b in zip(lo, hi)])
    return out


# ---------------------------------------------------------------------------------------------- index
@dataclass
class FeatureInfo:
    """Per-feature metadata for post-processing (positions are window positions)."""

    unique_id: int
    example_index: int
    doc_span_index: int
    doc_start: int            # paragraph token index of window position 0
    paragraph_len: int
    max_context: List[Tuple[int, int]]  # [a, b) ranges of window positions where this window is max-context

    def is_max_context(self, pos: int) -> bool:
        return any(a <= pos < b for a, b in self.max_context)


@dataclass
class SquadFeatureIndex:
    """What post-processing needs: examples (qas_id, context), contexts with piece spans, features."""

    qas_ids: List[str] = field(default_factory=list)
    example_context: List[int] = field(default_factory=list)       # example -> position in ``contexts``
    contexts: List[str] = field(default_factory=list)
    token_starts: List[List[int]] = field(default_factory=list)    # per context, per piece
    token_ends: List[List[int]] = field(default_factory=list)
    features: List[FeatureInfo] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    def features_by_example(self) -> List[List[FeatureInfo]]:
        out: List[List[FeatureInfo]] = [[] for _ in self.qas_ids]
        for f in self.features:
            out[f.example_index].append(f)
        return out

    def token_char_span(self, feature: FeatureInfo, start: int, end: int) -> Tuple[int, int]:
        """Window positions [start, end] (inclusive) -> [char_start, char_end) in the original context."""
        c = self.example_context[feature.example_index]
        return self.token_starts[c][feature.doc_start + start], self.token_ends[c][feature.doc_start + end]

    def to_json(self) -> dict:
        return {"meta": self.meta, "stats": self.stats, "qas_ids": self.qas_ids,
                "example_context": self.example_context, "contexts": self.contexts,
                "token_starts": self.token_starts, "token_ends": self.token_ends,
                "features": [[f.unique_id, f.example_index, f.doc_span_index, f.doc_start, f.paragraph_len,
                              [list(r) for r in f.max_context]] for f in self.features]}

    @classmethod
    def from_json(cls, d: dict) -> "SquadFeatureIndex":
        feats = [FeatureInfo(u, e, k, s, p, [tuple(r) for r in m]) for u, e, k, s, p, m in d["features"]]
        return cls(d["qas_ids"], d["example_context"], d["contexts"], d["token_starts"], d["token_ends"], feats,
                   d.get("meta", {}), d.get("stats", {}))

    def save(self, path: str) -> None:
        """Atomic write (tmp file + rename)."""
        write_json(path, self.to_json(), newline=False, separators=(",", ":"))

    @classmethod
    def load(cls, path: str) -> "SquadFeatureIndex":
        with open(path, "r", encoding="utf-8") as f:
            return cls.from_json(json.load(f))


def index_path(tfrecord_path: str) -> str:
    return tfrecord_path + ".index.json"


# ---------------------------------------------------------------------------------------------- features
@dataclass
class _Config:
    max_seq_length: int
    doc_stride: int
    max_query_length: int
    is_training: bool


def _check_config(c: _Config) -> None:
    if c.max_query_length < 1 or c.doc_stride < 1:
        raise ValueError(f"max_query_length ({c.max_query_length}) and doc_stride ({c.doc_stride}) must be >= 1")
    if c.max_seq_length < c.max_query_length + 4:
        raise ValueError(f"max_seq_length ({c.max_seq_length}) must exceed max_query_length "
                         f"({c.max_query_length}) + 3 so a window holds at least one paragraph token")


# A paragraph group: (context_id, context, [(example_index, question, answer_start, answer_end, is_impossible)])
_Group = Tuple[int, str, List[Tuple[int, str, int, int, bool]]]


def _encode_group(tok: XLNetTokenizer, group: _Group, cfg: _Config):
    """One paragraph (tokenised once) and its questions -> (context_id, ContextTokens, compact features,
    unmappable example indices, truncated question count). A compact feature is (example_index,
    doc_span_index, doc_start, paragraph_len, query_ids, start_position, end_position, is_impossible,
    max_context)."""
    context_id, context, questions = group
    ctx = tokenize_with_offsets(tok, context)
    n_tok = len(ctx.ids)
    feats, unmappable, truncated = [], [], 0
    span_cache: Dict[int, tuple] = {}
    for ex_index, question, a_start, a_end, impossible in questions:
        q_ids = tok.encode(question, first=cfg.max_query_length + 1)  # costs what is kept, and sees a cut
        if len(q_ids) > cfg.max_query_length:
            q_ids, truncated = q_ids[:cfg.max_query_length], truncated + 1
        tok_span = None
        if not impossible:
            tok_span = char_to_token_span(ctx.starts, ctx.ends, a_start, a_end)
            if tok_span is None:
                unmappable.append(ex_index)
                if cfg.is_training:
                    continue
        max_doc = cfg.max_seq_length - len(q_ids) - 3
        if max_doc not in span_cache:
            spans = doc_spans(n_tok, max_doc, cfg.doc_stride)
            span_cache[max_doc] = (spans, max_context_ranges(spans))
        spans, ranges = span_cache[max_doc]
        for k, (st, ln) in enumerate(spans):
            cls_index = ln + len(q_ids) + 2
            if tok_span is not None and st <= tok_span[0] and tok_span[1] < st + ln:
                sp, ep, imp = tok_span[0] - st, tok_span[1] - st, 0
            else:
                sp = ep = cls_index
                imp = 1 if (impossible or tok_span is not None) else 0
            feats.append((ex_index, k, st, ln, q_ids, sp, ep, imp, ranges[k]))
    return context_id, ctx, feats, unmappable, truncated


_WORKER: dict = {}


def _worker_init(tokenizer_args: dict, cfg: _Config) -> None:
    _WORKER.update(tokenizer=XLNetTokenizer(**tokenizer_args), cfg=cfg)


def _worker_encode(groups: List[_Group]):
    return [_encode_group(_WORKER["tokenizer"], g, _WORKER["cfg"]) for g in groups]


def _tokenizer_args(tok: XLNetTokenizer) -> dict:
    return {"spiece_model_file": tok.spiece_model_file, "lower": tok.lower, "remove_space": tok.remove_space,
            "keep_accents": tok.keep_accents}


def _groups(examples: Sequence, per_question: bool = False) -> List[_Group]:
    """Examples grouped by paragraph (order of first appearance); ``per_question`` = one group per example."""
    groups: Dict[object, _Group] = {}
    out: List[_Group] = []
    for i, ex in enumerate(examples):
        q = (i, ex.question, ex.answer_start, ex.answer_end, bool(ex.is_impossible))
        key = i if per_question else (ex.context_id, ex.context)
        if key not in groups:
            groups[key] = (ex.context_id, ex.context, [])
            out.append(groups[key])
        groups[key][2].append(q)
    return out


def _record(ids: np.ndarray, f, tok: XLNetTokenizer, L: int, unique_id: int) -> Dict[str, object]:
    _, _, st, n, q, sp, ep, imp, _ = f
    nq = len(q)
    cls = n + nq + 2
    input_ids = np.zeros(L, np.int64)  # padding id 0, as the original
    input_ids[:n] = ids[st:st + n]
    input_ids[n] = tok.sep_id
    input_ids[n + 1:n + 1 + nq] = q
    input_ids[n + 1 + nq] = tok.sep_id
    input_ids[cls] = tok.cls_id
    seg = np.full(L, SEG_PAD, np.int64)
    seg[:n + 1] = SEG_P
    seg[n + 1:cls] = SEG_Q
    seg[cls] = SEG_CLS
    pad = np.zeros(L, np.int64)
    pad[:cls + 1] = 1
    p_mask = np.ones(L, np.int64)
    p_mask[:n] = 0
    p_mask[cls] = 0
    return {"input_ids": input_ids, "segment_ids": seg, "padding_mask": pad, "p_mask": p_mask, "cls_index": cls,
            "start_position": sp, "end_position": ep, "is_impossible": imp, "unique_id": unique_id}


def iter_squad_features(examples: Sequence, tokenizer: XLNetTokenizer, index: SquadFeatureIndex,
                        max_seq_length: int = 512, doc_stride: int = 128, max_query_length: int = 64,
                        is_training: bool = False, num_workers: Optional[int] = 1,
                        per_question: bool = False) -> Iterator[Dict[str, object]]:
    """Feature records of ``examples`` (``tasks.squad.reader.SquadExample``), filling ``index`` as it goes.

    Paragraphs are tokenised once for all their questions (``per_question=True``: once per question, the
    naive way, for benchmarks). ``num_workers`` > 1 encodes paragraphs in a process pool (None: CPUs - 1,
    at most 8) when there are at least ``MIN_GROUPS_FOR_POOL`` paragraphs; records come out in the same order.
    Training drops answerable questions whose answer covers no piece (counted in ``index.stats``).
    """
    cfg = _Config(max_seq_length, doc_stride, max_query_length, is_training)
    _check_config(cfg)
    groups = _groups(examples, per_question)
    index.qas_ids = [ex.qas_id for ex in examples]
    index.example_context = [-1] * len(examples)
    stats = index.stats
    stats.update(examples=len(examples), features=0, unmappable=[], truncated_questions=0, multi_window=0)
    if num_workers is None:  # one CPU stays with this process, which serialises the records
        num_workers = min(hardware.usable_cpus(), 9) - 1
    if num_workers <= 1 or len(groups) < MIN_GROUPS_FOR_POOL:
        results: Iterable = (_encode_group(tokenizer, g, cfg) for g in groups)
        pool = None
    else:
        chunk = max(1, min(64, len(groups) // (num_workers * 8)))
        chunks = [groups[i:i + chunk] for i in range(0, len(groups), chunk)]
        ctx = multiprocessing.get_context("spawn")  # safe whatever threads (TF) the parent runs
        pool = ctx.Pool(num_workers, _worker_init, (_tokenizer_args(tokenizer), cfg))
        results = (r for batch in pool.imap(_worker_encode, chunks) for r in batch)
    try:
        for (_, context, questions), (_, toks, feats, unmappable, truncated) in zip(groups, results):
            c = len(index.contexts)
            index.contexts.append(context)
            index.token_starts.append(toks.starts)
            index.token_ends.append(toks.ends)
            for q in questions:
                index.example_context[q[0]] = c
            stats["unmappable"].extend(examples[i].qas_id for i in unmappable)
            stats["truncated_questions"] += truncated
            ids = np.asarray(toks.ids, np.int64)
            for f in feats:
                stats["multi_window"] += f[1] == 1
                uid = UNIQUE_ID_BASE + len(index.features)
                index.features.append(FeatureInfo(uid, f[0], f[1], f[2], f[3], list(f[8])))
                yield _record(ids, f, tokenizer, max_seq_length, uid)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    stats["features"] = len(index.features)


def build_squad_features(examples: Sequence, tokenizer: XLNetTokenizer, max_seq_length: int = 512,
                         doc_stride: int = 128, max_query_length: int = 64, is_training: bool = False,
                         num_workers: Optional[int] = 1) -> Tuple[List[Dict[str, object]], SquadFeatureIndex]:
    """In memory: (records, index). For serving, tests and small sets."""
    index = SquadFeatureIndex()
    records = list(iter_squad_features(examples, tokenizer, index, max_seq_length, doc_stride, max_query_length,
                                       is_training, num_workers))
    return records, index


def features_meta(examples: Sequence, tokenizer: XLNetTokenizer, max_seq_length: int, doc_stride: int,
                  max_query_length: int, is_training: bool) -> dict:
    """What a cached SQuAD TFRecord (and its index) must match to be reused: layout, tokenizer, lengths and
    a digest of the examples themselves (so any subset/split of a file gets its own cache)."""
    h = hashlib.sha1()
    for ex in examples:
        h.update(json.dumps([ex.qas_id, ex.question, ex.context_id, ex.answer_start, ex.answer_text,
                             bool(ex.is_impossible)]).encode("utf-8"))
    h.update(json.dumps(sorted({ex.context_id: hashlib.sha1(ex.context.encode("utf-8")).hexdigest()
                                for ex in examples}.items())).encode("utf-8"))
    return {"task": "squad", "layout": LAYOUT_VERSION, "examples_sha1": h.hexdigest(), "examples": len(examples),
            "tokenizer": dict(_tokenizer_args(tokenizer), model=stat_identity(tokenizer.spiece_model_file)),
            "max_seq_length": max_seq_length, "doc_stride": doc_stride, "max_query_length": max_query_length,
            "is_training": bool(is_training)}


def write_squad_features(examples: Sequence, output_path: str, tokenizer: XLNetTokenizer,
                         max_seq_length: int = 512, doc_stride: int = 128, max_query_length: int = 64,
                         is_training: bool = False, num_workers: Optional[int] = None,
                         progress: bool = True) -> SquadFeatureIndex:
    """Writes (or reuses, when both the manifest and the index match) ``output_path`` and its index.

    Returns the :class:`SquadFeatureIndex` (also at ``index_path(output_path)``); the record count is
    ``len(index.features)``.
    """
    meta = features_meta(examples, tokenizer, max_seq_length, doc_stride, max_query_length, is_training)
    ipath = index_path(output_path)
    if tfrecord_io.is_valid_cache(output_path, meta) and os.path.isfile(ipath):
        try:
            index = SquadFeatureIndex.load(ipath)
            if index.meta == json.loads(json.dumps(meta)):
                return index
        except (OSError, ValueError, KeyError, TypeError):
            pass
    index = SquadFeatureIndex(meta=meta)
    records = iter_squad_features(examples, tokenizer, index, max_seq_length, doc_stride, max_query_length,
                                  is_training, num_workers)
    tfrecord_io.write_tfrecords(output_path, records, squad_feature_spec(max_seq_length), meta=meta,
                                desc="SQuAD features", progress=progress)
    index.save(ipath)  # after the manifest; a reader trusts the pair only when both metas match
    return index


def load_feature_index(output_path: str) -> SquadFeatureIndex:
    """The index written next to ``output_path`` by :func:`write_squad_features`."""
    ipath = index_path(output_path)
    if not os.path.isfile(ipath):
        raise FileNotFoundError(f"SQuAD feature index not found: {ipath} (rebuild with write_squad_features)")
    index = SquadFeatureIndex.load(ipath)
    manifest = tfrecord_io.read_manifest(output_path)
    if manifest is None or manifest.get("meta") != index.meta:
        raise ValueError(f"{ipath} does not belong to {output_path} (different meta); rebuild the features")
    return index


def squad_dataset(paths, max_seq_length: int, batch_size: int, is_training: bool, **kwargs):
    """TFRecords -> tf.data batches of the SQuAD feature dict (int32)."""
    return tfrecord_io.make_dataset(paths, squad_feature_spec(max_seq_length), batch_size, is_training, **kwargs)


def answer_mapping_failures(examples: Sequence, tokenizer: XLNetTokenizer,
                            all_answers: bool = True) -> Tuple[int, List[Tuple[str, str, Optional[str]]]]:
    """Maps gold answers to pieces and back (the original-text substring of the pieces' spans).

    Returns (answers checked, [(qas_id, gold, recovered or None)] for those the official normalisation does
    not score as an exact match: boundaries inside a piece, e.g. "1990" in "▁1990s").
    """
    cache: Dict[Tuple[int, str], ContextTokens] = {}
    checked, failures = 0, []
    for ex in examples:
        pairs = list(zip(ex.answer_starts, ex.answers)) if all_answers else \
            ([(ex.answer_start, ex.answer_text)] if not ex.is_impossible else [])
        if not pairs:
            continue
        key = (ex.context_id, ex.context)
        if key not in cache:
            cache[key] = tokenize_with_offsets(tokenizer, ex.context)
        toks = cache[key]
        for start, text in pairs:
            checked += 1
            span = char_to_token_span(toks.starts, toks.ends, start, start + len(text))
            got = None if span is None else ex.context[toks.starts[span[0]]:toks.ends[span[1]]]
            if got is None or normalize_answer(got) != normalize_answer(text):
                failures.append((ex.qas_id, text, got))
    return checked, failures
