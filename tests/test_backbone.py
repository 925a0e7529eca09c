"""Backbone behaviour beyond HF parity: config I/O, dropout, mixed precision, recompute, depths."""

import json
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import tiny
from xlnet_tf import XLNetConfig, XLNetModel, accel, block, encodings, ops
from xlnet_tf.accel import chunks, fusions

TINY = tiny(d_model=32, d_head=16, d_inner=64, n_token=60)


def test_config_reads_original_hf_and_own(tmp_path):
    orig = {"n_layer": 24, "d_model": 1024, "n_head": 16, "d_head": 64, "d_inner": 4096,
            "ff_activation": "gelu", "untie_r": True, "n_token": 32000}
    (tmp_path / "xlnet_config.json").write_text(json.dumps(orig))
    c = XLNetConfig.from_json_file(str(tmp_path / "xlnet_config.json"), mem_len=384)
    assert (c.n_layer, c.d_model, c.mem_len, c.attn_type) == (24, 1024, 384, "bi")
    assert c == XLNetConfig.large(mem_len=384)
    hf = {"vocab_size": 32000, "d_model": 768, "n_layer": 12, "n_head": 12, "d_head": 64, "d_inner": 3072,
          "ff_activation": "gelu_new", "untie_r": True, "attn_type": "bi", "mem_len": None, "bi_data": False,
          "clamp_len": -1, "same_length": False, "dropout": 0.1, "summary_type": "last"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    c2 = XLNetConfig.from_json_file(str(tmp_path / "config.json"))
    assert c2.n_token == 32000 and c2.ff_activation == "gelu" and c2.mem_len == 0
    # an HF config's names are transformers': its "gelu" (the default) is the erf form; ours is the tanh form
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, ff_activation="gelu")))
    assert XLNetConfig.from_json_file(str(tmp_path / "config.json")).ff_activation == "gelu_exact"
    assert XLNetConfig.from_dict(orig).ff_activation == "gelu"
    c.to_json_file(str(tmp_path / "own.json"))
    assert XLNetConfig.from_json_file(str(tmp_path / "own.json")) == c
    assert XLNetConfig.load("tiny").n_layer == 2


@pytest.mark.parametrize("bad,msg", [({"n_layer": 0}, "n_layer"), ({"attn_type": "full"}, "attn_type"),
                                     ({"ff_activation": "swish"}, "ff_activation"), ({"dropout": 1.5}, "dropout")])
def test_config_errors_name_the_field(tmp_path, bad, msg):
    d = {**TINY, **bad}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=msg):
        XLNetConfig.from_json_file(str(p))
    p.write_text("{not json")
    with pytest.raises(ValueError, match="c.json: not valid json"):
        XLNetConfig.from_json_file(str(p))
    p.write_text(json.dumps({"d_model": 8}))
    with pytest.raises(ValueError, match=r"missing key\(s\)"):
        XLNetConfig.from_json_file(str(p))


def _inputs(b=2, q=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 60, (b, q)).astype(np.int32)
    mask = np.ones((b, q), np.int32)
    mask[0, :2] = 0
    seg = np.zeros((b, q), np.int32)
    seg[:, 4:] = 1
    return ids, seg, mask


