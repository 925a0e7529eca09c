"""SavedModel export: signatures that take RAW STRINGS (tokenised in-graph) and signatures that take ids.

The exported model loads in a fresh process with only ``tensorflow`` and ``tensorflow_text`` imported
(``import tensorflow_text`` registers the SentencePiece op). Every export is written to a temporary directory
and renamed into place, so an interrupted export never damages an earlier one.

The helpers below build the in-graph features of each task's serving module (``tasks/*/serving.py``), which
mirror the task's Python features exactly (the tests compare them on real text).

**Length groups** (``run_in_groups``): a request of mixed lengths is laid out once, padded to its longest (as a
single call would be), then run through the model in at most ``MAX_GROUPS`` calls, each on a group of rows
padded only to the group's own longest, and the answers put back in the request's order. The plan
(``group_plan``): rows sorted by length (stable), their padded lengths on the ``SERVING_MULTIPLE`` grid
(``xlnet_tf/lengths.py``); groups are contiguous runs of that order cut between distinct padded lengths, the cuts
chosen by a small dynamic programme over those distinct lengths (at most ``max_seq_length / 8``, whatever the
batch size) minimising the padded tokens computed plus ``GROUP_COST_TOKENS`` per extra call. A request of one
padded length (batch 1 always) is one group: the whole request, as before. Each group is cut from the request's
layout by gathering its rows and keeping the columns its longest row needs (the trailing ones of a left-padded
layout, the leading ones of a right-padded one), which is exactly the layout padded to that length. Outputs are
the same because padding is masked and positions are relative (``tests/test_lengths.py``, and
``tests/test_serving_groups.py`` for the served answers). In the graph: the plan is a few small ops, the groups a
``tf.while_loop`` around one copy of the model, its outputs in ``TensorArray`` s.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from xlnet_tf import accel, hardware, modeling
from xlnet_tf.fileutil import SAVED_MODEL, SERVING_INFO, atomic_directory, write_json
from xlnet_tf.lengths import SERVING_MULTIPLE, padded_length

SEG_PAD_CLASSIFIER = 4
# At most this many model calls per request (1: the whole request padded to its longest, in one call). Four
# groups keep 86-95% of the padded tokens one call per distinct length would save (SST-2 dev and IMDB test
# batches of 32), and bound the calls a request of 32 distinct lengths makes.
MAX_GROUPS = 4
# What one more model call costs, in padded tokens: a group is split off only when it saves more than this. A call
# reads every weight once whatever its size: XLNet-Base on 2 CPU cores, [1, T] costs ~45 ms + ~1.7 ms per token
# (~26 tokens); both terms grow with the parameter count, so the ratio holds for other sizes.
GROUP_COST_TOKENS = 32


# ---------------------------------------------------------------------------------------------- in-graph layout
def keep_first(rt: tf.RaggedTensor, lengths: tf.Tensor) -> tf.RaggedTensor:
    """Keeps the first ``lengths[i]`` items of row i (all of a shorter row, none for a length <= 0)."""
    keep = _kept(rt, lengths)
    return _rows_from(rt, rt.row_starts(), keep)


def keep_last(rt: tf.RaggedTensor, lengths: tf.Tensor) -> tf.RaggedTensor:
    """Keeps the last ``lengths[i]`` items of row i (all of a shorter row, none for a length <= 0)."""
    keep = _kept(rt, lengths)
    return _rows_from(rt, rt.row_limits() - keep, keep)


def _kept(rt: tf.RaggedTensor, lengths: tf.Tensor) -> tf.Tensor:
    return tf.minimum(tf.maximum(tf.cast(lengths, rt.row_splits.dtype), 0), rt.row_lengths())


def _rows_from(rt: tf.RaggedTensor, starts: tf.Tensor, keep: tf.Tensor) -> tf.RaggedTensor:
    """Row i: ``keep[i]`` items of ``rt``'s row i from its flat position ``starts[i]``; one gather (a ragged boolean
    mask traced ~3,900 more graph ops in the SQuAD + RACE raw-text test, and every served signature traces these)."""
    index = tf.ragged.range(starts, starts + keep, row_splits_dtype=rt.row_splits.dtype)
    return tf.RaggedTensor.from_row_splits(tf.gather(rt.values, index.flat_values), index.row_splits, validate=False)


def batch_length(rt: tf.RaggedTensor, max_len: int, exact_single_row: bool = False) -> tf.Tensor:
    """``padded_batch_length`` of the rows of a ragged [b, (n)] batch of tokens."""
    return padded_batch_length(rt.row_lengths(), max_len, exact_single_row)


def padded_batch_length(lengths: tf.Tensor, max_len: int, exact_single_row: bool = False) -> tf.Tensor:
    """The padded length of a served batch of rows of ``lengths`` [b] tokens: its longest row, rounded up to
    ``SERVING_MULTIPLE`` (``xlnet_tf/lengths.py``); ``exact_single_row``: a request of one row keeps its own length
    (rounding would only add padded tokens to compute)."""
    return padded_length(tf.reduce_max(lengths), max_len, serving_multiple(tf.size(lengths), exact_single_row))


def serving_multiple(rows, exact_single_row: bool = True):
    """The multiple a request of ``rows`` rows is padded to: ``SERVING_MULTIPLE``, or 1 for a single row with
    ``exact_single_row``."""
    if not exact_single_row:
        return SERVING_MULTIPLE
    return tf.where(rows > 1, SERVING_MULTIPLE, 1)


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


# ---------------------------------------------------------------------------------------------- length groups
def group_plan(lengths: tf.Tensor, max_len: Optional[int] = None, multiple: int = SERVING_MULTIPLE,
               max_groups: int = MAX_GROUPS, group_cost: float = 0.0) -> Dict[str, tf.Tensor]:
    """How ``run_in_groups`` splits a request (see the module docstring): rows of ``lengths`` [b] ->
    ``order`` int32 [b] (the rows by length, stable), ``bounds`` int32 [g + 1] (group k is rows
    ``order[bounds[k]:bounds[k + 1]]``) and ``lengths`` int32 [g] (group k's padded length: its longest row rounded
    up to ``multiple``, capped at ``max_len``), 1 <= g <= ``max_groups``. Minimises ``sum(rows x padded length) +
    group_cost x g``; ties go to fewer groups. An empty request is one empty group."""
    lengths = tf.cast(tf.reshape(lengths, [-1]), tf.int32)
    order = tf.argsort(lengths, stable=True)
    cap = 2 ** 30 if max_len is None else int(max_len)
    padded = padded_length(tf.gather(lengths, order), cap, multiple)
    distinct, _, counts = tf.unique_with_counts(padded)                 # ascending: ``padded`` is sorted
    cum = tf.concat([[0], tf.cumsum(counts)], 0)                        # [K + 1] rows below each distinct length
    ends = tf.concat([[padded_length(0, cap, multiple)], distinct], 0)  # a group ending at j pads to ends[j]
    K = tf.size(distinct)

    def cheapest_cuts():  # 0 = c_0 < c_1 < ... < c_g = K: group k holds distinct lengths c_k .. c_(k+1) - 1
        i, j = tf.range(K + 1)[:, None], tf.range(K + 1)[None, :]
        tokens = tf.cast((cum[None, :] - cum[:, None]) * ends[None, :], tf.float64)
        inf = tf.constant(float("inf"), tf.float64)
        cost = tf.where(i < j, tokens + group_cost, tf.where(i == j, tf.zeros_like(tokens), inf))  # rows i..j
        best = tf.concat([[0.0], tf.fill([K], inf)], 0)                   # the cheapest plan ending at j
        choices = []
        for _ in range(max_groups):                                       # unrolled: max_groups small steps
            total = best[:, None] + cost
            # the last minimum: an empty group (i = j) wins a tie
            choices.append(K - tf.argmin(tf.reverse(total, [0]), axis=0, output_type=tf.int32))
            best = tf.reduce_min(total, axis=0)
        cuts = [K]
        for choice in reversed(choices):
            cuts.append(choice[cuts[-1]])
        cuts = tf.stack(cuts[::-1])
        return tf.boolean_mask(cuts, tf.concat([[True], cuts[1:] > cuts[:-1]], 0))

    # One padded length (batch 1 always; an empty request: one empty group): one group, without the search.
    cuts = tf.cond(K > 1, cheapest_cuts, lambda: tf.stack([0, K]))
    return {"order": order, "bounds": tf.gather(cum, cuts), "lengths": tf.gather(ends, cuts[1:])}


def _trim(value: tf.Tensor, length, axis: int, left: bool) -> tf.Tensor:
    """``value`` padded along ``axis`` to ``length``: its last columns (left padding) or its first (right)."""
    if value.shape.rank is None or value.shape.rank <= axis:
        return value
    n = tf.shape(value)[axis]
    length = tf.minimum(length, n)  # a group is never longer than the request's layout (a single exact row)
    return value[(slice(None),) * axis + ((slice(n - length, None),) if left else (slice(0, length),))]


def run_in_groups(run: Callable[[Dict[str, tf.Tensor]], Dict[str, tf.Tensor]], features: Dict[str, tf.Tensor],
                  lengths: tf.Tensor, *, axis: int = 1, left: bool = True, max_len: Optional[int] = None,
                  multiple: int = SERVING_MULTIPLE, unit_tokens: int = 1, max_groups: int = MAX_GROUPS):
    """``run(features)`` computed in length groups (the module docstring), in-graph: ``features`` [b, ...] padded
    along ``axis`` to the request's longest (left or right), ``lengths`` [b] each row's length in that axis'
    units (``unit_tokens`` tokens each: the plan's cost), ``run`` -> a nest of [rows, ...] tensors. Features of
    rank <= ``axis`` are only gathered. ``max_groups`` 1: ``run(features)`` itself."""
    if max_groups <= 1:
        return run(features)
    plan = group_plan(lengths, max_len, multiple, max_groups, GROUP_COST_TOKENS / unit_tokens)
    # ``run`` traced once, for any group's shape: the loop calls it, and its outputs' structure and dtypes size the
    # loop's TensorArrays.
    specs = {k: tf.TensorSpec([None if d in (0, axis) else s for d, s in enumerate(v.shape)], v.dtype)
             for k, v in features.items()}
    traced = tf.function(run, autograph=False).get_concrete_function(specs)
    out_spec = traced.structured_outputs
    flat_spec = tf.nest.flatten(out_spec)
    groups = tf.size(plan["lengths"])

    def body(g, arrays):
        rows = plan["order"][plan["bounds"][g]:plan["bounds"][g + 1]]
        group = {k: _trim(tf.gather(v, rows), plan["lengths"][g], axis, left) for k, v in features.items()}
        return g + 1, [a.write(g, out) for a, out in zip(arrays, tf.nest.flatten(traced(group)))]

    arrays = [tf.TensorArray(s.dtype, size=groups, infer_shape=False,
                             element_shape=tf.TensorShape([None]).concatenate(s.shape[1:])) for s in flat_spec]
    _, arrays = tf.while_loop(lambda g, _: g < groups, body, (tf.constant(0), arrays), parallel_iterations=1)
    back = tf.math.invert_permutation(plan["order"])
    return tf.nest.pack_sequence_as(out_spec, [tf.gather(a.concat(), back) for a in arrays])


# ---------------------------------------------------------------------------------------------- precision
def float32_outputs(outputs: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """The model's floating outputs in float32 (a model under a mixed policy computes in bfloat16/float16):
    serving modules apply it before the head's serving outputs, so clients see float32 whatever the export's
    precision and softmax/top-k run in float32."""
    return {k: tf.cast(v, tf.float32) if v.dtype.is_floating else v for k, v in outputs.items()}


# What a process serving an export needs, by CPU family, as measured (PERFORMANCE.md "Serving at batch 1 against
# ONNX Runtime"); recorded in every export's serving_info.json.
SERVING_PROCESS = {
    "needs": "tensorflow and tensorflow_text only; no thread, oneDNN or precision setting",
    "avx2 (AMD EPYC, no AVX-512)": "TensorFlow's default threads (one inter-op thread measured no faster); "
                                   "TF_ENABLE_ONEDNN_OPTS on or off within 6% (issue 53); float32 (bfloat16 "
                                   "is slower without native bf16)",
    "avx512_bf16 (AMD EPYC, no AMX)": "float32 as above; the bfloat16 export (--export_precision=bfloat16) is "
                                      "1.45-1.73x float32 at batch 32 and on long texts, 0.95x on short texts at "
                                      "batch 1",
}


def serving_info(module: tf.Module) -> Dict:
    """What ``serving_info.json`` records of an export: its compute precision (the model's Keras policy), what a
    serving process needs (``SERVING_PROCESS``), plus what the module adds (``module.extra_serving_info()``, e.g.
    the generation options fixed at export)."""
    policy = hardware.policy_name(getattr(module, "model", None))
    compute = {p: d for d, p in hardware.POLICY_OF_DTYPE.items()}.get(policy, policy)
    info = {"precision": compute, "keras_policy": policy, "variable_dtype": "float32", "output_dtype": "float32",
            "serving_process": dict(SERVING_PROCESS)}
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
    with atomic_directory(export_dir, SAVED_MODEL) as tmp:
        # no compiled kernel in the graph (serving needs TensorFlow only), no Keras default signature (ours only)
        with accel.portable_graph(), modeling.own_signatures():
            tf.saved_model.save(module, tmp, signatures=signatures)
        _check_float32_signatures(tmp)  # before the rename: a refused export writes nothing
        write_json(os.path.join(tmp, SERVING_INFO), serving_info(module))
    return export_dir


class ServingModule(tf.Module):
    """A SavedModel over raw text: subclasses give ``text_fn(**options)`` (``serving_default``) and ``ids_fn()``
    (``serve_ids``, the same outputs from ready-made features). ``max_groups``: the raw-text signatures run a
    request in at most this many length groups (``run_in_groups``; 1: one call, the request padded to its
    longest); set it before ``export``."""

    max_groups = MAX_GROUPS

    def in_groups(self, run, features, lengths, **layout):
        """``run_in_groups`` with this module's ``max_groups``."""
        return run_in_groups(run, features, lengths, max_groups=self.max_groups, **layout)

    def export(self, export_dir: str, **text_options) -> str:
        self.serve_text = self.text_fn(**text_options)
        self.serve_ids = self.ids_fn()
        return save_atomically(self, export_dir, {"serving_default": self.serve_text,
                                                  "serve_ids": self.serve_ids})
