"""run_squad.py end to end on the real SQuAD dev sets (tiny model from random initialisation).

Split by article: dev-v2.0's first 4 articles (1,160 questions) train, the 5th ("Victoria_(Australia)", 247
questions, 472 windows at length 128) is held out. 120 steps are far too few for a 2-layer random-init model
to answer anything: the numbers are random level (measured: loss 4.93 -> ~2.7; HasAns EM/F1 0, the null
threshold at 0 answers "no answer" everywhere, so exact = f1 = NoAns share = 49.8). The tests check the
plumbing: files, keys, coverage, the loss falling, and the exported SavedModel (fresh process, only
tensorflow + tensorflow_text imported) answering raw question + context exactly as the Python features +
post-processing do.
"""

import json

import numpy as np
import pytest

import run_squad
from tests.cli_util import call, succeeds
from tests.conftest import shared_path, tiny
from tests.subprocess_util import run_like_a_server

TINY = tiny()
L, QLEN, STRIDE = 128, 32, 64
V2_KEYS = {"exact", "f1", "total", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact",
           "best_exact_thresh", "best_f1", "best_f1_thresh"}
SCORE_TOL = 1e-4  # |served - in-process| on log-prob scores and null odds (different batch compositions)

# Crafted contexts: whitespace runs, LaTeX quotes, accents/NFKD, a digit-comma piece, and one repeated past
# several windows (the served model sees it as sliding windows).
UNICODE_CONTEXT = ("  The  café ``Zoë's''   in Zürich\tserved 1,000, crêpes  to Ｍüller’s guests in  1999.  "
                   "Œuvres — naïve ﬁnal ½ drafts... ")
LONG_CONTEXT = " ".join(["Melbourne is the capital of Victoria and its most populous city, home to ``about 5 "
                         "million'' people in 2016."] + [f"Paragraph {i} talks about trams, coffee and "
                                                          f"football in the year {1900 + i}." for i in range(40)])


def run_cli(args):
    """run_squad.py's ``main`` in-process (tests/cli_util.py); it must succeed."""
    return succeeds(run_squad, *args)


