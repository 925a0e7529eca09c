"""The original's TensorFlow checkpoint files (TF1 Saver's V2 format, also our own format's weights): find one
from a path, read tensors by name, check that one reads whole, write one. ``CheckpointError`` is the one error
every checkpoint reader raises (a file that does not fit, names what and where)."""

from __future__ import annotations

import glob
import os
import re
from typing import List, Mapping, Optional, Tuple

import numpy as np

PREFIX = "model/transformer/"  # the original checkpoint's backbone names start with it
CKPT_NAME = "xlnet_model.ckpt"  # our own format's weights inside its directory


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the variable, the expected and the found shape."""


def write_tf_checkpoint(prefix: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Writes a name-keyed TF checkpoint (the TF1 Saver's V2 format) at ``prefix``."""
    import tensorflow as tf

    names = list(tensors)
    with tf.device("CPU:0"):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(tensors[n]) for n in names])


def find_tf_checkpoint(path: str) -> Optional[str]:
    """A checkpoint prefix from a prefix, an .index file or a directory; None if there is none."""
    import tensorflow as tf

    if path.endswith(".index") and os.path.isfile(path):
        return path[: -len(".index")]
    if os.path.isfile(path + ".index"):
        return path
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        idx = sorted(glob.glob(os.path.join(path, "*.index")))
        if len(idx) == 1:
            return idx[0][: -len(".index")]
        if len(idx) > 1:
            named = [i for i in idx if os.path.basename(i) == CKPT_NAME + ".index"]
            if named:
                return named[0][: -len(".index")]
            raise CheckpointError(f"{path}: several checkpoints inside ({[os.path.basename(i) for i in idx]}); "
                                  f"pass the prefix of one")
    return None


class TFCheckpointReader:
    """Reads tensors by name from a TF checkpoint; tolerates a leading scope (e.g. an Estimator's)."""

    def __init__(self, prefix: str):
        import tensorflow as tf

        try:
            self.reader = tf.train.load_checkpoint(prefix)
        except Exception as e:  # noqa: BLE001 - TF raises several types here
            raise CheckpointError(f"{prefix}: not a readable TF checkpoint ({e})") from None
        self.prefix = prefix
        self.shapes = self.reader.get_variable_to_shape_map()

    def names(self) -> List[str]:
        return sorted(self.shapes)

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        return tuple(self.shapes[name]) if name in self.shapes else None

    def get(self, name: str) -> Optional[np.ndarray]:
        if name not in self.shapes:
            return None
        import tensorflow as tf

        try:
            return self.reader.get_tensor(name)
        except (IndexError, tf.errors.OpError) as e:  # a truncated or corrupted data file
            raise damage_error(self.prefix, e, name) from None


def _tf_message(e: BaseException) -> str:
    """TensorFlow's error text on one line, without its op and function decorations."""
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:\w+\]", "", str(e))
    return " ".join(text.split()) or type(e).__name__


def damage_error(prefix: str, error: BaseException, tensor: Optional[str] = None) -> CheckpointError:
    """The one-line error of a checkpoint whose data cannot be read back (``error``: what TensorFlow raised reading
    ``tensor``): its data file and what is wrong with it."""
    files = sorted(glob.glob(glob.escape(prefix) + ".data-*"))
    where = files[0] if len(files) == 1 else prefix + ".data-*"
    what = f"tensor {tensor!r}" if tensor else "a tensor"
    detail = _tf_message(error)
    if isinstance(error, IndexError) or "Read less bytes than requested" in detail:
        size = f"{os.path.getsize(where):,} bytes" if len(files) == 1 else "a data file"
        return CheckpointError(f"{where}: damaged checkpoint: truncated ({size}, {what} ends beyond it)")
    if "Checksum does not match" in detail:
        return CheckpointError(f"{where}: damaged checkpoint: corrupted ({what} fails its checksum)")
    if not files:
        return CheckpointError(f"{prefix}: damaged checkpoint: no data file ({prefix}.data-*) beside its index")
    return CheckpointError(f"{where}: damaged checkpoint: {what} cannot be read ({detail})")


def check_readable(prefix: str) -> None:
    """Reads every tensor of the TF checkpoint at ``prefix`` back once, one at a time (TensorFlow checks each
    one's length and CRC32C); a checkpoint that does not read whole raises ``damage_error`` (its file and what is
    wrong). The trainer calls it on the checkpoint it resumes from before restoring anything."""
    import tensorflow as tf

    if not os.path.isfile(prefix + ".index"):
        raise CheckpointError(f"{prefix}.index: damaged checkpoint: its index file is missing")
    try:
        dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    except (IndexError, tf.errors.OpError) as e:
        raise CheckpointError(f"{prefix}.index: damaged checkpoint: not a readable index ({_tf_message(e)})") from None
    for name, dtype in sorted(dtypes.items()):
        try:
            with tf.device("CPU:0"):
                tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name], shape_and_slices=[""], dtypes=[dtype])
        except (IndexError, tf.errors.OpError) as e:
            raise damage_error(prefix, e, name) from None
