"""SavedModel export of a RACE (multiple-choice) model: raw article, question and 4 options in, answer out.

Signatures:
* ``serving_default(article: string [batch], question: string [batch], options: string [batch, 4])``
  -> ``choice`` int32 [batch] (0-3 = A-D), ``probabilities`` float32 [batch, 4].
* ``serve_ids(input_ids, segment_ids, padding_mask: int32 [batch, 4, T])``, T <= max_seq_length, left-padded
  -> the same outputs.

The in-graph layout is exactly ``tasks/race/features.py``'s ``encode_race`` (tests compare them on real dev questions):
``qa = question.replace("_", option)`` if ``"_"`` is in the question (every blank filled) else
``question + " " + option``; qa keeps its LAST ``max_qa_length`` pieces, the article its FIRST
``max_seq_length - 3 - len(qa)``; ``article <sep> qa <sep> <cls>`` LEFT-padded with id 0 to the batch's longest option
(rounded up to a multiple of 8), segments 0 / 1 / 2, padding segment 4. Memory mode (``memory=True``): the same signatures, the article read whole in windows
(``race_windows``, in-graph twin of ``encode_race(..., windows=True)``) through the model's window loop;
``serve_ids`` then takes windows [batch, 4, W, max_seq_length] and ``num_segments`` [batch]. Load in a fresh
process with ``import tensorflow_text`` (registers the SentencePiece ops).

``serving_default`` runs a request in length groups (``xlnet_tf.export.run_in_groups``): questions by their
longest option (memory mode: by window count), each group padded to its own longest, answers in the request's
order; ``serve_ids`` takes the caller's padding as given.
"""

from __future__ import annotations

from typing import Dict, Optional

import tensorflow as tf

from xlnet_tf.export import (SEG_PAD_CLASSIFIER, ServingModule, batch_length, constant_rows, float32_outputs,
                             keep_first, keep_last, pad_rows)
from xlnet_tf.tasks.race.features import check_lengths
from xlnet_tf.tasks.race.reader import NUM_CHOICES


def fill_blanks(question: tf.Tensor, option: tf.Tensor) -> tf.Tensor:
    """Element-wise ``q.replace("_", o) if "_" in q else q + " " + o`` on equal-shape string tensors.

    "_" is one byte that never occurs inside a multi-byte UTF-8 character, so splitting the bytes on it is the
    same as splitting the text (``tf.strings.split`` with an explicit ``sep`` keeps empty parts, as
    ``str.split``). Neither string is ever interpreted as a pattern or a rewrite template.
    """
    question = tf.convert_to_tensor(question, tf.string)
    option = tf.convert_to_tensor(option, tf.string)
    shape = tf.shape(question)
    q, o = tf.reshape(question, [-1]), tf.reshape(option, [-1])
    parts = tf.strings.split(q, sep="_")                        # ragged [n, (parts)]
    rows = parts.value_rowids()
    last = tf.equal(tf.range(tf.size(parts.flat_values, out_type=tf.int64)),
                    tf.gather(parts.row_limits(), rows) - 1)
    # every part but the last is followed by the option
    glue = tf.where(last, tf.zeros_like(parts.flat_values), tf.gather(o, rows))
    joined = tf.strings.reduce_join(parts.with_flat_values(tf.strings.join([parts.flat_values, glue])), axis=1)
    has_blank = parts.row_lengths() > 1
    out = tf.where(has_blank, joined, tf.strings.join([q, o], separator=" "))
    return tf.reshape(out, shape)


