"""xlnet-tf: XLNet for TensorFlow 2 / Keras 3.

Public API::

    from xlnet_tf import XLNetConfig, XLNetModel, XLNetTokenizer
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (its version is dynamic)

import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402
import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

# The rooms above the library and the names pyproject.toml's package-dir installs them under.
_ROOMS = {"xlnet_tf.heads": "heads", "xlnet_tf.tasks": "tasks", "xlnet_tf.data": "data"}


class _CheckoutRooms(importlib.abc.MetaPathFinder):
    """In a source checkout that was not installed (``pip install -r requirements.txt``, then ``python
    run_classifier.py`` as the original's users do), the rooms beside this folder answer to the names an install
    gives them, as pyproject.toml's package-dir maps them. Consulted last: an installed package's own rooms, or
    the editable install's finder, always come first."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        room = _ROOMS.get(fullname)
        init = room and _os.path.join(self.root, room, "__init__.py")
        if not init or not _os.path.isfile(init):
            return None
        return importlib.util.spec_from_file_location(fullname, init,
                                                      submodule_search_locations=[_os.path.dirname(init)])


_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and \
        not any(isinstance(f, _CheckoutRooms) for f in _sys.meta_path):
    _sys.meta_path.append(_CheckoutRooms(_root))

from xlnet_tf.config import XLNetConfig  # noqa: E402
from xlnet_tf.tokenizer import XLNetTokenizer  # noqa: E402


def __getattr__(name):  # XLNetModel imports TensorFlow/Keras: only on first use
    if name == "XLNetModel":
        from xlnet_tf.modeling import XLNetModel

        return XLNetModel
    raise AttributeError(name)


__all__ = ["XLNetConfig", "XLNetModel", "XLNetTokenizer", "__version__"]