def _question_ids(obj):
    return [qa["id"] for a in obj["data"] for p in a["paragraphs"] for qa in p["qas"]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("squad")
    with open(shared_path("squad", "dev-v2.0.json"), encoding="utf-8") as f:
        obj = json.load(f)
    train, dev = dict(obj, data=obj["data"][:4]), dict(obj, data=obj["data"][4:5])
    assert not {a["title"] for a in train["data"]} & {a["title"] for a in dev["data"]}
    (d / "train.json").write_text(json.dumps(train))
    (d / "dev.json").write_text(json.dumps(dev))
    (d / "config.json").write_text(json.dumps(TINY))
    return {"dir": d, "train": str(d / "train.json"), "dev": str(d / "dev.json"), "dev_obj": dev,
            "config": str(d / "config.json"), "spiece": shared_path("spiece", "spiece.model")}


def common_args(files, out, steps):
    return [f"--spiece_model_file={files['spiece']}", f"--model_config_path={files['config']}",
            f"--output_dir={out}", f"--max_seq_length={L}", f"--max_query_length={QLEN}",
            f"--doc_stride={STRIDE}", "--train_batch_size=16", f"--train_steps={steps}",
            f"--warmup_steps={max(steps // 10, 1)}", "--learning_rate=3e-4", "--progress=false",
            f"--save_steps={steps}", "--iterations=20", "--eval_batch_size=64"]


@pytest.fixture(scope="module")
def v2_run(files):
    out, export = files["dir"] / "out", files["dir"] / "export"
    run_cli([f"--train_file={files['train']}", f"--predict_file={files['dev']}", "--version_2_with_negative",
             "--do_train", "--do_predict", f"--export_dir={export}"] + common_args(files, out, 120))
    return out, export


@pytest.mark.slow
def test_v2_results_files_and_loss(files, v2_run):
    out, _ = v2_run
    res = json.loads((out / "eval_results.json").read_text())
    assert V2_KEYS | {"step", "loss"} <= set(res), res
    assert res["step"] == 120 and res["total"] == 247 and np.isfinite(res["loss"])
    assert res["HasAns_total"] == 124 and res["NoAns_total"] == 123
    assert res["best_f1"] >= res["f1"] - 1e-9 and res["best_exact"] >= res["exact"] - 1e-9
    ids = set(_question_ids(files["dev_obj"]))
    for name in ("predictions", "null_odds", "nbest", "non_null_predictions"):
        got = json.loads((out / f"{name}.json").read_text())
        assert set(got) == ids, name
    preds = json.loads((out / "predictions.json").read_text())
    non_null = json.loads((out / "non_null_predictions.json").read_text())
    odds = json.loads((out / "null_odds.json").read_text())
    nbest = json.loads((out / "nbest.json").read_text())
    thresh = res["null_score_diff_threshold"]
    for q in ids:  # predictions.json stands alone: "" exactly where the null odds exceed the threshold
        assert preds[q] == ("" if odds[q] > thresh else non_null[q])
        assert nbest[q][0]["text"] == non_null[q] and len(nbest[q]) <= 5
    # scoring predictions.json on its own gives the reported exact/f1
    from xlnet_tf.tasks.squad import metrics as squad_eval

    alone = squad_eval.evaluate(files["dev_obj"]["data"], preds, None, "2.0")
    assert abs(alone["exact"] - res["exact"]) < 1e-9 and abs(alone["f1"] - res["f1"]) < 1e-9
    history = json.loads((out / "model" / "train_history.json").read_text())
    assert [s for s, _ in history] == list(range(1, 121))
    first, last = np.mean([l for _, l in history[:10]]), np.mean([l for _, l in history[-20:]])
    assert last < first - 1.0, (first, last)  # measured: ~4.9 -> ~2.8


def _serve_in_fresh_process(export, questions, contexts, tmp_path):
    (tmp_path / "inputs.json").write_text(json.dumps({"q": questions, "c": contexts}))
    run_like_a_server(
        f"m = tf.saved_model.load({str(export)!r})\n"
        f"x = json.load(open({str(tmp_path / 'inputs.json')!r}))\n"
        "out = m.signatures['serving_default'](question=tf.constant(x['q']), context=tf.constant(x['c']))\n"
        "res = {k: v.numpy().tolist() for k, v in out.items()}\n"
        "res['answer_text'] = [t.decode('utf-8') for t in res['answer_text']]\n"
        f"json.dump(res, open({str(tmp_path / 'served.json')!r}, 'w'))\n", tmp_path, timeout=600)
    return json.loads((tmp_path / "served.json").read_text())


def _check_span(served, i, context):
    a, b, text = served["answer_start"][i], served["answer_end"][i], served["answer_text"][i]
    assert context[a:b] == text if a >= 0 else text == "", (i, a, b, text)


@pytest.mark.slow
def test_export_fresh_process_matches_python_postprocessing(files, v2_run, tmp_path):
    """The SavedModel on raw strings == Python features + the same checkpoint + tasks.squad_postprocess:
    (1) all 247 held-out questions against the CLI's nbest/null_odds, (2) crafted contexts (Unicode,
    whitespace, quotes, one spanning many windows, an empty one) against an in-process model."""
    out, export = v2_run
    from xlnet_tf.tasks.squad.features import build_squad_features, squad_feature_spec
    from xlnet_tf.tasks.squad.reader import SquadExample, read_squad
    from xlnet_tf.tasks.squad.postprocess import concat_results, postprocess

    dev = read_squad(files["dev"])
    crafted = [("Who served crêpes?", UNICODE_CONTEXT), ("Where was Zoë's café?", UNICODE_CONTEXT),
               ("What is the capital of Victoria?", LONG_CONTEXT), ("When were the trams?", LONG_CONTEXT)]
    questions = [e.question for e in dev] + [q for q, _ in crafted] + ["Anything?"]
    contexts = [e.context for e in dev] + [c for _, c in crafted] + [""]
    served = _serve_in_fresh_process(export, questions, contexts, tmp_path)
    assert set(served) >= {"answer_text", "answer_start", "answer_end", "score", "no_answer_probability",
                           "null_odds", "has_answer"}
    for i, c in enumerate(contexts):
        _check_span(served, i, c)
    p = np.asarray(served["no_answer_probability"])
    assert np.allclose(p, 1 / (1 + np.exp(-np.asarray(served["null_odds"]))), atol=1e-6)
    # has_answer: a span was found and the null odds are under the threshold; an empty context has no answer
    assert served["has_answer"] == [o <= 0.0 and s >= 0 for o, s in zip(served["null_odds"],
                                                                        served["answer_start"])]
    n = len(dev)
    assert served["answer_text"][-1] == "" and served["answer_start"][-1] == -1 and not served["has_answer"][-1]

    import tensorflow as tf

    from xlnet_tf.heads.squad import SquadHead
    from xlnet_tf import XLNetConfig, XLNetTokenizer
    from xlnet_tf.tasks.squad.serving import SquadServing
    from xlnet_tf.finetune import FineTuner

    tok = XLNetTokenizer(files["spiece"])
    tft = tok.tf_tokenizer()
    # (1) against the CLI's Python post-processing of the same checkpoint
    nbest = json.loads((out / "nbest.json").read_text())
    odds = json.loads((out / "null_odds.json").read_text())
    differ = [c[:60] for c in {e.context for e in dev} if tft.tokenize(tf.constant([c]))[0].numpy().tolist()
              != tok.encode(c)]
    assert not differ, differ  # the served pieces are the features' pieces (tests/test_tokenizer.py)
    mismatches, same_count = [], 0
    for i, e in enumerate(dev):
        best = nbest[e.qas_id][0]
        assert abs(served["null_odds"][i] - odds[e.qas_id]) <= SCORE_TOL
        same = (served["answer_text"][i], served["answer_start"][i], served["answer_end"][i]) == \
            (best["text"], best["start_char"], best["end_char"])
        py_score = best["start_log_prob"] + best["end_log_prob"]
        if same:
            same_count += 1
            assert abs(served["score"][i] - py_score) <= SCORE_TOL
        elif abs(served["score"][i] - py_score) > SCORE_TOL:
            mismatches.append((e.qas_id, served["answer_text"][i], best["text"]))
    # a different span is only allowed on a score tie within the tolerance
    assert not mismatches, mismatches[:5]
    assert same_count >= 0.95 * n, same_count  # measured: 247 of 247, scores within 7e-7

    # (2) crafted inputs against an in-process model and the Python pipeline
    cfg = XLNetConfig.from_json_file(files["config"])
    ft = FineTuner(cfg, lambda: SquadHead(cfg.d_model), squad_feature_spec(L))
    model = ft.model_for_inference(str(out / "model"))
    examples = [SquadExample(f"c{i}", q, c, i, is_impossible=True) for i, (q, c) in enumerate(crafted)]
    for ex in examples:
        assert tft.tokenize(tf.constant([ex.context]))[0].numpy().tolist() == tok.encode(ex.context)
    records, index = build_squad_features(examples, tok, L, STRIDE, QLEN, is_training=False)
    assert sum(f.example_index == 2 for f in index.features) >= 3  # the long context spans several windows
    feats = {k: np.asarray([r[k] for r in records], np.int32) for k in
             ("input_ids", "segment_ids", "padding_mask", "p_mask", "cls_index")}
    res = dict(model.head.predictions(model(feats, training=False)))
    res["unique_id"] = np.asarray([r["unique_id"] for r in records])
    preds = postprocess(index, concat_results([res]), n_best_size=5, max_answer_length=64)
    for k, ex in enumerate(examples):
        i = n + k
        best = preds.nbest[ex.qas_id][0]
        assert (served["answer_text"][i], served["answer_start"][i], served["answer_end"][i]) == \
            (best["text"], best["start_char"], best["end_char"]), (ex.question, served["answer_text"][i], best)
        assert abs(served["score"][i] - (best["start_log_prob"] + best["end_log_prob"])) <= SCORE_TOL
        assert abs(served["null_odds"][i] - preds.null_odds[ex.qas_id]) <= SCORE_TOL

    # the in-graph windows are the Python features exactly (held-out questions + crafted)
    sv = SquadServing(None, tok, L, QLEN, STRIDE)
    g_feats, g_win, _ = tf.function(sv.features, autograph=False)(
        tf.constant([e.question for e in dev] + [q for q, _ in crafted]),
        tf.constant([e.context for e in dev] + [c for _, c in crafted]))
    py_records, py_index = build_squad_features(list(dev) + examples, tok, L, STRIDE, QLEN, is_training=False)
    keep = [j for j, f in enumerate(py_index.features)
            if py_index.contexts[py_index.example_context[f.example_index]] not in differ]
    assert len(keep) >= 0.95 * len(py_records) and g_feats["input_ids"].shape[0] == len(py_records)
    for key in ("input_ids", "segment_ids", "padding_mask", "p_mask", "cls_index"):
        assert (g_feats[key].numpy()[keep] == np.asarray([py_records[j][key] for j in keep])).all(), key
    mc = g_win["max_context"].numpy()
    assert all(mc[j, p] == py_index.features[j].is_max_context(p)
               for j in keep for p in range(py_index.features[j].paragraph_len))


@pytest.mark.slow
def test_v1_run_with_do_eval(tmp_path):
    """SQuAD v1.1 (dev-v1.1 split by article), --do_eval as the alias of predict + score."""
    with open(shared_path("squad", "dev-v1.1.json"), encoding="utf-8") as f:
        obj = json.load(f)
    files = {"train": str(tmp_path / "train.json"), "dev": str(tmp_path / "dev.json"),
             "config": str(tmp_path / "config.json"), "spiece": shared_path("spiece", "spiece.model")}
    (tmp_path / "train.json").write_text(json.dumps(dict(obj, data=obj["data"][:1])))
    dev = dict(obj, data=[dict(obj["data"][1], paragraphs=obj["data"][1]["paragraphs"][:8])])
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    out = tmp_path / "out"
    run_cli([f"--train_file={files['train']}", f"--predict_file={files['dev']}", "--do_train", "--do_eval",
             "--jit=false", f"--predict_dir={tmp_path / 'pred'}"] + common_args(files, out, 6))
    res = json.loads((tmp_path / "pred" / "eval_results.json").read_text())
    assert {"exact_match", "f1", "step", "loss"} <= set(res) and res["step"] == 6, res
    assert not V2_KEYS & set(res) - {"f1"}
    preds = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    assert set(preds) == set(_question_ids(dev))
    assert not (tmp_path / "pred" / "non_null_predictions.json").exists()


def _doc(context="Bob ran home.", question="Who ran?", answers=({"text": "Bob", "answer_start": 0},), **extra):
    qa = {"id": "q1", "question": question, "answers": list(answers)}
    qa.update(extra)
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]}