@pytest.mark.slow
def test_dropout_only_in_training():
    m = XLNetModel(XLNetConfig(**TINY, dropout=0.3, dropatt=0.3))
    ids, seg, mask = _inputs()
    e1 = m(ids, segment_ids=seg, padding_mask=mask)["sequence_output"].numpy()
    e2 = m(ids, segment_ids=seg, padding_mask=mask, training=False)["sequence_output"].numpy()
    np.testing.assert_array_equal(e1, e2)
    t1 = m(ids, segment_ids=seg, padding_mask=mask, training=True)["sequence_output"].numpy()
    t2 = m(ids, segment_ids=seg, padding_mask=mask, training=True)["sequence_output"].numpy()
    assert np.abs(t1 - e1).max() > 1e-3 and np.abs(t1 - t2).max() > 1e-3
    # the seed state is a weight: restoring it replays the same masks
    m.dropout_seed.assign([0, 1])
    np.testing.assert_array_equal(m(ids, segment_ids=seg, padding_mask=mask, training=True)["sequence_output"], t2)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_masks_do_not_overflow(policy):
    ids, seg, mask = _inputs()
    ref = XLNetModel(XLNetConfig(**TINY, dropout=0.0, dropatt=0.0))
    perm = np.triu(np.ones((7, 7), np.float32), 1)[None].repeat(2, 0)
    tm = np.eye(7, dtype=np.float32)[None, 3:6].repeat(2, 0)
    kw = dict(segment_ids=seg, padding_mask=mask, perm_mask=perm, target_mapping=tm)
    want = ref(ids, **kw)
    keras.mixed_precision.set_global_policy(policy)
    try:
        m = XLNetModel(XLNetConfig(**TINY, dropout=0.0, dropatt=0.0))
        for a, b in zip(m.weights, ref.weights):
            a.assign(b)
        out = m(ids, **kw)
        assert out["sequence_output"].dtype == tf.as_dtype(policy.split("_")[1])
        for key in ("sequence_output", "query_output"):
            got = tf.cast(out[key], tf.float32).numpy()
            assert np.all(np.isfinite(got))
            tol = 0.05 if policy == "mixed_float16" else 0.25
            assert np.abs(got - want[key].numpy()).max() < tol
        assert m.lm_logits(out["query_output"]).dtype == tf.float32
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [0, 3])
def test_recompute_same_loss_and_gradients(chunk, monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK", chunk)  # 3: the 7 queries run as two chunks (3 + 4 rows)
    ids, seg, mask = _inputs()
    tm = np.eye(7, dtype=np.float32)[None, 2:5].repeat(2, 0)
    perm = np.triu(np.ones((7, 7), np.float32))[None].repeat(2, 0)
    results, base_weights = [], None
    for recompute in (False, True):
        m = XLNetModel(XLNetConfig(**TINY, dropout=0.2, dropatt=0.2, recompute=recompute), seed=3)
        if base_weights is None:
            base_weights = [w.numpy() for w in m.weights]
        else:
            for a, b in zip(m.weights, base_weights):
                a.assign(b)
        with tf.GradientTape() as tape:
            out = m(ids, segment_ids=seg, padding_mask=mask, perm_mask=perm, target_mapping=tm, training=True)
            loss = tf.reduce_mean(tf.square(out["sequence_output"])) + tf.reduce_mean(
                m.lm_logits(out["query_output"]) ** 2)
        grads = tape.gradient(loss, m.trainable_variables)
        results.append((loss.numpy(), [g.numpy() if not isinstance(g, tf.IndexedSlices)
                                       else tf.convert_to_tensor(g).numpy() for g in grads]))
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) < 1e-6
    assert all(g is not None for g in g1)
    assert max(np.abs(a - b).max() for a, b in zip(g0, g1)) < 1e-5


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16)])
def test_xla_layer_norm_and_gelu_match_plain_ops_with_gradients(shape):
    """The XLA clusters (forward + hand-written backward) against TensorFlow's own ops and autodiff."""
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(0, 2, shape), tf.float32)
    dy = tf.constant(rng.normal(0, 1, shape), tf.float32)
    gamma = tf.Variable(rng.normal(1, 0.3, shape[-1:]).astype(np.float32))
    beta = tf.Variable(rng.normal(0, 0.3, shape[-1:]).astype(np.float32))
    pairs = [(lambda v: fusions.layer_norm(v, gamma, beta, 1e-12),
              lambda v: ops.layer_norm(v, gamma, beta, 1e-12)),
             (fusions.gelu_tanh, ops.gelu_tanh)]
    for fused, plain in pairs:
        results = []
        for fn in (fused, plain):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            results.append([y] + tape.gradient(y, [x, gamma, beta], output_gradients=dy))
        for a, b in zip(*results):
            if b is None:
                assert a is None
                continue
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("table", [ops.PLAIN, fusions.FUSED], ids=["plain", "xla"])
def test_dropout_masks_rate_scale_and_sites(table):
    """Keep fraction 1 - rate, kept values scaled by 1/(1 - rate), gradient = mask * scale, one mask per site
    and seed, the same mask again for the same site and seed."""
    x = tf.ones([400, 500])
    seed = tf.constant([3, 9], tf.int64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = table.dropout(x, 0.3, seed, 1)
    dx = tape.gradient(y, x).numpy()
    y = y.numpy()
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.7)}
    assert abs((y > 0).mean() - 0.7) < 0.005  # 200,000 draws: 5 sd = 0.005
    np.testing.assert_array_equal(dx, y)
    np.testing.assert_array_equal(table.dropout(x, 0.3, seed, 1), y)
    assert (table.dropout(x, 0.3, seed, 2).numpy() != y).mean() > 0.3
    assert (table.dropout(x, 0.3, tf.constant([3, 10], tf.int64), 1).numpy() != y).mean() > 0.3
    assert table.dropout(x, 0.3, None, 1) is x and table.dropout(x, 0.0, seed, 1) is x


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["gelu_dropout", "dropout_add_ln", "dropout_add_ln_bias", "attention_core",
                                "attention_core_no_dropatt"])
