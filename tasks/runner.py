"""One runner for every fine-tuning task: train, evaluate, predict, export (plain arguments; the run_*.py entry
points turn flags into a ``Plan`` and a ``TaskSpec``).

Order, the same for every task: every input the run needs is read (features built or taken from the cache)
before the first training step, so a bad dev or test file fails at once; then training (resumable), evaluation
of the last (or every kept) checkpoint with ``eval_results.json`` and the health check (``tasks/health.py``), the
training curve ``OUTPUT_DIR/training_curve.png`` (``tasks/report.py``), predictions, the SavedModel export and
the HuggingFace one. With ``Plan.fail_if_unhealthy`` an unhealthy run stops after its results and curve are
written (``health.NotLearning``: no predictions, no export).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Dict, Optional, Sequence

from xlnet_tf.data import lengths
from xlnet_tf.tasks import health, report
from xlnet_tf.tasks.export_formats import check_format
from xlnet_tf.fileutil import write_json
from xlnet_tf.train_config import TrainConfig

log = logging.getLogger("runner")


@dataclasses.dataclass
class Plan:
    """What a run does and where. ``results_dir``: where ``eval_results.json`` goes (default ``output_dir``);
    ``fail_if_unhealthy``: raise ``health.NotLearning`` when the health check warns."""
    output_dir: str
    model_dir: str
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    export_dir: Optional[str] = None
    export_precision: str = "float32"  # the Keras policy the export computes in (FineTuner.model_for_inference)
    export_format: str = "tf_saved_model"  # Keras' format names (tasks/export_formats.py)
    export_huggingface: Optional[str] = None  # transformers' model with the same head (config.json + safetensors)
    eval_all_checkpoints: bool = False
    train_batch_size: int = 32
    results_dir: Optional[str] = None
    fail_if_unhealthy: bool = False

    def check(self) -> None:
        if not (self.do_train or self.do_eval or self.do_predict or self.export_dir or self.export_huggingface):
            raise ValueError("nothing to do: pass --do_train, --do_eval, --do_predict, --export_dir and/or "
                             "--export_huggingface")
        try:
            check_format(self.export_format)
        except ValueError as e:
            raise ValueError(f"--export_format: {e}") from None


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What every task's run reads besides its own data (``run_common.task_options`` builds it from the flags);
    the spec reads it as ``spec.options`` (nothing is copied out). ``max_segments``: memory mode (long documents in
    up to that many windows; the model's ``config.mem_len`` > 0); ``bucket``: training batches of one length
    group, padded to their longest (``data.lengths``; memory mode: the same window count). Evaluation batches are
    always padded to their longest. Padded lengths are rounded up to ``length_multiple``. Resolved when built:
    ``predict_batch_size`` None is ``eval_batch_size``; ``length_multiple`` None is the rule for this machine and
    model (``data.lengths.default_multiple``)."""
    tokenizer: Any
    config: Any
    max_seq_length: int
    cache_dir: str
    eval_batch_size: int = 32
    predict_batch_size: Optional[int] = None
    head_options: Dict = dataclasses.field(default_factory=dict)
    seed: int = TrainConfig.seed
    progress: bool = TrainConfig.progress
    overwrite_data: bool = False
    max_segments: Optional[int] = None
    bucket: bool = True
    length_multiple: Optional[int] = None
    num_workers: Optional[int] = None  # processes writing features (tasks that parallelise it)

    def __post_init__(self):
        if self.predict_batch_size is None:
            object.__setattr__(self, "predict_batch_size", self.eval_batch_size)
        if self.max_segments is not None:
            object.__setattr__(self, "max_segments", int(self.max_segments) or None)
        if self.length_multiple is None:
            object.__setattr__(self, "length_multiple", lengths.default_multiple(self.config))
            log.info("batches padded to their longest example, rounded up to a multiple of %d (by device and model "
                     "size: xlnet_tf/lengths.py)", self.length_multiple)


