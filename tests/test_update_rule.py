"""Fine-tuning follows the original XLNet update rule (xlnet-facts §4), checked against an independent NumPy
implementation of that rule fed with float64 gradients from HuggingFace's PyTorch XLNet.

``run_classifier.py`` (flags -> config -> trainer; its ``main`` in-process) trains a tiny model for six steps from an original-format TF1
checkpoint that holds the fine-tuned head under its original names (dropout 0, batches of 8, warmup 2,
lr 1e-3, clip 1.0, layer decay 0.75, weight decay 0.01 and 0). Every step's update of every variable must be
within 1e-4 of the reference update's size. The reference reproduces the batches (the same seeded tf.data
pipeline), computes the gradients at the weights the step started from, keeps its own Adam moments, and applies
the original's rule: global-norm clip; gradients of ``model/transformer/layer_{i}/`` times
0.75 ** (n_layer - 1 - i) and nothing else; with weight decay the AdamWeightDecay optimizer (no bias correction,
decay on every name without LayerNorm / layer_norm / bias except r_*_bias), without it tf.train.Adam (bias
correction); variables without a gradient untouched. Adam epsilon is the default 1e-6: the per-element
gradients of this model are 1e-6..1e-4, so epsilon still shows a wrongly scaled gradient.

The reference's sensitivity is checked too: each defect the training loop once had, applied to the reference,
moves some variable's update by far more than the tolerance.
"""

import glob
import json
import os
import re

import numpy as np
import pytest

import run_classifier
from tests.cli_util import succeeds
from tests.conftest import shared_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_LAYER, D, NH, DH, DI, V = 3, 32, 2, 16, 64, 32000
SEQ, BATCH, STEPS, WARMUP, LR, CLIP, RATE, EPS, SEED = 24, 8, 6, 2, 1e-3, 1.0, 0.75, 1e-6, 5
TOL = 1e-4
TASK_SCOPE = "model/classification_sst-2/logit"
SUMMARY_SCOPE = "model/sequnece_summary/summary"
PREFIX = "model/transformer/"


