"""The runner an ONNX or OpenVINO export carries as its ``serve.py``: raw text in, the SavedModel's
``serving_default`` answers out, with numpy, the Python standard library and the export's runtime only
(onnxruntime + onnxruntime-extensions, or openvino + openvino-tokenizers); never TensorFlow or xlnet_tf.

    import sys; sys.path.insert(0, EXPORT_DIR); import serve
    model = serve.load(EXPORT_DIR)                    # precision="bf16" (OpenVINO, native-bf16 CPUs) optional
    model(text_a=["A fine film."])                    # {"logits", "probabilities", "label", "label_name"}
    model(text_a=["He said so."], text_b=["He did."])

What runs where: SentencePiece runs in the runtime's own op (``tokenizer.onnx``: onnxruntime-extensions'
``SentencepieceTokenizer``; ``tokenizer.xml``: openvino-tokenizers' ``SentencepieceTokenizer``), the model (ids in,
the head's outputs out) in the runtime's graph (``model.onnx`` / ``model.xml``, converted from the SavedModel's
``serve_ids`` graph). Here, in a few lines of Python each, what those graphs do not hold: XLNet's text
normalisation (``xlnet_tf.tokenizer.preprocess_text``: whitespace, LaTeX quotes, accents, lower case), its
digit-comma piece rule, the classifier layout (``A <sep> (B <sep>) <cls>``, the longer side trimmed first,
left-padded, pad segment 4) and the length groups (``xlnet_tf.export.run_in_groups``: rows by padded length, at
most ``max_groups`` calls, answers in the request's order). ``layout.json`` holds every constant.
"""

from __future__ import annotations

import json
import os
import unicodedata

import numpy as np

SPIECE_UNDERLINE = "\u2581"


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
        comma = self.ids[","]
        for i in hits:
            piece, sub = self.pieces[i], [self.pieces[j] for j in subs[i]]
            if piece[0] != SPIECE_UNDERLINE and sub and sub[0][0] == SPIECE_UNDERLINE:
                sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:]] + sub[1:]
            subs[i] = [self.ids.get(p, self.unk) for p in sub] + [comma]
        return [[j for i in row for j in (subs[i] if i in subs else (i,))] for row in rows]


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


class _OnnxRuntime:
    def __init__(self, folder, precision, threads):
        import onnxruntime as ort
        from onnxruntime_extensions import get_library_path

        if precision not in ("f32", None):
            raise ValueError(f"precision {precision!r}: the ONNX export serves float32 (precision='f32')")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
        self.model = ort.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                          providers=["CPUExecutionProvider"])
        tok_options = ort.SessionOptions()
        tok_options.register_custom_ops_library(get_library_path())
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
        if self.layout["task"] == "race":
            return self.race(*args, **kwargs)
        return self.classify(*args, **kwargs)

    def _in_groups(self, rows, lengths, multiple, group_rows=1):
        """The model over ``rows`` (each ``group_rows`` consecutive rows one request row) in length groups,
        answers in the request's order."""
        lay = self.layout
        plan = group_plan(lengths, lay["max_seq_length"], multiple, lay["max_groups"],
                          lay["group_cost_tokens"] / group_rows)
        parts, order = [], []
        for members, length in plan:
            picked = [rows[i * group_rows + j] for i in members for j in range(group_rows)]
            feats = left_padded(picked, length, lay["seg_pad"])
            if group_rows > 1:
                feats = {k: v.reshape(len(members), group_rows, length) for k, v in feats.items()}
            parts.append(self.runtime.run(feats))
            order.extend(int(i) for i in members)
        back = np.argsort(np.array(order, np.int64), kind="stable")
        return {k: np.concatenate([p[k] for p in parts])[back] for k in parts[0]}

    def race(self, article, question, options):
        """``serving_default(article [n], question [n], options [n, 4])`` -> ``choice``, ``probabilities``."""
        lay = self.layout
        article, question = _texts(article), _texts(question)
        options = [_texts(o) for o in options]
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
        text_a = _texts(text_a)
        n = len(text_a)
        ids_a = self.encode(text_a)
        if text_b is None:
            ids_b = [[] for _ in range(n)]
        else:
            text_b = _texts(text_b)
            if len(text_b) != n:
                raise ValueError(f"text_a has {n} rows, text_b {len(text_b)}")
            ids_b = self.encode(text_b)
        if n == 0:  # an empty request: the one-row answer's shapes with no rows
            return {k: v[:0] for k, v in self.classify([""]).items()}
        rows = classifier_rows(ids_a, ids_b, lay["max_seq_length"], lay["sep_id"], lay["cls_id"])
        multiple = 1 if (n == 1 and lay["exact_single_row"]) else lay["serving_multiple"]
        out = self._in_groups(rows, [len(t) for t, _ in rows], multiple)
        if "label" in out and lay.get("label_names"):
            out["label_name"] = np.array([lay["label_names"][i].encode("utf-8") for i in out["label"]], object)
        return out


def _texts(rows):
    return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in rows]


def load(folder: str, precision=None, threads=None) -> Served:
    """The export in ``folder``; ``precision``: the runtime's compute precision ("f32", the default written in
    ``layout.json``; "bf16" on OpenVINO where the CPU computes it natively)."""
    return Served(folder, precision, threads)
