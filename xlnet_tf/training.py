"""The command lines' training loop around the one update (``xlnet_tf/train_step.py``), plus ``predict``.

Contract of the model built by ``model_fn`` (a TaskModel): ``n_layer``; ``call(features, training) -> dict``;
``loss(features, outputs) -> float32 [batch]`` per-example losses; ``variable_depth(variable) -> int``
(0 = embeddings, l+1 = block l, n_layer+1 = head).

``dataset_fn(input_context) -> tf.data.Dataset`` yields feature dicts batched with the PER-REPLICA batch size
(``input_context.get_per_replica_batch_size(global_batch)``), repeated; with ``grad_accum_steps > 1`` the
batches must have a fixed shape (they are stacked ``k`` at a time).

One step = ``UpdateRule.replica_fn`` on every replica (``grad_accum_steps`` micro-batches, one all-reduce,
clipping, layer decay, loss scaling, the optimizer's update: ``xlnet_tf/train_step.py``, the same update Keras
``fit`` runs on the task models). The loop around it keeps what a long unattended run needs and ``fit`` does not
give: a checkpointed input iterator, resuming past damaged checkpoints, Ctrl-C to one line, the history file.

Reproducibility: weights from ``keras.utils.set_random_seed(seed)``. Dropout has two RNG schemes, because
the backbone must replay its masks: the backbone draws them statelessly from its own checkpointed
``[seed, counter]`` (``XLNetModel.dropout_seed``, one seed per forward pass, so a recomputed block redraws the
same masks; ``xlnet_tf.ops``); the heads' plain Keras ``Dropout`` layers use ``SeedGenerator`` states, which
the loop re-seeds at each step from (seed, generator, step, replica). So resuming needs no other RNG state. The input
position is the checkpointed tf.data iterator (``data_resume="iterator"``; only possible on one device: TF
cannot checkpoint distributed iterators) or a ``skip`` of the consumed batches (``"skip"``, the ``"auto"``
choice under Mirrored/MultiWorker/TPU strategies), which needs a deterministic ``dataset_fn`` (seeded shuffles,
deterministic maps).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import checkpoint_files, datasets, hardware
# (the loop's neighbours, one job each; their names stay readable as training.X)
from xlnet_tf.checkpoint_files import HISTORY_FILE, resume_point, write_history  # noqa: F401
from xlnet_tf.device_policy import check_precision, default_jit, device_kind, update_groups  # noqa: F401
from xlnet_tf.progress import Progress, write_scalar
from xlnet_tf.train_config import TrainConfig  # noqa: F401  (the loop's options: training.TrainConfig)
from xlnet_tf.tf_checkpoint import CheckpointError
from xlnet_tf.train_step import UpdateRule

log = logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during ``Trainer.train``: the step reached, the step of the last checkpoint (None: none
    yet) and where it is. A rerun resumes from that checkpoint exactly as after any other stop."""

    def __init__(self, step: int, checkpoint_step: Optional[int], model_dir: Optional[str]):
        super().__init__(step, checkpoint_step, model_dir)
        self.step, self.checkpoint_step, self.model_dir = step, checkpoint_step, model_dir


class Diverged(ValueError):
    """The training loss (or the gradients' norm) stopped being finite: the run diverged. The step, the last
    finite loss and the last checkpoint kept (every checkpoint was saved at a finite loss); a ValueError, so the
    entry points print it as their one ``error:`` line (exit code 2) and export nothing."""

    def __init__(self, message: str, step: int, last_finite: Optional[Tuple[int, float]],
                 checkpoint: Optional[str]):
        super().__init__(message)
        self.step, self.last_finite, self.checkpoint = step, last_finite, checkpoint


class TrainResult(NamedTuple):
    model: Any
    history: List[Tuple[int, float]]