@pytest.mark.parametrize("content,where", [
    ('{"data": [', "malformed json"),
    (json.dumps({"data": [{"paragraphs": [{"context": "Bob ran.", "qas": [{"id": "q", "answers": []}]}]}]}),
     "data[0].paragraphs[0].qas[0].question"),
    (json.dumps(_doc(answers=[{"text": "Bob", "answer_start": 4}])),
     "data[0].paragraphs[0].qas[0].answers[0].answer_start"),
    (json.dumps(_doc(context="   ")), "data[0].paragraphs[0].context"),
    (json.dumps(_doc(question="")), "data[0].paragraphs[0].qas[0].question"),
])
@pytest.mark.parametrize("which", ["train_file", "predict_file"])
def test_bad_input_exits_2_naming_file_and_field(tmp_path, content, where, which):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_doc()))
    files = {"train_file": str(good), "predict_file": str(good), which: str(bad)}
    unused = tmp_path / "unused.model"  # exists (input paths are checked first), never read: the json fails first
    unused.write_text("")
    r = call(run_squad, f"--train_file={files['train_file']}", f"--predict_file={files['predict_file']}",
             "--do_train", "--do_predict", f"--output_dir={tmp_path / 'out'}", "--model_config_path=tiny",
             f"--spiece_model_file={unused}")
    assert r.code == 2, r.stderr[-2000:]
    assert str(bad) in r.error and where in r.error, r.error


