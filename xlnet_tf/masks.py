"""The one place where attention masks are built.

Convention (documented once, here and in BUILD.md):

* ``padding_mask`` [b, q]: 1 = real token, 0 = padding (public input polarity).
* ``perm_mask`` [b, q, q]: 1 at [b, i, j] = position i may NOT attend to position j (the original's polarity).
* Heads mask positions out of a softmax with ``mask_logits`` (1 = excluded: SQuAD's ``p_mask``, padding).
* ``mem_padding_mask`` [b, mlen]: 1 = a real memory position, 0 = a padded one (the same polarity as
  ``padding_mask``). Only memory carried over the windows of one long document needs it (its first window is
  left-padded); without it every memory position is visible, as the original.
* Returned masks are boolean **blocked** masks [b, q, mlen + q] (or None = nothing blocked):
  ``query_blocked`` for the query stream (and for the content stream of a plain forward pass) and
  ``content_blocked`` = query_blocked without the diagonal (a position's content may always see itself).

This reproduces the original ``transformer_xl`` mask logic exactly: memory columns are always visible (unless
a ``mem_padding_mask`` hides padded ones),
a padded key is hidden from every query, ``uni`` adds the causal (and ``same_length``) mask, and the content
stream removes the diagonal only.
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf


def causal_blocked(qlen, mlen, same_length: bool) -> tf.Tensor:
    """[q, mlen+q] bool: the ``uni`` mask (key j blocked for query i when j > mlen + i)."""
    i = tf.range(qlen)[:, None]
    j = tf.range(mlen + qlen)[None, :]
    blocked = j > mlen + i
    if same_length:
        # The original adds the strict lower triangle to the FIRST qlen columns, so every query sees the
        # same number of keys.
        blocked = tf.logical_or(blocked, tf.logical_and(j < qlen, j < i))
    return blocked


def attention_masks(qlen, mlen, batch, padding_mask: Optional[tf.Tensor] = None,
                    perm_mask: Optional[tf.Tensor] = None, attn_type: str = "bi",
                    same_length: bool = False, mem_padding_mask: Optional[tf.Tensor] = None
                    ) -> Tuple[Optional[tf.Tensor], Optional[tf.Tensor]]:
    """Returns (query_blocked, content_blocked), each bool [b or 1, q, mlen+q] or None."""
    blocked = None
    if attn_type == "uni":
        blocked = causal_blocked(qlen, mlen, same_length)[None]
    elif attn_type != "bi":
        raise ValueError(f"attn_type must be 'bi' or 'uni', got {attn_type!r}")

    data = None
    if padding_mask is not None:
        data = tf.equal(tf.cast(padding_mask, tf.int32), 0)[:, None, :]  # [b, 1, q]: key j is padding
    if perm_mask is not None:
        perm = tf.not_equal(tf.cast(perm_mask, tf.int32), 0)  # [b, q, q]
        data = perm if data is None else tf.logical_or(data, perm)
    if data is None and mem_padding_mask is not None:
        data = tf.zeros(tf.stack([tf.shape(mem_padding_mask)[0], 1, qlen]), tf.bool)
    if data is not None:
        if mem_padding_mask is not None:  # [b, 1, mlen]: a padded memory position is hidden from every query
            mem_cols = tf.equal(tf.cast(mem_padding_mask, tf.int32), 0)[:, None, :]
            mem_cols = tf.broadcast_to(mem_cols, tf.stack([tf.shape(data)[0], tf.shape(data)[1], mlen]))
            data = tf.concat([mem_cols, data], axis=-1)
        elif mlen is not None and not (isinstance(mlen, int) and mlen == 0):
            mem_cols = tf.zeros(tf.stack([tf.shape(data)[0], tf.shape(data)[1], mlen]), tf.bool)
            data = tf.concat([mem_cols, data], axis=-1)
        blocked = data if blocked is None else tf.logical_or(blocked, data)

    if blocked is None:
        return None, None
    eye = tf.equal(tf.range(qlen)[:, None] + mlen, tf.range(mlen + qlen)[None, :])[None]  # [1, q, k]
    content = tf.logical_and(blocked, tf.logical_not(eye))
    return blocked, content


def segment_diff(segment_ids: tf.Tensor, mlen) -> tf.Tensor:
    """[b, q, mlen+q] bool: True where query and key segments differ (memory counts as segment 0)."""
    seg = tf.cast(segment_ids, tf.int32)
    mem = tf.zeros(tf.stack([tf.shape(seg)[0], mlen]), tf.int32)
    cat = tf.concat([mem, seg], axis=1)
    return tf.not_equal(seg[:, :, None], cat[:, None, :])


def mask_value(dtype) -> float:
    """The additive 'minus infinity' of the original (1e30), limited to what ``dtype`` can hold."""
    dtype = tf.as_dtype(dtype)
    if dtype == tf.float16:
        return -65500.0
    return -1e30


def mask_logits(logits: tf.Tensor, excluded) -> tf.Tensor:
    """The heads' additive mask in the original's form, ``logits * (1 - m) - 1e30 * m`` with m = ``excluded``
    (1 / True = the position may not be chosen), in the logits' dtype."""
    m = tf.cast(excluded, logits.dtype)
    return logits * (1 - m) + mask_value(logits.dtype) * m


def hidden_memory_mask(batch, mem_len: int) -> tf.Tensor:
    """The ``mem_padding_mask`` of a memory that holds nothing yet (every position hidden): int32 [batch, mem_len]."""
    return tf.zeros(tf.stack([batch, mem_len]), tf.int32)


def next_mem_padding_mask(prev: tf.Tensor, padding_mask: tf.Tensor, mem_len: int) -> tf.Tensor:
    """The ``mem_padding_mask`` after a window: the last ``mem_len`` of (memory, window), as the memory itself
    (``XLNetModel._cache_mem`` without ``reuse_len``). int32, 1 = real."""
    cat = tf.concat([tf.cast(prev, tf.int32), tf.cast(padding_mask, tf.int32)], axis=1)
    return cat[:, -mem_len:]