# ------------------------------------------------------------------------------------------- the checkpoint
def original_tensors(rng):
    """Random weights under the original names, head included. Small magnitudes (LayerNorm scales ~0.2) keep
    the float32 rounding of the stored weights (half an ulp) well below 1e-4 of a ~1e-4 update."""
    w = lambda *shape: rng.normal(0, 0.05, shape)
    t = {PREFIX + "word_embedding/lookup_table": w(V, D), PREFIX + "mask_emb/mask_emb": w(1, 1, D),
         "model/lm_loss/bias": w(V), PREFIX + "seg_embed": w(N_LAYER, 2, NH, DH),
         SUMMARY_SCOPE + "/kernel": w(D, D), SUMMARY_SCOPE + "/bias": w(D),
         TASK_SCOPE + "/kernel": 8 * w(D, 2), TASK_SCOPE + "/bias": w(2)}
    for b in ("r_w_bias", "r_r_bias", "r_s_bias"):
        t[PREFIX + b] = w(N_LAYER, NH, DH)
    for i in range(N_LAYER):
        p = f"{PREFIX}layer_{i}/"
        for k in "qkvro":
            t[f"{p}rel_attn/{k}/kernel"] = 4 * w(D, NH, DH)
        for ln in ("rel_attn/LayerNorm", "ff/LayerNorm"):
            t[f"{p}{ln}/gamma"] = 0.2 + w(D)
            t[f"{p}{ln}/beta"] = w(D)
        t[f"{p}ff/layer_1/kernel"] = 4 * w(D, DI)
        t[f"{p}ff/layer_1/bias"] = w(DI)
        t[f"{p}ff/layer_2/kernel"] = 4 * w(DI, D)
        t[f"{p}ff/layer_2/bias"] = w(D)
    return {k: v.astype(np.float32) for k, v in t.items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from xlnet_tf.tf_checkpoint import write_tf_checkpoint

    d = tmp_path_factory.mktemp("update_rule")
    init = original_tensors(np.random.default_rng(0))
    (d / "init").mkdir()
    write_tf_checkpoint(str(d / "init" / "xlnet_model.ckpt"), init)
    (d / "init" / "xlnet_config.json").write_text(json.dumps(
        {"n_layer": N_LAYER, "d_model": D, "n_head": NH, "d_head": DH, "d_inner": DI, "ff_activation": "gelu",
         "untie_r": True, "n_token": V}))
    lines = open(shared_path("glue", "SST-2", "train.tsv"), encoding="utf-8").read().splitlines()
    (d / "data").mkdir()
    (d / "data" / "train.tsv").write_text("\n".join(lines[:1 + BATCH]) + "\n", encoding="utf-8")
    return d, init


def train_cli(d, weight_decay):
    out = d / f"out_wd{weight_decay}"
    args = ["--task=SST-2", f"--data_dir={d / 'data'}", f"--init_checkpoint={d / 'init'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            f"--max_seq_length={SEQ}", f"--train_batch_size={BATCH}", f"--train_steps={STEPS}",
            f"--warmup_steps={WARMUP}", f"--learning_rate={LR}", f"--clip={CLIP}",
            f"--lr_layer_decay_rate={RATE}", f"--weight_decay={weight_decay}", f"--adam_epsilon={EPS}",
            "--dropout=0", "--dropatt=0", "--save_steps=1", f"--keep_checkpoint_max={STEPS + 1}",
            f"--seed={SEED}", "--do_train", "--progress=false"]
    r = succeeds(run_classifier, *args)
    assert "and 4 head variables" in r.stderr, "the head was not loaded from the original names"
    return out


def our_trajectory(out):
    """[W_1 .. W_STEPS]: each training checkpoint read back under the original names."""
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf import XLNetConfig, checkpoint
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig(n_layer=N_LAYER, d_model=D, n_head=NH, d_head=DH, d_inner=DI, n_token=V, dropout=0.0,
                      dropatt=0.0)
    model = TaskModel(cfg, ClassificationHead(D, 2, task_name="SST-2", dropout=0.0))
    model.build_with({"input_ids": np.zeros((1, SEQ), np.int32), "segment_ids": np.zeros((1, SEQ), np.int32),
                      "padding_mask": np.ones((1, SEQ), np.int32), "label": np.zeros((1,), np.int32)})
    traj = []
    for step in range(1, STEPS + 1):
        path = os.path.join(out, "model", f"ckpt-{step}")
        tf.train.Checkpoint(model=model).restore(path).expect_partial()
        w = dict(checkpoint.backbone_tensors(model.backbone))
        w.update({name: v.numpy() for name, v in model.head_name_map().items()})
        traj.append({k: np.asarray(v, np.float64) for k, v in w.items()})
    return traj


def training_batches(out):
    """The batches the run consumed: the same seeded pipeline over its cached TFRecords."""
    import keras
    import tensorflow as tf

    from xlnet_tf.data import lengths
    from xlnet_tf.tasks.classification import features as cls_data
    from xlnet_tf import XLNetConfig

    (path,) = glob.glob(os.path.join(out, "data", "*train*.tfrecord"))
    keras.utils.set_random_seed(SEED)  # as the Trainer: the shuffle's seed pairs with the global seed
    # --length_buckets and --length_multiple=0 (the defaults): batches of one length group, the rounding of this
    # machine and model
    config = XLNetConfig(n_layer=N_LAYER, d_model=D, n_head=NH, d_head=DH, d_inner=DI, n_token=V)
    ds = cls_data.make_dataset(path, BATCH, is_training=True, seed=SEED, input_context=tf.distribute.InputContext(),
                               dynamic="left", length_multiple=lengths.default_multiple(config))
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(STEPS)]


