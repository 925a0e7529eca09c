"""Pay for the text, not for max_seq_length: batches padded to their own longest example.

The classifier and RACE records are LEFT-padded to ``max_seq_length`` (``<cls>`` stays last, as the original),
SQuAD's right-padded (``P <sep> Q <sep> <cls> PAD``); padding is masked and positions are relative, so dropping leading all-padding columns changes no real token's
output beyond float noise (tests/test_lengths.py). Lengths are rounded up to a multiple (``--length_multiple``;
the rule and its default by device and model size: ``xlnet_tf/lengths.py``).

* ``trim_batch``: a batch [b, (choices,) L] -> [b, (choices,) T], T = the padded length of its longest example
  (the padding side's columns dropped);
* ``length_buckets``: training examples grouped by that padded length (``group_by_window``: a batch fills from
  one length group at a time, the input order stays shuffled), each batch then trimmed;
* the rounding is ``xlnet_tf.lengths.padded_length`` (the serving graph pads each call's batch the same way).
"""

from __future__ import annotations

import logging
from typing import Dict

from xlnet_tf.lengths import default_multiple as rule
from xlnet_tf.lengths import padded_length

SEQUENCE_KEYS = ("input_ids", "segment_ids", "padding_mask", "p_mask")  # the [.., L] features


def report_truncation(what: str, truncated: int, total: int, max_seq_length: int) -> None:
    """Logs how many of ``what``'s examples lost pieces to ``--max_seq_length`` (when features are written): a
    warning when most did (a length that almost certainly was not meant), else a note."""
    if not truncated:
        return
    log = logging.getLogger("features")
    level = logging.WARNING if 2 * truncated > total else logging.INFO
    log.log(level, "%s: --max_seq_length=%d truncates %d of %d examples (each keeps its first pieces)%s", what,
            max_seq_length, truncated, total, "; is the length meant?" if level == logging.WARNING else "")


def real_lengths(batch: Dict) -> "tf.Tensor":
    """Real pieces of each example (its longest choice for RACE) [b]."""
    import tensorflow as tf

    counts = tf.reduce_sum(tf.cast(batch["padding_mask"], tf.int32), axis=-1)
    return tf.reduce_max(tf.reshape(counts, [tf.shape(counts)[0], -1]), axis=1)


def default_multiple(config) -> int:
    """The length multiple of a run of ``config``'s model on this machine (``xlnet_tf.lengths.default_multiple``:
    by device and model size)."""
    import tensorflow as tf

    return rule(config, bool(tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU")))


def trim_batch(batch: Dict, left: bool, multiple: int) -> Dict:
    """Drops the columns no example of the batch needs, to the padded length: the leading ones of left-padded
    records (classification, RACE), the trailing ones of right-padded records (SQuAD: its positions count from
    the left, so they stay valid)."""
    import tensorflow as tf

    keep = padded_length(tf.reduce_max(real_lengths(batch)), batch["input_ids"].shape[-1], multiple)
    return {k: (v[..., -keep:] if left else v[..., :keep]) if k in SEQUENCE_KEYS else v for k, v in batch.items()}


def length_buckets(examples, batch_size: int, max_len: int, multiple: int, drop_remainder: bool = True,
                   left: bool = True):
    """Unbatched training examples (shuffled, repeated) -> batches of one padded length each, trimmed."""
    import tensorflow as tf

    def key(ex):
        n = tf.reduce_max(tf.reduce_sum(tf.cast(ex["padding_mask"], tf.int32), axis=-1))
        return tf.cast(padded_length(n, max_len, multiple) // multiple, tf.int64)

    ds = examples.group_by_window(
        key_func=tf.autograph.experimental.do_not_convert(key), window_size=batch_size,
        reduce_func=tf.autograph.experimental.do_not_convert(
            lambda _, w: w.batch(batch_size, drop_remainder=drop_remainder)))
    return ds.map(tf.autograph.experimental.do_not_convert(lambda b: trim_batch(b, left, multiple)),
                  num_parallel_calls=tf.data.AUTOTUNE)
