"""Pretraining records: a corpus -> TFRecords of raw sequences, in the order the training loop reads them.

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

Reading the records into batches with targets and permutations: ``data/pretrain_sampling.py``.
"""

from __future__ import annotations

import array
import dataclasses
import json
import os
import unicodedata
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from xlnet_tf.data import tfrecord_io
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
    for path in index["files"]:
        problem = tfrecord_io.damage(path)
        if problem:
            raise ValueError(f"{path}: damaged pretraining records ({problem}); pass --train_input to rewrite them")
    return list(index["files"])


def _read_index(path: str) -> Optional[dict]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