def check_long_doc(task_name: str, config, max_segments: Optional[int], pair: bool = False) -> None:
    """Memory mode (``max_segments``, from --long_doc_mode=memory) needs single-text examples and a model with
    memory (``config.mem_len`` > 0); one line otherwise."""
    if not max_segments:
        return
    if pair:
        raise ValueError(f"--long_doc_mode=memory: task {task_name} has two texts; memory mode handles single-text "
                         f"tasks (use --long_doc_mode=truncate)")
    if config.mem_len <= 0:
        raise ValueError("--long_doc_mode=memory needs --mem_len > 0")


class TaskSpec:
    """What the runner needs of a task. ``finetuner`` (an ``xlnet_tf.finetune.FineTuner``) is set by the
    runner before any method below is called; ``options`` is the run's ``TaskOptions``."""
    name = "task"
    main_metric = "accuracy"
    finetuner = None
    pair = False  # examples of two texts (memory mode refuses them)

    def __init__(self, options: TaskOptions):
        self.options = options
        check_long_doc(self.name, options.config, options.max_segments, self.pair)

    def head_parts(self):
        """(the head's class, its arguments): what ``head`` makes and ``head_size`` describes."""
        raise NotImplementedError

    def head(self):
        """A fresh head (``xlnet_tf.head.Head``)."""
        cls, args = self.head_parts()
        return cls(**args)

    def head_size(self):
        """The head's own description for the RAM estimate (``xlnet_tf.ram.HeadSize``), without making it."""
        cls, args = self.head_parts()
        return cls.size(self.options.config, **args)

    def feature_spec(self) -> Dict:
        raise NotImplementedError

    def features(self, split: str):
        """What ``build_features(split)`` returns (the TFRecord path with its count or index), built once per
        run: ``prepare`` and the later phases ask for the same splits."""
        built = self.__dict__.setdefault("_built_features", {})
        if split not in built:
            built[split] = self.build_features(split)
        return built[split]

    def build_features(self, split: str):
        raise NotImplementedError

    def prepare(self, splits: Sequence[str]) -> None:
        """Builds (or validates the cache of) the features of ``splits``: "train", "eval", "predict"."""

    def train_dataset(self, batch_size: int, input_context):
        raise NotImplementedError

    def evaluate(self, model, step: int) -> Dict:
        raise NotImplementedError

    def finish_evaluation(self, results: Dict, results_dir: str) -> None:
        """After the (best) checkpoint was scored: writes ``eval_results.json``."""
        write_json(os.path.join(results_dir, "eval_results.json"), results)
        log.info("eval: %s", {k: v for k, v in results.items() if not isinstance(v, (dict, list))})
        for line in report.class_table(results):
            log.info("  %s", line)

    def predict(self, model, output_dir: str) -> str:
        """Writes the predictions of the unlabelled split; returns their path."""
        raise NotImplementedError

    # What ``export_formats.check_format`` calls this task's export ("classifier": every format).
    export_kind = "task"

    def check_export(self, fmt: str) -> None:
        """Refuses (one line) an export format this task's export cannot be written in, before any work (the
        classifier and RACE: every format but in memory mode)."""
        check_format(fmt, memory=bool(self.options.max_segments), task=self.export_kind)

    def export(self, model, export_dir: str, fmt: str = "tf_saved_model") -> None:
        raise NotImplementedError


def train_history(model_dir: Optional[str], history=None):
    """The whole run's [(step, loss)]: ``model_dir/train_history.json`` (written by every training process of
    the run, so a resumed run has all its steps), else ``history``."""
    path = os.path.join(model_dir, "train_history.json") if model_dir else None
    if path and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            pass
    return history or []


def health_context(train_config, init_checkpoint: Optional[str]) -> Dict:
    """What ``tasks.health.likely_causes`` reads of the run's settings."""
    if train_config is None:
        return {"pretrained": bool(init_checkpoint)}
    return {"learning_rate": train_config.learning_rate, "weight_decay": train_config.weight_decay,
            "bias_correction": train_config.adam_bias_correction,
            "pretrained": bool(init_checkpoint), "train_steps": train_config.train_steps,
            "warmup_steps": train_config.warmup_steps}


