"""Pretraining data: corpus -> TFRecords of raw sequences -> tf.data batches with permutation targets.

Writing (``create_pretrain_tfrecords``), as the original ``data_utils.py``:

* Corpus: text files, one sentence/paragraph per line, documents separated by blank lines (a run of blank
  lines counts once; a file end also ends a document). ``use_eod`` appends ``<eod>`` to the last line of each
  document (so, as in the original, it belongs to that sentence); ``use_eop`` appends ``<eop>`` to every other
  line of a document (each line is then a paragraph). Every line gets its own sentence id; A/B cut points are
  the sentence boundaries.
* The id stream is cut into parallel *streams* (``batchify``): stream r is the r-th contiguous chunk of the
  corpus. With ``bi_data`` only ``num_streams / 2`` forward chunks are cut and each is also read reversed.
* Steps: window start ``i = 0, s, 2s, ...`` (``s = reuse_len``, or ``seq_len - reuse_len - 3`` when
  ``reuse_len == 0``). Each stream yields one record per step laid out
  ``reuse(reuse_len) + A + <sep> + B + <sep> + <cls>`` (exactly ``seq_len``, no padding): reuse =
  ``stream[i : i+reuse_len]``; A starts at ``i + reuse_len`` and ends at a sentence boundary; B is the
  continuation (``nsp_label`` 1) or, half of the time or when A has no cut point, a random span of the same
  stream extended to sentence boundaries (``nsp_label`` 0); the longer of A/B is trimmed (A from its right).
  Segment ids: 0 reuse+A+SEP, 1 B+SEP, 2 CLS. ``nsp_label`` is written but unused (as the original).
* ``word_start`` [seq_len]: 1 where a piece begins a word **in the record's reading order**: a piece that
  starts with "▁", a special ``<...>`` piece, or a piece made only of punctuation/symbol characters (the
  original ``_is_start_piece``); also forced to 1 at SEP/CLS and at the first token of reuse, A and B. In a
  reversed stream a piece begins a word when it ENDS a word of the forward text, so spans stay whole words.

Order of the records, which the training loop must keep (memory): files are read in name order, records in
file order, **no shuffling**. Records come step by step; within a step ``num_groups`` groups (one per replica)
of ``num_streams / num_groups`` rows; within a group (bi_data) the forward rows, then the same rows reversed.
Batching the record sequence by ``num_streams / num_groups`` gives per-replica batches in the order
replica 0 (step 0), replica 1 (step 0), ..., replica 0 (step 1), ..., which is how
``strategy.distribute_datasets_from_function`` hands successive batches of one pipeline to the local
replicas; batching by ``num_streams`` gives global batches whose contiguous split by
``experimental_distribute_dataset`` is again one group per replica. Either way row b of a replica's batch at
step t+1 continues row b of its batch at step t, and its memory (``reuse_len`` hidden states of step t's reuse
part) covers exactly the tokens preceding step t+1's first token. A single device: ``num_groups=1``,
``batch_size=num_streams``. Multi-host: write one set of files per host (a part of the corpus each).

Reading (``make_pretrain_dataset``): targets and permutations are sampled in the tf.data map, with
stateless random ops seeded by ``(seed, record index)`` (deterministic, and different at every epoch):

* Targets (``_span_targets``), separately in the reuse part and the rest with goals
  ``num_predict - num_predict*(L-R)//L`` and ``num_predict*(L-R)//L`` (the original's 43/42 of 85): spans of
  n = 1..``max_span`` **words** with p ∝ 1/n, each placed at a random offset inside a context of
  ``n * mask_alpha // mask_beta`` words, contexts following each other left to right; spans are kept while the
  running target count stays <= goal (the span that crosses the goal keeps its words that fit). The original
  counted n in pieces (its word test looked at the wrong index): we count words, the paper's intent. The
  remaining budget is filled with random whole words, shortest first (the original filled with random single
  pieces), so the goal is met exactly unless no word fits. SEP/CLS are never targets.
* Factorisation order (``_block_order``; the mask from it: ``local_perm_mask``): drawn independently in the
  reuse part and in the rest, in blocks of ``perm_size`` (blocks in order, a random order inside each block;
  the original used ONE within-block permutation for all blocks, here each block draws its own). Non-target non-functional tokens get order -1.
  ``perm_mask[i, j] = (self_order[i] <= order[j]) and (j is a target or SEP/CLS)``, self_order = order for
  targets, order + 1 otherwise; the reuse part never sees the rest, the rest sees all of the reuse part.
  So a target's query stream sees the non-targets and the targets/functional tokens earlier in the order (not
  itself); its content stream (perm_mask without the diagonal) also sees itself.

Masked LM (``objective="mlm"``, ``sample_mlm_features``): the same records, BERT's targets instead: 15% of
the pieces (never SEP/CLS) selected, 80% of them masked (the content stream reads ``mask_emb`` there:
``mask_emb_positions``), 10% replaced by a random piece, 10% kept; no ``perm_mask`` (full attention on the
content stream).

Batch features (BUILD.md): ``input_ids``, ``segment_ids`` [L] int32; ``perm_mask`` [L, L] float32
(1 = may NOT attend); ``target_mapping`` [P, L] float32 one-hot rows (zero rows for padding); ``target`` [P]
int32 (the ids at the target positions); ``target_mask`` [P] float32; ``input_q`` [L] float32 (1 = target: its
query stream starts from mask_emb; the content stream always gets the real ids, as the original).
"""

