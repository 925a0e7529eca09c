"""Official SQuAD scoring (hand-computed cases) and answer post-processing (hand-built features/results)."""

import json
import math

import numpy as np
import pytest

from xlnet_tf.tasks.squad.features import FeatureInfo, SquadFeatureIndex
from xlnet_tf.tasks.squad import metrics as ev
from xlnet_tf.tasks.squad import postprocess as pp
from xlnet_tf.tasks.squad.reader import SquadExample


# ------------------------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize("text, norm", [
    ("The  Cat!", "cat"), ("an apple, a pear", "apple pear"), ("theatre", "theatre"), ("U.S.A.", "usa"),
    ("  Denver\tBroncos ", "denver broncos"), ("A", ""), ("the-end", "theend"), ("Gas–Stove", "gas–stove"),
    ("Anthem", "anthem"), ("a.b the c", "ab c"),
])
def test_normalize_answer(text, norm):
    assert ev.normalize_answer(text) == norm


def test_token_f1_hand_computed():
    # gold [cat, sat, on, mat], pred [cat, on, mat]: P 1, R 3/4 -> 6/7
    assert ev.compute_f1("the cat sat on the mat", "cat on mat") == pytest.approx(6 / 7)
    # Counter overlap: gold x x y, pred x y y -> 2 shared, P = R = 2/3
    assert ev.compute_f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert ev.f1_score_v1("x y y", "x x y") == pytest.approx(2 / 3)
    assert ev.compute_f1("blue whale", "whale shark") == 0.5
    assert ev.compute_f1("", "") == 1.0 and ev.compute_f1("", "the") == 1.0  # both normalise to nothing
    assert ev.compute_f1("", "x") == 0.0 and ev.f1_score_v1("", "") == 0.0  # v1.1 has no empty case
    assert ev.compute_exact("The Broncos", "broncos.") == 1


def _v1_data():
    return [{"paragraphs": [{"context": "...", "qas": [
        {"id": "a", "answers": [{"text": "Denver Broncos"}, {"text": "the Broncos"}]},
        {"id": "b", "answers": [{"text": "blue whale"}, {"text": "a whale"}]},
        {"id": "c", "answers": [{"text": "1990"}]}]}]}]


def test_evaluate_v1_multiple_golds_and_missing():
    preds = {"a": "Broncos", "b": "whale shark"}  # "c" missing: counts 0
    # a: EM max(0, 1) = 1 (the Broncos -> broncos), F1 1; b: EM 0, F1 max(0.5, 2/3) = 2/3 (gold "whale")
    out = ev.evaluate(_v1_data(), preds)
    assert out == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 2 / 3) / 3})
    assert ev.dataset_version(_v1_data()) == "1.1"


def _v2_data():
    qas = [{"id": "q1", "is_impossible": False, "answers": [{"text": "Denver Broncos"}, {"text": "Broncos"}]},
           {"id": "q2", "is_impossible": False, "answers": [{"text": "blue whale"}]},
           {"id": "q3", "is_impossible": True, "answers": []},
           {"id": "q4", "is_impossible": True, "answers": []}]
    return [{"paragraphs": [{"context": "...", "qas": qas}]}]


V2_PREDS = {"q1": "the Denver Broncos", "q2": "whale shark", "q3": "something", "q4": ""}
V2_NA = {"q1": 0.1, "q2": 0.6, "q3": 0.9, "q4": 0.3}


def test_evaluate_v2_hand_computed():
    # raw EM 1, 0, 0, 1; F1 1, .5, 0, 1
    out = ev.evaluate(_v2_data(), V2_PREDS, V2_NA)
    expected = {"exact": 50.0, "f1": 62.5, "total": 4, "HasAns_exact": 50.0, "HasAns_f1": 75.0, "HasAns_total": 2,
                "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
                # sweep by na prob: q1 (+1) -> 3/4 at 0.1; q4 (0); q2 (+0 EM, +.5 F1) -> F1 3.5/4 at 0.6; q3 (-1)
                "best_exact": 75.0, "best_exact_thresh": 0.1, "best_f1": 87.5, "best_f1_thresh": 0.6}
    assert out == pytest.approx(expected)
    assert list(out) == list(expected)  # the official key order