def test_fused_training_sites_match_plain_ops_with_gradients(fn):
    """Each XLA-fused site of a training step (``fusions.FUSED``, and ``fusions.rel_attn_core``: forward +
    hand-written backward, same dropout mask) against the plain TensorFlow ops and autodiff (``ops.PLAIN``,
    ``attention.rel_attn_core``)."""
    from xlnet_tf import attention

    rng = np.random.default_rng(5)
    seed = tf.constant([1, 2], tf.int64)
    t = lambda *shape: tf.constant(rng.normal(0, 1.5, shape), tf.float32)  # noqa: E731
    if fn.startswith("attention_core"):  # b 2, n 3, q 5, h 4, mlen 2 (klen 7, rlen 12); segments, a blocked part
        args = [t(2, 3, 5, 4), t(2, 3, 7, 4), t(2, 3, 7, 4), t(1, 3, 12, 4), t(3, 4), t(3, 4), t(3, 4), t(2, 3, 4)]
        ef_diff = tf.constant(rng.random((2, 5, 7)) < 0.5)
        blocked = tf.constant(rng.random((2, 5, 7)) < 0.3) & tf.constant(np.arange(7) > 0)  # col 0 always open
        rate = 0.25 if fn == "attention_core" else 0.0
        cores = (fusions.rel_attn_core, attention.rel_attn_core)
        runs = [lambda *a, core=core: core(*a, ef_diff, blocked, 0.5, rate, seed, 6) for core in cores]
    elif fn == "gelu_dropout":
        args = [t(6, 16), t(16)]
        runs = [lambda u, b, table=table: table.gelu_dropout(u, b, 0.25, seed, 3)
                for table in (fusions.FUSED, ops.PLAIN)]
    else:
        args = [t(6, 16), t(6, 16), t(16) + 1.0, t(16)] + ([t(16)] if fn.endswith("bias") else [])
        runs = [lambda h, x, g, b, *bias, table=table: table.dropout_add_layer_norm(
            h, x, g, b, 1e-12, 0.25, seed, 4, bias=bias[0] if bias else None) for table in (fusions.FUSED, ops.PLAIN)]
    results = []
    for run in runs:
        with tf.GradientTape() as tape:
            tape.watch(args)
            outs = run(*args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            loss = sum(tf.reduce_sum(tf.sin(2.0 * o)) for o in outs)  # uneven output gradients
        results.append([o.numpy() for o in outs] + [g.numpy() for g in tape.gradient(loss, args)])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    if fn == "gelu_dropout":  # dropout did act
        assert (results[0][0] == 0).mean() > 0.1
    elif fn == "attention_core":  # dropout did act: the gradient of v has fewer contributions than without
        no_drop = attention.rel_attn_core(*args, ef_diff, blocked, 0.5, 0.0, seed, 6).numpy()
        assert np.abs(results[0][0] - no_drop).max() > 1e-2
    elif fn.startswith("dropout_add_ln"):  # zeros in the gradient of h
        assert (results[0][1] == 0).mean() > 0.1


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_xla_fusions_off_same_outputs_and_gradients(monkeypatch):
    """Without the ``xla`` acceleration (plain ops for every elementwise chain) the model is the same, dropout
    included."""
    ids, seg, mask = _inputs()
    m = XLNetModel(XLNetConfig(**TINY, dropout=0.1, dropatt=0.1), seed=4)
    results = []
    for option in (True, "kernels,chunks"):
        monkeypatch.setattr(m.config, "accelerate", option)
        m.dropout_seed.assign([4, 0])
        infer = m(ids, segment_ids=seg, padding_mask=mask)["sequence_output"].numpy()
        with tf.GradientTape() as tape:
            h = m(ids, segment_ids=seg, padding_mask=mask, training=True)["sequence_output"]
            loss = tf.reduce_mean(tf.square(h))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, m.trainable_variables) if g is not None]
        results.append((infer, h.numpy(), grads))
    (i0, h0, g0), (i1, h1, g1) = results
    assert np.abs(i0 - i1).max() < 1e-5 and np.abs(h0 - h1).max() < 1e-5
    assert len(g0) == len(g1) and max(np.abs(a - b).max() for a, b in zip(g0, g1)) < 1e-5