from __future__ import annotations

import array
import dataclasses
import glob
import json
import os
import unicodedata
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from data import tfrecord_io
from xlnet_tf.fileutil import stat_identity, write_json
from xlnet_tf.tokenizer import SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SPIECE_UNDERLINE, XLNetTokenizer

LAYOUT_VERSION = 1  # bump when the record layout changes, so cached files are rebuilt


# ====================================================================================== corpus -> stream
def is_start_piece(piece: str) -> bool:
    """A piece that begins a word: "▁..." , a special ``<...>`` piece, or only punctuation/symbols."""
    if piece.startswith(SPIECE_UNDERLINE) or (len(piece) > 2 and piece[0] == "<" and piece[-1] == ">"):
        return True
    return bool(piece) and all(unicodedata.category(c)[0] in "PS" for c in piece)


def start_piece_table(tokenizer: XLNetTokenizer) -> np.ndarray:
    """[vocab] int8: 1 for ids whose piece begins a word (``is_start_piece``)."""
    return np.array([is_start_piece(tokenizer.sp.IdToPiece(i)) for i in range(tokenizer.vocab_size)], np.int8)


@dataclasses.dataclass
class TokenStream:
    """A corpus as one stream: ids, the sentence id of every token and word starts (forward order)."""
    ids: np.ndarray         # int32 [n]
    sent_ids: np.ndarray    # int32 [n]
    word_start: np.ndarray  # int8 [n]

    def __len__(self) -> int:
        return len(self.ids)


def encode_corpus(paths: Sequence[str], tokenizer: XLNetTokenizer, use_eod: bool = True, use_eop: bool = False,
                  progress: bool = True) -> TokenStream:
    """Text files -> one TokenStream (see the module docstring for documents, <eod> and <eop>)."""
    ids, sents = array.array("i"), array.array("i")
    sid = -1
    total = sum(os.path.getsize(p) for p in paths)
    bar = tfrecord_io.Progress(total, "tokenizing (bytes)", enabled=progress)
    for path in paths:
        in_doc = False
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                bar.update(len(line.encode("utf-8")))
                piece_ids = tokenizer.encode(line) if line.strip() else []
                if not piece_ids:
                    if line.strip():  # text that encodes to nothing: ignore the line
                        continue
                    if in_doc and use_eod:
                        ids.append(tokenizer.eod_id)
                        sents.append(sid)
                    in_doc = False
                    continue
                if in_doc and use_eop:
                    ids.append(tokenizer.eop_id)
                    sents.append(sid)
                sid += 1
                ids.extend(piece_ids)
                sents.extend([sid] * len(piece_ids))
                in_doc = True
        if in_doc and use_eod:
            ids.append(tokenizer.eod_id)
            sents.append(sid)
    bar.close()
    ids_arr = np.frombuffer(ids, np.int32) if len(ids) else np.zeros(0, np.int32)
    sents_arr = np.frombuffer(sents, np.int32) if len(sents) else np.zeros(0, np.int32)
    return TokenStream(ids_arr, sents_arr, start_piece_table(tokenizer)[ids_arr])


def reverse_stream(ids: np.ndarray, sent_ids: np.ndarray, word_start: np.ndarray):
    """The stream read backwards; ``word_start`` of the result marks the pieces that end a forward word."""
    ends = np.concatenate([word_start[1:], np.ones(1, word_start.dtype)])
    return ids[::-1].copy(), sent_ids[::-1].copy(), ends[::-1].copy()


