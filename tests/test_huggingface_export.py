"""The round trip to HuggingFace: what ``save_pretrained(format="huggingface")``, ``python -m xlnet_tf.convert
--to=huggingface`` and the run scripts' ``--export_huggingface`` write loads into transformers' PyTorch classes with
no missing, unexpected or mismatched key, and computes the same outputs on real text (SST-2, STS-B, RACE and
SQuAD dev rows tokenized with the released spiece.model).

Weights are random with std 0.2 (LayerNorm gains 1 + N(0, 0.2)), so attention is far from uniform and every
weight moves the outputs; "same" is a maximum absolute difference <= 1e-5 of the reference's largest magnitude.
"""

import csv
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from xlnet_tf.heads.classification import ClassificationHead  # noqa: E402
from xlnet_tf.heads.features import FeatureHead  # noqa: E402
from xlnet_tf.heads.multiple_choice import MultipleChoiceHead  # noqa: E402
from xlnet_tf.heads.squad import SquadHead  # noqa: E402
import run_classifier  # noqa: E402
from tests.cli_util import refused, succeeds  # noqa: E402
from tests.conftest import glue_args, shared_path, tiny  # noqa: E402
from xlnet_tf import convert  # noqa: E402
from xlnet_tf import XLNetConfig, XLNetModel, XLNetTokenizer  # noqa: E402
from xlnet_tf.hf_checkpoint import read_safetensors, write_safetensors  # noqa: E402
from xlnet_tf.tf_checkpoint import CheckpointError  # noqa: E402
from xlnet_tf.task_model import TaskModel  # noqa: E402

TOL = 1e-5
TINY = tiny(n_head=4, d_head=16, dropout=0.0, dropatt=0.0)


def randomize(model, seed=0, std=0.2):
    rng = np.random.default_rng(seed)
    for v in model.trainable_weights:
        value = rng.normal(0, std, v.shape)
        v.assign((value + 1.0 if "gamma" in v.path else value).astype(np.float32))


def rel(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))


def hf_load(cls, path, unexpected=()):
    """transformers' model from ``path``; asserts it found every key and nothing else (``unexpected``: allowed)."""
    model, info = getattr(transformers, cls).from_pretrained(str(path), output_loading_info=True)
    assert info["missing_keys"] == [] and info["mismatched_keys"] == [], info
    assert sorted(info["unexpected_keys"]) == sorted(unexpected), info
    return model.eval()


def torch_inputs(features):
    out = {"input_ids": features["input_ids"], "token_type_ids": features["segment_ids"],
           "attention_mask": features["padding_mask"]}
    return {k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in out.items()}


@pytest.fixture(scope="module")
def tokenizer():
    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


def dev_rows(task, n):
    with open(shared_path("glue", task, "dev.tsv"), encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]


@pytest.fixture(scope="module")
def sst2(tokenizer):
    """Six SST-2 dev sentences as classification features (left-padded, <cls> last)."""
    from xlnet_tf.tasks.classification.features import encode_texts

    return encode_texts(tokenizer, [r["sentence"] for r in dev_rows("SST-2", 6)], max_seq_length=40)


@pytest.fixture(scope="module")
def stsb(tokenizer):
    from xlnet_tf.tasks.classification.features import encode_texts

    rows = dev_rows("STS-B", 5)
    return encode_texts(tokenizer, [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], max_seq_length=48)


# ---------------------------------------------------------------------------------------------- the backbone
@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, dict(ff_activation="gelu_exact", untie_r=False, bi_data=True, clamp_len=5,
                                              layer_norm_eps=1e-5, mem_len=8)], ids=["released", "other_options"])
