"""TaskModel: the backbone plus one head, the unit the training loop, evaluation and export work on.

``model(features, training)`` -> the head's outputs; ``model.per_example_loss(features, outputs)`` -> float32 [batch];
``model.variable_depth(v)`` -> 0 embeddings, l+1 block l, n_layer+1 head (layer-wise LR decay, freezing).
Features with a choice axis (RACE: input_ids [batch, choices, seq]) are flattened for the backbone.

Long documents (features with ``num_segments``): ``input_ids``, ``segment_ids``, ``padding_mask`` are
[batch, windows, seq], consecutive windows of each document, right-aligned (a document of fewer windows starts
with all-padding windows). Windows 0..S-2 run left to right in a ``tf.while_loop`` in inference mode, each with
the previous windows' hidden states as memory (``config.mem_len`` positions, no gradient, padded positions
hidden by ``mem_padding_mask``); the last window runs with that memory in the call's mode and the head reads it
(its CLS). So only the last window gets gradients, as "no gradient into memory". In inference a batch of
one-window documents takes the plain path: exactly the output of the one-window features (in training, and in
batches mixing lengths, a one-window document attends to an all-hidden memory: the same up to rounding).
With a choice axis (RACE: [batch, choices, windows, seq]) the windows are flattened to [batch*choices, windows,
seq]: each option's sequence is its own document.
"""

from __future__ import annotations

import logging
from typing import Dict

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import checkpoint
from xlnet_tf.config import XLNetConfig
from xlnet_tf.head import Head
from xlnet_tf.masks import hidden_memory_mask, next_mem_padding_mask
from xlnet_tf.modeling import WrapsBackbone, XLNetModel

log = logging.getLogger(__name__)


