"""RAM estimate of an XLNet fine-tuning step (or inference): parameters, optimizer state and the step's peak of
activations, so a run that cannot fit is refused before any work ("memory" elsewhere in this code base means the
Transformer-XL memory, ``mems``).

    python -m xlnet_tf.ram --config=large --seq_len=512 --batch=1 --precision=mixed_bfloat16 --recompute
    python -m xlnet_tf.ram --config=base --seq_len=512 --batch=8 --num_trainable_layers=4 --grad_accum_steps=4

``estimate(config, seq_len, batch, precision, recompute, num_trainable_layers, ..., head=HeadSize) -> dict`` is
the function behind the CLI, ``run_common.check_memory`` and ``benchmarks/memory_levers.py`` (which checks it
against the allocator's measured peak). It imports no TensorFlow (the CLI's ``--fused_attention=auto`` asks
``xlnet_tf.accel``'s kernel rule, which does) and knows no head: a run hands it its head's own description
(``HeadSize``, from the head class's ``size``; the CLI's ``--head`` names are its own shorthands, ``cli_head``).
Sizes are bytes; 1 MiB = 2**20 bytes.

What it counts, the step's timeline and what XLA does on top (its calibration against the allocator's peak:
PERFORMANCE.md, "The RAM estimator's calibration"):

`python -m xlnet_tf.ram` (and `run_common.check_memory`, which refuses a run that cannot fit) models one replica,
one optimizer update of `batch` examples in `grad_accum_steps` micro-batches. PERFORMANCE.md "Memory levers" calibrates it
(`benchmarks/memory_levers.py`; `--quick` for a smoke run).

*Persistent*: every variable in float32 (Keras' mixed policies keep float32 master weights), and Adam(W)'s `m`
and `v` for the *trainable* variables only (the trainer builds slots for the `num_trainable_layers` subset).

*Step memory* (its peak is what the levers change): float32 gradients of the trainable variables (the
word-embedding gradient densified; with `grad_accum_steps > 1` an accumulator of the same size), and the
activations each *trainable* block keeps for the backward pass (b = micro-batch, q = k = seq_len, r = k + q
relative positions, n heads x d_head, a = compute-dtype bytes):

| tensor | shape | why autodiff keeps it |
|---|---|---|
| q + r_w_bias, q + r_r_bias, q + r_s_bias | 3 x [b, n, q, d_head] | operands of the AC / BD / EF matmuls |
| k_head, v_head | 2 x [b, n, k, d_head] | operands of AC and prob.v |
| kr = R.W_r | [n, r, d_head] | operand of BD (BD [b,n,q,r] is a temporary: rel_shift's gradient needs none) |
| softmax output | [b, n, q, k] float32 | softmax gradient (scores are upcast before the softmax) |
| attention-dropout draws / mask | [b, n, q, k] | dropout gradient (XLA keeps the draws, a bytes; graph mode a bool mask) |
| dropped probabilities | [b, n, q, k] | operand of prob.v |
| attention vector | [b, q, n*d_head] | operand of the o projection |
| 2 output-dropout draws (attention, FFN) | 2 x [b, q, d] | dropout gradients |
| LayerNorm inputs and outputs (2 LNs) | 4 x [b, q, d] | LN gradient |
| FFN pre-activation, tanh(.), dropout draws, dropped activation | 4 x [b, q, d_inner] | GELU and dropout gradients, operand of layer_2 (graph mode: no tanh) |
| mixed precision: compute-dtype weight copies | q, k, v, o, ff1, ff2 | d(input) = d(out).W^T needs the cast W |

With the compiled attention kernels (CPU, graph mode, float32; `xlnet_tf.ram.fused_attention_applies`) the
attention keeps q, k, v as projected, kr, the float32 probabilities and a bool keep mask, and no score-sized
workspace. Once per step: the dropped positional encodings [r, d] (per example or per batch), the embedding
output and its dropout draws, the boolean masks [b, q, k], the head's activations. Frozen bottom blocks keep
nothing (the tape records only ops that depend on a trainable variable); `recompute` keeps each block's input
and re-runs one block at a time. Workspace, never kept: the forward scores (AC, BD, their sum), about 5
score-sized gradients in the backward, and graph mode's per-variable optimizer temporaries.

The peak is found on a timeline, not by summing: `peak = max(forward, each backward block, update)` (at the end
of the forward every kept activation is alive; going down the backward, block j's activations are freed as its
gradients appear); the naive sum is reported too, as an upper bound. `jit=True` models whole-step XLA (the
trainer's `--jit=true`, its default on one GPU), `jit=False` TF graph mode (`--jit=false` and `--jit=update`,
the CPU default), which keeps more intermediates. What XLA does on top, found in its buffer-assignment dumps
(properties of this implementation, not of XLNet):

- `rng_hoisting`: every block's dropout seed is known before the step runs, so XLA draws the randoms of all
  blocks at its start: with frozen layers the forward peaks at the first block with every block's draws alive;
  with `recompute` each block's draws live until its recomputation. Tying each block's seed to its input removes
  this (Base, batch 2, seq 512, `num_trainable_layers=2`: XLA step peak 646 -> 370 MiB); `rng_hoisting=False`
  estimates that variant.
- with a mixed precision and `grad_accum_steps > 1`, the weight casts are hoisted out of the accumulation loop:
  a compute-dtype copy of every weight lives through the step.
- `cpu=True`: XLA:CPU round-trips bf16/fp16 through float32, so mixed precision saves no activation memory there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple, Union

from xlnet_tf.config import XLNetConfig
from xlnet_tf.hardware import PRECISIONS, validate_precision

OPTIMIZER_SLOTS = {"adamw": 2, "adam": 2, "momentum": 1, "sgd": 0}
MiB = float(2 ** 20)
# Measured on the reference machine (benchmarks/results/memory_levers.md): RSS of a process that has imported
# TensorFlow and run one op, plus what compiling and running the XLA step adds beyond the tensors the allocator
# reports. A property of TF/XLA on CPU, not of the model; printed separately, never added to the estimate.
CPU_RUNTIME_OVERHEAD_MIB = {"tensorflow_import": 575.0}


# ====================================================================== parameters
def block_param_count(c: XLNetConfig) -> int:
    """Weights of one XLNetBlock: q,k,v,r,o [d, n, d_head], 2 LayerNorms, FFN, seg_embed (+ r biases)."""
    proj = c.d_model * c.n_head * c.d_head
    n = 5 * proj + 2 * 2 * c.d_model                         # q k v r o, attention + FFN LayerNorm gamma/beta
    n += c.d_model * c.d_inner + c.d_inner + c.d_inner * c.d_model + c.d_model   # layer_1, layer_2
    n += 2 * c.n_head * c.d_head                             # seg_embed [2, n, d_head]
    if c.untie_r:
        n += 3 * c.n_head * c.d_head                         # r_w / r_r / r_s biases of this layer
    return n


def backbone_param_counts(c: XLNetConfig) -> Dict[str, int]:
    """Variables of XLNetModel by group; ``total`` equals ``XLNetModel(c).count_params()``."""
    groups = {
        "word_embedding": c.n_token * c.d_model,
        "mask_emb": c.d_model,
        "lm_bias": c.n_token,
        "shared_r_biases": 0 if c.untie_r else 3 * c.n_head * c.d_head,
        "blocks": c.n_layer * block_param_count(c),
        "dropout_seed": 2,                                   # int64 [2], non-trainable
    }
    groups["total"] = sum(groups.values())
    return groups


def dense_params(n_in: int, n_out: int, bias: bool = True) -> int:
    """Weights of a Dense layer (for a head's ``size``)."""
    return n_in * n_out + (n_out if bias else 0)


@dataclasses.dataclass(frozen=True)
class HeadSize:
    """What a task head adds to a step, as the head describes itself (``Head.size(config, **its arguments)``,
    ``xlnet_tf/head.py``): ``estimate`` knows no head by name, so a new head needs no edit here. ``params``: its
    trainable weights; the activations it keeps for the backward pass, per sequence (row) in elements:
    ``per_token`` / ``per_token_float32`` for each of its L positions (in the compute dtype / in float32) and
    ``per_row`` / ``per_row_float32`` once. ``name`` is printed."""
    name: str
    params: int = 0
    per_token: int = 0
    per_token_float32: int = 0
    per_row: int = 0
    per_row_float32: int = 0

    def activations(self, seq_len: int, rows: int, compute_bytes: int) -> int:
        """Bytes kept for ``rows`` sequences of ``seq_len`` positions (``compute_bytes`` per compute-dtype
        element)."""
        per_row = (seq_len * (self.per_token * compute_bytes + self.per_token_float32 * 4)
                   + self.per_row * compute_bytes + self.per_row_float32 * 4)
        return rows * per_row


NO_HEAD = HeadSize("none")  # the backbone alone (generation; pretraining's LM head is the backbone's embedding)


def trainable_param_counts(c: XLNetConfig, num_trainable_layers: Optional[int], head_params: int) -> Dict[str, int]:
    """What ``optimization.select_trainable`` returns: top N blocks + head-level variables (lm_bias, head); with
    N >= 1 the tied r biases (depth n_layer) too. None / -1: every trainable variable (embeddings included)."""
    bb = backbone_param_counts(c)
    if num_trainable_layers is None or num_trainable_layers < 0:
        blocks, emb = c.n_layer, bb["word_embedding"] + bb["mask_emb"]
    else:
        if num_trainable_layers > c.n_layer:
            raise ValueError(f"num_trainable_layers={num_trainable_layers} > n_layer={c.n_layer}")
        blocks, emb = num_trainable_layers, 0
    shared = bb["shared_r_biases"] if blocks > 0 else 0
    per_block = block_param_count(c)
    out = {"embeddings": emb, "blocks": blocks * per_block, "shared_r_biases": shared, "lm_bias": bb["lm_bias"],
           "head": head_params, "trainable_blocks": blocks}
    out["total"] = emb + blocks * per_block + shared + bb["lm_bias"] + head_params
    return out


# ====================================================================== activations
def _bytes_per(precision: str) -> int:
    return 4 if validate_precision(precision) == "float32" else 2


def block_activations(c: XLNetConfig, seq_len: int, batch: int, precision: str, jit: bool = True,
                      segments: bool = True, cpu: bool = False,
                      fused_attention: bool = False) -> List[Tuple[str, int, str]]:
    """[(name, bytes, part)] kept for the backward pass by ONE trainable block (content stream, no memory).

    ``part``: "score" ([b,n,q,k] tensors, consumed first in the attention backward), "ffn" (the FFN half,
    freed before the attention backward starts) or "attn" (the rest). ``cpu`` with ``jit`` and a mixed
    precision: XLA:CPU has no native 16-bit matmuls and upcasts them, so activations are kept as float32
    (measured); the 16-bit weight copies remain. ``fused_attention``: the compiled training kernels
    (``xlnet_tf/accel/kernels``; CPU, graph mode, float32) keep q, k, v as projected, the probabilities and the bool
    keep mask, and no biased queries, transposed heads or dropped probabilities."""
    mixed = precision != "float32"
    a = 4 if (cpu and jit) else _bytes_per(precision)
    w = _bytes_per(precision)
    b, q = batch, seq_len
    k = q                                                    # no mems at fine-tuning
    r = k + q if c.attn_type == "bi" else k + 1
    hd = c.n_head * c.d_head
    bqd, bkh, bqh = b * q * c.d_model, b * k * hd, b * q * hd
    score = b * c.n_head * q * k
    ffn = b * q * c.d_inner
    drop, datt = c.dropout > 0, c.dropatt > 0
    mask_b = a if jit else 1                                 # XLA keeps the uniform draws, graph mode a bool mask
    pb = b if (c.pos_dropout == "per_example" and drop) else (2 if c.bi_data else 1)
    if fused_attention:  # the kernels apply the keep mask inside: no dropped (or cast) probabilities
        items = [("q, k, v [b,len,n*dh] (kernel operands)", (bqh + 2 * bkh) * a, "attn"),
                 ("kr = R.W_r [r,n*dh]", r * hd * a, "attn"),
                 ("probabilities [b,n,q,k] (float32)", score * 4, "score")]
        if datt:
            items.append(("attention dropout mask [b,n,q,k] (bool)", score, "score"))
    else:
        items = [
            ("q+r_w_bias, q+r_r_bias" + (", q+r_s_bias" if segments else "") + " [b,n,q,dh]",
             (3 if segments else 2) * bqh * a, "attn"),
            ("k_head, v_head [b,n,k,dh]", 2 * bkh * a, "attn"),
            ("kr = R.W_r [n,r,dh]", pb * c.n_head * r * c.d_head * a, "attn"),
            ("softmax output [b,n,q,k] (float32)", score * 4, "score"),
        ]
        if datt:
            items += [("attention dropout draws/mask [b,n,q,k]", score * mask_b, "score"),
                      ("dropped probabilities [b,n,q,k]", score * a, "score")]
        elif mixed:
            items.append(("probabilities cast to compute dtype [b,n,q,k]", score * a, "score"))
    items.append(("attention vector [b,q,n*dh]", bqh * a, "attn"))
    if drop:
        items += [("attention-out dropout draws/mask [b,q,d]", bqd * mask_b, "attn"),
                  ("FFN-out dropout draws/mask [b,q,d]", bqd * mask_b, "ffn")]
    items += [("attention LayerNorm input + output 2x[b,q,d]", 2 * bqd * a, "attn"),
              ("FFN LayerNorm input + output 2x[b,q,d]", 2 * bqd * a, "ffn")]
    # Graph mode keeps no LayerNorm intermediates (its hand-written gradient needs the input, the row mean and
    # 1/std) and only the GELU's pre-activation (``gelu_dropout_train``); whole-step XLA keeps tanh(.) too.
    gelu = 2 if jit else 1
    items.append((f"FFN pre-activation{' + tanh' if jit else ''} {gelu}x[b,q,d_inner]", gelu * ffn * a, "ffn"))
    if drop:
        items += [("FFN dropout draws/mask [b,q,d_inner]", ffn * mask_b, "ffn"),
                  ("dropped FFN activation [b,q,d_inner]", ffn * a, "ffn")]
    if mixed:
        items += [("compute-dtype weight copies q,k,v,o", 4 * c.d_model * hd * w, "attn"),
                  ("compute-dtype weight copies layer_1, layer_2", 2 * c.d_model * c.d_inner * w, "ffn")]
    items.append(("LayerNorm statistics 2x2x[b,q,1] (float32)", 4 * b * q * 4, "attn"))
    return items


def workspace(c: XLNetConfig, seq_len: int, batch: int, precision: str, jit: bool = True,
              cpu: bool = False, fused_attention: bool = False) -> Dict[str, int]:
    """Temporaries never kept: the largest transient of a block's forward and of its backward. With
    ``fused_attention`` the attention's scores never leave the kernels' cache tiles: no score-sized
    temporaries, only the gradient op's outputs (dq, dk, dv, dkr)."""
    mixed = precision != "float32" and not (cpu and jit)
    a = 4 if (cpu and jit) else _bytes_per(precision)
    b, q = batch, seq_len
    k = q
    r = k + q if c.attn_type == "bi" else k + 1
    score = b * c.n_head * q * k
    bd = b * c.n_head * q * r
    bqd = b * q * c.d_model
    ffn = b * q * c.d_inner
    # forward: AC, BD (before rel_shift), their sum, the float32 copy fed to the softmax (mixed)
    fwd = score * a + bd * a + score * a + (score * 4 if mixed else 0)
    # backward of the attention: gradient of BD (padded back to [b,n,q,r]), ~3 score-sized gradients, a few
    # [b,q,d]; of the FFN: ~3 [b,q,d_inner] gradients
    attn = bd * a + 3 * score * a + 3 * bqd * a
    if not jit:
        attn += score * 4                                    # graph mode: float32 softmax gradient alongside
    if fused_attention:
        fwd, attn = 0, 4 * bqd * a + 3 * bqd * a
    return {"forward": fwd, "backward_attention": attn, "backward_ffn": 3 * ffn * a + 3 * bqd * a}


# ====================================================================== the estimate
def fused_attention_applies(c: XLNetConfig, precision: str, jit: bool, cpu: bool) -> bool:
    """Whether a training step would run the compiled attention kernels: the rule of ``xlnet_tf.accel``
    (``kernel_refusal``, which imports TensorFlow) for a training step of ``c`` on this host's build of the
    library (``cpu``: no GPU/TPU; ``jit``: whole-step XLA). The library's stamp is checked only when
    TensorFlow loads it: an outdated build falls back to the TensorFlow ops, which keep more."""
    from xlnet_tf import accel

    per_example = c.pos_dropout == "per_example" and c.dropout > 0   # a training step's positional dropout
    return accel.kernel_refusal(c, validate_precision(precision).replace("mixed_", ""), per_example, xla=jit,
                                accelerator=not cpu, library=accel.library_present) is None


def estimate(config: Union[XLNetConfig, str, dict], seq_len: int, batch: int, precision: str = "float32",
             recompute: bool = False, num_trainable_layers: Optional[int] = None, grad_accum_steps: int = 1,
             optimizer: str = "adamw", head: HeadSize = NO_HEAD, jit: bool = True, segments: bool = True,
             rng_hoisting: Optional[bool] = None, cpu: bool = False, fused_attention: bool = False) -> Dict:
    """Estimated training memory of one replica. ``batch`` = examples per optimizer update (per replica);
    each of the ``grad_accum_steps`` micro-batches holds ``ceil(batch / grad_accum_steps)``. Returns a dict of
    bytes (the model: this module's docstring); ``total`` = parameters + optimizer state + step peak.
    ``head``: the task head's own description (``HeadSize``; default: the backbone alone).
    ``fused_attention``: the step runs the compiled attention kernels (see ``fused_attention_applies``)."""
    c = _as_config(config)
    num_trainable_layers = _checked_arguments(optimizer, seq_len, batch, grad_accum_steps, num_trainable_layers)
    step = _Step(c, seq_len, batch, int(math.ceil(batch / grad_accum_steps)), grad_accum_steps, precision,
                 _bytes_per(precision), recompute, jit, segments, cpu, fused_attention)
    bb = backbone_param_counts(c)
    tp = trainable_param_counts(c, num_trainable_layers, head.params)
    grads = _gradients(step, bb, tp, head.params)
    acts = _activations(step, tp, head, rng_hoisting)
    ws = workspace(c, seq_len, step.micro, precision, jit, cpu, fused_attention)
    opt_tmp = _optimizer_temporaries(c, tp, head.params, jit)
    phases = _timeline(step, tp["trainable_blocks"], grads, acts, ws, opt_tmp)
    return _report(step, num_trainable_layers, optimizer, head, bb, tp, grads, acts, ws, opt_tmp, phases)


@dataclasses.dataclass(frozen=True)
class _Step:
    """What ``estimate`` models: one optimizer update of ``batch`` examples in micro-batches of ``micro``;
    ``a``: bytes of a compute-dtype element."""
    c: XLNetConfig
    seq_len: int
    batch: int
    micro: int
    grad_accum_steps: int
    precision: str
    a: int
    recompute: bool
    jit: bool
    segments: bool
    cpu: bool
    fused_attention: bool


@dataclasses.dataclass(frozen=True)
class _Gradients:
    """The step's float32 gradients (bytes): of one block, of the embeddings, of the other trainable variables,
    all of them; ``accum``: what lives through the step beside them (the accumulator, hoisted weight casts)."""
    block: int
    embeddings: int
    other: int
    total: int
    accum: int
    hoisted_casts: int


@dataclasses.dataclass(frozen=True)
class _Activations:
    """The step's kept activations (bytes, per micro-batch): a trainable block's items and their sums, the
    once-per-step ones (``shared``), the head's, and what each block keeps through the forward."""
    per_block_items: List[Tuple[str, int, str]]
    block: int
    attn: int
    draws: int
    hoist: bool
    shared: int
    head: int
    kept_per_block: int
    kept: int


def _checked_arguments(optimizer: str, seq_len: int, batch: int, grad_accum_steps: int,
                       num_trainable_layers: Optional[int]) -> Optional[int]:
    """Refuses an unknown optimizer or a size below 1; returns ``num_trainable_layers`` (None for every layer)."""
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer: expected one of {sorted(OPTIMIZER_SLOTS)}, got {optimizer!r}")
    if seq_len < 1 or batch < 1 or grad_accum_steps < 1:
        raise ValueError("seq_len, batch and grad_accum_steps must be >= 1")
    if num_trainable_layers is not None and num_trainable_layers < 0:
        num_trainable_layers = None
    return num_trainable_layers


def _gradients(s: _Step, bb: Dict[str, int], tp: Dict[str, int], head_params: int) -> _Gradients:
    """Float32 gradients of the trainable variables only, the accumulator and the hoisted weight casts."""
    g_block = 4 * block_param_count(s.c)
    g_emb = 4 * tp["embeddings"]
    g_other = 4 * (tp["head"] + tp["lm_bias"] + tp["shared_r_biases"])
    grads = g_emb + g_other + tp["trainable_blocks"] * g_block
    accum = grads if s.grad_accum_steps > 1 else 0
    # XLA hoists the loop-invariant casts of the weights out of the accumulation loop: with a mixed precision
    # and accumulation, a compute-dtype copy of every weight the forward reads lives through the step (on
    # XLA:CPU a float32 one: it round-trips 16-bit values through float32).
    hoisted_casts = 0
    if s.jit and s.precision != "float32" and s.grad_accum_steps > 1:
        used = bb["word_embedding"] + bb["blocks"] + bb["shared_r_biases"] + head_params
        hoisted_casts = used * (4 if s.cpu else _bytes_per(s.precision))
    return _Gradients(g_block, g_emb, g_other, grads, accum + hoisted_casts, hoisted_casts)


def _activations(s: _Step, tp: Dict[str, int], head: HeadSize, rng_hoisting: Optional[bool]) -> _Activations:
    """The activations kept for the backward pass, per micro-batch: each trainable block's, the once-per-step
    ones and the head's."""
    c, micro, seq_len = s.c, s.micro, s.seq_len
    per_block_items = block_activations(c, seq_len, micro, s.precision, s.jit, s.segments, s.cpu, s.fused_attention)
    a_block = sum(v for _, v, _ in per_block_items)
    a_attn = sum(v for _, v, part in per_block_items if part == "attn")   # left when the score grads appear
    draws = sum(v for name, v, _ in per_block_items if "draws" in name)   # one block's dropout draws
    if rng_hoisting is None:
        rng_hoisting = bool(s.jit)
    hoist = bool(rng_hoisting) and draws > 0
    bqd = micro * seq_len * c.d_model
    a_act = 4 if (s.cpu and s.jit) else s.a                  # XLA:CPU keeps 16-bit activations as float32
    mask_b = a_act if s.jit else 1
    r = 2 * seq_len if c.attn_type == "bi" else seq_len + 1
    shared = 0
    if tp["trainable_blocks"] > 0 or tp["embeddings"]:
        pos_sets = micro if (c.pos_dropout == "per_example" and c.dropout > 0) else (2 if c.bi_data else 1)
        shared += pos_sets * r * c.d_model * (a_act + mask_b)   # dropped pos. encodings + draws
        shared += 2 * micro * seq_len * seq_len * (1 if s.segments else 0.5)  # bool segment-diff / attention masks
        shared += bqd * a_act                                # input of the lowest trainable block
        if tp["embeddings"] and c.dropout > 0:
            shared += bqd * mask_b                           # embedding dropout draws
        shared += bqd * mask_b                               # dropout on the sequence output (head input)
    head_act = head.activations(seq_len, micro, s.a)
    kept_per_block = bqd * a_act if s.recompute else a_block  # recompute: only the block input is kept
    if s.recompute and hoist:
        kept_per_block += draws      # drawn at the step's start, alive until the block's recomputation uses them
    acts_kept = shared + head_act + tp["trainable_blocks"] * kept_per_block
    return _Activations(per_block_items, a_block, a_attn, draws, hoist, shared, head_act, kept_per_block, acts_kept)


def _optimizer_temporaries(c: XLNetConfig, tp: Dict[str, int], head_params: int, jit: bool) -> int:
    """Per-variable temporaries of clipping / Adam, for the largest trainable variable."""
    largest = max(c.d_model * c.d_inner if tp["trainable_blocks"] else 0,
                  tp["embeddings"] and c.n_token * c.d_model, head_params)
    return 4 * largest * (1 if jit else 2)


def _timeline(s: _Step, n_tr: int, g: _Gradients, act: _Activations, ws: Dict[str, int],
              opt_tmp: int) -> Dict[str, int]:
    """The memory alive at each moment of the step (this module's docstring): the forward, each backward block
    (top first), the update; ``n_tr`` trainable blocks."""
    phases = {}
    # forward, at the top block's attention scores (its FFN half does not exist yet); then after the head
    below_top = max(n_tr - 1, 0) * act.kept_per_block
    phases["forward"] = g.accum + act.shared + below_top + (act.attn if n_tr else 0) + ws["forward"]
    phases["forward end"] = g.accum + act.kept + (act.block - act.kept_per_block if s.recompute and n_tr else 0)
    if act.hoist:  # XLA draws every block's dropout randoms before the first block runs
        phases["forward, first block"] = g.accum + act.shared + s.c.n_layer * act.draws + ws["forward"]
    # XLA allocates the dense embedding gradient up front; with accumulation each micro-batch's gradients are
    # added into the accumulator as they appear (only the current block's exist on their own).
    emb_early = g.embeddings if s.jit and s.grad_accum_steps == 1 else 0
    for j in range(n_tr):                                    # j = 0 is the top trainable block
        below = n_tr - j - 1                                 # trainable blocks still holding their activations
        done = 0 if s.grad_accum_steps > 1 else j            # gradients of the blocks above, on their own
        base = g.accum + act.shared + act.head + g.other + emb_early + below * act.kept_per_block
        ffn_moment = base + done * g.block + act.block + ws["backward_ffn"]
        attn_moment = base + (done + 1) * g.block + act.attn + ws["backward_attention"]
        phases[f"backward block {n_tr - j}/{n_tr}"] = max(ffn_moment, attn_moment)
    phases["update"] = g.accum + g.total + opt_tmp
    return phases


def _report(s: _Step, num_trainable_layers: Optional[int], optimizer: str, head: HeadSize, bb: Dict[str, int],
            tp: Dict[str, int], g: _Gradients, act: _Activations, ws: Dict[str, int], opt_tmp: int,
            phases: Dict[str, int]) -> Dict:
    """``estimate``'s dict: the arguments, the parameters, the components, the timeline and the total."""
    c, hp = s.c, head.params
    n_params = bb["total"] + hp
    param_bytes = 4 * (n_params - bb["dropout_seed"]) + 8 * bb["dropout_seed"]
    opt_bytes = 4 * OPTIMIZER_SLOTS[optimizer] * tp["total"]
    peak_phase = max(phases, key=phases.get)
    step_peak = phases[peak_phase]
    n_tr = tp["trainable_blocks"]
    act_total = act.kept + (act.block if s.recompute and n_tr else 0)
    components = {
        "parameters": param_bytes,
        "gradients": g.total + (g.total if s.grad_accum_steps > 1 else 0),
        "optimizer_state": opt_bytes,
        "activations": act_total,
        "workspace": max(max(ws.values()), opt_tmp),
    }
    if g.hoisted_casts:
        components["weight_casts"] = g.hoisted_casts
    return {
        "config": c.to_original_dict(), "seq_len": s.seq_len, "batch": s.batch, "micro_batch": s.micro,
        "grad_accum_steps": s.grad_accum_steps, "precision": s.precision, "recompute": bool(s.recompute),
        "num_trainable_layers": num_trainable_layers, "optimizer": optimizer, "head": head.name,
        "jit": bool(s.jit), "cpu": bool(s.cpu), "fused_attention": bool(s.fused_attention),
        "param_count": n_params, "trainable_param_count": tp["total"], "trainable_blocks": n_tr,
        "param_groups": bb, "head_param_count": hp, "rng_hoisting": act.hoist, "dropout_draws_per_block": act.draws,
        **components,
        "activations_per_block": act.block, "activations_per_block_items": act.per_block_items,
        "activations_kept_per_block": act.kept_per_block, "activations_shared": act.shared,
        "activations_head": act.head,
        "gradient_accumulator": g.total if s.grad_accum_steps > 1 else 0, "hoisted_weight_casts": g.hoisted_casts,
        "workspace_items": {**ws, "optimizer_update": opt_tmp},
        "phases": phases, "peak_phase": peak_phase, "step_peak": step_peak,
        "persistent": param_bytes + opt_bytes,
        "total": param_bytes + opt_bytes + step_peak,
        "sum_of_components": sum(components.values()),
    }


def generation_estimate(config: Union[XLNetConfig, str, dict], batch: int, prompt_length: int, max_new_tokens: int,
                        mem_len: Optional[int] = None, precision: str = "float32") -> Dict:
    """Estimated memory of generating (``xlnet_tf/generation.py``) for ``batch`` prompts of up to ``prompt_length``
    pieces: the prompt's forward pass (``estimate`` for inference), then a loop whose state holds each layer's keys
    and values of ``positions`` positions (every one that joins the memory: the prompt but its last token and
    each new token, or the last ``mem_len``), twice while a step builds the next state, one layer's keys,
    values, positional encodings and scores over them, and the new ids. Bytes; ``positions``; ``memory``: one
    copy of the keys and values."""
    c = _as_config(config)
    if batch < 1 or prompt_length < 1 or max_new_tokens < 1:
        raise ValueError("batch, prompt_length and max_new_tokens must be >= 1")
    a = _bytes_per(precision)
    positions = max(prompt_length - 1 + max_new_tokens - 1, 1)
    if mem_len:
        positions = min(positions, mem_len)
    per_position = c.n_head * c.d_head * a                   # one key or value of one position, one row
    memory = c.n_layer * 2 * batch * positions * per_position
    klen = positions + 3                                     # the memory and a step's window of 3
    step = 2 * batch * klen * per_position + 2 * klen * per_position + 3 * batch * 3 * klen * c.n_head * 4
    ids = 2 * batch * max_new_tokens * 4                     # the new ids, and the next step's copy
    params = 4 * backbone_param_counts(c)["total"]
    prompt = estimate(c, prompt_length + 1, batch, precision, num_trainable_layers=0)["total"]
    loop = params + 2 * memory + step
    return {"positions": positions, "memory": memory, "prompt": prompt, "loop": loop, "ids": ids,
            "total": max(prompt, loop) + ids}


def machine_memory() -> Optional[int]:
    """Bytes of memory this process may use: the physical memory, or the cgroup's limit when lower (a container);
    None when unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = int(f.read().strip())
        except (OSError, ValueError):  # absent, or "max"
            continue
        total = min(total, limit) if total else limit
    return total


def _as_config(config) -> XLNetConfig:
    if isinstance(config, XLNetConfig):
        return config
    if isinstance(config, dict):
        return XLNetConfig.from_dict(config)
    return XLNetConfig.load(str(config))


# ====================================================================== CLI
def _mib(x: float) -> str:
    return f"{x / MiB:,.1f} MiB"


def format_table(e: Dict) -> str:
    c = e["config"]
    lines = [f"XLNet n_layer={c['n_layer']} d_model={c['d_model']} n_head={c['n_head']} d_inner={c['d_inner']} "
             f"vocab={c['n_token']}; seq {e['seq_len']}, batch {e['batch']} (micro-batch {e['micro_batch']} x "
             f"{e['grad_accum_steps']}), {e['precision']}, recompute={e['recompute']}, trainable blocks "
             f"{e['trainable_blocks']}/{c['n_layer']}, optimizer {e['optimizer']}, head {e['head']}, "
             f"{'XLA' if e['jit'] else 'TF graph mode'}{' on CPU' if e['cpu'] else ''}"
             f"{', compiled attention kernels' if e.get('fused_attention') else ''}", ""]
    rows = [
        ("parameters", f"{e['param_count']:,} ({e['trainable_param_count']:,} trainable), float32", e["parameters"]),
        ("gradients", "float32, trainable variables" + (" + accumulator" if e["gradient_accumulator"] else ""),
         e["gradients"]),
        ("optimizer state", f"{OPTIMIZER_SLOTS[e['optimizer']]} float32 slot(s) per trainable variable",
         e["optimizer_state"]),
        ("activations", (f"{e['trainable_blocks']} x {_mib(e['activations_kept_per_block'])} kept"
                         + (f" + 1 block recomputed ({_mib(e['activations_per_block'])})" if e["recompute"] else "")
                         + f" + shared/head {_mib(e['activations_shared'] + e['activations_head'])}"),
         e["activations"]),
        ("workspace", "largest transient (attention scores / their gradients / update)", e["workspace"]),
    ]
    if e["hoisted_weight_casts"]:
        rows.append(("weight casts", "compute-dtype weight copies hoisted out of the accumulation loop (XLA)",
                     e["hoisted_weight_casts"]))
    w = max(len(r[0]) for r in rows) + 2
    for name, note, val in rows:
        lines.append(f"  {name:<{w}}{_mib(val):>14}   {note}")
    lines.append("  " + "-" * (w + 14))
    lines.append(f"  {'sum of the above':<{w}}{_mib(e['sum_of_components']):>14}   upper bound (not all alive at once)")
    lines.append(f"  {'estimated peak':<{w}}{_mib(e['total']):>14}   parameters + optimizer state + step peak "
                 f"({_mib(e['step_peak'])} at {e['peak_phase']})")
    lines.append("")
    lines.append(f"Per trainable block ({_mib(e['activations_per_block'])}):")
    for name, val, _ in e["activations_per_block_items"]:
        lines.append(f"    {_mib(val):>12}  {name}")
    lines.append("")
    tf_mib = CPU_RUNTIME_OVERHEAD_MIB["tensorflow_import"]
    lines.append(f"Not included: the framework itself (TensorFlow after import ~{tf_mib:.0f} MiB "
                 "RSS on CPU; XLA executables, compiler and allocator slack: see benchmarks/results/memory_levers.md).")
    return "\n".join(lines)


# The command line's --head names. The library knows no head (``estimate`` takes the run's own ``HeadSize``,
# heads/*.py's ``size``); this CLI keeps shorthands for the heads it has always offered, as those heads describe
# themselves at their default options (tests/test_ram.py holds each equal to its head's ``size``).
CLI_HEADS = ("classification", "squad", "none")


def cli_head(name: str, c: XLNetConfig, num_labels: int = 2, hidden_sizes: Sequence[int] = (),
             answer_class_hidden_sizes: Sequence[int] = ()) -> HeadSize:
    """--head NAME's description: "classification" (heads/classification.py, summary "last"), "squad"
    (heads/squad.py) or "none"."""
    d, hidden = c.d_model, tuple(hidden_sizes)
    if name == "none":
        return NO_HEAD
    if name == "classification":
        n, width = dense_params(d, d), d                     # summary projection, MLP, logits
        for h in hidden:
            n, width = n + dense_params(width, h), h
        return HeadSize(name, n + dense_params(width, num_labels), per_row_float32=8 * d)
    if name == "squad":
        n, width = 0, d
        for h in hidden:                                     # start MLP: Dense + LayerNorm per size
            n, width = n + dense_params(width, h) + 2 * h, h
        n, width = n + dense_params(width, 1), 2 * d         # start logit; end MLP over [H ; H_start]
        for h in hidden or (d,):
            n, width = n + dense_params(width, h) + 2 * h, h
        n, width = n + dense_params(width, 1), 2 * d         # end logit; answer class over [start feature ; CLS]
        for h in tuple(answer_class_hidden_sizes) or (d,):
            n, width = n + dense_params(width, h), h
        kept = sum(hidden or (d,)) + sum(hidden)             # dense outputs and LayerNorms of the end / start MLPs
        return HeadSize(name, n + dense_params(width, 1, bias=False), per_token=d + 2 * kept,
                        per_token_float32=2 * kept)
    raise ValueError(f"head: expected one of {CLI_HEADS}, got {name!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlnet_tf.ram", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="base", help="preset (tiny/small/base/large), a config json or a directory")
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--batch", type=int, default=1, help="examples per optimizer update (per replica)")
    p.add_argument("--precision", default="float32", choices=PRECISIONS)
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--num_trainable_layers", type=int, default=-1, help="train only the top N blocks (-1: all)")
    p.add_argument("--grad_accum_steps", type=int, default=1)
    p.add_argument("--optimizer", default="adamw", choices=sorted(OPTIMIZER_SLOTS))
    p.add_argument("--head", default="classification", choices=CLI_HEADS,
                   help="a run hands xlnet_tf.ram.estimate its own head's description (HeadSize)")
    p.add_argument("--num_labels", type=int, default=2)
    p.add_argument("--head_hidden_sizes", default="", help="comma list, e.g. 512,384")
    p.add_argument("--answer_class_hidden_sizes", default="", help="SQuAD head, comma list, e.g. 256")
    p.add_argument("--jit", default="true", choices=["true", "update", "false"],
                   help="the trainer's --jit: true = whole-step XLA (calibrated; the default on GPU); update (the "
                        "default on CPU) and false = graph-mode activations")
    p.add_argument("--device", default="accelerator", choices=["accelerator", "cpu"],
                   help="cpu: XLA:CPU upcasts 16-bit matmuls, so mixed precision keeps float32 activations")
    p.add_argument("--rng_hoisting", default="auto", choices=["auto", "true", "false"],
                   help="auto (= --jit): XLA draws every block's dropout randoms at the start of the step "
                        "(this module's docstring); false: the estimate without that effect")
    p.add_argument("--fused_attention", default="auto", choices=["auto", "true", "false"],
                   help="auto: the compiled attention kernels when they would run (--device=cpu, --jit update or "
                        "false, float32, the library built); they keep fewer [b, n, q, k] tensors")
    p.add_argument("--json", action="store_true", help="print the estimate as json")
    args = p.parse_args(argv)
    sizes = lambda s: tuple(int(x) for x in s.split(",") if x.strip())  # noqa: E731
    try:
        jit, cpu = args.jit == "true", args.device == "cpu"
        c = _as_config(args.config)
        fused = (fused_attention_applies(c, args.precision, jit, cpu)
                 if args.fused_attention == "auto" else args.fused_attention == "true")
        head = cli_head(args.head, c, args.num_labels, sizes(args.head_hidden_sizes),
                        sizes(args.answer_class_hidden_sizes))
        e = estimate(c, args.seq_len, args.batch, args.precision, args.recompute,
                     args.num_trainable_layers, args.grad_accum_steps, args.optimizer, head, jit=jit,
                     rng_hoisting=None if args.rng_hoisting == "auto" else args.rng_hoisting == "true",
                     cpu=cpu, fused_attention=fused)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(e, indent=1))
    else:
        print(format_table(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