ALIGNMENT_CASES = [UNICODE_CONTEXT, LONG_CONTEXT[:300], "", "   ", "a", "```` ''' `` x", "1,000,000, and 2,3,",
                   "x \u00a8y\u00a8 z\t\n\u3000 done ", "ΟΔΥΣΣΕΥΣ ΣΑΣ Σ. İstanbul", "e\u0301\u0301 ǅ ß ẞ K",
                   "日本語のテキスト、そして１２３"]


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"lower": True}, {"keep_accents": True}, {"remove_space": False}])
def test_in_graph_piece_spans_equal_python(files, options):
    """In-graph pieces + ORIGINAL character spans == data.squad.tokenize_with_offsets (every preprocessing
    switch; the default also on every held-out context)."""
    import tensorflow as tf

    from xlnet_tf.tasks.squad.features import tokenize_with_offsets
    from xlnet_tf import XLNetTokenizer
    from xlnet_tf.tasks.squad.serving import tokenize_with_offsets as tf_tokenize_with_offsets

    tok = XLNetTokenizer(files["spiece"], **options)
    tft = tok.tf_tokenizer()
    texts = list(ALIGNMENT_CASES)
    if not options:
        texts += list(dict.fromkeys(p["context"] for a in files["dev_obj"]["data"] for p in a["paragraphs"]))
    out = tf.function(lambda c: tf_tokenize_with_offsets(tft, c), autograph=False)(tf.constant(texts))
    for j, text in enumerate(texts):
        ref = tokenize_with_offsets(tok, text)
        got = [out[k][j].numpy().tolist() for k in ("ids", "starts", "ends")]
        assert got == [ref.ids, ref.starts, ref.ends], (options, text[:60])


