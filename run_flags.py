"""The flags of the entry points, defined into a ``FlagValues`` of each call's own (``run_main`` makes one per
call, so every script's ``main`` runs in-process as often as needed), each flag under a help section.

Only definitions live here: ``run_common`` turns parsed flags into the library's objects, ``run_main`` parses,
prints ``--help`` and turns failures into one ``error:`` line. A flag that sets a field of an options dataclass
takes that field's default (``XLNetConfig``'s run options, ``TrainConfig``, ``TaskOptions``, ``Plan``; each
script's own: ``SquadOptions``, ``RaceData``, ``PretrainSpec``, ``GenerationOptions``): each default is written
once, in its dataclass. Where a flag spells "not set" another way than its field (``-1`` / ``0`` / ``auto`` for
None), its help says so.
"""

from __future__ import annotations

import os

from absl import flags

from xlnet_tf.heads import DEFAULT_SUMMARY, SUMMARY_TYPES
from xlnet_tf.tasks.runner import Plan, TaskOptions
from xlnet_tf.checkpoint import SAVED_FOLDERS
from xlnet_tf.config import XLNetConfig
from xlnet_tf.fileutil import SAVED_MODEL, check_replaceable
from xlnet_tf import presets
from xlnet_tf.tasks import export_formats
from xlnet_tf.hardware import POLICY_OF_DTYPE, PRECISIONS
from xlnet_tf.train_config import LAYER_DECAY_MODES, TrainConfig

# The directories a run writes (its checkpoints record paths inside them: the input iterator's TFRecord files),
# made absolute when the flags are parsed, so a run resumes from any working directory.
RUN_DIR_FLAGS = ("output_dir", "model_dir", "cache_dir", "export_dir", "record_dir", "predict_dir")
# Of those, the ones a run may only read when they exist (a shared, read-only cache of features or records).
SHARED_DIR_FLAGS = ("cache_dir", "record_dir", "model_dir")


class Definer:
    """``flags.DEFINE_*`` into one ``FlagValues``, each flag tagged with the help section it is listed under
    (``Definer(fv, "Task").string(...)``; ``section(title)`` switches the section for the next ones).

    ``string(..., input_path=True)`` marks a file or folder the run reads: ``settle`` refuses a value that does
    not exist, naming the flag, before any work (``input_path`` may also be a function of the parsed
    ``FlagValues`` saying whether the value is read in this call, see ``mark_input_path``)."""

    def __init__(self, fv: flags.FlagValues, section: str):
        self.fv, self.title = fv, section

    def section(self, title: str) -> "Definer":
        self.title = title
        return self

    def _define(self, define, name, *args, **kwargs):
        define(name, *args, flag_values=self.fv, **kwargs)
        self.fv[name].section = self.title

    def string(self, name, default, help_, input_path=False, **kw):
        self._define(flags.DEFINE_string, name, default, help_, **kw)
        if input_path:
            mark_input_path(self.fv, name, input_path)

    def integer(self, name, default, help_, **kw):
        self._define(flags.DEFINE_integer, name, default, help_, **kw)

    def float(self, name, default, help_, **kw):
        self._define(flags.DEFINE_float, name, default, help_, **kw)

    def bool(self, name, default, help_, **kw):
        self._define(flags.DEFINE_bool, name, default, help_, **kw)

    def enum(self, name, default, values, help_, **kw):
        self._define(flags.DEFINE_enum, name, default, list(values), help_, **kw)

    def list(self, name, default, help_, **kw):
        self._define(flags.DEFINE_list, name, default, help_, **kw)


def mark_input_path(fv: flags.FlagValues, name: str, when=True) -> None:
    """``--name`` is a file or folder the run reads (``when``: True, or a function of the parsed ``FlagValues``
    saying whether it is read in this call): ``settle`` checks that it exists."""
    fv[name].input_path = when