def test_backbone_loads_into_xlnet_model_and_lm_head_model_with_the_same_outputs(sst2, tmp_path, options):
    ours = XLNetModel(XLNetConfig(**dict(TINY, **options)), seed=0)
    ours(sst2["input_ids"][:2])  # (bi_data: an even batch)
    randomize(ours)
    out = tmp_path / "hf"
    ours.save_pretrained(str(out), format="huggingface")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["ff_activation"] == {"gelu": "gelu_new", "gelu_exact": "gelu"}[ours.config.ff_activation]

    got = ours(sst2["input_ids"], segment_ids=sst2["segment_ids"], padding_mask=sst2["padding_mask"])
    hidden = got["sequence_output"].numpy()
    assert np.std(hidden) > 0.3  # far from uniform attention: the comparison means something
    # the bare model has no LM head: transformers reports the LM bias as unused (as for its own xlnet-base-cased)
    bare = hf_load("XLNetModel", out, unexpected=["lm_loss.bias"])
    lm = hf_load("XLNetLMHeadModel", out)
    with torch.no_grad():
        ref_hidden = bare(**torch_inputs(sst2)).last_hidden_state.numpy()
        ref_logits = lm(**torch_inputs(sst2)).logits.numpy()
    assert rel(hidden, ref_hidden) <= TOL
    assert rel(ours.lm_logits(got["sequence_output"]).numpy(), ref_logits) <= TOL

    back = XLNetModel.from_pretrained(str(out))  # and we read what we wrote: the same weights, the same config
    for a, b in zip(ours.trainable_weights, back.trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for key in ("ff_activation", "untie_r", "bi_data", "clamp_len", "layer_norm_eps", "mem_len", "n_token"):
        assert getattr(back.config, key) == getattr(ours.config, key), key


@pytest.mark.slow
def test_convert_cli_to_huggingface_and_refusals(sst2, tmp_path):
    ours = XLNetModel(XLNetConfig(**TINY), seed=0)
    ours(sst2["input_ids"][:1])
    randomize(ours, seed=1)
    ours.save_pretrained(str(tmp_path / "own"))
    assert convert.main([f"--input={tmp_path / 'own'}", f"--output={tmp_path / 'hf'}", "--to=huggingface"]) == 0
    with torch.no_grad():
        ref = hf_load("XLNetLMHeadModel", tmp_path / "hf")(**torch_inputs(sst2)).logits.numpy()
    got = ours(sst2["input_ids"], segment_ids=sst2["segment_ids"], padding_mask=sst2["padding_mask"])
    assert rel(ours.lm_logits(got["sequence_output"]).numpy(), ref) <= TOL
    # HF derives d_head from d_model / n_head: another shape is refused, nothing written
    odd = XLNetModel(XLNetConfig(**dict(TINY, d_head=8)), seed=0)
    with pytest.raises(CheckpointError, match=r"d_head = d_model / n_head.*d_model=64, n_head=4, d_head=8"):
        odd.save_pretrained(str(tmp_path / "odd"), format="huggingface")
    assert not os.path.exists(tmp_path / "odd")
    with pytest.raises(ValueError, match="format: expected one of"):
        ours.save_pretrained(str(tmp_path / "x"), format="torch")


def test_safetensors_bfloat16_is_read_as_float32(tmp_path):
    import ml_dtypes

    x = np.array([1.5, -2.25, 3.0], np.float32)
    write_safetensors(str(tmp_path / "a.safetensors"), {"x": x.astype(ml_dtypes.bfloat16), "y": x})
    t = read_safetensors(str(tmp_path / "a.safetensors"))
    assert t["x"].dtype == np.float32 and t["y"].dtype == np.float32
    np.testing.assert_array_equal(t["x"], x)
    np.testing.assert_array_equal(t["y"], x)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="bad.safetensors: not a safetensors file"):
        read_safetensors(str(tmp_path / "bad.safetensors"))


# ---------------------------------------------------------------------------------------------- task heads
def task_model(head, features, seed=0):
    model = TaskModel(XLNetConfig(**TINY), head, seed=0)
    model.build_with({k: v[:1] for k, v in features.items()})
    randomize(model, seed)
    return model


def exported(model, path, cls):
    model.save_pretrained(str(path), format="huggingface")
    assert json.loads((path / "config.json").read_text())["architectures"] == [cls]
    return hf_load(cls, path)


