"""RACE: reading (real archive counts, filters, bad input), features (layout, truncation, no aliasing), head."""

import json
import os
import tarfile

import numpy as np
import pytest

from xlnet_tf.data import tfrecord_io
from xlnet_tf.tasks.race import features as race_data
from xlnet_tf.tasks.race import reader as race_task
from tests.conftest import SHARED, needs_shared, shared_path
from xlnet_tf.tasks.errors import DataError

RACE_TAR = os.path.join(SHARED, "race", "RACE.tar.gz")
needs_race = needs_shared("race", "RACE.tar.gz")
needs_spiece = needs_shared("spiece", "spiece.model")

# Official question counts; the middle/high split measured on the released archive.
COUNTS = {"train": {"middle": 25421, "high": 62445, "total": 87866},
          "dev": {"middle": 1436, "high": 3451, "total": 4887},
          "test": {"middle": 1436, "high": 3498, "total": 4934}}


@pytest.fixture(scope="module")
def tokenizer():
    from xlnet_tf.tokenizer import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


@pytest.fixture(scope="module")
def dev_docs():
    return race_task.read_race_documents(shared_path("race", "RACE.tar.gz"), "dev")


def _doc(article="A short article.", n=1, **override):
    d = {"id": "x", "article": article, "questions": [f"Question {i} _ ." for i in range(n)],
         "options": [["a", "b", "c", "d"] for _ in range(n)], "answers": ["B"] * n}
    d.update(override)
    return d


def _write_tree(root, files):
    """files: {(split, level, name): dict or str} -> RACE/<split>/<level>/<name> under root."""
    for (split, level, name), content in files.items():
        d = os.path.join(root, "RACE", split, level)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))


def _tar(root, out):
    with tarfile.open(out, "w:gz") as tar:
        tar.add(os.path.join(root, "RACE"), arcname="RACE")
    return out


# ------------------------------------------------------------------------------------------------ reading
@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
@needs_race
@pytest.mark.parametrize("split", ["dev", "test", "train"])
def test_real_counts_per_split(split):
    examples = race_task.read_race(RACE_TAR, split)
    assert race_task.count_levels(examples) == COUNTS[split]
    assert all(ex.label in (0, 1, 2, 3) and len(ex.options) == 4 for ex in examples)
    assert len({ex.example_id for ex in examples}) == len(examples)


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
@needs_race
def test_real_level_filters():
    assert race_task.count_levels(race_task.read_race(RACE_TAR, "dev", high_only=True)) == \
        {"middle": 0, "high": 3451, "total": 3451}
    middle = race_task.read_race(RACE_TAR, "dev", middle_only=True)
    assert len(middle) == 1436 and {ex.level for ex in middle} == {"middle"}
    with pytest.raises(ValueError, match="mutually exclusive"):
        race_task.read_race(RACE_TAR, "dev", high_only=True, middle_only=True)


def test_directory_and_archive_agree(tmp_path):
    files = {("dev", "high", "10.txt"): _doc("High ten.", 2, id="high10.txt"),
             ("dev", "high", "9.txt"): _doc("High nine.", 1, id="high9.txt"),
             ("dev", "middle", "3.txt"): _doc("Middle three.", 1, id="middle3.txt"),
             ("train", "middle", "1.txt"): _doc("Train.", 1)}
    _write_tree(str(tmp_path), files)
    from_dir = race_task.read_race(str(tmp_path), "dev")
    from_tar = race_task.read_race(_tar(str(tmp_path), str(tmp_path / "r.tar.gz")), "dev")
    assert from_dir == from_tar
    # middle first, then files by number (9 before 10)
    assert [ex.example_id for ex in from_dir] == ["middle3.txt-0", "high9.txt-0", "high10.txt-0", "high10.txt-1"]
    assert from_dir[0].options == ("a", "b", "c", "d") and from_dir[0].label == 1
    # unlabelled (no answers) -> label None
    _write_tree(str(tmp_path / "u"), {("test", "high", "1.txt"): {k: v for k, v in _doc().items() if k != "answers"}})
    assert race_task.read_race(str(tmp_path / "u" / "RACE"), "test")[0].label is None