class Trainer:
    """Builds model, optimizer, data iterator and checkpoint under ``strategy``; ``train()`` runs the loop."""

    def __init__(self, model_fn: Callable[[], Any], dataset_fn: Callable, config: TrainConfig,
                 strategy: Optional[tf.distribute.Strategy] = None):
        self.config = cfg = config
        self.strategy = strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = bool(strategy.extended.should_checkpoint)
        self.fp16 = cfg.precision == "mixed_float16"
        check_precision(strategy, cfg.precision)
        self._dataset_fn = dataset_fn

        keras.utils.set_random_seed(cfg.seed)
        previous_policy = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(cfg.precision)
        try:
            with strategy.scope():
                self.model = model_fn()
                if not self.model.variables:  # build on one batch
                    features = next(iter(dataset_fn(tf.distribute.InputContext()).take(1)))
                    self.model(features, training=False)
        finally:
            keras.mixed_precision.set_global_policy(previous_policy)

        with strategy.scope():
            self.rule = UpdateRule(self.model, cfg, strategy)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        rule = self.rule
        self.jit, self.train_vars, self.grad_mult = rule.jit, rule.train_vars, rule.grad_mult
        self.optimizer, self.outer_optimizer, self.apply_update = rule.optimizer, rule.outer_optimizer, rule.apply_update

        self._ckpt_dir = None
        latest = None
        if cfg.model_dir:
            self._ckpt_dir = cfg.model_dir
            latest = resume_point(cfg.model_dir)
            if not self.is_chief:  # every worker saves (collective); only the chief's files are kept
                self._ckpt_dir = tempfile.mkdtemp(prefix="xlnet_worker_ckpt_")
        start = int(tf.train.load_variable(latest, "step/.ATTRIBUTES/VARIABLE_VALUE")) if latest else 0
        self.iterator = self._make_iterator(0)
        trackable = isinstance(self.iterator, tf.__internal__.tracking.Trackable)
        if cfg.data_resume == "auto":  # iterator when possible (and present in the checkpoint being resumed)
            in_ckpt = not latest or any(n.startswith("iterator/") for n, _ in tf.train.list_variables(latest))
            self.data_resume = "iterator" if trackable and in_ckpt else "skip"
        else:
            self.data_resume = cfg.data_resume
        if self.data_resume == "iterator" and not trackable:
            raise ValueError(f"data_resume='iterator': {type(strategy).__name__}'s distributed iterators cannot be "
                             "checkpointed in this TensorFlow; use 'skip' (deterministic dataset_fn) or 'auto'")
        if self.data_resume == "skip" and start:
            self.iterator = self._make_iterator(start)
        items = dict(model=self.model, optimizer=self.outer_optimizer, step=self.step)
        if self.data_resume == "iterator":
            items["iterator"] = self.iterator
        self.checkpoint = tf.train.Checkpoint(**items)
        self.manager = None
        if self._ckpt_dir:
            self.manager = tf.train.CheckpointManager(self.checkpoint, self._ckpt_dir, cfg.keep_checkpoint_max,
                                                      step_counter=self.step)
        if latest:
            try:
                self.checkpoint.restore(latest).assert_existing_objects_matched()
            except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as e:
                detail = str(e).strip().splitlines()[0][:300]
                raise CheckpointError(f"{latest}: this checkpoint does not fit the model being trained ({detail}); "
                                      f"use a new output directory or remove it") from None
        self.restored_from = latest
        self._saved: Optional[str] = None  # the last checkpoint this trainer wrote
        self._step_fn = self._build_step()

    def close(self) -> None:
        """Lets go of the input iterator (and the checkpoint that tracks it): its open files close now, not when
        Python next collects the trainer's reference cycles (the step function refers back to the trainer)."""
        self.iterator = self.checkpoint = self.manager = None

    # ------------------------------------------------------------------ pieces
    def _make_iterator(self, skip: int):
        k = self.config.grad_accum_steps

        def fn(ctx):
            ds = datasets.for_iteration(self._dataset_fn(ctx)).batch(k, drop_remainder=True)
            per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines  # elements consumed per step
            return ds.skip(skip * per_pipeline) if skip else ds

        return iter(self.strategy.distribute_datasets_from_function(fn))

    def _build_step(self):
        """One step: the next batch from the iterator, the rule's update on every replica (``UpdateRule``, the
        update Keras ``fit`` runs too), the global step counted."""
        strategy, replica_fn = self.strategy, self.rule.replica_fn

        @tf.function(autograph=False)
        def train_step(iterator):
            batch = next(iterator)
            loss, gnorm = strategy.run(replica_fn, args=(batch, self.step.read_value()))
            self.step.assign_add(1)
            first = lambda t: strategy.experimental_local_results(t)[0]
            return first(loss), first(gnorm)

        return train_step

    def save(self) -> Optional[str]:
        """Checkpoint of the current step (``checkpoint_files.save``: no partial files stay behind a failed save)."""
        if self.manager is None:
            return None
        self._saved = path = checkpoint_files.save(self.manager, int(self.step.numpy()), self._ckpt_dir)
        if not self.is_chief:
            shutil.rmtree(self._ckpt_dir, ignore_errors=True)
        return path

    def _save_history(self, history) -> None:
        """``model_dir/train_history.json``, written BEFORE each checkpoint: a run killed between the two resumes
        from the older checkpoint and rewrites the steps after it, so the file always covers every step."""
        if self.config.model_dir and self.is_chief:
            write_history(os.path.join(self.config.model_dir, HISTORY_FILE), history)

    # ------------------------------------------------------------------ loop
    def train(self, stop_at: Optional[int] = None) -> TrainResult:
        """Runs to ``train_steps`` (or ``stop_at``, to simulate an interruption); returns (model, history)."""
        cfg = self.config
        end = min(cfg.train_steps, stop_at) if stop_at else cfg.train_steps
        step = int(self.step.numpy())
        writer = None
        if cfg.model_dir and self.is_chief:
            writer = tf.summary.create_file_writer(os.path.join(cfg.model_dir, "train"))
        bar = Progress(cfg.train_steps, cfg.log_steps) if cfg.progress and self.is_chief else None
        history: List[Tuple[int, float]] = []
        try:
            step = self._loop(step, end, writer, bar, history)
        except KeyboardInterrupt:
            latest = self._saved or self.restored_from  # (the manager's latest may be a damaged one passed over)
            raise Interrupted(step if not history else history[-1][0],
                              int(latest.rsplit("-", 1)[1]) if latest else None, cfg.model_dir) from None
        self._save_history(history)
        if history and step == cfg.train_steps and not (cfg.save_steps and step % cfg.save_steps == 0):
            self.save()  # final checkpoint (unless just written)
        if writer:
            writer.close()
        if history:  # batches padded to their longest (data/lengths.py) must not retrace the step per shape
            log.info("training step traced %d time(s) for %d steps", self._step_fn.experimental_get_tracing_count(),
                     len(history))
        if bar and bar.tty and step != cfg.train_steps:
            bar.close()
        return TrainResult(self.model, history)

    def _loop(self, step: int, end: int, writer, bar, history: List[Tuple[int, float]]) -> int:
        """Steps to ``end``, logging, checkpointing every ``save_steps``; returns the step reached."""
        cfg = self.config
        t0, s0, window = None, step, []
        while step < end:
            lr = float(self.optimizer.learning_rate)
            loss, gnorm = self._step_fn(self.iterator)
            loss = float(loss)
            step += 1
            history.append((step, loss))
            window.append(loss)
            if t0 is None:  # exclude tracing/compilation from the rate
                t0, s0 = time.time(), step
            rate = (step - s0) / (time.time() - t0) if step > s0 else 0.0
            if bar:
                bar.update(step, loss, lr, rate)
            if writer and (step % max(cfg.log_steps, 1) == 0 or step == end):
                with writer.as_default():
                    scalars = {"loss": np.mean(window), "learning_rate": lr, "grad_norm": gnorm, "steps_per_sec": rate}
                    if self.fp16:
                        scalars["loss_scale"] = self.outer_optimizer.dynamic_scale.numpy()
                    for name, value in scalars.items():
                        write_scalar(name, value, step)
                writer.flush()
                window = []
            if not self.fp16 and not (math.isfinite(loss) and math.isfinite(float(gnorm))):
                raise self._diverged(step, loss, float(gnorm), history)
            if cfg.save_steps and step % cfg.save_steps == 0:
                self._save_history(history)
                self.save()
        return step

    def _diverged(self, step: int, loss: float, gnorm: float, history) -> Diverged:
        """The error of a step whose loss or gradient norm is not finite (its update is not saved)."""
        kept = self._saved or self.restored_from
        what = f"loss {loss:g}" if not math.isfinite(loss) else f"gradient norm {gnorm:g} (loss {loss:.4g})"
        outcome = (f"the last checkpoint ({kept}) is kept" if kept else "no checkpoint was saved") + \
            " and nothing is exported"
        return diverged(what, step, history, self.config, outcome, ("--learning_rate", "--clip"), kept)


