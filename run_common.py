"""The entry points' parsed flags turned into the library's plain objects (the library below reads no flags).

The flags are defined in ``run_flags`` and parsed by ``run_main``; ``start_run`` checks the inputs and takes the
output directory (the manifest and the guard live in ``run_state``).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Dict, Optional, Sequence

import run_state
from xlnet_tf.tasks import runner
from xlnet_tf.tasks.classification import features as cls_features
from xlnet_tf import XLNetConfig, XLNetTokenizer, checkpoint, ram
from xlnet_tf.config import describe_activation
from xlnet_tf.hardware import POLICY_OF_DTYPE as EXPORT_PRECISIONS  # --export_precision -> the export's policy
from xlnet_tf.train_config import TrainConfig


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


def output_paths(F) -> Dict[str, str]:
    """The run's directories (created by ``start_run`` once the run may start: a refused start leaves none)."""
    if not F.output_dir:
        raise ValueError("--output_dir is required")
    return {"output_dir": F.output_dir, "model_dir": model_dir(F),
            "cache_dir": F.cache_dir or os.path.join(F.output_dir, "data")}


def model_config(F, **overrides):
    """XLNetConfig from --model_config_path (or the checkpoint's), with the run options of the flags."""
    run = dict(dropout=F.dropout, dropatt=F.dropatt, clamp_len=F.clamp_len, recompute=F.recompute,
               pos_dropout=F.pos_dropout, accelerate=F.accelerate)
    run.update(overrides)
    if F.model_config_path:
        config = XLNetConfig.load(F.model_config_path, **run)
        logging.getLogger("run").info("--model_config_path=%s: %s", F.model_config_path,
                                      describe_activation(config.ff_activation))
        return config
    if F.init_checkpoint:
        return checkpoint_config(F.init_checkpoint, run)
    raise ValueError("pass --model_config_path (a json or a preset name) or --init_checkpoint")


def checkpoint_config(path: str, overrides: dict):
    """The config next to the checkpoint at ``path`` (``--init_checkpoint``), with ``overrides``; the error
    without one names the flag that gives it."""
    return checkpoint.resolve_config(path, checkpoint.detect_format(path), None, overrides,
                                     fix="pass --model_config_path (the model's xlnet_config.json or a preset name)")


def train_config(F, model_dir: str):
    return TrainConfig(
        learning_rate=F.learning_rate, train_steps=F.train_steps, warmup_steps=F.warmup_steps,
        min_lr_ratio=F.min_lr_ratio, weight_decay=F.weight_decay, adam_epsilon=F.adam_epsilon,
        adam_bias_correction=F.adam_bias_correction, pretrained=bool(F.init_checkpoint), clip_norm=F.clip,
        lr_layer_decay_rate=F.lr_layer_decay_rate, layer_decay_mode=F.layer_decay_mode,
        grad_accum_steps=F.grad_accum_steps, precision=F.precision, num_trainable_layers=F.num_trainable_layers,
        jit_compile=F.jit, model_dir=model_dir,
        save_steps=F.save_steps, keep_checkpoint_max=F.keep_checkpoint_max, log_steps=F.iterations,
        seed=F.seed, progress=F.progress)


def length_options(F) -> dict:
    """The task runs' padding options: ``bucket``, training batches grouped by length (--length_buckets, unless
    gradient accumulation needs one shape), and ``length_multiple`` (--length_multiple; 0: None, the rule of
    ``xlnet_tf/lengths.py``)."""
    return dict(bucket=bool(F.length_buckets) and F.grad_accum_steps == 1, length_multiple=F.length_multiple or None)


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
    """A training run's steps and learning rate must be positive; warmup longer than the run is legal but
    unintended."""
    if F.train_steps < 1:
        raise ValueError(f"--train_steps={F.train_steps}: expected >= 1 to train")
    if F.learning_rate <= 0:
        raise ValueError(f"--learning_rate={F.learning_rate:g}: expected > 0 to train")
    if F.warmup_steps > F.train_steps:
        logging.getLogger("run").warning(
            "--warmup_steps=%d > --train_steps=%d: the peak learning rate %g is never reached (the last step's is "
            "%g)", F.warmup_steps, F.train_steps, F.learning_rate, F.learning_rate * F.train_steps / F.warmup_steps)


def check_text_room(F, pair: bool, memory: bool = False) -> None:
    """--max_seq_length must leave a text piece beside the special tokens (the classifier's rule:
    ``check_text_room`` in tasks/classification/features.py)."""
    cls_features.check_text_room(F.max_seq_length, pair, memory, flags=True)


