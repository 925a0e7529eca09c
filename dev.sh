#!/usr/bin/env bash
# Set-up + run in one command, on a fresh machine (Python 3.11 and pip are all it needs).
#   ./dev.sh demo [args]   the main job end to end on the embedded default (examples/quickstart.py)
#   ./dev.sh test [args]   the test suite (pytest), with the test-only reference stack installed
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {  # $1: requirements file
  if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$1" "setuptools>=64" wheel
  # The library itself, editable: `import xlnet_tf` then works from any directory (a script outside the checkout).
  # No build isolation: the build uses the setuptools + wheel above, so this step needs no network.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  # The fused attention kernel (optional: without g++ the model runs its TensorFlow ops; BUILD.md)
  .venv/bin/python -m xlnet_tf.accel.kernels build 2>&1 | grep -v -E '^(WARNING|I0000|E0000|W0000)|cuda|rebuild TensorFlow' \
    || echo "note: fused attention kernel not built; the model uses TensorFlow's ops" >&2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) setup requirements.txt; exec .venv/bin/python examples/quickstart.py "$@" ;;
  test) setup requirements-test.txt; exec .venv/bin/python -m pytest -q "$@" ;;
  *) echo "usage: ./dev.sh demo|test [args]" >&2; exit 2 ;;
esac
