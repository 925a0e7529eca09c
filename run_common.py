"""Flags shared by the run_*.py entry points, turned into plain objects (the library below reads no flags).

Each entry point defines its flags (``define_common_flags``) and runs
``app.run(main_wrapper(main), flags_parser=parse_flags)``; ``start_run`` checks the inputs and takes the output
directory (the manifest and the guard live in ``run_state``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from typing import Callable, Dict, Optional, Sequence

from absl import flags

# Process-wide TensorFlow settings of the command-line runs, before TensorFlow is imported (the library sets
# none): oneDNN doubles float32 matmul speed on the AMD CPUs measured, where TensorFlow leaves it off; TF's C++
# INFO lines are noise in a run's log. A user's own setting wins.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FLAGS = flags.FLAGS
# --export_precision -> the Keras policy of the exported model
from xlnet_tf.hardware import POLICY_OF_DTYPE as EXPORT_PRECISIONS, PRECISIONS  # noqa: E402


def define_model_flags() -> None:
    """The model and tokenizer flags of every entry point (``generate.py`` defines only these of the shared ones)."""
    flags.DEFINE_string("model_config_path", None, "XLNetConfig json (original, HF or ours) or a preset name "
                        "(tiny/small/base/large). Default: the config next to --init_checkpoint.")
    flags.DEFINE_string("init_checkpoint", None, "Original TF1 checkpoint (dir or prefix), HuggingFace dir or our "
                        "own format. Fine-tuning from random initialisation when absent.")
    flags.DEFINE_string("spiece_model_file", None, "SentencePiece model.")
    flags.DEFINE_bool("uncased", False, "Lower-case the input (uncased models).")


def define_common_flags(default_seq_len: int = 128, default_lr: float = 2e-5) -> None:
    # --- model and checkpoints
    define_model_flags()
    flags.DEFINE_string("output_dir", None, "Where results, predictions and cached TFRecords go.")
    flags.DEFINE_string("model_dir", None, "Training checkpoints and TensorBoard (default OUTPUT_DIR/model).")
    flags.DEFINE_string("cache_dir", None, "TFRecord cache (default OUTPUT_DIR/data).")
    flags.DEFINE_string("export_dir", None, "Write a SavedModel serving raw text here.")
    flags.DEFINE_string("export_huggingface", None, "Write the fine-tuned model here for transformers (PyTorch): "
                        "config.json + model.safetensors of XLNetForSequenceClassification / ForMultipleChoice / "
                        "ForQuestionAnswering (a head HuggingFace lacks is refused before any work).")
    flags.DEFINE_enum("export_precision", "float32", list(EXPORT_PRECISIONS),
                      "Compute precision of the exported graph: float32, or bfloat16/float16 (the Keras "
                      "mixed_* policy: float32 variables, 16-bit compute; the signatures' outputs stay float32). "
                      "bfloat16 is the fast serving path on CPUs with AMX / AVX-512 BF16 and on GPUs.")
    flags.DEFINE_float("dropout", 0.1, "Dropout rate.")
    flags.DEFINE_float("dropatt", 0.1, "Attention dropout rate.")
    flags.DEFINE_integer("clamp_len", -1, "Clamp relative distances (<= 0: no clamping).")
    flags.DEFINE_string("summary_type", "last", "Sequence summary: last|first|mean|attn.")
    # --- data
    flags.DEFINE_integer("max_seq_length", default_seq_len, "Maximum sequence length in pieces.", lower_bound=1)
    flags.DEFINE_bool("check_memory", True, "Refuse a run whose estimated memory (xlnet_tf.ram: parameters, "
                      "optimizer state and the step's activations at this length and batch) exceeds this machine's "
                      "memory, before any feature is written; false: run anyway.")
    flags.DEFINE_bool("overwrite_data", False, "Rebuild cached TFRecords even when valid.")
    flags.DEFINE_bool("overwrite_output_dir", False, "Replace the run in --output_dir (its checkpoints and cached "
                      "features) when it differs from this one; without it such a run refuses to start.")
    # --- training
    flags.DEFINE_bool("do_train", False, "Train.")
    flags.DEFINE_bool("do_eval", False, "Evaluate on the dev split.")
    flags.DEFINE_bool("do_predict", False, "Predict the test split.")
    flags.DEFINE_integer("train_batch_size", 32, "Global training batch size (per update; see grad_accum_steps).",
                         lower_bound=1)
    flags.DEFINE_integer("eval_batch_size", 32, "Evaluation batch size.", lower_bound=1)
    flags.DEFINE_integer("predict_batch_size", None, "Prediction batch size (default: eval_batch_size).",
                         lower_bound=1)
    flags.DEFINE_float("learning_rate", default_lr, "Peak learning rate (> 0 to train).")
    flags.DEFINE_integer("train_steps", 1000, "Optimizer updates.")
    flags.DEFINE_integer("warmup_steps", 0, "Linear warmup steps (more than --train_steps: the peak learning rate "
                         "is never reached, a warning).", lower_bound=0)
    flags.DEFINE_float("min_lr_ratio", 0.0, "Final LR as a fraction of the peak.")
    flags.DEFINE_float("weight_decay", 0.0, "Decoupled weight decay (every weight but LayerNorm and biases; the "
                       "attention biases r_w/r_r/r_s are decayed, as the original).")
    flags.DEFINE_float("adam_epsilon", 1e-6, "Adam epsilon.")
    flags.DEFINE_enum("adam_bias_correction", "auto", ["auto", "true", "false"],
                      "Adam bias correction. auto: with --init_checkpoint the original's rule, on when "
                      "weight_decay == 0 (tf.train.Adam) and off when weight_decay > 0 (its AdamWeightDecay, made "
                      "for fine-tuning pretrained weights at 2e-5..5e-5); from random initialisation always on "
                      "(without it the first updates are 3-6x larger and a fresh model collapses at 1e-3).")
    flags.DEFINE_float("clip", 1.0, "Global-norm gradient clipping (<= 0: none).")
    flags.DEFINE_float("lr_layer_decay_rate", 1.0, "Layer-wise decay rate (see --layer_decay_mode).")
    flags.DEFINE_enum("layer_decay_mode", "grad", ["grad", "lr"],
                      "grad (the original; reproduces the published recipes): the clipped gradients of block l's "
                      "projection, feed-forward and LayerNorm weights are multiplied by rate^(n_layer-1-l); "
                      "embeddings, attention biases, seg_embed and heads are not scaled, and Adam mostly cancels "
                      "the factor. lr: a true per-layer learning rate rate^(n_layer-depth) on every variable, "
                      "embeddings included; with 0.75 on XLNet-Large the embedding trains at 0.001x the top rate "
                      "and the bottom layers practically freeze.")
    flags.DEFINE_bool("length_buckets", True, "Training batches of examples of one length group, each padded to its "
                      "longest example (rounded up to --length_multiple); off, or with --grad_accum_steps > 1 "
                      "(which stacks batches of one shape), every training batch is padded to max_seq_length. "
                      "Evaluation and prediction always pad a batch to its longest text.")
    flags.DEFINE_integer("length_multiple", 0, "Padded batch lengths are rounded up to a multiple of this (training "
                         "and evaluation; each new length is traced once). 0: by machine, 8 with a GPU or TPU (XLA "
                         "compiles whole steps per shape), 2 on CPU (less padding; measured faster there).",
                         lower_bound=0)
    flags.DEFINE_integer("grad_accum_steps", 1, "Micro-batches per update (same update as a k-times batch).",
                         lower_bound=1)
    flags.DEFINE_enum("precision", "float32", list(PRECISIONS), "Compute precision.")
    flags.DEFINE_bool("recompute", False, "Recompute each block's activations in the backward pass.")
    flags.DEFINE_bool("accelerate", True, "The accelerations of xlnet_tf/accel that apply on this host (XLA "
                      "clusters, compiled attention kernels, query chunking); false: the plain TensorFlow ops of "
                      "the math only.")
    flags.DEFINE_enum("pos_dropout", "per_example", ["per_example", "shared"],
                      "Dropout mask on the relative positional encodings: per_example (the original) or shared "
                      "by the batch (faster training steps, not the original's noise).")
    flags.DEFINE_integer("num_trainable_layers", -1, "Train only the top N blocks and the head (-1: all).")
    flags.DEFINE_list("head_hidden_sizes", [], "Hidden sizes of a deeper head MLP (empty: the original head).")
    flags.DEFINE_integer("save_steps", 1000, "Checkpoint every N steps (0: only at the end).")
    flags.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints kept.")
    flags.DEFINE_integer("iterations", 50, "Log every N steps.")
    flags.DEFINE_integer("seed", 42, "Random seed.")
    flags.DEFINE_enum("jit", "auto", ["auto", "true", "update", "false"],
                      "XLA: true = the whole training step, update = only the optimizer update, false = none; "
                      "auto = whole step on one GPU, update on one CPU, none on several devices.")
    flags.DEFINE_bool("eval_all_ckpt", False, "Evaluate every checkpoint in model_dir and keep the best.")
    # --- distribution
    flags.DEFINE_enum("strategy", "default", ["default", "mirrored", "multi_worker", "tpu"], "tf.distribute.")
    flags.DEFINE_string("tpu", None, "TPU name or address (with --strategy=tpu).")
    flags.DEFINE_integer("num_cpu_devices", None, "Split the CPU into N logical devices (testing mirrored).")
    flags.DEFINE_bool("progress", True, "Show progress bars.")


def define_long_doc_flags(unit: str, memory_help: str, max_segments: bool = True) -> None:
    """``--long_doc_mode``, ``--mem_len`` and (``max_segments``) ``--max_segments``: the classifier's documents,
    RACE's articles, extract_features' texts."""
    flags.DEFINE_enum("long_doc_mode", "truncate", ["truncate", "memory"],
                      f"{unit.capitalize()}s longer than max_seq_length: truncate (keep the beginning, the original) "
                      f"or memory ({memory_help}).")
    flags.DEFINE_integer("mem_len", None, "memory mode: memory length in positions (default: max_seq_length).")
    if max_segments:
        flags.DEFINE_integer("max_segments", 8, f"memory mode: at most this many windows per {unit} in training, "
                             f"evaluation and prediction (a longer {unit} keeps its beginning, as truncation); the "
                             f"export reads the whole {unit}.")


def long_doc_options(F):
    """(memory mode?, the model's mem_len, the data settings the run manifest records) from the long-doc flags
    (without ``--max_segments``: a document in as many windows as it needs)."""
    if F.long_doc_mode != "memory":
        return False, 0, {}
    max_segments = getattr(F, "max_segments", None)
    if max_segments is not None and max_segments < 1:
        raise ValueError(f"--max_segments: expected >= 1, got {max_segments}")
    mem_len = F.mem_len if F.mem_len is not None else F.max_seq_length
    if mem_len <= 0:
        raise ValueError(f"--mem_len: expected > 0 in memory mode, got {mem_len}")
    data = {"long_doc_mode": "memory"}
    if max_segments is not None:
        data["max_segments"] = max_segments
    return True, mem_len, data


# The directories a run writes (its checkpoints record paths inside them: the input iterator's TFRecord files),
# made absolute when the flags are parsed, so a run resumes from any working directory.
RUN_DIR_FLAGS = ("output_dir", "model_dir", "cache_dir", "export_dir", "record_dir", "predict_dir")


def parse_flags(argv):
    """``app.run``'s ``flags_parser`` for the entry points: a bad flag value (a bound such as a batch size >= 1, a
    missing --init_checkpoint) is one ``error:`` line with exit code 2, as every other bad input; then the run's
    directories are made absolute (``RUN_DIR_FLAGS``)."""
    try:
        rest = FLAGS(argv)
        settle_flags(FLAGS)
    except (flags.Error, ValueError) as e:
        _fail(str(e), log=False)
    return rest


def settle_flags(F) -> None:
    """The run's directories made absolute (URLs such as gs://... kept); a missing --init_checkpoint refused."""
    for name in RUN_DIR_FLAGS:
        value = F[name].value if name in F else None
        if value and "://" not in value:
            setattr(F, name, os.path.abspath(os.path.expanduser(value)))
    path = getattr(F, "init_checkpoint", None)
    if path and "://" not in path and not os.path.isdir(path):
        folder, prefix = os.path.split(os.path.abspath(path))
        if not (os.path.isdir(folder) and any(n.startswith(prefix) for n in os.listdir(folder))):
            raise ValueError(f"--init_checkpoint={path}: no such checkpoint (expected a directory or a checkpoint "
                             f"prefix such as DIR/xlnet_model.ckpt)")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def output_paths(F) -> Dict[str, str]:
    if not F.output_dir:
        raise ValueError("--output_dir is required")
    paths = {"output_dir": F.output_dir, "model_dir": model_dir(F),
             "cache_dir": F.cache_dir or os.path.join(F.output_dir, "data")}
    for p in paths.values():
        os.makedirs(p, exist_ok=True)
    return paths


