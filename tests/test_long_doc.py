"""Long documents with memory (``--long_doc_mode=memory``): the windows, the memory loop, the export, training.

Tiny random-init models; real IMDB reviews (``../shared/data/imdb``) as the long texts.
"""

import csv
import json

import numpy as np
import pytest

from tests.conftest import shared_path
from tests.subprocess_util import run_like_a_server

L = 32


@pytest.fixture(scope="module")
def tok():
    from xlnet_tf import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


def read_reviews(split, n):
    """The first ``n`` reviews of ``split`` in the tarball (both labels), cleaned as the IMDB reader does."""
    import tarfile

    from xlnet_tf.tasks.classification.text import ImdbTask

    out = {"pos": [], "neg": []}
    with tarfile.open(shared_path("imdb", "aclImdb_v1.tar.gz"), "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if len(parts) == 4 and parts[1] == split and parts[2] in out and len(out[parts[2]]) < n // 2:
                out[parts[2]].append(ImdbTask._clean(tar.extractfile(member).read(), member.name))
                if all(len(v) >= n // 2 for v in out.values()):
                    break
    return [t for pair in zip(out["pos"], out["neg"]) for t in pair]


@pytest.fixture(scope="module")
def reviews():
    return read_reviews("test", 200)


def make_model(mem_len, seed=1):
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    # Plain ops (accelerate=False): no XLA compilation per shape in these eager calls; the same math.
    cfg = XLNetConfig.preset("tiny", mem_len=mem_len, dropout=0.0, dropatt=0.0, accelerate=False)
    return TaskModel(cfg, ClassificationHead(cfg.d_model, 2, n_head=cfg.n_head, d_head=cfg.d_head), seed=seed)


@pytest.fixture(scope="module")
def models(tok):
    """(memory model, mem_len 3 windows; truncating model with the same weights, mem_len 0)."""
    from xlnet_tf.tasks.classification import features as F

    mem, trunc = make_model(3 * L), make_model(0)
    mem.build_with(F.encode_documents(tok, ["a b c " * 30], L))
    trunc.build_with(F.encode_texts(tok, ["a b c"], max_seq_length=L))
    trunc.set_weights(mem.get_weights())
    return mem, trunc


def test_windows_layout(tok):
    from xlnet_tf.tasks.classification import features as F

    ids = list(range(100, 170))  # 70 pieces + SEP + CLS = 72 = 3 windows of 32, the first one left-padded
    w = F.build_windows(ids, L, tok.sep_id, tok.cls_id)
    flat = {k: sum(v, []) for k, v in w.items()}
    assert len(w["input_ids"]) == 3 and flat["input_ids"] == [0] * 24 + ids + [tok.sep_id, tok.cls_id]
    assert flat["segment_ids"] == [4] * 24 + [0] * 71 + [2] and flat["padding_mask"] == [0] * 24 + [1] * 72
    capped = F.build_windows(ids, L, tok.sep_id, tok.cls_id, max_segments=2)  # keeps the beginning
    assert sum(capped["input_ids"], []) == ids[:62] + [tok.sep_id, tok.cls_id]
    one = F.build_windows(ids[:10], L, tok.sep_id, tok.cls_id)
    assert one == {k: [v] for k, v in F.build_features(ids[:10], None, L, tok.sep_id, tok.cls_id).items()}


@pytest.mark.slow
def test_one_window_document_gives_todays_output(tok, models, reviews):
    from xlnet_tf.tasks.classification import features as F

    mem, trunc = models
    short = ["A fine film.", "Dull.", reviews[0][:60]]
    today = trunc(F.encode_texts(tok, short, max_seq_length=L))["logits"].numpy()
    windows = F.encode_documents(tok, short, L)
    assert windows["input_ids"].shape[1] == 1
    np.testing.assert_array_equal(mem(windows)["logits"].numpy(), today)  # bit for bit
    # In a batch with longer documents a one-window document attends to an all-hidden memory: same to rounding.
    mixed = F.encode_documents(tok, short + [reviews[1]], L)
    assert mixed["input_ids"].shape[1] > 1
    np.testing.assert_allclose(mem(mixed)["logits"].numpy()[:3], today, atol=1e-6)


def test_last_sentence_counts_in_memory_mode_only(tok, models, reviews):
    from xlnet_tf.tasks.classification import features as F

    mem, trunc = models
    body = next(r for r in reviews if 70 <= len(tok.encode(r)) <= 100)  # 3-4 windows with the ending
    endings = [" I loved every minute of it.", " I hated every minute of it."]
    docs = [body + e for e in endings]
    win = F.encode_documents(tok, docs, L, max_segments=4)
    assert (win["num_segments"] >= 3).all(), win["num_segments"]
    m = mem(win)["logits"].numpy()
    t = trunc(F.encode_texts(tok, docs, max_seq_length=L))["logits"].numpy()
    np.testing.assert_array_equal(t[0], t[1])  # truncation keeps the beginning: the ending is never read
    # Random-init logits are ~1e-2; rounding differences are ~1e-8 (the mixed batch above), truncation's 0.
    assert np.abs(m[0] - m[1]).max() > 1e-6, m
    # The memory carries the beginning too: changing only the first words changes the answer.
    first = mem(F.encode_documents(tok, ["Honestly, " + docs[0]], L, max_segments=4))["logits"].numpy()
    assert np.abs(first[0] - m[0]).max() > 1e-6


@pytest.mark.slow
def test_serving_windows_match_python(tok, reviews):
    import tensorflow as tf

    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf.tasks.classification.serving import document_windows

    texts = reviews[:24] + ["Short.", ""]
    ragged = tok.tf_tokenizer().tokenize(tf.constant(texts))
    for cap in (None, 3):
        graph = tf.function(lambda r: document_windows(r, L, tok.sep_id, tok.cls_id, cap))(ragged)
        py = F.encode_documents(tok, texts, L, max_segments=cap)
        for k in py:
            np.testing.assert_array_equal(graph[k].numpy(), py[k], err_msg=f"{k} max_segments={cap}")
    # The exported SavedModel's answers against the Python features: test_memory_mode_cli_... below.


def _key_docs(tok, reviews, n, seed):
    """Real review text behind a key word that sets the label; each document fills exactly 2 windows, so the
    key sits in the first window and the head (last window) can read it only through the memory."""
    rng = np.random.default_rng(seed)
    rows = []
    for text in reviews:
        label = ["neg", "pos"][int(rng.integers(2))]
        words = text.split()
        doc = ""
        for i in range(1, len(words)):
            cand = ("excellent " if label == "pos" else "terrible ") + " ".join(words[:i])
            if len(tok.encode(cand)) > 2 * L - 2:
                break
            doc = cand
        if len(tok.encode(doc)) > L:
            rows.append((doc, label))
        if len(rows) == n:
            break
    return rows


@pytest.mark.slow
def test_memory_mode_cli_learns_through_memory_and_exports_text_any_length(tok, reviews, tmp_path):
    import run_classifier
    from tests.cli_util import succeeds
    from tests.conftest import tiny

    TINY = tiny()

    pool = read_reviews("train", 500)
    data = tmp_path / "data"
    data.mkdir()
    split = {"train": _key_docs(tok, pool, 320, 0), "dev": _key_docs(tok, reviews, 96, 1)}
    for name, rows in split.items():
        with open(data / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows([("text", "label")] + rows)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    out, export = tmp_path / "run", tmp_path / "export"
    succeeds(run_classifier, *[
        "--task=generic", f"--data_dir={data}", f"--model_config_path={tmp_path / 'config.json'}",
        f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
        f"--max_seq_length={L}", "--long_doc_mode=memory", "--max_segments=2", "--train_batch_size=16",
        "--train_steps=100", "--warmup_steps=10", "--learning_rate=2e-3", "--progress=false", "--save_steps=100",
        "--jit=false", "--accelerate=false", "--do_train", "--do_eval", f"--export_dir={export}"])
    res = json.loads((out / "eval_results.json").read_text())
    assert res["accuracy"] > 0.9, res  # chance: 0.5; the key is only in the memory
    long_review = max(reviews, key=len)  # the export reads the whole text: here ~30 windows of 32
    assert len(tok.encode(long_review)) > 20 * L
    texts = [d for d, _ in split["dev"]] + [long_review]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    run_like_a_server(
        f"m = tf.saved_model.load({str(export)!r})\n"
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        "out = m.signatures['serving_default'](text_a=tf.constant(texts))\n"
        f"np.save({str(tmp_path / 'probs.npy')!r}, out['probabilities'].numpy())\n"
        "emb = m.signatures['embed'](text_a=tf.constant(texts[:8]))['embedding']\n"
        f"np.save({str(tmp_path / 'emb.npy')!r}, emb.numpy())", tmp_path)
    served = np.load(tmp_path / "probs.npy")
    # The in-graph path (tokeniser, windows, while_loop) against the Python windows through the trained model.
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf import XLNetConfig
    from xlnet_tf.finetune import FineTuner

    cfg = XLNetConfig.from_dict(dict(TINY, mem_len=L))
    ft = FineTuner(cfg, lambda: ClassificationHead(cfg.d_model, 2, task_name="generic"),
                   F.feature_spec(L, max_segments=2))
    model = ft.model_for_inference(str(out / "model"))
    probs = tf.nn.softmax(model(F.encode_documents(tok, texts, L))["logits"]).numpy()
    np.testing.assert_allclose(served, probs, atol=1e-5)
    cls = model.encode(F.encode_documents(tok, texts[:8], L))[0]["sequence_output"][:, -1].numpy()
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), cls, atol=1e-4)
    labels = np.array([lab == "pos" for _, lab in split["dev"]])
    assert abs(np.mean(served[:-1].argmax(-1) == labels) - res["accuracy"]) < 1e-9


def test_memory_mode_refuses_pair_tasks_and_a_model_without_memory(tok):
    from xlnet_tf.tasks.classification.registry import get_task
    from xlnet_tf.tasks.classification.run import ClassifierRun
    from xlnet_tf.tasks.runner import TaskOptions
    from xlnet_tf import XLNetConfig

    def run(task, mem_len):
        return ClassifierRun(get_task(task), "unused", TaskOptions(
            tokenizer=tok, config=XLNetConfig.preset("tiny", mem_len=mem_len), max_seq_length=L, cache_dir="unused",
            eval_batch_size=8, max_segments=2))

    with pytest.raises(ValueError, match="mrpc has two texts"):
        run("mrpc", L)
    with pytest.raises(ValueError, match="needs --mem_len > 0"):
        run("imdb", 0)
    assert run("imdb", L).feature_spec()["input_ids"] == ("int64", (2, L))


@pytest.mark.slow
def test_extract_features_memory_vectors_match_the_model_loop(tok, reviews):
    from extract_features import document_vectors
    from xlnet_tf.heads.features import FeatureHead
    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig.preset("tiny", mem_len=2 * L, dropout=0.0, dropatt=0.0, accelerate=False)
    model = TaskModel(cfg, FeatureHead(cfg.n_layer, layers=(-1, 0), pooling="mean"), seed=3)
    texts = ["A fine film.", reviews[2][:500], reviews[3][:250]]
    windows = F.encode_documents(tok, texts, L)
    model.build_with(F.encode_texts(tok, texts[:1], max_seq_length=L))
    pooled, tokens = document_vectors(model, windows, batch_size=2)
    n, w = windows["input_ids"].shape[:2]
    assert tokens.shape == (n, w * L, 2, cfg.d_model) and pooled.shape == (n, 2, cfg.d_model) and w >= 3
    # The last window of every text, final layer: the TaskModel's in-graph loop over the same windows.
    seq = model.encode(windows)[0]["sequence_output"].numpy() * windows["padding_mask"][:, -1, :, None]
    np.testing.assert_allclose(tokens[:, -L:, 0], seq, atol=1e-5)
    # A one-window text: today's vectors; the mean pools every real token of a long text.
    today = model(F.encode_texts(tok, texts[:1], max_seq_length=L))
    np.testing.assert_allclose(tokens[:1, -L:], today["tokens"].numpy(), atol=1e-5)
    np.testing.assert_allclose(pooled[:1], today["pooled"].numpy(), atol=1e-5)
    mask = windows["padding_mask"].reshape(n, -1).astype(bool)
    np.testing.assert_allclose(pooled[1], tokens[1][mask[1]].mean(0), atol=1e-5)


def test_window_batches_bucket_by_count_and_keep_order(tok, reviews, tmp_path):
    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf.tasks.classification.reader import Example
    from xlnet_tf.tasks.classification.registry import get_task

    task = get_task("imdb")
    texts = [r[:n] for r, n in zip(reviews[:24], [40, 300, 900] * 8)]  # 1, ~3 and ~8+ windows of 32
    exs = [Example(f"t-{i}", t, None, "pos" if i % 2 else "neg") for i, t in enumerate(texts)]
    path = str(tmp_path / "w.tfrecord")
    assert F.write_features(exs, tok, task, L, path, max_segments=6, progress=False) == 24
    counts = F.encode_documents(tok, texts, L, max_segments=6)["num_segments"]
    assert len(set(counts)) >= 3
    train = F.make_window_dataset(path, 4, is_training=True, seed=1, shuffle_buffer=32)
    for batch in train.take(12):  # one window count per batch, no all-padding window
        n = batch["num_segments"].numpy()
        assert (n == n[0]).all() and batch["input_ids"].shape[1] == n[0]
        assert (batch["padding_mask"].numpy()[:, 0].sum(-1) > 0).all()
    evals = list(F.make_window_dataset(path, 8, is_training=False))
    assert [int(b["label"][0]) for b in evals] == [0, 0, 0]  # file order
    for i, b in enumerate(evals):
        assert b["input_ids"].shape[1] == counts[8 * i: 8 * i + 8].max()
        np.testing.assert_array_equal(b["num_segments"].numpy(), counts[8 * i: 8 * i + 8])
