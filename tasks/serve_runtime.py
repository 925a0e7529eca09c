"""The runner an ONNX or OpenVINO export carries as its ``serve.py``: raw text in, the SavedModel's
``serving_default`` answers out, with numpy, the Python standard library and the export's runtime only
(onnxruntime + onnxruntime-extensions, or openvino + openvino-tokenizers); never TensorFlow or xlnet_tf.

    import sys; sys.path.insert(0, EXPORT_DIR); import serve
    model = serve.load(EXPORT_DIR)                    # precision="bf16" (OpenVINO, native-bf16 CPUs) optional
    model(text_a=["A fine film."])                    # {"logits", "probabilities", "label", "label_name"}
    model(text_a=["He said so."], text_b=["He did."])
    model(question=["Who?"], context=["Ann did."])   # a SQuAD export: {"answer_text", "answer_start", ...}

What runs where: SentencePiece runs in the runtime's own op (``tokenizer.onnx``: onnxruntime-extensions'
``SentencepieceTokenizer``; ``tokenizer.xml``: openvino-tokenizers' ``SentencepieceTokenizer``), the model (ids in,
the head's outputs out) in the runtime's graph (``model.onnx`` / ``model.xml``, converted from the SavedModel's
``serve_ids`` graph). Here, in a few lines of Python each, what those graphs do not hold: XLNet's text
normalisation (``xlnet_tf.tokenizer.preprocess_text``: whitespace, LaTeX quotes, accents, lower case), its
digit-comma piece rule, the classifier layout (``A <sep> (B <sep>) <cls>``, the longer side trimmed first,
left-padded, pad segment 4) and the length groups (``xlnet_tf.export.run_in_groups``: rows by padded length, at
most ``max_groups`` calls, answers in the request's order). SQuAD (``tasks/squad/serving.py``'s twin): each
context piece's characters in the original context (SentencePiece's offsets, recovered by laying the pieces over
its normalizer's text, emulated per character), the windows (right-padded, pad segment 3, max-context rule) and
the answer search. ``layout.json`` holds every constant.
"""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import json
import os
import unicodedata

import numpy as np

SPIECE_UNDERLINE = "\u2581"
NO_SPAN_SCORE = -2e6  # SQuAD: the score when no span is valid (``tasks/squad/serving.py``)


# ---------------------------------------------------------------------------------------------- text
def preprocess_text(text: str, lower: bool, remove_space: bool = True, keep_accents: bool = False) -> str:
    """XLNet's normalisation before SentencePiece (``xlnet_tf.tokenizer.preprocess_text``)."""
    out = " ".join(text.strip().split()) if remove_space else text
    out = out.replace("``", '"').replace("''", '"')
    if not keep_accents and not out.isascii():
        out = "".join(c for c in unicodedata.normalize("NFKD", out) if not unicodedata.combining(c))
    return out.lower() if lower else out


class Pieces:
    """The vocabulary (``pieces.json``) and the digit-comma rule (``XLNetTokenizer.tokenize_preprocessed``)."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.ids = {p: i for i, p in enumerate(pieces)}
        self.unk = self.ids.get("<unk>", 0)
        self.digit_comma = {i for i, p in enumerate(pieces) if len(p) > 1 and p[-1] == "," and p[-2].isdigit()}

    def fix_digit_commas(self, rows, encode):
        """Each piece "<...><digit>," re-encoded without the comma (and "▁"), the comma its own piece."""
        hits = sorted({i for row in rows for i in row if i in self.digit_comma})
        if not hits:
            return rows
        subs = dict(zip(hits, encode([self.pieces[i][:-1].replace(SPIECE_UNDERLINE, "") for i in hits])))
        subs = {i: self.substitute(i, subs[i]) + [self.ids[","]] for i in hits}
        return [[j for i in row for j in (subs[i] if i in subs else (i,))] for row in rows]

    def drops_first(self, i, sub) -> bool:
        """Whether the encoding ``sub`` of digit-comma piece ``i``'s body starts with a "▁" piece ``i`` lacks."""
        return self.pieces[i][0] != SPIECE_UNDERLINE and bool(sub) and self.pieces[sub[0]] == SPIECE_UNDERLINE

    def substitute(self, i, sub):
        """The ids replacing digit-comma piece ``i`` but its comma, from ``sub`` (its body's ids): a leading "▁"
        the piece did not have removed."""
        piece, sub = self.pieces[i], [self.pieces[j] for j in sub]
        if piece[0] != SPIECE_UNDERLINE and sub and sub[0][0] == SPIECE_UNDERLINE:
            sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:]] + sub[1:]
        return [self.ids.get(p, self.unk) for p in sub]