@pytest.mark.parametrize("content, field, expected", [
    (_doc(options=[["a", "b", "c"]]), "options[0]", "has 3 options; expected a list of 4"),
    (_doc(answers=["E"]), "answers[0]", "expected one of A, B, C, D"),
    ({k: v for k, v in _doc().items() if k != "article"}, "article", "missing or empty"),
    (_doc(n=2, answers=["A"]), "'answers'", "have 2, 2, 1 entries"),
    ('{"article": "x", "questions": [', "JSON", "malformed JSON"),
])
@pytest.mark.parametrize("as_tar", [False, True])
def test_bad_input_names_file_and_field(tmp_path, content, field, expected, as_tar):
    _write_tree(str(tmp_path), {("dev", "high", "7.txt"): content})
    source = _tar(str(tmp_path), str(tmp_path / "bad.tar.gz")) if as_tar else str(tmp_path)
    with pytest.raises(DataError) as err:
        race_task.read_race(source, "dev")
    msg = str(err.value)
    assert field in msg and expected in msg
    if as_tar:
        assert "bad.tar.gz" in msg and "(member RACE/dev/high/7.txt)" in msg
    else:
        assert os.path.join("RACE", "dev", "high", "7.txt") in msg


def test_missing_split_and_empty_split(tmp_path):
    with pytest.raises(FileNotFoundError, match="dev"):
        race_task.read_race(str(tmp_path), "dev")
    os.makedirs(tmp_path / "RACE" / "dev" / "high")
    with pytest.raises(DataError, match="no RACE files"):
        race_task.read_race(str(tmp_path), "dev")


def test_race_accuracy():
    acc = race_task.race_accuracy([0, 1, 2, 3], [0, 1, 0, 0], [0, 0, "high", 1])
    assert acc == {"accuracy": 0.5, "accuracy_middle": 1.0, "accuracy_high": 0.0}


