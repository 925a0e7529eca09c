"""Optional compiled CPU kernels: XLNet's relative attention as one op at inference, and a forward/backward pair
of ops in training (``rel_attention.cc``).

Build once per machine (``./dev.sh`` does it; needs g++):

    python -m xlnet_tf.accel.kernels build      # writes xlnet_tf/accel/kernels/_rel_attention.so and its stamp
    python -m xlnet_tf.accel.kernels status

The library is compiled with ``-march=native`` for the TensorFlow it was built against. The stamp next to it
records the TensorFlow version, the source's hash and the CPU's instruction-set flags; ``load()`` uses the
library only when all three still match (otherwise the model runs its TensorFlow ops, which compute the same
attention). Nothing is compiled implicitly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from typing import Optional

import tensorflow as tf

from xlnet_tf import hardware

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "rel_attention.cc")
LIBRARY = os.path.join(HERE, "_rel_attention.so")
STAMP = LIBRARY + ".json"
# d_head must be a multiple of the kernel's vector width (16 floats with AVX-512, 8 with AVX2).
D_HEAD_MULTIPLE = 16

_log = logging.getLogger(__name__)
_loaded = None  # None: not tried yet; False: unavailable; else the op module


def _cpu_flags() -> str:
    """A short hash of this CPU's feature flags (a build for other flags is stale); "unknown" without them."""
    flags = hardware.cpu_flags(hardware.read_cpuinfo())
    return hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16] if flags else "unknown"


def expected_stamp() -> dict:
    with open(SOURCE, "rb") as f:
        source = hashlib.sha256(f.read()).hexdigest()[:16]
    return {"tensorflow": tf.__version__, "source_sha256": source, "cpu_flags": _cpu_flags()}


def _read_stamp() -> Optional[dict]:
    try:
        with open(STAMP) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def status() -> str:
    """Why the kernel is or is not used, in one line."""
    if not os.path.exists(LIBRARY):
        return f"not built ({LIBRARY} missing): run `python -m xlnet_tf.accel.kernels build`"
    stamp, want = _read_stamp(), expected_stamp()
    if stamp != want:
        stale = [k for k in want if (stamp or {}).get(k) != want[k]]
        return f"stale build (differs in {', '.join(stale)}): run `python -m xlnet_tf.accel.kernels build`"
    return f"built for TensorFlow {want['tensorflow']} ({LIBRARY})"


def build(compiler: Optional[str] = None) -> str:
    """Compiles ``rel_attention.cc`` for this machine; the library and stamp replace the old ones atomically."""
    cxx = compiler or os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        raise RuntimeError(f"C++ compiler {cxx!r} not found (set CXX); the model runs without the kernel")
    flags = ["-O3", "-march=native", "-shared", "-fPIC", "-Wno-deprecated-declarations"]
    # TensorFlow's bundled Eigen does not compile with GCC 12's AVX512-FP16 types; the kernel does not use them.
    probe = subprocess.run([cxx, "-march=native", "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                           text=True)
    if "__AVX512FP16__" in probe.stdout:
        flags.append("-mno-avx512fp16")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=HERE)
    os.close(fd)
    cmd = [cxx, *flags, SOURCE, "-o", tmp, *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building {SOURCE} failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")
        os.replace(tmp, LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=HERE)
    with os.fdopen(fd, "w") as f:
        json.dump(expected_stamp(), f, indent=1)
    os.replace(tmp, STAMP)
    global _loaded
    _loaded = None
    return LIBRARY


def _no_gradient(op, grad):
    raise ValueError(
        "XlnetRelAttention (the fused inference attention kernel) has no gradient: a gradient was requested through "
        "a forward run with training=False. Call the model with training=True (with dropout 0 if you want "
        "deterministic outputs), or build the model with accelerate=False.")


def load():
    """The op module when a current build exists, else None (logged once)."""
    global _loaded
    if _loaded is None:
        why = status()
        if why.startswith("built"):
            _loaded = tf.load_op_library(LIBRARY)
            tf.RegisterGradient("XlnetRelAttention")(_no_gradient)
        else:
            _log.info("xlnet_tf fused attention kernel %s", why)
            _loaded = False
    return _loaded or None
