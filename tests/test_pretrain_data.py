"""Pretraining data: permutation masks and targets, the TFRecord layout, SentencePiece training."""

import os

import numpy as np
import pytest
import tensorflow as tf

from xlnet_tf.data import pretrain_records as records, pretrain_sampling as sampling
from tests.conftest import SHARED, needs_shared
from xlnet_tf.data import tfrecord_io

SPIECE = os.path.join(SHARED, "spiece", "spiece.model")
WIKI = os.path.join(SHARED, "text", "wikitext2-valid.tokens")
SHAKES = os.path.join(SHARED, "text", "tinyshakespeare.txt")
SEP, CLS = 4, 3


def _toy(seq_len=16, reuse_len=4, seps=(9, 14)):
    """ids with SEP/CLS as the layout puts them; words of 1-2 pieces."""
    ids = np.arange(100, 100 + seq_len)
    ids[list(seps)] = SEP
    ids[-1] = CLS
    seg = np.zeros(seq_len, np.int64)
    seg[seps[0] + 1:] = 1
    seg[-1] = 2
    ws = np.ones(seq_len, np.int64)
    ws[[2, 6, 7, 11, 12]] = 0  # words: [1,2] [5,6,7] [10,11,12] ...
    return ids, seg, ws


def _sample(seed, seq_len=16, reuse_len=4, num_predict=4, perm_size=None, **kw):
    ids, seg, ws = _toy(seq_len, reuse_len)
    out = sampling.sample_pretrain_features(ids, seg, ws, tf.constant(seed, tf.int64), reuse_len=reuse_len,
                                     num_predict=num_predict, perm_size=perm_size, return_order=True, **kw)
    return ids, ws, {k: v.numpy() for k, v in out.items()}


def _reference_blocked(order, tgt, func, reuse_len):
    """The factorisation semantics written pair by pair (independent of the vectorised formula)."""
    n = len(order)
    blocked = np.zeros((n, n), bool)
    part = np.arange(n) >= reuse_len
    for i in range(n):
        for j in range(n):
            if part[i] != part[j]:
                blocked[i, j] = not part[i]  # reuse never sees the rest; the rest sees all of the reuse
            elif not (tgt[j] or func[j]):
                blocked[i, j] = False  # non-target context: visible to all
            elif tgt[i] or func[i]:
                earlier = order[j] < order[i]
                blocked[i, j] = not (earlier or (func[i] and i == j))  # a target never sees itself
            else:
                blocked[i, j] = True  # non-targets never see targets / SEP / CLS
    return blocked


@pytest.mark.parametrize("seed", [[0, 0], [1, 7], [3, 3], [42, 1]])
def test_perm_mask_matches_factorisation_order(seed):
    ids, ws, f = _sample(seed)
    pm, tgt, order = f["perm_mask"], f["input_q"].astype(bool), f["perm_order"]
    func = (ids == SEP) | (ids == CLS)
    assert not (tgt & func).any(), "SEP/CLS are never targets"
    assert (order[~(tgt | func)] == -1).all() and (order[tgt | func] >= 0).all()
    np.testing.assert_array_equal(pm.astype(bool), _reference_blocked(order, tgt, func, 4))
    # query stream: a target never sees itself; the content stream (perm_mask minus the diagonal) does;
    # every other token already sees itself in perm_mask
    np.testing.assert_array_equal(np.diag(pm), tgt.astype(pm.dtype))
    nt = ~(tgt | func)
    rest = np.arange(len(ids)) >= 4
    assert (pm[np.ix_(nt & ~rest, nt & ~rest)] == 0).all(), "non-targets see all non-targets of their part"
    assert (pm[np.ix_(nt & rest, nt)] == 0).all(), "...and the rest also sees the reuse part"
    assert (pm[:4, 4:] == 1).all() and (pm[4:, :4] == 0).all()


def test_targets_count_words_and_mapping():
    for s in range(12):
        ids, ws, f = _sample([5, s], num_predict=4)
        tgt = f["input_q"].astype(bool)
        # goal split as the original (num_predict 85 of 512 -> 43 reuse / 42 rest): 4 of 16, reuse 4 -> 1 / 3
        assert tgt[:4].sum() == 1 and tgt[4:].sum() == 3
        assert f["target_mask"].sum() == 4
        wid = np.cumsum(ws) - 1
        for w in np.unique(wid):
            members = tgt[wid == w]
            assert members.all() or not members.any(), f"span cuts word {w}: {tgt.astype(int)}"
        pos = np.flatnonzero(tgt)
        np.testing.assert_array_equal(f["target_mapping"].argmax(1), pos)
        np.testing.assert_array_equal(f["target_mapping"].sum(1), np.ones(4))
        np.testing.assert_array_equal(f["target"], ids[pos])


