"""What this host computes natively in 16 bits: bfloat16 matmuls on the CPU (AMX, AVX-512 BF16) and the
compute capability of the visible GPUs.

Plain functions: nothing is detected at import. ``detect()`` reads ``/proc/cpuinfo`` and asks TensorFlow for the
visible GPUs; ``detect(cpuinfo=TEXT, gpus=CAPABILITIES)`` takes both as arguments (tests pass AMX / AVX2 text).

Why it matters (BUILD.md "Mixed precision by host"): oneDNN has bfloat16 kernels only on CPUs with AVX-512
(fast ones with AVX-512 BF16 or AMX); elsewhere TensorFlow falls back to Eigen's emulated bfloat16, which is
slower than float32 (PERFORMANCE.md "bf16 on a host without native bf16"). GPUs compute bfloat16 natively from
compute capability 8.0 (Ampere) and float16 tensor-core matmuls from 7.0 (Volta).
"""

from __future__ import annotations

import dataclasses
import os
from typing import FrozenSet, Optional, Sequence, Tuple

# The compute precisions (Keras policies) every part of the project accepts; stated here only.
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# compute dtype -> the Keras policy computing in it (float32 variables under both mixed policies)
POLICY_OF_DTYPE = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def validate_precision(precision: str) -> str:
    """``precision`` when it is one of PRECISIONS; else a one-line ValueError naming them."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    return precision


def policy_name(model) -> str:
    """The Keras policy a model was built under (float32 when it has none)."""
    return getattr(getattr(model, "dtype_policy", None), "name", "float32")
NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
# Lowest GPU compute capability with native (tensor-core) matmuls in that precision.
GPU_MIN_CAPABILITY = {"mixed_bfloat16": (8, 0), "mixed_float16": (7, 0)}
# Speed relative to float32 on CPUs without native 16-bit matmuls, TF 2.21 with oneDNN on (PERFORMANCE.md: the
# matmuls and XLNet-Base on a 2-core AMD EPYC with AVX2, "bf16 on a host without native bf16"; the SQuAD step
# in the trade-off study).
SLOW_ON_CPU = {
    "mixed_bfloat16": "bfloat16 ran at 0.70x float32 on a 2048x2048 matmul and at 0.82x (CPU time) on an "
                      "XLNet-Base training step",
    "mixed_float16": "float16 ran at 0.65x float32 on a 2048x2048 matmul and at 0.60x on a small SQuAD "
                     "fine-tuning step (whole-step XLA)",
}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, else every CPU), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    """The text of ``path`` ("" where it does not exist, e.g. not Linux)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def cpu_flags(text: str) -> FrozenSet[str]:
    """The CPU feature flags in ``/proc/cpuinfo`` text (``flags : ...`` lines) or ``lscpu`` output
    (``Flags: ...``), lower case; the union over all processors listed."""
    flags = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "flags":
            flags.update(value.lower().split())
    return frozenset(flags)


def gpu_capabilities() -> Tuple[Tuple[int, int], ...]:
    """Compute capabilities (major, minor) of the GPUs TensorFlow sees ((0, 0) where it does not say)."""
    import tensorflow as tf

    caps = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            cap = tf.config.experimental.get_device_details(gpu).get("compute_capability") or (0, 0)
        except (ValueError, RuntimeError):
            cap = (0, 0)
        caps.append((int(cap[0]), int(cap[1])))
    return tuple(caps)


@dataclasses.dataclass(frozen=True)
class Host:
    cpu_flags: FrozenSet[str]
    gpus: Tuple[Tuple[int, int], ...] = ()  # compute capability of each visible GPU

    @property
    def cpu_bf16(self) -> bool:
        """oneDNN has native bfloat16 matmuls on this CPU (AMX or AVX-512 BF16)."""
        return any(f in self.cpu_flags for f in NATIVE_BF16_CPU_FLAGS)

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.cpu_flags

    def native(self, precision: str, device: str = "cpu") -> bool:
        """Whether ``precision``'s matmuls run natively on ``device`` ("cpu" or "gpu": every visible GPU).
        float16 on a CPU counts as not native: TensorFlow's CPU graph kernels have no fast float16 matmul."""
        validate_precision(precision)
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device: expected 'cpu' or 'gpu', got {device!r}")
        if precision == "float32":
            return True
        if device == "gpu":
            return bool(self.gpus) and all(cap >= GPU_MIN_CAPABILITY[precision] for cap in self.gpus)
        return precision == "mixed_bfloat16" and self.cpu_bf16

    def native_precisions(self, device: str = "cpu") -> Tuple[str, ...]:
        """float32 and the 16-bit precisions native on ``device``, in PRECISIONS order."""
        return tuple(p for p in PRECISIONS if self.native(p, device))

    def describe(self) -> str:
        cpu = ("AMX" if self.amx else "AVX-512 BF16") if self.cpu_bf16 else "no native bf16"
        gpus = ", ".join(f"sm_{a}{b}" for a, b in self.gpus) or "none"
        return f"CPU: {cpu}; GPUs: {gpus}"


def detect(cpuinfo: Optional[str] = None, gpus: Optional[Sequence[Tuple[int, int]]] = None) -> Host:
    """This host (``cpuinfo``: /proc/cpuinfo or lscpu text, default the real one; ``gpus``: compute
    capabilities, default those TensorFlow sees)."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    caps = gpu_capabilities() if gpus is None else gpus
    return Host(cpu_flags(text), tuple((int(a), int(b)) for a, b in caps))


def precision_warning(precision: str, host: Host, device: str = "cpu") -> Optional[str]:
    """One line for the user when ``precision`` is slower than float32 on ``device`` of ``host``; else None."""
    if host.native(precision, device):
        return None
    if device == "gpu":
        need = ".".join(map(str, GPU_MIN_CAPABILITY[precision]))
        have = ", ".join(f"{a}.{b}" for a, b in host.gpus) or "none"
        return (f"--precision={precision}: a GPU of compute capability < {need} (found {have}) has no native "
                f"{precision.split('_')[1]} matmuls; expect no speed-up over float32")
    if precision == "mixed_bfloat16":
        return (f"--precision=mixed_bfloat16 on a CPU without native bfloat16 (no amx_bf16 / avx512_bf16 flag): "
                f"TensorFlow emulates it, {SLOW_ON_CPU[precision]} on such a CPU; use --precision=float32 here")
    return (f"--precision={precision} on a CPU: {SLOW_ON_CPU[precision]}; use float32 on a CPU "
            f"(mixed_bfloat16 where the CPU has AMX / AVX-512 BF16)")