def make_streams(stream: TokenStream, num_streams: int, bi_data: bool, num_groups: int = 1):
    """-> (ids, sent_ids, word_start), each [num_streams, stream_len], rows in batch order (module docstring)."""
    per_group, rem = divmod(num_streams, num_groups)
    if rem or (bi_data and per_group % 2):
        raise ValueError(f"num_streams={num_streams} must split into {num_groups} groups"
                         f"{' of an even size (bi_data)' if bi_data else ''}")
    n_fwd = num_streams // 2 if bi_data else num_streams
    length = len(stream) // n_fwd
    fwd = [a[:n_fwd * length].reshape(n_fwd, length) for a in (stream.ids, stream.sent_ids, stream.word_start)]
    if not bi_data:
        return tuple(fwd)
    half = per_group // 2
    rows = []  # (ids, sents, ws) per output row
    for g in range(num_groups):
        fwd_rows = list(range(g * half, (g + 1) * half))
        rows += [tuple(a[r] for a in fwd) for r in fwd_rows]
        rows += [reverse_stream(*(a[r] for a in fwd)) for r in fwd_rows]
    return tuple(np.stack([r[k] for r in rows]) for k in range(3))


def _trim(a_len: int, b_len: int, tot_len: int):
    """The original's loop 'drop one token from the longer (B on ties) until they fit', in closed form."""
    excess = a_len + b_len - tot_len
    if excess <= 0:
        return a_len, b_len
    if a_len > b_len:
        k = min(excess, a_len - b_len)
        a_len, excess = a_len - k, excess - k
    elif b_len > a_len:
        k = min(excess, b_len - a_len)
        b_len, excess = b_len - k, excess - k
    return a_len - excess // 2, b_len - (excess + 1) // 2


def split_a_and_b(bounds: np.ndarray, data_len: int, begin: int, tot_len: int, rng: np.random.Generator):
    """A/B split starting at ``begin`` (the original ``_split_a_and_b``).

    ``bounds``: sorted sentence-boundary positions of the stream (e where sent[e] != sent[e-1]).
    Returns ``(a_begin, a_end, b_begin, b_end, nsp_label)`` with ``a_len + b_len == tot_len``, or None.
    """
    if begin + tot_len >= data_len:
        return None
    lo = np.searchsorted(bounds, begin + 1)
    hi = np.searchsorted(bounds, begin + tot_len)
    cuts = bounds[lo:hi]
    end_idx = int(bounds[hi]) if hi < len(bounds) else data_len
    if len(cuts) == 0 or rng.random() < 0.5:
        label = 0
        a_end = end_idx if len(cuts) == 0 else int(rng.choice(cuts))
        b_len = max(1, tot_len - (a_end - begin))
        if data_len - 1 - b_len < 0:
            return None
        b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))
        b_end = b_begin + b_len
        k = np.searchsorted(bounds, b_begin, side="right")  # back to the start of b_begin's sentence
        b_begin = int(bounds[k - 1]) if k > 0 else 0
        k = np.searchsorted(bounds, b_end)  # forward to the next boundary, at most data_len - 1
        b_end = min(int(bounds[k]) if k < len(bounds) else data_len, data_len - 1)
    else:
        label = 1
        a_end = int(rng.choice(cuts))
        b_begin, b_end = a_end, end_idx
    a_len, b_len = _trim(a_end - begin, b_end - b_begin, tot_len)
    return begin, begin + a_len, b_begin, b_begin + b_len, label


def pretrain_record_spec(seq_len: int) -> tfrecord_io.FeatureSpec:
    return {"input_ids": ("int64", (seq_len,)), "segment_ids": ("int64", (seq_len,)),
            "word_start": ("int64", (seq_len,)), "nsp_label": ("int64", ()), "stream": ("int64", ())}


def _step_stride(seq_len: int, reuse_len: int) -> int:
    return reuse_len if reuse_len > 0 else seq_len - 3


def sentence_bounds(sent_ids: np.ndarray) -> List[np.ndarray]:
    """Per stream row: the sorted positions e where a new sentence starts (sent[e] != sent[e-1])."""
    return [np.flatnonzero(s[1:] != s[:-1]) + 1 for s in sent_ids]