def _path_like(value: str) -> bool:
    """A --model_config_path that names a file (else a preset name such as ``base``)."""
    return value.endswith(".json") or os.sep in value


def define_model_flags(fv: flags.FlagValues) -> None:
    """The model and tokenizer flags of every entry point (``generate.py`` defines only these of the shared ones)."""
    d = Definer(fv, "Model and tokenizer")
    d.string("model_config_path", None, "XLNetConfig json (original, HF or ours) or a preset name "
             "(tiny/small/base/large). Default: the config next to --init_checkpoint.",
             input_path=lambda v: _path_like(v.model_config_path))
    d.string("init_checkpoint", None, "Original TF1 checkpoint (dir or prefix), HuggingFace dir or our own format. "
             "Fine-tuning from random initialisation when absent.")
    d.string("spiece_model_file", None, "SentencePiece model.", input_path=True)
    d.bool("uncased", False, "Lower-case the input (uncased models).")


def define_common_flags(fv: flags.FlagValues, default_seq_len: int = 128, default_lr: float = 2e-5) -> None:
    """The flags every fine-tuning entry point shares, by help section: model, outputs, what to do, data, training,
    speed and memory, distribution."""
    define_model_flags(fv)
    _define_model_options(Definer(fv, "Model and tokenizer"))
    _define_output_flags(Definer(fv, "Outputs"))
    _define_data_flags(Definer(fv, "What to do"), default_seq_len)
    _define_training_flags(Definer(fv, "Training"), default_lr)
    _define_speed_flags(Definer(fv, "Speed and memory"))
    d = Definer(fv, "Distribution")
    d.enum("strategy", "default", ["default", "mirrored", "multi_worker", "tpu"], "tf.distribute.")
    d.string("tpu", None, "TPU name or address (with --strategy=tpu).")
    d.integer("num_cpu_devices", None, "Split the CPU into N logical devices (testing mirrored).")


def _define_model_options(d: Definer) -> None:
    """The run's options of the model (not its shape: that is the config's)."""
    d.float("dropout", XLNetConfig.dropout, "Dropout rate.")
    d.float("dropatt", XLNetConfig.dropatt, "Attention dropout rate.")
    d.integer("clamp_len", XLNetConfig.clamp_len, "Clamp relative distances (<= 0: no clamping).")
    d.enum("summary_type", DEFAULT_SUMMARY, SUMMARY_TYPES, "Sequence summary.")


def _define_output_flags(d: Definer) -> None:
    """Where a run writes: results, checkpoints, caches, exports."""
    d.string("output_dir", None, "Where results, predictions and cached TFRecords go (required).")
    d.string("model_dir", None, "Training checkpoints and TensorBoard (default OUTPUT_DIR/model).")
    d.string("cache_dir", None, "TFRecord cache (default OUTPUT_DIR/data).")
    d.string("export_dir", None, "Write a SavedModel serving raw text here.")
    d.string("export_huggingface", None, "Write the fine-tuned model here for transformers (PyTorch): config.json + "
             "model.safetensors of XLNetForSequenceClassification / ForMultipleChoice / ForQuestionAnswering (a "
             "head HuggingFace lacks is refused before any work).")
    d.enum("export_precision", "float32", POLICY_OF_DTYPE,
           "Compute precision of the exported graph: float32, or bfloat16/float16 (the Keras mixed_* policy: "
           "float32 variables, 16-bit compute; the signatures' outputs stay float32). bfloat16 is the fast serving "
           "path on CPUs with AMX / AVX-512 BF16 and on GPUs.")
    d.string("export_format", Plan.export_format, "What --export_dir holds, in Keras' format names: tf_saved_model "
             "(a SavedModel: TensorFlow + tensorflow_text), onnx (ONNX Runtime + onnxruntime-extensions) or openvino "
             "(OpenVINO + openvino-tokenizers); the last two serve raw text through the export's serve.py without "
             "TensorFlow (memory mode is a SavedModel only, refused before work).")
    d.bool("overwrite_output_dir", False, "Replace the run in --output_dir (its checkpoints and cached features) "
           "when it differs from this one; without it such a run refuses to start.")


