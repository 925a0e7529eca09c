"""Pretraining: PretrainModel (tied LM head, memory in the model), the loop under strategies, run_pretrain.py.

Everything runs on the session's tiny synthetic corpus with its own tiny SentencePiece model
(``conftest.tiny_corpus``; no shared data needed); the run_pretrain.py CLI run is the session's
``conftest.pretrained``. MirroredStrategy over 2 logical CPUs needs its own process
(``python tests/test_pretrain.py mirrored WORKDIR``).

Tolerances (float32, CPU, no XLA): default vs MirroredStrategy agree to 1e-5 on losses and memory and 1e-4
on weights after 3 Adam steps (summation order only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

if __name__ == "__main__":  # logical CPUs must exist before TensorFlow initialises its devices
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import (PRETRAIN_MEM, PRETRAIN_PREDICT, PRETRAIN_REUSE, PRETRAIN_SEQ, tiny_pretrain_config,
                            write_corpus)
from tests.subprocess_util import finish

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SEQ, REUSE, MEM, PREDICT = PRETRAIN_SEQ, PRETRAIN_REUSE, PRETRAIN_MEM, PRETRAIN_PREDICT


# =========================================================================================== shared pieces
def make_workdir(d: str) -> dict:
    """``conftest.tiny_corpus`` in ``d`` (for the mirrored subprocess, which has no fixtures)."""
    from xlnet_tf import spm_train

    os.makedirs(d, exist_ok=True)
    corpus, held = os.path.join(d, "train.txt"), os.path.join(d, "held.txt")
    write_corpus(corpus, 60, seed=0)
    write_corpus(held, 20, seed=1)
    spm = spm_train.train_spm([corpus], os.path.join(d, "sp"), vocab_size=60, hard_vocab_limit=False, quiet=True)
    return {"dir": d, "corpus": corpus, "heldout": held, "spm": spm}


tiny_config = tiny_pretrain_config


def records(work: dict, num_streams: int, num_groups: int, bi_data: bool = True, name: str = "train"):
    from xlnet_tf.data import pretrain_records

    prefix = os.path.join(work["dir"], f"{name}-s{num_streams}-g{num_groups}-b{int(bi_data)}")
    return pretrain_records.create_pretrain_tfrecords([work["corpus"]], prefix, work["spm"], SEQ, REUSE, num_streams,
                                       bi_data=bi_data, num_groups=num_groups, progress=False)


def dataset_fn(files, per_replica, k=1, bi_data=True, seed=3):
    from xlnet_tf.data.pretrain_sampling import make_train_dataset_fn

    return make_train_dataset_fn(files, SEQ, REUSE, per_replica, k, num_predict=PREDICT, perm_size=4,
                                 bi_data=bi_data, seed=seed)


def train_config(**kw):
    from xlnet_tf.training import TrainConfig

    base = dict(learning_rate=3e-3, train_steps=3, progress=False, seed=5, jit_compile=False, warmup_steps=0)
    base.update(kw)
    return TrainConfig(**base)


# =========================================================================================== subprocess entry
def _mirrored_report(workdir: str) -> None:
    from xlnet_tf import distribute, training
    from xlnet_tf.pretrain_model import PretrainModel

    strategy = distribute.get_strategy("mirrored", num_cpu_devices=2)
    assert strategy.num_replicas_in_sync == 2
    work = make_workdir(workdir)
    rep = {}

    # Without bi_data the records do not depend on the grouping: rows [s0 s1 s2 s3] on one device are
    # replica 0's [s0 s1] and replica 1's [s2 s3]. k=2: each update spans two consecutive steps of the streams
    # (regroup_for_accumulation keeps replica r on its own streams; k=1 is the special case without it).
    config = tiny_config(bi_data=False)
    for name, k in (("k2", 2),):
        hist, models = [], []
        for strat, per_replica, groups in ((None, 4, 1), (strategy, 2, 2)):
            files = records(work, 4, groups, bi_data=False)
            # per-sequence means: the token-weighted loss is per replica (as the original's towers), so it
            # only equals the one-device loss when every replica has the same number of targets
            tr = training.Trainer(lambda: PretrainModel(config, per_replica, seed=1, token_weighted=False),
                                  dataset_fn(files, per_replica, k, bi_data=False), train_config(grad_accum_steps=k),
                                  strat)
            hist.append(tr.train().history)
            models.append(tr.model)
        ref, mir = models
        w_diff = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                     for a, b in zip(ref.trainable_variables, mir.trainable_variables))
        mem_diff = 0.0
        for rv, mv in zip(ref.mem_vars, mir.mem_vars):
            per_rep = [np.asarray(x.numpy()) for x in mv.value.values]
            mem_diff = max(mem_diff, max(float(np.max(np.abs(a - b)))
                                         for a, b in zip(per_rep, (rv.numpy()[:2], rv.numpy()[2:]))))
        rep[name] = {"loss": max(abs(a[1] - b[1]) for a, b in zip(*hist)), "weights": w_diff, "mem": mem_diff,
                     "mem_norm": float(np.abs(ref.mem_vars[1].numpy()).mean()), "losses": [l for _, l in hist[1]]}

    # bi_data: each replica's batch is [forward | backward] of its own group. One step's loss on 2 replicas is
    # the mean of the two group batches' token-weighted losses; replica r's memory holds its own batch's states.
    config = tiny_config(bi_data=True)
    files = records(work, 4, 2, bi_data=True)
    tr = training.Trainer(lambda: PretrainModel(config, 2, seed=1), dataset_fn(files, 2),
                          train_config(train_steps=1), strategy)
    loss = tr.train().history[0][1]
    keras.utils.set_random_seed(tr.config.seed)
    ref = PretrainModel(config, 2, seed=1)
    expect, mem_diff = [], 0.0
    for r, batch in enumerate(dataset_fn(files, 2)(tf.distribute.InputContext()).take(2)):
        ref.reset_memory()
        out = ref(batch, training=True)
        expect.append(ref.token_losses(batch, out).numpy().sum() / batch["target_mask"].numpy().sum())
        for rv, mv in zip(ref.mem_vars, tr.model.mem_vars):
            mem_diff = max(mem_diff, float(np.max(np.abs(mv.value.values[r].numpy() - rv.numpy()))))
    rep["bi"] = {"loss": abs(loss - float(np.mean(expect))), "mem": mem_diff}
    # a checkpoint holds replica 0's memory; restoring gives it to every replica
    saved = [np.asarray(v.value.values[0].numpy()) for v in tr.model.mem_vars]
    path = tf.train.Checkpoint(model=tr.model).save(os.path.join(workdir, "ckpt", "c"))
    tf.train.Checkpoint(model=tr.model).restore(path).assert_existing_objects_matched()
    rep["restore"] = max(float(np.max(np.abs(x.numpy() - s))) for v, s in zip(tr.model.mem_vars, saved)
                         for x in v.value.values)
    print("REPORT " + json.dumps(rep))


# =========================================================================================== pytest
@pytest.fixture(scope="module")
def work(tiny_corpus):
    return tiny_corpus


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """The MirroredStrategy comparison in a process of its own (logical CPUs exist only before TensorFlow
    initialises)."""
    mdir = str(tmp_path_factory.mktemp("mirrored"))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "mirrored", mdir],
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _expected_mems(model, features, prev):
    """Independent of the model's memory code: layer 0 caches the embeddings of the reuse part; layer 1 the
    content output of a one-layer copy of block 0 (same inputs, same memory)."""
    from xlnet_tf.modeling import XLNetModel

    c = model.config
    emb = tf.gather(model.backbone.word_embedding, features["input_ids"]).numpy()
    one = XLNetModel(c.replace(n_layer=1))
    one.word_embedding.assign(model.backbone.word_embedding)
    one.mask_emb.assign(model.backbone.mask_emb)
    for dst, src in zip(one.blocks[0].weights, model.backbone.blocks[0].weights):
        dst.assign(src)
    h1 = one(features["input_ids"], segment_ids=features["segment_ids"], mems=[prev[0]],
             perm_mask=features["perm_mask"], target_mapping=features["target_mapping"])["sequence_output"].numpy()
    return [np.concatenate([p, h[:, :REUSE]], axis=1)[:, -MEM:] for p, h in zip(prev, (emb, h1))]


@pytest.mark.slow
def test_memory_is_carried_as_cache_mem(work, tmp_path):
    from xlnet_tf.pretrain_model import PretrainModel

    files = records(work, 4, 1)
    batches = list(dataset_fn(files, 4)(tf.distribute.InputContext()).take(3))
    model = PretrainModel(tiny_config(), 4, seed=0)
    prev = [np.zeros((4, MEM, 16), np.float32) for _ in range(2)]
    for t, features in enumerate(batches):
        expect = _expected_mems(model, features, prev)
        out = model(features, training=True)
        assert out["logits"].shape == (4, PREDICT, 60) and "new_mems" not in out
        got = model.memory()
        for layer in range(2):
            np.testing.assert_allclose(got[layer], expect[layer], atol=1e-5, err_msg=f"step {t} layer {layer}")
        if t == 0:  # the first step keeps MEM - REUSE zero slots, then the reuse part's states
            assert not got[1][:, :MEM - REUSE].any() and got[1][:, MEM - REUSE:].any()
        prev = got
    # inference calls never touch the memory; they take and return explicit mems
    out = model(batches[0], training=False, mems=[tf.constant(p) for p in prev])
    assert len(out["new_mems"]) == 2 and all(np.array_equal(a, b) for a, b in zip(model.memory(), prev))
    # checkpoints carry the memory (exact resume on one device)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    restored = PretrainModel(tiny_config(), 4, seed=0)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    assert all(np.array_equal(a, b) for a, b in zip(restored.memory(), prev))
    # the same stateful step compiled with XLA (the loop's default on one device)
    expect = _expected_mems(model, batches[0], prev)
    step = tf.function(lambda f: model.per_example_loss(f, model(f, training=True)), jit_compile=True)
    assert step(batches[0]).shape == (4,)
    for got, want in zip(model.memory(), expect):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.slow
def test_loop_loss_memory_and_learning(work):
    """One loop step: its loss is the original's token-weighted Σ CE·mask / Σ mask of the batch and it fills
    the memory; then the loss falls over 40 steps and the held-out PLM loss improves."""
    from xlnet_tf.data import pretrain_records, pretrain_sampling
    from xlnet_tf import XLNetTokenizer, training
    from xlnet_tf.pretrain_model import PretrainModel, evaluate_plm, unigram_log_probs

    files = records(work, 4, 1)
    ds_fn = dataset_fn(files, 4)
    first = next(iter(ds_fn(tf.distribute.InputContext())))
    config = tiny_config(d_model=32, d_head=16, d_inner=64)
    tr = training.Trainer(lambda: PretrainModel(config, 4, seed=2), ds_fn,
                          train_config(train_steps=40, learning_rate=1e-2, warmup_steps=4))
    keras.utils.set_random_seed(tr.config.seed)  # the Trainer's initial weights
    ref = PretrainModel(config, 4, seed=2)
    held = records(dict(work, corpus=work["heldout"]), 2, 1, name="held")
    corpus = pretrain_records.encode_corpus([work["corpus"]], XLNetTokenizer(work["spm"]), progress=False)
    uni = unigram_log_probs(corpus.ids, 60)

    def heldout():
        ds = pretrain_sampling.make_pretrain_dataset(held, SEQ, REUSE, 2, num_predict=PREDICT, perm_size=4,
                                                     bi_data=True, seed=9, repeat=False)
        return evaluate_plm(tr.model, ds, steps=6, unigram_log_probs=uni)

    start = heldout()
    history = tr.train(stop_at=1).history
    out = ref(first, training=True)
    losses = ref.token_losses(first, out).numpy()
    expect = losses.sum() / first["target_mask"].numpy().sum()
    assert abs(history[0][1] - expect) < 1e-5, (history, expect)
    for a, b in zip(tr.model.memory(), ref.memory()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.abs(tr.model.memory()[1]).mean() > 0
    # per_example_loss: token-weighted shares average to the batch's token mean; the per-sequence variant
    np.testing.assert_allclose(ref.per_example_loss(first, out).numpy().mean(), expect, rtol=1e-6)
    mask = first["target_mask"].numpy()
    np.testing.assert_allclose(ref.sequence_loss(first, out).numpy(), losses.sum(-1) / mask.sum(-1), rtol=1e-6)
    assert {ref.variable_depth(v) for v in ref.trainable_variables} == {0, 1, 2, 3}
    assert ref.variable_depth(ref.backbone.lm_bias) == 3

    losses = [history[0][1]] + [l for _, l in tr.train().history]
    end = heldout()
    assert len(losses) == 40 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    assert start["tokens"] == end["tokens"] > 0 and start["unigram_loss"] == end["unigram_loss"]
    assert end["loss"] < start["loss"] - 0.5, (start, end)
    assert start["loss"] == pytest.approx(np.log(60), abs=0.3)  # untrained: about uniform


def test_regroup_for_accumulation():
    from xlnet_tf.data.pretrain_sampling import regroup_for_accumulation

    ds = tf.data.Dataset.range(12).map(lambda i: {"x": tf.fill([2], i)})  # batch i = (step i // 2, group i % 2)
    got = [int(b["x"][0]) for b in regroup_for_accumulation(ds, 2, 3)]
    assert got == [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]
    assert [int(b["x"][0]) for b in regroup_for_accumulation(ds, 1, 3)] == list(range(12))


def test_save_backbone_has_finetuning_config(work, tmp_path):
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.pretrain_model import PretrainModel

    model = PretrainModel(tiny_config(), 4)
    model.save_backbone(str(tmp_path / "bb"))
    saved = XLNetConfig.load(str(tmp_path / "bb"))
    assert (saved.mem_len, saved.reuse_len, saved.bi_data) == (0, 0, False)
    assert saved.to_original_dict() == model.config.to_original_dict()
    assert model.config.mem_len == MEM  # the model's own config is untouched


@pytest.mark.slow
def test_mirrored_strategy_matches_default(mirrored):
    out, err = finish(mirrored, 600)
    lines = [l for l in out.splitlines() if l.startswith("REPORT ")]
    assert lines, err[-3000:]
    rep = json.loads(lines[-1][len("REPORT "):])
    for name in ("k2",):
        r = rep[name]
        assert r["loss"] < 1e-5 and r["mem"] < 1e-5 and r["weights"] < 1e-4, (name, r)
        assert r["mem_norm"] > 0
    assert rep["bi"]["loss"] < 1e-5 and rep["bi"]["mem"] < 1e-5, rep["bi"]
    assert rep["restore"] == 0.0


@pytest.mark.slow
def test_cli_smoke_and_backbone_loads_into_task_model(pretrained):
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.config import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    summary = pretrained["summary"]
    assert summary["step"] == 6 and summary["heldout_loss_end"] > 0 and summary["unigram_loss"] > 0
    with open(os.path.join(pretrained["train"], "pretrain_results.json")) as f:
        res = json.load(f)
    assert [h["step"] for h in res["heldout"]] == [0, 2, 4, 6] and len(res["train_history"]) == 6
    assert "held-out step 6" in pretrained["log"]
    # the final and best losses (training: over the log window of 2 steps; held-out: its evaluations), the curve
    assert summary["train_loss_final"] == res["train_loss_final"] and res["train_loss_window"] == 2
    assert res["train_loss_best"] <= res["train_loss_final"] and res["train_loss_best_step"] in range(2, 7)
    assert res["heldout_loss_best"] == min(h["loss"] for h in res["heldout"]) and res["health"]["healthy"]
    assert os.path.getsize(os.path.join(pretrained["train"], "training_curve.png")) > 10_000
    bb = pretrained["dir"]
    assert os.path.isfile(os.path.join(bb, "spiece.model"))
    config = XLNetConfig.load(bb)
    model = TaskModel(config, ClassificationHead(config.d_model, 2, n_head=config.n_head, d_head=config.d_head))
    model.build_with({"input_ids": np.zeros((1, 8), np.int32), "segment_ids": np.zeros((1, 8), np.int32),
                      "padding_mask": np.ones((1, 8), np.int32)})
    model.load_init_checkpoint(bb)
    ckpt = tf.train.load_checkpoint(os.path.join(bb, "xlnet_model.ckpt"))
    names = [n for n in ckpt.get_variable_to_shape_map() if n.endswith("word_embedding/lookup_table")]
    np.testing.assert_array_equal(model.backbone.word_embedding.numpy(), ckpt.get_tensor(names[0]))
    assert ckpt.get_tensor("model/lm_loss/bias").any()  # the trained LM bias is saved too


@pytest.mark.slow
def test_finetuning_with_the_other_casing_is_refused(pretrained):
    """The pretrained directory records the tokenizer's casing; fine-tuning it with the other casing would turn
    capitals into <unk> silently, so run_common refuses it before any work (and accepts the same casing)."""
    import types

    import run_common

    bb = pretrained["dir"]
    assert os.path.isfile(os.path.join(bb, "pretrain_results.json"))  # written by the CLI run (not uncased)
    run_common._check_case(types.SimpleNamespace(init_checkpoint=bb, uncased=False))
    run_common._check_case(types.SimpleNamespace(init_checkpoint=os.path.join(bb, "xlnet_model.ckpt"), uncased=False))
    with pytest.raises(ValueError, match="pretrained with uncased=false .*drop --uncased"):
        run_common._check_case(types.SimpleNamespace(init_checkpoint=bb, uncased=True))



@pytest.mark.slow
def test_pretrained_backbone_round_trips_into_the_finetuning_run(work, tmp_path):
    """Pretrain a few steps, save, and build the fine-tuning run's model the way run_classifier.py does
    (config from the checkpoint with the run's dropout, FineTuner.build_model inside the training loop): every
    backbone variable equals the pretrained model's exactly (mask_emb and the LM bias too, loaded but unused by
    a classifier); the only variables not loaded are the new head's."""
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification import features as cls_data
    from xlnet_tf import checkpoint, finetune, training
    from xlnet_tf.pretrain_model import PretrainModel

    files = records(work, 4, 1)
    tr = training.Trainer(lambda: PretrainModel(tiny_config(), 4, seed=2), dataset_fn(files, 4),
                          train_config(train_steps=2))
    tr.train()
    bb = str(tmp_path / "pretrained")
    tr.model.save_backbone(bb)
    pretrained = {n: checkpoint._value(t) for n, t in checkpoint.backbone_name_map(tr.model.backbone).items()}
    assert np.abs(pretrained["model/lm_loss/bias"]).max() > 0  # trained, not the zero init

    config = checkpoint.resolve_config(bb, checkpoint.detect_format(bb), None, {"dropout": 0.1, "dropatt": 0.1})
    assert (config.dropout, config.mem_len, config.bi_data) == (0.1, 0, False)
    spec = cls_data.feature_spec(16, False)
    ft = finetune.FineTuner(config, lambda: ClassificationHead(config.d_model, 2, n_head=config.n_head,
                                                               d_head=config.d_head, dropout=0.1),
                            spec, init_checkpoint=bb, seed=11)
    one = {k: v[0] for k, v in finetune.dummy_features(spec).items()}
    fine = training.Trainer(ft.build_model, lambda ctx: tf.data.Dataset.from_tensors(one).repeat().batch(2),
                            train_config(train_steps=1, seed=11))
    loaded = {n: checkpoint._value(t) for n, t in checkpoint.backbone_name_map(fine.model.backbone).items()}
    assert loaded.keys() == pretrained.keys()
    for name, value in pretrained.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    backbone_ids = {id(v) for v in fine.model.backbone.weights}
    new = [v.path for v in fine.model.weights if id(v) not in backbone_ids]
    assert new and all(p.startswith(fine.model.head.name) or "head" in p for p in new), new
    assert {id(v) for v in fine.model.head.weights} == {id(v) for v in fine.model.weights} - backbone_ids


