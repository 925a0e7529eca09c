#!/usr/bin/env bash
# Creates a separate virtualenv with TensorFlow Model Garden (tf-models-official) for the `mg` / `mg_noxla`
# peers of benchmarks/backbone.py. It lives OUTSIDE the repository and leaves our own .venv and requirements
# files alone: Model Garden runs on Keras 2 (tf_keras), we run on Keras 3.
#
#   bash benchmarks/setup_peer_model_garden.sh            # -> $HOME/.cache/xlnet_tf_peers/model_garden
#   MG_VENV=/some/dir bash benchmarks/setup_peer_model_garden.sh
#   XLNET_TF_MG_PYTHON=<printed python> python benchmarks/backbone.py   # (the default venv is found anyway)
#
# What goes in (about 2.3 GB):
#   tensorflow==$TF_VERSION (default: the version in the repo's .venv, else 2.21.0) and the matching tf-keras;
#   tf-models-official==2.20.0 WITHOUT its dependencies (its metadata pins tensorflow~=2.20 and pulls in
#   ~25 packages: opencv, pycocotools, kaggle, tensorflow-text, ... none of which the XLNet network needs);
#   then only what `from official.nlp.modeling.networks import XLNetBase` imports: gin-config (via
#   official.nlp.modeling.layers), scipy (layers/mixing.py) and six (official.modeling.tf_utils; TensorFlow
#   brings it too). `pip check` will complain about the rest: expected.
# Re-running is cheap (pip finds everything installed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
MG_VENV="${MG_VENV:-$HOME/.cache/xlnet_tf_peers/model_garden}"
BASE_PYTHON="${MG_BASE_PYTHON:-python3}"
MG_VERSION="${MG_VERSION:-2.20.0}"

if [ -z "${TF_VERSION:-}" ]; then
  TF_VERSION="$("$ROOT/.venv/bin/python" -c 'from importlib.metadata import version; print(version("tensorflow"))' \
                2>/dev/null || echo 2.21.0)"
fi
# tf-keras is released in lock-step with TensorFlow (tf-keras 2.21.x requires tensorflow >=2.21,<2.22).
TF_MINOR="$(echo "$TF_VERSION" | cut -d. -f1,2)"

echo "Model Garden peer venv: $MG_VENV (tensorflow==$TF_VERSION, tf-keras~=$TF_MINOR.0, tf-models-official==$MG_VERSION)"
if [ ! -x "$MG_VENV/bin/python" ]; then
  mkdir -p "$(dirname "$MG_VENV")"
  "$BASE_PYTHON" -m venv "$MG_VENV"
fi
PY="$MG_VENV/bin/python"
"$PY" -m pip install -q "tensorflow==$TF_VERSION" "tf-keras~=$TF_MINOR.0"
"$PY" -m pip install -q --no-deps "tf-models-official==$MG_VERSION"
"$PY" -m pip install -q gin-config scipy six

# The import the benchmark worker does (fails here, not in the middle of a benchmark, if something is missing),
# with the worker's TF_USE_LEGACY_KERAS=1 (tf.keras = tf_keras; Keras 3 is then not loaded).
TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 "$PY" - <<'EOF'
import sys
from importlib.metadata import version

import tensorflow as tf
import tf_keras
from official.modeling import activations  # noqa: F401
from official.nlp.modeling.networks import XLNetBase  # noqa: F401

assert "keras" not in sys.modules, "Keras 3 was imported"
print("ok: " + ", ".join(f"{d} {version(d)}" for d in ("tensorflow", "tf-keras", "tf-models-official",
                                                        "gin-config", "scipy", "numpy")))
EOF
echo "Model Garden python: $PY"
echo "use: XLNET_TF_MG_PYTHON=$PY python benchmarks/backbone.py --impls tf,mg,torch"
