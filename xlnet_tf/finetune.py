"""Fine-tuning glue shared by every task: build the TaskModel, train, restore checkpoints, evaluate, predict.

Plain arguments only (the run_*.py scripts turn flags into them).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import hardware
from xlnet_tf.config import XLNetConfig
from xlnet_tf.task_model import TaskModel
from xlnet_tf.tf_checkpoint import damage_error
from xlnet_tf.train_config import TrainConfig
from xlnet_tf.training import Trainer, predict

log = logging.getLogger(__name__)


def dummy_features(feature_spec: Dict) -> Dict[str, np.ndarray]:
    """One all-zero batch shaped like ``feature_spec`` (builds every variable of a model)."""
    out = {}
    for name, (dtype, shape) in feature_spec.items():
        np_dtype = {"int64": np.int32, "float32": np.float32}.get(dtype)
        if np_dtype is not None:
            out[name] = np.zeros((1,) + tuple(shape), np_dtype)
    if "padding_mask" in out:
        out["padding_mask"][...] = 1
    return out


def checkpoint_step(path: str) -> int:
    try:
        return int(tf.train.load_variable(path, "step/.ATTRIBUTES/VARIABLE_VALUE"))
    except (tf.errors.NotFoundError, ValueError):
        return -1


class FineTuner:
    """Owns the model of one run. ``head_fn()`` builds a fresh head; ``feature_spec`` shapes the dummy batch."""

    def __init__(self, config: XLNetConfig, head_fn: Callable, feature_spec: Dict,
                 strategy: Optional[tf.distribute.Strategy] = None, init_checkpoint: Optional[str] = None,
                 seed: int = TrainConfig.seed):
        self.config, self.head_fn, self.feature_spec = config, head_fn, feature_spec
        self.strategy = strategy or tf.distribute.get_strategy()
        self.init_checkpoint, self.seed = init_checkpoint, seed
        self.model: Optional[TaskModel] = None
        self.step = 0

    def build_model(self, load_init: bool = True) -> TaskModel:
        """Must run under the strategy's scope when variables should be distributed."""
        model = TaskModel(self.config, self.head_fn(), seed=self.seed)
        model.build_with(dummy_features(self.feature_spec))
        if load_init and self.init_checkpoint:
            info = model.load_init_checkpoint(self.init_checkpoint)
            log.info("initialised from %s (%s)", self.init_checkpoint, info)
        return model

    def train(self, dataset_fn: Callable, global_batch_size: int, train_config: TrainConfig):
        """``dataset_fn(per_replica_batch_size, input_context)`` -> repeated tf.data of feature dicts."""
        def ds(ctx):
            return dataset_fn(ctx.get_per_replica_batch_size(global_batch_size), ctx)

        trainer = Trainer(self.build_model, ds, train_config, self.strategy)
        if trainer.restored_from:
            log.info("resumed from %s", trainer.restored_from)
        try:
            result = trainer.train()  # writes model_dir/train_history.json with each checkpoint
        finally:
            trainer.close()
        self.model, self.step = result.model, int(trainer.step.numpy())
        return result

    def restore(self, path: str) -> TaskModel:
        with self.strategy.scope():
            model = self.build_model(load_init=False)
        try:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
        except (IndexError, tf.errors.OpError) as e:  # a truncated or corrupted checkpoint: one line naming it

            raise damage_error(path, e) from None
        self.step = checkpoint_step(path)
        return model

    def model_for_inference(self, model_dir: Optional[str], precision: Optional[str] = None) -> TaskModel:
        """The trained model of this run, else the latest checkpoint in ``model_dir``, else the init checkpoint.

        ``precision`` (a Keras policy: float32, mixed_bfloat16, mixed_float16; None: as trained/restored): the
        same weights in a model built under that policy (float32 variables, 16-bit compute), the global policy
        restored afterwards. Exports use it, so every task's SavedModel gets the same mechanism."""
        model = self._trained_or_restored(model_dir)
        if precision is None or hardware.policy_name(model) == precision:
            return model
        hardware.validate_precision(precision)
        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(precision)
        try:
            with self.strategy.scope():
                other = self.build_model(load_init=False)
        finally:
            keras.mixed_precision.set_global_policy(previous)
        other.set_weights(model.get_weights())  # mixed policies keep float32 variables: the same values
        return other

    def _trained_or_restored(self, model_dir: Optional[str]) -> TaskModel:
        if self.model is not None:
            return self.model
        latest = tf.train.latest_checkpoint(model_dir) if model_dir and os.path.isdir(model_dir) else None
        if latest:
            self.model = self.restore(latest)
        elif self.init_checkpoint:
            with self.strategy.scope():
                self.model = self.build_model(load_init=True)
            self.step = 0
        else:
            raise ValueError(f"no training checkpoint in {model_dir} and no --init_checkpoint: train first "
                             f"(--do_train) or pass a fine-tuned checkpoint")
        return self.model

    def evaluate_checkpoints(self, model_dir: str, evaluate: Callable, all_checkpoints: bool = False,
                             main_metric: Optional[str] = None) -> Dict:
        """``evaluate(model, step) -> metrics``; with ``all_checkpoints`` every kept checkpoint is scored and the
        best (by ``main_metric``) is returned, with the whole list under ``all_checkpoints``."""
        if not all_checkpoints:
            model = self.model_for_inference(model_dir)
            return evaluate(model, self.step)
        state = tf.train.get_checkpoint_state(model_dir)
        paths: List[str] = list(state.all_model_checkpoint_paths) if state else []
        if not paths:
            raise ValueError(f"--eval_all_ckpt: no checkpoints in {model_dir}")
        results = []
        for p in paths:
            results.append(evaluate(self.restore(p), self.step))
            log.info("checkpoint %s: %s", p, results[-1])
        key = main_metric if main_metric in results[0] else "loss"
        best = (min if key == "loss" else max)(results, key=lambda r: r[key])
        return dict(best, all_checkpoints=results, selected_by=key)


def predict_with_labels(model: TaskModel, dataset: tf.data.Dataset,
                        strategy: Optional[tf.distribute.Strategy] = None,
                        features_kept: Sequence[str] = ()) -> Dict[str, np.ndarray]:
    """Predictions plus the labels and per-example losses of a labelled dataset (numpy, dataset order), in one
    pass over it.

    Keys: the head's predictions, ``label``, ``loss``, ``num_tokens`` (real pieces), and each of ``features_kept``
    (per-example features passed through as they are, e.g. RACE's ``level``); a classification ``label``
    prediction is renamed ``label_pred`` so it does not clash with the gold ``label``.
    """
    def output_fn(features, outputs):
        preds = {name: features[name] for name in features_kept}
        preds.update(model.head.predictions(outputs))
        if "label" in preds:
            preds["label_pred"] = preds.pop("label")
        preds["loss"] = tf.cast(model.per_example_loss(features, outputs), tf.float32)
        if "label" in features:
            preds["label"] = features["label"]
        if "padding_mask" in features:  # real pieces per example (all windows / options)
            mask = tf.cast(features["padding_mask"], tf.int32)
            preds["num_tokens"] = tf.reduce_sum(tf.reshape(mask, [tf.shape(mask)[0], -1]), axis=1)
        return preds

    return predict(model, dataset, strategy, output_fn=output_fn)
