"""xlnet-tf: XLNet for TensorFlow 2 / Keras 3.

Public API::

    from xlnet_tf import XLNetConfig, XLNetModel, XLNetTokenizer
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (its version is dynamic)

from xlnet_tf.config import XLNetConfig  # noqa: E402
from xlnet_tf.tokenizer import XLNetTokenizer  # noqa: E402


def __getattr__(name):  # XLNetModel imports TensorFlow/Keras: only on first use
    if name == "XLNetModel":
        from xlnet_tf.modeling import XLNetModel

        return XLNetModel
    raise AttributeError(name)


__all__ = ["XLNetConfig", "XLNetModel", "XLNetTokenizer", "__version__"]
