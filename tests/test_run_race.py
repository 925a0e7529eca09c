"""run_race.py end to end on a small subset of the real RACE archive, and the in-graph RACE layout of the export.

One CLI run through run_race.py's ``main`` in-process (tiny random-init model, 32 training questions memorised in
60 steps, 96 dev questions scored, SavedModel exported) feeds the checks; the in-graph features are compared with
tasks/race/features.py on real dev questions.
"""

import json

import numpy as np
import pytest

import run_race
from tests.cli_util import succeeds
from tests.conftest import shared_path, tiny
from tests.subprocess_util import run_like_a_server

TINY = tiny(d_model=32, d_head=16, d_inner=64)
L, QA = 64, 16
STEPS, TRAIN_N, EVAL_N = 60, 32, 96


def _race_tar():
    return shared_path("race", "RACE.tar.gz")


def _spiece():
    return shared_path("spiece", "spiece.model")


@pytest.fixture(scope="module")
def tokenizer():
    from xlnet_tf.tokenizer import XLNetTokenizer

    return XLNetTokenizer(_spiece())


@pytest.fixture(scope="module")
def dev_examples():
    from xlnet_tf.tasks.race import reader as race_task

    docs = race_task.read_race_documents(_race_tar(), "dev")
    # a spread over the split: every 25th file, both levels
    return [ex for d in docs[::25] for ex in d.examples]


@pytest.fixture(scope="module")
def race_run(tmp_path_factory):
    tar, spiece = _race_tar(), _spiece()
    root = tmp_path_factory.mktemp("race")
    (root / "config.json").write_text(json.dumps(TINY))
    out, export = root / "run", root / "export"
    args = [f"--data_dir={tar}", f"--spiece_model_file={spiece}", f"--model_config_path={root / 'config.json'}",
            f"--output_dir={out}", f"--max_seq_length={L}", f"--max_qa_length={QA}", "--train_batch_size=8",
            f"--train_steps={STEPS}", "--learning_rate=2e-3", "--warmup_steps=5", "--dropout=0", "--dropatt=0",
            f"--train_subset={TRAIN_N}", f"--eval_subset={EVAL_N}", "--eval_batch_size=32", "--iterations=20",
            f"--save_steps={STEPS}", "--progress=false", "--do_train", "--do_eval", f"--export_dir={export}"]
    succeeds(run_race, *args)
    return root, out, export


@pytest.mark.slow
def test_eval_results_and_loss_falls(race_run):
    _, out, _ = race_run
    res = json.loads((out / "eval_results.json").read_text())
    assert {"accuracy", "accuracy_middle", "accuracy_high", "num_examples", "num_middle", "num_high", "loss",
            "step"} <= set(res)
    assert res["step"] == STEPS and res["split"] == "dev"
    assert res["num_examples"] == EVAL_N and res["num_middle"] + res["num_high"] == EVAL_N
    assert res["num_middle"] > 0 and res["num_high"] > 0  # the subset keeps both levels
    assert all(0.0 <= res[k] <= 1.0 for k in ("accuracy", "accuracy_middle", "accuracy_high"))
    overall = (res["accuracy_middle"] * res["num_middle"] + res["accuracy_high"] * res["num_high"]) / EVAL_N
    assert abs(overall - res["accuracy"]) < 1e-9 and np.isfinite(res["loss"])
    # per gold option: scores and the confusion matrix (rows gold A-D, columns predicted); the training curve
    counts = np.asarray(res["confusion_matrix"]["counts"])
    assert res["confusion_matrix"]["labels"] == list("ABCD") and set(res["per_class"]) == set("ABCD")
    assert counts.sum() == EVAL_N and abs(np.trace(counts) / EVAL_N - res["accuracy"]) < 1e-9
    assert [res["per_class"][k]["support"] for k in "ABCD"] == counts.sum(axis=1).tolist()
    assert (out / "training_curve.png").stat().st_size > 10_000
    history = json.loads((out / "model" / "train_history.json").read_text())
    assert [s for s, _ in history] == list(range(1, STEPS + 1))
    first, last = np.mean([l for _, l in history[:10]]), np.mean([l for _, l in history[-10:]])
    # starts at ln 4 = 1.386 (4 near-equal options); measured ~0.6 after 60 steps on the 32 training questions
    assert abs(first - np.log(4)) < 0.05 and last < first - 0.3, (first, last)
    # the health check: option distribution predicted vs gold, and the loss trend it judged
    health = res["health"]
    assert set(health["predictions"]["predicted"]) == set("ABCD") == set(health["predictions"]["gold"])
    assert abs(sum(health["predictions"]["gold"].values()) - 1) < 1e-3 and health["loss_trend"]["fell"]


def _python_features(tokenizer, examples, max_seq_length, max_qa_length):
    from xlnet_tf.tasks.race import features as race_data

    feats = [race_data.encode_race(tokenizer, ex.article, ex.question, ex.options, max_seq_length, max_qa_length)
             for ex in examples]
    return {k: np.stack([f[k] for f in feats]) for k in ("input_ids", "segment_ids", "padding_mask")}