class TaskModel(WrapsBackbone, keras.Model):
    def __init__(self, config: XLNetConfig, head: Head, seed: int = 0, name: str = "task_model", **kwargs):
        super().__init__(name=name, **kwargs)
        self.backbone = XLNetModel(config, seed=seed)
        self.head = head

    def call(self, features: Dict[str, tf.Tensor], training=False, positions=None):
        out, head_features = self.encode(features, training=training, positions=positions)
        return self.head(out, head_features, training=training)

    def encode(self, features: Dict[str, tf.Tensor], training=False, positions=None):
        """(backbone outputs, the features the head reads): for long-document windows, the last window's outputs
        (with the document's memory) and features. ``positions``: the call's projected relative positions
        (``XLNetModel.positions_from_tables``; one window without memory, inference), as a serving export
        passes them; None: computed by the backbone."""
        hidden = bool(getattr(self.head, "reads_hidden_states", False))
        if "num_segments" in features:
            return self._encode_windows(features, training, hidden)
        ids = tf.convert_to_tensor(features["input_ids"])  # (encode may be called directly with numpy arrays)
        seg = features.get("segment_ids")
        mask = features.get("padding_mask")
        if ids.shape.rank == 3:  # [batch, choices, seq] -> [batch*choices, seq]
            flat = lambda t: None if t is None else tf.reshape(t, [-1, tf.shape(t)[-1]])  # noqa: E731
            ids, seg, mask = flat(ids), flat(seg), flat(mask)
        out = self.backbone(ids, segment_ids=seg, padding_mask=mask, training=training, output_hidden_states=hidden,
                            positions=positions, last_position_only=self._last_only(hidden))
        return out, features

    def _last_only(self, hidden: bool) -> bool:
        """The backbone computes only the last position where the head reads nothing else (``Head``)."""
        return bool(getattr(self.head, "reads_last_position", False)) and not hidden

    def _encode_windows(self, features, training, hidden):
        c = self.config
        if c.mem_len <= 0:
            raise ValueError("long-document features (num_segments) need a model with memory: config.mem_len > 0")
        names = ("input_ids", "segment_ids", "padding_mask")
        ids, seg, mask = (tf.cast(features[k], tf.int32) for k in names)
        if ids.shape.rank == 4:  # [batch, choices, windows, seq] -> [batch*choices, windows, seq]
            flat = lambda t: tf.reshape(t, [-1] + [d if d is not None else tf.shape(t)[i]  # noqa: E731
                                                    for i, d in enumerate(t.shape[2:], 2)])
            ids, seg, mask = flat(ids), flat(seg), flat(mask)
        last = dict(features, **{k: t[:, -1] for k, t in zip(names, (ids, seg, mask))})
        del last["num_segments"]

        def last_window(mems=None, mem_mask=None):
            out = self.backbone(last["input_ids"], segment_ids=last["segment_ids"],
                                padding_mask=last["padding_mask"], mems=mems, mem_padding_mask=mem_mask,
                                training=training, output_hidden_states=hidden,
                                last_position_only=self._last_only(hidden))
            return {k: out[k] for k in ("sequence_output", "hidden_states") if k in out}

        def with_memory():
            return last_window(*self.document_memory(ids[:, :-1], seg[:, :-1], mask[:, :-1]))

        if training:  # (TensorFlow cannot differentiate this cond around the backbone's nested functions)
            return with_memory(), last
        return tf.cond(tf.shape(ids)[1] > 1, with_memory, last_window), last

    def document_memory(self, ids, seg, mask):
        """Windows [b, S, L] -> (mems: n_layer x [b, mem_len, d], mem_padding_mask [b, mem_len]) after running
        them left to right (inference mode, no gradient)."""
        mems, mem_mask = self.empty_memory(tf.shape(ids)[0])

        def body(i, mems, mem_mask):
            _, mems, mem_mask = self.window_step(ids[:, i], seg[:, i], mask[:, i], mems, mem_mask)
            return i + 1, mems, mem_mask

        _, mems, mem_mask = tf.while_loop(lambda i, *_: i < tf.shape(ids)[1], body, (tf.constant(0), mems, mem_mask))
        return [tf.stop_gradient(m) for m in mems], tf.stop_gradient(mem_mask)

    def empty_memory(self, batch):
        """A document's memory before its first window: n_layer x [batch, mem_len, d] zeros, every position hidden
        (so every window step has the same shapes)."""
        c = self.config
        mems = [tf.zeros(tf.stack([batch, c.mem_len, c.d_model]), self.backbone.compute_dtype)
                for _ in range(c.n_layer)]
        return mems, hidden_memory_mask(batch, c.mem_len)

    def window_step(self, ids, seg, mask, mems, mem_mask, training=False, output_hidden_states=False):
        """One window [b, L] read with the memory of the earlier ones -> (backbone outputs, the next mems, the next
        mem_padding_mask)."""
        c = self.config
        out = self.backbone(ids, segment_ids=seg, padding_mask=mask, mems=mems, mem_padding_mask=mem_mask,
                            training=training, output_hidden_states=output_hidden_states)
        new = [tf.ensure_shape(m, [None, c.mem_len, c.d_model]) for m in out["new_mems"]]
        return out, new, next_mem_padding_mask(mem_mask, mask, c.mem_len)

    def per_example_loss(self, features, outputs) -> tf.Tensor:
        """float32 [batch]. (Not named ``loss``: keras.Model's constructor sets ``self.loss = None``.)"""
        return self.head.loss(features, outputs)

    def build_with(self, features: Dict[str, np.ndarray]) -> None:
        """Creates every variable by running one batch (heads build lazily)."""
        self(features, training=False)

    # ------------------------------------------------------------------ initial checkpoints
    def load_init_checkpoint(self, path: str, ignore_mismatched_sizes: bool = False) -> Dict[str, int]:
        """Loads the backbone strictly from an original / HF / own checkpoint, and the head's weights when the
        checkpoint holds them (original fine-tuned names or ours; an HF directory's ``XLNetFor...`` head). Returns
        counts for logging.

        A head that does not fit the checkpoint (a weight of another shape: ``num_classes``, ``regression``; or a
        head the checkpoint holds only part of, such as another task's logits) is one rule for every task:
        refused in one line naming the variable and both shapes, or, with ``ignore_mismatched_sizes=True``
        (transformers' name), re-initialised with a warning. A checkpoint without head weights (a pretrained
        backbone) gives a new head."""
        fmt = checkpoint.detect_format(path)
        # A checkpoint without a config beside it (an original prefix) is read with the model's own config
        # (the caller's); the shapes are checked either way.
        found = checkpoint.config_file(path, fmt)
        ckpt_config = self.config if found is None else checkpoint.resolve_config(path, fmt, None, {})
        if ckpt_config.to_original_dict() != self.config.to_original_dict():
            diffs = {k: (v, getattr(ckpt_config, k)) for k, v in self.config.to_original_dict().items()
                     if getattr(ckpt_config, k) != v}
            raise checkpoint.CheckpointError(
                f"{path}: checkpoint config differs from the model config in "
                + ", ".join(f"{k} (model {a!r}, checkpoint {b!r})" for k, (a, b) in diffs.items()))
        reader = checkpoint.load_backbone_weights(self.backbone, path, fmt)
        # (checkpoint name, variable, transposed, stored shape, read) of every head weight
        if fmt == "hf":
            try:
                weights = self.head.huggingface_weights()
            except ValueError as e:  # a head HF has no form of: nothing of it can be in an HF directory
                weights = {}
                if reader.head_keys():
                    log.warning("%s: its head weights (%s) are not read: %s", path, ", ".join(reader.head_keys()), e)
            entries = [(k, v, t, reader.head_shape(k), lambda k=k: reader.head_get(k))
                       for k, (v, t) in weights.items()]
            others = [k for k in reader.head_keys() if k not in weights]
        else:
            entries = [(n, v, False, reader.shape(n), lambda n=n: reader.get(n))
                       for n, v in self.head_name_map().items()]
            others = _other_head_names(reader, entries)
        loaded = self._load_head(path, entries, others, reader, ignore_mismatched_sizes)
        log.info("loaded backbone from %s (%s) and %d head variables", path, fmt, loaded)
        return {"head_variables_loaded": loaded}

    def _load_head(self, path, entries, others, reader, ignore: bool) -> int:
        """Assigns the head's weights found in the checkpoint (the rule: ``load_init_checkpoint``'s docstring)."""
        present = [e for e in entries if e[3] is not None]
        if not present and others:  # another kind of head (transformers' "unexpected keys"): this one starts new
            log.warning("%s: the checkpoint's head weights (%s%s) are not this model's head: its head is new",
                        path, ", ".join(others[:3]), ", ..." if len(others) > 3 else "")
        mismatched = []
        for name, var, transposed, shape, _ in entries:
            expected = tuple(var.shape)
            if shape is not None:
                stored = tuple(shape)[::-1] if transposed else tuple(shape)
                if stored != expected:
                    mismatched.append(f"{name}: expected shape {list(expected)}, found {list(stored)}")
            elif present:  # the checkpoint holds a head, but not this weight of it
                near = [o for o in others if o.split("/")[-2:] == name.split("/")[-2:]]
                held = f"; it holds {near[0]} {list(_shape(reader, near[0]))}" if near else ""
                mismatched.append(f"{name}: expected shape {list(expected)}, found none in the checkpoint{held}")
        if mismatched and not ignore:
            raise checkpoint.CheckpointError(
                f"{path}: the head does not fit the checkpoint: {mismatched[0]}"
                + (f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else "")
                + "; pass ignore_mismatched_sizes=True to re-initialise it")
        loaded = 0
        bad = {m.split(":")[0] for m in mismatched}
        for m in mismatched:
            log.warning("%s: re-initialised (ignore_mismatched_sizes=True): %s", path, m)
        for name, var, transposed, shape, read in entries:
            if shape is None or name in bad:
                continue
            value = np.asarray(read())
            var.assign(value.T if transposed else value)
            loaded += 1
        return loaded

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

    def save_pretrained(self, directory: str, format: str = "own", tokenizer=None, extra_files=None) -> None:
        """Our format with the head's weights under their original names (an original fine-tuned checkpoint), or
        ``"huggingface"``: transformers' model with the same head (``XLNetForSequenceClassification``,
        ``XLNetForMultipleChoice``, ``XLNetForQuestionAnswering``); a head HF lacks raises ValueError naming it.
        ``tokenizer`` (an ``XLNetTokenizer``): written beside the weights (``checkpoint.write_tokenizer``);
        ``extra_files``: {name in ``checkpoint.EXTRA_FILES``: JSON value} written with them."""
        if format == "huggingface":
            head = checkpoint.HFHead(self.head.huggingface_config(), self.head.huggingface_tensors())
            checkpoint.save_pretrained(self.backbone, directory, format=format, hf_head=head, tokenizer=tokenizer,
                                       extra_files=extra_files)
            return
        extra = {name: np.asarray(v.numpy()) for name, v in self.head_name_map().items()}
        checkpoint.save_pretrained(self.backbone, directory, extra=extra, format=format, tokenizer=tokenizer,
                                   extra_files=extra_files)


def _shape(reader, name):
    return reader.shape(name) or ()


def _other_head_names(reader, entries):
    """The checkpoint's names outside the backbone that this head does not read (another task's head)."""
    names = getattr(reader, "names", None)
    if names is None:
        return []
    ours = {e[0] for e in entries}
    return [n for n in names() if n not in ours and not n.startswith(checkpoint.PREFIX) and n != "global_step"
            and not n.startswith("model/lm_loss/")]
