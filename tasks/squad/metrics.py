"""The official SQuAD scorers, v1.1 and v2.0, same definitions and numbers (percentages).

``dataset`` is the ``data`` list of a SQuAD json; ``predictions`` {qas_id: text}; for v2 ``na_probs``
{qas_id: no-answer score} (higher = more likely no answer; XLNet's ``null_odds``). Usage as a script:
``python -m tasks.squad.metrics data.json predictions.json [--na-prob-file null_odds.json]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import string
import sys
from typing import Dict, List, Mapping, Optional, Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def get_tokens(s: str) -> List[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """v2.0 token F1 (both empty = 1, one empty = 0)."""
    gold, pred = get_tokens(a_gold), get_tokens(a_pred)
    if not gold or not pred:
        return float(gold == pred)
    same = sum((collections.Counter(gold) & collections.Counter(pred)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score_v1(prediction: str, ground_truth: str) -> float:
    """v1.1 token F1 (no special case for empty answers: 0)."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _qas(dataset: Sequence[dict]):
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate_v1(dataset: Sequence[dict], predictions: Mapping[str, str]) -> Dict[str, float]:
    """Official v1.1: a missing prediction scores 0; max over the gold answers."""
    f1 = exact = total = 0.0
    for qa in _qas(dataset):
        total += 1
        if qa["id"] not in predictions:
            print(f"Unanswered question {qa['id']} will receive score 0.", file=sys.stderr)
            continue
        golds = [a["text"] for a in qa["answers"]]
        pred = predictions[qa["id"]]
        exact += max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
        f1 += max(f1_score_v1(pred, g) for g in golds)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def get_raw_scores(dataset: Sequence[dict], preds: Mapping[str, str]):
    exact, f1 = {}, {}
    for qa in _qas(dataset):
        qid = qa["id"]
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        if qid not in preds:
            print(f"Missing prediction for {qid}", file=sys.stderr)
            continue
        exact[qid] = max(compute_exact(a, preds[qid]) for a in golds)
        f1[qid] = max(compute_f1(a, preds[qid]) for a in golds)
    return exact, f1


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    return {qid: (float(not qid_to_has_ans[qid]) if na_probs[qid] > na_prob_thresh else s)
            for qid, s in scores.items()}


def make_eval_dict(exact, f1, qid_list: Optional[List[str]] = None):
    qids = qid_list if qid_list else list(exact)
    total = len(qids)
    return collections.OrderedDict([("exact", 100.0 * sum(exact[k] for k in qids) / total),
                                    ("f1", 100.0 * sum(f1[k] for k in qids) / total), ("total", total)])


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    """Official: sweep the no-answer threshold over the sorted na_probs; returns (best score %, threshold)."""
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur = best = num_no_ans
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(dataset: Sequence[dict], predictions: Mapping[str, str],
                na_probs: Optional[Mapping[str, float]] = None, na_prob_thresh: float = 1.0):
    """Official v2.0 (exact, f1, total, HasAns_*, NoAns_*, and with ``na_probs`` best_exact/best_f1 and
    their thresholds). Every question needs a prediction (the official script fails otherwise)."""
    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for qa in _qas(dataset)}
    missing = [q for q in qid_to_has_ans if q not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} of {len(qid_to_has_ans)} questions have no prediction "
                         f"(first: {missing[:3]})")
    probs = dict(na_probs) if na_probs is not None else {k: 0.0 for k in predictions}
    missing = [q for q in qid_to_has_ans if q not in probs]
    if missing:
        raise ValueError(f"{len(missing)} questions have no no-answer score (first: {missing[:3]})")
    has_ans = [k for k, v in qid_to_has_ans.items() if v]
    no_ans = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = get_raw_scores(dataset, predictions)
    exact_t = apply_no_ans_threshold(exact_raw, probs, qid_to_has_ans, na_prob_thresh)
    f1_t = apply_no_ans_threshold(f1_raw, probs, qid_to_has_ans, na_prob_thresh)
    out = make_eval_dict(exact_t, f1_t)
    for name, qids in (("HasAns", has_ans), ("NoAns", no_ans)):
        if qids:
            for k, v in make_eval_dict(exact_t, f1_t, qids).items():
                out[f"{name}_{k}"] = v
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(predictions, exact_raw, probs,
                                                                       qid_to_has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, probs, qid_to_has_ans)
    return out


def span_scores(dataset: Sequence[dict], predictions: Mapping[str, str]) -> Dict[str, float]:
    """Not in the official output: the answerable (v2.0) questions scored on the predicted non-null span, with
    no no-answer threshold, i.e. how well spans are found whatever the answerability decision."""
    exact, f1 = get_raw_scores(dataset, predictions)
    qids = [qa["id"] for qa in _qas(dataset) if qa["answers"] and qa["id"] in exact]
    if not qids:
        return {}
    ev = make_eval_dict(exact, f1, qids)
    return {"HasAns_span_exact": ev["exact"], "HasAns_span_f1": ev["f1"]}


def dataset_version(dataset: Sequence[dict]) -> str:
    """"2.0" when any question carries ``is_impossible``, else "1.1"."""
    return "2.0" if any("is_impossible" in qa for qa in _qas(dataset)) else "1.1"


def evaluate(dataset: Sequence[dict], predictions: Mapping[str, str],
             na_probs: Optional[Mapping[str, float]] = None, version: Optional[str] = None,
             na_prob_thresh: float = 1.0) -> dict:
    """The official scorer of ``version`` ("1.1" / "2.0"; default: detected from the dataset)."""
    version = version or dataset_version(dataset)
    if version.lstrip("v").startswith("2"):
        return dict(evaluate_v2(dataset, predictions, na_probs, na_prob_thresh))
    return evaluate_v1(dataset, predictions)


def examples_to_dataset(examples, version: Optional[str] = None) -> List[dict]:
    """SquadExamples (e.g. a split of a file) -> a ``data`` list the scorers accept (version "2.0" marks every
    question with ``is_impossible``; default: "2.0" when any example is impossible)."""
    v2 = (version or ("2.0" if any(e.is_impossible for e in examples) else "1.1")).lstrip("v").startswith("2")
    qas = [dict(id=e.qas_id, answers=[{"text": t} for t in e.answers],
                **({"is_impossible": bool(e.is_impossible)} if v2 else {})) for e in examples]
    return [{"paragraphs": [{"qas": qas}]}]


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description="Official SQuAD v1.1 / v2.0 scoring.")
    p.add_argument("data_file")
    p.add_argument("pred_file")
    p.add_argument("--na-prob-file", default=None)
    p.add_argument("--na-prob-thresh", type=float, default=1.0)
    p.add_argument("--version", default=None, help="1.1 or 2.0 (default: detected)")
    a = p.parse_args(argv)
    with open(a.data_file, encoding="utf-8") as f:
        dataset = json.load(f)["data"]
    with open(a.pred_file, encoding="utf-8") as f:
        preds = json.load(f)
    na_probs = None
    if a.na_prob_file:
        with open(a.na_prob_file, encoding="utf-8") as f:
            na_probs = json.load(f)
    print(json.dumps(evaluate(dataset, preds, na_probs, a.version, a.na_prob_thresh), indent=2))


if __name__ == "__main__":
    main()