def iter_records(streams, seq_len: int, reuse_len: int, sep_id: int, cls_id: int, seed: int = 0,
                 first_step: int = 0, num_steps: Optional[int] = None,
                 bounds: Optional[List[np.ndarray]] = None) -> Iterator[Dict[str, np.ndarray]]:
    """Records of steps ``first_step ..`` in batch order (step-major), from ``make_streams`` output.

    Every step is generated from its own rng ``(seed, step)``, so shards can be written independently.
    """
    ids, sents, ws = streams
    n_rows, data_len = ids.shape
    tot_len = seq_len - reuse_len - 3
    if tot_len < 2:
        raise ValueError(f"seq_len - reuse_len must be >= 5, got seq_len={seq_len}, reuse_len={reuse_len}")
    if bounds is None:
        bounds = sentence_bounds(sents)
    stride = _step_stride(seq_len, reuse_len)
    step = first_step
    while (num_steps is None or step < first_step + num_steps) and step * stride + seq_len <= data_len:
        i = step * stride
        rng = np.random.default_rng([seed, step])
        recs = []
        for r in range(n_rows):
            split = split_a_and_b(bounds[r], data_len, i + reuse_len, tot_len, rng)
            if split is None:
                return
            a0, a1, b0, b1, label = split
            one = np.ones(1, np.int64)
            inp = np.concatenate([ids[r, i:i + reuse_len], ids[r, a0:a1], [sep_id], ids[r, b0:b1],
                                  [sep_id, cls_id]]).astype(np.int64)
            word = np.concatenate([ws[r, i:i + reuse_len], ws[r, a0:a1], one, ws[r, b0:b1], one, one])
            word = word.astype(np.int64)
            na, nb = a1 - a0, b1 - b0
            word[[0, reuse_len, reuse_len + na + 1]] = 1  # part starts (reuse, A, B)
            seg = np.concatenate([np.full(reuse_len + na + 1, SEG_ID_A), np.full(nb + 1, SEG_ID_B),
                                  [SEG_ID_CLS]]).astype(np.int64)
            assert len(inp) == seq_len, (len(inp), seq_len)
            recs.append({"input_ids": inp, "segment_ids": seg, "word_start": word, "nsp_label": label,
                         "stream": r})
        yield from recs
        step += 1


def num_steps_for(data_len: int, seq_len: int, reuse_len: int) -> int:
    stride = _step_stride(seq_len, reuse_len)
    return 0 if data_len < seq_len else (data_len - seq_len) // stride + 1


