"""``chunks``: bidirectional attention computed in query chunks (``chunked(core)``: a core of
``attention.rel_attn_core``'s signature).

For bidirectional attention the positional scores BD are [q, klen + qlen] per head, but row i only reads the
klen columns starting at qlen - i (``attention.rel_shift``). Rows [i0, i1) together read the klen + (i1 - i0)
columns starting at qlen - i1, so computing BD chunk by chunk does only klen + chunk columns per row instead of
klen + qlen (at seq 512 with 128-row chunks: 640 instead of 1024), and each chunk's score tensors are a quarter
of the size. Every score is the same dot product (outputs bit-identical at Base 2x512; within 1e-6 where oneDNN
blocks the smaller products differently). Applies when the query length is known when tracing and is at least
two chunks. Chunk c > 0 folds 1000 * c into its attention-dropout salt, so each chunk draws its own mask (the
kernels draw theirs the same way). Measured gain (PERFORMANCE.md "Accelerations", XLNet-Base): 1.05x per
training step at 2x512.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tensorflow as tf

from xlnet_tf.ops import rows

CHUNK = 128  # rows per chunk


def query_chunks(qlen: Optional[int], chunk: int = CHUNK) -> Optional[List[Tuple[int, int]]]:
    """Static (start, end) row ranges of the query chunks, or None when attention runs in one piece."""
    if qlen is None or chunk <= 0 or qlen < 2 * chunk:
        return None
    n = int(round(qlen / chunk))
    bounds = [qlen * c // n for c in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def chunk_salt(salt: int, index: int) -> int:
    return salt if index == 0 else salt + 1000 * index


def chunked(core, chunk: int = CHUNK):
    """``core`` (``attention.rel_attn_core`` or a fused one) as a core of the same signature that runs the queries
    q [b, n, q, h] in chunks of about ``chunk`` rows when the query length allows (else in one piece): each chunk
    reads its own slice of the positional encodings kr [pb, n, r, h] and of ef_diff / blocked [b|1, q, klen]."""

    def attend(q, k, v, kr, r_w, r_r, r_s, seg_embed, ef_diff, blocked, scale, dropatt, seed, salt):
        qlen = q.shape[2]
        spans = query_chunks(qlen, chunk)
        if spans is None:
            return core(q, k, v, kr, r_w, r_r, r_s, seg_embed, ef_diff, blocked, scale, dropatt, seed, salt)
        klen = tf.shape(k)[2]
        outs = []
        for c, (i0, i1) in enumerate(spans):
            # Rows i0..i1-1 read positional encodings qlen - i1 .. qlen - i1 + klen + (i1 - i0) - 1.
            kr_c = tf.slice(kr, tf.stack([0, 0, qlen - i1, 0]), tf.stack([-1, -1, klen + (i1 - i0), -1]))
            outs.append(core(rows(q, 2, i0, i1), k, v, kr_c, r_w, r_r, r_s, seg_embed,
                             None if ef_diff is None else rows(ef_diff, 1, i0, i1),
                             None if blocked is None else rows(blocked, 1, i0, i1), scale, dropatt, seed,
                             chunk_salt(salt, c)))
        return tf.concat(outs, axis=2)

    return attend
