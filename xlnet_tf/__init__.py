"""xlnet-tf: XLNet for TensorFlow 2 / Keras 3.

Public API::

    from xlnet_tf import XLNetConfig, XLNetModel, XLNetTokenizer
"""

from xlnet_tf.config import XLNetConfig
from xlnet_tf.tokenizer import XLNetTokenizer


def __getattr__(name):  # XLNetModel imports TensorFlow/Keras: only on first use
    if name == "XLNetModel":
        from xlnet_tf.modeling import XLNetModel

        return XLNetModel
    raise AttributeError(name)


__all__ = ["XLNetConfig", "XLNetModel", "XLNetTokenizer"]
