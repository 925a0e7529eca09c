"""SavedModel export of a SQuAD model: raw question + context in, answer span (characters of the context) out.

Signatures:
* ``serving_default(question: string [batch], context: string [batch])`` ->
  ``answer_text`` string [batch]: the best non-null span (the ORIGINAL context substring, stripped of
  whitespace and format characters at its edges as ``tasks.squad.postprocess.strip_answer``);
  ``answer_start``/``answer_end`` int32 [batch]: its ``[start, end)`` in CHARACTERS (Unicode code points, as
  SQuAD's ``answer_start``) of the original context string, so ``context[start:end] == answer_text``;
  ``score`` float32: start_log_prob + end_log_prob of that span; ``null_odds`` float32: the MIN ``cls_logit``
  over the context's windows (the v2 no-answer score, as ``null_odds.json``); ``no_answer_probability`` =
  sigmoid(null_odds); ``has_answer`` bool = a span was found and ``null_odds <= null_threshold`` (the threshold
  baked in at export; without one, only the first condition). When no span is valid (empty context): text "",
  start = end = -1, score -2e6 (the nonce entry of ``tasks.squad.postprocess``).
* ``serve_ids(input_ids, segment_ids, padding_mask, p_mask: int32 [windows, L], cls_index: int32 [windows])``
  -> the head's raw beam outputs (``start_top_*``, ``end_top_*``, ``cls_logits``), one row per window.

Everything runs in-graph (load in a fresh process with ``import tensorflow_text`` only):
1. Alignment. The context is decoded to code points and XLNet's preprocessing is applied PER CHARACTER
   (whitespace runs -> one space between words, edges dropped; LaTeX quote pairs ```` `` ```` / ``''`` -> ``"``
   paired left to right inside each run; NFKD minus combining marks; lower-casing), keeping for every
   preprocessed character the original character it came from (and, for a collapsed space or a quote pair, the
   end of what it replaced). The per-character result is the whole-string preprocessing (NFKD then dropping
   the combining marks equals doing it per character: reordering only moves combining marks, all dropped).
   Lower-casing is context dependent only for a Greek final sigma: the SentencePiece input is then the
   whole-string ``preprocess`` (same length, so the map still holds).
2. ``SentencePiece`` with offsets (tensorflow-text, byte offsets into the preprocessed text, converted to
   characters), XLNet's digit-comma rule re-encoded with offsets, then each piece's span in the ORIGINAL
   context exactly as ``tasks.squad.features.tokenize_with_offsets`` (leading whitespace of ``▁x`` pieces excluded; an
   all-space piece keeps its whole surface). Ids equal ``TFXLNetTokenizer.tokenize``.
3. Windows as ``tasks/squad/features.py``: ``P <sep> Q <sep> <cls>`` right-padded, the question's first
   ``max_query_length`` pieces, ``max_seq_length - len(Q) - 3`` paragraph pieces every ``doc_stride``, the
   max-context rule (score ``min(left, right) + 0.01 * length``, first window wins ties). The windows of the
   request go through the model in length groups (``xlnet_tf.export.run_in_groups``: the full windows of long
   contexts apart from the short last ones and short contexts, each group padded to its own longest).
4. Best span as ``tasks.squad.postprocess.postprocess``: candidates start_k x end_k with start, end inside the
   paragraph, start at its max-context window, ``end >= start``, length <= ``max_answer_length``; score summed
   in float64; the first best in (window, start_k, end_k) order wins, as the Python sort.

Known limits (the same as the pieces used): the in-graph pieces equal the Python features' with the pinned
``sentencepiece`` < 0.2.2 (see ``xlnet_tf/tf_tokenizer.py``; with 0.2.2+ ~1.3e-4 of real strings are segmented
differently); an EMPTY context gives one window without paragraph pieces (the Python features
give none) and so the "no valid span" output.
"""

from __future__ import annotations

import unicodedata
from typing import Dict, Optional, Tuple

import tensorflow as tf
import tensorflow_text
from tensorflow_text.python.ops.sentencepiece_tokenizer import gen_sentencepiece_tokenizer as _spm_ops

from xlnet_tf.export import ServingModule, float32_outputs, padded_batch_length
from xlnet_tf.tf_tokenizer import SPIECE_UNDERLINE, _lower, assert_utf8