@pytest.mark.parametrize("task, regression, summary_type", [("SST-2", False, "last"), ("STS-B", True, "first")])
def test_sequence_classification_same_logits_on_glue_dev(task, regression, summary_type, sst2, stsb, tmp_path):
    features = sst2 if task == "SST-2" else stsb
    model = task_model(ClassificationHead(64, 2, regression=regression, task_name=task, summary_type=summary_type),
                       features, seed=3)
    ours = model(features, training=False)
    hf = exported(model, tmp_path / "hf", "XLNetForSequenceClassification")
    with torch.no_grad():
        logits = hf(**torch_inputs(features)).logits.numpy()
    if regression:
        assert hf.config.problem_type == "regression" and logits.shape == (len(features["input_ids"]), 1)
        assert rel(ours["score"].numpy(), logits[:, 0]) <= TOL
    else:
        assert rel(ours["logits"].numpy(), logits) <= TOL
        np.testing.assert_array_equal(np.argmax(ours["logits"].numpy(), -1), np.argmax(logits, -1))
        probs = model.head.predictions(ours)["probabilities"].numpy()
        assert np.max(np.abs(probs - torch.softmax(torch.from_numpy(logits), -1).numpy())) <= TOL


@pytest.mark.slow
def test_multiple_choice_same_scores_on_race_dev(tokenizer, tmp_path):
    from xlnet_tf.tasks.race import reader as race
    from xlnet_tf.tasks.race.features import encode_race

    docs = race.read_race_documents(shared_path("race", "RACE.tar.gz"), "dev")[:2]
    examples = [ex for d in docs for ex in d.examples][:3]
    rows = [encode_race(tokenizer, ex.article, ex.question, ex.options, max_seq_length=64, max_qa_length=24)
            for ex in examples]
    features = {k: np.stack([r[k] for r in rows]) for k in rows[0]}  # [3, 4, 64]
    model = task_model(MultipleChoiceHead(64), features, seed=4)
    ours = model(features, training=False)
    hf = exported(model, tmp_path / "hf", "XLNetForMultipleChoice")
    with torch.no_grad():
        logits = hf(**torch_inputs(features)).logits.numpy()
    assert logits.shape == (3, 4)
    assert rel(ours["logits"].numpy(), logits) <= TOL
    np.testing.assert_array_equal(model.head.predictions(ours)["choice"].numpy(), np.argmax(logits, -1))


def test_question_answering_same_beams_on_squad_dev(tokenizer, tmp_path):
    """Start and end beams (indices and probabilities) and the answerability logit: HF returns probabilities where
    we return log-probabilities, and orders the end beam [end_n_top, start_n_top] where we (and the original)
    order it [start_n_top, end_n_top]."""
    from xlnet_tf.tasks.squad.features import build_squad_features
    from xlnet_tf.tasks.squad.reader import read_squad

    examples = read_squad(shared_path("squad", "dev-v2.0.json"))[:3]
    records, _ = build_squad_features(examples, tokenizer, max_seq_length=64, doc_stride=32, max_query_length=16)
    keys = ("input_ids", "segment_ids", "padding_mask", "p_mask", "cls_index")
    features = {k: np.asarray([r[k] for r in records[:6]]) for k in keys}
    k_start, k_end = 3, 2
    model = task_model(SquadHead(64, start_n_top=k_start, end_n_top=k_end), features, seed=5)
    ours = {k: v.numpy() for k, v in model(features, training=False).items()}
    hf = exported(model, tmp_path / "hf", "XLNetForQuestionAnswering")
    with torch.no_grad():
        out = hf(**torch_inputs(features), p_mask=torch.from_numpy(features["p_mask"].astype(np.float32)),
                 cls_index=torch.from_numpy(features["cls_index"].astype(np.int64)))
    b = len(features["input_ids"])
    np.testing.assert_array_equal(ours["start_top_index"], out.start_top_index.numpy())
    assert rel(np.exp(ours["start_top_log_probs"]), out.start_top_log_probs.numpy()) <= TOL
    reorder = lambda t: t.numpy().reshape(b, k_end, k_start).transpose(0, 2, 1).reshape(b, -1)  # noqa: E731
    np.testing.assert_array_equal(ours["end_top_index"], reorder(out.end_top_index))
    assert rel(np.exp(ours["end_top_log_probs"]), reorder(out.end_top_log_probs)) <= TOL
    assert rel(ours["cls_logits"], out.cls_logits.numpy()) <= TOL


