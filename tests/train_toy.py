"""A toy TaskModel for the training-loop tests, and the subprocess entry points that need their own process
(logical CPU devices, multi-worker).

    python tests/train_toy.py mirrored            # JSON report comparing default and MirroredStrategy
    python tests/train_toy.py worker PORT0 PORT1 INDEX MODEL_DIR   # one MultiWorkerMirroredStrategy worker
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":  # logical CPUs must exist before TensorFlow initialises its devices
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if sys.argv[1] == "worker":
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [f"127.0.0.1:{sys.argv[2]}", f"127.0.0.1:{sys.argv[3]}"]},
            "task": {"type": "worker", "index": int(sys.argv[4])}})

import keras
import numpy as np
import tensorflow as tf

VOCAB, SEQ, N_CLASS, N_EXAMPLES = 16, 6, 3, 64


class Block(keras.layers.Layer):
    """Dense + r_w_bias + dropout + LayerNorm: real-looking variable names (kernel, bias, r_w_bias, gamma, beta)."""

    def __init__(self, d, dropout, **kwargs):
        super().__init__(**kwargs)
        self.ff = keras.layers.Dense(d, activation="tanh", name="ff")
        self.layer_norm = keras.layers.LayerNormalization(name="layer_norm")
        self.drop = keras.layers.Dropout(dropout)
        self.d = d

    def build(self, input_shape):
        self.r_w_bias = self.add_weight(shape=(self.d,), initializer=keras.initializers.RandomNormal(stddev=0.02),
                                        name="r_w_bias")
        self.ff.build(input_shape)
        self.layer_norm.build(input_shape)

    def weight_roles(self):
        return [(self.r_w_bias, "attention_bias")]

    def call(self, x, training=False):
        return self.layer_norm(x + self.drop(self.ff(x) + self.r_w_bias, training=training))


class ToyTaskModel(keras.Model):
    """Embedding (depth 0) + n_layer blocks (depth l+1) + dense head (depth n_layer+1)."""

    def __init__(self, n_layer=2, d=8, dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        self.n_layer = n_layer
        self.embedding = keras.layers.Embedding(VOCAB, d, name="word_embedding")
        self.blocks = [Block(d, dropout, name=f"layer_{i}") for i in range(n_layer)]
        self.drop = keras.layers.Dropout(dropout)
        self.head = keras.layers.Dense(N_CLASS, name="logit")

    def call(self, features, training=False):
        h = self.embedding(features["input_ids"])
        for block in self.blocks:
            h = block(h, training=training)
        logits = self.head(self.drop(keras.ops.mean(h, axis=1), training=training))
        return {"logits": tf.cast(logits, tf.float32)}

    def loss(self, features, outputs):
        return keras.losses.sparse_categorical_crossentropy(features["label"], outputs["logits"], from_logits=True)

    def variable_depth(self, variable):
        groups = [self.embedding.weights] + [b.weights for b in self.blocks] + [self.head.weights]
        for depth, weights in enumerate(groups):
            if any(w is variable for w in weights):
                return depth
        raise KeyError(variable.path)


def make_model(n_layer=2, dropout=0.1):
    def model_fn():
        model = ToyTaskModel(n_layer=n_layer, dropout=dropout)
        model({"input_ids": tf.zeros([1, SEQ], tf.int32)})
        return model
    return model_fn


def toy_data():
    rng = np.random.RandomState(0)
    ids = rng.randint(0, VOCAB, size=(N_EXAMPLES, SEQ)).astype(np.int32)
    return {"input_ids": ids, "label": (ids.sum(axis=1) % N_CLASS).astype(np.int32)}


def make_dataset_fn(per_replica_batch, shuffle=True, seed=7):
    data = toy_data()

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices(data)
        if ctx.num_input_pipelines > 1:
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        if shuffle:
            ds = ds.shuffle(32, seed=seed)
        return ds.repeat().batch(per_replica_batch, drop_remainder=True)
    return dataset_fn


def weights(model):
    return [v.numpy() for v in model.weights]


def max_diff(a, b):
    return float(max(np.max(np.abs(x - y)) for x, y in zip(a, b)))


def _mirrored_report():
    from xlnet_tf import distribute, training
    strategy = distribute.get_strategy("mirrored", num_cpu_devices=2)
    assert strategy.num_replicas_in_sync == 2
    # layer-wise LR and weight decay on: per-variable options must survive the mirrored variables
    cfg = dict(learning_rate=1e-2, train_steps=4, progress=False, seed=3, lr_layer_decay_rate=0.5, weight_decay=0.1)

    def run(strat, batch, k, **extra):
        config = training.TrainConfig(grad_accum_steps=k, **{**cfg, **extra})
        return training.train(make_model(dropout=0.0), make_dataset_fn(batch, shuffle=False), config, strat)

    ref = run(None, 8, 1)  # default strategy, batch 8
    rep, mirrored_model = {}, None
    for name, strat, batch, k in (("mirrored_b4", strategy, 4, 1), ("mirrored_b2_k2", strategy, 2, 2)):
        res = run(strat, batch, k)
        mirrored_model = mirrored_model or res.model
        rep[name] = {"weights": max_diff(weights(ref.model), weights(res.model)),
                     "loss": max(abs(a[1] - b[1]) for a, b in zip(ref.history, res.history))}
    # predict with a partial last batch (10 rows, global batch 4 -> 4, 4, 2)
    data = {key: val[:10] for key, val in toy_data().items()}
    ds = tf.data.Dataset.from_tensor_slices(data).batch(4)
    out = training.predict(mirrored_model, ds, strategy)
    direct = ref.model(data)["logits"].numpy()
    rep["predict"] = {"rows": int(out["logits"].shape[0]), "diff": float(np.max(np.abs(out["logits"] - direct)))}
    # resume under MirroredStrategy with dropout and a seeded shuffle ("skip" data resume)
    import tempfile
    full_dir, cut_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    mk = lambda d: training.TrainConfig(learning_rate=1e-2, train_steps=4, save_steps=2, model_dir=d,
                                        progress=False, seed=5)
    full = training.train(make_model(), make_dataset_fn(4), mk(full_dir), strategy)
    training.Trainer(make_model(), make_dataset_fn(4), mk(cut_dir), strategy).train(stop_at=3)
    resumed_tr = training.Trainer(make_model(), make_dataset_fn(4), mk(cut_dir), strategy)
    assert resumed_tr.data_resume == "skip"
    resumed = resumed_tr.train()
    rep["resume"] = {"weights": max_diff(weights(full.model), weights(resumed.model)),
                     "steps": [s for s, _ in resumed.history]}
    try:  # last: connecting to a (missing) TPU may reset the eager context
        distribute.get_strategy("tpu", tpu="local")
        rep["tpu"] = "no error"
    except RuntimeError as err:
        rep["tpu"] = str(err)[:80]
    print("REPORT " + json.dumps(rep))


def _worker():
    from xlnet_tf import distribute, training
    strategy = distribute.get_strategy("multi_worker")
    config = training.TrainConfig(learning_rate=1e-2, train_steps=3, progress=False, seed=3, save_steps=2,
                                  model_dir=sys.argv[5])
    res = training.train(make_model(), make_dataset_fn(4), config, strategy)
    print("REPORT " + json.dumps({"replicas": strategy.num_replicas_in_sync,
                                  "losses": [l for _, l in res.history],
                                  "checksum": float(sum(np.sum(w) for w in weights(res.model)))}))


if __name__ == "__main__":
    {"mirrored": _mirrored_report, "worker": _worker}[sys.argv[1]]()
    # Skip interpreter teardown: destroying tf.data iterators there intermittently waited 1-3 minutes on this
    # loaded 2-core machine (threads blocked in RootDataset::Iterator's destructor), which is not under test.
    sys.stdout.flush()
    os._exit(0)
