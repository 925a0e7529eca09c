"""The task rooms (installed as ``xlnet_tf.tasks``) and the Keras task models users import from here:

    from xlnet_tf.tasks import XLNetClassifier, XLNetQuestionAnswerer, XLNetMultipleChoice

(imported on first use, so ``import xlnet_tf.tasks`` alone loads no TensorFlow; importing one of them registers
every task model with Keras, so ``keras.saving.load_model("x.keras")`` needs no ``custom_objects``)."""

_MODELS = {"XLNetClassifier": "xlnet_tf.tasks.classification.keras_model",
           "XLNetQuestionAnswerer": "xlnet_tf.tasks.squad.keras_model",
           "XLNetMultipleChoice": "xlnet_tf.tasks.race.keras_model"}
__all__ = sorted(_MODELS)


def __getattr__(name):
    if name in _MODELS:
        import importlib

        for module in _MODELS.values():  # all of them: a saved file of any task then loads
            importlib.import_module(module)
        return getattr(importlib.import_module(_MODELS[name]), name)
    raise AttributeError(f"module 'xlnet_tf.tasks' has no attribute {name!r}")
