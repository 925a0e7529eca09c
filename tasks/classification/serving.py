"""The classifier's SavedModel: raw text in (tokenised in-graph), the head's outputs and the label name out.

The in-graph layout is ``features.py``'s exactly (the tests compare them on real text): ``A <sep> (B <sep>)
<cls>``, the longer side trimmed first, LEFT-padded, pad segment 4. In memory mode (``memory=True``) a text of
any length becomes the windows of ``features.build_windows`` (``document_windows``), and the model runs them
left to right with its memory (a ``tf.while_loop`` in the graph, ``TaskModel``); a text of one window gives the
one-window features, so the same answer as the truncating export.

The raw-text signatures (``serving_default``, single text or pair, and ``embed``) run a request in length groups
(``xlnet_tf.export.run_in_groups``): each group of texts padded only to its own longest, on the 8-multiple grid,
at most ``max_groups`` calls, answers in the request's order. In memory mode the groups are by window count
(documents of 1 window run apart from those of 10). ``serve_ids`` / ``serve_windows`` take the caller's padding
as given (one call).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import tensorflow as tf

from xlnet_tf.tasks.classification.features import text_budget
from xlnet_tf.export import (SEG_PAD_CLASSIFIER, ServingModule, batch_length, constant_rows, float32_outputs,
                             keep_first, pad_rows, save_atomically, serving_multiple)
from xlnet_tf.lengths import padded_length


def truncate_lengths(len_a: tf.Tensor, len_b: tf.Tensor, budget) -> tuple:
    """Closed form of the original loop "while too long: pop from the longer of A/B (ties: B)"."""
    len_a = tf.cast(len_a, tf.int32)
    len_b = tf.cast(len_b, tf.int32)
    excess = tf.maximum(len_a + len_b - budget, 0)
    d = tf.minimum(excess, tf.abs(len_a - len_b))
    a_longer = len_a > len_b
    len_a = len_a - tf.where(a_longer, d, 0)
    len_b = len_b - tf.where(a_longer, 0, d)
    e = excess - d
    return len_a - e // 2, len_b - (e + 1) // 2


def classification_features(ids_a: tf.RaggedTensor, ids_b: Optional[tf.RaggedTensor], max_seq_length: int,
                            sep_id: int, cls_id: int, length=None, exact_single_row: bool = False
                            ) -> Dict[str, tf.Tensor]:
    """The classifier layout of tasks/classification/features.py, in-graph, for a batch of tokenised texts,
    padded to ``length`` (default: the batch's longest, rounded up to a multiple of 8: ``batch_length``, a single
    text to its own length with ``exact_single_row``; ``max_seq_length`` gives the TFRecords' fixed layout)."""
    ids_a = tf.cast(ids_a, tf.int32)
    batch = ids_a.nrows(out_type=tf.int32)
    sep = constant_rows(batch, sep_id)
    cls = constant_rows(batch, cls_id)

    def dense(parts, segs):
        tokens, segments = tf.concat(parts, axis=1), tf.concat(segs, axis=1)
        return {"tokens": tokens, "segments": segments}

    def padded(rows, length):
        return {"input_ids": pad_rows(rows["tokens"], length, 0, left=True),
                "segment_ids": pad_rows(rows["segments"], length, SEG_PAD_CLASSIFIER, left=True),
                "padding_mask": pad_rows(tf.ones_like(rows["tokens"]), length, 0, left=True)}

    a = keep_first(ids_a, tf.fill([batch], text_budget(max_seq_length, pair=False)))
    single = dense([a, sep, cls], [a * 0, sep * 0, cls * 0 + 2])
    if ids_b is None:
        return padded(single, batch_length(single["tokens"], max_seq_length, exact_single_row=exact_single_row)
                      if length is None else length)
    ids_b = tf.cast(ids_b, tf.int32)
    la, lb = truncate_lengths(ids_a.row_lengths(), ids_b.row_lengths(), text_budget(max_seq_length, pair=True))
    a, b = keep_first(ids_a, la), keep_first(ids_b, lb)
    pair = dense([a, sep, b, sep, cls], [a * 0, sep * 0, b * 0 + 1, sep * 0 + 1, cls * 0 + 2])
    # As the original (and tasks/classification/features.py): an empty B gives the single-text layout.
    has_b = ids_b.row_lengths() > 0
    if length is None:
        rows = tf.where(has_b, pair["tokens"].row_lengths(), single["tokens"].row_lengths())
        length = padded_length(tf.reduce_max(rows), max_seq_length, serving_multiple(batch, exact_single_row))
    single, pair = padded(single, length), padded(pair, length)
    return {k: tf.where(has_b[:, None], pair[k], single[k]) for k in pair}


def document_windows(ids_a: tf.RaggedTensor, max_seq_length: int, sep_id: int, cls_id: int,
                     max_segments: Optional[int] = None) -> Dict[str, tf.Tensor]:
    """``features.encode_documents`` in-graph: tokenised documents -> windows [b, S, L], right-aligned to the
    batch's longest, and ``num_segments`` [b]."""
    L = int(max_seq_length)
    ids = tf.cast(ids_a, tf.int32)
    batch = ids.nrows(out_type=tf.int32)
    if max_segments:
        ids = keep_first(ids, tf.fill([batch], text_budget(L, pair=False, max_segments=max_segments)))
    sep, cls = constant_rows(batch, sep_id), constant_rows(batch, cls_id)
    tokens = tf.concat([ids, sep, cls], axis=1)
    segments = tf.concat([ids * 0, sep * 0, cls * 0 + 2], axis=1)
    n = tf.cast(tokens.row_lengths(), tf.int32)
    num = (n + L - 1) // L
    total = tf.maximum(tf.reduce_max(num), 1) * L
    shape = tf.stack([batch, -1, L])
    return {"input_ids": tf.reshape(pad_rows(tokens, total, 0, left=True), shape),
            "segment_ids": tf.reshape(pad_rows(segments, total, SEG_PAD_CLASSIFIER, left=True), shape),
            "padding_mask": tf.reshape(pad_rows(tf.ones_like(tokens), total, 0, left=True), shape),
            "num_segments": num}


class ClassifierServing(ServingModule):
    """Serving module for a fine-tuned classifier/regressor (TaskModel with a ClassificationHead).

    ``memory``: long documents in windows with memory (single text; ``max_segments`` caps the windows read,
    None reads the whole text)."""

    def __init__(self, model, tokenizer, max_seq_length: int, label_names: Optional[Sequence[str]] = None,
                 memory: bool = False, max_segments: Optional[int] = None):
        super().__init__()
        self.memory, self.max_segments = bool(memory), max_segments
        self.model = model
        self.tokenizer = tokenizer.tf_tokenizer() if hasattr(tokenizer, "tf_tokenizer") else tokenizer
        self.max_seq_length = int(max_seq_length)
        self.sep_id, self.cls_id = int(tokenizer.sep_id), int(tokenizer.cls_id)
        self.regression = bool(model.head.regression)
        # without names a class is named by its index ("0", "1", ...)
        names = list(label_names or []) or [str(i) for i in range(max(int(model.head.num_labels), 1))]
        self.label_names = tf.constant(names, tf.string)

    # Every block's projected positional tables, computed once at export for |d| <= max_seq_length and saved with
    # the export (``XLNetModel.position_tables``): a request reads its rows instead of multiplying them in every
    # block (two matmuls per block). One-window exports only (memory mode's calls have a memory). False: off.
    precomputed_positions = True
    # A request of one text runs at its own length, not rounded up to a multiple of 8 (``batch_length``): batch 1
    # computes no padded token. False: rounded, as before.
    exact_single_row = True

    def _build_position_tables(self):
        """The tables as variables of this module (saved once in the export's variables), before any trace."""
        self._position_tables = None
        if self.precomputed_positions and not self.memory:
            self._position_tables = [tuple(tf.Variable(t, trainable=False, name=f"position_table_{i}_{k}")
                                           for k, t in zip(("sin", "cos"), pair))
                                     for i, pair in enumerate(self.model.backbone.position_tables(self.max_seq_length))]

    def _positions(self, features):
        """This call's ``positions`` from the export's tables (None without them: the backbone computes them)."""
        if getattr(self, "_position_tables", None) is None or "num_segments" in features:
            return None
        T = tf.shape(features["input_ids"])[-1]
        return self.model.backbone.positions_from_tables(self._position_tables, T, T)

    def _outputs(self, features):
        out = self.model(features, training=False, positions=self._positions(features))
        out = self.model.head.serving_outputs(float32_outputs(out))
        if not self.regression:
            out = dict(out)
            out["label_name"] = tf.gather(self.label_names, out["label"])
        return out

    def ids_fn(self):
        if self.memory:
            spec = tf.TensorSpec([None, None, self.max_seq_length], tf.int32)

            @tf.function(input_signature=[spec, spec, spec, tf.TensorSpec([None], tf.int32)], autograph=False)
            def serve_windows(input_ids, segment_ids, padding_mask, num_segments):
                return self._outputs({"input_ids": input_ids, "segment_ids": segment_ids,
                                      "padding_mask": padding_mask, "num_segments": num_segments})

            return serve_windows
        spec = tf.TensorSpec([None, None], tf.int32)  # [batch, any length <= max_seq_length], left-padded

        @tf.function(input_signature=[spec, spec, spec], autograph=False)
        def serve_ids(input_ids, segment_ids, padding_mask):
            return self._outputs({"input_ids": input_ids, "segment_ids": segment_ids,
                                  "padding_mask": padding_mask})

        return serve_ids

    def in_length_groups(self, run, features):
        """``run(features)`` in length groups: texts by padded length, documents (memory mode) by window count."""
        if self.memory:
            return self.in_groups(run, features, features["num_segments"], multiple=1,
                                  unit_tokens=self.max_seq_length)
        return self.in_groups(run, features, tf.reduce_sum(features["padding_mask"], 1), max_len=self.max_seq_length)

    def features(self, text_a, text_b=None):
        """Raw text -> the model's features (one window, or the windows of memory mode)."""
        if self.memory:
            return document_windows(self.tokenizer.tokenize(text_a), self.max_seq_length, self.sep_id, self.cls_id,
                                    self.max_segments)
        ids_b = None if text_b is None else self.tokenizer.tokenize(text_b)
        return classification_features(self.tokenizer.tokenize(text_a), ids_b, self.max_seq_length, self.sep_id,
                                       self.cls_id, exact_single_row=self.exact_single_row)

    def embed_fn(self, pair: bool):
        """``embed``: the last layer's hidden state of the document's final ``<cls>`` [b, d_model] (with the memory
        of the earlier windows in memory mode), the vector the head reads."""
        def embedding(features):
            out, _ = self.model.encode(features, training=False, positions=self._positions(features))
            return {"embedding": tf.cast(out["sequence_output"][:, -1], tf.float32)}

        def run(text_a, text_b=None):
            return self.in_length_groups(embedding, self.features(text_a, text_b))

        s = tf.TensorSpec([None], tf.string)
        if pair:
            return tf.function(lambda text_a, text_b: run(text_a, text_b), input_signature=[s, s], autograph=False)
        return tf.function(lambda text_a: run(text_a), input_signature=[s], autograph=False)

    def export(self, export_dir: str, pair: bool = False) -> str:
        """Signatures ``serving_default`` (raw text), ``serve_ids`` (features) and ``embed`` (raw text)."""
        self._build_position_tables()
        self.serve_text, self.serve_ids, self.embed = self.text_fn(pair), self.ids_fn(), self.embed_fn(pair)
        return save_atomically(self, export_dir, {"serving_default": self.serve_text, "serve_ids": self.serve_ids,
                                                  "embed": self.embed})

    def text_fn(self, pair: bool):
        if pair and self.memory:
            raise ValueError("memory mode serves single-text classifiers (no text_b)")

        def run(text_a, text_b=None):
            return self.in_length_groups(self._outputs, self.features(text_a, text_b))

        s = tf.TensorSpec([None], tf.string)
        if pair:
            return tf.function(lambda text_a, text_b: run(text_a, text_b), input_signature=[s, s], autograph=False)
        return tf.function(lambda text_a: run(text_a), input_signature=[s], autograph=False)
