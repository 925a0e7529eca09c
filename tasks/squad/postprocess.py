"""SQuAD answer extraction from the span head's beam outputs (the original ``write_predictions``).

Per example, over all its features: candidates (start_k, end_k) from ``start_top_*`` x ``end_top_*`` with
start and end inside the paragraph tokens but not on its last one (the original rejects ``index >= paragraph_len
- 1``), the start at its max-context window, end >= start and length <= ``max_answer_length``; score =
start_log_prob + end_log_prob; the ``n_best_size`` best distinct texts (the ORIGINAL context substring of the
pieces' character spans, stripped of whitespace and of invisible format characters, Unicode category Cf such as
U+200E or U+FEFF, at its edges: a piece's span may carry one, and the scorer would count it against an exact
match). Null score = the MIN ``cls_logit``
over the example's features. As the original, ``predictions`` always hold the best non-null text and
``null_odds`` the null scores: the official v2 scorer with ``na_probs=null_odds`` finds the best threshold.
"""

from __future__ import annotations

import math
import os
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from xlnet_tf.tasks.squad.features import SquadFeatureIndex
from xlnet_tf.fileutil import write_json

NO_FEATURE_NULL_ODDS = 1e6  # an example without any feature (dropped at training time) = no answer
RESULT_KEYS = ("unique_id", "start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index",
               "cls_logits")


@dataclass
class SquadPredictions:
    predictions: Dict[str, str] = field(default_factory=dict)   # best non-null text ("" past null_threshold)
    null_odds: Dict[str, float] = field(default_factory=dict)   # min cls_logit (higher = no answer)
    nbest: Dict[str, List[dict]] = field(default_factory=dict)
    char_spans: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # best text's [start, end) in context


