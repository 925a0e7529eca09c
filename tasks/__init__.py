"""The task rooms (installed as ``xlnet_tf.tasks``) and the Keras task models users import from here:

    from xlnet_tf.tasks import XLNetClassifier, XLNetQuestionAnswerer, XLNetMultipleChoice

(imported on first use, so ``import xlnet_tf.tasks`` alone loads no TensorFlow). ``import xlnet_tf.tasks`` alone
registers every task model with Keras for ``keras.saving.load_model("x.keras")`` (no ``custom_objects``): at once
when Keras is already imported, else as soon as it is (a load needs Keras). ``load_model(path)`` is Keras' with a
one-line answer for a damaged ``.keras`` file."""

import importlib
import importlib.abc
import importlib.util
import os
import sys
import zipfile

_MODELS = {"XLNetClassifier": "xlnet_tf.tasks.classification.keras_model",
           "XLNetQuestionAnswerer": "xlnet_tf.tasks.squad.keras_model",
           "XLNetMultipleChoice": "xlnet_tf.tasks.race.keras_model"}
__all__ = sorted(_MODELS) + ["load_model"]


def _register() -> None:
    for module in _MODELS.values():  # all of them: a saved file of any task then loads
        importlib.import_module(module)


class _AfterKeras(importlib.abc.MetaPathFinder):
    """Registers the task models right after Keras' own import (unless one of them is what imports Keras: then
    that import registers them all)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("keras")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if "xlnet_tf.tasks.keras_task" not in sys.modules:
                _register()

        spec.loader.exec_module = exec_module
        return spec


if "keras" in sys.modules:
    _register()
elif not any(isinstance(f, _AfterKeras) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterKeras())


def load_model(path, **kwargs):
    """``keras.saving.load_model(path, **kwargs)``, after checking that a ``.keras`` file is a whole zip archive
    (Keras calls a cut one "File not found"): ValueError in one line naming the file."""
    import keras  # (heavy: TensorFlow)

    if str(path).endswith(".keras") and os.path.isfile(path):
        problem = None
        if not zipfile.is_zipfile(path):
            problem = "it is not a zip archive (a .keras file is one): the save was cut short or the copy is damaged"
        else:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            if bad:
                problem = f"its member {bad} is damaged (CRC mismatch)"
        if problem:
            raise ValueError(f"{path}: not a complete .keras file ({os.path.getsize(path):,} bytes): {problem}")
    return keras.saving.load_model(path, **kwargs)


def __getattr__(name):
    if name in _MODELS:
        _register()
        return getattr(importlib.import_module(_MODELS[name]), name)
    raise AttributeError(f"module 'xlnet_tf.tasks' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