@pytest.mark.parametrize("run", [dict(), dict(bi_data=True), dict(clamp_len=3), dict(attn_type="uni"),
                                 dict(bi_data=True, clamp_len=2)])
@pytest.mark.parametrize("qlen,mlen", [(9, 0), (5, 4)])
def test_positional_basis_projects_like_the_encoding(run, qlen, mlen):
    """The factored encodings (inference) give the same projected encodings as the [pb, r, d] tensor."""
    cfg = XLNetConfig(**TINY, **run)
    attn = XLNetModel(cfg).blocks[0].rel_attn
    args = (qlen, qlen + mlen, cfg.d_model, cfg.attn_type, cfg.bi_data, cfg.clamp_len)
    dense = attn.positional_rows(encodings.relative_positional_encoding(*args), tf.float32)
    factored = attn.positional_rows(encodings.positional_basis(*args), tf.float32)
    assert dense.shape == factored.shape
    np.testing.assert_allclose(factored.numpy(), dense.numpy(), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_accelerations_are_chosen_in_one_place_with_the_reason(caplog):
    """``accel.choose`` names what runs and why it may not, and a traced forward pass logs it once."""
    plain = accel.choose(XLNetConfig(**TINY, accelerate=False), tf.float32, False, False)
    assert (plain.ops, plain.kernel, plain.chunk) == (ops.PLAIN, None, 0) and "not selected" in plain.why
    bi_data = accel.choose(XLNetConfig(**TINY, bi_data=True), tf.float32, True, False)
    assert (bi_data.ops, bi_data.kernel, bi_data.chunk) == (fusions.FUSED, None, chunks.CHUNK)
    assert "no kernels: bi_data" in bi_data.why
    inference = accel.choose(XLNetConfig(**TINY, bi_data=True), tf.float32, False, False)
    assert (inference.ops, inference.chunk) == (ops.PLAIN, chunks.CHUNK) and inference.core is not None
    half = accel.choose(XLNetConfig(**TINY, attn_type="uni", accelerate="kernels"), tf.bfloat16, True, False)
    assert (half.ops, half.kernel, half.chunk) == (ops.PLAIN, None, 0) and "compute dtype bfloat16" in half.why
    per_example = accel.choose(XLNetConfig(**TINY), tf.float32, True, True)
    assert per_example.kernel is None and "per-example positional dropout" in per_example.why
    training = accel.choose(XLNetConfig(**TINY), tf.float32, True, False)
    assert training.ops is fusions.FUSED and "ops xla" in training.why  # the XLA clusters: training passes only
    m = XLNetModel(XLNetConfig(**TINY))
    forward = tf.function(lambda ids: m(ids)["sequence_output"])
    with caplog.at_level(logging.INFO, logger="xlnet_tf.accel"):
        caplog.clear()  # only this block's records (the root logger may already pass INFO: an in-process CLI run)
        for length in (5, 5, 7):  # two traces
            forward(tf.zeros([2, length], tf.int32))
    assert sum("xlnet_tf accelerations: ops plain" in r.getMessage() for r in caplog.records) == 2  # inference


def test_query_chunks_bounds():
    assert chunks.query_chunks(None, 128) is None and chunks.query_chunks(255, 128) is None
    assert chunks.query_chunks(512, 0) is None
    assert chunks.query_chunks(512, 128) == [(0, 128), (128, 256), (256, 384), (384, 512)]
    assert chunks.query_chunks(13, 3) == [(0, 3), (3, 6), (6, 9), (9, 13)]


@pytest.mark.slow
def test_query_chunks_same_outputs_and_gradients(monkeypatch):
    """Attention in query chunks (mems, padding, segments, two streams, bi_data) == attention in one piece."""
    rng = np.random.default_rng(5)
    b, q, mlen = 2, 13, 4
    ids = rng.integers(10, 60, (b, q)).astype(np.int32)
    seg = (np.arange(q)[None] >= 6).astype(np.int32).repeat(b, 0)
    mask = np.ones((b, q), np.int32)
    mask[1, :3] = 0
    perm = (rng.random((b, q, q)) < 0.3).astype(np.float32)
    tm = np.eye(q, dtype=np.float32)[None, 4:9].repeat(b, 0)
    mems = [rng.normal(0, 1, (b, mlen, TINY["d_model"])).astype(np.float32) for _ in range(TINY["n_layer"])]
    kw = dict(segment_ids=seg, padding_mask=mask, perm_mask=perm, target_mapping=tm, mems=mems)
    m = XLNetModel(XLNetConfig(**TINY, dropout=0.0, dropatt=0.0, bi_data=True, mem_len=mlen))
    results = []
    for chunk in (0, 3):
        monkeypatch.setattr(chunks, "CHUNK", chunk)
        with tf.GradientTape() as tape:
            out = m(ids, **kw, training=True)
            loss = tf.reduce_mean(tf.square(out["sequence_output"])) + tf.reduce_mean(tf.square(out["query_output"]))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, m.trainable_variables)
                 if g is not None]  # lm_bias only serves lm_logits
        results.append((out["sequence_output"].numpy(), out["query_output"].numpy(), grads))
    (h0, g0, d0), (h1, g1, d1) = results
    assert np.abs(h0 - h1).max() <= 1e-6 and np.abs(g0 - g1).max() <= 1e-6
    assert max(np.abs(a - c).max() for a, c in zip(d0, d1)) <= 1e-6


