"""Optimisation: warmup + linear decay, AdamW, and the original XLNet update rule decided by variable role.

* ``WarmupLinearDecay``: ``lr * step / warmup`` for ``step < warmup`` (0 at the first update, as the original),
  then linear decay to ``lr * min_lr_ratio`` at ``train_steps``.
* ``variable_roles(model)``: the role of every variable (``ROLES``), declared by the layer that owns it
  (``weight_roles()``) or known from its Keras type (Dense, EinsumDense, LayerNormalization, Embedding). The two
  rules below read roles, never names:
  - weight decay (``decay_flags``): every variable except LayerNorm scales/offsets and biases. The
    relative-attention biases (role ``attention_bias``) are decayed, as the original force-includes them.
    Variables that get no gradient are not updated at all (the training loop leaves them out), so ``mask_emb``
    stays put in fine-tuning;
  - layer-wise decay (``layer_decay_factors``), mode ``"grad"`` (the original): the clipped gradients of block
    l's projection, feed-forward and LayerNorm weights (what the original stores under
    ``model/transformer/layer_{l}/``) are multiplied by ``rate ** (n_layer - 1 - l)``; embeddings, the attention
    biases and ``seg_embed`` (stored stacked outside ``layer_{l}/`` in the original), heads and the weight-decay
    term are not scaled. Under Adam this mostly cancels: the bottom layers still learn. Mode ``"lr"`` is another
    recipe: a true per-layer learning rate ``rate ** (n_layer - depth)`` on every variable (embeddings included)
    that also scales the decoupled decay.
* ``AdamW``: Adam with the original's decoupled decay (``param -= lr * wd * param`` beside the Adam step), a
  per-variable learning-rate multiplier and optional bias correction. The original uses bias correction only
  when ``weight_decay == 0`` (``tf.train.AdamOptimizer``); with decay its AdamWeightDecayOptimizer has none.
  ``grads_pre_reduced``: the training loop all-reduces, clips and scales gradients itself.
* ``select_trainable``: the ``num_trainable_layers`` subset, from the model's ``variable_depth(variable)``
  (0 = embeddings, l+1 = block l, n_layer+1 = head).
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence

import keras
import tensorflow as tf


# kernel: projection matrices; embedding: lookup tables (word, mask); bias: additive biases of dense layers
# (and the attention summary's query); norm: LayerNorm scale and offset; attention_bias: r_w/r_r/r_s biases of
# relative attention; segment_embedding: seg_embed.
ROLES = ("kernel", "embedding", "bias", "norm", "attention_bias", "segment_embedding")
NO_DECAY_ROLES = frozenset({"bias", "norm"})
# Roles of the weights the original keeps under model/transformer/layer_{l}/ (the layer-decay scope).
LAYER_SCOPED_ROLES = frozenset({"kernel", "bias", "norm"})


def variable_roles(model) -> Dict[int, str]:
    """{id(variable): role} for every variable of ``model`` (see ``ROLES``)."""
    roles: Dict[int, str] = {}

    def put(var, role):
        if var is not None:
            if role not in ROLES:
                raise ValueError(f"{var.path}: unknown role {role!r}; expected one of {ROLES}")
            roles[id(var)] = role

    for layer in model._flatten_layers(include_self=True, recursive=True):
        declared = getattr(layer, "weight_roles", None)
        if declared is not None:
            for var, role in declared():
                put(var, role)
        elif isinstance(layer, keras.layers.LayerNormalization):
            put(layer.gamma, "norm")
            put(layer.beta, "norm")
        elif isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            put(layer.kernel, "kernel")
            put(layer.bias, "bias")
        elif isinstance(layer, keras.layers.Embedding):
            put(layer.embeddings, "embedding")
    return roles


def role_of(roles: Dict[int, str], variable) -> str:
    try:
        return roles[id(variable)]
    except KeyError:
        raise ValueError(f"variable {variable.path} has no role: the layer that creates it must list it in "
                         f"weight_roles()") from None


def decay_flags(model, variables: Sequence) -> List[bool]:
    """Whether weight decay applies to each variable (every role but LayerNorm and bias)."""
    roles = variable_roles(model)
    return [role_of(roles, v) not in NO_DECAY_ROLES for v in variables]


def layer_decay_factors(model, variables: Sequence, rate: float, mode: str = "grad") -> List[float]:
    """Per-variable factors of layer-wise decay (module docstring): mode "grad" multiplies the clipped
    gradients of the layer-scoped weights of block l by rate^(n_layer-1-l); mode "lr" gives every variable the
    learning-rate factor rate^(n_layer-depth) (embeddings rate^n_layer, top block and heads 1)."""
    if mode not in ("grad", "lr"):  # (train_config.LAYER_DECAY_MODES: this module reads no run options)
        raise ValueError(f"layer_decay_mode: expected 'grad' or 'lr', got {mode!r}")
    n = int(model.n_layer)
    roles = variable_roles(model) if mode == "grad" else {}
    out = []
    for v in variables:
        depth = int(model.variable_depth(v))
        if mode == "lr":
            out.append(float(rate) ** max(n - depth, 0))
        elif 1 <= depth <= n and role_of(roles, v) in LAYER_SCOPED_ROLES:
            out.append(float(rate) ** (n - depth))
        else:
            out.append(1.0)
    return out


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


def balanced_groups(sizes: Sequence[int], groups: int) -> List[List[int]]:
    """Indices of ``sizes`` in at most ``groups`` non-empty groups of about equal total size (largest first into
    the smallest group), each group's indices in ascending order."""
    groups = max(1, min(int(groups), len(sizes)))
    parts: List[List[int]] = [[] for _ in range(groups)]
    totals = [0] * groups
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        j = totals.index(min(totals))
        parts[j].append(i)
        totals[j] += sizes[i]
    return [sorted(p) for p in parts if p]


