"""Keras task models: a ``TaskModel`` (backbone + head) that behaves as a Keras model on raw text.

What every task model (``XLNetClassifier``, ``XLNetQuestionAnswerer``, ``XLNetMultipleChoice``) shares:

* **Built** from an ``XLNetConfig`` (training from scratch) or ``from_pretrained(path)`` (every format
  ``XLNetModel.from_pretrained`` reads; ``spiece.model`` beside it, or ``tokenizer=``).
* **Raw text in**: ``fit`` / ``evaluate`` / ``predict`` take raw strings (the task's own form), numpy feature dicts
  or a ``tf.data.Dataset`` of either, batched; strings become exactly the features the command lines build
  (the task's in-graph layout, ``tasks/<task>/serving.py``, which the tests hold equal to ``features.py``),
  padded to each batch's longest.
* **compile()** with no argument is the command lines' recipe (``TrainConfig``'s defaults: AdamW with the
  original's weight-decay and layer-decay rules, warmup + linear decay, clipping); ``optimizer``, ``loss`` and
  ``metrics`` default to ``"auto"`` and each takes any Keras object instead. Every ``TrainConfig`` field is a
  keyword of ``compile`` (``learning_rate=``, ``warmup_steps=``, ``grad_accum_steps=``, ...); ``train_steps``
  left unset is the length of the ``fit`` call (epochs x steps per epoch) for the learning-rate schedule.
* **One update**: ``train_step`` is ``xlnet_tf.train_step.UpdateRule``'s replica step, the code the command
  lines' loop calls (``tests/test_keras_tasks.py`` holds the weights after 20 steps equal).
* **Saving**: ``save("x.keras")`` / ``keras.saving.load_model`` (the SentencePiece model travels as an asset);
  ``export(dir)`` writes the command lines' SavedModel (raw-text ``serving_default``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import checkpoint, datasets, hardware
from xlnet_tf.config import XLNetConfig
from xlnet_tf.lengths import default_multiple, padded_length
from xlnet_tf.task_model import TaskModel
from xlnet_tf.tokenizer import XLNetTokenizer
from xlnet_tf.train_config import TrainConfig
from xlnet_tf.train_step import UpdateRule

log = logging.getLogger(__name__)

SPIECE = "spiece.model"
AUTO = "auto"


class _Tokenizers:
    """The SentencePiece model of a task model: its bytes (saved with the model), the Python tokenizer and the
    in-graph one (made once). Kept out of Keras' and TensorFlow's tracking (a plain object)."""

    def __init__(self, proto: bytes, lower: bool, directory: str):
        path = os.path.join(directory, SPIECE)
        with open(path, "wb") as f:
            f.write(proto)
        self.proto, self.lower = proto, bool(lower)
        self.python = XLNetTokenizer(path, lower=self.lower)
        self.graph = self.python.tf_tokenizer()  # reads the file now: the directory may go afterwards

    @classmethod
    def from_file(cls, path: str, lower: bool, directory: str) -> "_Tokenizers":
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SentencePiece model not found: {path} (pass tokenizer=PATH/spiece.model)")
        with open(path, "rb") as f:
            return cls(f.read(), lower, directory)


class XLNetTask(TaskModel):
    """Base of the Keras task models (module docstring). Subclasses give ``make_head``, ``text_features``
    (raw strings -> features, in-graph), ``is_raw``, ``metric_pair`` (y, y_pred for compiled metrics),
    ``predict_outputs`` and ``make_serving`` (the command line's serving module over the model)."""

    def __init__(self, config, tokenizer=None, lower: bool = False, max_seq_length: int = 128,
                 seed: int = TrainConfig.seed, pretrained: bool = False, head_options: Optional[Dict[str, Any]] = None, name=None, **kwargs):
        config = config if isinstance(config, XLNetConfig) else XLNetConfig.from_dict(dict(config))
        self.head_options = dict(head_options or {})
        super().__init__(config, self.make_head(config, **self.head_options), seed=seed,
                         name=name or type(self).__name__.lower(), **kwargs)
        self.max_seq_length, self.seed, self.pretrained, self.lower = int(max_seq_length), int(seed), \
            bool(pretrained), bool(lower)
        self._compile_options: Optional[Dict[str, Any]] = None
        object.__setattr__(self, "_rule", None)
        object.__setattr__(self, "_tok", None)
        object.__setattr__(self, "_tmp", None)
        if tokenizer is not None:
            self.set_tokenizer(tokenizer, lower)
        self.build_with(self.dummy_features())

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str, tokenizer=None, lower: bool = False, max_seq_length: int = 128,
                        seed: int = TrainConfig.seed, head_options: Optional[Dict[str, Any]] = None,
                        config_overrides=None, **task_kwargs):
        """Reads every format ``XLNetModel.from_pretrained`` reads (original TF1, HuggingFace, ours) and the head
        when the checkpoint holds it (an original fine-tuned checkpoint, or ``save_pretrained``'s). The tokenizer:
        ``tokenizer`` (a path or an ``XLNetTokenizer``), else ``spiece.model`` in the checkpoint's directory."""
        fmt = checkpoint.detect_format(path)
        config = checkpoint.resolve_config(path, fmt, None, dict(config_overrides or {}))
        if tokenizer is None:
            folder = path if os.path.isdir(path) else os.path.dirname(path)
            tokenizer = os.path.join(folder, SPIECE)
            if not os.path.isfile(tokenizer):
                raise FileNotFoundError(f"{path}: no {SPIECE} beside the checkpoint; pass tokenizer=PATH/{SPIECE}")
        model = cls(config, tokenizer=tokenizer, lower=lower, max_seq_length=max_seq_length, seed=seed,
                    pretrained=True, head_options=head_options, **task_kwargs)
        model.load_init_checkpoint(path)
        return model

    def set_tokenizer(self, tokenizer, lower: Optional[bool] = None) -> None:
        """A SentencePiece model path or an ``XLNetTokenizer`` (its ``lower`` wins)."""
        import tempfile

        if isinstance(tokenizer, XLNetTokenizer):
            lower, tokenizer = tokenizer.lower, tokenizer.spiece_model_file
        self.lower = self.lower if lower is None else bool(lower)
        tmp = tempfile.TemporaryDirectory(prefix="xlnet_task_")
        object.__setattr__(self, "_tmp", tmp)
        object.__setattr__(self, "_tok", _Tokenizers.from_file(str(tokenizer), self.lower, tmp.name))
        object.__setattr__(self, "_serving", None)  # (made again, with this tokenizer, when asked)
        object.__setattr__(self, "_answer_fn", None)
        if self._tok.python.vocab_size > self.config.n_token:
            raise ValueError(f"{tokenizer}: {self._tok.python.vocab_size} pieces, more than the model's n_token "
                             f"{self.config.n_token}")

    @property
    def tokenizer(self) -> XLNetTokenizer:
        if self._tok is None:
            raise ValueError(f"{type(self).__name__} has no tokenizer: build it with tokenizer=PATH/spiece.model "
                             f"(or call set_tokenizer) to read raw text")
        return self._tok.python

    def dummy_features(self) -> Dict[str, np.ndarray]:
        from xlnet_tf.finetune import dummy_features

        return dummy_features(self.feature_spec(8))

    # ------------------------------------------------------------------ Keras: saving
    def get_config(self):
        return {"config": self.config.to_dict(), "lower": self.lower, "max_seq_length": self.max_seq_length,
                "seed": self.seed, "pretrained": self.pretrained, "head_options": self.head_options,
                "name": self.name, **self.task_config()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def save_assets(self, dir_path):
        if self._tok is not None:
            with open(os.path.join(dir_path, SPIECE), "wb") as f:
                f.write(self._tok.proto)

    def load_assets(self, dir_path):
        path = os.path.join(dir_path, SPIECE)
        if os.path.isfile(path):
            self.set_tokenizer(path, self.lower)

    def get_compile_config(self):
        return None if self._compile_options is None else {"xlnet_tf": self._compile_options}

    def compile_from_config(self, config):
        if "xlnet_tf" in (config or {}):
            self.compile(**config["xlnet_tf"])
            self._ensure_rule(1)  # the optimizer's slots, so a saved file's optimizer state loads into them

    # ------------------------------------------------------------------ Keras: compile
    def compile(self, optimizer=AUTO, loss=AUTO, metrics=AUTO, **train_options):
        """``optimizer="auto"``: the command lines' recipe from ``TrainConfig(**train_options)`` (defaults: the
        CLIs' defaults); ``loss="auto"``: the head's loss (any Keras loss of ``(y, y_pred)`` instead, ``y_pred``
        as ``predict`` gives it); ``metrics="auto"``: the task's (``default_metrics``). ``train_steps`` unset: the
        ``fit`` call's length."""
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        keras_kw = {k: train_options.pop(k) for k in list(train_options) if k not in fields}
        unknown = set(keras_kw) - {"steps_per_execution", "run_eagerly"}
        if unknown:
            raise TypeError(f"compile(): unknown argument(s) {sorted(unknown)}; the training options are "
                            f"TrainConfig's fields: {sorted(fields)}")
        if keras_kw.get("steps_per_execution", 1) != 1:
            raise ValueError("compile(steps_per_execution=...): one update per step (use grad_accum_steps)")
        self._train_options = dict(train_options)
        recipe = self.train_config(1)  # checks the values (train_steps unset: fit sets the schedule's length)
        serializable = all(isinstance(v, str) for v in (optimizer, loss, metrics))
        self._compile_options = dict(optimizer=optimizer, loss=loss, metrics=metrics, **train_options) \
            if serializable else None
        self._loss_spec = loss
        object.__setattr__(self, "_rule", None)
        if optimizer == AUTO:
            with self.distribute_strategy.scope():
                optimizer = recipe.optimizer()
        if metrics == AUTO:
            metrics = self.default_metrics()
        self._has_metrics = bool(metrics)
        super().compile(optimizer=optimizer, loss=None, metrics=metrics or None, jit_compile=False,
                        run_eagerly=keras_kw.get("run_eagerly", False))

    def train_config(self, train_steps: int) -> TrainConfig:
        opts = dict(self._train_options)
        opts["train_steps"] = int(opts.get("train_steps") or train_steps)
        opts.setdefault("seed", self.seed)
        opts.setdefault("pretrained", self.pretrained)
        opts.setdefault("precision", hardware.policy_name(self))
        return TrainConfig(**opts)

    def _example_loss(self):
        """(features, outputs) -> per-example loss [batch]."""
        spec = self._loss_spec
        if spec == AUTO:
            return self.per_example_loss
        fn = spec.call if isinstance(spec, keras.losses.Loss) else keras.losses.get(spec)
        return lambda features, outputs: fn(*self.metric_pair(features, outputs))

    # ------------------------------------------------------------------ Keras: the steps
    def _ensure_rule(self, train_steps: int) -> UpdateRule:
        if self._rule is None:
            cfg = self.train_config(train_steps)
            with self.distribute_strategy.scope():
                rule = UpdateRule(self, cfg, self.distribute_strategy, optimizer=self.optimizer,
                                  precision=hardware.policy_name(self))
            object.__setattr__(self, "_rule", rule)
            self.optimizer = rule.outer_optimizer
        return self._rule

    def _set_schedule_length(self, steps: int) -> None:
        """The recipe's schedule decays over the fit call when compile() was not given train_steps. Its length is
        a constant of the traced step, so a new length drops the traced step and the rule that holds it."""
        if self._train_options.get("train_steps") or not steps:
            return
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        schedule = getattr(inner, "_learning_rate", None)
        if hasattr(schedule, "train_steps") and schedule.train_steps != int(steps):
            schedule.train_steps = int(steps)
            object.__setattr__(self, "_rule", None)
            self.train_function = None

    def _features(self, data) -> Dict[str, tf.Tensor]:
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        features = dict(x)
        if y is not None:
            features.update(y if isinstance(y, dict) else {"label": y})
        return features

    def train_step(self, data):
        features = self._features(data)
        if self._rule.config.grad_accum_steps == 1:  # the rule takes [k, batch, ...]
            features = tf.nest.map_structure(lambda t: t[None], features)

        def on_outputs(f, outputs):
            if self._has_metrics:
                self._compile_metrics.update_state(*self.metric_pair(f, outputs))

        step = tf.convert_to_tensor(self.optimizer.iterations)
        # Keras runs this inside its own tf.function under strategy.run: the rule's step itself, except where the
        # whole step is XLA-compiled (one replica: a GPU, or float16 on a CPU), its compiled function
        rule = self._rule
        step_fn = rule.replica_fn if rule.jit == "step" else rule.replica_step
        loss, _ = step_fn(features, step, loss=self._example_loss(), on_outputs=on_outputs)
        size = tf.shape(tf.nest.flatten(features)[0])
        self._loss_tracker.update_state(loss, sample_weight=size[0] * size[1])
        return self.get_metrics_result() if self._has_metrics else {"loss": self._loss_tracker.result()}

    def test_step(self, data):
        features = self._features(data)
        outputs = self(features, training=False)
        per_example = tf.cast(self._example_loss()(features, outputs), tf.float32)
        self._loss_tracker.update_state(tf.reduce_mean(per_example), sample_weight=tf.shape(per_example)[0])
        if self._has_metrics:
            self._compile_metrics.update_state(*self.metric_pair(features, outputs))
        return self.get_metrics_result() if self._has_metrics else {"loss": self._loss_tracker.result()}

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self.predict_outputs(x, self(dict(x), training=False))

    # ------------------------------------------------------------------ Keras: fit / evaluate / predict
    def fit(self, x=None, y=None, batch_size=None, epochs=1, validation_data=None, shuffle=True,
            steps_per_epoch=None, **kwargs):
        if self.optimizer is None:
            raise ValueError(f"{type(self).__name__}: call compile() before fit()")
        k = int(self._train_options.get("grad_accum_steps", 1))
        ds = self.as_dataset(x, y, batch_size or 32, shuffle=shuffle, training=True, micro_batches=k)
        per_epoch = steps_per_epoch or _cardinality(ds)
        self._set_schedule_length((per_epoch or 0) * int(epochs))
        if not self._train_options.get("train_steps") and not per_epoch:
            raise ValueError("fit(): the data's length is unknown, so the learning-rate schedule has no length: "
                             "pass steps_per_epoch=N, or compile(train_steps=N)")
        self._ensure_rule((per_epoch or 1) * int(epochs))
        if validation_data is not None:
            vx, vy, _ = (validation_data, None, None) if isinstance(validation_data, tf.data.Dataset) else \
                keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
            validation_data = self.as_dataset(vx, vy, batch_size or 32, shuffle=False, training=False)
        return super().fit(ds, epochs=epochs, validation_data=validation_data, steps_per_epoch=steps_per_epoch,
                           shuffle=False, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        return super().evaluate(self.as_dataset(x, y, batch_size or 32, shuffle=False, training=False), **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        return super().predict(self.as_dataset(x, None, batch_size or 32, shuffle=False, training=False), **kwargs)

    def as_dataset(self, x, y, batch_size: int, shuffle: bool, training: bool, micro_batches: int = 1):
        """Raw strings (the task's form), a dict of numpy features, or a batched tf.data.Dataset of either ->
        a dataset of (features, labels) batches the steps read (``micro_batches`` > 1: stacked k at a time, the
        update's gradient accumulation; each padded to ``max_seq_length`` so they stack)."""
        fixed = self.max_seq_length if micro_batches > 1 else None
        # the map's function traced as written (no AutoGraph), as every graph function of the project
        preprocess = lambda *e: self._preprocess(*e, length=fixed)  # noqa: E731
        if isinstance(x, tf.data.Dataset):
            ds = x
            if self.is_raw(ds.element_spec):
                ds = ds.map(tf.autograph.experimental.do_not_convert(preprocess), num_parallel_calls=tf.data.AUTOTUNE)
        elif isinstance(x, dict):
            data = dict(x) if y is None else (dict(x), y)
            ds = tf.data.Dataset.from_tensor_slices(data)
            if shuffle and training:
                ds = ds.shuffle(len(next(iter(x.values()))), seed=self.seed)
            ds = ds.batch(batch_size)
        else:
            raw = self.raw_inputs(x)
            ds = tf.data.Dataset.from_tensor_slices(raw if y is None else (raw, np.asarray(y)))
            if shuffle and training:
                ds = ds.shuffle(int(ds.cardinality()), seed=self.seed)
            ds = ds.batch(batch_size).map(tf.autograph.experimental.do_not_convert(preprocess),
                                          num_parallel_calls=tf.data.AUTOTUNE)
        if micro_batches > 1:
            ds = ds.batch(micro_batches, drop_remainder=True)
        return datasets.for_iteration(ds.prefetch(tf.data.AUTOTUNE))

    def _preprocess(self, *element, length=None):
        if len(element) == 1 or not self.labelled(element):
            return self.text_features(element[0] if len(element) == 1 else element, length=length)
        return self.text_features(element[0], length=length), element[1]

    def labelled(self, element) -> bool:
        return len(element) == 2

    def on_length_grid(self, features: Dict[str, tf.Tensor], left: bool) -> Dict[str, tf.Tensor]:
        """A batch re-padded to its longest row rounded up to the command lines' length multiple
        (``xlnet_tf.lengths.default_multiple``: the batch shapes, so the compilations, of a run): extra padding
        columns added, or padding-only columns dropped, on the padded side."""
        mask = features["padding_mask"]
        width = tf.shape(mask)[-1]
        target = padded_length(tf.reduce_max(tf.reduce_sum(mask, -1)), self.max_seq_length, self.length_multiple)
        extra, cut = tf.maximum(target - width, 0), tf.maximum(width - target, 0)
        pads = {"segment_ids": self.segment_pad}
        out = dict(features)
        for key in ("input_ids", "segment_ids", "padding_mask", "p_mask"):
            if key in features:
                t = features[key]
                rank = len(t.shape)
                t = t[..., cut:] if left else t[..., :width - cut]
                pad = [[0, 0]] * (rank - 1) + ([[extra, 0]] if left else [[0, extra]])
                out[key] = tf.pad(t, pad, constant_values=pads.get(key, 1 if key == "p_mask" else 0))
        return out

    @property
    def length_multiple(self) -> int:
        return default_multiple(self.config, accelerated=bool(tf.config.list_logical_devices("GPU")))

    # ------------------------------------------------------------------ export
    def export(self, filepath, format: str = "tf_saved_model", precision: Optional[str] = None, **kwargs):
        """The command lines' export (``--export_dir``, ``--export_format``), in Keras' format names
        (``tasks/export_formats.py``): "tf_saved_model" (``serving_default`` on raw text, ``serve_ids``; needs only
        tensorflow and tensorflow_text to serve), "onnx", "openvino" (raw text through the folder's ``serve.py``
        with that runtime only); anything else is refused in one line before any work. ``precision``:
        ``--export_precision``'s policies."""
        from xlnet_tf.tasks import export_formats

        kind = getattr(self, "export_kind", None) or export_formats.OTHERS.get(type(self).__name__, "this task's")
        export_formats.check_format(format, memory=bool(getattr(self, "memory", False)), task=kind)
        model = self
        if precision is not None and precision != hardware.policy_name(self):
            hardware.validate_precision(precision)
            previous = keras.mixed_precision.global_policy()
            keras.mixed_precision.set_global_policy(precision)
            try:
                model = type(self).from_config(self.get_config())
            finally:
                keras.mixed_precision.set_global_policy(previous)
            model.set_weights(self.get_weights())
            object.__setattr__(model, "_tok", self._tok)
        module = model.serving_module()
        path = export_formats.export(module, filepath, format, **self.export_options())
        log.info("exported %s to %s", format, filepath)
        return path

    def export_options(self) -> Dict[str, Any]:
        return {}

    def serving_module(self):
        """The task's serving module over this model (``make_serving``), made once and eagerly: raw-text
        preprocessing in a dataset map and ``predict`` reuse its tokenizer and layout, the export saves it."""
        if getattr(self, "_serving", None) is None:
            with tf.init_scope():
                object.__setattr__(self, "_serving", self.make_serving())
        return self._serving

    # ------------------------------------------------------------------ per task
    def task_config(self) -> Dict[str, Any]:
        return {}

    def default_metrics(self):
        return []


def _cardinality(ds: tf.data.Dataset) -> Optional[int]:
    n = int(ds.cardinality())
    return n if n > 0 else None