def test_span_scores_ignore_the_no_answer_decision():
    # answerable q1 (EM 1, F1 1) and q2 (EM 0, F1 .5); q3/q4 (no answer) are not scored
    assert ev.span_scores(_v2_data(), V2_PREDS) == pytest.approx({"HasAns_span_exact": 50.0, "HasAns_span_f1": 75.0})
    assert ev.span_scores(_v2_data(), {**V2_PREDS, "q2": "the blue whale"})["HasAns_span_f1"] == 100.0


def test_evaluate_v2_threshold_and_no_na_file():
    # na > 0.5 -> predicted no-answer: q2 (has answer) scores 0, q3 (no answer) scores 1
    out = ev.evaluate_v2(_v2_data(), V2_PREDS, V2_NA, na_prob_thresh=0.5)
    assert out["exact"] == 75.0 and out["f1"] == 75.0 and out["NoAns_exact"] == 100.0
    out = ev.evaluate(_v2_data(), V2_PREDS)  # no na_probs: no best_* keys, as the official script
    assert "best_f1" not in out and out["exact"] == 50.0
    with pytest.raises(ValueError, match="no prediction"):
        ev.evaluate(_v2_data(), {"q1": "x"})
    with pytest.raises(ValueError, match="no no-answer score"):
        ev.evaluate(_v2_data(), V2_PREDS, {"q1": 0.0})


def test_examples_to_dataset_and_cli(tmp_path, capsys):
    exs = [SquadExample("q1", "?", "Denver Broncos won", 0, "Denver Broncos", 0, False,
                        ["Denver Broncos", "Broncos"], [0, 7]),
           SquadExample("q2", "?", "x", 0, "", -1, False, ["blue whale"], [0]),
           SquadExample("q3", "?", "x", 0, "", -1, True), SquadExample("q4", "?", "x", 0, "", -1, True)]
    data = ev.examples_to_dataset(exs)
    assert ev.evaluate(data, V2_PREDS, V2_NA) == ev.evaluate(_v2_data(), V2_PREDS, V2_NA)
    files = {}
    for name, obj in (("data", {"data": _v2_data()}), ("pred", V2_PREDS), ("na", V2_NA)):
        files[name] = str(tmp_path / f"{name}.json")
        with open(files[name], "w") as f:
            json.dump(obj, f)
    ev.main([files["data"], files["pred"], "--na-prob-file", files["na"]])
    assert json.loads(capsys.readouterr().out)["best_f1"] == 87.5


# ------------------------------------------------------------------------------------------- post-processing
def _index():
    """q1: "Alpha beta gamma delta epsilon." in two windows of 4 tokens (stride 2); q2: "one two one two."."""
    c1, c2 = "Alpha beta gamma delta epsilon.", "one two one two."
    feats = [FeatureInfo(100, 0, 0, 0, 4, [(0, 3)]),   # tokens 0-3; max context for tokens 0-2
             FeatureInfo(101, 0, 1, 2, 4, [(1, 4)]),   # tokens 2-5; max context for tokens 3-5
             FeatureInfo(102, 1, 0, 0, 5, [(0, 5)])]
    return SquadFeatureIndex(qas_ids=["q1", "q2"], example_context=[0, 1], contexts=[c1, c2],
                             token_starts=[[0, 6, 11, 17, 23, 30], [0, 4, 8, 12, 15]],
                             token_ends=[[5, 10, 16, 22, 30, 31], [3, 7, 11, 15, 16]], features=feats)


def _results():
    # start_n_top = end_n_top = 2; rows in shuffled order (f2, f0, f1)
    return {"unique_id": np.array([102, 100, 101]),
            "start_top_index": np.array([[0, 2], [1, 0], [0, 1]]),
            "start_top_log_probs": np.array([[-0.1, -0.2], [-0.1, -2.0], [-0.01, -0.05]]),
            "end_top_index": np.array([[1, 0, 3, 2], [2, 0, 1, 3], [3, 3, 2, 4]]),
            "end_top_log_probs": np.array([[-0.1, -1.0, -0.1, -1.0], [-0.2, -0.5, -1.0, -3.0],
                                           [-0.01, -0.02, -0.05, -0.06]]),
            "cls_logits": np.array([2.5, -1.0, -3.0])}


