"""TaskModel: the backbone plus one head, the unit the training loop, evaluation and export work on.

``model(features, training)`` -> the head's outputs; ``model.per_example_loss(features, outputs)`` -> float32 [batch];
``model.variable_depth(v)`` -> 0 embeddings, l+1 block l, n_layer+1 head (layer-wise LR decay, freezing).
Features with a choice axis (RACE: input_ids [batch, choices, seq]) are flattened for the backbone.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf.head import Head
from xlnet_tf import checkpoint
from xlnet_tf.config import XLNetConfig
from xlnet_tf.modeling import WrapsBackbone, XLNetModel

log = logging.getLogger(__name__)


class TaskModel(WrapsBackbone, keras.Model):
    def __init__(self, config: XLNetConfig, head: Head, seed: int = 0, name: str = "task_model", **kwargs):
        super().__init__(name=name, **kwargs)
        self.backbone = XLNetModel(config, seed=seed)
        self.head = head

    def call(self, features: Dict[str, tf.Tensor], training=False):
        ids = features["input_ids"]
        seg = features.get("segment_ids")
        mask = features.get("padding_mask")
        if ids.shape.rank == 3:  # [batch, choices, seq] -> [batch*choices, seq]
            flat = lambda t: None if t is None else tf.reshape(t, [-1, tf.shape(t)[-1]])  # noqa: E731
            ids, seg, mask = flat(ids), flat(seg), flat(mask)
        out = self.backbone(ids, segment_ids=seg, padding_mask=mask, training=training,
                            output_hidden_states=bool(getattr(self.head, "reads_hidden_states", False)))
        return self.head(out, features, training=training)

    def per_example_loss(self, features, outputs) -> tf.Tensor:
        """float32 [batch]. (Not named ``loss``: keras.Model's constructor sets ``self.loss = None``.)"""
        return self.head.loss(features, outputs)

    def build_with(self, features: Dict[str, np.ndarray]) -> None:
        """Creates every variable by running one batch (heads build lazily)."""
        self(features, training=False)

    # ------------------------------------------------------------------ initial checkpoints
    def load_init_checkpoint(self, path: str) -> Dict[str, int]:
        """Loads the backbone strictly from an original / HF / own checkpoint, and the head's weights when the
        checkpoint holds them under the original fine-tuned names (or ours). Returns counts for logging."""
        fmt = checkpoint.detect_format(path)
        ckpt_config = checkpoint.resolve_config(path, fmt, None, {})
        if ckpt_config.to_original_dict() != self.config.to_original_dict():
            diffs = {k: (v, getattr(ckpt_config, k)) for k, v in self.config.to_original_dict().items()
                     if getattr(ckpt_config, k) != v}
            raise checkpoint.CheckpointError(
                f"{path}: checkpoint config differs from the model config in "
                + ", ".join(f"{k} (model {a!r}, checkpoint {b!r})" for k, (a, b) in diffs.items()))
        reader = checkpoint.load_backbone_weights(self.backbone, path, fmt)
        loaded = 0
        if fmt != "hf":
            for name, var in self.head_name_map().items():
                value = reader.get(name)
                if value is None:
                    continue
                if tuple(value.shape) != tuple(var.shape):
                    raise checkpoint.CheckpointError(f"{path}: {name}: expected shape {list(var.shape)}, "
                                                     f"found {list(value.shape)}")
                var.assign(value)
                loaded += 1
        log.info("loaded backbone from %s (%s) and %d head variables", path, fmt, loaded)
        return {"head_variables_loaded": loaded}

    def head_name_map(self) -> Dict[str, object]:
        """Original checkpoint name -> head variable, matched by the suffix of each variable's path."""
        out = {}
        for suffix, name in self.head.original_names().items():
            matches = [v for v in self.head.weights if v.path.endswith(suffix)]
            if len(matches) != 1:
                raise RuntimeError(f"head variable for {suffix!r}: found {len(matches)} matches "
                                   f"(head built? paths: {[v.path for v in self.head.weights]})")
            out[name] = matches[0]
        return out

    def save_pretrained(self, directory: str) -> None:
        """Our format with the head's weights under their original names (an original fine-tuned checkpoint)."""
        extra = {name: np.asarray(v.numpy()) for name, v in self.head_name_map().items()}
        checkpoint.save_pretrained(self.backbone, directory, extra=extra)