# ---------------------------------------------------------------------------------------------- layout
def padded_length(n: int, max_len: int, multiple: int) -> int:
    """``xlnet_tf.lengths.padded_length``."""
    return min(int(max_len), max(1, -(-int(n) // multiple)) * multiple)


def truncate_lengths(la: int, lb: int, budget: int):
    """The original's "pop from the longer of A/B (ties: B)", closed form (``classification/serving.py``)."""
    excess = max(la + lb - budget, 0)
    d = min(excess, abs(la - lb))
    if la > lb:
        la -= d
    else:
        lb -= d
    e = excess - d
    return la - e // 2, lb - (e + 1) // 2


def classifier_rows(ids_a, ids_b, max_seq_length: int, sep: int, cls: int):
    """Each text's tokens and segments, unpadded (``tasks/classification/features.py``'s layout)."""
    rows = []
    for a, b in zip(ids_a, ids_b):
        if b:
            la, lb = truncate_lengths(len(a), len(b), max_seq_length - 3)
            a, b = a[:la], b[:lb]
            rows.append((a + [sep] + b + [sep, cls], [0] * (la + 1) + [1] * (lb + 1) + [2]))
        else:
            a = a[:max_seq_length - 2]
            rows.append((a + [sep, cls], [0] * (len(a) + 1) + [2]))
    return rows


def fill_blanks(question: str, option: str) -> str:
    """RACE's question + option (``tasks/race/features.py``): every "_" filled, else appended after a space."""
    return question.replace("_", option) if "_" in question else question + " " + option


def race_rows(article_ids, qa_ids, max_seq_length: int, max_qa_length: int, sep: int, cls: int):
    """``article <sep> qa <sep> <cls>`` per option (``tasks/race/serving.py``'s ``race_features``): qa keeps its
    last ``max_qa_length`` pieces, the article its first ``max_seq_length - 3 - len(qa)``."""
    rows = []
    for k, qa in enumerate(qa_ids):
        qa = qa[len(qa) - min(len(qa), max_qa_length):]
        ctx = article_ids[k][:max(max_seq_length - 3 - len(qa), 0)]
        rows.append((ctx + [sep] + qa + [sep, cls], [0] * (len(ctx) + 1) + [1] * (len(qa) + 1) + [2]))
    return rows


def left_padded(rows, length: int, seg_pad: int):
    n = len(rows)
    ids, segs, mask = (np.zeros([n, length], np.int32), np.full([n, length], seg_pad, np.int32),
                       np.zeros([n, length], np.int32))
    for r, (tokens, segments) in enumerate(rows):
        k = len(tokens)
        if k:
            ids[r, length - k:], segs[r, length - k:], mask[r, length - k:] = tokens, segments, 1
    return {"input_ids": ids, "segment_ids": segs, "padding_mask": mask}


def group_plan(lengths, max_len: int, multiple: int, max_groups: int, group_cost: float):
    """``xlnet_tf.export.group_plan`` in numpy: rows sorted by length (stable), cut between distinct padded lengths
    where the padded tokens saved exceed ``group_cost`` per extra call; -> [(rows, padded length)]."""
    lengths = np.asarray(lengths, np.int64)
    order = np.argsort(lengths, kind="stable")
    padded = np.array([padded_length(n, max_len, multiple) for n in lengths[order]], np.int64)
    distinct, counts = np.unique(padded, return_counts=True)
    K = len(distinct)
    if K <= 1 or max_groups <= 1:
        return [(order, int(padded.max()) if len(padded) else padded_length(0, max_len, multiple))]
    cum = np.concatenate([[0], np.cumsum(counts)])
    ends = np.concatenate([[padded_length(0, max_len, multiple)], distinct])
    best = {0: (0.0, [0])}  # cheapest plan over distinct lengths [0, j), its cuts
    for _ in range(max_groups):
        nxt = dict(best)
        for i, (cost, cuts) in best.items():
            for j in range(i + 1, K + 1):
                c = cost + (cum[j] - cum[i]) * ends[j] + group_cost
                if j not in nxt or c < nxt[j][0]:
                    nxt[j] = (c, cuts + [j])
        best = nxt
    cuts = best[K][1]
    return [(order[cum[a]:cum[b]], int(ends[b])) for a, b in zip(cuts[:-1], cuts[1:])]


# ---------------------------------------------------------------------------------------------- SQuAD: offsets
# SentencePiece's nmt_nfkc normalizer (the model's charsmap: the same on every code point up to U+2FFFF, a
# character and its marks in ``_spm_chunks``): controls deleted, these spaces to " ", every other character NFKC
# but the few the charsmap (an older Unicode) keeps.
_SPM_DELETED = set(range(1, 9)) | {0x0B} | set(range(0x0E, 0x20)) | {0x7F, 0x8F, 0x9F}
_SPM_SPACES = {0x09, 0x0A, 0x0C, 0x0D, 0x1680, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2581,
               0xFEFF, 0xFFFD}
_SPM_KEPT = ({0x32FF, 0xA7F2, 0xA7F3, 0xA7F4, 0xAB69, 0xFF5E, 0x1F16C, 0x1F23B} | set(range(0x10781, 0x107BB))
             | set(range(0x1FBF0, 0x1FBFA)))


def _spm_char(c: str) -> str:
    o = ord(c)
    if o < 128 and o not in _SPM_DELETED and o not in _SPM_SPACES:
        return c
    if o in _SPM_DELETED:
        return ""
    if o in _SPM_SPACES:
        return " "
    return c if o in _SPM_KEPT else unicodedata.normalize("NFKC", c)


def _spm_chunks(text: str):
    """(start, normalized) of each character, or of the longest run of it and the combining marks (Hangul
    vowel and final jamo) after it that composes into one character, as the charsmap's entries do."""
    chunks, i = [], 0
    while i < len(text):
        k = i + 1
        while k < len(text) and (unicodedata.combining(text[k]) or "\u1160" <= text[k] <= "\u11ff"):
            k += 1
        j = next((j for j in range(k, i + 1, -1) if len(unicodedata.normalize("NFC", text[i:j])) == 1), i + 1)
        chunks.append((i, _spm_char(text[i]) if j == i + 1 else unicodedata.normalize("NFKC", text[i:j])))
        i = j
    return chunks


def spm_normalize(text: str):
    """SentencePiece's normalized text (``▁`` for spaces, the dummy prefix, whitespace runs collapsed, edges
    dropped) and ``norm_to_orig`` [len + 1]: the character of ``text`` each normalized character came from
    (SentencePiece's ``Normalizer::Normalize``)."""
    out, origin, prev_space = [], [], True
    chunks = _spm_chunks(text)
    lead = next((i for i, s in chunks if s != " "), len(text))  # the dummy prefix's origin
    for i, s in chunks:
        if prev_space:
            s = s.lstrip(" ")
        if s:
            if not out:
                out.append(SPIECE_UNDERLINE)
                origin.append(lead)
            out.extend(s.replace(" ", SPIECE_UNDERLINE))
            origin.extend([i] * len(s))
            prev_space = s.endswith(" ")
    end = len(text)
    while out and out[-1] == SPIECE_UNDERLINE:
        out.pop()
        end = origin.pop()
    return "".join(out), origin + [end]


def piece_spans(text: str, pieces, unk: str = "<unk>"):
    """Each piece's ``[begin, end)`` in characters of ``text``, as SentencePiece reports them (the TF path's
    offsets): the pieces laid over the normalized text, an unknown run (``unk``) up to where the next piece
    matches. Where the normalizer above differs from the model's (none known: it is SentencePiece's on every
    string tried), the pieces are laid over it by ``difflib``'s matching blocks."""
    norm, origin = spm_normalize(text)
    bounds, pos = [0], 0
    for k, piece in enumerate(pieces):
        if piece != unk:
            pos = pos + len(piece) if norm.startswith(piece, pos) else -1
        else:
            nxt = pieces[k + 1] if k + 1 < len(pieces) else None
            pos = len(norm) if nxt is None else norm.find(nxt, pos + 1)
        if pos < 0:
            return _spans_by_matching(norm, origin, pieces, unk)
        bounds.append(pos)
    if pos != len(norm):
        return _spans_by_matching(norm, origin, pieces, unk)
    return [(origin[a], origin[b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _spans_by_matching(norm: str, origin, pieces, unk: str):
    joined = "".join("\ufffd" if p == unk else p for p in pieces)
    blocks = difflib.SequenceMatcher(None, joined, norm, autojunk=False).get_matching_blocks()

    def at(j):  # a position of ``joined`` -> one of ``norm`` (in a gap between matches: where the gap starts)
        end = 0
        for a, b, size in blocks:
            if j < a:
                return end
            if j < a + size or not size:
                return b + j - a
            end = b + size
        return len(norm)

    cuts = np.cumsum([0] + [1 if p == unk else len(p) for p in pieces]).tolist()
    return [(origin[at(a)], origin[at(b)]) for a, b in zip(cuts[:-1], cuts[1:])]


def preprocess_with_origin(text: str, lower: bool, remove_space: bool = True, keep_accents: bool = False):
    """``preprocess_text`` with provenance (``tasks/squad/serving.py``'s ``preprocess_with_origin``): (the text
    SentencePiece reads, origin_start, origin_end): preprocessed character k came from original characters
    ``[origin_start[k], origin_end[k])`` (a collapsed whitespace run or a quote pair: what it replaced)."""
    n = len(text)
    space = [c.isspace() for c in text]
    words = [i for i in range(n) if not space[i]]
    outs, ends = list(text), list(range(1, n + 1))
    if remove_space:
        nxt = n
        for i in range(n - 1, -1, -1):  # a kept whitespace char: the first of a run strictly between two words
            if not space[i]:
                nxt = i
            elif words and words[0] < i < words[-1] and not space[i - 1]:
                outs[i], ends[i] = " ", nxt
            else:
                outs[i] = ""
    for quote in "`'":  # "``" / "''" -> '"', pairs left to right in each run
        i = 0
        while i < n - 1:
            if text[i] == quote and text[i + 1] == quote:
                outs[i], outs[i + 1], ends[i] = '"', "", i + 2
                i += 2
            else:
                i += 1
    if not keep_accents:
        outs = [o if o.isascii() else "".join(c for c in unicodedata.normalize("NFKD", o)
                                              if not unicodedata.combining(c)) for o in outs]
    if lower:
        outs = [o.lower() for o in outs]
    joined = "".join(outs)
    whole = preprocess_text(text, lower, remove_space, keep_accents) if lower else joined
    starts = [i for i, o in enumerate(outs) for _ in o]
    return (whole if len(whole) == len(joined) else joined), starts, [ends[i] for i in starts]


def context_tokens(served, contexts):
    """Contexts -> per context (ids, starts, ends): each piece's span in characters of the ORIGINAL context
    (``tasks/squad/serving.py``'s ``tokenize_with_offsets``: the digit-comma rule with offsets, the leading
    whitespace of ``▁x`` pieces excluded, an all-space piece keeping its surface)."""
    lay, vocab = served.layout, served.pieces
    preps = [preprocess_with_origin(c, lay["lower"], lay["remove_space"], lay["keep_accents"]) for c in contexts]
    rows = served.runtime.tokenize([p[0] for p in preps])
    hits = sorted({i for row in rows for i in row if i in vocab.digit_comma})
    bodies = [vocab.pieces[i][:-1].replace(SPIECE_UNDERLINE, "") for i in hits]
    subs = dict(zip(hits, zip(bodies, served.runtime.tokenize(bodies))))
    out = []
    for context, (text, ostart, oend), row in zip(contexts, preps, rows):
        ids, spans = [], []
        for i, (s, e) in zip(row, piece_spans(text, [vocab.pieces[i] for i in row], vocab.pieces[vocab.unk])):
            if i not in subs:
                ids.append(i)
                spans.append((s, e))
                continue
            body, sub = subs[i]
            base = max(s, e - 1 - len(body))
            for j, (x, y) in zip(vocab.substitute(i, sub), _sub_spans(body, vocab, i, sub)):
                ids.append(j)
                spans.append((min(base + x, e - 1), min(base + y, e - 1)))
            ids.append(vocab.ids[","])
            spans.append((e - 1, e))
        out.append((ids,) + _original_spans(text, ostart, oend, len(context), spans))
    return out


def _sub_spans(body, vocab, i, sub):
    spans = piece_spans(body, [vocab.pieces[j] for j in sub], vocab.pieces[vocab.unk])
    return spans[1:] if vocab.drops_first(i, sub) else spans


def _original_spans(text, ostart, oend, n_orig, spans):
    """Spans in the preprocessed text -> in the original (``tasks/squad/serving.py``, ``tokenize_with_offsets``)."""
    m = len(text)
    starts, ends = [], []
    for s, e in spans:
        a = s
        while a < e and a < m and text[a].isspace():  # skip the leading spaces of "▁x"
            a += 1
        a = s if a == e else a
        origin = lambda values, k: values[min(k, max(m - 1, 0))] if k < m else n_orig  # noqa: E731
        if a < e:
            starts.append(origin(ostart, a))
            ends.append(origin(oend, max(e - 1, 0)))
        else:
            starts.append(origin(ostart, s))
            ends.append(starts[-1])
    return starts, ends


# ---------------------------------------------------------------------------------------------- SQuAD: windows
def squad_windows(ctx_ids, q_ids, lay):
    """``tasks/squad/serving.py``'s ``squad_windows``: per window its unpadded (tokens, segments, p_mask) and
    (example, doc_start, paragraph_len, max-context positions)."""
    L, stride = lay["max_seq_length"], lay["doc_stride"]
    sep, cls = lay["sep_id"], lay["cls_id"]
    rows, windows = [], []
    for ex, (para, q) in enumerate(zip(ctx_ids, q_ids)):
        q = q[:lay["max_query_length"]]
        n, M = len(para), L - len(q) - 3
        step = min(M, stride)
        K = 1 + max(0, (n - M + step - 1) // step)
        best = {}  # paragraph token -> (score, window) of its max-context window (the first on ties)
        for k in range(K):
            start = k * step
            plen = max(min(n - start, M), 0)
            for p in range(plen):
                score = 100 * min(p, plen - 1 - p) + plen
                if start + p not in best or score > best[start + p][0]:
                    best[start + p] = (score, len(windows))
            rows.append((para[start:start + plen] + [sep] + q + [sep, cls],
                         [0] * (plen + 1) + [1] * (len(q) + 1) + [2], [0] * plen + [1] * (len(q) + 2) + [0]))
            windows.append([ex, start, plen, set()])
        for t, (_, w) in best.items():
            windows[w][3].add(t - windows[w][1])
    return rows, windows


def right_padded(rows, length: int, seg_pad: int):
    n = len(rows)
    feats = {"input_ids": np.zeros([n, length], np.int32), "segment_ids": np.full([n, length], seg_pad, np.int32),
             "padding_mask": np.zeros([n, length], np.int32), "p_mask": np.ones([n, length], np.int32)}
    for r, (tokens, segments, p_mask) in enumerate(rows):
        k = len(tokens)
        feats["input_ids"][r, :k], feats["segment_ids"][r, :k] = tokens, segments
        feats["padding_mask"][r, :k], feats["p_mask"][r, :k] = 1, p_mask
    feats["cls_index"] = np.array([len(t) - 1 for t, _, _ in rows], np.int32)
    return feats


# ---------------------------------------------------------------------------------------------- SQuAD: answers
def _stripped(context: str, a: int, b: int):
    """``[a, b)`` without whitespace and format characters (Cf) at its edges (``postprocess.strip_answer``)."""
    drop = lambda ch: ch.isspace() or unicodedata.category(ch) == "Cf"  # noqa: E731
    if a >= b:
        return a, a
    first = a
    while first < b and drop(context[first]):
        first += 1
    if first == b:
        return b, b
    last = b
    while drop(context[last - 1]):
        last -= 1
    return first, last


def best_spans(heads, windows, tokens, contexts, lay):
    """``tasks/squad/serving.py``'s ``best_spans`` in numpy: the best valid (start, end) of each example over its
    windows (score summed in float64, the first best in (window, start_k, end_k) order), its text and characters."""
    n = len(contexts)
    margin = 0 if lay["allow_last_paragraph_token"] else 1
    k_start = heads["start_top_index"].shape[1]
    k_end = heads["end_top_index"].shape[1] // k_start
    best = [None] * n  # (score, window, start, end)
    null = np.full([n], np.inf, np.float32)
    for w, (ex, _, plen, mine) in enumerate(windows):
        null[ex] = min(null[ex], heads["cls_logits"][w])
        slp = heads["start_top_log_probs"][w].astype(np.float64)
        elp = heads["end_top_log_probs"][w].astype(np.float64)
        for i, start in enumerate(heads["start_top_index"][w].tolist()):
            for j in range(i * k_end, (i + 1) * k_end):
                end = int(heads["end_top_index"][w, j])
                if (start < plen - margin and end < plen - margin and start <= end
                        and end - start + 1 <= lay["max_answer_length"] and start in mine):
                    score = slp[i] + elp[j]
                    if best[ex] is None or score > best[ex][0]:
                        best[ex] = (score, w, start, end)
    text, first, last, score = [], np.full([n], -1, np.int32), np.full([n], -1, np.int32), []
    for ex, found in enumerate(best):
        if found is None:
            text.append(b"")
            score.append(NO_SPAN_SCORE)
            continue
        _, w, start, end = found
        _, starts, ends = tokens[ex]
        first[ex], last[ex] = _stripped(contexts[ex], starts[windows[w][1] + start], ends[windows[w][1] + end])
        text.append(contexts[ex][first[ex]:last[ex]].encode("utf-8"))
        score.append(found[0])
    found = first >= 0
    threshold = lay["null_threshold"]
    return {"answer_text": np.array(text, object), "answer_start": first, "answer_end": last,
            "score": np.array(score, np.float32), "null_odds": null,
            "no_answer_probability": (1 / (1 + np.exp(-null))).astype(np.float32),
            "has_answer": found if threshold is None else found & (null <= np.float32(threshold))}


# ---------------------------------------------------------------------------------------------- runtimes
class _OpenVINO:
    def __init__(self, folder, precision, threads):
        import openvino as ov
        import openvino_tokenizers  # noqa: F401  (registers the SentencePiece op)

        core = ov.Core()
        # Threads not pinned to cores: a pinned thread sharing its core with another process holds up every op
        # of the call (PERFORMANCE.md "Serving in other runtimes"); the same answers.
        config = {"INFERENCE_PRECISION_HINT": precision, "ENABLE_CPU_PINNING": False}
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.model = core.compile_model(os.path.join(folder, "model.xml"), "CPU", config)
        self.tok = core.compile_model(os.path.join(folder, "tokenizer.xml"), "CPU")

    def tokenize(self, texts):
        if not texts:
            return []
        out = self.tok(np.array(texts, dtype=str))
        indices, values = out["indices"], out["values"]
        rows = [[] for _ in texts]
        for (r, _), v in zip(indices.tolist(), values.tolist()):
            rows[r].append(v)
        return rows

    def run(self, features):
        out = self.model(features)
        return {o.get_any_name(): out[o] for o in self.model.outputs}


def _extensions_library() -> str:
    """onnxruntime-extensions' custom-op library (what its ``get_library_path()`` returns), found without importing
    the package: its ``__init__`` imports onnx and, through its converters, transformers where installed (~5 s, most
    of a serving process's start on the machines here; PERFORMANCE.md "Test suite"). The package's own answer where
    the file is not where it keeps it."""
    spec = importlib.util.find_spec("onnxruntime_extensions")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_extensions_pydll" + suffix)
            if os.path.isfile(path):
                return path
    from onnxruntime_extensions import get_library_path  # the package's own lookup (slow to import, above)

    return get_library_path()


class _OnnxRuntime:
    def __init__(self, folder, precision, threads):
        import onnxruntime as ort

        if precision not in ("f32", None):
            raise ValueError(f"precision {precision!r}: the ONNX export serves float32 (precision='f32')")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
        self.model = ort.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                          providers=["CPUExecutionProvider"])
        tok_options = ort.SessionOptions()
        tok_options.register_custom_ops_library(_extensions_library())
        self.tok = ort.InferenceSession(os.path.join(folder, "tokenizer.onnx"), tok_options,
                                        providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.model.get_outputs()]

    def tokenize(self, texts):
        if not texts:
            return []
        ids, splits = self.tok.run(None, {"text": np.array(texts, dtype=object)})
        ids, splits = ids.tolist(), splits.tolist()
        return [ids[splits[r]:splits[r + 1]] for r in range(len(texts))]

    def run(self, features):
        return dict(zip(self.names, self.model.run(None, features)))


RUNTIMES = {"openvino": _OpenVINO, "onnx": _OnnxRuntime}


class Served:
    """An export's ``serving_default``: ``served(text_a=[...], text_b=[...])`` -> dict of numpy arrays."""

    def __init__(self, folder: str, precision=None, threads=None):
        with open(os.path.join(folder, "layout.json"), encoding="utf-8") as f:
            self.layout = json.load(f)
        with open(os.path.join(folder, "pieces.json"), encoding="utf-8") as f:
            self.pieces = Pieces(json.load(f))
        self.runtime = RUNTIMES[self.layout["format"]](folder, precision or self.layout["precision"], threads)

    def encode(self, texts):
        """Raw texts -> ids, as ``XLNetTokenizer.encode``."""
        lay = self.layout
        texts = [preprocess_text(t, lay["lower"], lay["remove_space"], lay["keep_accents"]) for t in texts]
        return self.pieces.fix_digit_commas(self.runtime.tokenize(texts), self.runtime.tokenize)

    def __call__(self, *args, **kwargs):
        task = self.layout["task"]
        return (self.race if task == "race" else self.squad if task == "squad" else self.classify)(*args, **kwargs)

    def _in_groups(self, rows, lengths, multiple, group_rows=1, pad=left_padded):
        """The model over ``rows`` (each ``group_rows`` consecutive rows one request row) in length groups, each
        padded by ``pad`` (SQuAD's windows: on the right), answers in the request's order."""
        lay = self.layout
        plan = group_plan(lengths, lay["max_seq_length"], multiple, lay["max_groups"],
                          lay["group_cost_tokens"] / group_rows)
        parts, order = [], []
        for members, length in plan:
            picked = [rows[i * group_rows + j] for i in members for j in range(group_rows)]
            feats = pad(picked, length, lay["seg_pad"])
            if group_rows > 1:
                feats = {k: v.reshape(len(members), group_rows, length) for k, v in feats.items()}
            parts.append(self.runtime.run(feats))
            order.extend(int(i) for i in members)
        back = np.argsort(np.array(order, np.int64), kind="stable")
        return {k: np.concatenate([p[k] for p in parts])[back] for k in parts[0]}

    def squad(self, question, context):
        """``serving_default(question [n], context [n])`` -> ``answer_text``, ``answer_start`` / ``answer_end``
        (characters of the context), ``score``, ``null_odds``, ``no_answer_probability``, ``has_answer``."""
        lay = self.layout
        question, context = _texts(question, "question"), _texts(context, "context")
        if len(question) != len(context):
            raise ValueError(f"question has {len(question)} rows, context {len(context)}: they must match")
        if not context:  # an empty request: the one-row answer's shapes with no rows
            return {k: v[:0] for k, v in self.squad([""], [""]).items()}
        tokens = context_tokens(self, context)
        rows, windows = squad_windows([t[0] for t in tokens], self.encode(question), lay)
        heads = self._in_groups(rows, [len(r[0]) for r in rows], lay["serving_multiple"], pad=right_padded)
        return best_spans(heads, windows, tokens, context, lay)

    def race(self, article, question, options):
        """``serving_default(article [n], question [n], options [n, 4])`` -> ``choice``, ``probabilities``."""
        lay = self.layout
        article, question = _texts(article, "article"), _texts(question, "question")
        options = [_texts(o, "options") for o in _texts(options, "options", strings=False)]
        n, k = len(article), lay["num_choices"]
        if len(question) != n or len(options) != n or any(len(o) != k for o in options):
            raise ValueError(f"article [{n}], question [{len(question)}] and options [n, {k}] must match")
        if n == 0:
            return {"choice": np.zeros([0], np.int32), "probabilities": np.zeros([0, k], np.float32)}
        ids = self.encode(article + [fill_blanks(q, o) for q, opts in zip(question, options) for o in opts])
        arts = [ids[i // k] for i in range(n * k)]
        rows = race_rows(arts, ids[n:], lay["max_seq_length"], lay["max_qa_length"], lay["sep_id"], lay["cls_id"])
        longest = [max(len(rows[i * k + j][0]) for j in range(k)) for i in range(n)]
        return self._in_groups(rows, longest, lay["serving_multiple"], group_rows=k)

    def classify(self, text_a, text_b=None):
        """``serving_default(text_a [n], text_b [n])`` -> ``logits``, ``probabilities``, ``label``, ``label_name``
        (regression: ``score``)."""
        lay = self.layout
        text_a = _texts(text_a, "text_a")
        n = len(text_a)
        if (text_b is None) == bool(lay["pair"]):  # as the SavedModel's signature: text_b iff it was exported so
            raise ValueError("text_b: this export reads pairs (text_a, text_b); text_b is missing" if lay["pair"]
                             else "text_b: this export reads single texts (text_a alone)")
        ids_a = self.encode(text_a)
        if text_b is None:
            ids_b = [[] for _ in range(n)]
        else:
            text_b = _texts(text_b, "text_b")
            if len(text_b) != n:
                raise ValueError(f"text_a has {n} rows, text_b {len(text_b)}")
            ids_b = self.encode(text_b)
        if n == 0:  # an empty request: the one-row answer's shapes with no rows
            return {k: v[:0] for k, v in self.classify([""], [""] if lay["pair"] else None).items()}
        rows = classifier_rows(ids_a, ids_b, lay["max_seq_length"], lay["sep_id"], lay["cls_id"])
        multiple = 1 if (n == 1 and lay["exact_single_row"]) else lay["serving_multiple"]
        out = self._in_groups(rows, [len(t) for t, _ in rows], multiple)
        if "label" in out and lay.get("label_names"):
            out["label_name"] = np.array([lay["label_names"][i].encode("utf-8") for i in out["label"]], object)
        return out


def _texts(rows, name: str, strings: bool = True):
    """A request's rows (str or UTF-8 bytes each); one string instead of a list, a row of another kind (None, a
    number) or bytes that are not UTF-8 are refused in one line naming the row, as the SavedModel refuses them."""
    if isinstance(rows, (str, bytes)):
        raise ValueError(f"{name}: expected a list of rows, got one string {rows[:40]!r}")
    rows = list(rows)
    if not strings:
        return rows
    out = []
    for i, t in enumerate(rows):
        if isinstance(t, bytes):
            try:
                t = t.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{name}[{i}]: bytes that are not valid UTF-8 ({e.reason} at byte {e.start})") \
                    from None
        elif not isinstance(t, str):
            raise TypeError(f"{name}[{i}]: a text (str) is expected, got {type(t).__name__} {t!r}"[:300])
        out.append(t)
    return out


def load(folder: str, precision=None, threads=None) -> Served:
    """The export in ``folder``; ``precision``: the runtime's compute precision ("f32", the default written in
    ``layout.json``; "bf16" on OpenVINO where the CPU computes it natively)."""
    return Served(folder, precision, threads)
