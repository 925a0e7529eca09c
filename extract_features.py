r"""Per-token and pooled vectors of chosen layers for raw text, from a pretrained or fine-tuned XLNet.

    python extract_features.py --input_file=texts.txt --output_file=features.npz --spiece_model_file=spiece.model \
      --model_config_path=xlnet_config.json --init_checkpoint=xlnet_model.ckpt --output_dir=OUT \
      --layers=-1,-2 --pooling=mean --max_seq_length=128

``--input_file``: UTF-8, one text per line; ``A ||| B`` gives a pair (the classifier's layout: A <sep> B <sep>
<cls>, left-padded). Empty or whitespace-only lines are skipped (the run logs how many) and ``line_index`` maps
each output row back to its input line. ``--long_doc_mode=memory`` (single texts): a text of any length is cut
into windows of max_seq_length (``tasks.classification.features.build_windows``) that run left to right with the
previous windows' hidden states as memory (``--mem_len``); ``tokens`` then cover the whole text,
[n, W * max_seq_length, layers, d] with W the most windows of a text (each text right-aligned, padding first), and
``pooled`` is the mean over all of a text's real tokens or its final ``<cls>``. A fine-tuned run's checkpoint in ``--model_dir`` (default
OUTPUT_DIR/model) takes precedence over ``--init_checkpoint``. ``--output_file``:
* ``.npz``: ``pooled`` [n, layers, d], ``tokens`` [n, max_seq_length, layers, d] (zeros at padding), ``input_ids``,
  ``padding_mask`` [n, max_seq_length], ``layers`` (the hidden-state indices: 0 = embeddings) and ``line_index``
  [n] (the 0-based input line of each row);
* ``.tfrecord``: one record per text with ``pooled`` and ``tokens`` (float lists of the real tokens only, row
  after row), ``input_ids`` (real tokens), ``layers`` and ``line_index``.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np

import run_common
import run_flags
import run_main
from xlnet_tf.tasks import runner
from xlnet_tf.tasks.classification import features as cls_data
from xlnet_tf.tasks.errors import DataError
from xlnet_tf.fileutil import atomic_path, atomic_write


def define_flags(fv) -> None:
    d = run_flags.Definer(fv, "Features")
    d.string("input_file", None, "Texts, one per line (A ||| B for a pair); blank lines are skipped and "
             "the output's line_index gives each row's 0-based input line.", input_path=True)
    d.string("output_file", None, "Where the vectors go: .npz or .tfrecord.")
    d.list("layers", ["-1"], "Hidden-state indices (0 = embeddings, -1 = last block).")
    d.enum("pooling", "mean", ["mean", "last"], "Pooled vector: mean over real tokens, or the last (CLS).")
    run_flags.define_long_doc_flags(fv, "text", "single texts: windows of max_seq_length run left to right with the "
                                        "previous windows' hidden states as memory, each read whole", max_segments=False)
    run_flags.define_common_flags(fv, default_seq_len=128, default_lr=0.0)


log = logging.getLogger("extract_features")
_UNDECODED = re.compile("[\udc80-\udcff]")  # the bytes that are not UTF-8, as surrogateescape keeps them


def read_texts(path):
    """([(text_a, text_b or None)], [0-based line of each]): one per non-blank line; logs the blank lines
    skipped. A line that is not UTF-8 is refused naming the file and line (as the classifier's readers); NUL
    bytes (which the tokenizer reads as <unk>) are said once, with the first line holding one."""
    out, lines, blank, nul = [], [], 0, []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if _UNDECODED.search(line):
                try:
                    line.encode("utf-8", "surrogateescape").decode("utf-8")
                except UnicodeDecodeError as e:  # the classifier readers' words (tasks/classification/reader.py)
                    raise DataError(path, n, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if "\x00" in line:
                nul.append(n)
            if not line.strip():
                blank += 1
                continue
            lines.append(n - 1)
            a, sep, b = line.partition(" ||| ")
            if not a.strip() or (sep and not b.strip()):
                raise ValueError(f"{path}:{n}: expected 'text' or 'text A ||| text B', got {line[:80]!r}")
            out.append((a, b if sep else None))
    if not out:
        raise ValueError(f"{path}: no texts (expected one per line)")
    if blank:
        log.info("%s: %d blank line(s) skipped; %d texts (line_index in the output maps rows to lines)", path,
                 blank, len(out))
    if nul:
        log.warning("%s, line %d: a NUL byte (\\x00), which the tokenizer reads as <unk>%s", path, nul[0],
                    f" (and {len(nul) - 1} more line(s) with one)" if len(nul) > 1 else "")
    return out, lines


class FeatureRun(runner.TaskSpec):
    """Feature extraction for the runner: ``predict`` writes the vectors of ``texts``."""
    name, main_metric = "features", "none"

    def __init__(self, texts, options: runner.TaskOptions, layers=(-1,), pooling="mean", output_file="",
                 memory=False, line_index=None):
        """``texts``: [(a, b or None)]; ``memory``: each text in windows with memory (as many as it needs);
        vectors are computed at ``options.predict_batch_size``."""
        super().__init__(options)
        self.texts = texts
        self.line_index = list(range(len(texts))) if line_index is None else list(line_index)
        self.memory = memory
        if memory and any(b for _, b in texts):
            raise ValueError("--long_doc_mode=memory: one text per line (no ' ||| ' pairs)")
        self.layers, self.pooling, self.output_file = layers, pooling, output_file

    def head_parts(self):
        from xlnet_tf.heads.features import FeatureHead

        return FeatureHead, dict(n_layer=self.options.config.n_layer, layers=self.layers, pooling=self.pooling)

    def feature_spec(self):
        return cls_data.feature_spec(self.options.max_seq_length)

    def predict(self, model, output_dir):
        import tensorflow as tf

        from xlnet_tf.training import predict

        if self.memory:
            feats = cls_data.encode_documents(self.options.tokenizer, [a for a, _ in self.texts], self.options.max_seq_length)
            pooled, tokens = document_vectors(model, feats, self.options.predict_batch_size)
            flat = {k: feats[k].reshape(len(tokens), -1) for k in ("input_ids", "padding_mask")}
            write_vectors(self.output_file, pooled, tokens, flat["input_ids"], flat["padding_mask"],
                          np.asarray(model.head.layers, np.int32), self.line_index)
            return self.output_file
        feats = cls_data.encode_texts(self.options.tokenizer, [a for a, _ in self.texts],
                                      [b or "" for _, b in self.texts], self.options.max_seq_length)
        ds = tf.data.Dataset.from_tensor_slices(feats).batch(self.options.predict_batch_size)
        out = predict(model, ds, self.finetuner.strategy,
                      output_fn=lambda features, outputs: {k: outputs[k] for k in ("tokens", "pooled")})
        head = model.head
        write_vectors(self.output_file, out["pooled"], out["tokens"], feats["input_ids"], feats["padding_mask"],
                      np.asarray(head.layers, np.int32), self.line_index)
        return self.output_file


def document_vectors(model, windows, batch_size):
    """Right-aligned windows [n, W, L] (``encode_documents``) -> (pooled [n, k, d], tokens [n, W*L, k, d]) of the
    model's ``FeatureHead``: each batch's windows run left to right with the memory of the earlier ones
    (``TaskModel.empty_memory`` and ``window_step``, as ``TaskModel.document_memory``), the head reads each
    window and pools the tokens of all of them (``FeatureHead.pool``).
    """
    import tensorflow as tf

    head = model.head

    @tf.function(autograph=False)
    def window(ids, seg, mask, mems, mem_mask):
        out, mems, mem_mask = model.window_step(ids, seg, mask, mems, mem_mask, output_hidden_states=True)
        return head(out, {"padding_mask": mask})["tokens"], mems, mem_mask

    n, w, L = windows["input_ids"].shape
    pooled, tokens = [], []
    for start in range(0, n, batch_size):
        part = {k: v[start:start + batch_size] for k, v in windows.items()}
        s = int(part["num_segments"].max())
        b = len(part["num_segments"])
        mems, mem_mask = model.empty_memory(b)
        out = []
        for i in range(w - s, w):
            t, mems, mem_mask = window(*(tf.constant(part[k][:, i]) for k in ("input_ids", "segment_ids",
                                                                               "padding_mask")), mems, mem_mask)
            out.append(t.numpy())
        t = np.concatenate([np.zeros((b, (w - s) * L) + out[0].shape[2:], np.float32)] + out, axis=1)
        mask = part["padding_mask"].reshape(b, -1).astype(np.float32)[:, :, None, None]
        pooled.append(head.pool(tf.constant(t), tf.constant(mask)).numpy())
        tokens.append(t)
    return np.concatenate(pooled), np.concatenate(tokens)


def write_vectors(path, pooled, tokens, input_ids, padding_mask, layers, line_index):
    import tensorflow as tf

    if path.endswith(".npz"):
        with atomic_write(path, "wb") as f:
            np.savez(f, pooled=pooled, tokens=tokens, input_ids=input_ids, padding_mask=padding_mask, layers=layers,
                     line_index=np.asarray(line_index, np.int64))
        return
    floats = lambda x: tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(x)))  # noqa: E731
    ints = lambda x: tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(x)))  # noqa: E731
    with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as w:
        for p, t, ids, m, n in zip(pooled, tokens, input_ids, padding_mask, line_index):
            real = m.astype(bool)
            ex = tf.train.Example(features=tf.train.Features(feature={
                "pooled": floats(p), "tokens": floats(t[real]), "input_ids": ints(ids[real]),
                "layers": ints(layers), "line_index": ints(n)}))
            w.write(ex.SerializeToString())


def job(F):
    if not F.output_file or not F.output_file.endswith((".npz", ".tfrecord")):
        raise ValueError(f"--output_file must end with .npz or .tfrecord, got {F.output_file!r}")
    if os.path.isdir(F.output_file):  # (an existing file of that name is replaced, as any output file is)
        raise ValueError(f"--output_file={F.output_file}: is a directory; pass the path of a file to write")
    if not F.input_file:
        raise ValueError("--input_file is required")
    texts, line_index = read_texts(F.input_file)
    layers = run_common.int_list(F, "layers")
    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    tokenizer = run_common.tokenizer(F)
    memory, mem_len, _ = run_common.long_doc_options(F)
    run_common.check_text_room(F, False, memory)
    config = run_common.model_config(F, mem_len=mem_len) if memory else run_common.model_config(F)
    spec = FeatureRun(texts, run_common.task_options(F, tokenizer, config, paths["cache_dir"], {}), layers=layers,
                      pooling=F.pooling, output_file=F.output_file, memory=memory, line_index=line_index)
    run_common.start_run(F, paths["output_dir"], "extract_features", "features", config, tokenizer, False,
                         work_dirs=[paths["model_dir"]], memory={"head": spec.head_size()})
    plan = runner.Plan(output_dir=paths["output_dir"], model_dir=paths["model_dir"], do_predict=True,
                       export_huggingface=F.export_huggingface)  # (refused: HuggingFace has no features head)
    run_common.run_task(F, spec, plan, config, strategy)


def main(argv=None) -> run_main.Exit:
    return run_main.main(argv, define_flags, job, __doc__)


if __name__ == "__main__":
    run_main.exit(main())
