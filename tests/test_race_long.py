"""RACE memory mode (``run_race.py --long_doc_mode=memory``): the windows of each option on real articles, the
model's window loop over the choice axis, and what each mode reads of a long article.

Tiny random-init models; real RACE dev articles (``../shared/data/race``).
"""

import dataclasses

import numpy as np
import pytest

from tests.conftest import shared_path

L, QA = 64, 16


@pytest.fixture(scope="module")
def tok():
    from xlnet_tf.tokenizer import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


@pytest.fixture(scope="module")
def examples():
    from xlnet_tf.tasks.race import reader as race_task

    docs = race_task.read_race_documents(shared_path("race", "RACE.tar.gz"), "dev")
    return [ex for d in docs[:40] for ex in d.examples]


def make_model(mem_len, seed=1):
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig.preset("tiny", mem_len=mem_len, dropout=0.0, dropatt=0.0, accelerate=False)
    return TaskModel(cfg, MultipleChoiceHead(cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropout=0.0,
                                             dropatt=0.0), seed=seed)


def batch(feats):
    return {k: np.stack([f[k] for f in feats]) for k in feats[0]}


@pytest.fixture(scope="module")
def models(tok, examples):
    """(memory model, mem_len 4 windows; truncating model with the same weights, mem_len 0)."""
    from xlnet_tf.tasks.race import features as R

    ex = examples[0]
    mem, trunc = make_model(4 * L), make_model(0)
    mem.build_with(batch([R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, max_segments=2)]))
    trunc.build_with(batch([R.encode_race(tok, ex.article, ex.question, ex.options, L, QA)]))
    trunc.set_weights(mem.get_weights())
    return mem, trunc


def test_window_layout_on_real_articles(tok, examples):
    from xlnet_tf.tasks.race import features as R

    long_seen = capped_seen = 0
    for ex in examples[:60]:
        ctx = tok.encode(ex.article)
        qas = [tok.encode(R.qa_text(ex.question, o))[-QA:] for o in ex.options]
        for cap in (None, 3):
            w = R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, context_ids=ctx, max_segments=cap,
                              windows=True)
            n_win = w["input_ids"].shape[1]
            assert n_win == (cap or n_win) and w["input_ids"].shape == (4, n_win, L)
            counts = []
            for j, qa in enumerate(qas):
                keep = ctx if cap is None else ctx[:cap * L - 3 - len(qa)]  # the article's beginning
                seq = keep + [tok.sep_id] + qa + [tok.sep_id, tok.cls_id]
                segs = [0] * (len(keep) + 1) + [1] * (len(qa) + 1) + [2]
                s = -(-len(seq) // L)
                counts.append(s)
                ids, seg, mask = (w[k][j] for k in ("input_ids", "segment_ids", "padding_mask"))
                assert not mask[:n_win - s].any() and (ids[:n_win - s] == 0).all()  # leading all-padding windows
                assert (seg[:n_win - s] == 4).all()
                pad = s * L - len(seq)  # only the first real window is partial, LEFT-padded
                assert list(ids[n_win - s:].ravel()) == [0] * pad + seq
                assert list(seg[n_win - s:].ravel()) == [4] * pad + segs
                assert list(mask[n_win - s:].ravel()) == [0] * pad + [1] * len(seq)
                assert mask[-1].all() or s == 1  # the last window is full whenever there is more than one
                long_seen += s > 1
                capped_seen += cap is not None and len(keep) < len(ctx)
            assert int(w["num_segments"]) == max(counts)
        # one window (and max_segments=1, always): exactly today's features
        today = R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, context_ids=ctx)
        one = R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, context_ids=ctx, max_segments=1)
        for k in today:
            np.testing.assert_array_equal(one[k][:, 0], today[k])
        big = R.encode_race(tok, ex.article, ex.question, ex.options, 512, QA, context_ids=ctx, windows=True)
        if int(big["num_segments"]) == 1:
            today = R.encode_race(tok, ex.article, ex.question, ex.options, 512, QA, context_ids=ctx)
            for k in today:
                np.testing.assert_array_equal(big[k][:, 0], today[k])
    assert long_seen > 100 and capped_seen > 50


@pytest.mark.slow
def test_one_window_article_gives_todays_output(tok, examples, models):
    from xlnet_tf.tasks.race import features as R

    mem, trunc = models
    exs = examples[:3]  # real articles are longer than a window of 64: cut to their first 30 pieces
    arts = [tok.decode(tok.encode(ex.article)[:30]) for ex in exs]
    win = [R.encode_race(tok, a, ex.question, ex.options, L, QA, windows=True) for a, ex in zip(arts, exs)]
    assert all(int(w["num_segments"]) == 1 for w in win)
    plain = [R.encode_race(tok, a, ex.question, ex.options, L, QA) for a, ex in zip(arts, exs)]
    a = mem(batch(win))["logits"].numpy()
    b = trunc(batch(plain))["logits"].numpy()
    assert a.shape == (3, 4)
    np.testing.assert_allclose(a, b, atol=1e-6)
    # one-window questions in a batch with a long one: an all-hidden memory, the same up to rounding
    long_ex = examples[0]
    mixed = [R.encode_race(tok, a, ex.question, ex.options, L, QA, max_segments=3) for a, ex in zip(arts, exs)]
    mixed.append(R.encode_race(tok, long_ex.article, long_ex.question, long_ex.options, L, QA, max_segments=3))
    np.testing.assert_allclose(mem(batch(mixed))["logits"].numpy()[:3], b, atol=1e-5)