@pytest.mark.slow
def test_mlm_objective_learns_on_real_text(tmp_path):
    """--objective=mlm's model on WikiText records: the loop's loss is Σ CE·mask / Σ mask over the selected
    pieces, read from the content stream (no query stream), and the held-out masked-LM loss falls."""
    from tests.conftest import shared_path
    from xlnet_tf.data import pretrain_records, pretrain_sampling
    from xlnet_tf import XLNetTokenizer, training
    from xlnet_tf.pretrain_model import PretrainModel, evaluate_plm

    wiki, spiece = shared_path("text", "wikitext2-valid.tokens"), shared_path("spiece", "spiece.model")
    with open(wiki, encoding="utf-8") as f:
        text = f.read(40000)
    (tmp_path / "train.txt").write_text(text[:32000], encoding="utf-8")
    (tmp_path / "held.txt").write_text(text[32000:], encoding="utf-8")
    tok = XLNetTokenizer(spiece)
    seq, reuse = 32, 16
    files = {name: pretrain_records.create_pretrain_tfrecords([str(tmp_path / f"{name}.txt")], str(tmp_path / name),
                                                              tok, seq, reuse, 4, bi_data=True, progress=False)
             for name in ("train", "held")}
    sampler = dict(objective="mlm", vocab_size=tok.vocab_size, mask_id=tok.mask_id, bi_data=True)
    config = tiny_config(d_model=32, d_head=16, d_inner=64, n_token=tok.vocab_size, mem_len=16, reuse_len=reuse)
    tr = training.Trainer(lambda: PretrainModel(config, 4, seed=2, objective="mlm"),
                          pretrain_sampling.make_train_dataset_fn(files["train"], seq, reuse, 4, seed=1, **sampler),
                          train_config(train_steps=25, learning_rate=1e-2, warmup_steps=3))
    keras.utils.set_random_seed(tr.config.seed)
    ref = PretrainModel(config, 4, seed=2, objective="mlm")
    first = next(iter(pretrain_sampling.make_pretrain_dataset(files["train"], seq, reuse, 4, seed=1, repeat=False,
                                                              **sampler)))

    def heldout():
        ds = pretrain_sampling.make_pretrain_dataset(files["held"], seq, reuse, 4, seed=9, repeat=False, **sampler)
        return evaluate_plm(tr.model, ds, steps=6)

    start = heldout()
    history = tr.train(stop_at=1).history
    out = ref(first, training=True)
    assert out["logits"].shape == (4, pretrain_sampling.mlm_num_predict(seq), tok.vocab_size)
    expect = ref.token_losses(first, out).numpy().sum() / first["target_mask"].numpy().sum()
    assert abs(history[0][1] - expect) < 1e-5, (history, expect)
    losses = [history[0][1]] + [l for _, l in tr.train().history]
    end = heldout()
    assert start["loss"] == pytest.approx(np.log(tok.vocab_size), abs=0.5)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses
    assert end["tokens"] == start["tokens"] > 0 and end["loss"] < start["loss"] - 0.5, (start, end)


if __name__ == "__main__":
    {"mirrored": _mirrored_report}[sys.argv[1]](*sys.argv[2:])
