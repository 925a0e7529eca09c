"""The padded-length rule, in one place: every batch (training, evaluation, prediction, serving) is padded to its
longest example, rounded up to a multiple. ``data/lengths.py`` applies it to tf.data batches, the exported
serving graphs (``xlnet_tf/export.py``) to each request.

Why a multiple, and which: a batch length not met before costs once (the training step's small XLA clusters
compile for the new shape; a GPU/TPU's whole-step XLA compiles the whole step), while every padded position
costs the model's per-token work in every step. So:

* a GPU or TPU (whole-step XLA per shape): ``ACCELERATOR_MULTIPLE`` (8, a bounded set of ``L / 8`` shapes);
* a CPU: by the model's training cost per token (``train_flops_per_token``). A model at least
  ``CPU_FINE_FLOPS`` per token pays more for padding than for compiling: multiples of 2 (XLNet-Base, SST-2:
  an epoch 1.12x shorter than with 8, PERFORMANCE.md "Real text lengths"); a smaller one compiles more than it
  pads: multiples of ``CPU_SMALL_MODEL_MULTIPLE`` (the crossover as measured: PERFORMANCE.md "Length multiple
  by model size");
* serving: ``SERVING_MULTIPLE`` (8): its graph is traced once with dynamic dimensions.
"""

from __future__ import annotations

ACCELERATOR_MULTIPLE = 8
SERVING_MULTIPLE = 8
# Training FLOPs per token (forward + backward) at and above which a CPU rounds lengths to 2 rather than
# CPU_SMALL_MODEL_MULTIPLE (the measured crossover; PERFORMANCE.md "Length multiple by model size").
CPU_FINE_FLOPS = 20e6
CPU_SMALL_MODEL_MULTIPLE = 16


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
    return 2 if train_flops_per_token(config) >= CPU_FINE_FLOPS else CPU_SMALL_MODEL_MULTIPLE