# ------------------------------------------------------------------------------------------------ features
def test_encode_choices_exact_ids():
    ctx = [101, 102, 103, 104, 105, 106]
    out = race_data.encode_choices(ctx, [[201, 202], [301, 302, 303, 304]], 10, 3, sep_id=4, cls_id=3)
    np.testing.assert_array_equal(out["input_ids"], [[101, 102, 103, 104, 105, 4, 201, 202, 4, 3],
                                                     [101, 102, 103, 104, 4, 302, 303, 304, 4, 3]])
    np.testing.assert_array_equal(out["segment_ids"], [[0] * 6 + [1] * 3 + [2], [0] * 5 + [1] * 4 + [2]])
    np.testing.assert_array_equal(out["padding_mask"], np.ones((2, 10)))
    # context fits: left padding; the second option sees the article only (no list aliasing)
    out = race_data.encode_choices([101, 102], [[201], [301]], 10, 3, sep_id=4, cls_id=3)
    np.testing.assert_array_equal(out["input_ids"], [[0, 0, 0, 0, 101, 102, 4, 201, 4, 3],
                                                     [0, 0, 0, 0, 101, 102, 4, 301, 4, 3]])
    np.testing.assert_array_equal(out["segment_ids"][1], [4, 4, 4, 4, 0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(out["padding_mask"][1], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="max_qa_length"):
        race_data.encode_choices(ctx, [[1]], 10, 8, sep_id=4, cls_id=3)


def test_qa_text():
    assert race_data.qa_text("Tom has a _ .", "cat") == "Tom has a cat ."
    assert race_data.qa_text("What does Tom have?", "A cat.") == "What does Tom have? A cat."


@needs_spiece
def test_encode_race_tiny(tokenizer):
    out = race_data.encode_race(tokenizer, "Tom has a cat.", "Tom has a _ .", ["cat", "dog", "fish", "cow"], 32, 8)
    enc = tokenizer.encode
    for j, opt in enumerate(["cat", "dog", "fish", "cow"]):
        ids = enc("Tom has a cat.") + [4] + enc(f"Tom has a {opt} .") + [4, 3]
        assert tokenizer.sep_id == 4 and tokenizer.cls_id == 3
        np.testing.assert_array_equal(out["input_ids"][j], [0] * (32 - len(ids)) + ids)
        assert out["padding_mask"][j].sum() == len(ids)


@needs_race
@needs_spiece
def test_real_features_layout(tokenizer, dev_docs):
    L, QA = 512, 128
    checked_once, truncated = 0, 0
    for doc in dev_docs[:25]:
        ctx_ids = tokenizer.encode(doc.article)
        for ex, feats in zip(doc.examples, race_data.document_features(tokenizer, doc, L, QA)):
            assert feats["level"] == race_task.LEVELS.index(doc.level) and feats["label"] == ex.label
            norm_opts = [tokenizer.decode(tokenizer.encode(o)) for o in ex.options]
            for j, option in enumerate(ex.options):
                ids, seg, mask = (feats[k][j] for k in ("input_ids", "segment_ids", "padding_mask"))
                real = ids[mask == 1]
                assert (ids[mask == 0] == 0).all() and (seg[mask == 0] == 4).all() and mask[-1] == 1
                assert real[-1] == tokenizer.cls_id and seg[-1] == 2
                context, qa = real[seg[mask == 1] == 0], real[seg[mask == 1] == 1]
                assert context[-1] == tokenizer.sep_id and qa[-1] == tokenizer.sep_id
                qa_ids = tokenizer.encode(race_data.qa_text(ex.question, option))[-QA:]
                assert list(qa[:-1]) == qa_ids
                # the context is the article's first pieces, the same for every option
                assert list(context[:-1]) == ctx_ids[:len(context) - 1]
                assert len(context) - 1 == min(len(ctx_ids), L - 3 - len(qa_ids))
                truncated += len(real) == L and len(context) - 1 < len(ctx_ids)
                # the option appears exactly once, the other options not at all (when that is decidable)
                qa_text = tokenizer.decode(qa[:-1])
                others = [o for k, o in enumerate(norm_opts) if k != j]
                if (ex.question.count("_") <= 1 and len(qa_ids) < QA and norm_opts[j]
                        and not any(norm_opts[j] in o or o in norm_opts[j] for o in others)
                        and not any(o in tokenizer.decode(tokenizer.encode(ex.question)) for o in norm_opts)):
                    assert qa_text.count(norm_opts[j]) == 1, (qa_text, norm_opts[j])
                    assert not any(o in qa_text for o in others)
                    checked_once += 1
                # the question appears, or its blank is filled
                parts = [tokenizer.decode(tokenizer.encode(p)) for p in ex.question.split("_") if p.strip()]
                assert all(p in qa_text for p in parts if len(qa_ids) < QA), (qa_text, parts)
    assert checked_once > 200 and truncated > 0


@needs_race
@needs_spiece
def test_truncated_articles_are_counted_when_written(tokenizer, dev_docs, caplog):
    """Questions whose article lost pieces in some option, counted as the records are written (a warning when most
    did), against the layout's rule: the article keeps max_seq_length - 3 - len(qa) pieces."""
    docs, L, QA = dev_docs[:12], 128, 32
    want = 0
    for doc in docs:
        ctx = tokenizer.encode(doc.article)
        for ex in doc.examples:
            want += any(len(ctx) > L - 3 - len(tokenizer.encode(race_data.qa_text(ex.question, o))[-QA:])
                        for o in ex.options)
    n = sum(len(d.examples) for d in docs)
    assert 2 * want > n
    with caplog.at_level("INFO", logger="features"):
        records = list(race_data.iter_features(docs, tokenizer, L, QA, num_workers=0, name="dev-128"))
    assert len(records) == n and not any("truncated" in r for r in records)
    said = [r for r in caplog.records if "truncates" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"
    assert f"dev-128: --max_seq_length={L} truncates {want} of {n} examples" in said[0].getMessage()


@needs_race
@needs_spiece
def test_writer_cache_workers_and_dataset(tokenizer, dev_docs, tmp_path):
    docs = dev_docs[:70]
    serial = list(race_data.iter_features(docs, tokenizer, 128, 32, num_workers=0))
    pooled = list(race_data.iter_features(docs, tokenizer, 128, 32, num_workers=2))
    assert len(serial) == len(pooled) == sum(len(d.examples) for d in docs)
    for a, b in zip(serial, pooled):
        assert all(np.array_equal(a[k], b[k]) for k in a)

    # a tiny source tree: written, reused while the manifest matches, rebuilt when a length changes
    files = {("dev", "middle", f"{i}.txt"): _doc(f"Article number {i}.", 2, id=f"middle{i}.txt") for i in range(3)}
    _write_tree(str(tmp_path), files)
    out = str(tmp_path / "dev.tfrecord")
    n = race_data.write_race_features(str(tmp_path), "dev", out, tokenizer, 64, 16, num_workers=0, progress=False)
    assert n == 6
    stamp = os.stat(out).st_mtime_ns
    assert race_data.write_race_features(str(tmp_path), "dev", out, tokenizer, 64, 16, progress=False) == 6
    assert os.stat(out).st_mtime_ns == stamp
    batch = next(iter(race_data.race_dataset(out, 64, 4, is_training=False, length_multiple=8)))  # its longest option
    T = batch["input_ids"].shape[-1]
    assert batch["input_ids"].shape == (4, 4, T) and T % 8 == 0 and T < 64
    assert list(batch["label"].numpy()) == [1, 1, 1, 1]
    ex = race_task.read_race(str(tmp_path), "dev")[0]
    ref = race_data.encode_race(tokenizer, ex.article, ex.question, ex.options, 64, 16)
    for k in ("input_ids", "segment_ids", "padding_mask"):
        np.testing.assert_array_equal(batch[k][0].numpy(), ref[k][..., -T:])
        assert not ref["padding_mask"][..., :-T].any()
    flat = race_data.flatten_choices(batch)
    assert flat["input_ids"].shape == (16, T)
    race_data.write_race_features(str(tmp_path), "dev", out, tokenizer, 96, 16, num_workers=0, progress=False)
    assert os.stat(out).st_mtime_ns != stamp
    assert race_data.race_dataset(out, 96, 2, False, length_multiple=8).element_spec["input_ids"].shape[1] == 4
    assert tfrecord_io.read_manifest(out)["spec"]["input_ids"][1] == [4, 96]  # rebuilt at the new length


# ------------------------------------------------------------------------------------------------ head
def _np_layer_norm(x, gamma, beta, eps=1e-12):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _np_summary(summary_type, h, mask, w):
    if summary_type == "last":
        s = h[:, -1]
    elif summary_type == "first":
        s = h[:, 0]
    elif summary_type == "mean":
        s = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    else:
        q = np.einsum("h,hnd->nd", w["summary_bias"], w["q_kernel"])
        k = np.einsum("bsh,hnd->bsnd", h, w["k_kernel"])
        v = np.einsum("bsh,hnd->bsnd", h, w["v_kernel"])
        sc = np.einsum("nd,bsnd->bns", q, k) / np.sqrt(q.shape[-1]) - 1e30 * (1 - mask)[:, None, :]
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        s = _np_layer_norm(np.einsum("bnd,hnd->bh", np.einsum("bns,bsnd->bnd", p, v), w["o_kernel"]),
                           w["LayerNorm/gamma"], w["LayerNorm/beta"])
    return np.tanh(s @ w["summary/kernel"] + w["summary/bias"])


@pytest.mark.parametrize("summary_type", ["last", "first", "mean", "attn"])
def test_head_matches_numpy(summary_type):
    import tensorflow as tf
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead

    b, L, d = 3, 6, 8
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(b * 4, L, d)).astype(np.float32)
    mask = np.ones((b, 4, L), np.int32)
    mask[:, :, :2] = 0  # left padding
    labels = np.array([0, 3, -1])
    feats = {"padding_mask": tf.constant(mask), "label": tf.constant(labels)}
    head = MultipleChoiceHead(d, summary_type=summary_type, n_head=2, d_head=4)
    head({"sequence_output": tf.constant(hidden)}, feats, training=False)
    names = head.original_names()
    weights = {}
    for v in head.weights:
        key = [k for k in names if v.path.endswith("/" + k)]
        assert len(key) == 1, (v.path, names)
        value = rng.normal(scale=0.5, size=v.shape).astype(np.float32)
        v.assign(value)
        weights[key[0].split("/", 1)[1] if key[0].startswith("sequence_summary/") else key[0]] = value
    assert len(weights) == len(names)
    out = head({"sequence_output": tf.constant(hidden)}, feats, training=False)
    s = _np_summary(summary_type, hidden, mask.reshape(b * 4, L).astype(np.float32), weights)
    logits = (s @ weights["logits/kernel"] + weights["logits/bias"]).reshape(b, 4)
    np.testing.assert_allclose(out["logits"].numpy(), logits, rtol=1e-4, atol=1e-4)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    loss = head.loss(feats, out).numpy()
    assert loss.dtype == np.float32 and loss.shape == (b,)
    np.testing.assert_allclose(loss, [-logp[0, 0], -logp[1, 3], 0.0], rtol=1e-4, atol=1e-5)
    pred = head.predictions(out)
    np.testing.assert_array_equal(pred["choice"].numpy(), logits.argmax(-1))
    np.testing.assert_allclose(pred["probabilities"].numpy(), np.exp(logp), rtol=1e-4, atol=1e-6)


def test_head_original_names_and_mixed_precision():
    import keras
    import tensorflow as tf
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead

    head = MultipleChoiceHead(8, dtype="mixed_bfloat16")
    out = head({"sequence_output": tf.zeros([8, 5, 8], tf.bfloat16)}, {}, training=True)
    assert out["logits"].shape == (2, 4) and out["logits"].dtype == tf.bfloat16
    assert head.loss({"label": tf.constant([0, 1])}, out).dtype == tf.float32
    assert all(v.dtype == "float32" for v in head.weights)
    assert head.original_names() == {
        "sequence_summary/summary/kernel": "model/sequnece_summary/summary/kernel",
        "sequence_summary/summary/bias": "model/sequnece_summary/summary/bias",
        "logits/kernel": "logits/dense/kernel", "logits/bias": "logits/dense/bias"}
    clone = MultipleChoiceHead.from_config(head.get_config())
    assert clone.summary.summary_type == "last" and clone.num_choices == 4
    assert isinstance(clone.dtype_policy, keras.DTypePolicy)