def model_config(F, **overrides):
    """XLNetConfig from --model_config_path (or the checkpoint's), with the run options of the flags."""
    from xlnet_tf import XLNetConfig
    from xlnet_tf import checkpoint

    run = dict(dropout=F.dropout, dropatt=F.dropatt, clamp_len=F.clamp_len, recompute=F.recompute,
               pos_dropout=F.pos_dropout, accelerate=F.accelerate)
    run.update(overrides)
    if F.model_config_path:
        return XLNetConfig.load(F.model_config_path, **run)
    if F.init_checkpoint:
        fmt = checkpoint.detect_format(F.init_checkpoint)
        return checkpoint.resolve_config(F.init_checkpoint, fmt, None, run)
    raise ValueError("pass --model_config_path (a json or a preset name) or --init_checkpoint")


def train_config(F, model_dir: str):
    from xlnet_tf.training import TrainConfig

    return TrainConfig(
        learning_rate=F.learning_rate, train_steps=F.train_steps, warmup_steps=F.warmup_steps,
        min_lr_ratio=F.min_lr_ratio, weight_decay=F.weight_decay, adam_epsilon=F.adam_epsilon,
        adam_bias_correction=bias_correction(F),
        clip_norm=F.clip if F.clip > 0 else None, lr_layer_decay_rate=F.lr_layer_decay_rate,
        layer_decay_mode=F.layer_decay_mode, grad_accum_steps=F.grad_accum_steps, precision=F.precision,
        num_trainable_layers=None if F.num_trainable_layers < 0 else F.num_trainable_layers,
        jit_compile={"auto": None, "true": True, "update": "update", "false": False}[F.jit], model_dir=model_dir,
        save_steps=F.save_steps, keep_checkpoint_max=F.keep_checkpoint_max, log_steps=F.iterations,
        seed=F.seed, progress=F.progress)


