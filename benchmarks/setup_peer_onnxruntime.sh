#!/usr/bin/env bash
# Installs ONNX Runtime, the `ort` / `ort_int8` serving peers of benchmarks/real_lengths.py, into the repo's .venv.
# A benchmark-only dependency: not in requirements*.txt, and nothing under xlnet_tf/ imports it.
#
#   bash benchmarks/setup_peer_onnxruntime.sh
#   .venv/bin/python benchmarks/real_lengths.py --training 0 --hf_threads 2 --hf_variants hf --ort_variants ort,ort_int8
#
# What goes in: onnxruntime (CPU provider, the inference session and onnxruntime.quantization's dynamic int8),
# onnx (the exported graph's format) and onnxscript (what torch.onnx.export's exporter writes the graph with).
# The HF model is exported by the .venv's own torch + transformers (requirements-test.txt). Re-running is cheap.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
"$PY" -m pip install -q onnxruntime onnx onnxscript
"$PY" - <<'PYEOF'
from importlib.metadata import version

import onnx  # noqa: F401
import onnxruntime
from onnxruntime.quantization import quantize_dynamic  # noqa: F401

print("ok: " + ", ".join(f"{d} {version(d)}" for d in ("onnxruntime", "onnx", "onnxscript", "torch",
                                                        "transformers")),
      "providers:", onnxruntime.get_available_providers())
PYEOF
