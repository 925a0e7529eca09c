"""What the Keras task models save comes back whole: ``save_pretrained`` in both formats writes the tokenizer
(``spiece.model``; for transformers also ``tokenizer_config.json``, ``special_tokens_map.json`` and
``tokenizer.json``), transformers' classes load the HF folder with no missing or unexpected weight and compute our
outputs, ``from_pretrained`` reads it back with its head (the same predictions), ``AutoTokenizer`` on the folder
gives our ids on 1,000 real SST-2 sentences, and a head that does not fit the checkpoint follows one rule: refused
in one line naming the variable and both shapes, or re-initialised with a warning under
``ignore_mismatched_sizes=True``."""

import logging
import os

import numpy as np
import pytest

from tests.conftest import shared_path, tiny
from xlnet_tf import XLNetConfig
from xlnet_tf.tf_checkpoint import CheckpointError

pytestmark = pytest.mark.slow  # each builds, saves and reloads a model and runs transformers' (> 2 s)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPIECE = ("spiece", "spiece.model")
TOL = 1e-5


def _config():
    return XLNetConfig.from_dict(tiny(n_layer=1, n_head=4, d_head=16, dropout=0.0, dropatt=0.0))


def _randomize(model, seed=0, std=0.2):
    rng = np.random.default_rng(seed)
    for v in model.trainable_weights:
        value = rng.normal(0, std, v.shape)
        v.assign((value + 1.0 if "gamma" in v.path else value).astype(np.float32))


def _sst2(n, split="dev"):
    lines = open(shared_path("glue", "SST-2", f"{split}.tsv"), encoding="utf-8").read().splitlines()[1:n + 1]
    return [line.split("\t")[0] for line in lines]


