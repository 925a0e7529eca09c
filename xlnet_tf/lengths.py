"""The padded-length rule, in one place: every batch (training, evaluation, prediction, serving) is padded to its
longest example, rounded up to a multiple. ``data/lengths.py`` applies it to tf.data batches, the exported
serving graphs (``xlnet_tf/export.py``) to each request.

Why a multiple, and which: a batch length not met before costs once (the training step's small XLA clusters
compile for the new shape; a GPU/TPU's whole-step XLA compiles the whole step), while every padded position
costs the model's per-token work in every step. So:

* a GPU or TPU (whole-step XLA per shape): ``ACCELERATOR_MULTIPLE`` (8, a bounded set of ``L / 8`` shapes);
* a CPU: by the model's training cost per token (``train_flops_per_token``), in ``CPU_MULTIPLES`` steps: the
  more a model pays per padded position, the finer its lengths. XLNet-Base (510 MFLOP/token): multiples of 2
  (an epoch of SST-2 1.12x shorter than with 8, PERFORMANCE.md "Real text lengths"); a small model (10-100
  MFLOP/token): 8; a tiny one (the tests', the demo's): 16, where compiling a new length costs more than the
  padding it saves (the crossovers as measured: PERFORMANCE.md "Length multiple by model size");
* serving: ``SERVING_MULTIPLE`` (8): its graph is traced once with dynamic dimensions.
"""

from __future__ import annotations

ACCELERATOR_MULTIPLE = 8
SERVING_MULTIPLE = 8
# A CPU's multiple by the model's training FLOPs per token (forward + backward): the first row whose floor the
# model reaches (the measured crossovers; PERFORMANCE.md "Length multiple by model size").
CPU_MULTIPLES = ((100e6, 2), (10e6, 8), (0.0, 16))


def padded_length(n, max_len: int, multiple: int):
    """The smallest multiple of ``multiple`` >= ``n`` (at least one multiple), capped at ``max_len``; for Python
    ints and int tensors alike (the serving graph and ``data.lengths`` share it)."""
    if isinstance(n, int):
        return min(int(max_len), max(1, -(-n // multiple)) * multiple)
    import tensorflow as tf

    n = tf.maximum(tf.cast(n, tf.int32), 1)
    return tf.minimum(int(max_len), (n + multiple - 1) // multiple * multiple)


def train_flops_per_token(config) -> float:
    """Multiply-adds x 2 x 3 (forward and backward) of the blocks' projections and feed-forward per token: the part
    of a step that grows with the padded length (embeddings and heads do not)."""
    attention = 4 * config.d_model * config.n_head * config.d_head
    return 6.0 * config.n_layer * (attention + 2 * config.d_model * config.d_inner)


def default_multiple(config, accelerated: bool) -> int:
    """The length multiple of a run of ``config``'s model: see the module docstring. ``accelerated``: a GPU or
    TPU computes the steps."""
    if accelerated:
        return ACCELERATOR_MULTIPLE
    flops = train_flops_per_token(config)
    return next(multiple for floor, multiple in CPU_MULTIPLES if flops >= floor)