def test_postprocess_rules_hand_computed():
    out = pp.postprocess(_index(), _results(), n_best_size=3)
    # q1 candidates: f1 start pos 0 (token 2) is not max context there -> dropped; f1 (1,2) "delta epsilon"
    # -0.1; f1 (1,4) outside the paragraph; f0 (1,2) "beta gamma" -0.3; (1,0) end < start; (0,1) "Alpha beta"
    # -3.0; (0,3) "Alpha beta gamma delta" -5.0 (cut by n_best 3)
    assert [e["text"] for e in out.nbest["q1"]] == ["delta epsilon", "beta gamma", "Alpha beta"]
    assert out.predictions["q1"] == "delta epsilon" and out.char_spans["q1"] == (17, 30)
    assert out.null_odds["q1"] == -3.0 and out.null_odds["q2"] == 2.5  # min over features
    probs = [e["probability"] for e in out.nbest["q1"]]
    z = [math.exp(-0.1), math.exp(-0.3), math.exp(-3.0)]
    assert probs == pytest.approx([x / sum(z) for x in z])
    # q2: "one two" from (0,1) and (2,3), "one" from (0,0) and (2,2): duplicates dropped
    assert [e["text"] for e in out.nbest["q2"]] == ["one two", "one"]
    assert out.nbest["q2"][0]["start_log_prob"] == pytest.approx(-0.1)
    assert out.char_spans["q2"] == (0, 7)


def test_postprocess_options():
    out = pp.postprocess(_index(), _results(), max_answer_length=1)  # no single-token candidate for q1
    assert out.predictions["q1"] == "" and out.nbest["q1"][0]["start_log_prob"] == -1e6
    assert out.predictions["q2"] == "one"
    out = pp.postprocess(_index(), _results(), null_threshold=0.0)
    assert out.predictions["q2"] == "" and out.char_spans["q2"] == (-1, -1) and out.predictions["q1"]
    last = "Alpha beta gamma delta"  # ends on token 3, the last paragraph token of window 0
    assert last not in [e["text"] for e in pp.postprocess(_index(), _results(), n_best_size=5).nbest["q1"]]
    out = pp.postprocess(_index(), _results(), allow_last_paragraph_token=True, n_best_size=5)
    assert last in [e["text"] for e in out.nbest["q1"]]


def test_postprocess_bad_results_and_writing(tmp_path):
    r = _results()
    with pytest.raises(ValueError, match="have no result"):
        pp.postprocess(_index(), {k: v[:2] for k, v in r.items()})
    with pytest.raises(KeyError, match="cls_logits"):
        pp.postprocess(_index(), {k: v for k, v in r.items() if k != "cls_logits"})
    with pytest.raises(ValueError, match="multiple"):
        pp.postprocess(_index(), dict(r, end_top_index=r["end_top_index"][:, :3],
                                      end_top_log_probs=r["end_top_log_probs"][:, :3]))
    with pytest.raises(ValueError, match="rows"):
        pp.postprocess(_index(), dict(r, cls_logits=r["cls_logits"][:2]))
    both = pp.concat_results([{k: v[:1] for k, v in r.items()}, {k: v[1:] for k, v in r.items()}])
    out = pp.postprocess(_index(), both)
    paths = pp.write_predictions(out, str(tmp_path / "out"))
    with open(paths["predictions"]) as f:
        assert json.load(f) == out.predictions
    with open(paths["null_odds"]) as f:
        assert json.load(f) == out.null_odds
    with open(paths["nbest"]) as f:
        assert json.load(f)["q2"][0]["text"] == "one two"


def test_answer_stripped_of_format_characters():
    """An answer's edges lose whitespace and invisible format characters (Cf: U+200E, U+FEFF, U+200B), which
    the official scorer would count against an exact match; inner ones stay."""
    assert pp.strip_answer(" \u200eParis\ufeff ") == (2, "Paris")
    assert pp.strip_answer("\u200bNew\u200eYork\u200b") == (1, "New\u200eYork")
    assert pp.strip_answer("\u200e \u200e") == (3, "")
    assert pp.strip_answer("plain") == (0, "plain")