SEG_P, SEG_Q, SEG_CLS, SEG_PAD = 0, 1, 2, 3
NO_SPAN_SCORE = -2e6
# Every code point for which Python's str.isspace() is true (all are <= U+3000).
SPACE_CODEPOINTS = tuple(cp for cp in range(0x3001) if chr(cp).isspace())
# What an answer is stripped of at its edges (tasks.squad_postprocess.strip_answer): whitespace and the
# invisible format characters (Unicode category Cf, e.g. U+200E, U+FEFF).
STRIP_CODEPOINTS = SPACE_CODEPOINTS + tuple(cp for cp in range(0x110000) if unicodedata.category(chr(cp)) == "Cf")
_BIG = 2 ** 62


# ---------------------------------------------------------------------------------------------- small helpers
def _is_space(codepoints: tf.Tensor, table: Tuple[int, ...] = SPACE_CODEPOINTS) -> tf.Tensor:
    cps = tf.cast(codepoints, tf.int32)
    return tf.reduce_any(tf.equal(cps[:, None], tf.constant(table, tf.int32)[None, :]), axis=1)


def _at(flat: tf.Tensor, index: tf.Tensor, pad) -> tf.Tensor:
    """``flat[index]`` where ``index`` may equal ``len(flat)`` (gives ``pad``): safe on empty tensors."""
    ext = tf.concat([flat, tf.cast(tf.reshape(pad, [1]), flat.dtype)], axis=0)
    return tf.gather(ext, tf.clip_by_value(index, 0, tf.shape(flat, out_type=index.dtype)[0]))