def _rel(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _hf_load(cls, path):
    model, info = getattr(transformers, cls).from_pretrained(str(path), output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    return model.eval()


def _torch(features):
    out = {"input_ids": features["input_ids"], "token_type_ids": features["segment_ids"],
           "attention_mask": features["padding_mask"]}
    return {k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in out.items()}


def _batch(model, x):
    """The features ``predict`` feeds the model for raw ``x`` (one batch)."""
    return {k: v.numpy() for k, v in next(iter(model.as_dataset(x, None, 64, shuffle=False, training=False))).items()}


def _classifier(**kw):
    from xlnet_tf.tasks import XLNetClassifier

    return XLNetClassifier(_config(), tokenizer=shared_path(*SPIECE), max_seq_length=48, **kw)


CASES = {
    "classifier": ("XLNetClassifier", "XLNetForSequenceClassification", dict(num_classes=3)),
    "regression": ("XLNetClassifier", "XLNetForSequenceClassification", dict(regression=True)),
    "race": ("XLNetMultipleChoice", "XLNetForMultipleChoice", dict(max_qa_length=16)),
}


def _inputs(case):
    if case == "race":
        return (["Tom has a red bike. He rides it to school every day.", "The sea was calm and blue."],
                ["What colour is the bike?", "The sea was _ ."],
                [["red", "blue", "green", "black"], ["rough", "calm", "dark", "cold"]])
    return _sst2(6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_huggingface_folder_loads_in_transformers_and_comes_back_with_its_head(case, tmp_path):
    from xlnet_tf import tasks

    ours_cls, hf_cls, kw = CASES[case]
    cls = getattr(tasks, ours_cls)
    model = cls(_config(), tokenizer=shared_path(*SPIECE), max_seq_length=48, **kw)
    _randomize(model, seed=len(case))
    x = _inputs(case)
    predicted = model.predict(x, verbose=0)
    folder = tmp_path / "hf"
    model.save_pretrained(str(folder), format="huggingface")
    assert {"spiece.model", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"} <= set(
        os.listdir(folder))
    features = _batch(model, x)
    with torch.no_grad():
        logits = _hf_load(hf_cls, folder)(**_torch(features)).logits.numpy()
    ours = model(features, training=False)
    ours = ours["score" if case == "regression" else "logits"].numpy()
    assert _rel(ours, logits[:, 0] if case == "regression" else logits) <= TOL
    again = cls.from_pretrained(str(folder))  # the tokenizer and the task's arguments from the folder
    assert again.max_seq_length == 48 and again.task_config() == model.task_config()
    assert _rel(again.predict(x, verbose=0), predicted) <= TOL
    if case != "race":  # a folder transformers wrote (no task file of ours): its classes from config.json
        os.remove(folder / "xlnet_tf_task.json")
        model_hf = transformers.XLNetForSequenceClassification.from_pretrained(str(folder))
        model_hf.save_pretrained(str(tmp_path / "from_hf"), safe_serialization=True)
        for name in ("spiece.model", "tokenizer_config.json"):
            (tmp_path / "from_hf" / name).write_bytes((folder / name).read_bytes())
        hf_made = cls.from_pretrained(str(tmp_path / "from_hf"), max_seq_length=48)
        assert hf_made.task_config()["num_classes"] == model.task_config()["num_classes"]
        assert _rel(hf_made.predict(x, verbose=0), predicted) <= TOL


def test_question_answerer_huggingface_folder_round_trip(tmp_path):
    from xlnet_tf.tasks import XLNetQuestionAnswerer

    questions = ["Who wrote the book?", "Where is the castle?"]
    contexts = ["The book was written by Ada Lovelace in London. It sold well.",
                "Far away, the old castle stands on a hill above the river, where kings once lived."]
    kw = dict(max_seq_length=32, doc_stride=8, max_query_length=8)
    qa = XLNetQuestionAnswerer(_config(), tokenizer=shared_path(*SPIECE), **kw)
    _randomize(qa, seed=7)
    answers = qa.predict((questions, contexts))
    folder = tmp_path / "hf"
    qa.save_pretrained(str(folder), format="huggingface")
    hf = _hf_load("XLNetForQuestionAnswering", folder)
    from xlnet_tf.tasks.squad.features import build_squad_features
    from xlnet_tf.tasks.squad.reader import read_squad

    examples = read_squad(shared_path("squad", "dev-v2.0.json"))[:2]
    records, _ = build_squad_features(examples, qa.tokenizer, max_seq_length=64, doc_stride=32, max_query_length=16)
    keys = ("input_ids", "segment_ids", "padding_mask", "p_mask", "cls_index")
    features = {k: np.asarray([r[k] for r in records[:4]]) for k in keys}
    ours = {k: v.numpy() for k, v in qa(features, training=False).items()}
    with torch.no_grad():
        out = hf(**_torch(features), p_mask=torch.from_numpy(features["p_mask"].astype(np.float32)),
                 cls_index=torch.from_numpy(features["cls_index"].astype(np.int64)))
    np.testing.assert_array_equal(ours["start_top_index"], out.start_top_index.numpy())
    assert _rel(np.exp(ours["start_top_log_probs"]), out.start_top_log_probs.numpy()) <= TOL
    assert _rel(ours["cls_logits"], out.cls_logits.numpy()) <= TOL
    again = XLNetQuestionAnswerer.from_pretrained(str(folder))
    back = again.predict((questions, contexts))
    assert list(back["answer_text"]) == list(answers["answer_text"])
    assert _rel(back["null_odds"], answers["null_odds"]) <= TOL


def test_own_folder_comes_back_whole_with_its_tokenizer(tmp_path):
    from xlnet_tf.tasks import XLNetClassifier

    model = _classifier(num_classes=2)
    _randomize(model, seed=3)
    x = _sst2(5)
    model.save_pretrained(str(tmp_path / "own"))
    assert os.path.isfile(tmp_path / "own" / "spiece.model")
    again = XLNetClassifier.from_pretrained(str(tmp_path / "own"))
    assert _rel(again.predict(x, verbose=0), model.predict(x, verbose=0)) <= TOL
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"mine: holds 'notes.txt', which no xlnet_tf checkpoint writes"):
        model.save_pretrained(str(tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    model.save_pretrained(str(tmp_path / "own"), format="huggingface")  # a folder of ours: replaced


@pytest.mark.parametrize("fmt", ["own", "huggingface"])
def test_a_head_that_does_not_fit_is_refused_or_reinitialised_by_one_rule(fmt, tmp_path, caplog):
    from xlnet_tf.tasks import XLNetClassifier

    model = _classifier(num_classes=2)
    _randomize(model, seed=5)
    folder = str(tmp_path / fmt)
    model.save_pretrained(folder, format=fmt)
    for kw, shapes in ((dict(num_classes=3), r"\[64, 3\], found \[64, 2\]"),
                       (dict(regression=True), r"\[64, 1\], found (\[64, 2\]|none)")):
        with pytest.raises(CheckpointError, match=shapes) as e:
            XLNetClassifier.from_pretrained(folder, max_seq_length=48, **kw)
        msg = str(e.value)
        assert "\n" not in msg and "logit" in msg and "ignore_mismatched_sizes=True" in msg
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            fresh = XLNetClassifier.from_pretrained(folder, max_seq_length=48, ignore_mismatched_sizes=True, **kw)
        assert any("re-initialised" in r.getMessage() for r in caplog.records)
        np.testing.assert_array_equal(fresh.backbone.word_embedding.numpy(), model.backbone.word_embedding.numpy())
    from xlnet_tf.tasks import XLNetQuestionAnswerer

    with caplog.at_level(logging.WARNING):  # another kind of head: a new one, said (transformers' unexpected keys)
        caplog.clear()
        XLNetQuestionAnswerer.from_pretrained(folder, max_seq_length=32, doc_stride=8, max_query_length=8)
    assert any("are not this model's head" in r.getMessage() for r in caplog.records)
    if fmt == "own":  # the other task's logits are named in the refusal
        with pytest.raises(CheckpointError, match="it holds model/classification_task/logit/kernel"):
            XLNetClassifier.from_pretrained(folder, max_seq_length=48, regression=True)


def test_auto_tokenizer_on_our_folder_gives_our_ids_on_1000_sst2_sentences(tmp_path):
    from transformers import AutoTokenizer

    from xlnet_tf import XLNetModel, XLNetTokenizer

    sentences = _sst2(1000, "train")
    for lower in (False, True):
        tok = XLNetTokenizer(shared_path(*SPIECE), lower=lower)
        folder = tmp_path / f"hf_{lower}"
        XLNetModel(_config()).save_pretrained(str(folder), format="huggingface", tokenizer=tok)
        for fast in (True, False):
            theirs = AutoTokenizer.from_pretrained(str(folder), use_fast=fast)
            assert theirs.padding_side == "left"
            bad = [s for s in sentences if theirs(s)["input_ids"] != tok.encode(s) + [tok.sep_id, tok.cls_id]]
            assert bad == [], (lower, type(theirs).__name__, len(bad), bad[:3])
        pair = theirs("A first text.", "A second one.")
        assert pair["token_type_ids"][-1] == 2 and pair["input_ids"][-2:] == [tok.sep_id, tok.cls_id]