def length_options(F) -> dict:
    """The task runs' padding options: ``bucket``, training batches grouped by length (--length_buckets, unless
    gradient accumulation needs one shape), and ``length_multiple`` (--length_multiple, 0 resolved by
    ``data.lengths.default_multiple``)."""
    from data import lengths

    multiple = F.length_multiple or lengths.default_multiple()
    logging.info("batches padded to their longest example, rounded up to a multiple of %d%s", multiple,
                 "" if F.length_multiple else " (--length_multiple=0: this machine's default)")
    return dict(bucket=bool(F.length_buckets) and F.grad_accum_steps == 1, length_multiple=multiple)


def bias_correction(F) -> bool:
    """--adam_bias_correction, with auto resolved by ``optimization.auto_bias_correction`` (the original's rule
    when --init_checkpoint is given, on when training from random initialisation)."""
    from xlnet_tf.optimization import auto_bias_correction

    if F.adam_bias_correction != "auto":
        return F.adam_bias_correction == "true"
    return auto_bias_correction(F.weight_decay, pretrained=bool(F.init_checkpoint))


def _check_case(F) -> None:
    """A backbone pretrained by run_pretrain.py records whether its tokenizer lower-cased the text
    (``pretrain_results.json`` beside the checkpoint); fine-tuning it with the other casing turns capitals into
    <unk> pieces silently, so it is an error."""
    path = getattr(F, "init_checkpoint", None)
    if not path:
        return
    results = os.path.join(path if os.path.isdir(path) else os.path.dirname(path) or ".", "pretrain_results.json")
    try:
        with open(results, encoding="utf-8") as f:
            pretrained_uncased = json.load(f).get("uncased")
    except (OSError, ValueError, AttributeError):
        return
    if pretrained_uncased is not None and bool(pretrained_uncased) != bool(F.uncased):
        want = "pass --uncased" if pretrained_uncased else "drop --uncased"
        raise ValueError(f"--init_checkpoint {path} was pretrained with uncased={str(bool(pretrained_uncased)).lower()} "
                         f"({results}), this run has uncased={str(bool(F.uncased)).lower()}: {want}")


