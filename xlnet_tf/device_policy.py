"""Where a run computes and how: the device kind of a strategy, where XLA compiles (``default_jit``), how many
groups update the weights at once, and the warning when a precision is slower than float32 on this host."""

from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from xlnet_tf import hardware

log = logging.getLogger("xlnet_tf.training")


def device_kind(strategy: tf.distribute.Strategy) -> str:
    """"tpu", "gpu" (the strategy's devices, or TensorFlow's placement for the default strategy) or "cpu"."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: TensorFlow's placement, a GPU when there is one
        devices = [d.name for d in tf.config.list_logical_devices("GPU")] or ["CPU:0"]
    return "gpu" if any("GPU" in d.upper() for d in devices) else "cpu"


def default_jit(strategy: tf.distribute.Strategy, precision: str = "float32") -> str:
    """The ``jit_compile=None`` choice (see TrainConfig), measured, not assumed (BUILD.md, "XLA where it pays").
    float16 on a CPU takes the whole step: TF's CPU kernels have no fast float16 matmul (measured: a small model's
    SQuAD run in graph mode had not reached step 20 after 16 min, against 0.7 s/step in float32), while XLA:CPU
    computes 16-bit matmuls in float32. bfloat16 on a CPU keeps forward and backward on the graph: oneDNN's
    bfloat16 kernels (AMX, AVX-512 BF16) exist only there, XLA:CPU does not call them (BUILD.md "Mixed precision
    by host")."""
    if strategy.num_replicas_in_sync != 1 or isinstance(strategy, tf.distribute.TPUStrategy):
        return "off"
    if device_kind(strategy) == "gpu" or precision == "mixed_float16":
        return "step"
    return "update"


def update_groups() -> int:
    """How many XLA clusters update the weights at once under ``jit_compile="update"``: the CPUs this process may
    use, at most 4 (measured on 2 cores, XLNet-Base: 2 and 4 groups alike, 0.12-0.13 s against 0.19-0.23 s as
    one cluster)."""
    return min(4, hardware.usable_cpus())


_WARNED = set()


def check_precision(strategy: tf.distribute.Strategy, precision: str,
                    host: Optional[hardware.Host] = None) -> Optional[str]:
    """Logs (once per process and message) a warning when ``precision`` is slower than float32 on the devices
    of ``strategy`` (``hardware.precision_warning``); returns the message, or None. ``host`` defaults to
    ``hardware.detect()``; TPUs compute bfloat16 natively and are not checked."""
    if precision == "float32":
        return None
    device = device_kind(strategy)
    if device == "tpu":
        return None
    note = hardware.precision_warning(precision, host or hardware.detect(), device)
    if note and note not in _WARNED:
        _WARNED.add(note)
        log.warning(note)
    return note