def race_features(article_ids: tf.RaggedTensor, qa_ids: tf.RaggedTensor, max_seq_length: int,
                  max_qa_length: int, sep_id: int, cls_id: int,
                  num_choices: int = NUM_CHOICES) -> Dict[str, tf.Tensor]:
    """In-graph ``tasks.race.features.encode_choices``: article ids [batch, (n)], qa ids [batch * num_choices, (m)]
    (choices of one question adjacent) -> int32 ``input_ids``/``segment_ids``/``padding_mask``
    [batch, num_choices, T]: the records' layout, padded to the batch's longest option (T <= max_seq_length,
    a multiple of 8)."""
    check_lengths(max_seq_length, max_qa_length)
    article_ids = tf.cast(article_ids, tf.int32)
    qa_ids = tf.cast(qa_ids, tf.int32)
    rows = qa_ids.nrows(out_type=tf.int32)
    qa = keep_last(qa_ids, tf.fill([rows], max_qa_length))
    ctx = tf.gather(article_ids, tf.range(rows) // num_choices)   # each article once per choice
    ctx = keep_first(ctx, max_seq_length - 3 - qa.row_lengths())
    sep, cls = constant_rows(rows, sep_id), constant_rows(rows, cls_id)
    tokens = tf.concat([ctx, sep, qa, sep, cls], axis=1)
    segments = tf.concat([ctx * 0, sep * 0, qa * 0 + 1, sep * 0 + 1, cls * 0 + 2], axis=1)
    length = batch_length(tokens, max_seq_length)  # the batch's longest option, rounded up (data/lengths.py)
    feats = {"input_ids": pad_rows(tokens, length, 0, left=True),
             "segment_ids": pad_rows(segments, length, SEG_PAD_CLASSIFIER, left=True),
             "padding_mask": pad_rows(tf.ones_like(tokens), length, 0, left=True)}
    return {k: tf.reshape(v, [-1, num_choices, length]) for k, v in feats.items()}


def race_windows(article_ids: tf.RaggedTensor, qa_ids: tf.RaggedTensor, max_seq_length: int, max_qa_length: int,
                 sep_id: int, cls_id: int, num_choices: int = NUM_CHOICES,
                 max_segments: Optional[int] = None) -> Dict[str, tf.Tensor]:
    """In-graph ``tasks.race.features.encode_choice_windows``: -> int32 windows [batch, num_choices, W, L]
    right-aligned to the batch's most windows, and ``num_segments`` [batch] (the most of each question's options)."""
    L = int(max_seq_length)
    check_lengths(L, max_qa_length)
    article_ids, qa_ids = tf.cast(article_ids, tf.int32), tf.cast(qa_ids, tf.int32)
    rows = qa_ids.nrows(out_type=tf.int32)
    qa = keep_last(qa_ids, tf.fill([rows], max_qa_length))
    ctx = tf.gather(article_ids, tf.range(rows) // num_choices)
    if max_segments:
        ctx = keep_first(ctx, int(max_segments) * L - 3 - tf.cast(qa.row_lengths(), tf.int32))
    sep, cls = constant_rows(rows, sep_id), constant_rows(rows, cls_id)
    tokens = tf.concat([ctx, sep, qa, sep, cls], axis=1)
    segments = tf.concat([ctx * 0, sep * 0, qa * 0 + 1, sep * 0 + 1, cls * 0 + 2], axis=1)
    num = (tf.cast(tokens.row_lengths(), tf.int32) + L - 1) // L
    total = tf.maximum(tf.reduce_max(num), 1) * L
    shape = tf.stack([-1, num_choices, total // L, L])
    return {"input_ids": tf.reshape(pad_rows(tokens, total, 0, left=True), shape),
            "segment_ids": tf.reshape(pad_rows(segments, total, SEG_PAD_CLASSIFIER, left=True), shape),
            "padding_mask": tf.reshape(pad_rows(tf.ones_like(tokens), total, 0, left=True), shape),
            "num_segments": tf.reduce_max(tf.reshape(num, [-1, num_choices]), axis=1)}


class RaceServing(ServingModule):
    """Serving module for a fine-tuned RACE model (TaskModel with a MultipleChoiceHead).

    ``features`` works without a model (``model=None``): the in-graph layout alone.
    """

    def __init__(self, model, tokenizer, max_seq_length: int, max_qa_length: int, memory: bool = False):
        super().__init__()
        self.memory = bool(memory)
        self.model = model
        self.tokenizer = tokenizer.tf_tokenizer() if hasattr(tokenizer, "tf_tokenizer") else tokenizer
        self.max_seq_length, self.max_qa_length = int(max_seq_length), int(max_qa_length)
        self.sep_id, self.cls_id = int(tokenizer.sep_id), int(tokenizer.cls_id)
        self.num_choices = int(getattr(getattr(model, "head", None), "num_choices", NUM_CHOICES))

    def features(self, article, question, options) -> Dict[str, tf.Tensor]:
        """Raw strings -> the model's features [batch, num_choices, max_seq_length] (also used by the tests)."""
        article = tf.convert_to_tensor(article, tf.string)
        question = tf.convert_to_tensor(question, tf.string)
        options = tf.convert_to_tensor(options, tf.string)
        tf.debugging.assert_equal(tf.shape(options), tf.stack([tf.shape(question)[0], self.num_choices]),
                                  message=f"options must be [batch, {self.num_choices}]")
        questions = tf.repeat(question[:, None], self.num_choices, axis=1)
        qa_text = tf.reshape(fill_blanks(questions, options), [-1])
        if self.memory:
            return race_windows(self.tokenizer.tokenize(article), self.tokenizer.tokenize(qa_text),
                                self.max_seq_length, self.max_qa_length, self.sep_id, self.cls_id, self.num_choices)
        return race_features(self.tokenizer.tokenize(article), self.tokenizer.tokenize(qa_text),
                             self.max_seq_length, self.max_qa_length, self.sep_id, self.cls_id,
                             self.num_choices)

    def _outputs(self, features):
        out = self.model.head.serving_outputs(float32_outputs(self.model(features, training=False)))
        return {"choice": tf.cast(out["choice"], tf.int32),
                "probabilities": tf.cast(out["probabilities"], tf.float32)}

    def text_fn(self):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="article"),
                                      tf.TensorSpec([None], tf.string, name="question"),
                                      tf.TensorSpec([None, self.num_choices], tf.string, name="options")],
                     autograph=False)
        def serve_text(article, question, options):
            feats = self.features(article, question, options)
            if self.memory:
                return self.in_groups(self._outputs, feats, feats["num_segments"], axis=2, multiple=1,
                                      unit_tokens=self.num_choices * self.max_seq_length)
            longest = tf.reduce_max(tf.reduce_sum(feats["padding_mask"], 2), 1)  # a question's longest option
            return self.in_groups(self._outputs, feats, longest, axis=2, max_len=self.max_seq_length,
                                  unit_tokens=self.num_choices)

        return serve_text

    def ids_fn(self):
        if self.memory:
            spec = tf.TensorSpec([None, self.num_choices, None, self.max_seq_length], tf.int32)

            @tf.function(input_signature=[spec, spec, spec, tf.TensorSpec([None], tf.int32)], autograph=False)
            def serve_windows(input_ids, segment_ids, padding_mask, num_segments):
                return self._outputs({"input_ids": input_ids, "segment_ids": segment_ids,
                                      "padding_mask": padding_mask, "num_segments": num_segments})

            return serve_windows
        spec = tf.TensorSpec([None, self.num_choices, None], tf.int32)  # any length <= max_seq_length

        @tf.function(input_signature=[spec, spec, spec], autograph=False)
        def serve_ids(input_ids, segment_ids, padding_mask):
            return self._outputs({"input_ids": input_ids, "segment_ids": segment_ids,
                                  "padding_mask": padding_mask})

        return serve_ids