def check_schedule(F) -> None:
    """A training run's learning rate must be positive; warmup longer than the run is legal but unintended."""
    if F.learning_rate <= 0:
        raise ValueError(f"--learning_rate={F.learning_rate:g}: expected > 0 to train")
    if F.warmup_steps > F.train_steps:
        logging.getLogger("run").warning(
            "--warmup_steps=%d > --train_steps=%d: the peak learning rate %g is never reached (the last step's is "
            "%g)", F.warmup_steps, F.train_steps, F.learning_rate, F.learning_rate * F.train_steps / F.warmup_steps)


def check_memory(F, config, training: bool, head: str = "classification", rows: int = 1,
                 length_flag: str = "max_seq_length") -> None:
    """Refuses (one line) a run whose ``xlnet_tf.ram`` estimate exceeds the machine's memory, before any work:
    training at --train_batch_size, else inference at the evaluation batch; ``rows``: sequences per example (RACE:
    its 4 options); ``length_flag``: the flag holding the sequence length. Whole-step XLA's estimate (the smaller
    one) is used, so only a run that cannot fit is refused."""
    from xlnet_tf import ram

    if not F.check_memory:
        return
    length = getattr(F, length_flag)
    flag, batch = (("train_batch_size", F.train_batch_size) if training else
                   ("predict_batch_size" if F.predict_batch_size else "eval_batch_size",
                    F.predict_batch_size or F.eval_batch_size))
    need = ram.estimate(config, length, batch * rows, precision=F.precision, recompute=F.recompute,
                           num_trainable_layers=(None if F.num_trainable_layers < 0 else F.num_trainable_layers)
                           if training else 0, grad_accum_steps=F.grad_accum_steps if training else 1,
                           head=head, jit=True)["total"]
    have = ram.machine_memory()
    if have and need > have:
        GiB = 2.0 ** 30
        what = "training" if training else "inference"
        raise ValueError(f"--{length_flag}={length} with --{flag}={batch}: {what} is estimated to need "
                         f"{need / GiB:,.1f} GiB (xlnet_tf.ram), this machine has {have / GiB:,.1f} GiB; lower "
                         f"them, or pass --nocheck_memory to run anyway")