def test_padding_when_goal_unreachable_and_perm_blocks():
    ids, ws, f = _sample([2, 2], num_predict=12, perm_size=4)
    real = int(f["target_mask"].sum())
    assert real == f["input_q"].sum() <= 12
    assert (f["target_mapping"][real:] == 0).all() and (f["target"][real:] == 0).all()
    # factorisation order in blocks of perm_size: every rank of block b lies in [b*4, b*4+4) of its part
    order = f["perm_order"]
    for part_lo, part_hi in ((0, 4), (4, 16)):
        for p in range(part_lo, part_hi):
            if order[p] >= 0:
                assert (p - part_lo) // 4 == order[p] // 4


def test_target_fraction_and_determinism():
    rng = np.random.RandomState(0)
    L, R = 128, 64
    ids = rng.randint(100, 1000, L)
    ids[[100, 126]] = SEP
    ids[127] = CLS
    ws = (rng.rand(L) < 0.7).astype(np.int64)
    kw = dict(reuse_len=R, num_predict=21, mask_alpha=6, mask_beta=1)
    a = sampling.sample_pretrain_features(ids, np.zeros(L), ws, tf.constant([9, 1], tf.int64), **kw)
    b = sampling.sample_pretrain_features(ids, np.zeros(L), ws, tf.constant([9, 1], tf.int64), **kw)
    c = sampling.sample_pretrain_features(ids, np.zeros(L), ws, tf.constant([9, 2], tf.int64), **kw)
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    assert not np.array_equal(a["perm_mask"].numpy(), c["perm_mask"].numpy())
    assert a["target_mask"].numpy().sum() == 21  # round(128 / 6): K = mask_alpha / mask_beta
    assert a["input_q"].numpy()[:R].sum() == 21 - 21 * (L - R) // L


def test_span_stage_density_follows_mask_alpha():
    """Without the goal and the fill, spans cover about mask_beta / mask_alpha of the words."""
    m = 3000
    ws = tf.constant(np.random.RandomState(1).rand(m) < 0.6)  # words of ~1.7 pieces
    eligible = tf.ones([m], tf.bool)
    seeds = tf.random.experimental.stateless_split(tf.constant([4, 4], tf.int64), 3)
    for alpha, beta in ((6, 1), (4, 2)):
        tgt = sampling._span_targets(ws, eligible, m, seeds, alpha, beta, 5, fill=False).numpy()
        starts = ws.numpy().copy()
        starts[0] = True
        wid = np.cumsum(starts) - 1
        frac = len(np.unique(wid[tgt])) / (wid[-1] + 1)
        assert abs(frac - beta / alpha) < 0.04, (alpha, beta, frac)


# ------------------------------------------------------------------------------------ TFRecords, real model
def needs_spiece(test):
    """Skips ``test`` without the released spiece.model or WikiText-2's validation text."""
    return needs_shared("spiece", "spiece.model")(needs_shared("text", "wikitext2-valid.tokens")(test))


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    from xlnet_tf.tokenizer import XLNetTokenizer

    tmp = tmp_path_factory.mktemp("pretrain")
    corpus = tmp / "corpus.txt"
    with open(WIKI, encoding="utf-8") as f:
        corpus.write_text(f.read(20000), encoding="utf-8")
    tok = XLNetTokenizer(SPIECE)
    cfg = dict(seq_len=48, reuse_len=16, num_streams=4, bi_data=True)
    files = records.create_pretrain_tfrecords(str(corpus), str(tmp / "out" / "wt"), tok, records_per_shard=40,
                                        progress=False, **cfg)
    recs = []
    spec = records.pretrain_record_spec(cfg["seq_len"])
    for batch in tfrecord_io.make_dataset(files, spec, 1, is_training=False, int32=False):
        recs.append({k: v.numpy()[0] for k, v in batch.items()})
    stream = records.encode_corpus([str(corpus)], tok, progress=False)
    return dict(cfg, files=files, recs=recs, stream=stream, tok=tok)


@needs_spiece
def test_record_layout(tiny_records):
    L, R = tiny_records["seq_len"], tiny_records["reuse_len"]
    recs = tiny_records["recs"]
    assert len(tiny_records["files"]) > 1 and len(recs) % 4 == 0
    assert tfrecord_io.read_manifest(tiny_records["files"][0])["meta"]["num_streams"] == 4
    labels = set()
    for k, r in enumerate(recs):
        ids, seg = r["input_ids"], r["segment_ids"]
        assert r["stream"] == k % 4
        seps = np.flatnonzero(ids == SEP)
        assert len(seps) == 2 and seps[1] == L - 2 and ids[-1] == CLS and (ids != CLS)[:-1].all()
        assert seps[0] > R  # reuse + non-empty A
        expect = np.r_[np.zeros(seps[0] + 1), np.ones(L - 2 - seps[0]), [2]]
        np.testing.assert_array_equal(seg, expect)
        assert r["word_start"][[0, R, seps[0] + 1, L - 2, L - 1]].all()
        labels.add(int(r["nsp_label"]))
    assert labels == {0, 1}


