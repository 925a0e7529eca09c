"""PretrainModel: XLNetModel + the tied LM head for permutation language modelling, with recurrence memory.

Model contract of ``xlnet_tf/training.py``: ``model(features, training)`` -> ``{"logits": [b, P, n_token]}``;
``per_example_loss(features, outputs)`` -> float32 [b]; ``variable_depth(v)``; ``n_layer``.

Objectives: ``plm`` (the paper's permutation LM: two streams, the query stream predicts the targets) or ``mlm``
(BERT-style masked LM on the same backbone, memory included: the content stream reads the corrupted input of
``data.pretrain_sampling.sample_mlm_features`` with full attention, ``mask_emb`` at its masked positions, and its output at the selected positions, gathered
by ``target_mapping``, goes to the same tied head).

Head (the original ``lm_loss``): ``logits = query_output · lookup_tableᵀ + lm_loss/bias`` (``XLNetModel.lm_logits``:
tied, no projection, no LayerNorm); ``CE = softmax cross-entropy(logits, target)``.

Loss averaging. The original's loss is ``Σ CE·target_mask / Σ target_mask`` over a device's batch
(token-weighted), and with several GPUs/cores the mean of those per-device losses. The loop sums the
per-example losses of every replica's micro-batch and divides by the global number of examples, so
``per_example_loss`` returns each sequence's SHARE of its replica's token-weighted loss,
``Σ_p CE·mask × (replica examples / replica target tokens)``: the loop's loss is then exactly the original's
(``Σ CE·mask / Σ mask`` on one device; the mean over replicas of that, as the original's towers; with
gradient accumulation, the mean over micro-batches, as a bigger batch of towers). The counts are local on
purpose: an all-reduce inside the loss would be a synchronisation point inside the loop's accumulation
``tf.while_loop``, which MirroredStrategy does not support. ``token_weighted=False`` gives the plain
per-sequence mean ``Σ_p CE·mask / Σ_p mask`` instead. The sampler (``data/pretrain_sampling.py``) meets the
``num_predict`` goal exactly unless no whole word fits, so all of these nearly always coincide.

Memory. With ``config.mem_len > 0`` the model owns one non-trainable float32 variable per layer,
``[per_replica_batch, mem_len, d_model]``, created with ``synchronization=ON_READ`` (under MirroredStrategy
each replica keeps its own copy: replica r carries the memory of its own streams) and aggregation
``ONLY_FIRST_REPLICA`` (what a cross-replica read and a checkpoint see; averaging unrelated streams' states
would mean nothing). ``call(training=True)`` reads them as the mems, runs the backbone and assigns
``new_mems`` (the backbone's ``_cache_mem``: the reuse part's layer inputs appended to the old memory, last
``mem_len`` kept, ``stop_gradient``). Rows stay aligned because ``data/pretrain_records.py`` orders records so that
row b of a replica's batch at step t+1 continues row b at step t (with ``bi_data`` each replica's batch is
``[forward half | backward half]``, whose rows continue themselves too). They start at zero, as the
original's ``train_gpu.py`` (which attends the zero memory at the first step).
``call(training=False)`` never touches them: it takes explicit ``mems`` and returns ``new_mems``
(``evaluate_plm`` carries them through a held-out stream).

Checkpoints: the mems are saved with the model (replica 0's copy). Resuming on one device is exact; under
several replicas every replica restarts from replica 0's memory (a one-step perturbation of the other
replicas' context; the original restarted from zero memory).
"""

from __future__ import annotations

import math
import weakref
from typing import Dict, Iterable, List, Optional

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import checkpoint, datasets
from xlnet_tf.config import XLNetConfig
from xlnet_tf.modeling import WrapsBackbone, XLNetModel