@keras.saving.register_keras_serializable("xlnet_tf")
class AdamW(keras.optimizers.AdamW):
    """Keras AdamW with per-variable decay flags and LR multipliers and optional bias correction.

    With ``weight_decay > 0`` every updated variable needs its flag (``set_decay_flags``; the Trainer passes
    ``decay_flags(model, variables)``)."""

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

    def set_decay_flags(self, variables: Sequence, flags: Sequence[bool]) -> None:
        """Which variables the decoupled weight decay applies to."""
        if len(variables) != len(flags):
            raise ValueError("set_decay_flags: one flag per variable")
        self._decay = {self._var_key(v): bool(f) for v, f in zip(variables, flags)}

    def lr_multiplier(self, variable) -> float:
        return self._lr_mult.get(self._var_key(variable), 1.0)

    def _use_weight_decay(self, variable):
        key = self._var_key(variable)
        if key not in self._decay:
            name = getattr(variable, "path", variable.name)
            raise ValueError(f"AdamW(weight_decay={self.weight_decay}): no decay flag for {name}; "
                             f"call set_decay_flags(variables, decay_flags(model, variables)) first")
        return self._decay[key]

    def _apply_weight_decay(self, variables):
        """Decay is applied inside ``update_step`` with the variable's own learning rate."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if self.grads_pre_reduced:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    def update_step(self, gradient, variable, learning_rate):
        self._update(gradient, variable, learning_rate, self.iterations + 1)

    def _update(self, gradient, variable, learning_rate, t):
        """One variable's step; ``t`` is the 1-based count of this update (bias correction)."""
        index = self._get_variable_index(variable)
        adamw_step(gradient, variable, self._momentums[index], self._velocities[index], learning_rate, t,
                   self.lr_multiplier(variable), self._decayed(variable), self._hyper())

    def _decayed(self, variable) -> bool:
        """Whether the decoupled weight decay applies to ``variable`` in this optimizer's steps."""
        return bool(self.weight_decay) and self._use_weight_decay(variable)

    def _hyper(self) -> tuple:
        """(weight_decay, beta_1, beta_2, epsilon, bias_correction): what ``adamw_step`` reads of the optimizer."""
        return (float(self.weight_decay or 0.0), float(self.beta_1), float(self.beta_2), float(self.epsilon),
                self.bias_correction)

    def apply_in_groups(self, grads: Sequence, variables: Sequence, scale=None,
                        grad_mult: Optional[Sequence[float]] = None, groups: int = 2) -> None:
        """``apply([g * scale * mult for ...], variables)`` (the same arithmetic in the same order, variable by
        variable), with the variables split into ``groups`` groups of about equal size, each updated by one
        XLA cluster. The groups share no variable, so TensorFlow runs their clusters at once on its inter-op
        threads: one cluster updates its ~200 variables one after another and reaches about half the memory's
        bandwidth (PERFORMANCE.md "Where a short step ... goes": XLNet-Base's update 0.19-0.23 s as one cluster,
        0.12-0.13 s as two, 2-core CPU). Used by the Trainer's ``jit_compile="update"`` on one replica; ``scale``
        is a scalar tensor (the clipping factor) or None, ``grad_mult`` per-variable floats or None. Call it
        inside a ``tf.function`` (in eager mode the clusters run one after another)."""
        if not self.built:
            raise ValueError("apply_in_groups: build the optimizer on its variables first")
        variables = list(variables)
        self._check_variables_are_known(variables)
        mult = list(grad_mult) if grad_mult is not None else [1.0] * len(variables)
        if not (len(grads) == len(variables) == len(mult)):
            raise ValueError("apply_in_groups: one gradient and one multiplier per variable")
        lr = self._get_current_learning_rate()
        t = self.iterations + 1  # read once, before the increment below
        scale = tf.constant(1.0) if scale is None else scale
        for part, spec in self.groups(variables, mult, groups):
            slots = [self._get_variable_index(variables[i]) for i in part]
            group_update(spec)([grads[i] for i in part], [unwrap(variables[i]) for i in part],
                               [unwrap(self._momentums[j]) for j in slots],
                               [unwrap(self._velocities[j]) for j in slots], scale, lr, t)
        self._iterations.assign_add(1)

    def groups(self, variables: Sequence, grad_mult: Sequence[float], groups: int) -> List[tuple]:
        """``apply_in_groups``' groups: [(indices into ``variables``, the group's ``group_update`` spec)]."""
        weights = [(self.lr_multiplier(v), self._decayed(v), float(m)) for v, m in zip(variables, grad_mult)]
        parts = balanced_groups([int(v.shape.num_elements()) for v in variables], groups)
        return [(part, (self._hyper(), tuple(weights[i] for i in part))) for part in parts]

    def get_config(self):
        config = super().get_config()
        config["bias_correction"] = self.bias_correction
        config.pop("amsgrad", None)
        return config


