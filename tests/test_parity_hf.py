"""Numerical parity with HuggingFace transformers' PyTorch XLNet (the reference implementation).

The test writes random weights (std 0.25, so attention is far from uniform) as an ORIGINAL-format TF1
checkpoint with the released variable names, loads it into our model with ``from_pretrained`` and into
HF's PyTorch model with HF's own converter ``load_tf_weights_in_xlnet``, and compares outputs in float32.
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.xlnet import modeling_xlnet as hf_xlnet  # noqa: E402

from tests.conftest import REPO  # noqa: E402
from xlnet_tf import XLNetConfig, XLNetModel  # noqa: E402
from xlnet_tf.accel import chunks, kernels  # noqa: E402
from xlnet_tf.tf_checkpoint import CheckpointError, write_tf_checkpoint  # noqa: E402

TOL = 1e-5
L, D, NH, DH, DI, V = 3, 64, 4, 16, 128, 120  # d_head 16: the fused kernel's vector width divides it


def original_tensors(rng, n_layer=L, untie_r=True, std=0.25):
    """Random weights under the released checkpoint's names (written out independently of our name map)."""
    t = {
        "model/transformer/word_embedding/lookup_table": rng.normal(0, std, (V, D)),
        "model/transformer/mask_emb/mask_emb": rng.normal(0, std, (1, 1, D)),
        "model/lm_loss/bias": rng.normal(0, std, (V,)),
        "global_step": np.array(1000, np.int64),
    }
    bias_shape = (n_layer, NH, DH) if untie_r else (NH, DH)
    for b in ("r_w_bias", "r_r_bias", "r_s_bias"):
        t[f"model/transformer/{b}"] = rng.normal(0, std, bias_shape)
    t["model/transformer/seg_embed"] = rng.normal(0, std, (n_layer, 2, NH, DH))
    for i in range(n_layer):
        p = f"model/transformer/layer_{i}/"
        for w in "qkvro":
            t[f"{p}rel_attn/{w}/kernel"] = rng.normal(0, std, (D, NH, DH))
        for ln in ("rel_attn/LayerNorm", "ff/LayerNorm"):
            t[f"{p}{ln}/gamma"] = 1.0 + rng.normal(0, std, (D,))
            t[f"{p}{ln}/beta"] = rng.normal(0, std, (D,))
        t[f"{p}ff/layer_1/kernel"] = rng.normal(0, std, (D, DI))
        t[f"{p}ff/layer_1/bias"] = rng.normal(0, std, (DI,))
        t[f"{p}ff/layer_2/kernel"] = rng.normal(0, std, (DI, D))
        t[f"{p}ff/layer_2/bias"] = rng.normal(0, std, (D,))
    return {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in t.items()}


@pytest.fixture(scope="module")
def original_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("orig")
    write_tf_checkpoint(str(d / "xlnet_model.ckpt"), original_tensors(np.random.default_rng(0)))
    with open(d / "xlnet_config.json", "w") as f:
        json.dump({"n_layer": L, "d_model": D, "n_head": NH, "d_head": DH, "d_inner": DI,
                   "ff_activation": "gelu", "untie_r": True, "n_token": V}, f)
    return d


@pytest.fixture(params=[(0, False), (3, False), (0, True)], ids=["whole", "chunked", "fused"])
def attn_chunk(request, monkeypatch):
    """Each numerical test runs with attention in one piece, in query chunks of ~3 rows (``query_chunks``:
    sequences of 6+ rows are split, e.g. 10 rows -> 3 + 3 + 4), and through the compiled kernel
    (``accelerate`` with ``kernels``; inference without the query stream), which must all give the same numbers."""
    chunk, fused = request.param
    if fused and kernels.load() is None:
        pytest.skip(f"fused attention kernel: {kernels.status()}")
    monkeypatch.setattr(chunks, "CHUNK", chunk)
    if not fused:  # the graph's attention, as where the kernels are not built
        monkeypatch.setattr(kernels, "load", lambda: None)
    return chunk


def hf_model(ckpt_dir, **run):
    cfg = transformers.XLNetConfig(vocab_size=V, d_model=D, n_layer=L, n_head=NH, d_inner=DI,
                                   ff_activation="gelu_new", untie_r=True, dropout=0.0,
                                   layer_norm_eps=1e-12, **run)
    model = transformers.XLNetLMHeadModel(cfg)
    hf_xlnet.load_tf_weights_in_xlnet(model, cfg, str(ckpt_dir / "xlnet_model.ckpt"))
    return model.eval()