def start_run(F, run_dir: str, script: str, task: str, config, tokenizer, training: bool,
              train_sources: Optional[Sequence[str]] = (), data: Optional[Dict] = None,
              work_dirs: Sequence[str] = (), memory: Optional[Dict] = None):
    """Checks the inputs against the model and takes ``run_dir`` for this run (``run_state.take_run_dir``: lock,
    stale temporaries, manifest). Held until the process exits. ``train_sources=None``: the training data
    is not given to this run (reused records) and not compared. ``memory``: the task's arguments of
    ``check_memory`` (head, rows per example, the length flag)."""
    import run_state

    vocab = int(tokenizer.vocab_size)
    if vocab > config.n_token:
        raise ValueError(f"--spiece_model_file {tokenizer.spiece_model_file}: vocabulary of {vocab} pieces, but "
                         f"the model embeds only n_token={config.n_token}: use the model's own spiece.model")
    _check_case(F)
    if training:
        check_schedule(F)
    check_memory(F, config, training, **(memory or {}))
    manifest = run_state.run_manifest(F, script, task, config, tokenizer, data, train_sources)
    return run_state.take_run_dir(F, run_dir, manifest, training, work_dirs)


def model_dir(F) -> str:
    return F.model_dir or os.path.join(F.output_dir, "model")


