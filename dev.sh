#!/usr/bin/env bash
# Set-up + run in one command, on a fresh machine (Python 3.11 and pip are all it needs).
#   ./dev.sh demo [args]   the main job end to end on the embedded default (examples/quickstart.py)
#   ./dev.sh test [args]   the test suite (pytest), with the test-only reference stack installed
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {  # $1: requirements file
  # Bytecode: into a .venv whose packages were never byte-compiled (new, or its first set-up was interrupted) pip
  # installs without compiling (it compiles one file at a time) and compileall writes the same bytecode on every
  # core, beside the kernel build below; its marker says it finished. Later installs compile as usual.
  local started=$SECONDS compiled=.venv/.bytecode-compiled no_compile="" compiling=""
  if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
  [ -e "$compiled" ] || no_compile=--no-compile
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check $no_compile -r "$1" "setuptools>=64" wheel
  # The library itself, editable: `import xlnet_tf` then works from any directory (a script outside the checkout).
  # No build isolation: the build uses the setuptools + wheel above, so this step needs no network.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  if [ -n "$no_compile" ]; then
    # Not the packages' own test suites nor transformers' other model families (~3,600 of ~13,400 files): nothing
    # here imports them, and a module without bytecode still imports (compiled in memory).
    .venv/bin/python -m compileall -q -j 0 -x '/tests/|_test[.]py$|/transformers/models/(?!(xlnet|auto)/|__init__)' \
      "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null 2>&1 &
    compiling=$!
  fi
  # The fused attention kernel (optional: without g++ the model runs its TensorFlow ops; BUILD.md)
  .venv/bin/python -m xlnet_tf.accel.kernels build 2>&1 | grep -v -E '^(WARNING|I0000|E0000|W0000)|cuda|rebuild TensorFlow' \
    || echo "note: fused attention kernel not built; the model uses TensorFlow's ops" >&2
  # (compileall exits non-zero over the odd file no Python 3.11 parses, as pip's own compiling ignores them)
  if [ -n "$compiling" ]; then wait "$compiling" || true; touch "$compiled"; fi
  echo "set-up: $((SECONDS - started)) s${no_compile:+ (bytecode written by compileall)}" >&2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) setup requirements.txt; exec .venv/bin/python examples/quickstart.py "$@" ;;
  test) setup requirements-test.txt; exec .venv/bin/python -m pytest -q "$@" ;;
  *) echo "usage: ./dev.sh demo|test [args]" >&2; exit 2 ;;
esac