def test_variable_depths_cover_every_trainable_weight():
    m = XLNetModel(XLNetConfig(**TINY))
    depths = [m.variable_depth(v) for v in m.trainable_variables]
    assert min(depths) == 0 and max(depths) == TINY["n_layer"] + 1
    assert depths.count(0) == 2  # word embedding, mask_emb
    assert {m.variable_depth(v) for v in m.blocks[1].trainable_variables} == {2}


def test_bi_data_requires_even_batch():
    m = XLNetModel(XLNetConfig(**TINY, bi_data=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="even batch"):
        m(np.ones((3, 4), np.int32))


@pytest.mark.slow
@pytest.mark.parametrize("bi_data", [False, True])
@pytest.mark.parametrize("mode", ["per_example", "shared"])
def test_positional_encoding_dropout_per_example(monkeypatch, bi_data, mode):
    """As the original (encodings tiled over the batch, then dropped), each example gets its own dropout mask
    on the relative encodings; the kept entries are the encoding / keep (forward half / backward half with
    bi_data). ``pos_dropout="shared"`` draws one mask per encoding set."""
    seen = []
    call = block.XLNetBlock.call

    def record(self, h, g, mem, inputs):
        seen.append(inputs.pos_emb)
        return call(self, h, g, mem, inputs)

    monkeypatch.setattr(block.XLNetBlock, "call", record)
    rate, b, q = 0.5, 4, 5
    model = XLNetModel(XLNetConfig(**TINY, dropout=rate, dropatt=0.0, bi_data=bi_data, pos_dropout=mode))
    model(tf.zeros([b, q], tf.int32), training=True)
    pos = seen[0].numpy()
    pe = encodings.relative_positional_encoding(q, q, TINY["d_model"], "bi", bi_data, -1).numpy()  # [pb, r, d]
    groups = pe.shape[0]
    assert pos.shape == ((b,) if mode == "per_example" else (groups,)) + pe.shape[1:]
    expect = np.repeat(pe, pos.shape[0] // groups, axis=0) / (1 - rate)
    kept = pos != 0
    np.testing.assert_allclose(pos[kept], expect[kept], rtol=1e-6)
    assert 0.35 < kept.mean() < 0.65
    if mode == "per_example":  # rows sharing an encoding have different masks
        assert not np.array_equal(kept[0], kept[1])
    model(tf.zeros([b, q], tf.int32), training=False)
    assert not isinstance(seen[-1], tf.Tensor) or seen[-1].shape[0] == groups  # inference: no dropout, no tiling


def test_mask_emb_positions_read_mask_emb_on_the_content_stream():
    """The masked LM's input hook: a position flagged in ``mask_emb_positions`` gives exactly what a vocabulary
    row equal to ``mask_emb`` would give there, and unflagged positions read their own rows."""
    m = XLNetModel(XLNetConfig(**TINY, dropout=0.0, dropatt=0.0), seed=5)
    ids, seg, pad = _inputs()
    spare = TINY["n_token"] - 1
    ids = np.minimum(ids, spare - 1)  # the last row is free to become mask_emb
    flags = np.zeros(ids.shape, np.float32)
    flags[0, [1, 4]] = flags[1, 2] = 1.0
    out = m(ids, segment_ids=seg, padding_mask=pad, mask_emb_positions=flags)["sequence_output"]
    table = m.word_embedding.numpy()
    m.word_embedding.assign(np.concatenate([table[:spare], m.mask_emb.numpy().reshape(1, -1)]))
    ref = m(np.where(flags > 0, spare, ids), segment_ids=seg, padding_mask=pad)["sequence_output"]
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    plain = m(ids, segment_ids=seg, padding_mask=pad)["sequence_output"]
    assert np.abs(plain.numpy() - out.numpy()).max() > 1e-3


def test_a_wrong_input_is_one_line_naming_it():
    """The backbone's token inputs checked before Keras' call (no framework traceback, nothing read otherwise):
    text, float ids, ids not [batch, seq], a segment or padding mask of another shape (which would broadcast),
    and, called eagerly, an id outside the vocabulary."""
    model = XLNetModel(XLNetConfig(**TINY))
    ids = np.array([[5, 6, 7, 8]])
    assert model(ids)["sequence_output"].shape == (1, 4, 32)
    for kwargs, kind, part in (
            (dict(input_ids=["hello world"]), TypeError, "got text"),
            (dict(input_ids=np.array([[5.5, 6.0]])), TypeError, "integer token ids"),
            (dict(input_ids=np.array([5, 6, 7])), ValueError, "got shape [3]"),
            (dict(input_ids=ids, segment_ids=np.zeros((1, 3), np.int32)), ValueError, "segment_ids"),
            (dict(input_ids=ids, padding_mask=np.ones((2, 4), np.int32)), ValueError, "padding_mask"),
            (dict(input_ids=np.array([[3, 60]])), ValueError, "input_ids[0, 1]: 60 is not a token id")):
        with pytest.raises(kind) as e:
            model(**kwargs)
        assert part in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_every_weight_is_its_own_draw():
    """Each weight draws its own initial values (``ops.normal_init``), as the original's per-variable initializer:
    one shared Keras 3 initializer gave a layer's q, k, v, r and o, its three biases, and a summary's q, k, v, o
    the same values, and weights of other shapes the same stream."""
    from xlnet_tf.heads.summary import SequenceSummary

    model = XLNetModel(XLNetConfig(**TINY))
    model(np.array([[5, 6]]))
    w = {v.path: v.numpy().reshape(-1) for v in model.weights}
    for prefix in ("xlnet/layer_0/rel_attn/", "xlnet/layer_1/ff/layer_"):
        drawn = [v for k, v in w.items() if k.startswith(prefix) and (k.endswith("kernel") or "rel_attn" in k)
                 and not k.endswith(("gamma", "beta"))]
        heads = [tuple(v[:4]) for v in drawn]
        assert len(drawn) >= 2 and len(set(heads)) == len(heads), (prefix, heads)
    summary = SequenceSummary(32, summary_type="attn", n_head=2, d_head=16)
    summary(tf.zeros([1, 3, 32]))
    heads = [tuple(v.numpy().reshape(-1)[:4]) for v in summary.weights if v.path.endswith("_kernel")]
    assert len(heads) == 4 and len(set(heads)) == 4, heads