@pytest.mark.slow
def test_article_end_counts_in_memory_mode_only_and_its_start_reaches_through_memory(tok, examples, models):
    from xlnet_tf.tasks.race import features as R

    mem, trunc = models
    ex = next(e for e in examples if 3 * L < len(tok.encode(e.article)) < 3.6 * L)  # 4 windows uncapped
    sents = ex.article.split(". ")
    assert len(sents) > 4
    changed_end = ". ".join(sents[:-1] + ["Nobody knew what the old painter had hidden in the red box"])
    changed_start = ". ".join(["Nobody knew what the old painter had hidden in the red box"] + sents[1:])

    def run(model, article, **kw):
        """(logits [1, 4], the 4 options' CLS vectors): a random head's logits are tiny (~4e-3) and close, so a
        change is also checked on the CLS vectors the head reads."""
        f = batch([R.encode_race(tok, article, ex.question, ex.options, L, QA, **kw)])
        return model(f)["logits"].numpy(), model.encode(f)[0]["sequence_output"][:, -1].numpy()

    def changed(a, b):  # far beyond float32 rounding (logits ~1e-9, CLS ~1e-6); measured: logits >2e-5, CLS >1e-3
        return np.abs(a[0] - b[0]).max() > 1e-7 and np.abs(a[1] - b[1]).max() > 1e-4

    # truncation keeps the article's BEGINNING: a change at its end is cut away, one at its start counts
    base_t = run(trunc, ex.article)
    for x, y in zip(run(trunc, changed_end), base_t):
        np.testing.assert_array_equal(x, y)
    assert changed(run(trunc, changed_start), base_t)
    # memory mode: the end sits in the last window, the start only in the memory windows; both count
    base_m = run(mem, ex.article, max_segments=4)
    assert int(R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, max_segments=4)["num_segments"]) == 4
    assert changed(run(mem, changed_end, max_segments=4), base_m)
    start_ids = tok.encode(changed_start)
    last_window = R.encode_race(tok, changed_start, ex.question, ex.options, L, QA, max_segments=4)["input_ids"][:, -1]
    assert not np.isin(start_ids[:10], last_window).all()  # the first sentence is not in the last window
    assert changed(run(mem, changed_start, max_segments=4), base_m)


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_window_dataset_and_training_step(tok, examples, tmp_path):
    """Windows written to TFRecords, batched by window count for training, trimmed in evaluation; one training
    step sends gradients through the last window to every variable fine-tuning uses."""
    import tensorflow as tf

    from xlnet_tf.data import tfrecord_io
    from xlnet_tf.tasks.race import features as R

    recs = []
    for ex in examples[:24]:
        f = R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, max_segments=6)
        f.update(label=ex.label, level=0)
        recs.append(f)
    path = str(tmp_path / "race.tfrecord")
    tfrecord_io.write_tfrecords(path, recs, R.race_feature_spec(L, max_segments=6), meta={}, progress=False)
    ev = list(R.race_dataset(path, L, 8, is_training=False, max_segments=6))
    assert [b["input_ids"].shape[0] for b in ev] == [8, 8, 8]
    for i, b in enumerate(ev):
        s = max(int(r["num_segments"]) for r in recs[8 * i:8 * i + 8])
        assert b["input_ids"].shape == (8, 4, s, L)
        want = np.stack([r["input_ids"][:, -s:] for r in recs[8 * i:8 * i + 8]])
        np.testing.assert_array_equal(b["input_ids"].numpy(), want)
    tr = next(iter(R.race_dataset(path, L, 2, is_training=True, max_segments=6, seed=0)))
    assert len(set(tr["num_segments"].numpy().tolist())) == 1 and tr["input_ids"].shape[2] == tr["num_segments"][0]
    model = make_model(2 * L)
    model.build_with(tr)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model.per_example_loss(tr, model(tr, training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    none = [v.path for v, g in zip(model.trainable_variables, grads) if g is None]
    assert np.isfinite(loss.numpy()) and sorted(none) == ["xlnet/lm_bias", "xlnet/mask_emb"], none  # pretraining only


@pytest.mark.slow
def test_serving_windows_match_python_and_the_model(tok, examples, models):
    """The export's in-graph windows (whole articles, no cap) == ``encode_race(windows=True)`` right-aligned to the
    batch's most windows; the served answer == the model on the Python windows. (``serving_default`` traces these
    same calls into the SavedModel.)"""
    import tensorflow as tf

    from xlnet_tf.tasks.race import features as R
    from xlnet_tf.tasks.race.serving import RaceServing

    mem, _ = models
    exs = examples[::7][:6]
    exs[1] = dataclasses.replace(exs[1], article=tok.decode(tok.encode(exs[1].article)[:20]))  # one window
    py = [R.encode_race(tok, ex.article, ex.question, ex.options, L, QA, windows=True) for ex in exs]
    w = max(int(f["num_segments"]) for f in py)
    assert w > 3 and int(py[1]["num_segments"]) == 1
    want = {k: np.stack([np.concatenate([np.zeros((4, w - f[k].shape[1], L), np.int32) + (4 if k == "segment_ids"
                                                                                         else 0), f[k]], 1)
                         for f in py]) for k in ("input_ids", "segment_ids", "padding_mask")}
    want["num_segments"] = np.array([int(f["num_segments"]) for f in py])
    serving = RaceServing(mem, tok, L, QA, memory=True)
    got = serving.features([ex.article for ex in exs], [ex.question for ex in exs], [list(ex.options) for ex in exs])
    for k in want:
        np.testing.assert_array_equal(got[k].numpy(), want[k], err_msg=k)
    served = serving._outputs(got)  # what serving_default runs (traced there; eager here, to stay fast)
    probs = tf.nn.softmax(mem(want)["logits"]).numpy()
    np.testing.assert_allclose(served["probabilities"].numpy(), probs, atol=1e-6)