def diverged(what: str, step: int, history, config: TrainConfig, outcome: str, names, checkpoint=None) -> Diverged:
    """The one divergence message (the command lines' loop and Keras ``fit``): what was not finite at ``step``,
    the last finite loss of ``history`` [(step, loss)], ``outcome`` (what was kept), and what to lower, in the
    caller's option ``names`` (learning rate, clipping)."""
    finite = [(s, v) for s, v in history if math.isfinite(v)]
    last = finite[-1] if finite else None
    lr, clip = names
    return Diverged(
        f"training diverged: {what} at step {step}"
        + (f", the last finite loss {last[1]:.4g} at step {last[0]}" if last else "")
        + f"; {outcome}: lower {lr} (now {config.learning_rate:g})"
        + (f" or clip the gradients harder ({clip}, now {config.clip_norm:g})" if config.clip_norm
           else f" or clip the gradients ({clip}=1.0; now off)"), step, last, checkpoint)


def train(model_fn: Callable[[], Any], dataset_fn: Callable, config: TrainConfig,
          strategy: Optional[tf.distribute.Strategy] = None) -> TrainResult:
    """Builds a ``Trainer`` (resuming from ``config.model_dir`` if it holds a checkpoint) and trains."""
    return Trainer(model_fn, dataset_fn, config, strategy).train()