# ------------------------------------------------------------------------------------------- the reference
class Reference:
    """float64 loss gradients under the original names: HF's XLNetModel + the original summary/logit head."""

    def __init__(self):
        torch.set_default_dtype(torch.float64)
        try:
            cfg = transformers.XLNetConfig(vocab_size=V, d_model=D, n_layer=N_LAYER, n_head=NH, d_inner=DI,
                                           ff_activation="gelu_new", untie_r=True, dropout=0.0,
                                           layer_norm_eps=1e-12)
            self.hf = transformers.XLNetModel(cfg).double().eval()
        finally:
            torch.set_default_dtype(torch.float32)
        self.head = {n: torch.zeros(1, dtype=torch.float64) for n in
                     (SUMMARY_SCOPE + "/kernel", SUMMARY_SCOPE + "/bias", TASK_SCOPE + "/kernel",
                      TASK_SCOPE + "/bias")}

    def _targets(self):
        """original name -> (torch tensor or per-layer list, transpose?)."""
        layers = self.hf.layer
        m = {PREFIX + "word_embedding/lookup_table": (self.hf.word_embedding.weight, False),
             PREFIX + "mask_emb/mask_emb": (self.hf.mask_emb, False),
             PREFIX + "seg_embed": ([l.rel_attn.seg_embed for l in layers], False)}
        for b in ("r_w_bias", "r_r_bias", "r_s_bias"):
            m[PREFIX + b] = ([getattr(l.rel_attn, b) for l in layers], False)
        for i, l in enumerate(layers):
            p = f"{PREFIX}layer_{i}/"
            for w in "qkvro":
                m[f"{p}rel_attn/{w}/kernel"] = (getattr(l.rel_attn, w), False)
            for ln, mod in (("rel_attn/LayerNorm", l.rel_attn.layer_norm), ("ff/LayerNorm", l.ff.layer_norm)):
                m[f"{p}{ln}/gamma"], m[f"{p}{ln}/beta"] = (mod.weight, False), (mod.bias, False)
            for k, mod in (("layer_1", l.ff.layer_1), ("layer_2", l.ff.layer_2)):
                m[f"{p}ff/{k}/kernel"], m[f"{p}ff/{k}/bias"] = (mod.weight, True), (mod.bias, False)
        return m

    def gradients(self, weights, batch):
        """{original name: float64 gradient} for every variable the loss depends on (mask_emb: none)."""
        targets = self._targets()
        with torch.no_grad():
            for name, (t, transpose) in targets.items():
                value = weights[name]
                for j, tt in enumerate(t if isinstance(t, list) else [t]):
                    v = value[j] if isinstance(t, list) else value
                    tt.copy_(torch.from_numpy(np.ascontiguousarray(v.T if transpose else v)))
        head = {n: torch.tensor(weights[n], requires_grad=True) for n in self.head}
        self.hf.zero_grad(set_to_none=True)
        out = self.hf(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
                      token_type_ids=torch.from_numpy(batch["segment_ids"].astype(np.int64)),
                      attention_mask=torch.from_numpy(batch["padding_mask"].astype(np.float64))).last_hidden_state
        summary = torch.tanh(out[:, -1] @ head[SUMMARY_SCOPE + "/kernel"] + head[SUMMARY_SCOPE + "/bias"])
        logits = summary @ head[TASK_SCOPE + "/kernel"] + head[TASK_SCOPE + "/bias"]
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(batch["label"].astype(np.int64)))
        loss.backward()
        grads = {n: t.grad.numpy().copy() for n, t in head.items()}
        for name, (t, transpose) in targets.items():
            parts = t if isinstance(t, list) else [t]
            if any(p.grad is None for p in parts):
                continue
            g = [p.grad.numpy().T if transpose else p.grad.numpy() for p in parts]
            grads[name] = np.stack(g) if isinstance(t, list) else g[0].copy()
        return grads


