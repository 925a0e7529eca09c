"""Sequence summary: one vector per sequence, the original ``modeling.summarize_sequence``.

``summary_type``:
  * ``"last"``: ``h[:, -1]`` (the ``<cls>`` of the left-padded classification/RACE layouts);
  * ``"first"``: ``h[:, 0]``;
  * ``"mean"``: mean over real tokens (``padding_mask`` 1 = real; plain mean when no mask is given). The
    original averaged over every position, padding included; with left padding that only differs on padded
    sequences;
  * ``"attn"``: a learned query (``summary_bias``) attends over the sequence with one multi-head attention
    (q/k/v/o kernels [d_model, n_head, d_head], no residual, LayerNorm), padding masked.
then, with ``use_proj``, ``tanh(Dense_d)`` (``summary/{kernel,bias}``), then Dropout.

Original checkpoint names live under ``model/sequnece_summary/`` (sic), see :meth:`SequenceSummary.original_names`.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import keras
import tensorflow as tf

from xlnet_tf.heads import DEFAULT_SUMMARY, SUMMARY_TYPES
from xlnet_tf.head import hf_linear
from xlnet_tf.masks import mask_logits
from xlnet_tf.ops import normal_init
from xlnet_tf.ram import dense_params

ORIGINAL_SCOPE = "model/sequnece_summary"  # the original's spelling
# Why HuggingFace's XLNetSequenceSummary cannot compute a summary type of ours (None: it can).
HF_SUMMARY_TYPES = {"last": None, "first": None,
                    "mean": "HuggingFace's 'mean' averages the padding too, ours the real tokens only",
                    "attn": "HuggingFace's XLNet sequence summary has no attention summary"}


class SequenceSummary(keras.layers.Layer):
    """[batch, seq, d] (+ optional padding_mask [batch, seq]) -> [batch, d_model]."""

    def __init__(self, d_model: int, summary_type: str = DEFAULT_SUMMARY, use_proj: bool = True, dropout: float = 0.1,
                 n_head: Optional[int] = None, d_head: Optional[int] = None, dropatt: float = 0.1,
                 initializer_range: float = 0.02, layer_norm_eps: float = 1e-12, **kwargs):
        super().__init__(**kwargs)
        if summary_type not in SUMMARY_TYPES:
            raise ValueError(f"unknown summary_type {summary_type!r}; expected one of {SUMMARY_TYPES}")
        if summary_type == "attn" and not (n_head and d_head):
            raise ValueError("summary_type='attn' needs n_head and d_head")
        self.d_model, self.summary_type, self.use_proj = d_model, summary_type, use_proj
        self.dropout_rate, self.n_head, self.d_head, self.dropatt = dropout, n_head, d_head, dropatt
        self.initializer_range, self.layer_norm_eps = initializer_range, layer_norm_eps
        self.proj = (keras.layers.Dense(d_model, activation="tanh", name="summary",
                                        kernel_initializer=normal_init(initializer_range),
                                        dtype=self.dtype_policy) if use_proj else None)
        self.drop = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        if summary_type == "attn":
            self.attn_drop = keras.layers.Dropout(dropatt, dtype=self.dtype_policy)
            self.out_drop = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
            self.layer_norm = keras.layers.LayerNormalization(epsilon=layer_norm_eps, name="LayerNorm",
                                                              dtype=self.dtype_policy)

    @staticmethod
    def param_count(d_model: int, summary_type: str = DEFAULT_SUMMARY, use_proj: bool = True,
                    n_head: Optional[int] = None, d_head: Optional[int] = None) -> int:
        """Weights of ``SequenceSummary(d_model, ...)`` on inputs of width d_model (for its heads' ``size``)."""
        n = dense_params(d_model, d_model) if use_proj else 0            # summary/{kernel,bias}
        if summary_type == "attn":                                         # summary_bias, q k v o, LayerNorm
            n += d_model + 4 * d_model * n_head * d_head + 2 * d_model
        return n

    def build(self, input_shape):
        d_in = input_shape[-1]
        if self.summary_type == "attn":
            self.summary_bias = self.add_weight(name="summary_bias", shape=(d_in,),
                                                initializer=normal_init(self.initializer_range))
            shape = (d_in, self.n_head, self.d_head)
            self.q, self.k, self.v, self.o = (self.add_weight(name=f"{n}_kernel", shape=shape,
                                                              initializer=normal_init(self.initializer_range))
                                              for n in "qkvo")
            self.layer_norm.build(tuple(input_shape[:1]) + (d_in,))
        if self.proj is not None:
            self.proj.build(tuple(input_shape[:1]) + (d_in,))

    def weight_roles(self):
        """(variable, role) for the attention summary's own weights (Dense and LayerNorm are known by type)."""
        if self.summary_type != "attn":
            return []
        return [(self.summary_bias, "bias")] + [(w, "kernel") for w in (self.q, self.k, self.v, self.o)]

    def _attend(self, hidden, padding_mask, training):
        dtype = hidden.dtype
        q = tf.einsum("h,hnd->nd", tf.cast(self.summary_bias, dtype), tf.cast(self.q, dtype))
        k = tf.einsum("bsh,hnd->bsnd", hidden, tf.cast(self.k, dtype))
        v = tf.einsum("bsh,hnd->bsnd", hidden, tf.cast(self.v, dtype))
        scores = tf.cast(tf.einsum("nd,bsnd->bns", q, k), tf.float32) * (self.d_head ** -0.5)
        if padding_mask is not None:
            scores = mask_logits(scores, tf.equal(tf.cast(padding_mask, tf.int32), 0)[:, None, :])
        prob = self.attn_drop(tf.cast(tf.nn.softmax(scores, axis=-1), dtype), training=training)
        vec = tf.einsum("bns,bsnd->bnd", prob, v)
        out = self.out_drop(tf.einsum("bnd,hnd->bh", vec, tf.cast(self.o, dtype)), training=training)
        return self.layer_norm(out)

    def call(self, hidden, padding_mask=None, training=None):
        if self.summary_type == "last":
            summary = hidden[:, -1]
        elif self.summary_type == "first":
            summary = hidden[:, 0]
        elif self.summary_type == "mean":
            if padding_mask is None:
                summary = tf.reduce_mean(hidden, axis=1)
            else:
                m = tf.cast(padding_mask, hidden.dtype)[:, :, None]
                summary = tf.reduce_sum(hidden * m, axis=1) / tf.maximum(tf.reduce_sum(m, axis=1), 1)
        else:
            summary = self._attend(hidden, padding_mask, training)
        if self.proj is not None:
            summary = self.proj(summary)
        return self.drop(summary, training=training)

    def original_names(self, scope: str = ORIGINAL_SCOPE) -> Dict[str, str]:
        """{our variable path relative to this layer: original checkpoint name}."""
        names = {}
        if self.proj is not None:
            names.update({"summary/kernel": f"{scope}/summary/kernel", "summary/bias": f"{scope}/summary/bias"})
        if self.summary_type == "attn":
            names["summary_bias"] = f"{scope}/summary_bias"
            names.update({f"{n}_kernel": f"{scope}/abs_attn/{n}/kernel" for n in "qkvo"})
            names.update({"LayerNorm/gamma": f"{scope}/abs_attn/LayerNorm/gamma",
                          "LayerNorm/beta": f"{scope}/abs_attn/LayerNorm/beta"})
        return names

    def huggingface_config(self) -> Dict[str, object]:
        """transformers' ``XLNetSequenceSummary`` fields computing this summary (ValueError where it has none)."""
        if HF_SUMMARY_TYPES[self.summary_type]:
            raise ValueError(f"summary_type={self.summary_type!r}: {HF_SUMMARY_TYPES[self.summary_type]}")
        return {"summary_type": self.summary_type, "summary_use_proj": self.use_proj,
                "summary_proj_to_labels": False, "summary_activation": "tanh" if self.use_proj else None,
                "summary_first_dropout": 0.0, "summary_last_dropout": self.dropout_rate}

    def huggingface_weights(self, prefix: str = "sequence_summary") -> Dict[str, Tuple[object, bool]]:
        return hf_linear(f"{prefix}.summary", self.proj) if self.proj is not None else {}

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, summary_type=self.summary_type, use_proj=self.use_proj,
                      dropout=self.dropout_rate, n_head=self.n_head, d_head=self.d_head, dropatt=self.dropatt,
                      initializer_range=self.initializer_range, layer_norm_eps=self.layer_norm_eps)
        return config
