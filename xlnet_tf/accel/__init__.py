"""Accelerations beside the math: the same formulas as the plain layers, computed faster on a CPU.

A model chooses them with one run option, ``XLNetConfig.accelerate``: True (all that apply on this host),
False (the plain TensorFlow ops of ``xlnet_tf.ops`` and the layers only), or a comma list of names
(``XLNetConfig.accelerations`` reads it):

* ``xla`` (``fusions``): the memory-bound elementwise chains between the matmuls as small XLA clusters with
  hand-written gradients (LayerNorm, dropout with its neighbours, the biased queries, the score chain); training
  passes only (``training=True``): inference runs the plain ops.
* ``kernels`` (``fused_attention`` and ``kernels/``): a block's whole attention core as compiled CPU ops.
* ``chunks`` (``chunks``): bidirectional attention computed in query chunks.

What applies to a forward pass is decided here and only here, by ``choose`` (called once per
``XLNetModel.call`` through ``xlnet_tf.path_choice.choose``; the layers read the ``Paths`` it returns from their inputs
and import nothing from here). Each module's docstring gives its measured
gain (PERFORMANCE.md "Accelerations"; ``benchmarks/ab_switches.py`` measures one against another). Outputs agree
with the plain ops within float32 rounding (tests/test_fused_attention.py holds it).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Callable, Optional

import tensorflow as tf

from xlnet_tf import attention, ops
from xlnet_tf.accel import chunks, fusions, kernels
from xlnet_tf.accel.fused_attention import CompiledAttention
from xlnet_tf.paths import Paths

_log = logging.getLogger(__name__)
_portable = False
_logged = set()


@contextlib.contextmanager
def portable_graph():
    """Functions traced inside use TensorFlow's own ops only (no compiled kernel): for SavedModels."""
    global _portable
    old, _portable = _portable, True
    try:
        yield
    finally:
        _portable = old


def accelerator_visible() -> bool:
    """Whether a GPU/TPU is visible (then the graph runs there: the CPU kernels step aside)."""
    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # cannot tell: stay on TensorFlow ops
        return True
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def kernel_refusal(config, compute_dtype: str, per_example_pos_dropout: bool, xla: bool, accelerator: bool,
                   library: Callable[[], Optional[str]], portable: bool = False) -> Optional[str]:
    """The kernel rule, its one home (``choose`` asks it for each trace, ``xlnet_tf.ram.fused_attention_applies``
    for a training step it estimates): why the compiled attention may not run, or None when it may. The facts:
    ``compute_dtype`` (a name), ``per_example_pos_dropout`` (each example its own projected encodings), ``xla``
    (inside an XLA-compiled function), ``accelerator`` (a GPU/TPU visible), ``portable`` (SavedModel tracing) and
    ``library()``: why the built library cannot be used, or None (asked last: loading it is the costly fact)."""
    if "kernels" not in config.accelerations:
        return "not selected"
    if portable:
        return "SavedModel tracing (portable_graph)"
    if compute_dtype != "float32":
        return f"compute dtype {compute_dtype} (float32 only)"
    if config.d_head % kernels.D_HEAD_MULTIPLE:
        return f"d_head {config.d_head} is not a multiple of {kernels.D_HEAD_MULTIPLE}"
    if config.bi_data:
        return "bi_data"
    if per_example_pos_dropout:
        return "per-example positional dropout (each example has its own projected encodings)"
    if xla:
        return "inside an XLA-compiled function"
    if accelerator:
        return "a GPU/TPU is visible"
    return library()


def _library_loads() -> Optional[str]:
    return kernels.status() if kernels.load() is None else None


def library_present() -> Optional[str]:
    """The library fact without loading it (the RAM estimator's): None when the built library exists."""
    return None if os.path.exists(kernels.LIBRARY) else kernels.status()


def choose(config, dtype, training: bool, per_example_pos_dropout: bool) -> Paths:
    """The accelerations of one forward pass: ``config.accelerations`` less what cannot apply to this trace
    (compute ``dtype``; ``per_example_pos_dropout``: dropout on the encodings with a mask per example), as the
    ``Paths`` the layers take. Logged once per trace (once per distinct choice when eager)."""
    names = config.accelerations
    # The XLA clusters pay in training passes only: at inference they measure no faster than the plain ops
    # (XLNet-Base) and compile again for every new batch shape, a served request's first call at each length
    # included (PERFORMANCE.md "Accelerations"). In training they stay at every size: besides their speed they make
    # the step bitwise the same from process to process, which a killed run's exact resume relies on; the plain ops
    # are not with TensorFlow's default thread pools (two identical 12-step runs differed in a projection kernel's
    # Adam slots; with one intra-op or one inter-op thread they were equal).
    fused = "xla" in names and training
    table = fusions.FUSED if fused else ops.PLAIN
    chunk = chunks.CHUNK if "chunks" in names and config.attn_type == "bi" else 0
    refusal = kernel_refusal(config, tf.as_dtype(dtype).name, per_example_pos_dropout, xla=_in_xla_context(),
                             accelerator=accelerator_visible(), library=_library_loads, portable=_portable)
    kernel = CompiledAttention(kernels.load()) if refusal is None else None
    core = fusions.rel_attn_core if fused else None
    if chunk:
        core = chunks.chunked(core or attention.rel_attn_core, chunk)
    where = (f"kernels ({'training' if training else 'inference'} ops)" if kernel is not None
             else f"graph (no kernels: {refusal})")
    rows = f"query chunks of {chunk} rows (from {2 * chunk} rows on)" if chunk else "one piece"
    why = f"ops {table.name}; attention {where}, {rows}"
    if not tf.executing_eagerly() or why not in _logged:
        _logged.add(why)
        _log.info("xlnet_tf accelerations: %s", why)
    return Paths(ops=table, core=core, kernel=kernel, chunk=chunk, why=why)