def original_update(weights, grads, state, step, weight_decay, defect=None):
    """One update of the original ``model_utils.get_train_op`` in NumPy; returns {name: delta}.
    ``defect`` applies one of the training loop's past mistakes (for the sensitivity check)."""
    lr = LR * step / WARMUP if step < WARMUP else LR * (1.0 - (step - WARMUP) / (STEPS - WARMUP))
    names = sorted(grads) + (sorted(n for n in weights if n not in grads) if defect == "decay_no_grad" else [])
    g = {n: grads.get(n, np.zeros_like(weights[n])) for n in names}
    norm = np.sqrt(sum(float(np.sum(x * x)) for x in g.values()))
    g = {n: x * (CLIP / max(norm, CLIP)) for n, x in g.items()}
    for n in names:
        m = re.search(r"model/transformer/layer_(\d+)/", n)
        if m:
            g[n] = g[n] * RATE ** (N_LAYER - 1 - int(m.group(1)))
        elif defect == "grad_scales_stacked" and n.endswith(("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")):
            g[n] = g[n] * (RATE ** (N_LAYER - 1 - np.arange(N_LAYER))).reshape((-1,) + (1,) * (g[n].ndim - 1))
    bias_correction = weight_decay == 0
    if defect == "bias_correction":
        bias_correction = not bias_correction
    t = step + 1
    deltas = {}
    for n in names:
        m, v = state.setdefault(n, (np.zeros_like(g[n]), np.zeros_like(g[n])))
        m = 0.9 * m + 0.1 * g[n]
        v = 0.999 * v + 0.001 * g[n] * g[n]
        state[n] = (m, v)
        step_lr = lr
        if defect == "per_layer_lr":
            depth = re.search(r"model/transformer/layer_(\d+)/", n)
            if depth:
                step_lr *= RATE ** (N_LAYER - 1 - int(depth.group(1)))
            elif "word_embedding" in n:
                step_lr *= RATE ** N_LAYER
        if bias_correction:
            update = m / (np.sqrt(v) + EPS) * (np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t))
        else:
            update = m / (np.sqrt(v) + EPS)
        if weight_decay and original_decays(n, defect):
            update = update + weight_decay * weights[n]
        deltas[n] = -step_lr * update
    return deltas


def original_decays(name, defect=None):
    if any(re.search(r, name) for r in ("r_s_bias", "r_r_bias", "r_w_bias")):
        return True
    if defect == "decay_layer_norm" and ("LayerNorm" in name):
        return True
    return not any(re.search(r, name) for r in ("LayerNorm", "layer_norm", "bias"))


def reference_run(init, batches, weight_decay, defect=None, ours=None):
    """The reference's update at each step. With ``ours`` (our weights after each step) it starts every step
    from OUR weights and stores its result in float32 as the trainer does, so that the two updates are compared
    at the same point without the float32 rounding of the weights (half an ulp of a 0.3 weight is 1e-5 of a
    1e-3 update) counting as an update error; its Adam moments are its own."""
    ref = Reference()
    weights = {k: v.astype(np.float64) for k, v in init.items()}
    state, deltas = {}, []
    for step, batch in enumerate(batches):
        delta = original_update(weights, ref.gradients(weights, batch), state, step, weight_decay, defect)
        if ours is None:
            deltas.append(delta)
            weights = {n: w + delta.get(n, 0.0) for n, w in weights.items()}
        else:
            deltas.append({n: (weights[n] + d).astype(np.float32).astype(np.float64) - weights[n]
                           for n, d in delta.items()})
            weights = ours[step]
    return deltas


def relative_errors(ours, ref):
    """{name: max over steps of ||ours - ref|| / ||ref||} (absolute ||ours|| where the reference is 0)."""
    out = {}
    for name in ref[0]:
        errs = []
        for o, r in zip(ours, ref):
            ref_d = r.get(name, 0.0) + np.zeros_like(o[name])
            diff = np.linalg.norm(o[name] - ref_d)
            scale = np.linalg.norm(ref_d)
            errs.append(diff / scale if scale > 0 else diff)
        out[name] = max(errs)
    return out


def group(name):
    if "word_embedding" in name or "mask_emb" in name:
        return "embedding"
    m = re.search(r"layer_(\d+)/", name)
    if m:
        return f"layer_{m.group(1)}"
    if name.endswith("seg_embed"):
        return "seg_embed"
    if re.search(r"r_[wrs]_bias$", name):
        return "attention biases"
    return "head"