def _next_true(mask: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """Smallest i >= index with mask[i] (flat int64 indices), else ``_BIG``."""
    where = tf.where(mask)[:, 0]
    k = tf.searchsorted(where[None, :], tf.cast(index, tf.int64)[None, :], side="left")[0]
    return _at(where, k, _BIG)


def _prev_true(mask: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """Largest i < index with mask[i] (flat int64 indices), else -1."""
    where = tf.where(mask)[:, 0]
    k = tf.searchsorted(where[None, :], tf.cast(index, tf.int64)[None, :], side="left")[0] - 1
    return tf.where(k >= 0, _at(where, k, -1), tf.constant(-1, tf.int64))


def _row_positions(rt: tf.RaggedTensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(row id, position within the row) of every value of a ragged [rows, (n)] tensor (int64)."""
    rows = rt.value_rowids()
    pos = tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(rt.row_starts(), rows)
    return rows, pos


def _ragged_to_chars(byte_offsets: tf.RaggedTensor, text: tf.Tensor) -> tf.RaggedTensor:
    """Byte offsets into ``text`` (ragged [batch, (k)]) -> character offsets (chars starting before it)."""
    _, starts = tf.strings.unicode_decode_with_offsets(text, "UTF-8", errors="replace")
    dense_starts = starts.to_tensor(default_value=_BIG)
    dense_offsets = byte_offsets.to_tensor(default_value=0)
    chars = tf.searchsorted(dense_starts, dense_offsets, side="left", out_type=tf.int64)
    return tf.RaggedTensor.from_tensor(chars, lengths=byte_offsets.row_lengths())


# ---------------------------------------------------------------------------------------------- 1. alignment
def preprocess_with_origin(tokenizer, context: tf.Tensor) -> Dict[str, object]:
    """XLNet's preprocessing of ``context`` [batch] with provenance, in-graph.

    Returns ``text`` [batch] (the preprocessed strings = ``tokenizer.preprocess``), ``origin_start`` /
    ``origin_end`` ragged int64 [batch, (preprocessed chars)]: preprocessed char k came from original chars
    ``[origin_start[k], origin_end[k])``, ``codepoints`` ragged [batch, (original chars)] and ``num_chars``.
    """
    context = assert_utf8(context)
    cps = tf.strings.unicode_decode(context, "UTF-8", errors="replace")
    rows, pos = _row_positions(cps)
    flat = cps.flat_values
    n = tf.size(flat, out_type=tf.int64)
    chars = tf.strings.unicode_encode(flat[:, None], "UTF-8")
    space = _is_space(flat)
    same_row_prev = tf.concat([[False], tf.equal(rows[1:], rows[:-1])], axis=0)
    same_row_next = tf.concat([tf.equal(rows[1:], rows[:-1]), [False]], axis=0)
    out = chars
    end = pos + 1
    if tokenizer.remove_space:
        word = tf.logical_not(space)
        prev_word = same_row_prev & tf.concat([[False], word[:-1]], axis=0)
        last_word = tf.math.unsorted_segment_max(tf.where(word, pos, -1), rows, cps.nrows())
        # a kept whitespace char = the first of a run strictly between two words (-> " ", spanning the run)
        sep = space & prev_word & (pos < tf.gather(last_word, rows))
        out = tf.where(word, chars, tf.where(sep, " ", ""))
        nxt = _next_true(word, tf.range(n))
        end = tf.where(sep, nxt - tf.gather(cps.row_starts(), rows), end)
    for quote in ("`", "'"):  # "``" / "''" -> '"', pairs taken left to right in each run
        q = tf.equal(flat, ord(quote))
        run_start = q & tf.logical_not(same_row_prev & tf.concat([[False], q[:-1]], axis=0))
        start_of_run = tf.gather(tf.concat([tf.where(run_start)[:, 0], [0]], axis=0),
                                 tf.maximum(tf.cumsum(tf.cast(run_start, tf.int64)) - 1, 0))
        offset = tf.range(n) - start_of_run
        next_q = same_row_next & tf.concat([q[1:], [False]], axis=0)
        first = q & tf.equal(offset % 2, 0) & next_q
        second = q & tf.equal(offset % 2, 1)
        out = tf.where(first, '"', tf.where(second, "", out))
        end = tf.where(first, pos + 2, end)
    if not tokenizer.keep_accents:
        out = tensorflow_text.normalize_utf8(out, "NFKD")
        out = tf.strings.regex_replace(out, tokenizer._combining_re, "")
    if tokenizer.lower:
        out = _lower(out)
    lengths = tf.strings.length(out, unit="UTF8_CHAR")
    joined = tf.strings.reduce_join(cps.with_flat_values(out), axis=1)
    text = joined
    if tokenizer.lower:  # final sigma: the whole-string lower-casing (same length) feeds SentencePiece
        whole = tokenizer.preprocess(context)
        same = tf.equal(tf.strings.length(whole, unit="UTF8_CHAR"), tf.strings.length(joined, unit="UTF8_CHAR"))
        text = tf.where(same, whole, joined)
    out_rows = tf.repeat(rows, lengths)
    nrows = cps.nrows()
    origin_start = tf.RaggedTensor.from_value_rowids(tf.repeat(pos, lengths), out_rows, nrows=nrows)
    origin_end = tf.RaggedTensor.from_value_rowids(tf.repeat(end, lengths), out_rows, nrows=nrows)
    return {"text": text, "origin_start": origin_start, "origin_end": origin_end, "codepoints": cps,
            "num_chars": cps.row_lengths()}


# ---------------------------------------------------------------------------------------------- 2. pieces
def _spm_with_offsets(tokenizer, text: tf.Tensor):
    pieces, splits, starts, ends = _spm_ops.sentencepiece_tokenize_with_offsets_op(
        tokenizer._spm.resource_handle, text, nbest_size=0, alpha=1.0, add_bos=False, add_eos=False,
        reverse=False, out_type=tf.string)
    rt = lambda v: tf.RaggedTensor.from_row_splits(v, splits, validate=False)  # noqa: E731
    return rt(pieces), rt(starts), rt(ends)


def pieces_with_offsets(tokenizer, text: tf.Tensor):
    """Preprocessed text [batch] -> (pieces, byte starts, byte ends), ragged [batch, (pieces)], with XLNet's
    digit-comma rule (``"1,000,"`` -> ``"1,000" ","``) applied as ``features.tokenize_with_offsets``."""
    pieces, starts, ends = _spm_with_offsets(tokenizer, text)
    flat, fs, fe = pieces.flat_values, starts.flat_values, ends.flat_values
    hit = tf.strings.regex_full_match(flat, tokenizer._digit_comma_re)
    src, s, e = tf.boolean_mask(flat, hit), tf.boolean_mask(fs, hit), tf.boolean_mask(fe, hit)
    body = tf.strings.regex_replace(tf.strings.regex_replace(src, ",$", ""), SPIECE_UNDERLINE, "")
    sub, sub_s, sub_e = _spm_with_offsets(tokenizer, body)
    rows = sub.value_rowids()
    vals = sub.flat_values
    is_first = tf.equal(tf.range(tf.size(vals, out_type=tf.int64)), tf.gather(sub.row_starts(), rows))
    src_bare = tf.logical_not(tf.strings.regex_full_match(src, "(?s)\u2581.*"))
    fix = is_first & tf.gather(src_bare, rows) & tf.strings.regex_full_match(vals, "(?s)\u2581.*")
    vals = tf.where(fix, tf.strings.regex_replace(vals, "^\u2581", ""), vals)
    keep = tf.logical_not(fix & tf.equal(vals, ""))
    base = tf.maximum(s, e - 1 - tf.cast(tf.strings.length(body), tf.int64))   # bytes, as the offsets
    last = tf.gather(e - 1, rows)
    vs = tf.minimum(tf.gather(base, rows) + sub_s.flat_values, last)
    ve = tf.minimum(tf.gather(base, rows) + sub_e.flat_values, last)
    m = tf.size(src)
    comma_row = lambda v: tf.RaggedTensor.from_tensor(tf.reshape(v, [m, 1]))  # noqa: E731
    mask = sub.with_flat_values(keep)
    sub_p = tf.concat([tf.ragged.boolean_mask(sub.with_flat_values(vals), mask),
                       comma_row(tf.fill([m], ","))], axis=1)
    sub_s2 = tf.concat([tf.ragged.boolean_mask(sub.with_flat_values(vs), mask), comma_row(e - 1)], axis=1)
    sub_e2 = tf.concat([tf.ragged.boolean_mask(sub.with_flat_values(ve), mask), comma_row(e)], axis=1)
    # splice: rows [0, n) of each table are the pieces, [n, n + m) the replacements of the hits
    n = tf.size(flat, out_type=tf.int64)
    idx = tf.where(hit, n + tf.cumsum(tf.cast(hit, tf.int64)) - 1, tf.range(n))

    def splice(values, subs):
        table = tf.concat([tf.RaggedTensor.from_tensor(values[:, None]), subs], axis=0)
        out = tf.gather(table, idx)
        return tf.RaggedTensor.from_row_splits(out.values, tf.gather(out.row_splits, pieces.row_splits),
                                               validate=False)

    return splice(flat, sub_p), splice(fs, sub_s2), splice(fe, sub_e2)


def tokenize_with_offsets(tokenizer, context: tf.Tensor) -> Dict[str, object]:
    """Contexts [batch] -> ``ids`` int32 and ``starts``/``ends`` int64 ragged [batch, (pieces)] (each piece's
    ``[start, end)`` in characters of the ORIGINAL context, as ``tasks.squad.features.tokenize_with_offsets``), plus the
    original ``codepoints`` and ``num_chars``."""
    prep = preprocess_with_origin(tokenizer, context)
    pieces, bstart, bend = pieces_with_offsets(tokenizer, prep["text"])
    S = _ragged_to_chars(bstart, prep["text"])
    E = _ragged_to_chars(bend, prep["text"])
    ostart, oend = prep["origin_start"], prep["origin_end"]
    rows = pieces.value_rowids()
    base = tf.gather(ostart.row_starts(), rows)             # first preprocessed char of the row (flat index)
    m = tf.gather(ostart.row_lengths(), rows)               # preprocessed length of the row
    n_orig = tf.gather(prep["num_chars"], rows)
    s, e = S.flat_values, E.flat_values
    prep_cps, _ = tf.strings.unicode_decode_with_offsets(prep["text"], "UTF-8", errors="replace")
    word = tf.logical_not(_is_space(prep_cps.flat_values))
    a = tf.minimum(_next_true(word, base + s), base + e) - base     # skip the leading spaces of "▁x"
    a = tf.where(tf.equal(a, e), s, a)                               # an all-space piece keeps its surface

    def origin(values, k):  # values[row][k], or the original length when k == m
        return tf.where(k < m, _at(values.flat_values, base + tf.minimum(k, tf.maximum(m - 1, 0)), 0), n_orig)

    nonempty = a < e
    starts = tf.where(nonempty, origin(ostart, a), origin(ostart, s))
    ends = tf.where(nonempty, origin(oend, tf.maximum(e - 1, 0)), starts)
    ids = tokenizer.piece_to_id(pieces.flat_values)
    return {"ids": pieces.with_flat_values(ids), "starts": pieces.with_flat_values(starts),
            "ends": pieces.with_flat_values(ends), "codepoints": prep["codepoints"],
            "num_chars": prep["num_chars"]}


# ---------------------------------------------------------------------------------------------- 3. windows
def squad_windows(ctx_ids: tf.RaggedTensor, q_ids: tf.RaggedTensor, max_seq_length: int, doc_stride: int,
                  max_query_length: int, sep_id: int, cls_id: int) -> Tuple[Dict[str, tf.Tensor], Dict]:
    """Paragraph ids [batch, (n)] and question ids [batch, (q)] -> (features [windows, L], windows) where
    ``windows`` holds ``example_index``, ``doc_start``, ``paragraph_len`` [windows] and ``max_context`` bool
    [windows, L] (window position p is the max-context window of its paragraph token)."""
    L = int(max_seq_length)
    if max_seq_length < max_query_length + 4:
        raise ValueError(f"max_seq_length ({max_seq_length}) must exceed max_query_length ({max_query_length}) "
                         f"+ 3")
    ctx_ids = tf.cast(ctx_ids, tf.int32)
    batch = ctx_ids.nrows(out_type=tf.int64)
    q = tf.cast(q_ids, tf.int32)
    n = ctx_ids.row_lengths()
    nq = tf.minimum(q.row_lengths(), max_query_length)         # each question keeps its first pieces
    M = L - nq - 3                                              # paragraph pieces per window
    step = tf.minimum(M, tf.constant(doc_stride, tf.int64))
    K = 1 + tf.maximum(tf.zeros_like(n), (n - M + step - 1) // step)           # windows per example (>= 1)
    ex = tf.repeat(tf.range(batch), K)                          # [W]
    k = tf.range(tf.size(ex, out_type=tf.int64)) - tf.gather(tf.cumsum(K, exclusive=True), ex)  # window in example
    start = k * tf.gather(step, ex)
    plen = tf.maximum(tf.minimum(tf.gather(n, ex) - start, tf.gather(M, ex)), tf.zeros_like(start))
    # Each window's row, position by position on a dense [W, T] grid (no ragged concatenation: a few dozen ops):
    # paragraph [0, plen), SEP, question, SEP, CLS, then padding.
    nq_w = tf.gather(nq, ex)
    pl, qn = plen[:, None], nq_w[:, None]
    para_first = tf.gather(ctx_ids.row_starts(), ex)[:, None] + start[:, None]   # flat index of the window's 1st
    T = padded_batch_length(plen + nq_w + 3, L)                 # the call's longest window, rounded up
    p = tf.range(tf.cast(T, tf.int64))[None, :]
    in_para, in_q = p < pl, (p > pl) & (p <= pl + qn)
    sep1, sep2, is_cls = tf.equal(p, pl), tf.equal(p, pl + qn + 1), tf.equal(p, pl + qn + 2)
    para_tok = _at(ctx_ids.flat_values, para_first + p, 0)
    q_tok = _at(q.flat_values, tf.gather(q.row_starts(), ex)[:, None] + p - pl - 1, 0)
    tokens = tf.where(in_para, para_tok, tf.where(in_q, q_tok, tf.where(sep1 | sep2, sep_id,
                                                                          tf.where(is_cls, cls_id, 0))))
    segments = tf.where(in_para | sep1, SEG_P, tf.where(in_q | sep2, SEG_Q, tf.where(is_cls, SEG_CLS, SEG_PAD)))
    features = {"input_ids": tokens,
                "segment_ids": segments,
                "padding_mask": tf.cast(p <= pl + qn + 2, tf.int32),
                "p_mask": tf.where(in_para | is_cls, 0, 1),
                "cls_index": tf.cast(plen + nq_w + 2, tf.int32)}
    # max-context rule: score 100 * min(left, right) + length (= 100x the original's), first window on ties; on a
    # dense [W, L] grid whose positions past a window's paragraph go to one extra, ignored segment
    pv = tf.range(L, dtype=tf.int64)[None, :]
    in_window = pv < pl
    n_seg = tf.size(ctx_ids.flat_values, out_type=tf.int64)
    seg = tf.where(in_window, para_first + pv, n_seg)
    score = 100 * tf.minimum(pv, pl - 1 - pv) + pl
    best = tf.gather(tf.math.unsorted_segment_max(score, seg, n_seg + 1), seg)
    wid = tf.range(tf.size(ex, out_type=tf.int64))[:, None] + tf.zeros_like(pv)
    owner = tf.math.unsorted_segment_min(tf.where(tf.equal(score, best), wid, _BIG), seg, n_seg + 1)
    mine = in_window & tf.equal(tf.gather(owner, seg), wid)
    windows = {"example_index": ex, "doc_start": start, "paragraph_len": plen, "max_context": mine}
    return features, windows


# ---------------------------------------------------------------------------------------------- 4. best span
def best_spans(outputs: Dict[str, tf.Tensor], windows: Dict, tokens: Dict, context: tf.Tensor,
               max_answer_length: int, allow_last_paragraph_token: bool = False) -> Dict[str, tf.Tensor]:
    """The head's beam outputs over all windows -> the best span per example (see the module docstring)."""
    ex = windows["example_index"]
    batch = tf.shape(context, out_type=tf.int64)[0]
    s_ix = tf.cast(outputs["start_top_index"], tf.int64)
    e_ix = tf.cast(outputs["end_top_index"], tf.int64)
    k_start = s_ix.shape[1]
    k_end = e_ix.shape[1] // k_start
    start = tf.repeat(s_ix, k_end, axis=1)                      # [W, k_start * k_end], (i, j) order
    slp = tf.repeat(tf.cast(outputs["start_top_log_probs"], tf.float64), k_end, axis=1)
    elp = tf.cast(outputs["end_top_log_probs"], tf.float64)
    plen = windows["paragraph_len"][:, None] - (0 if allow_last_paragraph_token else 1)  # as the original
    valid = ((start < plen) & (e_ix < plen) & (e_ix >= start) & (e_ix - start + 1 <= max_answer_length)
             & tf.gather(windows["max_context"], tf.minimum(start, windows["max_context"].shape[1] - 1),
                         batch_dims=1))
    score = tf.where(valid, slp + elp, tf.constant(-float("inf"), tf.float64))
    kk = k_start * k_end
    flat_score = tf.reshape(score, [-1])
    flat_ex = tf.repeat(ex, kk)
    best = tf.math.unsorted_segment_max(flat_score, flat_ex, batch)
    cand = tf.range(tf.size(flat_score, out_type=tf.int64))
    is_best = tf.reshape(valid, [-1]) & tf.equal(flat_score, tf.gather(best, flat_ex))
    chosen = tf.math.unsorted_segment_min(tf.where(is_best, cand, _BIG), flat_ex, batch)
    found = chosen < _BIG
    chosen = tf.where(found, chosen, 0)
    w = chosen // kk
    doc_start = _at(windows["doc_start"], w, 0)
    t0 = doc_start + _at(tf.reshape(start, [-1]), chosen, 0)
    t1 = doc_start + _at(tf.reshape(e_ix, [-1]), chosen, 0)
    row0 = tokens["starts"].row_starts()
    a = _at(tokens["starts"].flat_values, row0 + t0, 0)
    b = _at(tokens["ends"].flat_values, row0 + t1, 0)
    # strip_answer(context[a:b]) in code points, as the Python post-processing
    cps = tokens["codepoints"]
    c0 = cps.row_starts()
    word = tf.logical_not(_is_space(cps.flat_values, STRIP_CODEPOINTS))
    first = tf.minimum(_next_true(word, c0 + a), c0 + b) - c0
    last = _prev_true(word, c0 + b) - c0 + 1
    empty = a >= b
    all_space = tf.logical_not(empty) & tf.equal(first, b)
    a2 = tf.where(empty, a, tf.where(all_space, b, first))
    b2 = tf.where(empty, a, tf.where(all_space, b, last))
    a2 = tf.where(found, a2, -1)
    b2 = tf.where(found, b2, -1)
    text = tf.strings.substr(context, tf.cast(tf.maximum(a2, 0), tf.int32),
                             tf.cast(tf.maximum(b2 - a2, 0), tf.int32), unit="UTF8_CHAR")
    text = tf.where(found, text, "")
    top = tf.gather(flat_score, chosen)
    null = tf.math.unsorted_segment_min(tf.cast(outputs["cls_logits"], tf.float32), ex, batch)
    return {"answer_text": text, "answer_start": tf.cast(a2, tf.int32), "answer_end": tf.cast(b2, tf.int32),
            "score": tf.cast(tf.where(found, top, NO_SPAN_SCORE), tf.float32), "null_odds": null,
            "no_answer_probability": tf.sigmoid(null)}


# ---------------------------------------------------------------------------------------------- module
class SquadServing(ServingModule):
    """Serving module for a fine-tuned SQuAD model (TaskModel with a SquadHead).

    ``features(question, context)`` works without a model (``model=None``): the in-graph layout alone
    (the tests compare it with tasks/squad/features.py). ``null_threshold``: ``has_answer = null_odds <= threshold``
    (None: always true).
    """

    def __init__(self, model, tokenizer, max_seq_length: int, max_query_length: int = 64, doc_stride: int = 128,
                 max_answer_length: int = 64, null_threshold: Optional[float] = None,
                 allow_last_paragraph_token: bool = False):
        super().__init__()
        self.allow_last_paragraph_token = bool(allow_last_paragraph_token)
        self.model = model
        self.tokenizer = tokenizer.tf_tokenizer() if hasattr(tokenizer, "tf_tokenizer") else tokenizer
        self.max_seq_length, self.max_query_length = int(max_seq_length), int(max_query_length)
        self.doc_stride, self.max_answer_length = int(doc_stride), int(max_answer_length)
        if self.doc_stride < 1 or self.max_answer_length < 1:
            raise ValueError("doc_stride and max_answer_length must be >= 1")
        if self.max_seq_length < self.max_query_length + 4:
            raise ValueError(f"max_seq_length ({max_seq_length}) must exceed max_query_length "
                             f"({max_query_length}) + 3")
        self.sep_id, self.cls_id = int(tokenizer.sep_id), int(tokenizer.cls_id)
        self.null_threshold = None if null_threshold is None else float(null_threshold)

    def features(self, question, context):
        """Raw strings -> (model features [windows, L], windows, context tokens with character spans)."""
        question = tf.convert_to_tensor(question, tf.string)
        context = tf.convert_to_tensor(context, tf.string)
        tf.debugging.assert_equal(tf.shape(question), tf.shape(context),
                                  message="question and context must have the same batch size")
        tokens = tokenize_with_offsets(self.tokenizer, context)
        feats, windows = squad_windows(tokens["ids"], self.tokenizer.tokenize(question), self.max_seq_length,
                                       self.doc_stride, self.max_query_length, self.sep_id, self.cls_id)
        return feats, windows, tokens

    def _head_outputs(self, features):
        out = self.model.head.predictions(float32_outputs(self.model(features, training=False)))
        return {k: tf.cast(v, tf.int32 if v.dtype.is_integer else tf.float32) for k, v in out.items()}

    def answer(self, question, context) -> Dict[str, tf.Tensor]:
        context = tf.convert_to_tensor(context, tf.string)
        feats, windows, tokens = self.features(question, context)
        heads = self.in_groups(self._head_outputs, feats, tf.reduce_sum(feats["padding_mask"], 1), left=False,
                               max_len=self.max_seq_length)
        out = best_spans(heads, windows, tokens, context, self.max_answer_length, self.allow_last_paragraph_token)
        found = out["answer_start"] >= 0  # no valid span (an empty or blank context): no answer
        if self.null_threshold is None:
            out["has_answer"] = found
        else:
            out["has_answer"] = found & (out["null_odds"] <= self.null_threshold)
        return out

    def text_fn(self):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question"),
                                      tf.TensorSpec([None], tf.string, name="context")], autograph=False)
        def serve_text(question, context):
            return self.answer(question, context)

        return serve_text

    def ids_fn(self):
        spec = tf.TensorSpec([None, None], tf.int32)  # right-padded windows, any length <= max_seq_length

        @tf.function(input_signature=[spec, spec, spec, spec, tf.TensorSpec([None], tf.int32)], autograph=False)
        def serve_ids(input_ids, segment_ids, padding_mask, p_mask, cls_index):
            return self._head_outputs({"input_ids": input_ids, "segment_ids": segment_ids,
                                       "padding_mask": padding_mask, "p_mask": p_mask, "cls_index": cls_index})

        return serve_ids
