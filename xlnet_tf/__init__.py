"""xlnet-tf: XLNet for TensorFlow 2 / Keras 3.

Public API::

    from xlnet_tf import XLNetConfig, XLNetModel, XLNetTokenizer
"""

import os as _os

# oneDNN doubles float32 matmul speed on the AMD CPUs we measured and is off by default there; it must be set
# before TensorFlow is imported. Users can still force it off with TF_ENABLE_ONEDNN_OPTS=0.
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from xlnet_tf.config import XLNetConfig  # noqa: E402
from xlnet_tf.tokenizer import XLNetTokenizer  # noqa: E402


def __getattr__(name):  # XLNetModel imports TensorFlow/Keras: only on first use
    if name == "XLNetModel":
        from xlnet_tf.modeling import XLNetModel

        return XLNetModel
    raise AttributeError(name)


__all__ = ["XLNetConfig", "XLNetModel", "XLNetTokenizer"]
