"""``pip install .`` installs the model library ``xlnet_tf`` with the rooms above it inside its namespace
(``xlnet_tf.heads``, ``xlnet_tf.tasks``, ``xlnet_tf.data``) and nothing else: installed into a temporary target with
no network, every module imports from a directory outside the checkout, with no top-level ``tasks``, ``heads``,
``data`` or ``run_*`` on the path, and the installed model runs."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # every test here runs a CLI or a subprocess

CHECK = """
import importlib, os, pkgutil, sys
import xlnet_tf
print(xlnet_tf.__file__)
for m in pkgutil.walk_packages(xlnet_tf.__path__, "xlnet_tf."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
rooms = sorted(n for n in sys.modules if n.split(".")[0] in ("tasks", "heads", "data", "run_common", "run_state"))
print("rooms:", rooms)
print("installed rooms:", sorted(n for n in ("xlnet_tf.heads.classification", "xlnet_tf.tasks.squad.serving",
                                             "xlnet_tf.data.tfrecord_io") if n in sys.modules))
from xlnet_tf import XLNetConfig, XLNetModel
from xlnet_tf.accel import kernels
print("kernel source:", os.path.isfile(kernels.SOURCE))
m = XLNetModel(XLNetConfig.preset("tiny", n_token=50), seed=0)
import numpy as np
print("output:", tuple(m(np.array([[5, 6, 7]], np.int32))["sequence_output"].shape))
from xlnet_tf.tasks import XLNetClassifier, XLNetMultipleChoice, XLNetQuestionAnswerer
print("task models:", XLNetClassifier.__module__, XLNetQuestionAnswerer.__module__, XLNetMultipleChoice.__module__)
"""


def test_pip_install_gives_the_library_importable_outside_the_checkout(tmp_path):
    src = tmp_path / "src"  # a copy: pip builds in the source tree (build/, *.egg-info), not in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    for room in ("xlnet_tf", "heads", "tasks", "data"):
        shutil.copytree(os.path.join(REPO, room), src / room,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.so.json", "tmp*"))
    target = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--disable-pip-version-check", "--target", str(target), str(src)],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) == ["xlnet_tf"]
    meta = next(target.glob("xlnet_tf-*.dist-info")) / "METADATA"
    import xlnet_tf  # the version is defined once, in the package, and read by the build

    assert f"Version: {xlnet_tf.__version__}" in meta.read_text().splitlines()
    requires = [l.split(":", 1)[1].strip() for l in meta.read_text().splitlines() if l.startswith("Requires-Dist:")]
    assert any(r.startswith("safetensors") for r in requires) and any(r.startswith("tensorflow<") for r in requires)

    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(env, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="2"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith(str(target) + os.sep), lines[0]
    assert "installed rooms: ['xlnet_tf.data.tfrecord_io', 'xlnet_tf.heads.classification', " \
           "'xlnet_tf.tasks.squad.serving']" in lines, r.stdout
    assert ("task models: xlnet_tf.tasks.classification.keras_model xlnet_tf.tasks.squad.keras_model "
            "xlnet_tf.tasks.race.keras_model") in lines, r.stdout
    assert "rooms: []" in lines and "kernel source: True" in lines and "output: (1, 3, 64)" in lines, r.stdout