@needs_spiece
def test_streams_continue_and_bi_data_reversed(tiny_records):
    L, R = tiny_records["seq_len"], tiny_records["reuse_len"]
    recs, stream = tiny_records["recs"], tiny_records["stream"]
    steps = len(recs) // 4
    n = len(stream) // 2  # bi_data: 2 forward streams, each also read reversed
    table = records.start_piece_table(tiny_records["tok"])
    for row in range(4):
        fwd = stream.ids[(row % 2) * n:(row % 2 + 1) * n]
        expect = fwd if row < 2 else fwd[::-1]
        by_step = [recs[t * 4 + row] for t in range(steps)]
        reuse = np.concatenate([r["input_ids"][:R] for r in by_step])
        np.testing.assert_array_equal(reuse, expect[:steps * R])  # record t+1 continues record t
        for a, b in zip(by_step, by_step[1:]):  # the next reuse part starts where this A started
            na = np.flatnonzero(a["input_ids"] == SEP)[0] - R
            m = min(na, R)
            np.testing.assert_array_equal(b["input_ids"][:m], a["input_ids"][R:R + m])
        for t, r in enumerate(by_step):
            if r["nsp_label"] == 1:  # B continues A in the stream (A may have been trimmed on its right)
                s0 = np.flatnonzero(r["input_ids"] == SEP)[0]
                b = r["input_ids"][s0 + 1:L - 2]
                start = t * R + s0  # A begins at t*R + R and has s0 - R pieces
                assert any(np.array_equal(b, expect[c:c + len(b)]) for c in range(start, start + L))
        # word starts in reading order: a reversed piece starts a word when the next forward piece does
        ws = np.concatenate([r["word_start"][1:R] for r in by_step])
        pos = np.concatenate([np.arange(t * R + 1, t * R + R) for t in range(steps)])
        if row < 2:
            want = table[expect[pos]]
        else:
            want = table[expect[pos - 1]]
        np.testing.assert_array_equal(ws, want)


@pytest.mark.slow
@needs_spiece
def test_dataset_batches_keep_stream_order(tiny_records):
    L, R = tiny_records["seq_len"], tiny_records["reuse_len"]
    recs = tiny_records["recs"]
    ds = sampling.make_pretrain_dataset(tiny_records["files"], L, R, batch_size=4, bi_data=True, seed=3, repeat=False)
    batches = list(ds.take(3).as_numpy_iterator())
    for t, b in enumerate(batches):
        np.testing.assert_array_equal(b["input_ids"], np.stack([recs[t * 4 + r]["input_ids"] for r in range(4)]))
        assert b["perm_mask"].shape == (4, L, L) and b["target_mapping"].shape == (4, 8, L)
        np.testing.assert_array_equal(b["target_mask"].sum(1), [8] * 4)  # round(48 / 6)
    again = list(sampling.make_pretrain_dataset(tiny_records["files"], L, R, 4, bi_data=True, seed=3,
                                         repeat=False).take(3).as_numpy_iterator())
    np.testing.assert_array_equal(batches[2]["perm_mask"], again[2]["perm_mask"])
    with pytest.raises(ValueError):
        sampling.make_pretrain_dataset(tiny_records["files"], L, R, batch_size=3, bi_data=True)
    with pytest.raises(ValueError):
        sampling.make_pretrain_dataset(tiny_records["files"], L, R, batch_size=4, bi_data=False)


@needs_spiece
def test_cached_files_are_reused(tiny_records, tmp_path):
    files = tiny_records["files"]
    mtimes = [os.path.getmtime(p) for p in files]
    prefix = files[0].rsplit("-00000-of-", 1)[0]
    corpus = os.path.join(os.path.dirname(os.path.dirname(prefix)), "corpus.txt")
    again = records.create_pretrain_tfrecords(corpus, prefix, tiny_records["tok"], seq_len=48, reuse_len=16,
                                        num_streams=4, bi_data=True, records_per_shard=40, progress=False)
    assert again == files and [os.path.getmtime(p) for p in files] == mtimes


# ------------------------------------------------------------------------------------ SentencePiece training
def test_is_start_piece():
    assert records.is_start_piece("\u2581the") and records.is_start_piece("<eod>") and records.is_start_piece(".")
    assert records.is_start_piece(")") and records.is_start_piece("),") and records.is_start_piece("<")
    assert not records.is_start_piece("ing") and not records.is_start_piece("s.")


