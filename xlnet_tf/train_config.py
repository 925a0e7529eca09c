"""The training loop's options (``TrainConfig``), apart from the loop so the command lines read their defaults
without importing TensorFlow."""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

from xlnet_tf import hardware

# How layer-wise decay applies (``optimization.py``): "grad" the original's (the clipped gradients of block l
# scaled), "lr" a true per-layer learning rate.
LAYER_DECAY_MODES = ("grad", "lr")


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
    adam_bias_correction: Optional[bool] = None  # None: the original's, on iff weight_decay == 0
    clip_norm: Optional[float] = 1.0       # None / <= 0: no clipping
    lr_layer_decay_rate: float = 1.0
    layer_decay_mode: str = "grad"         # "grad": the original; "lr": true per-layer LR (optimization.py)
    grad_accum_steps: int = 1
    precision: str = "float32"
    initial_loss_scale: float = 2.0 ** 15
    num_trainable_layers: Optional[int] = None   # None / -1: all
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
        jit = {True: "step", False: "off"}.get(self.jit_compile, self.jit_compile)
        if jit not in (None, "step", "update", "off"):
            raise ValueError(f"jit_compile: expected None, True/'step', 'update' or False/'off', "
                             f"got {self.jit_compile!r}")
        self.jit_compile = jit
        if int(self.grad_accum_steps) < 1 or int(self.train_steps) < 1:
            raise ValueError("grad_accum_steps and train_steps must be >= 1")