def _define_data_flags(d: Definer, default_seq_len: int) -> None:
    """What the run does, and how its data is cut and batched."""
    d.bool("do_train", False, "Train.")
    d.bool("do_eval", False, "Evaluate on the dev split.")
    d.bool("do_predict", False, "Predict the test split.")
    d.bool("eval_all_ckpt", False, "Evaluate every checkpoint in model_dir and keep the best.")
    d.section("Data")
    d.integer("max_seq_length", default_seq_len, "Maximum sequence length in pieces.", lower_bound=1)
    d.bool("overwrite_data", TaskOptions.overwrite_data, "Rebuild cached TFRecords even when valid.")
    d.bool("length_buckets", TaskOptions.bucket, "Training batches of examples of one length group, each padded to "
           "its longest example (rounded up to --length_multiple); off, or with --grad_accum_steps > 1 (which stacks "
           "batches of one shape), every training batch is padded to max_seq_length. Evaluation and prediction always"
           " pad a batch to its longest text.")
    d.integer("length_multiple", 0, "Padded batch lengths are rounded up to a multiple of this (training and "
              "evaluation; each new length is traced once). 0: chosen by device and model size "
              "(data.lengths.default_multiple).", lower_bound=0)


def _define_training_flags(d: Definer, default_lr: float) -> None:
    """The training options (``TrainConfig``'s fields, its defaults)."""
    d.integer("train_batch_size", Plan.train_batch_size, "Global training batch size (per update; see "
              "grad_accum_steps).", lower_bound=1)
    d.integer("eval_batch_size", TaskOptions.eval_batch_size, "Evaluation batch size.", lower_bound=1)
    d.integer("predict_batch_size", None, "Prediction batch size (default: eval_batch_size).", lower_bound=1)
    d.float("learning_rate", default_lr, "Peak learning rate (> 0 to train).")
    d.integer("train_steps", TrainConfig.train_steps, "Optimizer updates.")
    d.integer("warmup_steps", TrainConfig.warmup_steps, "Linear warmup steps (more than --train_steps: the peak "
              "learning rate is never reached, a warning).", lower_bound=0)
    d.float("min_lr_ratio", TrainConfig.min_lr_ratio, "Final LR as a fraction of the peak.")
    d.float("weight_decay", TrainConfig.weight_decay, "Decoupled weight decay (every weight but LayerNorm and biases;"
            " the attention biases r_w/r_r/r_s are decayed, as the original).")
    d.float("adam_epsilon", TrainConfig.adam_epsilon, "Adam epsilon.")
    d.enum("adam_bias_correction", "auto", ["auto", "true", "false"],
           "Adam bias correction. auto: with --init_checkpoint the original's rule, on when weight_decay == 0 "
           "(tf.train.Adam) and off when weight_decay > 0 (its AdamWeightDecay, made for fine-tuning pretrained "
           "weights at 2e-5..5e-5); from random initialisation always on (without it the first updates are 3-6x "
           "larger and a fresh model collapses at 1e-3).")
    d.float("clip", TrainConfig.clip_norm, "Global-norm gradient clipping (<= 0: none).")
    d.float("lr_layer_decay_rate", TrainConfig.lr_layer_decay_rate, "Layer-wise decay rate (see --layer_decay_mode).")
    d.enum("layer_decay_mode", TrainConfig.layer_decay_mode, LAYER_DECAY_MODES,
           "grad (the original; reproduces the published recipes): the clipped gradients of block l's projection, "
           "feed-forward and LayerNorm weights are multiplied by rate^(n_layer-1-l); embeddings, attention biases, "
           "seg_embed and heads are not scaled, and Adam mostly cancels the factor. lr: a true per-layer learning "
           "rate rate^(n_layer-depth) on every variable, embeddings included; with 0.75 on XLNet-Large the "
           "embedding trains at 0.001x the top rate and the bottom layers practically freeze.")
    d.integer("grad_accum_steps", TrainConfig.grad_accum_steps, "Micro-batches per update (same update as a k-times "
              "batch).", lower_bound=1)
    d.integer("num_trainable_layers", -1, "Train only the top N blocks and the head (-1: all).")
    d.list("head_hidden_sizes", [], "Hidden sizes of a deeper head MLP (empty: the original head).")
    d.integer("save_steps", TrainConfig.save_steps, "Checkpoint every N steps (0: only at the end).", lower_bound=0)
    d.integer("keep_checkpoint_max", TrainConfig.keep_checkpoint_max, "Checkpoints kept.")
    d.integer("iterations", TrainConfig.log_steps, "Log every N steps.")
    d.integer("seed", TrainConfig.seed, "Random seed.")
    d.bool("progress", TrainConfig.progress, "Show progress bars.")