def plan(F, do_eval: Optional[bool] = None, do_predict: Optional[bool] = None, results_dir: Optional[str] = None):
    """The runner's ``Plan`` from the flags (``do_eval`` / ``do_predict`` override theirs), checked (something to
    do) before any work."""
    from tasks import runner

    plan_ = runner.Plan(output_dir=F.output_dir, model_dir=model_dir(F), do_train=F.do_train,
                        do_eval=F.do_eval if do_eval is None else do_eval,
                        do_predict=F.do_predict if do_predict is None else do_predict,
                        export_dir=F.export_dir, export_precision=EXPORT_PRECISIONS[F.export_precision],
                        export_huggingface=F.export_huggingface,
                        eval_all_checkpoints=F.eval_all_ckpt,
                        train_batch_size=F.train_batch_size, results_dir=results_dir)
    plan_.check()
    return plan_


def task_options(F, tokenizer, config, cache_dir: str, head_options: Dict, memory: bool = False):
    """The runner's ``TaskOptions`` from the flags (``memory``: --long_doc_mode=memory, checked by
    ``long_doc_options``)."""
    from tasks import runner

    return runner.TaskOptions(
        tokenizer=tokenizer, config=config, max_seq_length=F.max_seq_length, cache_dir=cache_dir,
        eval_batch_size=F.eval_batch_size, predict_batch_size=F.predict_batch_size, head_options=head_options,
        seed=F.seed, progress=F.progress, overwrite_data=F.overwrite_data,
        max_segments=F.max_segments if memory else None, num_workers=getattr(F, "num_workers", None),
        **length_options(F))


def run_task(F, task, plan_, config, strategy_) -> None:
    """Runs ``task`` (a ``runner.TaskSpec``) by the flags' ``plan_`` with the one runner."""
    from tasks import runner

    runner.run(task, plan_, config, train_config(F, plan_.model_dir), strategy_, F.init_checkpoint, F.seed)


def strategy(F):
    from xlnet_tf.distribute import get_strategy

    return get_strategy(F.strategy, tpu=F.tpu, num_cpu_devices=F.num_cpu_devices)


def tokenizer(F):
    from xlnet_tf import XLNetTokenizer

    if not F.spiece_model_file:
        raise ValueError("--spiece_model_file is required")
    return XLNetTokenizer(F.spiece_model_file, lower=F.uncased)


def int_list(F, name: str):
    """A list flag of integers (empty items skipped); one line naming the flag otherwise."""
    values = getattr(F, name)
    try:
        return tuple(int(x) for x in values if str(x).strip())
    except ValueError:
        raise ValueError(f"--{name}: expected integers, got {values}") from None


def head_hidden_sizes(F):
    return int_list(F, "head_hidden_sizes")


def _fail(message: str, code: int = 2, log: bool = True) -> None:
    if log:  # into the run's log as well (not before the flags are parsed: absl's pre-parse handler repeats it)
        logging.getLogger("run").error("%s", message)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def _interrupted(e: KeyboardInterrupt) -> None:
    """Ctrl-C: one line saying where the run resumes from (exit code 130, the shell's for SIGINT)."""
    from xlnet_tf.training import Interrupted

    if not isinstance(e, Interrupted):
        _fail("interrupted; finished checkpoints, features and outputs are kept: rerun the same command to go on",
              130)
    if e.checkpoint_step is None:
        _fail(f"interrupted at step {e.step}, before the first checkpoint in {e.model_dir}: rerun the same command "
              f"to start the training again", 130)
    _fail(f"interrupted at step {e.step}; the last checkpoint is step {e.checkpoint_step} in {e.model_dir}: rerun "
          f"the same command to resume", 130)


def main_wrapper(main: Callable) -> Callable:
    """Runs ``main``; data/config/checkpoint errors exit with a one-line message instead of a traceback."""

    def wrapped(argv):
        setup_logging()
        from tasks.errors import DataError
        from xlnet_tf.checkpoint import CheckpointError

        try:
            return main(argv)
        except KeyboardInterrupt as e:
            _interrupted(e)
        except (DataError, CheckpointError, ValueError, FileNotFoundError) as e:
            _fail(str(e))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            _fail(f"no space left on device writing {e.filename or 'the output'}; the last complete checkpoint "
                  f"and export are kept: free space and run again to resume")
        except Exception as e:  # TensorFlow's own writers report a full disk as an OpError
            if "No space left on device" not in str(e):
                raise
            _fail(f"no space left on device ({str(e).strip().splitlines()[0][:200]}); the last complete "
                  f"checkpoint and export are kept: free space and run again to resume")

    return wrapped