def concat_results(batches: Sequence[Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """Per-batch result dicts (numpy or tensors) -> one dict of arrays over all features."""
    return {k: np.concatenate([np.asarray(b[k]) for b in batches], axis=0) for k in RESULT_KEYS}


def _softmax(scores: List[float]) -> List[float]:
    if not scores:
        return []
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    total = sum(e)
    return [x / total for x in e]


def strip_answer(raw: str) -> Tuple[int, str]:
    """(characters removed at the left, text): whitespace and format characters (Cf) stripped at both edges."""
    drop = lambda ch: ch.isspace() or unicodedata.category(ch) == "Cf"
    a, b = 0, len(raw)
    while a < b and drop(raw[a]):
        a += 1
    while b > a and drop(raw[b - 1]):
        b -= 1
    return a, raw[a:b]


def postprocess(index: SquadFeatureIndex, results: Mapping[str, np.ndarray], n_best_size: int = 5,
                max_answer_length: int = 64, null_threshold: Optional[float] = None,
                allow_last_paragraph_token: bool = False) -> SquadPredictions:
    """Head outputs for the features of ``index`` -> predictions, null odds, n-best lists, character spans.

    ``results``: arrays keyed by :data:`RESULT_KEYS` ([F] unique_id and cls_logits, [F, start_n_top] start
    tops, [F, start_n_top * end_n_top] end tops, rows in any order). ``null_threshold``: when given, an
    example whose null odds exceed it predicts "". ``allow_last_paragraph_token`` lets a span start or end on a
    window's last paragraph token, which the original rejects.
    """
    missing_keys = [k for k in RESULT_KEYS if k not in results]
    if missing_keys:
        raise KeyError(f"results lack {missing_keys} (need {RESULT_KEYS})")
    r = {k: np.asarray(results[k]) for k in RESULT_KEYS}
    n = len(r["unique_id"])
    for k in RESULT_KEYS:
        if len(r[k]) != n:
            raise ValueError(f"results[{k!r}] has {len(r[k])} rows, unique_id has {n}")
    k_start = r["start_top_index"].shape[1]
    if r["end_top_index"].shape[1] % k_start:
        raise ValueError(f"end_top_index width {r['end_top_index'].shape[1]} is not a multiple of "
                         f"start_n_top={k_start}")
    k_end = r["end_top_index"].shape[1] // k_start
    row = {int(u): i for i, u in enumerate(r["unique_id"].tolist())}
    missing = [f.unique_id for f in index.features if f.unique_id not in row]
    if missing:
        raise ValueError(f"{len(missing)} of {len(index.features)} features have no result "
                         f"(first unique_ids: {missing[:3]})")
    s_lp, s_ix = r["start_top_log_probs"].tolist(), r["start_top_index"].tolist()
    e_lp, e_ix = r["end_top_log_probs"].tolist(), r["end_top_index"].tolist()
    cls = r["cls_logits"].astype(np.float64).tolist()
    margin = 0 if allow_last_paragraph_token else 1

    out = SquadPredictions()
    for ex_index, feats in enumerate(index.features_by_example()):
        qid = index.qas_ids[ex_index]
        context = index.contexts[index.example_context[ex_index]]
        prelim = []
        score_null = math.inf
        for fi, f in enumerate(feats):
            i_row = row[f.unique_id]
            score_null = min(score_null, cls[i_row])
            limit = f.paragraph_len - margin
            for i in range(k_start):
                start, slp = s_ix[i_row][i], s_lp[i_row][i]
                if start >= limit or not f.is_max_context(start):
                    continue
                for j in range(k_end):
                    end = e_ix[i_row][i * k_end + j]
                    if end >= limit or end < start or end - start + 1 > max_answer_length:
                        continue
                    prelim.append((slp + e_lp[i_row][i * k_end + j], fi, start, end, slp, e_lp[i_row][i * k_end + j]))
        prelim.sort(key=lambda c: c[0], reverse=True)  # stable, as the original's sorted()
        seen = set()
        nbest = []
        for score, fi, start, end, slp, elp in prelim:
            if len(nbest) >= n_best_size:
                break
            a, b = index.token_char_span(feats[fi], start, end)
            lead, text = strip_answer(context[a:b])
            if text in seen:
                continue
            seen.add(text)
            a += lead
            nbest.append({"text": text, "start_log_prob": float(slp), "end_log_prob": float(elp),
                          "start_char": a, "end_char": a + len(text)})
        if not nbest:  # as the original: a nonce entry
            nbest.append({"text": "", "start_log_prob": -1e6, "end_log_prob": -1e6, "start_char": -1,
                          "end_char": -1})
        for entry, p in zip(nbest, _softmax([e["start_log_prob"] + e["end_log_prob"] for e in nbest])):
            entry["probability"] = p
        best = nbest[0]
        out.null_odds[qid] = float(score_null) if feats else NO_FEATURE_NULL_ODDS
        null = null_threshold is not None and out.null_odds[qid] > null_threshold
        out.predictions[qid] = "" if null else best["text"]
        out.char_spans[qid] = (-1, -1) if null else (best["start_char"], best["end_char"])
        out.nbest[qid] = nbest
    return out


def _atomic_json(obj, path: str) -> None:
    write_json(path, obj, newline=False, indent=2, ensure_ascii=False)


def write_predictions(preds: SquadPredictions, output_dir: str, prefix: str = "") -> Dict[str, str]:
    """Writes ``{prefix}predictions.json``, ``null_odds.json``, ``nbest.json`` atomically; returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {name: os.path.join(output_dir, f"{prefix}{name}.json") for name in ("predictions", "null_odds", "nbest")}
    _atomic_json(preds.predictions, paths["predictions"])
    _atomic_json(preds.null_odds, paths["null_odds"])
    _atomic_json(preds.nbest, paths["nbest"])
    return paths


def oracle_results(records: Sequence[Mapping[str, object]], index: SquadFeatureIndex, impossible: Sequence[bool],
                   start_n_top: int = 5, end_n_top: int = 5) -> Dict[str, np.ndarray]:
    """Head outputs of a perfect model (one-hot log-probs on each feature's gold window positions; cls logit
    +10 / -10 for impossible / answerable examples): post-processing them measures the ceiling that
    tokenisation, windowing and the max-context rule leave."""
    f = len(records)
    out = {"unique_id": np.array([r["unique_id"] for r in records], np.int64),
           "start_top_log_probs": np.full((f, start_n_top), -1e4, np.float32),
           "start_top_index": np.zeros((f, start_n_top), np.int32),
           "end_top_log_probs": np.full((f, start_n_top * end_n_top), -1e4, np.float32),
           "end_top_index": np.zeros((f, start_n_top * end_n_top), np.int32),
           "cls_logits": np.zeros(f, np.float32)}
    for i, (r, info) in enumerate(zip(records, index.features)):
        out["start_top_log_probs"][i, 0] = out["end_top_log_probs"][i, 0] = 0.0
        out["start_top_index"][i] = r["start_position"]
        out["end_top_index"][i] = r["end_position"]
        out["cls_logits"][i] = 10.0 if impossible[info.example_index] else -10.0
    return out