@needs_shared("text", "tinyshakespeare.txt")
def test_spm_train_special_ids(tmp_path):
    from xlnet_tf.spm_train import EXPECTED_IDS, train_spm
    from xlnet_tf.tokenizer import XLNetTokenizer

    corpus = tmp_path / "c.txt"
    with open(SHAKES, encoding="utf-8") as f:
        corpus.write_text(f.read(100000) + "\nPrices: \u00a35, \u20ac7 \u2013 (ok).\n", encoding="utf-8")
    path = train_spm(str(corpus), str(tmp_path / "sp"), vocab_size=300, quiet=True)
    tok = XLNetTokenizer(path)
    assert [tok.sp.IdToPiece(i) for i in range(9)] == list(EXPECTED_IDS)
    assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id, tok.eod_id, tok.eop_id) == (3, 4, 5, 6, 7, 8)
    assert tok.vocab_size == 300 and tok.encode("First Citizen.")
    assert sorted(os.listdir(tmp_path)) == ["c.txt", "sp.model", "sp.vocab"]  # no temp leftovers


# ------------------------------------------------------------------------------------ masked LM (BERT-style)
@pytest.mark.slow
def test_mlm_masking_rate_and_replacements():
    """15% of the non-SEP/CLS pieces selected (exactly round(0.15 L) per sequence), 80/10/10 mask/random/kept,
    targets = the original ids in position order, deterministic per seed."""
    L, vocab = 40, 500
    assert sampling.mlm_num_predict(L) == 6
    rng = np.random.RandomState(0)
    ids = rng.randint(sampling.NUM_SPECIAL_PIECES, vocab, size=L).astype(np.int32)
    ids[[20, 37]], ids[38], ids[39] = 4, 4, 3  # SEP, SEP, SEP, CLS: never selected
    seg = np.zeros(L, np.int32)
    fn = tf.function(lambda s: sampling.sample_mlm_features(ids, seg, s, num_predict=6, vocab_size=vocab, mask_id=6,
                                                     return_kind=True))
    kinds, positions = [], np.zeros(L)
    for i in range(1500):
        f = {k: v.numpy() for k, v in fn(tf.constant([7, i], tf.int64)).items()}
        kind, sel = f["mlm_kind"], f["mlm_kind"] > 0
        assert sel.sum() == 6 and f["target_mask"].sum() == 6 and not sel[[20, 37, 38, 39]].any()
        pos = np.argmax(f["target_mapping"], -1)
        np.testing.assert_array_equal(pos, np.flatnonzero(sel))
        np.testing.assert_array_equal(f["target"], ids[pos])
        np.testing.assert_array_equal(f["input_ids"][kind == 0], ids[kind == 0])
        assert (f["input_ids"][kind == 1] == 6).all() and (f["input_ids"][kind == 3] == ids[kind == 3]).all()
        np.testing.assert_array_equal(f["mask_emb_positions"], (kind == 1).astype(np.float32))
        rnd = f["input_ids"][kind == 2]
        assert ((rnd >= sampling.NUM_SPECIAL_PIECES) & (rnd < vocab)).all()
        kinds.append(kind[sel])
        positions += sel
    kinds = np.concatenate(kinds)
    frac = [np.mean(kinds == k) for k in (1, 2, 3)]  # 9000 draws: sd of a 10% share is 0.3 points
    np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.015)
    eligible = positions[[i for i in range(L) if i not in (20, 37, 38, 39)]]
    assert eligible.min() > 0.5 * eligible.mean() and eligible.max() < 1.5 * eligible.mean()  # uniform
    a = fn(tf.constant([7, 3], tf.int64))
    b = fn(tf.constant([7, 3], tf.int64))
    np.testing.assert_array_equal(a["input_ids"].numpy(), b["input_ids"].numpy())


@needs_spiece
def test_mlm_dataset_on_real_records(tiny_records):
    """The same records read with objective="mlm": 15% of seq_len targets per row, the original ids."""
    r = tiny_records
    ds = sampling.make_pretrain_dataset(r["files"], r["seq_len"], r["reuse_len"], 4, bi_data=True, objective="mlm",
                                 vocab_size=r["tok"].vocab_size, mask_id=r["tok"].mask_id, repeat=False)
    batch = next(iter(ds))
    assert batch["target"].shape == (4, sampling.mlm_num_predict(r["seq_len"])) and "perm_mask" not in batch
    assert (batch["target_mask"].numpy() == 1).all()
    raw = np.stack([rec["input_ids"] for rec in r["recs"][:4]])
    pos = np.argmax(batch["target_mapping"].numpy(), -1)
    np.testing.assert_array_equal(batch["target"].numpy(), np.take_along_axis(raw, pos, 1))
    changed = batch["input_ids"].numpy() != raw
    assert changed.any() and (np.take_along_axis(changed, pos, 1).sum() == changed.sum())
    with pytest.raises(ValueError, match="vocab_size"):
        sampling.make_pretrain_dataset(r["files"], r["seq_len"], r["reuse_len"], 4, bi_data=True, objective="mlm")
