"""``streams``: an inference batch as two independent half-batch forwards in one graph.

On a CPU-only host an inference forward with batch >= MIN_BATCH and at least MIN_TOKENS tokens per half batch
runs as two half-batch forwards: the executor overlaps the two chains, so one half's poorly parallel ops
(attention BatchMatMuls, transposes, the small XLA clusters) run next to the other half's matmuls instead of
leaving a core idle. Every example's computation is unchanged (outputs equal up to oneDNN's blocking of the
smaller matmuls); training is never split (dropout masks and weight gradients stay as they are). Off when a
GPU/TPU is visible or TensorFlow may use one thread only. Measured gain: PERFORMANCE.md "Backbone speed".
"""

from __future__ import annotations

import os

import tensorflow as tf

from xlnet_tf.accel import accelerator_visible

MIN_TOKENS = 256
MIN_BATCH = 4


def host_allows() -> bool:
    if accelerator_visible():
        return False
    threads = tf.config.threading.get_intra_op_parallelism_threads() or (os.cpu_count() or 1)
    return threads >= 2


def use_streams(batch, qlen):
    """Whether an inference forward of [batch, qlen] runs as two streams (Python bool or bool tensor)."""
    rule = (batch >= MIN_BATCH, (batch // 2) * qlen >= MIN_TOKENS)
    return all(rule) if isinstance(batch, int) and isinstance(qlen, int) else tf.logical_and(*rule)


def _halves(forward, inputs):
    """``forward(**inputs)`` on each half of the batch; the output structures concatenated."""
    half = (tf.shape(inputs["input_ids"])[0] + 1) // 2
    shards = [forward(**{k: None if v is None else tf.nest.map_structure(
                  lambda x: tf.convert_to_tensor(x)[:half] if first else tf.convert_to_tensor(x)[half:], v)
                  for k, v in inputs.items()})
              for first in (True, False)]
    return tf.nest.map_structure(lambda a, b: tf.concat([a, b], axis=0), *shards)


def forward(forward_fn, inputs):
    """``forward_fn(**inputs)`` (an inference forward), as two streams where ``use_streams`` says so."""
    ids = tf.convert_to_tensor(inputs["input_ids"])
    batch, qlen = ids.shape[0], ids.shape[1]
    if batch is not None and qlen is not None:  # static shapes: decided when tracing
        return _halves(forward_fn, inputs) if use_streams(batch, qlen) else forward_fn(**inputs)
    shape = tf.shape(ids)
    return tf.cond(use_streams(shape[0], shape[1]), lambda: _halves(forward_fn, inputs),
                   lambda: forward_fn(**inputs))
