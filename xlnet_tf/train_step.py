"""The one training update: what a step computes, for the command lines' loop (``training.Trainer``) and for
Keras ``fit`` on the task models (``xlnet_tf.tasks.keras_task``) alike.

``UpdateRule(model, config, strategy)`` decides once, from a ``TrainConfig``: the trainable subset
(``num_trainable_layers``), the original's layer-wise decay factors, the optimizer (AdamW on the warmup + linear
decay schedule, weight-decay flags by variable role, loss scaling for mixed_float16; or the caller's optimizer),
and where XLA runs (``jit``). ``rule.replica_fn(batch, step)`` is then one update in a replica context:

* ``batch``: the step's feature dicts stacked ``grad_accum_steps`` at a time ([k, batch, ...]); the losses of the
  k micro-batches (a ``tf.while_loop`` summing gradients) are summed and divided by the global number of examples
  of the step, so a step equals one batch ``k * replicas`` times larger;
* one all-reduce, then global-norm clipping, the layer-decay factors on the clipped gradients (mode "grad"),
  optional dynamic loss scaling, and the optimizer's update (under ``jit="update"`` the grouped XLA update,
  ``AdamW.apply_in_groups``);
* the heads' Keras ``SeedGenerator`` s are re-seeded from (seed, step, replica) first, so a resumed run replays
  the same dropout (the backbone draws its masks from its own checkpointed counter, ``xlnet_tf.ops``).

Returns (loss, global norm). Nothing here reads flags or files.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import keras
import tensorflow as tf

from xlnet_tf import optimization
from xlnet_tf.device_policy import default_jit, update_groups
from xlnet_tf.train_config import TrainConfig


def loss_fn(model) -> Callable:
    """The model's per-example loss ``(features, outputs) -> float32 [batch]``: ``per_example_loss`` if defined,
    else the class's ``loss`` method (keras.Model's constructor sets an instance attribute ``self.loss = None``,
    the compile() loss, which shadows a ``loss`` method defined on the subclass, hence the lookup on the class)."""
    fn = getattr(model, "per_example_loss", None)
    if fn is None:
        method = getattr(type(model), "loss", None)
        if not callable(method):
            raise TypeError(f"{type(model).__name__} defines neither per_example_loss nor a loss method")
        return lambda features, outputs: method(model, features, outputs)
    return fn


def seed_states(model) -> List:
    """State variables of every Keras SeedGenerator of the model (dropout RNG)."""
    seen, out = set(), []
    for v in model.variables:
        if v.name == "seed_generator_state" and id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


class UpdateRule:
    """One training update of ``model`` as ``config`` says (module docstring). Build it under the strategy's
    scope (the optimizer's slots are created here, for the trainable subset only).

    ``optimizer``: None builds the recipe's AdamW (``config.optimizer()``); a Keras optimizer (possibly a
    ``LossScaleOptimizer``) is used as given, the recipe's per-variable settings applied when it is our
    ``optimization.AdamW``. ``precision``: the compute policy of ``model`` (default
    ``config.precision``)."""

    def __init__(self, model, config: TrainConfig, strategy: Optional[tf.distribute.Strategy] = None,
                 optimizer=None, precision: Optional[str] = None):
        self.model, self.config = model, config
        cfg = config
        strategy = strategy or tf.distribute.get_strategy()
        precision = precision or cfg.precision
        self.fp16 = precision == "mixed_float16"
        self.jit = cfg.jit_compile or default_jit(strategy, precision)
        self.train_vars = optimization.select_trainable(model, cfg.num_trainable_layers)
        if not self.train_vars:
            raise ValueError("no trainable variables")
        mult = [1.0] * len(self.train_vars)
        if cfg.lr_layer_decay_rate != 1.0:
            mult = optimization.layer_decay_factors(model, self.train_vars, cfg.lr_layer_decay_rate,
                                                    cfg.layer_decay_mode)
        self.grad_mult = mult if cfg.layer_decay_mode == "grad" else None
        if optimizer is None:
            optimizer = cfg.optimizer()
        if self.fp16 and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=cfg.initial_loss_scale)
        self.outer_optimizer = optimizer
        self.optimizer = inner = getattr(optimizer, "inner_optimizer", optimizer)
        if isinstance(inner, optimization.AdamW):
            inner.grads_pre_reduced = True
            if cfg.layer_decay_mode == "lr":
                inner.set_lr_multipliers(self.train_vars, mult)
            if inner.weight_decay:
                inner.set_decay_flags(self.train_vars, optimization.decay_flags(model, self.train_vars))
        else:
            self.check_optimizer(inner, strategy)
        if not optimizer.built:
            optimizer.build(self.train_vars)  # slots for the trainable subset only
        self.seed = cfg.seed
        self._seed_vars = seed_states(model)
        grouped = self.jit == "update" and not self.fp16 and isinstance(inner, optimization.AdamW)
        if grouped:
            self.apply_update = self._grouped_update()
        elif self.jit == "update":  # XLA fuses the optimizer's per-weight elementwise chain
            self.apply_update = tf.function(self._plain_update, jit_compile=True, autograph=False)
        else:
            self.apply_update = self._plain_update
        self.replica_fn = tf.function(self.replica_step, jit_compile=self.jit == "step", autograph=False)

    @staticmethod
    def check_optimizer(optimizer, strategy) -> None:
        """What ``optimizer=`` may be: a Keras optimizer (TypeError otherwise); on several replicas only
        ``xlnet_tf.optimization.AdamW`` (the recipe's), which takes the gradients this rule all-reduces itself
        (another Keras optimizer all-reduces them again: ValueError)."""
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"optimizer: a keras.optimizers.Optimizer or 'auto' is expected, got "
                            f"{type(optimizer).__name__} {optimizer!r}"[:300])
        if strategy.num_replicas_in_sync > 1 and not isinstance(inner, optimization.AdamW):
            raise ValueError(f"optimizer: {type(inner).__name__} under {strategy.num_replicas_in_sync} replicas: the "
                             f"update all-reduces the gradients itself, which only the recipe's optimizer "
                             f"(optimizer='auto', xlnet_tf.optimization.AdamW) expects; use it, or one replica")

    @property
    def clip(self) -> Optional[float]:
        return self.config.clip_norm

    def reseed(self, step) -> None:
        """The heads' dropout RNG for this step and replica, from (seed, step, replica) alone."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        base = tf.random.experimental.stateless_fold_in(tf.constant([self.seed, 0], tf.int64),
                                                        tf.cast(step, tf.int64))
        base = tf.random.experimental.stateless_fold_in(base, tf.cast(replica, tf.int64))
        for i, var in enumerate(self._seed_vars):
            var.assign(tf.random.experimental.stateless_fold_in(base, i))

    def replica_step(self, batch, step, loss=None, on_outputs=None):
        """One update on ``batch`` ([k, batch, ...] feature dicts) in a replica context; returns (the step's
        loss, the global norm of its unclipped gradients). ``loss(features, outputs) -> [batch]`` replaces the
        model's per-example loss; ``on_outputs(features, outputs)`` sees every micro-batch's outputs (metrics)."""
        cfg, model, tvars = self.config, self.model, self.train_vars
        k = cfg.grad_accum_steps
        model_loss = loss or loss_fn(model)
        sources = [v.value for v in tvars]  # the tf.Variables behind the Keras variables
        ctx = tf.distribute.get_replica_context()
        self.reseed(step)

        def micro(features, count):
            """Loss sum / global example count of the step (a mean-sized loss, what loss scaling expects), and
            the gradients: None for a variable that takes no part in the loss (e.g. mask_emb in fine-tuning)."""
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(sources)  # frozen variables: no gradient computed
                outputs = model(features, training=True)
                per_example = tf.cast(model_loss(features, outputs), tf.float32)
                loss = tf.reduce_sum(per_example) / count
                scaled = self.outer_optimizer.scale_loss(loss) if self.fp16 else loss
            if on_outputs is not None:
                on_outputs(features, outputs)
            return loss, tape.gradient(scaled, sources)

        local = tf.cast(k * tf.shape(tf.nest.flatten(batch)[0])[1], tf.float32)  # [k, batch, ...]
        count = ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)
        micro_batch = lambda i: tf.nest.map_structure(lambda x: x[i], batch)  # noqa: E731
        loss, grads = micro(micro_batch(0), count)
        # Variables without a gradient are not updated at all (no decay, no Adam moments), as the original.
        live = tuple(i for i, g in enumerate(grads) if g is not None)
        grads = [tf.convert_to_tensor(grads[i]) for i in live]
        if k > 1:
            def body(i, loss, grads):
                l, g = micro(micro_batch(i), count)
                return i + 1, loss + l, [a + tf.convert_to_tensor(g[j]) for a, j in zip(grads, live)]

            _, loss, grads = tf.while_loop(lambda i, *_: i < k, body, (tf.constant(1), loss, grads))
        loss = ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss)
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return loss, self.apply_update(grads, live)

    def _plain_update(self, grads, live):
        """Unscale, clip, layer-decay factors, optimizer update of the variables ``train_vars[i] for i in live``;
        returns the (unscaled) global norm."""
        outer = self.outer_optimizer
        scale = outer.dynamic_scale if self.fp16 else None
        if scale is not None:
            grads = [g / scale for g in grads]
        gnorm = tf.linalg.global_norm(grads)
        if self.clip:
            grads, _ = tf.clip_by_global_norm(grads, self.clip, use_norm=gnorm)
        if self.grad_mult is not None:
            mult = [self.grad_mult[i] for i in live]
            grads = [g * m if m != 1.0 else g for g, m in zip(grads, mult)]
        if scale is not None:  # LossScaleOptimizer divides by the same power of two: exact round trip
            grads = [g * scale for g in grads]
        outer.apply(grads, [self.train_vars[i] for i in live])
        return gnorm

    def _grouped_update(self):
        """``apply_update`` for ``jit="update"`` in float32/bfloat16: the global norm and clipping factor on
        TensorFlow's graph (its multi-threaded reductions: 21 ms for XLNet-Base's gradients, against 78 ms as an
        XLA cluster), then AdamW in ``update_groups()`` XLA clusters that run at once
        (``AdamW.apply_in_groups``); the same arithmetic as clipping the gradients and applying them."""
        tvars, groups, clip = self.train_vars, update_groups(), self.clip

        def update(grads, live):
            gnorm = tf.linalg.global_norm(grads)
            factor = None
            if clip:  # tf.clip_by_global_norm's factor, NaN when the norm is not finite
                c = tf.constant(clip, tf.float32)
                factor = c * tf.minimum(1.0 / gnorm, 1.0 / c) + (gnorm - gnorm)
            mult = None if self.grad_mult is None else [self.grad_mult[i] for i in live]
            self.optimizer.apply_in_groups(grads, [tvars[i] for i in live], factor, mult, groups)
            return gnorm

        return update

