"""Exports in Keras' format names (``XLNetTask.export(path, format=...)``, ``--export_format``): one function per
format, each from the same serving module as the SavedModel (``ClassifierServing``: its ``serve_ids`` graph and
its layout constants), each written to a temporary folder and renamed into place with a ``serving_info.json``.

* ``tf_saved_model``: the SavedModel (``ServingModule.export``), the default.
* ``onnx``: ``model.onnx`` (the ids graph through tf2onnx without tf2onnx's own graph optimizers: its
  ``reshape_optimizer`` resolves the relative attention's head split to a shape ONNX Runtime rejects, and its
  passes copy the graph at every step, 7.4 GB peak for a 2-layer d_model 768 model; ONNX Runtime optimizes the
  graph itself when it loads it) and
  ``tokenizer.onnx`` (onnxruntime-extensions' ``SentencepieceTokenizer`` over the export's spiece.model bytes).
* ``openvino``: ``model.xml/.bin`` (``openvino.convert_model`` of the ids graph, weights kept float32, each
  LayerNorm's normalisation one ``MVN`` node: ``layer_norms_as_mvn``; the shape arithmetic every layer repeats
  computed once: ``shape_arithmetic_shared``) and
  ``tokenizer.xml/.bin`` (openvino-tokenizers' ``SentencepieceTokenizer`` over the same bytes).

Both carry ``serve.py`` (``tasks/serve_runtime.py``: text normalisation, the digit-comma rule, the layout and
the length groups, in numpy; the same names in and out as ``serving_default``), ``layout.json`` (its constants)
and ``pieces.json`` (the vocabulary). Served with their runtime only: neither TensorFlow nor xlnet_tf.
Written for the classifier, RACE (``RaceServing``: ``serving_default(article, question, options)``) and SQuAD
(``SquadServing``: its ``serve_ids`` on right-padded windows in the graph; the pieces' character offsets, the
windows and the answer search in ``serve.py``). What they do not hold is refused in one line before any work:
memory mode (its window loop), and ``litert`` (XLNet's in-graph SentencePiece and dynamic lengths have no TFLite
builtin).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from typing import Dict, Optional

import numpy as np

from xlnet_tf.fileutil import SAVED_MODEL, SERVING_INFO, Written, atomic_directory, write_json
from xlnet_tf.lengths import SERVING_MULTIPLE

FORMATS = ("tf_saved_model", "onnx", "openvino")
REFUSED = {"litert": "XLNet's in-graph SentencePiece and dynamic lengths have no TFLite builtin ops"}
# What each format needs to be written and served (the pip extras of pyproject.toml).
NEEDS = {"onnx": ("tf2onnx", "onnx", "onnxruntime", "onnxruntime_extensions"),
         "openvino": ("openvino", "openvino_tokenizers")}
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_runtime.py")
ONNX_OPSET = 17
# What each format's folder holds (fileutil.Written): only an earlier export of that format is replaced.
_RUNNER_FILES = {"serve.py", "layout.json", "pieces.json", SERVING_INFO}
WRITTEN = {"tf_saved_model": SAVED_MODEL,
           "onnx": Written("ONNX export", marks={"model.onnx", "tokenizer.onnx"} | _RUNNER_FILES, names={"__pycache__"}),
           "openvino": Written("OpenVINO export", marks={"model.xml", "model.bin", "tokenizer.xml"} | _RUNNER_FILES,
                               names={"tokenizer.bin", "__pycache__"})}
# The serving modules these formats are written for (the runner's ``layout["task"]``).
TASKS = {"ClassifierServing": "classifier", "RaceServing": "race", "SquadServing": "squad"}
# What a refusal calls the other serving modules.
OTHERS = {"GenerationModule": "generation"}
# What ``serving_default`` takes and gives, by task (``serving_info.json``; the classifier's by its labels).
SIGNATURES = {"race": (["article", "question", "options"], ["choice", "probabilities"]),
              "squad": (["question", "context"], ["answer_text", "answer_start", "answer_end", "score", "null_odds",
                                                  "no_answer_probability", "has_answer"])}


def check_format(fmt: str, memory: bool = False, task: str = "classifier") -> str:
    """``fmt`` if this export can be written, else ValueError in one line naming it and the accepted ones."""
    if fmt in REFUSED:
        raise ValueError(f"export format {fmt!r}: not available ({REFUSED[fmt]}); accepted: {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r}: unknown; accepted: {', '.join(FORMATS)}")
    if fmt != "tf_saved_model":
        if task not in TASKS.values():
            raise ValueError(f"export format {fmt!r}: the {task} export is a SavedModel only so far "
                             f"(format='tf_saved_model')")
        if memory:
            raise ValueError(f"export format {fmt!r}: memory mode (long documents in windows with memory) is a "
                             f"SavedModel only (format='tf_saved_model')")
        missing = [m for m in NEEDS[fmt] if _missing(m)]
        if missing:
            raise ValueError(f"export format {fmt!r} needs {', '.join(missing)}: pip install 'xlnet-tf[{fmt}]'")
    return fmt


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def export(module, path: str, fmt: str = "tf_saved_model", **text_options) -> str:
    """``module`` (a task's ``ServingModule``) written as ``fmt`` at ``path``."""
    name = type(module).__name__
    task = TASKS.get(name) or OTHERS.get(name, name)
    check_format(fmt, memory=bool(getattr(module, "memory", False)), task=task)
    if fmt == "tf_saved_model":
        return module.export(path, **text_options)
    return {"onnx": export_onnx, "openvino": export_openvino}[fmt](module, path, **text_options)


# ---------------------------------------------------------------------------------------------- shared parts
def ids_function(module):
    """The serving module's ``serve_ids`` without its string output (``label_name``: the runner names the label),
    traced without the compiled attention kernel (SQuAD: its ``serve_ids`` on right-padded windows)."""
    import tensorflow as tf

    from xlnet_tf import accel

    if hasattr(module, "_build_position_tables"):
        module._build_position_tables()
    if TASKS[type(module).__name__] == "squad":
        with accel.portable_graph():
            return module.ids_fn().get_concrete_function()
    race = type(module).__name__ == "RaceServing"
    spec = tf.TensorSpec([None, module.num_choices, None] if race else [None, None], tf.int32)

    @tf.function(input_signature=[spec, spec, spec], autograph=False)
    def serve_ids(input_ids, segment_ids, padding_mask):
        out = module._outputs({"input_ids": input_ids, "segment_ids": segment_ids, "padding_mask": padding_mask})
        return {k: v for k, v in out.items() if v.dtype != tf.string}

    with accel.portable_graph():
        return serve_ids.get_concrete_function()


def layout(module, fmt: str, pair: bool) -> Dict:
    """The runner's constants (``layout.json``)."""
    from xlnet_tf.export import GROUP_COST_TOKENS, SEG_PAD_CLASSIFIER
    from xlnet_tf.tasks.squad.serving import SEG_PAD as SEG_PAD_SQUAD

    tok = module.tokenizer
    out = {"format": fmt, "task": TASKS[type(module).__name__], "precision": "f32",
           "max_seq_length": module.max_seq_length, "sep_id": module.sep_id, "cls_id": module.cls_id,
           "seg_pad": SEG_PAD_CLASSIFIER, "lower": bool(tok.lower), "remove_space": bool(tok.remove_space),
           "keep_accents": bool(tok.keep_accents), "max_groups": int(module.max_groups),
           "group_cost_tokens": GROUP_COST_TOKENS, "serving_multiple": SERVING_MULTIPLE}
    if out["task"] == "race":
        return dict(out, max_qa_length=module.max_qa_length, num_choices=module.num_choices)
    if out["task"] == "squad":
        return dict(out, seg_pad=SEG_PAD_SQUAD, max_query_length=module.max_query_length,
                    doc_stride=module.doc_stride, max_answer_length=module.max_answer_length,
                    null_threshold=module.null_threshold,
                    allow_last_paragraph_token=module.allow_last_paragraph_token)
    names = None if module.regression else [n.decode("utf-8") for n in module.label_names.numpy().tolist()]
    return dict(out, pair=bool(pair), label_names=names, exact_single_row=bool(module.exact_single_row))


def _spiece_proto(module) -> bytes:
    return bytes(module.tokenizer._spm._proto)


def _pieces(proto: bytes):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    return [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]


def _write_common(module, tmp: str, fmt: str, pair: bool, files: Dict[str, str]) -> None:
    from xlnet_tf.export import serving_info

    lay = layout(module, fmt, pair)
    write_json(os.path.join(tmp, "layout.json"), lay, indent=1)
    with open(os.path.join(tmp, "pieces.json"), "w", encoding="utf-8") as f:
        json.dump(_pieces(_spiece_proto(module)), f, ensure_ascii=False)
    shutil.copyfile(RUNNER, os.path.join(tmp, "serve.py"))
    info = serving_info(module)
    if lay["task"] in SIGNATURES:
        inputs, outputs = SIGNATURES[lay["task"]]
    else:
        inputs = ["text_a", "text_b"] if pair else ["text_a"]
        outputs = ["logits", "probabilities", "label", "label_name"] if lay["label_names"] else ["score"]
    info.update({"format": fmt, "files": files, "inputs": inputs, "outputs": outputs,
                 "serve": "import sys; sys.path.insert(0, EXPORT_DIR); import serve; serve.load(EXPORT_DIR)("
                          + ", ".join(f"{k}=[...]" for k in inputs) + ")",
                 "serving_process": FORMAT_CHOICE})
    write_json(os.path.join(tmp, SERVING_INFO), info, indent=1)


# Which format to pick, by CPU family and batch size, as measured (PERFORMANCE.md "Serving in other runtimes":
# XLNet-Base classifier, raw text in, 2 cores); recorded in every ONNX / OpenVINO export's serving_info.json.
FORMAT_CHOICE = {
    "needs": {"tf_saved_model": "tensorflow and tensorflow_text",
              "onnx": "onnxruntime and onnxruntime-extensions (pip install 'xlnet-tf[onnx]')",
              "openvino": "openvino and openvino-tokenizers (pip install 'xlnet-tf[openvino]')"},
    "avx512_bf16 (AMD EPYC, no AMX)": "openvino with precision='bf16' at every batch size and length (1.7-3.4x the "
                                      "float32 SavedModel, five runs); in float32: openvino or onnx at batch "
                                      "1 on short texts (SST-2: 1.5-1.9x the SavedModel), openvino for batches of "
                                      "32 and long texts (IMDB, 512: 0.95-1.28x the SavedModel; onnx 0.82-1.03x "
                                      "there)",
    "not measured": "AVX2-only cores (issue 53: ONNX Runtime led TensorFlow at batch 1 there, so try onnx), AMX "
                    "(Intel Sapphire Rapids and later), ARM",
}


# ---------------------------------------------------------------------------------------------- OpenVINO
def export_openvino(module, path: str, pair: bool = False) -> str:  # (``pair``: the classifier's text_b)
    """``module``'s ids graph and tokenizer as OpenVINO IR (module docstring)."""
    import openvino as ov
    from openvino import Type, opset13 as opset
    from openvino_tokenizers import _get_factory

    model = ov.convert_model(ids_function(module))
    layer_norms_as_mvn(model)
    shape_arithmetic_shared(model)
    for port in model.inputs:
        port.get_tensor().set_names({port.get_any_name().split(":")[0]})
    # The length dimension bounded by max_seq_length, the longest the runner sends: the plugin knows the largest
    # call; the same graph and answers (no measured change on a quiet host: PERFORMANCE.md "Serving in other runtimes").
    # (Rank-1 inputs, SQuAD's cls_index [windows], have no length dimension.)
    model.reshape({port.get_any_name(): ov.PartialShape([*port.get_partial_shape()][:-1]
                                                         + [ov.Dimension(1, module.max_seq_length)])
                   for port in model.inputs if port.get_partial_shape().rank.get_length() > 1})
    text = opset.parameter(ov.PartialShape([-1]), Type.string, name="text")
    spm_bytes = opset.constant(np.frombuffer(_spiece_proto(module), np.uint8))
    node = _get_factory().create("SentencepieceTokenizer", [spm_bytes, *text.outputs()],
                                 {"add_bos": False, "add_eos": False, "reverse": False, "alpha": 0.0,
                                  "nbest_size": 0})
    indices, values, _ = node.outputs()
    indices.get_tensor().set_names({"indices"})
    values.get_tensor().set_names({"values"})
    tokenizer = ov.Model([indices, values], [text], "xlnet_sentencepiece")
    with atomic_directory(path, WRITTEN["openvino"]) as tmp:
        ov.save_model(model, os.path.join(tmp, "model.xml"), compress_to_fp16=False)
        ov.save_model(tokenizer, os.path.join(tmp, "tokenizer.xml"), compress_to_fp16=False)
        _write_common(module, tmp, "openvino", pair, {"model": "model.xml", "tokenizer": "tokenizer.xml",
                                                      "runner": "serve.py"})
    return path


def layer_norms_as_mvn(model) -> int:
    """Each LayerNorm's normalisation in ``model`` (``xlnet_tf.ops.layer_norm`` as converted: ``(x - mean(x)) *
    (mean((x - mean(x))^2) + eps)^-0.5`` over the last axis, six nodes) as one ``MVN`` node (the same math:
    ``normalize_variance``, eps inside the square root), which OpenVINO's own fusion does not match from
    ``tf.nn.moments``' SquaredDifference; gamma and beta stay as they are. Fewer nodes is what a dynamic-shape call
    pays for at batch 1 (PERFORMANCE.md "Serving in other runtimes": 831 -> 735 compiled nodes, SST-2 batch 1
    ~16% faster per call, outputs within 5e-7). Returns the count replaced."""
    from openvino import opset13 as opset

    def constant(output):
        node = output.get_node()
        return node.get_data().reshape(-1) if node.get_type_name() == "Constant" else None

    def last_axis(reduce, rank):
        axes = constant(reduce.input(1).get_source_output())
        return (axes is not None and sorted(int(a) % rank for a in axes) == [rank - 1]
                and bool(reduce.get_attributes()["keep_dims"]))

    replaced = 0
    for mul in model.get_ordered_ops():
        if mul.get_type_name() != "Multiply":
            continue
        a, b = (i.get_source_output() for i in mul.inputs())
        if a.get_node().get_type_name() == "Power":
            a, b = b, a
        sub, power = a.get_node(), b.get_node()
        if sub.get_type_name() != "Subtract" or power.get_type_name() != "Power":
            continue
        exponent, add = constant(power.input(1).get_source_output()), power.input(0).get_source_output().get_node()
        if exponent is None or exponent.size != 1 or float(exponent[0]) != -0.5 or add.get_type_name() != "Add":
            continue
        var, eps = (i.get_source_output() for i in add.inputs())
        if constant(eps) is None:
            var, eps = eps, var
        eps, var = constant(eps), var.get_node()
        if eps is None or eps.size != 1 or var.get_type_name() != "ReduceMean":
            continue
        x, mean = (i.get_source_output() for i in sub.inputs())
        squared = var.input(0).get_source_output().get_node()
        if (mean.get_node().get_type_name() != "ReduceMean" or mean.get_node().input(0).get_source_output() != x
                or squared.get_type_name() != "SquaredDifference"
                or {i.get_source_output() for i in squared.inputs()} != {x, mean}):
            continue
        rank = x.get_partial_shape().rank
        if rank.is_dynamic or not (last_axis(mean.get_node(), rank.get_length()) and last_axis(var, rank.get_length())):
            continue
        mvn = opset.mvn(x, opset.constant(np.array([-1], np.int64)), True, float(eps[0]), "inside_sqrt")
        mvn.set_friendly_name(mul.get_friendly_name())
        mul.output(0).replace(mvn.output(0))
        replaced += 1
    model.validate_nodes_and_infer_types()
    return replaced


# OpenVINO nodes never merged by ``shape_arithmetic_shared`` (state, randomness, the graph's ends).
_NOT_SHARED = {"Parameter", "Result", "ReadValue", "Assign", "RandomUniform", "Multinomial"}


def shape_arithmetic_shared(model) -> Dict[str, int]:
    """The shape arithmetic each layer of ``model`` repeats, computed once. Every layer builds its reshape
    targets and slice bounds from ``tf.shape`` of its own tensors (ShapeOf, Gather, StridedSlice, Concat, the
    floor division of ``positional_scores``, ~20 nodes a layer); those tensors have the same shapes in every
    layer, but OpenVINO runs each layer's copy. Two steps, both exact: (1) each ``ShapeOf`` whose input has the
    same shape as an earlier one's, proven by OpenVINO's shape inference (each dynamic input dimension its own
    ``Symbol``, which inference unifies where the graph requires the dimensions equal), reads the earlier one;
    (2) then the small integer and boolean tensors (shape values, rank <= 1) computed by the same op with the
    same attributes from the same inputs (constants: the same bytes) are computed once. Left in each layer:
    ``rel_shift``'s second slice bound (a ShapeOf of a reshape whose output OpenVINO's inference does not name,
    3 nodes); in RACE's graph (layers on batch x 4 rows, a product inference leaves unnamed) also the
    feed-forward's reshape back. Fewer dynamic-shape nodes is what a batch-1 call pays for (PERFORMANCE.md
    "Serving in other runtimes", XLNet-Base: 735 -> 514 compiled nodes run per call; 12 SST-2 lengths at batch
    1, 11 interleaved reps under another session's load: 63.0 -> 57.3 ms per call; IMDB's lengths neutral; the
    same outputs, bit for bit). Returns the counts: ``{"shape_of": merged ShapeOf nodes, "ops": merged small ops
    (constants included)}``."""
    import openvino as ov

    for param in model.get_parameters():  # own symbols: nothing assumed about which inputs share a dimension
        shape = param.get_partial_shape()
        if shape.rank.is_static and shape.is_dynamic:
            for dim in shape:
                if dim.is_dynamic:
                    dim.set_symbol(ov.Symbol())
            param.set_partial_shape(shape)
    model.validate_nodes_and_infer_types()

    def dims(output):
        shape = output.get_partial_shape()
        if shape.rank.is_dynamic or any(d.is_dynamic and not d.has_symbol() for d in shape):
            return None
        return [(d.get_length(), None) if d.is_static else (None, d.get_symbol()) for d in shape]

    def same(a, b):
        return len(a) == len(b) and all(x[0] == y[0] and (x[1] is None) == (y[1] is None)
                                        and (x[1] is None or x[1] == y[1]) for x, y in zip(a, b))

    counts = {"shape_of": 0, "ops": 0}
    firsts = []  # (input dims, output type, the first ShapeOf's output)
    for op in model.get_ordered_ops():
        if op.get_type_name() != "ShapeOf" or (key := dims(op.input(0).get_source_output())) is None:
            continue
        kind = op.get_output_element_type(0)
        first = next((out for d, t, out in firsts if t == kind and same(d, key)), None)
        if first is None:
            firsts.append((key, kind, op.output(0)))
        else:
            op.output(0).replace(first)
            counts["shape_of"] += 1

    def small(output):
        kind, shape = output.get_element_type(), output.get_partial_shape()
        return ((kind.is_integral() or kind == ov.Type.boolean) and shape.rank.is_static
                and shape.rank.get_length() <= 1)

    seen = {}
    for op in model.get_ordered_ops():
        kind = op.get_type_name()
        if kind in _NOT_SHARED or op.get_output_size() < 1 or not all(small(o) for o in op.outputs()):
            continue
        if kind == "Constant":
            data = op.get_data()
            if data.size > 64:
                continue
            key = (kind, str(op.get_output_element_type(0)), data.shape, data.tobytes())
        else:
            key = (kind, op.get_type_info().version_id, repr(sorted(op.get_attributes().items())),
                   tuple((i.get_source_output().get_node().get_name(), i.get_source_output().get_index())
                         for i in op.inputs()))
        if key in seen:
            for out, kept in zip(op.outputs(), seen[key]):
                out.replace(kept)
            counts["ops"] += 1
        else:
            seen[key] = list(op.outputs())
    model.validate_nodes_and_infer_types()
    return counts


# ---------------------------------------------------------------------------------------------- ONNX
def export_onnx(module, path: str, pair: bool = False) -> str:
    """``module``'s ids graph and tokenizer as ONNX (module docstring)."""
    import onnx
    from onnx import TensorProto, helper
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    import tensorflow as tf
    from tf2onnx import tfonnx

    traced = ids_function(module)
    out_names = sorted(traced.structured_outputs)  # a dict's outputs, flattened in sorted key order
    fn = convert_variables_to_constants_v2(traced)
    inputs = [t.name for t in fn.inputs]
    outputs = [t.name for t in fn.outputs]
    rename = dict(zip(inputs, [n.split(":")[0] for n in inputs]))
    rename.update(zip(outputs, out_names))
    with tf.Graph().as_default() as graph:
        tf.import_graph_def(fn.graph.as_graph_def(), name="")
        g = tfonnx.process_tf_graph(graph, opset=ONNX_OPSET, input_names=inputs, output_names=outputs,
                                    tensors_to_rename=rename)
    model = g.make_model("xlnet_tf serve_ids")  # (no tf2onnx optimizer: the module docstring)

    text = helper.make_tensor_value_info("text", TensorProto.STRING, [None])
    consts = [helper.make_tensor("nbest_size", TensorProto.INT64, [], [0]),
              helper.make_tensor("alpha", TensorProto.FLOAT, [], [0.0]),
              helper.make_tensor("add_bos", TensorProto.BOOL, [], [False]),
              helper.make_tensor("add_eos", TensorProto.BOOL, [], [False]),
              helper.make_tensor("reverse", TensorProto.BOOL, [], [False])]
    node = helper.make_node("SentencepieceTokenizer", ["text"] + [c.name for c in consts],
                            ["ids", "row_splits"], domain="ai.onnx.contrib", model=_spiece_proto(module))
    tok_graph = helper.make_graph([node], "xlnet_sentencepiece", [text],
                                  [helper.make_tensor_value_info("ids", TensorProto.INT32, [None]),
                                   helper.make_tensor_value_info("row_splits", TensorProto.INT64, [None])],
                                  initializer=consts)
    tokenizer = helper.make_model(tok_graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET),
                                                            helper.make_opsetid("ai.onnx.contrib", 1)])
    with atomic_directory(path, WRITTEN["onnx"]) as tmp:
        onnx.save(model, os.path.join(tmp, "model.onnx"))
        onnx.save(tokenizer, os.path.join(tmp, "tokenizer.onnx"))
        _write_common(module, tmp, "onnx", pair, {"model": "model.onnx", "tokenizer": "tokenizer.onnx",
                                                  "runner": "serve.py"})
    return path


def load_runner(path: str, precision: Optional[str] = None, threads: Optional[int] = None):
    """The export's own ``serve.py`` loaded from ``path`` (what a deployer runs), for tests and benchmarks
    (``threads``: the runtime's; None: its default). Imports no TensorFlow."""
    spec = importlib.util.spec_from_file_location(f"xlnet_export_serve_{abs(hash(path))}",
                                                  os.path.join(path, "serve.py"))
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    return serve.load(path, precision=precision, threads=threads)