@pytest.mark.parametrize("head, named", [
    (lambda: ClassificationHead(64, 2, hidden_sizes=(32,)), r"head_hidden_sizes=\[32\]: .* no hidden layers"),
    (lambda: ClassificationHead(64, 2, summary_type="mean"), r"summary_type='mean': HuggingFace's 'mean' averages"),
    (lambda: MultipleChoiceHead(64, summary_type="attn", n_head=4, d_head=16), r"summary_type='attn'"),
    (lambda: SquadHead(64, hidden_sizes=(32,)), r"hidden_sizes=\[32\].*original head only"),
    (lambda: FeatureHead(2), r"FeatureHead: HuggingFace's XLNet has no such head"),
], ids=["hidden_layers", "mean", "attn", "squad_hidden", "features"])
def test_heads_huggingface_lacks_are_refused_in_one_line(head, named):
    with pytest.raises(ValueError, match=named) as e:
        head().huggingface_config()
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- a run's export
@pytest.mark.slow
def test_run_classifier_export_huggingface_gives_the_runs_predictions(sst2_run, glue, tokenizer, tmp_path):
    """The session's SST-2 run (conftest.sst2_run) wrote its model for transformers with --export_huggingface;
    HF's logits on SST-2 dev rows equal those of the run's checkpoint; an export-only rerun on the finished run
    writes the same weights. A head HF lacks is refused before any work."""
    from xlnet_tf.tasks.classification.features import encode_texts, feature_spec
    from xlnet_tf.finetune import FineTuner

    run, export = sst2_run.dir, sst2_run.hf
    cfg = XLNetConfig.from_json_file(sst2_run.config, dropout=0.0, dropatt=0.0)
    ft = FineTuner(cfg, lambda: ClassificationHead(cfg.d_model, 2, task_name="SST-2", n_head=cfg.n_head,
                                                   d_head=cfg.d_head), feature_spec(sst2_run.L))
    model = ft.model_for_inference(str(run / "model"))
    assert ft.step == 400
    rows = open(shared_path("glue", "SST-2", "dev.tsv"), encoding="utf-8").read().splitlines()[1:65]
    features = encode_texts(tokenizer, [r.split("\t")[0] for r in rows], max_seq_length=sst2_run.L)
    ours = model(features, training=False)["logits"].numpy()
    with torch.no_grad():
        ref = hf_load("XLNetForSequenceClassification", export)(**torch_inputs(features)).logits.numpy()
    assert rel(ours, ref) <= TOL
    np.testing.assert_array_equal(np.argmax(ours, -1), np.argmax(ref, -1))

    # later, on the finished run (export only): the same model
    later = tmp_path / "hf_later"
    export_only = [a for a in sst2_run.args if not a.startswith(("--do_", "--export_"))]
    succeeds(run_classifier, *export_only, f"--export_huggingface={later}")
    assert {"spiece.model", "tokenizer_config.json", "tokenizer.json"} <= set(os.listdir(later))  # the run's tokenizer
    first, second = (read_safetensors(str(d / "model.safetensors")) for d in (export, later))
    assert sorted(first) == sorted(second)
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])

    fresh = tmp_path / "refused"
    line = refused(run_classifier, *glue_args(glue, "SST-2", fresh, "--head_hidden_sizes=8",
                                              f"--export_huggingface={tmp_path / 'hf2'}"))
    assert "--export_huggingface: head_hidden_sizes=[8]" in line
    assert not os.path.exists(tmp_path / "hf2")
    assert os.listdir(fresh / "model") == [] and os.listdir(fresh / "data") == []  # no features, no training
