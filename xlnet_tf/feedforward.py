"""The position-wise feed-forward sub-layer (the original's ``ff``): LayerNorm(x + dropout(W2 act(W1 x + b1) + b2))."""

from __future__ import annotations

import keras
import tensorflow as tf

from xlnet_tf.ops import OpsTable, activation_fn, gelu_tanh, normal_init


class FeedForward(keras.layers.Layer):
    """``call(x, seed, ops, salt)``, x [b, s, d_model], ``ops`` the forward pass's ops table: dropout salt ``salt`` after the activation and ``salt + 1``
    before the residual. Weights as in the checkpoint: layer_1 [d_model, d_inner] + bias, layer_2 [d_inner,
    d_model] + bias, a LayerNorm."""

    def __init__(self, config, **kwargs):
        super().__init__(name="ff", **kwargs)
        self.config = c = config
        self.layer_1_kernel = self.add_weight(name="layer_1_kernel", shape=(c.d_model, c.d_inner),
                                              initializer=normal_init(c.initializer_range))
        self.layer_1_bias = self.add_weight(name="layer_1_bias", shape=(c.d_inner,), initializer="zeros")
        self.layer_2_kernel = self.add_weight(name="layer_2_kernel", shape=(c.d_inner, c.d_model),
                                              initializer=normal_init(c.initializer_range))
        self.layer_2_bias = self.add_weight(name="layer_2_bias", shape=(c.d_model,), initializer="zeros")
        self.ln_gamma = self.add_weight(name="ln_gamma", shape=(c.d_model,), initializer="ones")
        self.ln_beta = self.add_weight(name="ln_beta", shape=(c.d_model,), initializer="zeros")
        self.act = activation_fn(c.ff_activation)
        self.built = True

    def weight_roles(self):
        return [(self.layer_1_kernel, "kernel"), (self.layer_2_kernel, "kernel"), (self.layer_1_bias, "bias"),
                (self.layer_2_bias, "bias"), (self.ln_gamma, "norm"), (self.ln_beta, "norm")]

    def call(self, x, seed, ops: OpsTable, salt: int):
        c = self.config
        w = lambda v: tf.cast(v, self.compute_dtype)  # noqa: E731
        x2 = tf.reshape(x, [-1, c.d_model])  # 2-D MatMul -> BiasAdd -> GELU: one oneDNN kernel at inference
        h = tf.matmul(x2, w(self.layer_1_kernel))
        if self.act is gelu_tanh:
            h = ops.gelu_dropout(h, w(self.layer_1_bias), c.dropout, seed, salt)
        else:
            h = ops.dropout(self.act(tf.nn.bias_add(h, w(self.layer_1_bias))), c.dropout, seed, salt)
        h = tf.matmul(h, w(self.layer_2_kernel))
        out = ops.dropout_add_layer_norm(h, x2, self.ln_gamma, self.ln_beta, c.layer_norm_eps, c.dropout, seed,
                                         salt + 1, bias=w(self.layer_2_bias))
        return tf.reshape(out, tf.shape(x))
