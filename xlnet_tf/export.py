"""SavedModel export: signatures that take RAW STRINGS (tokenised in-graph) and signatures that take ids.

The exported model loads in a fresh process with only ``tensorflow`` and ``tensorflow_text`` imported
(``import tensorflow_text`` registers the SentencePiece op). Every export is written to a temporary directory
and renamed into place, so an interrupted export never damages an earlier one.

The helpers below build the in-graph features of each task's serving module (``tasks/*/serving.py``), which
mirror the task's Python features exactly (the tests compare them on real text).
"""

from __future__ import annotations

import os
from typing import Callable, Dict

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from xlnet_tf import accel, hardware
from xlnet_tf.fileutil import atomic_directory, write_json
from xlnet_tf.lengths import SERVING_MULTIPLE, padded_length

SEG_PAD_CLASSIFIER = 4


# ---------------------------------------------------------------------------------------------- in-graph layout
def keep_first(rt: tf.RaggedTensor, lengths: tf.Tensor) -> tf.RaggedTensor:
    """Keeps the first ``lengths[i]`` items of row i."""
    lengths = tf.minimum(tf.cast(lengths, tf.int64), rt.row_lengths())
    mask = tf.ragged.range(rt.row_lengths()) < lengths[:, None]
    return tf.ragged.boolean_mask(rt, mask)


def keep_last(rt: tf.RaggedTensor, lengths: tf.Tensor) -> tf.RaggedTensor:
    """Keeps the last ``lengths[i]`` items of row i."""
    n = rt.row_lengths()
    lengths = tf.minimum(tf.cast(lengths, tf.int64), n)
    mask = tf.ragged.range(n) >= (n - lengths)[:, None]
    return tf.ragged.boolean_mask(rt, mask)


def batch_length(rt: tf.RaggedTensor, max_len: int) -> tf.Tensor:
    """The padded length of a served batch of token rows: its longest row, rounded up to ``SERVING_MULTIPLE``
    (``xlnet_tf/lengths.py``)."""
    return padded_length(tf.reduce_max(rt.row_lengths()), max_len, SERVING_MULTIPLE)


def pad_rows(rt: tf.RaggedTensor, length, value, left: bool) -> tf.Tensor:
    """Ragged [b, None] -> dense [b, length], padded on the left or the right (rows must fit); ``length`` may
    be a tensor (``batch_length``)."""
    if isinstance(length, int):
        dense = rt.to_tensor(default_value=value, shape=[None, length])
    else:
        dense = rt.to_tensor(default_value=value)
        dense = tf.pad(dense, [[0, 0], [0, length - tf.shape(dense)[1]]], constant_values=tf.cast(value, dense.dtype))
    if not left:
        return dense
    n = tf.cast(rt.row_lengths(), tf.int32)
    src = tf.range(length)[None, :] - (length - n)[:, None]
    gathered = tf.gather(dense, tf.maximum(src, 0), batch_dims=1)
    return tf.where(src >= 0, gathered, tf.cast(value, dense.dtype))


def constant_rows(batch, value, dtype=tf.int32) -> tf.RaggedTensor:
    return tf.RaggedTensor.from_tensor(tf.fill(tf.stack([batch, 1]), tf.cast(value, dtype)))


# ---------------------------------------------------------------------------------------------- precision
def float32_outputs(outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """The model's floating outputs in float32 (a model under a mixed policy computes in bfloat16/float16):
    serving modules apply it before the head's serving outputs, so clients see float32 whatever the export's
    precision and softmax/top-k run in float32."""
    return {k: tf.cast(v, tf.float32) if v.dtype.is_floating else v for k, v in outputs.items()}


def serving_info(module: tf.Module) -> Dict:
    """What ``serving_info.json`` records of an export: its compute precision (the model's Keras policy), plus
    what the module adds (``module.extra_serving_info()``, e.g. the generation options fixed at export)."""
    policy = hardware.policy_name(getattr(module, "model", None))
    compute = {p: d for d, p in hardware.POLICY_OF_DTYPE.items()}.get(policy, policy)
    info = {"precision": compute, "keras_policy": policy, "variable_dtype": "float32", "output_dtype": "float32"}
    extra = getattr(module, "extra_serving_info", None)
    return dict(info, **extra()) if extra else info


def _check_float32_signatures(saved_model_dir: str) -> None:
    """Reads the written signatures (no retrace: a trace outside the save context would be a second one)."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    for name, sig in proto.meta_graphs[0].signature_def.items():
        for key, info in sig.outputs.items():
            if not info.dtype:  # a composite output (no single dtype)
                continue
            dtype = tf.dtypes.as_dtype(info.dtype)
            if dtype.is_floating and dtype != tf.float32:
                raise TypeError(f"signature {name!r} output {key!r} is {dtype.name}: serving outputs are float32 "
                                f"(apply xlnet_tf.export.float32_outputs)")


# ---------------------------------------------------------------------------------------------- writing
def save_atomically(module: tf.Module, export_dir: str, signatures: Dict[str, Callable]) -> str:
    """tf.saved_model.save into a temp dir next to ``export_dir``, then rename over it. ``serving_info.json``
    next to ``saved_model.pb`` records the export's compute precision (``serving_info``)."""
    with atomic_directory(export_dir) as tmp:
        with accel.portable_graph():  # no compiled kernel in the graph: serving needs TensorFlow only
            tf.saved_model.save(module, tmp, signatures=signatures)
        _check_float32_signatures(tmp)  # before the rename: a refused export writes nothing
        write_json(os.path.join(tmp, "serving_info.json"), serving_info(module))
    return export_dir


class ServingModule(tf.Module):
    """A SavedModel over raw text: subclasses give ``text_fn(**options)`` (``serving_default``) and ``ids_fn()``
    (``serve_ids``, the same outputs from ready-made features)."""

    def export(self, export_dir: str, **text_options) -> str:
        self.serve_text = self.text_fn(**text_options)
        self.serve_ids = self.ids_fn()
        return save_atomically(self, export_dir, {"serving_default": self.serve_text,
                                                  "serve_ids": self.serve_ids})