def check_memory(F, config, training: bool, head: ram.HeadSize, rows: int = 1,
                 length_flag: str = "max_seq_length") -> None:
    """Refuses (one line) a run whose ``xlnet_tf.ram`` estimate exceeds the machine's memory, before any work:
    training at --train_batch_size, else inference at the evaluation batch; ``head``: the run's head as it
    describes itself (``TaskSpec.head_size()``); ``rows``: sequences per example (RACE: its 4 options);
    ``length_flag``: the flag holding the sequence length. Whole-step XLA's estimate (the smaller one) is used, so
    only a run that cannot fit is refused."""
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


def start_run(F, run_dir: str, script: str, task: str, config, tokenizer, training: bool, *, memory: Dict,
              train_sources: Optional[Sequence[str]] = (), data: Optional[Dict] = None,
              work_dirs: Sequence[str] = ()):
    """Checks the inputs against the model and takes ``run_dir`` for this run (``run_state.take_run_dir``: lock,
    stale temporaries, manifest), then creates ``work_dirs`` (the run's checkpoint and cache directories: created
    only here, so a refused start leaves no empty folders). Held until the process exits. ``train_sources=None``:
    the training data is not given to this run (reused records) and not compared. ``memory``: the task's arguments
    of ``check_memory`` (its head's description, rows per example, the length flag)."""
    vocab = int(tokenizer.vocab_size)
    if vocab > config.n_token:
        raise ValueError(f"--spiece_model_file {tokenizer.spiece_model_file}: vocabulary of {vocab} pieces, but "
                         f"the model embeds only n_token={config.n_token}: use the model's own spiece.model")
    _check_case(F)
    if training:
        check_schedule(F)
    check_memory(F, config, training, **memory)
    manifest = run_state.run_manifest(F, script, task, config, tokenizer, data, train_sources)
    guard = run_state.take_run_dir(F, run_dir, manifest, training, work_dirs)
    for d in work_dirs:
        os.makedirs(d, exist_ok=True)
    return guard


def model_dir(F) -> str:
    return F.model_dir or os.path.join(F.output_dir, "model")


def check_export(F, spec) -> None:
    """A ``--export_format`` the task's export cannot be written in (memory mode: a SavedModel only),
    refused in one line before ``start_run`` (the format name itself: ``Plan.check``)."""
    if F.export_dir:
        try:
            spec.check_export(F.export_format)
        except ValueError as e:
            raise ValueError(f"--export_format: {e}") from None


def plan(F, do_eval: Optional[bool] = None, do_predict: Optional[bool] = None, results_dir: Optional[str] = None):
    """The runner's ``Plan`` from the flags (``do_eval`` / ``do_predict`` override theirs), checked (something to
    do) before any work."""
    plan_ = runner.Plan(output_dir=F.output_dir, model_dir=model_dir(F), do_train=F.do_train,
                        do_eval=F.do_eval if do_eval is None else do_eval,
                        do_predict=F.do_predict if do_predict is None else do_predict,
                        export_dir=F.export_dir, export_precision=EXPORT_PRECISIONS[F.export_precision],
                        export_format=F.export_format,
                        export_huggingface=F.export_huggingface,
                        eval_all_checkpoints=F.eval_all_ckpt,
                        train_batch_size=F.train_batch_size, results_dir=results_dir,
                        fail_if_unhealthy=bool(getattr(F, "fail_if_unhealthy", False)))
    plan_.check()
    return plan_


def task_options(F, tokenizer, config, cache_dir: str, head_options: Dict, memory: bool = False):
    """The runner's ``TaskOptions`` from the flags (``memory``: --long_doc_mode=memory, checked by
    ``long_doc_options``)."""
    return runner.TaskOptions(
        tokenizer=tokenizer, config=config, max_seq_length=F.max_seq_length, cache_dir=cache_dir,
        eval_batch_size=F.eval_batch_size, predict_batch_size=F.predict_batch_size, head_options=head_options,
        seed=F.seed, progress=F.progress, overwrite_data=F.overwrite_data,
        max_segments=F.max_segments if memory else None, num_workers=getattr(F, "num_workers", None),
        **length_options(F))


def run_task(F, task, plan_, config, strategy_) -> None:
    """Runs ``task`` (a ``runner.TaskSpec``) by the flags' ``plan_`` with the one runner."""
    runner.run(task, plan_, config, train_config(F, plan_.model_dir), strategy_, F.init_checkpoint, F.seed)


def strategy(F):
    from xlnet_tf.distribute import get_strategy

    return get_strategy(F.strategy, tpu=F.tpu, num_cpu_devices=F.num_cpu_devices)


def tokenizer(F):
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