def run(task: TaskSpec, plan: Plan, config, train_config, strategy=None, init_checkpoint: Optional[str] = None,
        seed: int = TrainConfig.seed) -> None:
    from xlnet_tf import finetune

    plan.check()
    ft = finetune.FineTuner(config=config, head_fn=task.head, feature_spec=task.feature_spec(), strategy=strategy,
                            init_checkpoint=init_checkpoint, seed=seed)
    task.finetuner = ft
    if plan.export_dir:  # a format this export cannot be written in is refused before any work
        task.check_export(plan.export_format)
    if plan.export_huggingface:  # a head HuggingFace lacks is refused before any work
        try:
            task.head().huggingface_config()
        except ValueError as e:
            raise ValueError(f"--export_huggingface: {e}") from None
    splits = [s for s, wanted in (("train", plan.do_train), ("eval", plan.do_eval), ("predict", plan.do_predict))
              if wanted]
    task.prepare(splits)
    context = health_context(train_config, init_checkpoint)
    verdict, history = None, []
    if plan.do_train:
        t0 = time.time()
        result = ft.train(task.train_dataset, plan.train_batch_size, train_config)
        if result.history:
            seconds = time.time() - t0
            log.info("trained %d steps in %.1fs (%.2f steps/s incl. compilation); loss %.4f -> %.4f",
                     len(result.history), seconds, len(result.history) / seconds, result.history[0][1],
                     result.history[-1][1])
        history = train_history(plan.model_dir, result.history)
        if not plan.do_eval:  # evaluation reports the trend with the predictions
            verdict = health.assess(None, health.loss_trend(history), context)
            health.report(verdict, task.name)
            write_curve(task, plan, history, train_config, [])
    if plan.do_eval:
        results = ft.evaluate_checkpoints(plan.model_dir, task.evaluate, all_checkpoints=plan.eval_all_checkpoints,
                                          main_metric=task.main_metric)
        history = train_history(plan.model_dir) if plan.model_dir else []
        trend = health.loss_trend(history) if plan.model_dir else None
        results["health"] = verdict = health.assess(results.pop("health", None), trend, context,
                                                    eval_loss=results.get("loss"))
        health.report(results["health"], task.name)
        task.finish_evaluation(results, plan.results_dir or plan.output_dir)
        write_curve(task, plan, history, train_config, results.get("all_checkpoints") or [results])
    failure = health.failure(verdict, task.name) if plan.fail_if_unhealthy and verdict else None
    if failure:
        raise failure
    if plan.do_predict:
        path = task.predict(ft.model_for_inference(plan.model_dir), plan.output_dir)
        log.info("predictions: %s", path)
    if plan.export_dir:
        task.export(ft.model_for_inference(plan.model_dir, precision=plan.export_precision), plan.export_dir,
                    plan.export_format)
    if plan.export_huggingface:
        ft.model_for_inference(plan.model_dir).save_pretrained(plan.export_huggingface, format="huggingface",
                                                               tokenizer=getattr(task.options, "tokenizer", None))
        log.info("HuggingFace model: %s", plan.export_huggingface)


def write_curve(task: TaskSpec, plan: Plan, history, train_config, evaluations) -> None:
    """``OUTPUT_DIR/training_curve.png`` of a run that trained (``tasks/report.py``): its loss, the learning rate
    of ``train_config``'s schedule, and the evaluation loss and main metric at each evaluation."""
    if not history:
        return
    rates = report.learning_rates(train_config, [h[0] for h in history]) if train_config is not None else None
    report.write_curve(os.path.join(plan.output_dir, report.CURVE_FILE), history, rates, evaluations,
                       metric=task.main_metric, title=f"{task.name}: training curve")