def ours(ckpt_dir, **run):
    return XLNetModel.from_pretrained(str(ckpt_dir), dropout=0.0, dropatt=0.0, **run)


def hf_run(model, ids, **kw):
    tkw = {}
    for k, v in kw.items():
        if v is None:
            continue
        if k == "mems":
            tkw[k] = [torch.from_numpy(np.ascontiguousarray(np.transpose(m, (1, 0, 2)))) for m in v]
        elif k in ("token_type_ids", "attention_mask"):
            tkw[k] = torch.from_numpy(np.asarray(v, np.int64))
        else:
            tkw[k] = torch.from_numpy(np.asarray(v, np.float32))
    with torch.no_grad():
        out = model.transformer(input_ids=torch.from_numpy(ids.astype(np.int64)), use_mems=True,
                                output_hidden_states=True, **tkw)
        logits = model.lm_loss(out.last_hidden_state)
    mems = [np.transpose(m.numpy(), (1, 0, 2)) for m in out.mems] if out.mems is not None else None
    return out, logits.numpy(), mems


def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def left_padded_batch(rng, b=3, q=10):
    ids = rng.integers(10, V, (b, q)).astype(np.int32)
    mask = np.ones((b, q), np.int32)
    seg = np.zeros((b, q), np.int32)
    for r in range(b):
        pad = r * 2  # rows padded on the LEFT by 0, 2, 4
        mask[r, :pad] = 0
        ids[r, :pad] = 5
        seg[r, :pad] = 4
        real = q - pad
        seg[r, pad + real // 2: q - 1] = 1  # A | B
        seg[r, q - 1] = 2  # CLS at the end
    return ids, seg, mask


@pytest.mark.slow
def test_padding_three_segments_and_lm_logits(original_ckpt, attn_chunk):
    rng = np.random.default_rng(1)
    ids, seg, mask = left_padded_batch(rng)
    ref_out, ref_logits, _ = hf_run(hf_model(original_ckpt), ids, token_type_ids=seg, attention_mask=mask)
    m = ours(original_ckpt)
    out = m(ids, segment_ids=seg, padding_mask=mask)
    h = out["sequence_output"].numpy()
    ref = ref_out.last_hidden_state.numpy()
    # attention must be far from uniform for the test to mean anything: outputs differ across positions
    assert np.std(h) > 0.3
    assert maxdiff(h, ref) <= TOL, maxdiff(h, ref)
    logits = m.lm_logits(out["sequence_output"]).numpy()
    # logits sum d_model products of O(1) terms: float32 rounding grows with their magnitude
    assert maxdiff(logits, ref_logits) <= TOL * max(1.0, np.abs(ref_logits).max() / 4)


def test_hidden_states_of_every_layer(original_ckpt, attn_chunk):
    """``output_hidden_states``: the embeddings and each block's output equal HF's hidden_states."""
    rng = np.random.default_rng(4)
    ids, seg, mask = left_padded_batch(rng)
    ref_out, _, _ = hf_run(hf_model(original_ckpt), ids, token_type_ids=seg, attention_mask=mask)
    out = ours(original_ckpt)(ids, segment_ids=seg, padding_mask=mask, output_hidden_states=True)
    assert len(out["hidden_states"]) == len(ref_out.hidden_states) == L + 1
    for i, (h, ref) in enumerate(zip(out["hidden_states"], ref_out.hidden_states)):
        assert maxdiff(h, ref.numpy()) <= TOL, (i, maxdiff(h, ref.numpy()))
    assert maxdiff(out["hidden_states"][-1], out["sequence_output"]) == 0


@pytest.mark.parametrize("run", [
    dict(mem_len=6),
    dict(mem_len=6, reuse_len=4),
    dict(mem_len=5, attn_type="uni", same_length=True),
    dict(mem_len=4, attn_type="uni"),
])
def test_mems_over_two_segments(original_ckpt, attn_chunk, run):
    rng = np.random.default_rng(2)
    ref_model, m = hf_model(original_ckpt, **run), ours(original_ckpt, **run)
    mems_ref = mems_ours = None
    for step in range(2):
        ids = rng.integers(10, V, (2, 7)).astype(np.int32)
        seg = (np.arange(7)[None] >= 4).astype(np.int32).repeat(2, 0)
        ref_out, _, mems_ref = hf_run(ref_model, ids, token_type_ids=seg, mems=mems_ref)
        out = m(ids, segment_ids=seg, mems=mems_ours)
        mems_ours = [x.numpy() for x in out["new_mems"]]
        assert maxdiff(out["sequence_output"], ref_out.last_hidden_state.numpy()) <= TOL
        assert len(mems_ours) == L and mems_ours[0].shape == mems_ref[0].shape
        assert max(maxdiff(a, b) for a, b in zip(mems_ours, mems_ref)) <= TOL


def perm_inputs(rng, b=2, q=8, num_predict=3):
    ids = rng.integers(10, V, (b, q)).astype(np.int32)
    perm = np.zeros((b, q, q), np.float32)
    tmap = np.zeros((b, num_predict, q), np.float32)
    for r in range(b):
        order = rng.permutation(q)
        rank = np.argsort(order)
        targets = order[-num_predict:]
        for i in range(q):
            for j in range(q):
                perm[r, i, j] = float(rank[i] <= rank[j] and j in targets)
        for k, t in enumerate(sorted(targets)):
            tmap[r, k, t] = 1.0
    tmap[1, -1] = 0.0  # an all-zero row (padding of num_predict) is allowed
    return ids, perm, tmap


@pytest.mark.parametrize("run", [dict(), dict(bi_data=True, clamp_len=3), dict(mem_len=4)])
def test_two_stream_perm_mask_target_mapping(original_ckpt, attn_chunk, run):
    rng = np.random.default_rng(3)
    ids, perm, tmap = perm_inputs(rng)
    seg = np.zeros_like(ids)
    seg[:, 5:] = 1
    ref_model, m = hf_model(original_ckpt, **run), ours(original_ckpt, **run)
    mems = None
    if run.get("mem_len"):
        warm = rng.integers(10, V, ids.shape).astype(np.int32)
        _, _, mems = hf_run(ref_model, warm)
        mems_ours = m(warm)["new_mems"]
        assert max(maxdiff(a, b) for a, b in zip(mems_ours, mems)) <= TOL
    ref_out, ref_logits, _ = hf_run(ref_model, ids, token_type_ids=seg, perm_mask=perm, target_mapping=tmap,
                                    mems=mems)
    out = m(ids, segment_ids=seg, perm_mask=perm, target_mapping=tmap, mems=mems)
    assert maxdiff(out["query_output"], ref_out.last_hidden_state.numpy()) <= TOL
    content_ref = ref_out.hidden_states[-2].numpy()  # HF interleaves (h, g) per layer: the last h
    assert maxdiff(out["sequence_output"], content_ref) <= TOL
    logits = m.lm_logits(out["query_output"]).numpy()
    # logits sum d_model products of O(1) terms: float32 rounding grows with their magnitude
    assert maxdiff(logits, ref_logits) <= TOL * max(1.0, np.abs(ref_logits).max() / 4)


@pytest.mark.parametrize("run", [dict(bi_data=True), dict(clamp_len=2), dict(attn_type="uni"),
                                 dict(attn_type="uni", same_length=True, mem_len=3)])
def test_positional_options(original_ckpt, attn_chunk, run):
    rng = np.random.default_rng(4)
    ids, seg, mask = left_padded_batch(rng, b=4, q=9)
    ref_model = hf_model(original_ckpt, **run)
    if run.get("attn_type") == "uni":
        # HF crashes on uni attention + attention_mask with batch > 1 (in-place `attn_mask += data_mask`
        # cannot broadcast): compare row by row there, our model still runs the whole batch at once.
        ref = np.concatenate([hf_run(ref_model, ids[r:r + 1], token_type_ids=seg[r:r + 1],
                                     attention_mask=mask[r:r + 1])[0].last_hidden_state.numpy()
                              for r in range(len(ids))])
    else:
        ref = hf_run(ref_model, ids, token_type_ids=seg, attention_mask=mask)[0].last_hidden_state.numpy()
    out = ours(original_ckpt, **run)(ids, segment_ids=seg, padding_mask=mask)
    assert maxdiff(out["sequence_output"], ref) <= TOL


def test_hf_formats_and_own_format_round_trip(original_ckpt, tmp_path):
    """HF safetensors and pytorch_model.bin load to the same model; our format round-trips exactly and is
    readable by HF's converter (it is an original-named TF checkpoint)."""
    rng = np.random.default_rng(5)
    ids, seg, mask = left_padded_batch(rng)
    ref = hf_model(original_ckpt)
    base = ours(original_ckpt)(ids, segment_ids=seg, padding_mask=mask)["sequence_output"].numpy()
    for safe in (True, False):
        d = tmp_path / f"hf_{safe}"
        ref.save_pretrained(str(d), safe_serialization=safe)
        assert os.path.isfile(d / ("model.safetensors" if safe else "pytorch_model.bin"))
        m = XLNetModel.from_pretrained(str(d), dropout=0.0, dropatt=0.0)
        np.testing.assert_array_equal(m(ids, segment_ids=seg, padding_mask=mask)["sequence_output"].numpy(), base)
    own = tmp_path / "own"
    m = ours(original_ckpt, mem_len=7)
    m.save_pretrained(str(own))
    m2 = XLNetModel.from_pretrained(str(own))
    assert m2.config.mem_len == 7 and m2.config.dropout == 0.0
    for a, b in zip(m.weights, m2.weights):
        if "dropout_seed" not in a.path:
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # HF's converter reads our format
    ref2 = hf_model(own)
    out2, _, _ = hf_run(ref2, ids, token_type_ids=seg, attention_mask=mask)
    assert maxdiff(out2.last_hidden_state.numpy(), base) <= TOL


def test_mismatched_checkpoint_errors(original_ckpt, tmp_path):
    with pytest.raises(CheckpointError, match=rf"layer_0/rel_attn/q/kernel: expected shape \[48, {NH}, {DH}\], "
                                              rf"found \[{D}, {NH}, {DH}\]"):
        XLNetModel.from_pretrained(str(original_ckpt), d_model=48)
    # a checkpoint lacking one weight names it
    t = original_tensors(np.random.default_rng(0))
    del t["model/transformer/layer_2/ff/layer_1/bias"]
    d = tmp_path / "partial"
    d.mkdir()
    write_tf_checkpoint(str(d / "xlnet_model.ckpt"), t)
    with pytest.raises(CheckpointError, match=r"layer_2/ff/layer_1/bias: missing"):
        XLNetModel.from_pretrained(str(d), config=XLNetConfig(n_layer=L, d_model=D, n_head=NH, d_head=DH,
                                                              d_inner=DI, n_token=V))
    with pytest.raises(CheckpointError, match=r"n_layer|layer_3"):
        XLNetModel.from_pretrained(str(original_ckpt), n_layer=4)


def test_untied_biases_load(tmp_path):
    d = tmp_path / "tied"
    d.mkdir()
    write_tf_checkpoint(str(d / "xlnet_model.ckpt"), original_tensors(np.random.default_rng(7), untie_r=False))
    cfg = XLNetConfig(n_layer=L, d_model=D, n_head=NH, d_head=DH, d_inner=DI, n_token=V, untie_r=False,
                      dropout=0.0, dropatt=0.0)
    m = XLNetModel.from_pretrained(str(d), config=cfg)
    hf_cfg = transformers.XLNetConfig(vocab_size=V, d_model=D, n_layer=L, n_head=NH, d_inner=DI,
                                      ff_activation="gelu_new", untie_r=False, dropout=0.0)
    # HF's modules always hold per-layer biases; emulate untie_r=False by copying the shared ones
    ref = transformers.XLNetLMHeadModel(hf_cfg).eval()
    t = original_tensors(np.random.default_rng(7), untie_r=False)
    tiled = dict(t)
    for b in ("r_w_bias", "r_r_bias", "r_s_bias"):
        tiled[f"model/transformer/{b}"] = np.stack([t[f"model/transformer/{b}"]] * L)
    d2 = tmp_path / "tiled"
    d2.mkdir()
    write_tf_checkpoint(str(d2 / "xlnet_model.ckpt"), tiled)
    hf_cfg.untie_r = True
    hf_xlnet.load_tf_weights_in_xlnet(ref, hf_cfg, str(d2 / "xlnet_model.ckpt"))
    ids = np.random.default_rng(8).integers(10, V, (2, 6)).astype(np.int32)
    out_ref, _, _ = hf_run(ref, ids)
    assert maxdiff(m(ids)["sequence_output"], out_ref.last_hidden_state.numpy()) <= TOL


@pytest.mark.slow
def test_convert_cli(original_ckpt, tmp_path):
    """``python -m xlnet_tf.convert``: its ``main`` in-process for the conversion, a process for the exit code of a
    refusal."""
    import subprocess
    import sys

    from xlnet_tf import convert

    out = tmp_path / "converted"
    assert convert.main([f"--input={original_ckpt}/xlnet_model.ckpt", f"--config={original_ckpt}/xlnet_config.json",
                         f"--output={out}"]) == 0
    a, b = ours(original_ckpt), XLNetModel.from_pretrained(str(out), dropout=0.0, dropatt=0.0)
    for x, y in zip(a.trainable_weights, b.trainable_weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    bad = subprocess.run([sys.executable, "-m", "xlnet_tf.convert", f"--input={tmp_path}/nothing",
                          f"--output={tmp_path}/x"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "nothing" in bad.stderr