def create_pretrain_tfrecords(input_paths: Sequence[str] | str, output_prefix: str, tokenizer, seq_len: int,
                              reuse_len: int, num_streams: int, bi_data: bool = False, num_groups: int = 1,
                              records_per_shard: int = 16384, use_eod: bool = True, use_eop: bool = False,
                              seed: int = 0, progress: bool = True) -> List[str]:
    """Corpus -> sharded TFRecords ``<output_prefix>-KKKKK-of-NNNNN.tfrecord`` (+ manifests); returns the paths.

    ``tokenizer``: an XLNetTokenizer or a SentencePiece model path. ``num_streams``: records per step (the
    original ``bsz_per_host``); ``num_groups``: replicas that split a step (the original ``num_core_per_host``).
    An index ``<output_prefix>.index.json`` is written last; when it and every shard's manifest match the
    requested settings and sources, the files are reused.
    """
    if isinstance(input_paths, str):
        input_paths = [p for p in input_paths.split(",") if p]
    if isinstance(tokenizer, str):
        tokenizer = XLNetTokenizer(tokenizer)
    spm = tokenizer.spiece_model_file  # by name, size and mtime (the same model may be copied elsewhere)
    meta = {"layout": "pretrain", "version": LAYOUT_VERSION, "sources": [stat_identity(p) for p in input_paths],
            "tokenizer": dict(stat_identity(spm), path=os.path.basename(spm), lower=tokenizer.lower,
                              keep_accents=tokenizer.keep_accents),
            "seq_len": seq_len, "reuse_len": reuse_len, "num_streams": num_streams, "num_groups": num_groups,
            "bi_data": bool(bi_data), "use_eod": use_eod, "use_eop": use_eop, "seed": seed}
    index_path = output_prefix + ".index.json"
    cached = _read_index(index_path)
    if cached and cached["meta"] == json.loads(json.dumps(meta)) and all(
            tfrecord_io.is_valid_cache(p, dict(meta, **s)) for p, s in zip(cached["files"], cached["shards"])):
        return cached["files"]

    stream = encode_corpus(input_paths, tokenizer, use_eod=use_eod, use_eop=use_eop, progress=progress)
    if not np.isin(stream.ids, [tokenizer.eod_id, tokenizer.eop_id], invert=True).any():
        raise ValueError(f"{', '.join(input_paths)}: no text to pretrain on (empty or blank files); expected "
                         f"plain text, one sentence per line, documents separated by blank lines")
    streams = make_streams(stream, num_streams, bi_data, num_groups)
    total_steps = num_steps_for(streams[0].shape[1], seq_len, reuse_len)
    if total_steps == 0:
        raise ValueError(f"corpus too small: {len(stream)} tokens give streams of {streams[0].shape[1]} < "
                         f"seq_len {seq_len}; use fewer streams or more text")
    steps_per_shard = max(1, records_per_shard // num_streams)
    n_shards = -(-total_steps // steps_per_shard)
    files, shards = [], []
    spec = pretrain_record_spec(seq_len)
    bounds = sentence_bounds(streams[1])
    for k in range(n_shards):
        first = k * steps_per_shard
        n = min(steps_per_shard, total_steps - first)
        path = f"{output_prefix}-{k:05d}-of-{n_shards:05d}.tfrecord"
        shard = {"shard": k, "num_shards": n_shards, "first_step": first, "num_steps": n}
        recs = iter_records(streams, seq_len, reuse_len, tokenizer.sep_id, tokenizer.cls_id, seed=seed,
                            first_step=first, num_steps=n, bounds=bounds)
        count = tfrecord_io.write_tfrecords(path, recs, spec, meta=dict(meta, **shard), total=n * num_streams,
                                            desc=f"shard {k + 1}/{n_shards}", progress=progress)
        if count != n * num_streams:  # a failed A/B split ends the data early (as the original)
            raise RuntimeError(f"{path}: wrote {count} records, expected {n * num_streams}")
        files.append(path)
        shards.append(shard)
    write_json(index_path, {"meta": meta, "files": files, "shards": shards, "num_tokens": len(stream),
                            "steps": total_steps}, newline=False, indent=1)
    return files


def pretrain_files(output_prefix: str) -> List[str]:
    """The shard paths recorded in ``<output_prefix>.index.json`` (in reading order)."""
    index = _read_index(output_prefix + ".index.json")
    if not index:
        raise FileNotFoundError(f"no pretraining index at {output_prefix}.index.json")
    return list(index["files"])


def _read_index(path: str) -> Optional[dict]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ====================================================================================== tf side
def _split_goal(num_predict: int, seq_len: int, reuse_len: int):
    rest = num_predict * (seq_len - reuse_len) // seq_len
    return num_predict - rest, rest


def _span_targets(word_start, eligible, goal: int, seeds, mask_alpha, mask_beta, max_span: int,
                  fill: bool = True):
    """bool [m]: whole-word span targets of one part (module docstring), ``goal`` tokens when possible."""
    import tensorflow as tf

    m = int(word_start.shape[0])
    if m == 0 or goal <= 0:
        return tf.zeros([m], tf.bool)
    ws = tf.concat([[True], word_start[1:]], 0)
    wid = tf.cumsum(tf.cast(ws, tf.int32)) - 1                                   # word index of every token
    cnt = tf.math.unsorted_segment_sum(tf.cast(eligible, tf.int32), wid, m)     # eligible tokens per word
    # Spans in word units: length n ~ 1/n, inside a context of n*alpha/beta words, contexts back to back.
    logits = tf.math.log(1.0 / tf.range(1, max_span + 1, dtype=tf.float32))[None]
    n = tf.cast(tf.random.stateless_categorical(logits, m, seeds[0])[0], tf.int32) + 1
    ctx = tf.maximum(tf.cast(tf.floor(tf.cast(n, tf.float32) * (mask_alpha / mask_beta)), tf.int32), n)
    left = tf.cast(tf.floor(tf.random.stateless_uniform([m], seeds[1]) * tf.cast(ctx - n + 1, tf.float32)),
                   tf.int32)
    start = tf.cumsum(ctx, exclusive=True) + left
    ones = tf.ones([m], tf.int32)
    delta = (tf.math.unsorted_segment_sum(ones, tf.minimum(start, m), m + 1)
             - tf.math.unsorted_segment_sum(ones, tf.minimum(start + n, m), m + 1))
    covered = tf.cumsum(delta)[:m] > 0
    keep = covered & (cnt > 0) & (tf.cumsum(tf.where(covered, cnt, 0)) <= goal)
    if not fill:
        return tf.gather(keep, wid) & eligible
    # Fill the remaining budget with random whole words, shortest first.
    rem = goal - tf.reduce_sum(tf.where(keep, cnt, 0))
    cand = tf.logical_not(keep) & (cnt > 0)
    key = tf.where(cand, tf.cast(cnt, tf.float32) + tf.random.stateless_uniform([m], seeds[2]), float(m + 2))
    order = tf.argsort(key, stable=True)
    c_sorted = tf.gather(tf.where(cand, cnt, 0), order)
    take = tf.gather(cand, order) & (tf.cumsum(c_sorted) <= rem)
    fill = tf.scatter_nd(order[:, None], tf.cast(take, tf.int32), [m]) > 0
    return tf.gather(keep | fill, wid) & eligible


def _block_order(m: int, perm_size: int, seed):
    """int32 [m]: the rank of every position in a factorisation order drawn in blocks of ``perm_size``."""
    import tensorflow as tf

    block = tf.cast(tf.range(m) // perm_size, tf.float32)
    keys = block + tf.random.stateless_uniform([m], seed)
    return tf.math.invert_permutation(tf.argsort(keys, stable=True))


def local_perm_mask(is_target, is_func, order):
    """float32 [m, m] perm_mask of one part (1 = i may NOT attend j), from a rank ``order`` [m]."""
    import tensorflow as tf

    tgt_or_func = is_target | is_func
    rev = tf.where(tgt_or_func, order, -1)
    self_rev = tf.where(is_target, rev, rev + 1)
    blocked = (self_rev[:, None] <= rev[None, :]) & tgt_or_func[None, :]
    return tf.cast(blocked, tf.float32)


def sample_pretrain_features(input_ids, segment_ids, word_start, seed, *, reuse_len: int, num_predict: int,
                             perm_size: Optional[int] = None, mask_alpha: float = 6, mask_beta: float = 1,
                             max_span: int = 5, sep_id: int = 4, cls_id: int = 3,
                             return_order: bool = False) -> Dict[str, object]:
    """One raw sequence [L] -> the pretraining features (module docstring); ``seed``: int [2] (stateless).

    ``perm_size`` None = each part's full length. ``return_order`` adds ``perm_order`` [L] (rank inside its
    part; -1 for visible tokens) for tests/inspection.
    """
    import tensorflow as tf

    if mask_alpha < mask_beta:
        raise ValueError(f"mask_alpha ({mask_alpha}) must be >= mask_beta ({mask_beta})")
    seq_len = int(input_ids.shape[0])
    input_ids = tf.cast(input_ids, tf.int32)
    is_func = tf.equal(input_ids, sep_id) | tf.equal(input_ids, cls_id)
    after_func = tf.concat([[False], is_func[:-1]], 0)
    ws = tf.cast(word_start, tf.bool) | is_func | after_func
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=8)
    goals = _split_goal(num_predict, seq_len, reuse_len)
    targets, masks, orders = [], [], []
    for part, (lo, hi) in enumerate(((0, reuse_len), (reuse_len, seq_len))):
        m = hi - lo
        if m == 0:
            continue
        tgt = _span_targets(ws[lo:hi], tf.logical_not(is_func[lo:hi]), goals[part], seeds[4 * part:4 * part + 3],
                            mask_alpha, mask_beta, max_span)
        order = _block_order(m, perm_size or m, seeds[4 * part + 3])
        targets.append(tgt)
        masks.append(local_perm_mask(tgt, is_func[lo:hi], order))
        orders.append(tf.where(tgt | is_func[lo:hi], order, -1))
    if len(masks) == 2:
        r, n = reuse_len, seq_len - reuse_len
        perm_mask = tf.concat([tf.concat([masks[0], tf.ones([r, n])], 1),
                               tf.concat([tf.zeros([n, r]), masks[1]], 1)], 0)
    else:
        perm_mask = masks[0]
    is_target = tf.concat(targets, 0)
    idx = tf.cast(tf.where(is_target)[:, 0], tf.int32)
    count = tf.shape(idx)[0]
    out = {
        "input_ids": input_ids,
        "segment_ids": tf.cast(segment_ids, tf.int32),
        "perm_mask": tf.ensure_shape(perm_mask, [seq_len, seq_len]),
        **_target_features(input_ids, idx, count, num_predict, seq_len),
        "input_q": tf.cast(is_target, tf.float32),
    }
    if return_order:
        out["perm_order"] = tf.concat(orders, 0)
    return out


MLM_MASK_PROB = 0.15
NUM_SPECIAL_PIECES = 9  # <unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop>: never drawn as random replacements


def mlm_num_predict(seq_len: int, mask_prob: float = MLM_MASK_PROB) -> int:
    return max(1, int(round(seq_len * mask_prob)))


def _target_features(input_ids, idx, count, num_predict: int, seq_len: int) -> Dict[str, object]:
    """The prediction targets at positions ``idx`` (``count`` of them, in order) padded to ``num_predict``:
    ``target_mapping`` [P, L] one-hot rows (zero rows for padding), ``target`` [P] (the original ids),
    ``target_mask`` [P] (1 = a real target)."""
    import tensorflow as tf

    pad = num_predict - count
    return {
        "target_mapping": tf.ensure_shape(
            tf.concat([tf.one_hot(idx, seq_len, dtype=tf.float32), tf.zeros([pad, seq_len])], 0),
            [num_predict, seq_len]),
        "target": tf.ensure_shape(tf.concat([tf.gather(input_ids, idx), tf.zeros([pad], tf.int32)], 0),
                                  [num_predict]),
        "target_mask": tf.ensure_shape(tf.concat([tf.ones([count]), tf.zeros([pad])], 0), [num_predict]),
    }


def sample_mlm_features(input_ids, segment_ids, seed, *, num_predict: int, vocab_size: int, mask_id: int = 6,
                        sep_id: int = 4, cls_id: int = 3, replace_probs=(0.8, 0.1, 0.1),
                        return_kind: bool = False) -> Dict[str, object]:
    """One raw sequence [L] -> BERT-style masked-LM features (content stream only); ``seed``: int [2].

    Selection: exactly ``min(num_predict, eligible)`` positions drawn uniformly without replacement among the
    non-SEP/CLS tokens (``num_predict`` = 15% of ``seq_len`` by default: ``mlm_num_predict``), single pieces as
    BERT's original recipe. Each selected input is masked (``replace_probs[0]``: id ``mask_id``, and
    ``mask_emb_positions`` [L] float32 is 1 there, so the content stream reads ``mask_emb`` instead of an
    embedding row), replaced by a random ordinary piece (ids >= ``NUM_SPECIAL_PIECES``, ``replace_probs[1]``)
    or kept (the rest). Features: ``input_ids`` (the corrupted input), ``mask_emb_positions``, ``segment_ids``, ``target_mapping`` [P, L] (selected positions in
    order), ``target`` [P] (the original ids), ``target_mask`` [P]. ``return_kind`` adds ``mlm_kind`` [L]
    int32: 0 not selected, 1 masked, 2 random, 3 kept.
    """
    import tensorflow as tf

    seq_len = int(input_ids.shape[0])
    input_ids = tf.cast(input_ids, tf.int32)
    eligible = tf.logical_not(tf.equal(input_ids, sep_id) | tf.equal(input_ids, cls_id))
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
    scores = tf.random.stateless_uniform([seq_len], seeds[0])
    scores = tf.where(eligible, scores, -1.0)
    count = tf.minimum(num_predict, tf.reduce_sum(tf.cast(eligible, tf.int32)))
    idx = tf.sort(tf.math.top_k(scores, k=num_predict).indices[:count])
    selected = tf.scatter_nd(idx[:, None], tf.ones_like(idx, tf.bool), [seq_len])
    u = tf.random.stateless_uniform([seq_len], seeds[1])
    p_mask, p_random = float(replace_probs[0]), float(replace_probs[0] + replace_probs[1])
    random_ids = tf.random.stateless_uniform([seq_len], seeds[2], minval=NUM_SPECIAL_PIECES, maxval=vocab_size,
                                             dtype=tf.int32)
    kind = tf.where(selected, tf.where(u < p_mask, 1, tf.where(u < p_random, 2, 3)), 0)
    corrupted = tf.where(kind == 1, mask_id, tf.where(kind == 2, random_ids, input_ids))
    out = {
        "input_ids": corrupted,
        "mask_emb_positions": tf.cast(kind == 1, tf.float32),
        "segment_ids": tf.cast(segment_ids, tf.int32),
        **_target_features(input_ids, idx, count, num_predict, seq_len),
    }
    if return_kind:
        out["mlm_kind"] = tf.cast(kind, tf.int32)
    return out


def _files_and_meta(files):
    if isinstance(files, str):
        files = sorted(glob.glob(files)) or [files]
    files = list(files)
    for p in files:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"TFRecord file not found: {p}")
    metas = [(tfrecord_io.read_manifest(p) or {}).get("meta") for p in files]
    return files, metas


def make_pretrain_dataset(files, seq_len: int, reuse_len: int, batch_size: int, num_predict: Optional[int] = None,
                          perm_size: Optional[int] = None, mask_alpha: float = 6, mask_beta: float = 1,
                          bi_data: bool = False, seed: int = 0, repeat: bool = True, max_span: int = 5,
                          sep_id: int = 4, cls_id: int = 3, objective: str = "plm", vocab_size: Optional[int] = None,
                          mask_id: int = 6):
    """Pretraining TFRecords -> tf.data of per-replica batches (module docstring), in record order.

    ``files``: shard paths (read in the given order) or a glob (sorted). ``batch_size``: ``num_streams /
    num_groups`` of the files (per-replica batches) or ``num_streams`` (global batches), checked against the
    manifests, so that row b of every batch is the same stream. ``num_predict`` None =
    ``round(seq_len * mask_beta / mask_alpha)``.
    ``objective="mlm"``: BERT-style masked-LM features instead (``sample_mlm_features``; ``num_predict`` None =
    15% of ``seq_len``; ``vocab_size`` and ``mask_id`` required/used; the span and permutation settings unused).
    Batches are never shuffled; ``repeat`` restarts the streams after the last step.
    """
    import tensorflow as tf

    files, metas = _files_and_meta(files)
    for p, meta in zip(files, metas):
        if meta is None:
            continue
        want = {"seq_len": seq_len, "reuse_len": reuse_len, "bi_data": bool(bi_data)}
        got = {k: meta.get(k) for k in want}
        if got != want:
            raise ValueError(f"{p}: written with {got}, asked for {want}")
        group = meta["num_streams"] // meta["num_groups"]
        if meta["num_streams"] % batch_size or batch_size % group:
            raise ValueError(f"{p}: {meta['num_streams']} streams in {meta['num_groups']} group(s) need a batch "
                             f"of {group} (per replica) or a multiple of it dividing {meta['num_streams']}, "
                             f"got {batch_size}")
    if objective not in ("plm", "mlm"):
        raise ValueError(f"objective must be plm or mlm, got {objective!r}")
    if objective == "mlm" and not vocab_size:
        raise ValueError("objective mlm needs vocab_size (random replacements)")
    if num_predict is None:
        num_predict = (mlm_num_predict(seq_len) if objective == "mlm"
                       else int(round(seq_len * mask_beta / mask_alpha)))
    spec = tfrecord_io.parse_spec(pretrain_record_spec(seq_len))
    base_seed = tf.constant(seed, tf.int64)

    def _map(index, serialized):
        ex = tf.io.parse_single_example(serialized, spec)
        if objective == "mlm":
            return sample_mlm_features(ex["input_ids"], ex["segment_ids"], tf.stack([base_seed, index]),
                                       num_predict=num_predict, vocab_size=vocab_size, mask_id=mask_id,
                                       sep_id=sep_id, cls_id=cls_id)
        return sample_pretrain_features(
            ex["input_ids"], ex["segment_ids"], ex["word_start"], tf.stack([base_seed, index]),
            reuse_len=reuse_len, num_predict=num_predict, perm_size=perm_size, mask_alpha=mask_alpha,
            mask_beta=mask_beta, max_span=max_span, sep_id=sep_id, cls_id=cls_id)

    ds = tf.data.TFRecordDataset(files)
    if repeat:
        ds = ds.repeat()
    ds = ds.enumerate().map(_map, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------- the loop's input
def regroup_for_accumulation(ds: tf.data.Dataset, num_replicas: int, grad_accum_steps: int) -> tf.data.Dataset:
    """Reorders per-replica batches so that memory rows stay aligned with gradient accumulation.

    ``data/pretrain.py`` yields, per step s, one batch per replica: ``(s, g0), (s, g1), ...``. One pipeline of
    ``distribute_datasets_from_function`` hands successive elements to the local replicas in turn and the
    loop stacks ``k`` consecutive elements per replica, so each group of ``R*k`` batches is reordered to
    ``(s, g0), (s+1, g0), ..., (s+k-1, g0), (s, g1), ...``: replica r then gets its own streams at k
    consecutive steps, as its memory needs. Identity when ``R == 1`` or ``k == 1``.
    """
    import tensorflow as tf

    r, k = int(num_replicas), int(grad_accum_steps)
    if r == 1 or k == 1:
        return ds

    def reorder(batch):
        def one(x):
            shape = tf.shape(x)
            x = tf.reshape(x, tf.concat([[k, r], shape[1:]], 0))
            x = tf.transpose(x, tf.concat([[1, 0], tf.range(2, tf.rank(x))], 0))
            return tf.reshape(x, shape)

        return tf.nest.map_structure(one, batch)

    return ds.batch(r * k, drop_remainder=True).map(reorder).unbatch()


def make_train_dataset_fn(files, seq_len: int, reuse_len: int, per_replica_batch: int, grad_accum_steps: int = 1,
                          **sampler):
    """``dataset_fn(input_context)`` for ``Trainer``: per-replica batches in stream order (never shuffled).

    ``sampler``: ``num_predict, perm_size, mask_alpha, mask_beta, bi_data, seed, max_span, sep_id, cls_id``
    (and ``objective, vocab_size, mask_id``) of ``make_pretrain_dataset``.
    """
    def dataset_fn(ctx: tf.distribute.InputContext):
        ds = make_pretrain_dataset(files, seq_len, reuse_len, per_replica_batch, repeat=True, **sampler)
        local = max(ctx.num_replicas_in_sync // max(ctx.num_input_pipelines, 1), 1)
        return regroup_for_accumulation(ds, local, grad_accum_steps)

    return dataset_fn
