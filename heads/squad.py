"""XLNet's SQuAD span head with answerability (the original ``get_qa_outputs``).

H = ``sequence_output`` [b, L, d]; p_mask 1 = may not be an answer boundary.
  start      = Dense_1(H), masked: start * (1 - p) - 1e30 * p (in float32); start_lp = log_softmax(start)
  end(s)     = Dense_1(LN(tanh(Dense_d([H ; s])))), masked the same way
  training   : s = H[start_position]  -> start_log_probs, end_log_probs [b, L]
  inference  : the start_n_top best starts, each s = H[start_k] -> end_n_top ends per start:
               start_top_log_probs/index [b, start_n_top], end_top_log_probs/index [b, start_n_top*end_n_top]
  answer     : sp = softmax(masked start); sfeat = sum(sp * H)
               cls_logits = Dense_1_no_bias(Dropout(tanh(Dense_d([sfeat ; H[cls_index]]))))   [b]
  loss       = 0.5 * (CE_start + CE_end) + 0.5 * BCE(cls_logits, is_impossible), per example.
``Dense_d([H ; s])`` is computed as ``H W_top + s W_bottom + b`` (same math, no [b, k, L, 2d] concat).
Inference outputs also carry the teacher-forced ``end_log_probs`` when ``start_position`` is in the
features, so an eval loss can be computed. ``hidden_sizes`` / ``answer_class_hidden_sizes`` make the MLPs
deeper (then there is no original checkpoint to load); empty = the original head.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import keras
import tensorflow as tf

from xlnet_tf.head import Head, hf_layer_norm, hf_linear
from xlnet_tf.masks import mask_logits
from xlnet_tf.ram import HeadSize, dense_params


class SquadHead(Head):
    """The span + answer-class head; ``outputs = head({"sequence_output": H}, features, training)``."""

    def __init__(self, d_model: int = None, start_n_top: int = 5, end_n_top: int = 5, dropout: float = 0.1,
                 hidden_sizes: Sequence[int] = (), answer_class_hidden_sizes: Sequence[int] = (),
                 initializer_range: float = 0.02, layer_norm_eps: float = 1e-12, **kwargs):
        kwargs.setdefault("name", "squad_head")
        super().__init__(**kwargs)
        if start_n_top < 1 or end_n_top < 1:
            raise ValueError(f"start_n_top and end_n_top must be >= 1, got {start_n_top}, {end_n_top}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.start_n_top, self.end_n_top = d_model, start_n_top, end_n_top
        self.dropout_rate = dropout
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.answer_class_hidden_sizes = tuple(int(h) for h in answer_class_hidden_sizes)
        self.initializer_range, self.layer_norm_eps = initializer_range, layer_norm_eps
        self.original = not self.hidden_sizes and not self.answer_class_hidden_sizes
        if d_model is not None:
            self._make_layers()

    @classmethod
    def size(cls, config, d_model: int = None, hidden_sizes: Sequence[int] = (),
             answer_class_hidden_sizes: Sequence[int] = (), **_) -> HeadSize:
        """The layers ``_make_layers`` makes: the start MLP (Dense + LayerNorm per hidden size) and logit, the
        end MLP over [H ; H_start] and logit, the answer-class MLP over [start feature ; CLS] and its logit (no
        bias). Kept per position: H and each MLP layer's dense output and LayerNorm (float32 statistics)."""
        d = d_model or config.d_model
        start = tuple(int(h) for h in hidden_sizes)
        end = start or (d,)

        def mlp(width, sizes, layer_norm):
            n = 0
            for h in sizes:
                n, width = n + dense_params(width, h) + (2 * h if layer_norm else 0), h
            return n, width

        n_start, w_start = mlp(d, start, True)
        n_end, w_end = mlp(2 * d, end, True)
        n_ans, w_ans = mlp(2 * d, tuple(int(h) for h in answer_class_hidden_sizes) or (d,), False)
        params = (n_start + dense_params(w_start, 1) + n_end + dense_params(w_end, 1) + n_ans
                  + dense_params(w_ans, 1, bias=False))
        kept = sum(start) + sum(end)
        return HeadSize("squad", params, per_token=d + 2 * kept, per_token_float32=2 * kept)

    # ------------------------------------------------------------------ layers
    def _dense(self, units, name, activation=None, use_bias=True):
        init = keras.initializers.RandomNormal(stddev=self.initializer_range)
        return keras.layers.Dense(units, activation=activation, use_bias=use_bias, name=name,
                                  kernel_initializer=init, dtype=self.dtype_policy)

    def _ln(self, name):
        return keras.layers.LayerNormalization(epsilon=self.layer_norm_eps, name=name, dtype=self.dtype_policy)

    def _block(self, units, dense_name, ln_name):
        return self._dense(units, dense_name, "tanh"), self._ln(ln_name)

    def _make_layers(self) -> None:
        end_sizes = self.hidden_sizes or (self.d_model,)
        ans_sizes = self.answer_class_hidden_sizes or (self.d_model,)
        if self.hidden_sizes:
            self.start_mlp = [self._block(h, f"start_logits_hidden_{i}", f"start_logits_LayerNorm_{i}")
                              for i, h in enumerate(self.hidden_sizes)]
            self.end_mlp = [self._block(h, f"end_logits_hidden_{i}", f"end_logits_LayerNorm_{i}")
                            for i, h in enumerate(end_sizes)]
            self.end_out = self._dense(1, "end_logits_out")
        else:
            self.start_mlp = []
            self.end_mlp = [self._block(end_sizes[0], "end_logits_dense_0", "end_logits_LayerNorm")]
            self.end_out = self._dense(1, "end_logits_dense_1")
        self.start_out = self._dense(1, "start_logits")
        ac_names = ["answer_class_dense_0"] if not self.answer_class_hidden_sizes else \
            [f"answer_class_hidden_{i}" for i in range(len(ans_sizes))]
        self.ans_mlp = [self._dense(h, n, "tanh") for h, n in zip(ans_sizes, ac_names)]
        self.ans_drop = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)
        self.ans_out = self._dense(1, "answer_class_dense_1" if not self.answer_class_hidden_sizes
                                   else "answer_class_out", use_bias=False)
        # tf.train.Checkpoint does not see layers inside Keras lists: name each one as an attribute too
        for group, layers in (("start", self.start_mlp), ("end", self.end_mlp)):
            for i, (dense, ln) in enumerate(layers):
                setattr(self, f"{group}_dense_{i}", dense)
                setattr(self, f"{group}_ln_{i}", ln)
        for i, dense in enumerate(self.ans_mlp):
            setattr(self, f"ans_dense_{i}", dense)

    def build(self, backbone_outputs_shape, features_shape=None):
        shape = backbone_outputs_shape["sequence_output"] if isinstance(backbone_outputs_shape, dict) \
            else backbone_outputs_shape
        d = self._d_in = int(shape[-1])
        if self.d_model is None:  # inferred: the layers are made now
            self.d_model = d
            self._make_layers()
        # build every sublayer now (variables exist before any tf.function trace): each MLP from its input width
        stacks = ((self.start_mlp, self.start_out, d), (self.end_mlp, self.end_out, 2 * d),
                  ([(dense, None) for dense in self.ans_mlp], self.ans_out, 2 * d))
        for mlp, out, width in stacks:
            for dense, ln in mlp:
                dense.build((None, width))
                if ln is not None:
                    ln.build((None, dense.units))
                width = dense.units
            out.build((None, width))
        self.built = True

    # ------------------------------------------------------------------ pieces
    def _start_logits(self, h):
        x = h
        for dense, ln in self.start_mlp:
            x = ln(dense(x))
        return tf.cast(tf.squeeze(self.start_out(x), -1), tf.float32)

    def _end_logits(self, h, s):
        """h [b, L, d], s [b, k, d] -> end logits [b, k, L] (float32) of Dense_d([h ; s]) ... Dense_1."""
        dense, ln = self.end_mlp[0]
        kernel, d = tf.cast(dense.kernel, h.dtype), self._d_in
        x = (tf.einsum("bld,de->ble", h, kernel[:d])[:, None]
             + tf.einsum("bkd,de->bke", s, kernel[d:])[:, :, None] + tf.cast(dense.bias, h.dtype))
        x = ln(tf.tanh(x))
        for dense, ln in self.end_mlp[1:]:
            x = ln(dense(x))
        return tf.cast(tf.squeeze(self.end_out(x), -1), tf.float32)

    @staticmethod
    def _mask(logits, p_mask):
        return mask_logits(logits, p_mask)

    def call(self, backbone_outputs, features, training=None) -> Dict[str, tf.Tensor]:
        h = backbone_outputs["sequence_output"]
        p_mask = tf.cast(features["p_mask"], tf.float32)
        start = self._mask(self._start_logits(h), p_mask)
        start_lp = tf.nn.log_softmax(start, axis=-1)
        out = {"start_logits": start, "start_log_probs": start_lp}
        if training or "start_position" in features:
            gold = tf.cast(tf.reshape(features["start_position"], [-1]), tf.int32)
            s = tf.gather(h, gold, batch_dims=1)[:, None]
            end = self._mask(self._end_logits(h, s)[:, 0], p_mask)
            out["end_log_probs"] = tf.nn.log_softmax(end, axis=-1)
        if not training:
            top_lp, top_ix = tf.math.top_k(start_lp, k=self.start_n_top)
            s = tf.gather(h, top_ix, batch_dims=1)                                  # [b, k, d]
            end = self._mask(self._end_logits(h, s), p_mask[:, None])               # [b, k, L]
            e_lp, e_ix = tf.math.top_k(tf.nn.log_softmax(end, axis=-1), k=self.end_n_top)
            kk = self.start_n_top * self.end_n_top
            out.update(start_top_log_probs=top_lp, start_top_index=top_ix,
                       end_top_log_probs=tf.reshape(e_lp, [-1, kk]), end_top_index=tf.reshape(e_ix, [-1, kk]))
        # answerability: no dependency on the end, one cls_logit per feature
        sp = tf.cast(tf.nn.softmax(start, axis=-1), h.dtype)
        sfeat = tf.einsum("bl,bld->bd", sp, h)
        cls_index = tf.cast(tf.reshape(features["cls_index"], [-1]), tf.int32)
        x = tf.concat([sfeat, tf.gather(h, cls_index, batch_dims=1)], axis=-1)
        for dense in self.ans_mlp:
            x = self.ans_drop(dense(x), training=training)
        out["cls_logits"] = tf.cast(tf.squeeze(self.ans_out(x), -1), tf.float32)
        return out

    # ------------------------------------------------------------------ protocol
    def loss(self, features, outputs) -> tf.Tensor:
        def ce(log_probs, key):
            pos = tf.cast(tf.reshape(features[key], [-1]), tf.int32)
            return -tf.gather(log_probs, pos, batch_dims=1)

        if "end_log_probs" not in outputs:
            raise KeyError("end_log_probs missing: call the head with start_position in the features")
        imp = tf.cast(tf.reshape(features["is_impossible"], [-1]), tf.float32)
        bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=imp, logits=outputs["cls_logits"])
        span = ce(outputs["start_log_probs"], "start_position") + ce(outputs["end_log_probs"], "end_position")
        return 0.5 * span + 0.5 * bce

    def predictions(self, outputs):
        keys = ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index", "cls_logits")
        return {k: outputs[k] for k in keys if k in outputs}

    def original_names(self) -> Dict[str, str]:
        if not self.original:
            return {}
        names = {"start_logits/kernel": "start_logits/dense/kernel", "start_logits/bias": "start_logits/dense/bias",
                 "end_logits_LayerNorm/gamma": "end_logits/LayerNorm/gamma",
                 "end_logits_LayerNorm/beta": "end_logits/LayerNorm/beta",
                 "answer_class_dense_1/kernel": "answer_class/dense_1/kernel"}
        for ours, orig in (("end_logits_dense_0", "end_logits/dense_0"),
                           ("end_logits_dense_1", "end_logits/dense_1"),
                           ("answer_class_dense_0", "answer_class/dense_0")):
            names.update({f"{ours}/kernel": f"{orig}/kernel", f"{ours}/bias": f"{orig}/bias"})
        return names

    def huggingface_config(self) -> Dict[str, object]:
        """``XLNetForQuestionAnswering`` (the same beam: start_n_top starts, end_n_top ends for each)."""
        if not self.original:
            raise ValueError(f"hidden_sizes={list(self.hidden_sizes)}, answer_class_hidden_sizes="
                             f"{list(self.answer_class_hidden_sizes)}: HuggingFace's XLNetForQuestionAnswering has "
                             f"the original head only (no hidden layers)")
        return {"architectures": ["XLNetForQuestionAnswering"], "start_n_top": self.start_n_top,
                "end_n_top": self.end_n_top, "layer_norm_eps": self.layer_norm_eps}

    def huggingface_weights(self) -> Dict[str, Tuple[object, bool]]:
        (end_dense, end_ln), = self.end_mlp
        return {**hf_linear("start_logits.dense", self.start_out), **hf_linear("end_logits.dense_0", end_dense),
                **hf_layer_norm("end_logits.LayerNorm", end_ln), **hf_linear("end_logits.dense_1", self.end_out),
                **hf_linear("answer_class.dense_0", self.ans_mlp[0]), **hf_linear("answer_class.dense_1", self.ans_out)}

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, start_n_top=self.start_n_top, end_n_top=self.end_n_top,
                      dropout=self.dropout_rate, hidden_sizes=list(self.hidden_sizes),
                      answer_class_hidden_sizes=list(self.answer_class_hidden_sizes),
                      initializer_range=self.initializer_range, layer_norm_eps=self.layer_norm_eps)
        return config