def _define_speed_flags(d: Definer) -> None:
    """Precision, recomputation, the accelerations, XLA and the memory check."""
    d.enum("precision", TrainConfig.precision, PRECISIONS, "Compute precision.")
    d.bool("recompute", XLNetConfig.recompute, "Recompute each block's activations in the backward pass.")
    d.bool("accelerate", XLNetConfig.accelerate, "The accelerations of xlnet_tf/accel that apply on this host (XLA "
           "clusters, compiled attention kernels, query chunking); false: the plain TensorFlow ops of the math only.")
    d.enum("pos_dropout", XLNetConfig.pos_dropout, ["per_example", "shared"],
           "Dropout mask on the relative positional encodings: per_example (the original) or shared by the batch "
           "(faster training steps, not the original's noise).")
    d.enum("jit", "auto", ["auto", "true", "update", "false"],
           "XLA: true = the whole training step, update = only the optimizer update, false = none; auto = whole "
           "step on one GPU, update on one CPU, none on several devices.")
    d.bool("check_memory", True, "Refuse a run whose estimated memory (xlnet_tf.ram: parameters, optimizer state "
           "and the step's activations at this length and batch) exceeds this machine's memory, before any "
           "feature is written; false: run anyway.")


def define_health_flag(fv: flags.FlagValues, results: str = "eval_results.json") -> None:
    """``--fail_if_unhealthy`` (the fine-tuning scripts and pretraining): a pipeline acts on "not learning"."""
    Definer(fv, "What to do").bool(
        "fail_if_unhealthy", False, f"Exit with code 3 (the health warning as the error line) when the run's health "
        f"check (tasks/health.py: a collapse, a training loss that did not fall) finds it is not learning, after "
        f"{results} and the training curve are written; nothing after that (predictions, exports) is done. "
        f"Overfitting is a note, not a failure.")


def define_long_doc_flags(fv: flags.FlagValues, unit: str, memory_help: str, max_segments: bool = True) -> None:
    """``--long_doc_mode``, ``--mem_len`` and (``max_segments``) ``--max_segments``: the classifier's documents,
    RACE's articles, extract_features' texts."""
    d = Definer(fv, "Long documents")
    d.enum("long_doc_mode", "truncate", ["truncate", "memory"],
           f"{unit.capitalize()}s longer than max_seq_length: truncate (keep the beginning, the original) or memory "
           f"({memory_help}).")
    d.integer("mem_len", None, "memory mode: memory length in positions (default: max_seq_length).")
    if max_segments:
        d.integer("max_segments", 8, f"memory mode: at most this many windows per {unit} in training, evaluation "
                  f"and prediction (a longer {unit} keeps its beginning, as truncation); the export reads the whole "
                  f"{unit}.")