def unwrap(variable):
    """The tf.Variable behind a Keras variable (what the optimizer's own ``assign_*`` write to)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def adamw_step(gradient, variable, m, v, learning_rate, t, lr_mult: float, decay: bool, hyper: tuple) -> None:
    """One variable's AdamW step (``AdamW``'s arithmetic, written once): the decoupled decay at the variable's
    learning rate, the moments ``m``/``v``, the bias correction for the 1-based update count ``t``; ``hyper`` is
    ``AdamW._hyper()``. The variables are Keras or tf.Variables; each write is cast to the variable's dtype."""
    weight_decay, beta_1, beta_2, epsilon, bias_correction = hyper
    variable, m, v = unwrap(variable), unwrap(m), unwrap(v)
    dtype = variable.dtype
    lr = tf.cast(learning_rate, dtype) * lr_mult
    gradient = tf.cast(gradient, dtype)
    if decay:
        variable.assign_sub(tf.cast(variable * tf.cast(weight_decay, dtype) * lr, dtype))
    m.assign_add(tf.cast((gradient - m) * (1.0 - beta_1), dtype))
    v.assign_add(tf.cast((tf.square(gradient) - v) * (1.0 - beta_2), dtype))
    if bias_correction:
        t = tf.cast(t, dtype)
        b1, b2 = tf.cast(beta_1, dtype), tf.cast(beta_2, dtype)
        lr = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
    variable.assign_sub(tf.cast(m * lr / (tf.sqrt(v) + epsilon), dtype))


@functools.lru_cache(maxsize=32)
def group_update(spec: tuple):
    """The XLA function updating one group of weights; ``spec`` = (``AdamW._hyper()``, per weight (learning-rate
    factor, decay flag, gradient factor)). The weights and their moments are its arguments, so every optimizer
    with that spec shares it: the next model of the same shapes in the process (a sweep, a notebook's rerun, the
    next command-line job run in-process) reuses its trace and its compiled XLA executable (TensorFlow caches
    those by function name and argument shapes) instead of compiling its own."""
    hyper, weights = spec

    @tf.function(jit_compile=True, autograph=False)
    def update(grads, variables, momentums, velocities, scale, lr, t):
        for g, var, m, v, (lr_mult, decay, grad_mult) in zip(grads, variables, momentums, velocities, weights):
            g = g * tf.cast(scale, g.dtype)
            if grad_mult != 1.0:
                g = g * grad_mult
            adamw_step(g, var, m, v, lr, t, lr_mult, decay, hyper)

    return update


def select_trainable(model, num_trainable_layers: Optional[int] = None) -> List:
    """Trainable variables of the top ``num_trainable_layers`` blocks and the head (None / -1: all)."""
    variables = list(model.trainable_variables)
    if num_trainable_layers is None or num_trainable_layers < 0:
        return variables
    n = int(model.n_layer)
    if num_trainable_layers > n:
        raise ValueError(f"num_trainable_layers={num_trainable_layers} > n_layer={n}")
    return [v for v in variables if int(model.variable_depth(v)) > n - num_trainable_layers]
