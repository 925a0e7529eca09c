"""Accelerations beside the math: the same formulas as the plain layers, computed faster on a CPU.

A model chooses them with one run option, ``XLNetConfig.accelerate``: True (all that apply on this host),
False (the plain TensorFlow ops of ``xlnet_tf.ops`` and the layers only), or a comma list of names
(``XLNetConfig.accelerations`` reads it):

* ``xla`` (``fusions``): the memory-bound elementwise chains between the matmuls as small XLA clusters with
  hand-written gradients (LayerNorm, dropout with its neighbours, the biased queries, the score chain).
* ``kernels`` (``fused_attention`` and ``kernels/``): a block's whole attention core as compiled CPU ops.
* ``chunks`` (``chunks``): bidirectional attention computed in query chunks.

Each module's docstring gives its measured gain (PERFORMANCE.md "Accelerations"; ``benchmarks/ab_switches.py``
measures one against another, e.g. ``config.accelerate=xla+chunks`` against ``base``). Outputs agree
with the plain ops within float32 rounding (tests/test_fused_attention.py holds it).
"""

from __future__ import annotations

import contextlib
from typing import FrozenSet

import tensorflow as tf

from xlnet_tf import ops
from xlnet_tf.accel import fusions

def accelerator_visible() -> bool:
    """Whether a GPU/TPU is visible (then the graph runs there: the CPU kernels step aside)."""
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


_portable = False


@contextlib.contextmanager
def portable_graph():
    """Functions traced inside use TensorFlow's own ops only (no compiled kernel): for SavedModels."""
    global _portable
    old, _portable = _portable, True
    try:
        yield
    finally:
        _portable = old


def portable() -> bool:
    return _portable


def ops_table(names: FrozenSet[str]):
    """The ops the layers call: ``fusions.FUSED`` with ``xla``, else ``xlnet_tf.ops.PLAIN``."""
    return fusions.FUSED if "xla" in names else ops.PLAIN