def settle(fv: flags.FlagValues) -> None:
    """After parsing: the run's directories made absolute (URLs such as gs://... kept); a missing input path
    (``mark_input_path``) or --init_checkpoint refused (ValueError, one line naming the flag)."""
    for name in RUN_DIR_FLAGS:
        value = fv[name].value if name in fv else None
        if value and "://" not in value:
            setattr(fv, name, os.path.abspath(os.path.expanduser(value)))
    for name in fv:
        flag = fv[name]
        when = getattr(flag, "input_path", False)
        if name != flag.name or not when or not flag.value or "://" in flag.value:
            continue
        if (when is True or when(fv)) and not os.path.exists(os.path.expanduser(flag.value)):
            raise ValueError(f"--{name}={flag.value}: no such file or directory")
    for name in RUN_DIR_FLAGS + ("export_huggingface",):
        value = fv[name].value if name in fv else None
        if value and "://" not in value:
            check_writable_dir(name, os.path.abspath(os.path.expanduser(value)))
    for name, written in replaced_dirs(fv).items():  # an export replaces only an earlier export of its kind
        value = fv[name].value if name in fv else None
        if value and "://" not in value:
            try:
                check_replaceable(os.path.abspath(os.path.expanduser(value)), *written)
            except ValueError as e:
                raise ValueError(f"--{name}={e}") from None
    path = fv["init_checkpoint"].value if "init_checkpoint" in fv else None
    if path and not _looks_local(path):
        path = resolve_init_checkpoint(fv, path)
    if path and "://" not in path and not os.path.isdir(path):
        folder, prefix = os.path.split(os.path.abspath(path))
        if not (os.path.isdir(folder) and any(n.startswith(prefix) for n in os.listdir(folder))):
            raise ValueError(f"--init_checkpoint={path}: no such checkpoint (expected a directory or a checkpoint "
                             f"prefix such as DIR/xlnet_model.ckpt)")


def _looks_local(path: str) -> bool:
    """A path the user means (it exists, is a checkpoint prefix, or is written as a path: ./x, /x, ~/x, x.ckpt)."""
    return presets.is_local(path) or path.startswith((".", os.sep, "~")) or ".ckpt" in path


def resolve_init_checkpoint(fv: flags.FlagValues, name: str) -> str:
    """``--init_checkpoint=NAME`` (``xlnet_tf.presets``: a HuggingFace repo id or a release name): the local folder
    it resolves to, which also gives ``--spiece_model_file`` where that flag is not set (``--model_config_path``
    unset already reads the checkpoint's config). A name that cannot be had: one line naming it."""
    try:
        folder = presets.resolve(name)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"--init_checkpoint={e}") from None
    fv.init_checkpoint = folder
    spiece = os.path.join(folder, "spiece.model")
    if "spiece_model_file" in fv and not fv["spiece_model_file"].value and os.path.isfile(spiece):
        fv.spiece_model_file = spiece
    return folder


def replaced_dirs(fv: flags.FlagValues) -> dict:
    """The flags naming a directory the run writes whole, and the writers whose earlier directories it may replace
    (``fileutil.Written``): the export in its ``--export_format``; the HuggingFace export (or an earlier
    save_pretrained folder)."""
    fmt = fv["export_format"].value if "export_format" in fv else "tf_saved_model"
    return {"export_dir": (export_formats.WRITTEN.get(fmt, SAVED_MODEL),),
            "export_huggingface": SAVED_FOLDERS["huggingface"]}


def check_writable_dir(name: str, path: str) -> None:
    """``--name=path`` must be a directory this run can write, or one it can create (``SHARED_DIR_FLAGS`` may be
    existing read-only directories: a shared cache); ValueError naming the flag otherwise, before anything is
    created."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"--{name}={path}: exists and is not a directory; pass a directory")
        if name not in SHARED_DIR_FLAGS and not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"--{name}={path}: not writable (a read-only file system or no permission); pass a "
                             f"directory this run can write")
        return
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"--{name}={path}: cannot be created: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--{name}={path}: cannot be created: {parent} is not writable (a read-only file system "
                         f"or no permission); pass a directory this run can write")
