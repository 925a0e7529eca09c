"""Distribution strategies: default (one device), mirrored (GPUs or logical CPUs), multi_worker, tpu.

Logical CPU devices (to test MirroredStrategy on a CPU-only machine) must be configured before TensorFlow
initialises its devices, i.e. before the first op runs: call ``configure_cpu_devices(n)`` (or pass
``num_cpu_devices`` to ``get_strategy``) at the very start of the process.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")


def configure_cpu_devices(n: int) -> None:
    """Splits the first physical CPU into ``n`` logical devices (no-op if already so configured)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) == n:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError as err:
        raise RuntimeError(f"cannot create {n} logical CPU devices: TensorFlow has already initialised its "
                           "devices; configure them at the very start of the process") from err


def get_strategy(name: str = "default", tpu: Optional[str] = None,
                 num_cpu_devices: Optional[int] = None) -> tf.distribute.Strategy:
    """Returns the named strategy.

    * ``default``: the current (default) strategy, one device.
    * ``mirrored``: all GPUs; without GPUs, the logical CPUs (``num_cpu_devices`` creates them).
    * ``multi_worker``: MultiWorkerMirroredStrategy configured from the ``TF_CONFIG`` environment variable.
    * ``tpu``: TPUStrategy on ``tpu`` (name, grpc:// address, or "local"; None: from the environment).
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {name!r}")
    if num_cpu_devices and name != "tpu":
        configure_cpu_devices(int(num_cpu_devices))
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.NotFoundError, tf.errors.UnavailableError,
            tf.errors.InvalidArgumentError) as err:
        raise RuntimeError(f"no TPU available (tpu={tpu!r}): {err}") from err
    return tf.distribute.TPUStrategy(resolver)