@pytest.mark.slow
def test_export_fresh_process_matches_in_process_model(race_run, tokenizer, dev_examples, tmp_path):
    import tensorflow as tf

    from xlnet_tf.tasks.race import features as race_data
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead
    from xlnet_tf import XLNetConfig
    from xlnet_tf.finetune import FineTuner

    root, out, export = race_run
    examples = dev_examples[:24]
    assert any("_" in ex.question for ex in examples) and any("_" not in ex.question for ex in examples)
    py = _python_features(tokenizer, examples, L, QA)
    raw = {"article": [ex.article for ex in examples], "question": [ex.question for ex in examples],
           "options": [list(ex.options) for ex in examples]}
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    np.savez(tmp_path / "ids.npz", **py)
    run_like_a_server(
        f"m = tf.saved_model.load({str(export)!r})\n"
        f"raw = json.load(open({str(tmp_path / 'raw.json')!r}))\n"
        f"ids = np.load({str(tmp_path / 'ids.npz')!r})\n"
        "text = m.signatures['serving_default'](article=tf.constant(raw['article']),\n"
        "    question=tf.constant(raw['question']), options=tf.constant(raw['options']))\n"
        "by_ids = m.signatures['serve_ids'](**{k: tf.constant(ids[k], tf.int32) for k in ids.files})\n"
        f"np.savez({str(tmp_path / 'served.npz')!r}, probs=text['probabilities'].numpy(),\n"
        "    choice=text['choice'].numpy(), ids_probs=by_ids['probabilities'].numpy(),\n"
        "    ids_choice=by_ids['choice'].numpy())\n", tmp_path)
    served = np.load(tmp_path / "served.npz")

    cfg = XLNetConfig.from_json_file(str(root / "config.json"))
    ft = FineTuner(cfg, lambda: MultipleChoiceHead(cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head),
                   race_data.race_feature_spec(L))
    model = ft.model_for_inference(str(out / "model"))
    assert ft.step == STEPS
    probs = tf.nn.softmax(model(py)["logits"]).numpy()
    assert probs.shape == served["probs"].shape == (len(examples), 4)
    assert served["choice"].dtype == np.int32 and served["choice"].shape == (len(examples),)
    assert np.abs(probs - served["probs"]).max() <= 1e-5
    assert np.abs(probs - served["ids_probs"]).max() <= 1e-5
    np.testing.assert_array_equal(served["choice"], served["ids_choice"])
    np.testing.assert_array_equal(served["choice"], probs.argmax(-1))
    assert probs.std() > 1e-3  # a trained model, not a uniform one


def test_fill_blanks_is_python_replace():
    import tensorflow as tf

    from xlnet_tf.tasks.race.features import qa_text
    from xlnet_tf.tasks.race.serving import fill_blanks

    qs = ["Tom has a _ .", "No blank here?", "_ starts", "ends _", "a__b_", "", "_", "x \\1 _ y", "h\u00e9 _ w _"]
    opts = ["cat", "opt", "O", "E\\0", "Z", "empty", "", "$1 \\g<0>", "\u00fc\u6f22"]
    got = [x.decode("utf-8") for x in fill_blanks(tf.constant(qs), tf.constant(opts)).numpy()]
    assert got == [qa_text(q, o) for q, o in zip(qs, opts)]


@pytest.mark.slow
@pytest.mark.parametrize("max_seq_length,max_qa_length", [(64, 16), (512, 128)])
def test_in_graph_features_equal_python(tokenizer, dev_examples, max_seq_length, max_qa_length):
    import tensorflow as tf

    from xlnet_tf.tasks.race.features import qa_text
    from xlnet_tf.tasks.race.reader import RaceExample
    from xlnet_tf.tasks.race.serving import RaceServing

    def pick(level, blank, n):
        return [ex for ex in dev_examples if ex.level == level and ("_" in ex.question) == blank][:n]

    blanks = pick("middle", True, 12) + pick("high", True, 12)
    plain = pick("middle", False, 12) + pick("high", False, 12)
    longest = max(dev_examples, key=lambda ex: len(ex.article))  # truncated even at 512
    odd = [RaceExample("odd-0", "high", "", "__ and _ ?", ("\\1", "$0", "\u00fc", ""), 0),
           RaceExample("odd-1", "middle", plain[0].article, "Which is true? " * 60 + "_ !", plain[0].options, 0)]
    examples = blanks + plain + odd + [longest]
    serving = RaceServing(None, tokenizer, max_seq_length, max_qa_length)
    fn = tf.function(serving.features, input_signature=[tf.TensorSpec([None], tf.string),
                                                         tf.TensorSpec([None], tf.string),
                                                         tf.TensorSpec([None, 4], tf.string)])
    graph = fn(tf.constant([ex.article for ex in examples]), tf.constant([ex.question for ex in examples]),
               tf.constant([list(ex.options) for ex in examples]))
    py = _python_features(tokenizer, examples, max_seq_length, max_qa_length)
    # the graph pads the batch to its longest option (rounded up to a multiple of 8): the records' last T columns
    T = graph["input_ids"].shape[-1]
    assert T == min(max_seq_length, -(-int(py["padding_mask"].sum(-1).max()) // 8) * 8)
    assert not py["padding_mask"][..., :-T].any()
    for k in py:
        assert graph[k].dtype == tf.int32 and py[k].shape == (len(examples), 4, max_seq_length)
        np.testing.assert_array_equal(graph[k].numpy(), py[k][..., -T:], err_msg=k)
    # both regimes occur: qa cut to its last pieces, articles cut and articles that fit
    qa_len = [len(tokenizer.encode(qa_text(ex.question, o))) for ex in examples for o in ex.options]
    article_fits = (py["padding_mask"].sum(-1) < max_seq_length).sum()
    assert sum(n > max_qa_length for n in qa_len) >= 4 and sum(n <= max_qa_length for n in qa_len) > 100
    assert 4 <= article_fits < len(examples) * 4  # the empty article fits, at least
    if max_seq_length == 512:
        assert article_fits > 4
