"""Optimisation: warmup + linear decay, AdamW with XLNet's weight-decay rule, layer-wise learning rates.

* ``WarmupLinearDecay``: ``lr * step / warmup`` for ``step < warmup`` (0 at the first update, as the original),
  then linear decay to ``lr * min_lr_ratio`` at ``train_steps``.
* ``AdamW``: Keras 3's AdamW with
  - the original weight-decay rule (``use_weight_decay``): LayerNorm weights and biases are excluded, the
    relative-attention biases ``r_w_bias``/``r_r_bias``/``r_s_bias`` are always decayed. Decided once per
    variable from its Keras *path* (Keras' own ``exclude_from_weight_decay`` regex-matches the short name, where
    ``"bias"`` would also hit ``r_w_bias``);
  - a per-variable learning-rate multiplier (true layer-wise LR decay) that also scales the decoupled decay;
  - ``bias_correction=False`` for the BERT-style update the original used when ``weight_decay > 0``;
  - ``grads_pre_reduced``: the training loop all-reduces, clips and scales gradients itself, so the optimizer
    must not all-reduce them a second time.
* ``layer_multipliers`` / ``select_trainable``: depth-based factors and the ``num_trainable_layers`` subset,
  driven by the TaskModel's ``n_layer`` and ``variable_depth(variable)`` (0 = embeddings, l+1 = block l,
  n_layer+1 = head).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import keras
import tensorflow as tf

FORCE_DECAY = ("r_w_bias", "r_r_bias", "r_s_bias")


def use_weight_decay(path: str) -> bool:
    """The original rule applied to a variable path ("a/b/kernel", optional ":0" and "/replica_N" suffixes)."""
    parts = [p for p in path.split(":")[0].split("/") if p and not p.startswith("replica_")]
    short = parts[-1] if parts else ""
    if any(name in short for name in FORCE_DECAY):
        return True
    lowered = "/".join(parts).lower()
    if short in ("gamma", "beta") or "layer_norm" in lowered or "layernorm" in lowered:
        return False
    return "bias" not in short


@keras.saving.register_keras_serializable("xlnet_tf")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup 0 -> learning_rate over warmup_steps, then linear decay to learning_rate * min_lr_ratio."""

    def __init__(self, learning_rate: float, train_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0):
        self.learning_rate = float(learning_rate)
        self.train_steps = int(train_steps)
        self.warmup_steps = int(warmup_steps)
        self.min_lr_ratio = float(min_lr_ratio)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        lr = self.learning_rate
        warm = lr * step / float(max(self.warmup_steps, 1))
        frac = tf.clip_by_value((step - self.warmup_steps) / float(max(self.train_steps - self.warmup_steps, 1)),
                                0.0, 1.0)
        decay = lr - lr * (1.0 - self.min_lr_ratio) * frac
        return tf.where(step < self.warmup_steps, warm, decay)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "train_steps": self.train_steps,
                "warmup_steps": self.warmup_steps, "min_lr_ratio": self.min_lr_ratio}


@keras.saving.register_keras_serializable("xlnet_tf")
class AdamW(keras.optimizers.AdamW):
    """Keras AdamW with XLNet's decay rule, per-variable LR multipliers and optional bias correction."""

    def __init__(self, learning_rate=1e-5, weight_decay=0.0, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 bias_correction=True, name="adamw", **kwargs):
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, name=name, **kwargs)
        if self.amsgrad:
            raise ValueError("amsgrad is not supported")
        self.bias_correction = bool(bias_correction)
        self.grads_pre_reduced = False
        self._lr_mult: Dict[int, float] = {}
        self._decay: Dict[int, bool] = {}

    def set_lr_multipliers(self, variables: Sequence, multipliers: Sequence[float]) -> None:
        """Per-variable learning-rate factors (also applied to the decoupled weight decay)."""
        if len(variables) != len(multipliers):
            raise ValueError("set_lr_multipliers: one multiplier per variable")
        self._lr_mult = {self._var_key(v): float(m) for v, m in zip(variables, multipliers) if float(m) != 1.0}

    def lr_multiplier(self, variable) -> float:
        return self._lr_mult.get(self._var_key(variable), 1.0)

    def _use_weight_decay(self, variable):
        key = self._var_key(variable)
        if key not in self._decay:
            self._decay[key] = use_weight_decay(getattr(variable, "path", None) or variable.name)
        return self._decay[key]

    def build(self, var_list):
        super().build(var_list)
        for v in var_list:  # decide on the Keras path now: replica components are named ".../replica_1:0"
            self._use_weight_decay(v)

    def _apply_weight_decay(self, variables):
        """Decay is applied inside ``update_step`` with the variable's own learning rate."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if self.grads_pre_reduced:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype) * self.lr_multiplier(variable)
        gradient = tf.cast(gradient, dtype)
        if self.weight_decay and self._use_weight_decay(variable):
            self.assign_sub(variable, variable * tf.cast(self.weight_decay, dtype) * lr)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, (gradient - m) * (1.0 - self.beta_1))
        self.assign_add(v, (tf.square(gradient) - v) * (1.0 - self.beta_2))
        if self.bias_correction:
            t = tf.cast(self.iterations + 1, dtype)
            b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
            lr = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
        self.assign_sub(variable, m * lr / (tf.sqrt(v) + self.epsilon))

    def get_config(self):
        config = super().get_config()
        config["bias_correction"] = self.bias_correction
        config.pop("amsgrad", None)
        return config


def layer_factor(depth: int, n_layer: int, rate: float) -> float:
    """rate ** max(n_layer - depth, 0): head and top block 1, block l rate^(n_layer-1-l), embeddings rate^n_layer."""
    return float(rate) ** max(n_layer - int(depth), 0)


def layer_multipliers(model, variables: Sequence, rate: float, mode: str = "lr") -> List[float]:
    """Per-variable factors. mode "lr": every depth; mode "grad" (the original): blocks only, embeddings/head 1."""
    if mode not in ("lr", "grad"):
        raise ValueError(f"layer_decay_mode: expected 'lr' or 'grad', got {mode!r}")
    n = int(model.n_layer)
    out = []
    for v in variables:
        depth = int(model.variable_depth(v))
        if mode == "grad" and not 1 <= depth <= n:
            out.append(1.0)
        else:
            out.append(layer_factor(depth, n, rate))
    return out


def select_trainable(model, num_trainable_layers: Optional[int] = None) -> List:
    """Trainable variables of the top ``num_trainable_layers`` blocks and the head (None / -1: all)."""
    variables = list(model.trainable_variables)
    if num_trainable_layers is None or num_trainable_layers < 0:
        return variables
    n = int(model.n_layer)
    if num_trainable_layers > n:
        raise ValueError(f"num_trainable_layers={num_trainable_layers} > n_layer={n}")
    return [v for v in variables if int(model.variable_depth(v)) > n - num_trainable_layers]


def create_optimizer(learning_rate: float, train_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0,
                     weight_decay: float = 0.0, epsilon: float = 1e-6, bias_correction: bool = True) -> AdamW:
    """AdamW on the WarmupLinearDecay schedule (call inside ``strategy.scope()``)."""
    schedule = WarmupLinearDecay(learning_rate, train_steps, warmup_steps, min_lr_ratio)
    return AdamW(learning_rate=schedule, weight_decay=weight_decay, epsilon=epsilon, bias_correction=bias_correction)