# ------------------------------------------------------------------------------------------- tests
@pytest.mark.slow
@pytest.mark.parametrize("weight_decay", [0.01, 0.0])
def test_six_steps_follow_the_original_update_rule(setup, weight_decay):
    d, init = setup
    out = train_cli(d, weight_decay)
    traj = our_trajectory(out)
    batches = training_batches(out)
    assert len({b["input_ids"].tobytes() for b in batches}) > 1 or BATCH == 1
    ref = reference_run(init, batches, weight_decay, ours=traj)
    ours = []
    prev = {k: v.astype(np.float64) for k, v in init.items()}
    for w in traj:
        ours.append({n: w[n] - prev[n] for n in prev})
        prev = w
    # step 0 runs at learning rate 0 (warmup): nothing moves, so the first checkpoint IS the loaded checkpoint
    assert all(np.array_equal(traj[0][n], init[n].astype(np.float64)) for n in init)
    errors = relative_errors(ours[1:], ref[1:])
    by_group = {}
    for name, e in errors.items():
        by_group[group(name)] = max(by_group.get(group(name), 0.0), e)
    print(f"\nweight_decay={weight_decay}: max relative update error per group:",
          json.dumps({k: float(f"{v:.2e}") for k, v in sorted(by_group.items())}))
    bad = {n: e for n, e in errors.items() if e > TOL}
    assert not bad, bad
    # variables without a gradient do not move at all (mask_emb, the LM bias)
    for name in (PREFIX + "mask_emb/mask_emb", "model/lm_loss/bias"):
        assert np.array_equal(traj[-1][name], init[name].astype(np.float64)), name


@pytest.mark.parametrize("defect,weight_decay", [
    ("per_layer_lr", 0.01), ("grad_scales_stacked", 0.0), ("decay_layer_norm", 0.01), ("decay_no_grad", 0.01),
    ("bias_correction", 0.01), ("bias_correction", 0.0)])
@pytest.mark.slow
def test_each_past_defect_moves_updates_far_beyond_the_tolerance(setup, defect, weight_decay):
    """The comparison above can fail: every defect the loop once had changes some variable's updates by more
    than 5x the tolerance on the same batches, or moves a variable without a gradient."""
    d, init = setup
    rng = np.random.default_rng(3)
    batches = [{"input_ids": rng.integers(5, 1000, (BATCH, SEQ)).astype(np.int32),
                "segment_ids": np.where(np.arange(SEQ) < SEQ - 1, 0, 2).astype(np.int32)[None].repeat(BATCH, 0),
                "padding_mask": np.ones((BATCH, SEQ), np.int32),
                "label": rng.integers(0, 2, BATCH).astype(np.int32)} for _ in range(3)]
    good = reference_run(init, batches, weight_decay)
    bad = reference_run(init, batches, weight_decay, defect)
    # a variable the original never moves (no gradient) moves: the exact-equality check above fails
    moved = sorted({n for b in bad[1:] for n, x in b.items() if n not in good[0] and np.any(x)})
    worst = max(relative_errors(bad[1:], good[1:]).values())
    assert moved or worst > 5 * TOL, (defect, worst)