class PretrainModel(WrapsBackbone, keras.Model):
    """Backbone + tied LM head; ``per_replica_batch`` sizes the memory (the batch each replica sees)."""

    def __init__(self, config: XLNetConfig, per_replica_batch: int, seed: int = 0, token_weighted: bool = True,
                 objective: str = "plm", name: str = "pretrain_model", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(config, dict):
            config = XLNetConfig.from_dict(config)
        if objective not in ("plm", "mlm"):
            raise ValueError(f"objective must be plm or mlm, got {objective!r}")
        self.objective = objective
        if config.bi_data and per_replica_batch % 2:
            raise ValueError(f"bi_data needs an even per-replica batch, got {per_replica_batch}")
        self.backbone = XLNetModel(config, seed=seed)
        self.per_replica_batch = int(per_replica_batch)
        self.token_weighted = bool(token_weighted)
        self.mem_vars: List[keras.Variable] = []
        if config.mem_len > 0:
            self.mem_vars = [
                keras.Variable(initializer="zeros", shape=(self.per_replica_batch, config.mem_len, config.d_model),
                               dtype="float32", trainable=False, autocast=False, synchronization="on_read",
                               aggregation="only_first_replica", name=f"mem_{i}")
                for i in range(config.n_layer)]
        # Keras 3 keeps lists in its own tracker only (a TrackedList is no tf Trackable), so tf.train.Checkpoint
        # would not see the list's variables: register each one with the TF object graph by name.
        for i, var in enumerate(self.mem_vars):
            self._track_trackable(var, name=f"mem_{i}", overwrite=True)
        self.built = True

    # ------------------------------------------------------------------ contract
    def call(self, features: Dict[str, tf.Tensor], training=False, mems: Optional[List] = None):
        """``training=True``: memory from/to the model's variables; else explicit ``mems`` (None = none).

        Returns ``logits`` [b, P, n_token] float32, plus ``new_mems`` when not training and mem_len > 0.
        """
        stateful = bool(training) and bool(self.mem_vars)
        ids = features["input_ids"]
        if stateful:
            batch = ids.shape[0]
            if batch is not None and batch != self.per_replica_batch:
                raise ValueError(f"batch of {batch} rows, but the memory was sized for {self.per_replica_batch} "
                                 f"(per_replica_batch): the data's streams per replica must match")
            mems = [tf.convert_to_tensor(v.value) for v in self.mem_vars]
        if self.objective == "mlm":  # content stream only, full attention; predictions at the selected positions
            out = self.backbone(ids, segment_ids=features.get("segment_ids"),
                                padding_mask=features.get("padding_mask"), mems=mems, training=training,
                                mask_emb_positions=features.get("mask_emb_positions"))
            seq = out["sequence_output"]
            hidden = tf.einsum("bpl,bld->bpd", tf.cast(features["target_mapping"], seq.dtype), seq)
        else:
            out = self.backbone(ids, segment_ids=features.get("segment_ids"),
                                padding_mask=features.get("padding_mask"), mems=mems, perm_mask=features["perm_mask"],
                                target_mapping=features["target_mapping"], training=training)
            hidden = out["query_output"]
        result = {"logits": self.backbone.lm_logits(hidden)}
        if "new_mems" in out:
            if stateful:
                for var, new in zip(self.mem_vars, out["new_mems"]):
                    var.assign(tf.cast(tf.stop_gradient(new), var.dtype))
            else:
                result["new_mems"] = out["new_mems"]
        return result

    def token_losses(self, features, outputs) -> tf.Tensor:
        """float32 [b, P]: CE of every target times target_mask."""
        target = tf.cast(features["target"], tf.int32)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=outputs["logits"])
        return ce * tf.cast(features["target_mask"], tf.float32)

    def sequence_loss(self, features, outputs) -> tf.Tensor:
        """float32 [b]: each sequence's mean CE over its targets."""
        mask = tf.cast(features["target_mask"], tf.float32)
        return tf.reduce_sum(self.token_losses(features, outputs), -1) / tf.maximum(tf.reduce_sum(mask, -1), 1.0)

    def per_example_loss(self, features, outputs) -> tf.Tensor:
        """float32 [b]; see the module docstring (token-weighted shares, or per-sequence means)."""
        if not self.token_weighted:
            return self.sequence_loss(features, outputs)
        sums = tf.reduce_sum(self.token_losses(features, outputs), -1)
        mask = tf.stop_gradient(tf.cast(features["target_mask"], tf.float32))
        examples = tf.cast(tf.shape(mask)[0], tf.float32)
        return sums * examples / tf.maximum(tf.reduce_sum(mask), 1.0)

    # ------------------------------------------------------------------ memory helpers
    def memory(self) -> List[np.ndarray]:
        """The memory variables as numpy (replica 0's copy under a distribution strategy)."""
        return [np.asarray(v.numpy()) for v in self.mem_vars]

    def reset_memory(self) -> None:
        for v in self.mem_vars:
            v.assign(tf.zeros(v.shape, v.dtype))

    def zero_mems(self, batch: int) -> Optional[List[tf.Tensor]]:
        c = self.config
        if c.mem_len <= 0:
            return None
        return [tf.zeros([batch, c.mem_len, c.d_model], tf.float32) for _ in range(c.n_layer)]

    # ------------------------------------------------------------------ export
    def save_backbone(self, directory: str) -> None:
        """``XLNetModel.save_pretrained`` format; the saved config has fine-tuning run options (no memory,
        no reuse, no bi_data), so ``--init_checkpoint`` runs do not inherit the pretraining layout."""
        clean = self.config.replace(mem_len=0, reuse_len=0, bi_data=False, recompute=False)
        checkpoint.save_pretrained(_ConfigView(self.backbone, clean), directory)