def test_in_graph_answer_edges_and_last_paragraph_token(files):
    """The served span search strips invisible format characters (Cf) at the answer's edges as the Python
    post-processing does, and rejects a span on a window's last paragraph token (the original's rule) unless
    allowed."""
    import tensorflow as tf

    from xlnet_tf.tasks.squad.postprocess import strip_answer
    from xlnet_tf import XLNetTokenizer
    from xlnet_tf.tasks.squad.serving import SquadServing, best_spans

    tok = XLNetTokenizer(files["spiece"])
    context = "The capital is \u200eParis\ufeff. The river is the Seine"
    sv = SquadServing(None, tok, L, QLEN, STRIDE)
    feats, windows, tokens = sv.features(tf.constant(["Which city?"]), tf.constant([context]))
    starts, ends = tokens["starts"][0].numpy().tolist(), tokens["ends"][0].numpy().tolist()
    # the pieces' spans carry the format characters: "\u200eParis", "\ufeff" (SentencePiece drops them)
    t0 = min(t for t in range(len(starts)) if ends[t] > context.index("\u200e"))
    t1 = min(t for t in range(len(starts)) if ends[t] > context.index("\ufeff"))
    raw = context[starts[t0]:ends[t1]]
    assert raw == "\u200eParis\ufeff" and strip_answer(raw) == (1, "Paris")

    def span(start, end, allow=False):
        w = int(tf.shape(windows["paragraph_len"])[0])
        out = {"start_top_index": tf.constant([[start]] * w, tf.int32),
               "end_top_index": tf.constant([[end]] * w, tf.int32),
               "start_top_log_probs": tf.zeros([w, 1]), "end_top_log_probs": tf.zeros([w, 1]),
               "cls_logits": tf.zeros([w])}
        got = best_spans(out, windows, tokens, tf.constant([context]), 64, allow)
        return got["answer_text"][0].numpy().decode(), int(got["answer_start"][0]), int(got["answer_end"][0])

    text, a, b = span(t0, t1)
    assert text == "Paris" and context[a:b] == "Paris"
    last = int(windows["paragraph_len"][0]) - 1
    assert span(last, last)[0] == ""  # rejected: no valid span
    assert span(last, last, allow=True)[0] == strip_answer(context[starts[last]:ends[last]])[1] != ""
