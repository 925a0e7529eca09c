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

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import random
import tempfile
from typing import Any, Dict, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import checkpoint, datasets, hardware, presets
from xlnet_tf.config import XLNetConfig
from xlnet_tf.fileutil import check_replaceable
from xlnet_tf.lengths import default_multiple, padded_length
from xlnet_tf.task_model import TaskModel
from xlnet_tf.tokenizer import XLNetTokenizer
from xlnet_tf.train_config import TrainConfig
from xlnet_tf.train_step import UpdateRule
from xlnet_tf.tasks import export_formats
from xlnet_tf.tasks import keras_inputs as door
from xlnet_tf.tasks.keras_health import FitHealth, LabelCounts

log = logging.getLogger(__name__)

SPIECE = "spiece.model"
AUTO = "auto"
SAMPLE_WEIGHT = "sample_weight"  # a batch's per-example loss weights travel beside its features under this key
TASK_FILE = checkpoint.TASK_FILE  # the Keras task model's class and arguments, beside its save_pretrained weights


@contextlib.contextmanager
def _seeded(seed: int):
    """Keras' unseeded initializers draw their seeds from Python's ``random`` (``keras.random.make_default_seed``):
    seeded from ``seed`` while a model is built, so its initial weights are the same in every process; the
    caller's ``random`` state is put back after."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def _is_text(x) -> bool:
    """Raw text handed where features are expected: strings, a list of them, or a string array / tensor."""
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, (list, tuple)):
        return bool(x) and _is_text(x[0])
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "US" or (x.dtype == object and x.size > 0 and isinstance(x.flat[0], (str, bytes)))
    return isinstance(x, (tf.Tensor, tf.RaggedTensor)) and x.dtype == tf.string



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
    def from_file(cls, path, lower: bool, directory: str) -> "_Tokenizers":
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"tokenizer: a path to a spiece.model or an XLNetTokenizer is expected, got "
                            f"{type(path).__name__} {path!r}"[:300])
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SentencePiece model not found: {path} (pass tokenizer=PATH/spiece.model)")
        with open(path, "rb") as f:
            proto = f.read()
        try:
            return cls(proto, lower, directory)
        except ValueError:  # (the message would name the private copy)
            raise ValueError(f"{path}: not a SentencePiece model (tokenizer= takes XLNet's spiece.model)") from None


class XLNetTask(TaskModel):
    """Base of the Keras task models (module docstring). Subclasses give ``make_head``, ``text_features``
    (raw strings -> features, in-graph), ``is_raw``, ``metric_pair`` (y, y_pred for compiled metrics),
    ``predict_outputs`` and ``make_serving`` (the command line's serving module over the model)."""

    def __init__(self, config, tokenizer=None, lower: bool = False, max_seq_length: int = 128,
                 seed: int = TrainConfig.seed, pretrained: bool = False, head_options: Optional[Dict[str, Any]] = None, name=None, **kwargs):
        config = config if isinstance(config, XLNetConfig) else XLNetConfig.from_dict(dict(config))
        max_seq_length = door.whole_number("max_seq_length", max_seq_length, 1)
        self.check_lengths(max_seq_length)
        self.head_options = dict(head_options or {})
        with _seeded(int(seed)):  # the whole model's initial weights, head included, from ``seed`` alone
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
    def check_lengths(self, max_seq_length: int) -> None:
        """The task's length rule, its command line's (each task's ``features`` module holds it), refused in one
        line naming the options: the subclasses give it."""

    # (issue 69: names, revision/token/cache_dir/local_files_only, ignore_mismatched_sizes, save_pretrained)
    @classmethod
    def from_pretrained(cls, name_or_path: str, tokenizer=None, lower: Optional[bool] = None,
                        max_seq_length: Optional[int] = None, seed: int = TrainConfig.seed,
                        head_options: Optional[Dict[str, Any]] = None, config_overrides=None, *, revision=None,
                        token=None, cache_dir=None, local_files_only=None, ignore_mismatched_sizes: bool = False,
                        **task_kwargs):
        """Reads every format ``XLNetModel.from_pretrained`` reads (original TF1, HuggingFace, ours), from a path or
        a model name (``xlnet_tf.presets``: ``revision``, ``token``, ``cache_dir``, ``local_files_only``), and the
        head when the checkpoint holds it (an original fine-tuned checkpoint, an HF ``XLNetFor...`` folder, or
        ``save_pretrained``'s); a head that does not fit is refused in one line, or re-initialised with a warning
        under ``ignore_mismatched_sizes=True`` (``TaskModel.load_init_checkpoint``). The tokenizer: ``tokenizer``
        (a path or an ``XLNetTokenizer``), else ``spiece.model`` in the checkpoint's directory; ``lower`` None: the
        folder's ``tokenizer_config.json`` (``do_lower_case``), else cased. A folder ``save_pretrained`` wrote for
        this class gives the task's arguments it was built with (``TASK_FILE``: ``num_classes``, ``regression``,
        ``max_seq_length``, ``head_options``, ...); an HF ``XLNetForSequenceClassification`` folder its number of
        labels and ``problem_type``; the ones passed here win."""
        path = presets.resolve(name_or_path, revision=revision, token=token, cache_dir=cache_dir,
                               local_files_only=local_files_only)
        fmt = checkpoint.detect_format(path)
        config = checkpoint.resolve_config(path, fmt, None, dict(config_overrides or {}))
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        saved = _saved_task(folder, cls) or (_hf_task(folder, cls) if fmt == "hf" else {})
        task_kwargs = dict(saved.get("task", {}), **task_kwargs)
        max_seq_length = max_seq_length or saved.get("max_seq_length", 128)
        head_options = saved.get("head_options") if head_options is None else head_options
        if lower is None:
            lower = checkpoint.tokenizer_lower(folder)
        if tokenizer is None:
            tokenizer = os.path.join(folder, SPIECE)
            if not os.path.isfile(tokenizer):
                raise FileNotFoundError(f"{path}: no {SPIECE} beside the checkpoint; pass tokenizer=PATH/{SPIECE}")
        model = cls(config, tokenizer=tokenizer, lower=lower, max_seq_length=max_seq_length, seed=seed,
                    pretrained=True, head_options=head_options, **task_kwargs)
        model.load_init_checkpoint(path, ignore_mismatched_sizes=ignore_mismatched_sizes)
        return model

    def save_pretrained(self, directory: str, format: str = "own") -> None:
        """``TaskModel.save_pretrained`` with the tokenizer (``spiece.model`` in both formats, and in the HF one the
        files with which transformers' ``AutoTokenizer`` builds the same tokenizer) and the task's arguments
        (``TASK_FILE``), so ``from_pretrained(directory)`` reads the model back whole, its head included."""
        task = {"class": type(self).__name__, "max_seq_length": self.max_seq_length,
                "head_options": self.head_options, "task": self.task_config()}
        super().save_pretrained(directory, format=format, tokenizer=self._tok.python if self._tok else None,
                                extra_files={TASK_FILE: task})
    # (end of issue 69's part)

    def set_tokenizer(self, tokenizer, lower: Optional[bool] = None) -> None:
        """A SentencePiece model path or an ``XLNetTokenizer`` (its ``lower`` wins)."""
        if isinstance(tokenizer, XLNetTokenizer):
            lower, tokenizer = tokenizer.lower, tokenizer.spiece_model_file
        self.lower = self.lower if lower is None else bool(lower)
        tmp = tempfile.TemporaryDirectory(prefix="xlnet_task_")
        object.__setattr__(self, "_tmp", tmp)
        object.__setattr__(self, "_tok", _Tokenizers.from_file(tokenizer, self.lower, tmp.name))
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
        ``fit`` call's length. Values no training means (a learning rate <= 0, negative warmup, ...) are refused
        here, in one line."""
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
        recipe.check_training()
        serializable = all(isinstance(v, str) for v in (optimizer, loss, metrics))
        self._compile_options = dict(optimizer=optimizer, loss=loss, metrics=metrics, **train_options) \
            if serializable else None
        if optimizer != AUTO:
            with self.distribute_strategy.scope():
                optimizer = keras.optimizers.get(optimizer) if isinstance(optimizer, str) else optimizer
            UpdateRule.check_optimizer(optimizer, self.distribute_strategy)
        if loss != AUTO and self.predicts_logits and _reads_probabilities(loss):
            raise ValueError(f"loss={_reads_probabilities(loss)!r} reads probabilities, but {type(self).__name__} "
                             f"gives logits (predict's output): pass the loss with from_logits=True (keras.losses."
                             f"SparseCategoricalCrossentropy(from_logits=True)), or loss='auto' (the head's own)")
        self._loss_spec = loss
        object.__setattr__(self, "_rule", None)
        if optimizer == AUTO:
            with self.distribute_strategy.scope():
                optimizer = recipe.optimizer()
        if metrics == AUTO:
            metrics = self.default_metrics()
        self._has_metrics = bool(metrics)
        with self.distribute_strategy.scope():  # (out of Keras' tracking: no log entry, not saved)
            object.__setattr__(self, "_health", LabelCounts(len(self.class_names())) if self.class_names() else None)
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
        """(features, outputs) -> per-example loss [batch], times the example's ``sample_weight`` when the
        batch carries one (Keras' definition: the step's loss is the mean of the weighted losses)."""
        spec = self._loss_spec
        if spec == AUTO:
            base = self.per_example_loss
        else:
            fn = spec.call if isinstance(spec, keras.losses.Loss) else keras.losses.get(spec)
            base = lambda features, outputs: fn(*self.metric_pair(features, outputs))  # noqa: E731

        def weighted(features, outputs):
            loss = tf.cast(base(features, outputs), tf.float32)
            weight = features.get(SAMPLE_WEIGHT)
            return loss if weight is None else loss * tf.cast(weight, tf.float32)

        return weighted

    def _update_metrics(self, features, outputs) -> None:
        if self._has_metrics:
            self._compile_metrics.update_state(*self.metric_pair(features, outputs),
                                               sample_weight=features.get(SAMPLE_WEIGHT))

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
        x, y, weight = keras.utils.unpack_x_y_sample_weight(data)
        features = dict(x)
        if y is not None:
            features.update(y if isinstance(y, dict) else {"label": y})
        if weight is not None:
            features[SAMPLE_WEIGHT] = weight
        return features

    def _step_logs(self):
        logs = self.get_metrics_result() if self._has_metrics else {"loss": self._loss_tracker.result()}
        if _multi_worker(self.distribute_strategy):
            # Keras averages the replicas' logs with strategy.reduce("MEAN", v, axis=0) across workers, which
            # needs an axis (a scalar fails: TensorFlow issue 72388): each log goes as [1]
            logs = {k: tf.reshape(v, [1]) for k, v in logs.items()}
        return logs

    def train_step(self, data):
        features = self._features(data)
        if self._rule.config.grad_accum_steps == 1:  # the rule takes [k, batch, ...]
            features = tf.nest.map_structure(lambda t: t[None], features)
        step = tf.convert_to_tensor(self.optimizer.iterations)
        # Keras runs this inside its own tf.function under strategy.run: the rule's step itself, except where the
        # whole step is XLA-compiled (one replica: a GPU, or float16 on a CPU), its compiled function
        rule = self._rule
        step_fn = rule.replica_fn if rule.jit == "step" else rule.replica_step
        loss, _ = step_fn(features, step, loss=self._example_loss(), on_outputs=self._update_metrics)
        size = tf.shape(tf.nest.flatten(features)[0])
        self._loss_tracker.update_state(loss, sample_weight=size[0] * size[1])
        return self._step_logs()

    def test_step(self, data):
        features = self._features(data)
        outputs = self(features, training=False)
        per_example = self._example_loss()(features, outputs)
        self._loss_tracker.update_state(tf.reduce_mean(per_example), sample_weight=tf.shape(per_example)[0])
        self._update_metrics(features, outputs)
        self.update_health_counts(features, outputs)
        return self._step_logs()

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras builds the compiled metrics from the first batch averaged over the replicas
        (``strategy.reduce("MEAN", batch)``), which fails for a MultiWorkerMirroredStrategy's dict batches and for
        replicas whose batches have different lengths: the first local replica's batch serves instead."""
        if iterator is not None and self._distribute_strategy is not None:
            local = self.distribute_strategy.experimental_local_results
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: local(v)[0] if isinstance(v, tf.distribute.DistributedValues) else v, next(it))
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self.predict_outputs(x, self(dict(x), training=False))

    def __call__(self, *args, **kwargs):
        first = args[0] if args else kwargs.get("features", kwargs.get("inputs"))
        if _is_text(first):
            raise TypeError(f"{type(self).__name__}(...) is called on the features (input_ids, segment_ids, "
                            f"padding_mask); for raw text use predict(texts)")
        return super().__call__(*args, **kwargs)

    # ------------------------------------------------------------------ Keras: fit / evaluate / predict
    def fit(self, x=None, y=None, batch_size=None, epochs=1, validation_data=None, shuffle=True,
            steps_per_epoch=None, class_weight=None, sample_weight=None, callbacks=None, **kwargs):
        """Keras' ``fit`` on raw text, feature dicts or a dataset (module docstring). ``class_weight`` and
        ``sample_weight`` weight each example's loss as Keras defines them; the run's health (the command lines'
        rules, ``tasks/health.py``) is watched: a non-finite loss stops ``fit`` in one line, a divergence, a
        loss that does not fall or predictions collapsed on ``validation_data`` are warned of at the end."""
        if self.optimizer is None:
            raise ValueError(f"{type(self).__name__}: call compile() before fit()")
        split = kwargs.pop("validation_split", None)
        if split:  # Keras': the last rows of the arrays, before any shuffling; validation_data, when given, wins
            if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 < split < 1:
                raise ValueError(f"fit(validation_split={split!r}): expected a fraction between 0 and 1")
            if isinstance(x, tf.data.Dataset):
                raise ValueError("fit(validation_split=...) splits arrays, as Keras' does; for a dataset pass "
                                 "validation_data=")
            if validation_data is None:
                n = door.count_rows(x)
                at = int(np.floor(n * (1.0 - split)))
                if not 0 < at < n:
                    raise ValueError(f"fit(validation_split={split}): {n} examples leave no "
                                     f"{'training' if at == 0 else 'validation'} example")
                x, held = door.take_rows(x, 0, at), door.take_rows(x, at, n)
                validation_data = (held, door.take_rows(y, at, n, columns=False)) + (
                    () if sample_weight is None else (door.take_rows(sample_weight, at, n, columns=False),))
                y, sample_weight = (door.take_rows(v, 0, at, columns=False) for v in (y, sample_weight))
        epochs = door.whole_number("epochs", epochs, 1)
        if steps_per_epoch is not None:
            steps_per_epoch = door.whole_number("steps_per_epoch", steps_per_epoch, 1)
        k = int(self._train_options.get("grad_accum_steps", 1))
        ds = self.as_dataset(x, y, checked_batch_size(batch_size, 32), shuffle=shuffle, training=True,
                             micro_batches=k, sample_weight=sample_weight, class_weight=class_weight)
        per_epoch = steps_per_epoch or _cardinality(ds)
        self._set_schedule_length((per_epoch or 0) * int(epochs))
        if not self._train_options.get("train_steps") and not per_epoch:
            raise ValueError("fit(): the data's length is unknown, so the learning-rate schedule has no length: "
                             "pass steps_per_epoch=N, or compile(train_steps=N)")
        rule = self._ensure_rule((per_epoch or 1) * int(epochs))
        if validation_data is not None:
            if isinstance(validation_data, tf.data.Dataset):
                vx, vy, vw = validation_data, None, None
            elif isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3):
                vx, vy, vw = keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
            else:
                raise TypeError("fit(validation_data=...): (x, y), (x, y, sample_weight) or a tf.data.Dataset")
            validation_data = self.as_dataset(vx, vy, checked_batch_size(batch_size, 32), shuffle=False,
                                              training=False, sample_weight=vw)
        watch = FitHealth(self, rule.config, validation_data is not None)
        with _collectives_explained("fit"):
            return super().fit(ds, epochs=epochs, validation_data=validation_data, steps_per_epoch=steps_per_epoch,
                               shuffle=False, callbacks=list(callbacks or []) + [watch], **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, return_dict=True, **kwargs):
        """Keras' ``evaluate``; returns a dict ``{"loss": ..., metric: ...}`` (``return_dict=False``: Keras' list)."""
        x = self.named_texts(x)
        if y is None and x is not None and not isinstance(x, (dict, tf.data.Dataset)):
            raise ValueError(f"evaluate: y is required with raw text (the labels the loss and metrics compare "
                             f"with); predict reads texts alone")
        ds = self.as_dataset(x, y, checked_batch_size(batch_size, 32), shuffle=False, training=False,
                             sample_weight=sample_weight)
        spec = ds.element_spec
        if isinstance(spec, dict) and self.LABEL_KEY not in spec:
            raise ValueError(f"evaluate: x's examples carry no labels ('{self.LABEL_KEY}'): a dataset of (x, y) "
                             f"pairs is expected; predict reads x alone")
        with _collectives_explained("evaluate"):
            return super().evaluate(ds, return_dict=return_dict, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        if _no_rows(x):  # (Keras' predict fails on a dataset of no batch)
            return self.empty_prediction()
        ds = self.as_dataset(x, None, checked_batch_size(batch_size, 32), shuffle=False, training=False)
        return super().predict(ds, **kwargs)

    def as_dataset(self, x, y, batch_size: int, shuffle: bool, training: bool, micro_batches: int = 1,
                   sample_weight=None, class_weight=None):
        """Raw strings (the task's form), a dict of numpy features, or a tf.data.Dataset of either (batched, or
        unbatched: batched here) -> a dataset of (features, labels[, weights]) batches the steps read
        (``micro_batches`` > 1: stacked k at a time, the update's gradient accumulation; each padded to
        ``max_seq_length`` so they stack). Every array input is checked here (``tasks/keras_inputs.py``)."""
        fixed = self.max_seq_length if micro_batches > 1 else None
        preprocess = self._preprocess_fn(fixed)
        if batch_size is not None:
            door.whole_number("batch_size", batch_size, 1)
        if isinstance(x, tf.data.Dataset):
            if y is not None or sample_weight is not None:
                raise ValueError("x is a tf.data.Dataset: its elements carry the labels and weights ((x, y) or "
                                 "(x, y, sample_weight)); y= and sample_weight= are for arrays")
            ds = self._batched(x, batch_size)
            first = ds.element_spec[0] if isinstance(ds.element_spec, tuple) else ds.element_spec
            if isinstance(first, dict) and door.texts_by_name(first, self.TEXT_INPUTS, self.REQUIRED_TEXTS,
                                                              type(self).__name__, "x's elements") is not None:
                ds = ds.map(tf.autograph.experimental.do_not_convert(self._texts_of_element))
            elif isinstance(first, dict):
                self.check_feature_names(first, "x's elements")
            if self.is_raw(ds.element_spec):
                ds = ds.map(tf.autograph.experimental.do_not_convert(preprocess), num_parallel_calls=tf.data.AUTOTUNE)
        else:
            if x is None:
                raise TypeError(f"{type(self).__name__}: x is required (texts, a dict of features or a dataset)")
            x = self.named_texts(x)
            if isinstance(x, dict):
                self.check_feature_names(x)
                inputs, n = {k: np.asarray(v) for k, v in x.items()}, door.rows_of(x)
            else:
                inputs = self.raw_inputs(x)
                n = len(tf.nest.flatten(inputs)[0])
            if n == 0:
                raise ValueError(f"{type(self).__name__}: x holds no example")
            labels = None if y is None else self.check_labels(y, n)
            weights = None if sample_weight is None else door.sample_weights(sample_weight, n)
            if weights is not None and labels is None:
                raise ValueError("sample_weight without y: weights weigh the loss of labelled examples")
            raw = not isinstance(x, dict)
            if raw:
                inputs = self.features_in_memory(inputs, n, fixed)
            data = (inputs,) + tuple(a for a in (labels, weights) if a is not None)
            ds = tf.data.Dataset.from_tensor_slices(data if len(data) > 1 else inputs)
            if shuffle and training:
                ds = ds.shuffle(max(n, 1), seed=self.seed)
            ds = ds.batch(batch_size)
            if raw and fixed is None:  # each batch on the length grid, as the map of a dataset of texts gives it
                ds = ds.map(tf.autograph.experimental.do_not_convert(self._on_grid))
        if class_weight is not None:
            ds = ds.map(tf.autograph.experimental.do_not_convert(self._class_weighting(class_weight)))
        if micro_batches > 1:
            ds = ds.batch(micro_batches, drop_remainder=True)
        return datasets.for_iteration(ds.prefetch(tf.data.AUTOTUNE))

    # The export's text inputs (``serving_default``'s names) in the raw form's order; the first REQUIRED_TEXTS needed.
    TEXT_INPUTS: Tuple[str, ...] = ()
    REQUIRED_TEXTS = 0
    LABEL_KEY = "label"  # the feature a labelled example carries (evaluate refuses examples without it)
    predicts_logits = False  # predict's output is logits (a loss reading probabilities is refused at compile)

    def named_texts(self, x):
        """A dict of texts keyed by the export's input names (``{"text_a": [...], "text_b": [...]}``) -> the
        task's raw form, so one dict serves the model and its export alike; anything else as it is."""
        if isinstance(x, dict):
            raw = door.texts_by_name(x, self.TEXT_INPUTS, self.REQUIRED_TEXTS, type(self).__name__)
            if raw is not None:
                return raw
        return x

    def _texts_of_element(self, *element):
        return (self.named_texts(element[0]),) + element[1:] if len(element) > 1 else self.named_texts(element[0])

    def check_feature_names(self, features, name: str = "x") -> None:
        """A dict of features carries the model's inputs (the task's ``feature_spec``), refused in one line."""
        if "input_ids" not in features:
            spec = [k for k in self.feature_spec(8) if k not in ("label", "is_real_example")]
            raise ValueError(f"{name}: {type(self).__name__} reads a dict of texts keyed "
                             f"{' / '.join(self.TEXT_INPUTS)} or of features ({', '.join(spec)}); got keys "
                             f"{sorted(features)}")

    def _batched(self, ds: tf.data.Dataset, batch_size: Optional[int]) -> tf.data.Dataset:
        """A dataset of single examples (rank-0 strings, or features of the task's per-example shape) batched by
        ``batch_size`` (Keras' default 32), as the user meant; a batched one as it is."""
        first = ds.element_spec
        while isinstance(first, tuple):
            first = first[0]
        first = first["input_ids"] if isinstance(first, dict) and "input_ids" in first else tf.nest.flatten(first)[0]
        per_example = 0 if first.dtype == tf.string else len(self.feature_spec(8)["input_ids"][1])
        if first.shape.rank == per_example:
            return ds.batch(batch_size or 32)
        return ds

    def _class_weighting(self, class_weight):
        """Keras' ``class_weight``: each example's weight times its class's (a class left out weighs 1)."""
        table = tf.constant(door.class_weight_vector(class_weight, self.num_labels))

        def weigh(*element):
            x, y, w = keras.utils.unpack_x_y_sample_weight(element)
            if y is None:
                raise ValueError("class_weight needs labels (y)")
            cw = tf.gather(table, tf.cast(y, tf.int32))
            return x, y, cw if w is None else cw * tf.cast(w, tf.float32)

        return weigh

    @property
    def num_labels(self) -> int:
        raise ValueError(f"class_weight: {type(self).__name__} has no classes")

    def _preprocess_fn(self, length: Optional[int]):
        """``_preprocess`` as one graph function per set of layout options, traced once and called by every later
        dataset's map and by ``features_in_memory`` (a map traces its function anew: the tokenizer and the layout cost ~1.5 s of tracing on
        every ``fit`` / ``evaluate`` / ``predict`` call without it). Traced as written (no AutoGraph), as every
        graph function of the project."""
        key = (length, self.max_seq_length, self.length_multiple, id(self._tok))
        cache = self.__dict__.get("_preprocess_fns")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_preprocess_fns", cache)  # (not a Keras-tracked attribute)
        if key not in cache:
            cache[key] = tf.function(lambda e: self._preprocess(*e, length=length), autograph=False,
                                     reduce_retracing=True)
        fn = cache[key]
        return lambda *element: fn(element)

    # Texts handed over in memory are turned into features here, in chunks of this many rows, by direct calls of
    # the traced preprocessing (``_preprocess_fn``): the dataset then holds numbers only, and its iterator costs
    # nothing to start (a dataset mapping the tokenizer re-instantiates its graph at every iterator: ~0.5 s per
    # fit / evaluate / predict call, whatever the number of texts). The features take 12 bytes per token of the
    # longest text (RACE: of its four rows), what the batches would hold anyway.
    MEMORY_CHUNK = 1024
    pads_left = True  # the padded side of the task's features (the classifier's and RACE's layout)

    def features_in_memory(self, inputs, n: int, length: Optional[int]) -> Dict[str, np.ndarray]:
        """Raw inputs (``raw_inputs``: an array of texts or a tuple of arrays) of ``n`` rows -> the task's
        features, every row padded to one width (``length``, or the longest row's)."""
        fn = self._preprocess_fn(length)
        columns = inputs if isinstance(inputs, tuple) else (inputs,)
        parts = [fn(*[tf.constant(c[i:i + self.MEMORY_CHUNK]) for c in columns])
                 for i in range(0, n, self.MEMORY_CHUNK)]
        width = max(int(p["padding_mask"].shape[-1]) for p in parts)
        parts = [self.padded_to(p, width, self.pads_left) for p in parts]
        return {k: np.concatenate([p[k].numpy() for p in parts]) for k in parts[0]}

    def _on_grid(self, features, *rest):
        features = self.on_length_grid(features, left=self.pads_left)
        return (features,) + rest if rest else features

    def _preprocess(self, *element, length=None):
        if len(element) == 1 or not self.labelled(element):
            return self.text_features(element[0] if len(element) == 1 else element, length=length)
        return (self.text_features(element[0], length=length),) + tuple(element[1:])

    def labelled(self, element) -> bool:
        return len(element) in (2, 3)

    def on_length_grid(self, features: Dict[str, tf.Tensor], left: bool) -> Dict[str, tf.Tensor]:
        """A batch re-padded to its longest row rounded up to the command lines' length multiple
        (``xlnet_tf.lengths.default_multiple``: the batch shapes, so the compilations, of a run): extra padding
        columns added, or padding-only columns dropped, on the padded side."""
        mask = features["padding_mask"]
        target = padded_length(tf.reduce_max(tf.reduce_sum(mask, -1)), self.max_seq_length, self.length_multiple)
        return self.padded_to(features, target, left)

    def padded_to(self, features: Dict[str, tf.Tensor], target, left: bool) -> Dict[str, tf.Tensor]:
        """``features`` ([..., width]) with padding columns added or padding-only columns dropped on the padded
        side to ``target`` columns."""
        width = tf.shape(features["padding_mask"])[-1]
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
    def export(self, filepath, format: str = "tf_saved_model", verbose=None, precision: Optional[str] = None):
        """The command lines' export (``--export_dir``, ``--export_format``), in Keras' format names
        (``tasks/export_formats.py``): "tf_saved_model" (``serving_default`` on raw text, ``serve_ids``; needs only
        tensorflow and tensorflow_text to serve), "onnx", "openvino" (raw text through the folder's ``serve.py``
        with that runtime only); anything else is refused in one line before any work. ``precision``:
        ``--export_precision``'s policies. ``filepath`` must be new, empty or an earlier export of that format
        (anything else there is refused before any work: the export replaces the folder whole)."""
        kind = getattr(self, "export_kind", None) or export_formats.OTHERS.get(type(self).__name__, "this task's")
        export_formats.check_format(format, memory=bool(getattr(self, "memory", False)), task=kind)
        check_replaceable(os.fspath(filepath), export_formats.WRITTEN[format])
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
        path = export_formats.export(module, os.fspath(filepath), format, **self.export_options())
        if verbose is not False:
            log.info("exported %s to %s", format, filepath)
        return path

    def save(self, filepath, overwrite: bool = True, **kwargs):
        """Keras' ``save``; a ``.keras`` file is written beside its path and renamed into place, so a save that
        fails or is interrupted leaves the earlier file whole (never a cut one)."""
        path = os.fspath(filepath)
        if not path.endswith(".keras"):
            legacy = (f" (Keras' legacy .h5 cannot hold {type(self).__name__}: its tokenizer and layers do not load "
                      f"back from it)") if path.endswith(".h5") else ""
            raise ValueError(f"save({path}): a path ending in .keras is expected{legacy}; export(path) writes the "
                             f"serving formats, save_pretrained(directory) a checkpoint folder")
        if not overwrite and os.path.exists(path):
            return super().save(filepath, overwrite=overwrite, **kwargs)
        tmp = path[: -len(".keras")] + f".tmp-{os.getpid()}.keras"  # (Keras wants the suffix)
        try:
            super().save(tmp, overwrite=True, **kwargs)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

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

    def check_labels(self, y, n: int):
        """``y`` checked and made an array for ``n`` examples (``tasks/keras_inputs.py``)."""
        raise NotImplementedError

    def empty_prediction(self):
        """What ``predict`` gives for no input: the outputs' shapes with 0 rows."""
        raise NotImplementedError

    def class_names(self):
        """The classes' names for the health checks (None: the task has no classes)."""
        try:
            n = self.num_labels
        except ValueError:
            return None
        names = getattr(self, "label_names", None)
        return list(names) if names else [str(i) for i in range(n)]

    def health_counts(self) -> Optional[LabelCounts]:
        """The predicted and gold class counts of the last evaluation (``tasks/keras_health.py``; None: the task
        has no classes, or the model was not compiled)."""
        return getattr(self, "_health", None)

    def update_health_counts(self, features, outputs) -> None:
        """Adds a batch's predicted (argmax of its ``logits``) and gold classes to ``health_counts``."""
        counts = self.health_counts()
        if counts is not None and "label" in features:
            counts.update_state(features["label"], outputs["logits"], features.get(SAMPLE_WEIGHT))

    def default_metrics(self):
        return []


def _multi_worker(strategy) -> bool:
    """A MultiWorkerMirroredStrategy across workers (Keras reduces its logs its own way, see ``_step_logs``)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
        bool(getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)())


@contextlib.contextmanager
def _collectives_explained(call: str):
    """TensorFlow's abort of a second MirroredStrategy's all-reduce, said in one line with its way out: every
    MirroredStrategy numbers its collectives from the same start, so one whose gradients have other shapes than an
    earlier strategy's in the same process (a notebook's second model) meets that strategy's cached instances and
    TensorFlow aborts the process's collectives (tensorflow/tensorflow#62790; one strategy object reused, or
    ``cross_device_ops=tf.distribute.ReductionToOneDevice()``, never meets it)."""
    try:
        yield
    except tf.errors.OpError as err:
        if "Shape mismatch in the collective instance" not in str(err):
            raise
        raise RuntimeError(
            f"{call}: TensorFlow aborted this process's collective ops: another MirroredStrategy in this process "
            f"all-reduced tensors of other shapes first (every MirroredStrategy numbers its collectives from the "
            f"same start: tensorflow/tensorflow#62790); restart the process and build every model under one "
            f"strategy object, or create each strategy with cross_device_ops=tf.distribute.ReductionToOneDevice()"
        ) from None


_PROBABILITY_LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy",
                       "binary_focal_crossentropy", "categorical_focal_crossentropy")


def _reads_probabilities(loss) -> Optional[str]:
    """The name of a Keras cross-entropy ``loss`` that reads probabilities (``from_logits=False``, its default:
    a string, the function, or the object so built); None for any other loss."""
    if isinstance(loss, keras.losses.Loss):
        config = loss.get_config()
        return config.get("name") if config.get("from_logits") is False else None
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", None)
    return name if name in _PROBABILITY_LOSSES else None


def checked_batch_size(batch_size, default: int) -> int:
    """``batch_size`` as Keras takes it: None for the default, else an integer >= 1 (0 is refused, not the default)."""
    return default if batch_size is None else door.whole_number("batch_size", batch_size, 1)


def _no_rows(x) -> bool:
    """An array input of no example: an empty list of texts, a tuple of empty columns, a dict of empty arrays."""
    if isinstance(x, tf.data.Dataset) or x is None or isinstance(x, (str, bytes)):
        return False
    first = next(iter(x.values()), ()) if isinstance(x, dict) else x[0] if isinstance(x, tuple) and x else x
    try:
        return len(first) == 0
    except TypeError:
        return False


def _saved_task(folder: str, cls) -> Dict[str, Any]:
    """``TASK_FILE`` in ``folder`` when ``save_pretrained`` wrote it for ``cls`` (another class's: {}). (issue 69)"""
    try:
        with open(os.path.join(folder, TASK_FILE), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict) or saved.get("class") != cls.__name__:
        return {}
    return saved


def _hf_task(folder: str, cls) -> Dict[str, Any]:
    """An HF ``XLNetForSequenceClassification`` folder's classes for a task model taking ``num_classes`` (as
    transformers reads ``id2label`` / ``num_labels`` and ``problem_type``). (issue 69)"""
    try:
        with open(os.path.join(folder, checkpoint.HF_CONFIG), encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError):
        return {}
    takes = inspect.signature(cls.__init__).parameters
    if "XLNetForSequenceClassification" not in (hf.get("architectures") or []) or "num_classes" not in takes:
        return {}
    n = len(hf.get("id2label") or {}) or int(hf.get("num_labels", 2))
    return {"task": {"num_classes": n, "regression": hf.get("problem_type") == "regression" or n == 1}}


def _cardinality(ds: tf.data.Dataset) -> Optional[int]:
    n = int(ds.cardinality())
    return n if n > 0 else None