def predict(model, dataset: tf.data.Dataset, strategy: Optional[tf.distribute.Strategy] = None,
            output_fn: Optional[Callable[[Dict, Dict], Dict]] = None) -> Dict[str, np.ndarray]:
    """Runs ``model(features, training=False)`` over a finite dataset (GLOBAL batch size) and concatenates.

    ``output_fn(features, outputs) -> dict`` selects what to return (default: the outputs). Every returned
    tensor needs a leading batch axis. Partial last batches are fine under MirroredStrategy; row order is the
    dataset's order on one worker.
    """
    strategy = strategy or tf.distribute.get_strategy()
    output_fn = output_fn or (lambda features, outputs: outputs)
    dist = strategy.experimental_distribute_dataset(datasets.for_iteration(dataset))
    forward = lambda f: dict(output_fn(f, model(f, training=False)))  # noqa: E731
    policy = getattr(getattr(model, "dtype_policy", None), "name", "float32")
    if policy in hardware.PRECISIONS:
        check_precision(strategy, policy)
    if policy == "mixed_float16" and default_jit(strategy, policy) == "step":
        # as training: on a CPU only XLA has fast float16
        forward = tf.function(forward, jit_compile=True, autograph=False)

    # One trace for every batch: the dataset's element spec (its padded length and last batch left open), not
    # one per batch shape (batches padded to their own longest row would each trace the model again).
    @tf.function(autograph=False, input_signature=[dist.element_spec])
    def step(features):
        out = strategy.run(forward, args=(features,))
        return {key: strategy.gather(val, axis=0) for key, val in out.items()}

    chunks: Dict[str, List[np.ndarray]] = {}
    for features in dist:
        for key, val in step(features).items():
            chunks.setdefault(key, []).append(val.numpy())
    return {key: np.concatenate(vals, axis=0) for key, vals in chunks.items()}
