"""The training options (``TrainConfig``), apart from the loop so the command lines read their defaults without
importing TensorFlow. Each option is resolved here, once: "auto" bias correction, a clip <= 0, a negative
``num_trainable_layers`` and the jit names become values in ``__post_init__``, and the config builds its own
learning-rate schedule and optimizer (``schedule()``, ``optimizer()``), which the loop, Keras ``fit``, pretraining
and the report's curve call instead of unpacking the fields."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

from xlnet_tf import hardware

# How layer-wise decay applies (``optimization.py``): "grad" the original's (the clipped gradients of block l
# scaled), "lr" a true per-layer learning rate.
LAYER_DECAY_MODES = ("grad", "lr")
# --jit's names and what they mean (see TrainConfig.jit_compile)
JIT_NAMES = {"auto": None, "true": "step", "step": "step", "update": "update", "false": "off", "off": "off",
             True: "step", False: "off", None: None}


def auto_bias_correction(weight_decay: float, pretrained: bool) -> bool:
    """Adam bias correction by default. Fine-tuning pretrained weights: the original's rule, on when
    ``weight_decay == 0`` (its tf.train.AdamOptimizer) and off otherwise (its AdamWeightDecayOptimizer), which is
    what reproduces the published recipes (2e-5..5e-5 on a pretrained backbone). From random initialisation:
    always on; without it the first few hundred updates are 3-6x larger, and at the learning rates a fresh model
    needs (1e-4..1e-3) that collapses a run to one label (measured on the quickstart: dev 0.375 vs 0.79)."""
    return True if not pretrained else not weight_decay > 0


@dataclasses.dataclass
class TrainConfig:
    """How the one loop trains (``xlnet_tf/training.py``). Each default is written here only: the command-line
    flags take theirs from these fields (``run_flags``)."""
    learning_rate: float = 1e-5
    train_steps: int = 1000
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_epsilon: float = 1e-6
    # None / "auto": ``auto_bias_correction`` for ``pretrained`` (resolved to a bool when the config is made)
    adam_bias_correction: Union[None, bool, str] = None
    pretrained: bool = True                # the backbone starts from pretrained weights (decides "auto" above)
    clip_norm: Optional[float] = 1.0       # None / <= 0: no clipping (resolved to None)
    lr_layer_decay_rate: float = 1.0
    layer_decay_mode: str = "grad"         # "grad": the original; "lr": true per-layer LR (optimization.py)
    grad_accum_steps: int = 1
    precision: str = "float32"
    initial_loss_scale: float = 2.0 ** 15
    num_trainable_layers: Optional[int] = None   # None / -1: all (resolved to None)
    # XLA: "step" (True) compiles the whole replica step; "update" only the optimizer update (clip, scale,
    # AdamW), the forward and backward stay on the plain graph (oneDNN); "off" (False) neither.
    # None = auto (``default_jit``): "step" on one GPU and for float16, "update" on one CPU device, "off" under
    # multi-device or TPU (TPUStrategy compiles everything itself). Why: BUILD.md, "XLA where it pays".
    jit_compile: Union[None, bool, str] = None
    model_dir: Optional[str] = None        # checkpoints + TensorBoard; None: neither
    save_steps: int = 1000                 # 0: only at the end
    keep_checkpoint_max: int = 5
    log_steps: int = 100
    seed: int = 42
    data_resume: str = "auto"              # "iterator" | "skip" | "auto" (iterator when checkpointable)
    progress: bool = True

    def __post_init__(self):
        hardware.validate_precision(self.precision)
        if self.layer_decay_mode not in LAYER_DECAY_MODES:
            raise ValueError(f"layer_decay_mode: expected one of {LAYER_DECAY_MODES}, "
                             f"got {self.layer_decay_mode!r}")
        if self.data_resume not in ("auto", "iterator", "skip"):
            raise ValueError(f"data_resume: expected auto|iterator|skip, got {self.data_resume!r}")
        if self.jit_compile not in JIT_NAMES:
            raise ValueError(f"jit_compile: expected None/'auto', True/'step'/'true', 'update' or False/'off'/"
                             f"'false', got {self.jit_compile!r}")
        self.jit_compile = JIT_NAMES[self.jit_compile]
        for name in ("grad_accum_steps", "train_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or value != int(value) or int(value) < 1:
                raise ValueError(f"{name}={value!r}: expected an integer >= 1")
        bias = {"auto": None, "true": True, "false": False}.get(self.adam_bias_correction, self.adam_bias_correction)
        if bias not in (None, True, False):
            raise ValueError(f"adam_bias_correction: expected None/'auto', True/'true' or False/'false', "
                             f"got {self.adam_bias_correction!r}")
        self.adam_bias_correction = auto_bias_correction(self.weight_decay, self.pretrained) if bias is None \
            else bool(bias)
        if self.clip_norm is not None and not self.clip_norm > 0:
            self.clip_norm = None
        if self.num_trainable_layers is not None and self.num_trainable_layers < 0:
            self.num_trainable_layers = None

    def check_training(self) -> None:
        """Refuses (ValueError, one line naming the option) values no training means: a learning rate that is
        not a finite number > 0, negative warmup or weight decay, a final-rate ratio outside [0, 1], epsilon or
        layer-decay rate <= 0."""
        checks = (("learning_rate", self.learning_rate, lambda v: math.isfinite(v) and v > 0, "a number > 0"),
                  ("warmup_steps", self.warmup_steps, lambda v: v >= 0, ">= 0"),
                  ("weight_decay", self.weight_decay, lambda v: math.isfinite(v) and v >= 0, ">= 0"),
                  ("min_lr_ratio", self.min_lr_ratio, lambda v: 0 <= v <= 1, "within [0, 1]"),
                  ("adam_epsilon", self.adam_epsilon, lambda v: math.isfinite(v) and v > 0, "> 0"),
                  ("lr_layer_decay_rate", self.lr_layer_decay_rate, lambda v: math.isfinite(v) and v > 0, "> 0"))
        for name, value, ok, expected in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise ValueError(f"{name}={value!r}: expected {expected} to train")

    def schedule(self):
        """The learning rate by step: warmup, then linear decay to ``min_lr_ratio`` at ``train_steps``."""
        from xlnet_tf.optimization import WarmupLinearDecay

        return WarmupLinearDecay(self.learning_rate, self.train_steps, self.warmup_steps, self.min_lr_ratio)

    def optimizer(self):
        """The recipe's AdamW on ``schedule()`` (call inside the strategy's scope; the per-variable decay flags
        and layer-decay multipliers are set by ``xlnet_tf.train_step.UpdateRule``, which knows the model)."""
        from xlnet_tf.optimization import AdamW

        return AdamW(learning_rate=self.schedule(), weight_decay=self.weight_decay, epsilon=self.adam_epsilon,
                     bias_correction=self.adam_bias_correction)
