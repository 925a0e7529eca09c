"""Per-token and pooled vectors of chosen layers for raw text, from a pretrained or fine-tuned XLNet.

    python extract_features.py --input_file=texts.txt --output_file=features.npz --spiece_model_file=spiece.model \
      --model_config_path=xlnet_config.json --init_checkpoint=xlnet_model.ckpt --output_dir=OUT \
      --layers=-1,-2 --pooling=mean --max_seq_length=128

``--input_file``: UTF-8, one text per line; ``A ||| B`` gives a pair (the classifier's layout: A <sep> B <sep>
<cls>, left-padded). A fine-tuned run's checkpoint in ``--model_dir`` (default OUTPUT_DIR/model) takes precedence
over ``--init_checkpoint``. ``--output_file``:
* ``.npz``: ``pooled`` [n, layers, d], ``tokens`` [n, max_seq_length, layers, d] (zeros at padding), ``input_ids``,
  ``padding_mask`` [n, max_seq_length] and ``layers`` (the hidden-state indices: 0 = embeddings);
* ``.tfrecord``: one record per text with ``pooled`` and ``tokens`` (float lists of the real tokens only, row
  after row), ``input_ids`` (real tokens) and ``layers``.
"""

from __future__ import annotations

import logging

from absl import app, flags

import run_common
from tasks import runner

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "Texts, one per line (A ||| B for a pair).")
flags.DEFINE_string("output_file", None, "Where the vectors go: .npz or .tfrecord.")
flags.DEFINE_list("layers", ["-1"], "Hidden-state indices (0 = embeddings, -1 = last block).")
flags.DEFINE_enum("pooling", "mean", ["mean", "last"], "Pooled vector: mean over real tokens, or the last (CLS).")
run_common.define_common_flags(default_seq_len=128, default_lr=0.0)

log = logging.getLogger("extract_features")


def read_texts(path):
    """[(text_a, text_b or None)], one per non-empty line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            a, sep, b = line.partition(" ||| ")
            if not a.strip() or (sep and not b.strip()):
                raise ValueError(f"{path}:{n}: expected 'text' or 'text A ||| text B', got {line[:80]!r}")
            out.append((a, b if sep else None))
    if not out:
        raise ValueError(f"{path}: no texts (expected one per line)")
    return out


class FeatureRun(runner.TaskSpec):
    """Feature extraction for the runner: ``predict`` writes the vectors of ``texts``."""
    name, main_metric = "features", "none"

    def __init__(self, texts, tokenizer, config, max_seq_length, layers, pooling, batch_size, output_file):
        self.texts, self.tokenizer, self.config, self.L = texts, tokenizer, config, max_seq_length
        self.layers, self.pooling, self.batch_size, self.output_file = layers, pooling, batch_size, output_file

    def head(self):
        from heads.features import FeatureHead

        return FeatureHead(self.config.n_layer, self.layers, self.pooling)

    def feature_spec(self):
        from tasks.classification import features as cls_data

        return cls_data.feature_spec(self.L)

    def predict(self, model, output_dir):
        import numpy as np
        import tensorflow as tf

        from tasks.classification import features as cls_data
        from xlnet_tf.training import predict

        feats = cls_data.encode_texts(self.tokenizer, [a for a, _ in self.texts],
                                      [b or "" for _, b in self.texts], self.L)
        ds = tf.data.Dataset.from_tensor_slices(feats).batch(self.batch_size)
        out = predict(model, ds, self.finetuner.strategy,
                      output_fn=lambda features, outputs: {k: outputs[k] for k in ("tokens", "pooled")})
        head = model.head
        write_vectors(self.output_file, out["pooled"], out["tokens"], feats["input_ids"], feats["padding_mask"],
                      np.asarray(head.layers, np.int32))
        return self.output_file


def write_vectors(path, pooled, tokens, input_ids, padding_mask, layers):
    import numpy as np
    import tensorflow as tf

    from xlnet_tf.fileutil import atomic_path, atomic_write

    if path.endswith(".npz"):
        with atomic_write(path, "wb") as f:
            np.savez(f, pooled=pooled, tokens=tokens, input_ids=input_ids, padding_mask=padding_mask, layers=layers)
        return
    floats = lambda x: tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(x)))  # noqa: E731
    ints = lambda x: tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(x)))  # noqa: E731
    with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as w:
        for p, t, ids, m in zip(pooled, tokens, input_ids, padding_mask):
            real = m.astype(bool)
            ex = tf.train.Example(features=tf.train.Features(feature={
                "pooled": floats(p), "tokens": floats(t[real]), "input_ids": ints(ids[real]),
                "layers": ints(layers)}))
            w.write(ex.SerializeToString())


def main(_):
    F = FLAGS
    if not F.output_file or not F.output_file.endswith((".npz", ".tfrecord")):
        raise ValueError(f"--output_file must end with .npz or .tfrecord, got {F.output_file!r}")
    if not F.input_file:
        raise ValueError("--input_file is required")
    texts = read_texts(F.input_file)
    layers = run_common.int_list(F, "layers")
    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    tokenizer = run_common.tokenizer(F)
    config = run_common.model_config(F)
    run_common.start_run(F, paths["output_dir"], "extract_features", "features", config, tokenizer, False,
                         work_dirs=[paths["model_dir"]])
    spec = FeatureRun(texts, tokenizer, config, F.max_seq_length, layers, F.pooling,
                      F.predict_batch_size or F.eval_batch_size, F.output_file)
    plan = runner.Plan(output_dir=paths["output_dir"], model_dir=paths["model_dir"], do_predict=True)
    run_common.run_task(F, spec, plan, config, strategy)


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(run_common.main_wrapper(main))