# ------------------------------------------------------------------------------------------- head losses
def _finite_difference(f, arrays, h=1e-6):
    """Central differences of the scalar f(arrays) w.r.t. every element of every array (float64)."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for i in range(a.size):
            keep = a.flat[i]
            a.flat[i] = keep + h
            up = f(arrays)
            a.flat[i] = keep - h
            down = f(arrays)
            a.flat[i] = keep
            g.flat[i] = (up - down) / (2 * h)
        grads.append(g)
    return grads


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _layer_norm(x, gamma, beta, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _check_head_gradients(head, features, hidden, numpy_loss, variables):
    """TF gradients of the head's mean loss w.r.t. the sequence output and the head's weights against finite
    differences of ``numpy_loss`` (the original's formulas in float64)."""
    import tensorflow as tf

    h = tf.Variable(hidden)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(head.loss(features, head({"sequence_output": h}, features, training=True)))
    got = tape.gradient(loss, [h] + variables)
    arrays = [hidden.astype(np.float64)] + [v.numpy().astype(np.float64) for v in variables]
    assert abs(float(loss) - numpy_loss(arrays)) < 1e-5 * max(1.0, abs(float(loss)))
    want = _finite_difference(numpy_loss, arrays)
    for v, g, w in zip(["sequence_output"] + [v.path for v in variables], got, want):
        g = tf.convert_to_tensor(g).numpy()
        # (a logits bias has a zero gradient where every use of its logits is shift invariant, such as the start
        # bias and RACE's; float32 leaves ~1e-7 of rounding there, seen at 1.19e-7, hence the absolute 1e-6)
        assert np.linalg.norm(g - w) <= 1e-4 * np.linalg.norm(w) + 1e-6, (v, np.linalg.norm(g - w), w)


def test_span_head_loss_gradients_match_numpy():
    """run_squad.py's loss (SquadHead, training): 0.5 (CE start + CE end at the gold start's features) + 0.5 BCE
    of the answer class on (softmax(start)-weighted H ; H[cls]), as xlnet-facts §3."""
    import tensorflow as tf

    from xlnet_tf.heads.squad import SquadHead

    rng = np.random.default_rng(0)
    b, L, d = 3, 10, 8
    p_mask = np.zeros((b, L), np.float32)
    p_mask[:, 5:8] = 1.0  # P P P P P <sep> Q <sep> <cls> PAD -> here: question and seps masked, CLS at 8
    p_mask[:, 9] = 1.0
    feats = {"p_mask": tf.constant(p_mask), "cls_index": tf.constant([8, 8, 8]),
             "start_position": tf.constant([1, 8, 3]), "end_position": tf.constant([2, 8, 4]),
             "is_impossible": tf.constant([0.0, 1.0, 0.0])}
    hidden = rng.normal(0, 1, (b, L, d)).astype(np.float32)
    head = SquadHead(d_model=d, dropout=0.0, initializer_range=0.5)
    head({"sequence_output": tf.constant(hidden)}, feats, training=True)
    dense0, ln = head.end_mlp[0]
    variables = [head.start_out.kernel, head.start_out.bias, dense0.kernel, dense0.bias, ln.gamma, ln.beta,
                 head.end_out.kernel, head.end_out.bias, head.ans_mlp[0].kernel, head.ans_mlp[0].bias,
                 head.ans_out.kernel]
    p = p_mask.astype(np.float64)
    start_pos, end_pos = np.array([1, 8, 3]), np.array([2, 8, 4])
    imp, cls = np.array([0.0, 1.0, 0.0]), np.array([8, 8, 8])
    rows = np.arange(b)

    def loss(a):
        H, ws, bs, we, be, g, bt, wo, bo, wa, ba, wc = a
        start = (H @ ws)[..., 0] + bs[0]
        start = start * (1 - p) - 1e30 * p
        start_lp = _log_softmax(start)
        sf = H[rows, start_pos]                                           # [b, d]
        x = np.tanh(np.concatenate([H, np.repeat(sf[:, None], L, 1)], -1) @ we + be)
        end = (_layer_norm(x, g, bt) @ wo)[..., 0] + bo[0]
        end_lp = _log_softmax(end * (1 - p) - 1e30 * p)
        sp = np.exp(start_lp)
        feat = np.concatenate([(sp[..., None] * H).sum(1), H[rows, cls]], -1)
        logit = (np.tanh(feat @ wa + ba) @ wc)[:, 0]
        bce = np.maximum(logit, 0) - logit * imp + np.log1p(np.exp(-np.abs(logit)))
        ce = -start_lp[rows, start_pos] - end_lp[rows, end_pos]
        return float(np.mean(0.5 * ce + 0.5 * bce))

    _check_head_gradients(head, feats, hidden, loss, variables)


def test_multiple_choice_head_loss_gradients_match_numpy():
    """run_race.py's loss (MultipleChoiceHead): summary "last" -> tanh(Dense_d) -> Dense_1 -> [b, 4] -> CE."""
    import tensorflow as tf

    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead

    rng = np.random.default_rng(1)
    b, L, d = 2, 6, 8
    hidden = rng.normal(0, 1, (b * 4, L, d)).astype(np.float32)
    feats = {"label": tf.constant([2, 0])}
    head = MultipleChoiceHead(d, num_choices=4, dropout=0.0, initializer_range=0.5)
    head({"sequence_output": tf.constant(hidden)}, feats, training=True)
    variables = [head.summary.proj.kernel, head.summary.proj.bias, head.logits_dense.kernel,
                 head.logits_dense.bias]
    labels = np.array([2, 0])

    def loss(a):
        H, ws, bs, wl, bl = a
        logits = ((np.tanh(H[:, -1] @ ws + bs) @ wl)[:, 0] + bl[0]).reshape(b, 4)
        return float(np.mean(-_log_softmax(logits)[np.arange(b), labels]))

    _check_head_gradients(head, feats, hidden, loss, variables)