class _ConfigView:
    """The backbone seen with another config (what ``checkpoint.save_pretrained`` writes as the config)."""

    def __init__(self, model, config):
        self._model, self.config = model, config

    def __getattr__(self, name):
        return getattr(self._model, name)


# ====================================================================================== evaluation
_EVAL_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def evaluate_plm(model: PretrainModel, dataset: Iterable, steps: Optional[int] = None,
                 unigram_log_probs: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Held-out PLM loss ``Σ CE·mask / Σ mask`` over ``steps`` batches of ``dataset`` (in stream order), the
    memory carried from batch to batch (starting at zero) in Python, never in the model's variables.

    ``unigram_log_probs`` [n_token]: also the cross-entropy of that unigram distribution over the same
    targets (``unigram_loss``). Returns ``loss``, ``perplexity``, ``tokens``, ``steps`` (+ ``unigram_loss``).
    """
    step = _EVAL_STEPS.get(model)
    if step is None:  # one traced function per model (evaluations during training reuse it)
        @tf.function(autograph=False)
        def step(features, mems):
            out = model(features, training=False, mems=mems)
            return tf.reduce_sum(model.token_losses(features, out)), out.get("new_mems")

        _EVAL_STEPS[model] = step
    total, count, uni, n = 0.0, 0.0, 0.0, 0
    mems = None
    if isinstance(dataset, tf.data.Dataset):
        dataset = datasets.for_iteration(dataset)
    for features in dataset:
        if steps is not None and n >= steps:
            break
        if mems is None:
            mems = model.zero_mems(int(features["input_ids"].shape[0]))
        loss_sum, new_mems = step(features, mems)
        if new_mems is not None:
            mems = [tf.cast(m, tf.float32) for m in new_mems]
        mask = features["target_mask"].numpy().astype(np.float64)
        total += float(loss_sum)
        count += float(mask.sum())
        if unigram_log_probs is not None:
            uni -= float((unigram_log_probs[features["target"].numpy()] * mask).sum())
        n += 1
    if count == 0:
        raise ValueError("evaluate_plm: no target tokens (empty held-out dataset?)")
    loss = total / count
    out = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "tokens": int(count), "steps": n}
    if unigram_log_probs is not None:
        out["unigram_loss"] = uni / count
    return out


def unigram_log_probs(token_ids: np.ndarray, vocab_size: int, smoothing: float = 1.0) -> np.ndarray:
    """float64 [vocab]: log of the add-``smoothing`` unigram distribution of ``token_ids``."""
    counts = np.bincount(np.asarray(token_ids, np.int64), minlength=vocab_size)[:vocab_size].astype(np.float64)
    counts += smoothing
    return np.log(counts / counts.sum())
