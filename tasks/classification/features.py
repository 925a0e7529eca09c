"""Classification / regression features, exactly the original XLNet classifier layout.

``A <sep> B <sep> <cls>`` (single sentence: ``A <sep> <cls>``); segment ids A+SEP 0, B+SEP 1, CLS 2. The pair
is truncated by dropping the last token of the longer side (B on ties) until it fits ``max_len - 3``; a single
text keeps its first ``max_len - 2`` tokens. LEFT-padded to ``max_seq_length`` with id 0 (as the original),
segment id 4, ``padding_mask`` 0 (our convention: 1 = real token). As the original, an empty B after
tokenisation gives the single-sentence layout.

Features: ``input_ids``, ``segment_ids``, ``padding_mask`` [L] int; ``label`` int64 (float32 for regression);
``is_real_example`` (0 on the padding examples added by ``pad_to_multiple``).

Long documents (``max_segments``, memory mode; single text only): the document ``A <sep> <cls>`` (A cut to
``max_segments * L - 2`` pieces, its beginning kept as truncation does) is split into consecutive windows of L
from its END, so the last window ends with ``<cls>`` and only the FIRST window is partial, LEFT-padded: its
padded positions lie before every real token, so real tokens keep consecutive relative positions across the
windows, and the padding that enters the memory is hidden by the backbone's ``mem_padding_mask``. A document
that fits one window gives exactly the one-window features above. Stored right-aligned in
[max_segments, L] (leading all-padding windows), with ``num_segments`` = the document's window count.
"""

from __future__ import annotations

import glob
import hashlib
import os
import random
import re
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np

from xlnet_tf.data.lengths import report_truncation
from xlnet_tf.data.tfrecord_io import FeatureSpec, cached_tfrecords, is_valid_cache, read_manifest
from xlnet_tf.data import tfrecord_io
from xlnet_tf.fileutil import stat_identity
from xlnet_tf.tokenizer import SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, part_chars

LAYOUT = "xlnet-classification-v1"  # bump when the feature layout changes: invalidates cached TFRecords
LONG_LAYOUT = "xlnet-classification-windows-v1"
PAD_ID = 0  # the original classifier pads input ids with 0
TRAIN_ORDER_SEED = 12345  # the train split's records are written in this seeded order (write_features)
_DIGIT_COMMA = re.compile(r"[0-9],")


def check_text_room(max_seq_length: int, pair: bool, memory: bool = False, flags: bool = False) -> None:
    """The classifier's length rule, its one home (run_classifier.py's and extract_features.py's flags, the Keras
    ``XLNetClassifier``): max_seq_length must leave a text piece beside the special tokens (A <sep> [B <sep>] <cls>;
    memory mode cuts a text into windows and needs only the two). ``flags``: name it as the command line's flag."""
    need = 2 if memory else 5 if pair else 3
    if max_seq_length < need:
        what = ("memory mode's windows end in <sep> <cls>" if memory else
                "a pair needs A <sep> B <sep> <cls>" if pair else "a text needs its pieces, <sep> and <cls>")
        name = "--max_seq_length" if flags else "max_seq_length"
        raise ValueError(f"{name}={max_seq_length}: leaves no room for text ({what}: at least {need})")


def feature_spec(max_seq_length: int, regression: bool = False, max_segments: Optional[int] = None) -> FeatureSpec:
    """The one-window layout, or with ``max_segments`` the windows of a long document (memory mode)."""
    shape = (max_seq_length,) if not max_segments else (int(max_segments), max_seq_length)
    spec = {
        "input_ids": ("int64", shape),
        "segment_ids": ("int64", shape),
        "padding_mask": ("int64", shape),
        "label": ("float32" if regression else "int64", ()),
        "is_real_example": ("int64", ()),
    }
    if max_segments:
        spec["num_segments"] = ("int64", ())
    return spec


def truncate_pair(ids_a: List[int], ids_b: List[int], max_length: int) -> None:
    """In place: drops the last token of the longer list (``ids_b`` on ties) until the total fits."""
    while len(ids_a) + len(ids_b) > max_length:
        (ids_a if len(ids_a) > len(ids_b) else ids_b).pop()


def text_budget(max_seq_length: int, pair: bool, max_segments: Optional[int] = None) -> int:
    """Text pieces an example keeps: one sequence holds A <sep> [B <sep>] <cls>; ``max_segments`` windows (one
    text) hold ``max_segments * max_seq_length`` positions, <sep> <cls> included."""
    if max_segments:
        return int(max_segments) * max_seq_length - 2
    return max_seq_length - (3 if pair else 2)


def build_features(ids_a: Sequence[int], ids_b: Optional[Sequence[int]], max_seq_length: int, sep_id: int,
                   cls_id: int) -> Dict[str, List[int]]:
    """Token ids of A (and B) -> ``input_ids``, ``segment_ids``, ``padding_mask`` (truncated, left-padded)."""
    ids_a = list(ids_a)
    ids_b = list(ids_b) if ids_b else None
    budget = text_budget(max_seq_length, bool(ids_b))
    if budget < 0:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the special tokens")
    if ids_b:
        truncate_pair(ids_a, ids_b, budget)
    else:
        ids_a = ids_a[:budget]
    ids = ids_a + [sep_id]
    seg = [SEG_ID_A] * len(ids)
    if ids_b:
        ids += ids_b + [sep_id]
        seg += [SEG_ID_B] * (len(ids_b) + 1)
    ids.append(cls_id)
    seg.append(SEG_ID_CLS)
    pad = max_seq_length - len(ids)
    return {"input_ids": [PAD_ID] * pad + ids, "segment_ids": [SEG_ID_PAD] * pad + seg,
            "padding_mask": [0] * pad + [1] * len(ids)}


def build_windows(ids_a: Sequence[int], max_seq_length: int, sep_id: int, cls_id: int,
                  max_segments: Optional[int] = None) -> Dict[str, List[List[int]]]:
    """Token ids of one document -> its windows (see the module docstring): ``input_ids``, ``segment_ids``,
    ``padding_mask`` as S lists of ``max_seq_length``; ``max_segments`` None: no cap."""
    L = max_seq_length
    if L < 2:
        raise ValueError(f"max_seq_length={L} leaves no room for the special tokens")
    ids = list(ids_a if not max_segments else ids_a[:text_budget(L, pair=False, max_segments=max_segments)])
    return cut_windows(ids + [sep_id, cls_id], [SEG_ID_A] * (len(ids) + 1) + [SEG_ID_CLS], L)


def cut_windows(tokens: Sequence[int], segments: Sequence[int], max_seq_length: int) -> Dict[str, List[List[int]]]:
    """One whole sequence -> windows of ``max_seq_length`` cut from its END (only the first one partial,
    LEFT-padded): ``input_ids``, ``segment_ids``, ``padding_mask`` as S lists (the classifier's and RACE's)."""
    L, n = max_seq_length, len(tokens)
    s = -(-n // L)
    pad = s * L - n
    seqs = {"input_ids": [PAD_ID] * pad + list(tokens), "segment_ids": [SEG_ID_PAD] * pad + list(segments),
            "padding_mask": [0] * pad + [1] * n}
    return {k: [v[i * L:(i + 1) * L] for i in range(s)] for k, v in seqs.items()}


def right_align(windows: Dict[str, List[List[int]]], num_windows: int) -> Dict[str, object]:
    """S windows -> ``num_windows`` (>= S): leading all-padding windows, plus ``num_segments`` = S."""
    s = len(windows["input_ids"])
    L = len(windows["input_ids"][0])
    fill = {"input_ids": PAD_ID, "segment_ids": SEG_ID_PAD, "padding_mask": 0}
    out: Dict[str, object] = {k: [[fill[k]] * L] * (num_windows - s) + v for k, v in windows.items()}
    out["num_segments"] = s
    return out


def encode_documents(tokenizer, texts: Sequence[str], max_seq_length: int,
                     max_segments: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Raw documents -> their windows, right-aligned to the longest: int32 [n, S, L] and ``num_segments`` [n]
    (what the memory-mode SavedModel builds in-graph)."""
    keep = text_budget(max_seq_length, False, max_segments) + 1 if max_segments else None
    wins = [build_windows(ids, max_seq_length, tokenizer.sep_id, tokenizer.cls_id, max_segments)
            for ids in encode_many(tokenizer, list(texts), first=keep)]
    s = max(len(w["input_ids"]) for w in wins)
    feats = [right_align(w, s) for w in wins]
    return {k: np.asarray([f[k] for f in feats], dtype=np.int32) for k in feats[0]}


def encode_many(tokenizer, texts: Sequence[str], num_threads: int = 2, first: Optional[int] = None) -> List[List[int]]:
    """``[tokenizer.encode(t) for t in texts]``, faster: one batched SentencePiece call.

    The digit-comma rule can only fire on a piece ending in ``<digit>,``; texts that might produce one (non
    printable-ASCII text, or ``[0-9],``) go through ``tokenizer.encode``'s path, so the ids are identical.
    ``first``: each text's first ids only (``tokenizer.encode(t, first=...)``: a long text costs what is kept).
    """
    if not all(hasattr(tokenizer, a) for a in ("sp", "preprocess", "tokenize_preprocessed")):
        return [tokenizer.encode(t)[:first] for t in texts]
    long = {i for i, t in enumerate(texts) if first is not None and len(t) > part_chars(first)}
    pre = [tokenizer.preprocess(t) if i not in long else "" for i, t in enumerate(texts)]
    ids = tokenizer.sp.Encode(pre, num_threads=num_threads) if pre else []
    for i, t in enumerate(pre):
        if i in long:
            ids[i] = tokenizer.encode(texts[i], first=first)
        elif not (t.isascii() and t.isprintable()) or _DIGIT_COMMA.search(t):
            ids[i] = tokenizer.convert_tokens_to_ids(tokenizer.tokenize_preprocessed(t))
    return [list(x[:first]) for x in ids]


def encode_texts(tokenizer, text_a: Union[str, Sequence[str]], text_b: Union[str, Sequence[str], None] = None,
                 max_seq_length: int = 128) -> Dict[str, np.ndarray]:
    """Raw strings -> the features of the training data (int32 arrays, [L] for a str, [n, L] for a list)."""
    single = isinstance(text_a, str)
    a_list = [text_a] if single else list(text_a)
    b_list = [text_b] if single or text_b is None else list(text_b)
    if text_b is None:
        b_list = [None] * len(a_list)
    if len(b_list) != len(a_list):
        raise ValueError(f"{len(a_list)} text_a but {len(b_list)} text_b")
    keep = text_budget(max_seq_length, pair=False) + 1  # what either text can keep, and one to see a cut
    ids_a = encode_many(tokenizer, a_list, first=keep)
    ids_b = encode_many(tokenizer, [b or "" for b in b_list], first=keep)
    feats = [build_features(a, b, max_seq_length, tokenizer.sep_id, tokenizer.cls_id) for a, b in zip(ids_a, ids_b)]
    out = {k: np.asarray([f[k] for f in feats], dtype=np.int32) for k in feats[0]} if feats else {}
    return {k: v[0] for k, v in out.items()} if single else out


def iter_features(examples: Iterable, tokenizer, task, max_seq_length: int, chunk: int = 4096,
                  pad_to_multiple: Optional[int] = None, max_segments: Optional[int] = None,
                  name: str = "examples") -> Iterator[Dict[str, object]]:
    """Examples -> feature dicts, tokenised ``chunk`` examples at a time (``max_segments``: windows); at the end,
    how many were truncated (``data.lengths.report_truncation``, under ``name``)."""
    if max_segments:
        def build(a, b):
            if b:
                raise ValueError(f"task {task.name}: long-document (memory) features take one text per example; "
                                 f"this task has a text_b")
            return right_align(build_windows(a, max_seq_length, tokenizer.sep_id, tokenizer.cls_id, max_segments),
                               max_segments)
    else:
        def build(a, b):
            return build_features(a, b, max_seq_length, tokenizer.sep_id, tokenizer.cls_id)
    examples = iter(examples)
    n = truncated = 0
    # Either text keeps at most a single text's budget (``truncate_pair`` only shortens); one more piece tells a
    # cut text from one that fits, so tokenising costs what the features keep (``XLNetTokenizer.encode``).
    keep = text_budget(max_seq_length, False, max_segments) + 1
    while True:
        block = [ex for _, ex in zip(range(chunk), examples)]
        if not block:
            break
        ids_a = encode_many(tokenizer, [ex.text_a for ex in block], first=keep)
        ids_b = encode_many(tokenizer, [ex.text_b or "" for ex in block], first=keep)
        for ex, a, b in zip(block, ids_a, ids_b):
            truncated += len(a) + len(b) > text_budget(max_seq_length, bool(b), max_segments)
            feat = build(a, b)
            feat["label"] = task.label_id(ex.label)
            feat["is_real_example"] = 1
            n += 1
            yield feat
    report_truncation(name, truncated, n, max_seq_length)
    if pad_to_multiple:
        while n % pad_to_multiple:
            feat = build([], None)
            feat["label"] = 0.0 if task.regression else 0
            feat["is_real_example"] = 0
            n += 1
            yield feat


def _examples_digest(examples: Sequence) -> str:
    h = hashlib.sha1()
    for ex in examples:
        h.update(f"{ex.guid}\x00{ex.text_a}\x00{ex.text_b}\x00{ex.label}\x01".encode("utf-8"))
    return h.hexdigest()


def features_meta(task, tokenizer, max_seq_length: int, sources: Union[List[dict], str],
                  pad_to_multiple: Optional[int] = None, max_segments: Optional[int] = None) -> dict:
    """What a cached TFRecord file must match: layout, task, tokenizer, max_seq_length, source files."""
    sp_file = getattr(tokenizer, "spiece_model_file", None)
    tok = {"class": type(tokenizer).__name__}
    if sp_file:
        tok.update(path=os.path.abspath(sp_file), size=os.path.getsize(sp_file))
    for opt in ("lower", "remove_space", "keep_accents"):
        if hasattr(tokenizer, opt):
            tok[opt] = getattr(tokenizer, opt)
    meta = {"layout": LAYOUT, "task": task.describe(), "tokenizer": tok, "max_seq_length": max_seq_length,
            "sources": sources, "pad_to_multiple": pad_to_multiple}
    if max_segments:
        meta.update(layout=LONG_LAYOUT, max_segments=int(max_segments))
    return meta


def write_features(examples: Union[Sequence, Callable[[], Sequence]], tokenizer, task, max_seq_length: int,
                   path: str, source_files: Optional[Sequence[str]] = None, pad_to_multiple: Optional[int] = None,
                   progress: bool = True, max_segments: Optional[int] = None,
                   shuffle_seed: Optional[int] = None) -> int:
    """Writes the features of ``examples`` to ``path`` (atomic, with manifest); reuses a matching cache.

    ``shuffle_seed``: write the examples in a seeded random order (training files, as the original shuffles its
    train examples before writing): the training input's shuffle buffer (10,000 records) cannot mix a file
    sorted by label (IMDB's archive holds 12,500 negative reviews, then 12,500 positive ones; a short run saw
    only negatives and collapsed to that label).

    ``examples``: a list, or a callable returning it (then it is only called when the cache is stale).
    ``source_files``: the files the examples come from; the cache is keyed on their ``stat_identity``. Without
    them it is keyed on a digest of the examples (which then must be a list). Returns the record count.
    """
    if source_files is not None:
        sources: Union[List[dict], str] = [stat_identity(p) for p in source_files]
    elif callable(examples):
        raise ValueError("pass source_files= when examples is a callable (the cache needs an identity)")
    else:
        sources = "sha1:" + _examples_digest(examples)
    meta = features_meta(task, tokenizer, max_seq_length, sources, pad_to_multiple, max_segments)
    if shuffle_seed is not None:
        meta["shuffle_seed"] = int(shuffle_seed)
    if is_valid_cache(path, meta):
        return int(read_manifest(path)["count"])
    exs = examples() if callable(examples) else examples
    if shuffle_seed is not None:
        exs = list(exs)
        random.Random(int(shuffle_seed)).shuffle(exs)
    total = len(exs) + ((-len(exs)) % pad_to_multiple if pad_to_multiple else 0)
    return cached_tfrecords(path, lambda: iter_features(exs, tokenizer, task, max_seq_length,
                                                        pad_to_multiple=pad_to_multiple, max_segments=max_segments,
                                                        name=os.path.basename(path)),
                            feature_spec(max_seq_length, task.regression, max_segments), meta=meta, total=total,
                            desc=f"{task.name} features", progress=progress)


def task_features(task, data_dir: str, split: str, tokenizer, max_seq_length: int, out_dir: str,
                  pad_to_multiple: Optional[int] = None, progress: bool = True, overwrite: bool = False,
                  max_segments: Optional[int] = None):
    """Reads ``split`` of ``task`` (only when no valid cache exists, or ``overwrite``) and writes its TFRecords.

    Returns (path, record count); the file is ``out_dir/<task>-<split>-<max_seq_length>.tfrecord``
    (``...-<max_seq_length>x<max_segments>.tfrecord`` for long-document windows).
    """
    size = f"{max_seq_length}x{int(max_segments)}" if max_segments else f"{max_seq_length}"
    path = os.path.join(out_dir, f"{task.name}-{split}-{size}.tfrecord")
    if overwrite:
        for p in (path, tfrecord_io.manifest_path(path)):
            if os.path.exists(p):
                os.remove(p)
    if hasattr(task, "discover_labels"):  # labels read from train go into the cache identity
        task.discover_labels(data_dir)
    n = write_features(lambda: task.get_examples(data_dir, split), tokenizer, task, max_seq_length, path,
                       source_files=task.source_files(data_dir, split), pad_to_multiple=pad_to_multiple,
                       progress=progress, max_segments=max_segments,
                       shuffle_seed=TRAIN_ORDER_SEED if split == "train" else None)
    return path, n


def make_dataset(paths: Union[str, Sequence[str]], batch_size: int, is_training: bool,
                 max_seq_length: Optional[int] = None, regression: Optional[bool] = None, **kwargs):
    """TFRecords written by :func:`write_features` -> tf.data of dict batches (int32 ints).

    The feature spec comes from the first file's manifest, or from ``max_seq_length``/``regression``.
    ``kwargs`` go to ``data.tfrecord_io.make_dataset`` (seed, drop_remainder, repeat, input_context, ...).
    """
    if isinstance(paths, str):
        paths = sorted(glob.glob(paths)) or [paths]
    first = paths[0]
    manifest = read_manifest(first) if os.path.isfile(first) else None
    if manifest:
        spec = {k: (d, tuple(s)) for k, (d, s) in manifest["spec"].items()}
    elif max_seq_length is not None:
        spec = feature_spec(max_seq_length, bool(regression))
    else:
        raise ValueError(f"{first}: no manifest; pass max_seq_length= (and regression=)")
    return tfrecord_io.make_dataset(paths, spec, batch_size, is_training, **kwargs)


def trim_windows(batch: Dict[str, "tf.Tensor"]) -> Dict[str, "tf.Tensor"]:
    """A batch of right-aligned windows [b, (choices,) max_segments, L] -> the last max(num_segments) windows."""
    import tensorflow as tf

    s = tf.maximum(tf.reduce_max(batch["num_segments"]), 1)
    return {k: v[..., -s:, :] if k in ("input_ids", "segment_ids", "padding_mask") else v for k, v in batch.items()}


def make_window_dataset(paths: Union[str, Sequence[str]], batch_size: int, is_training: bool, bucket: bool = True,
                        **kwargs):
    """Long-document windows -> batches [b, S, L] with S = the batch's most windows (``trim_windows``).

    Training with ``bucket``: batches of documents with the same window count (``group_by_window``), so no
    batch computes a window only padding fills; S then varies from batch to batch (one trace: the model loops
    over S in-graph). Without ``bucket`` (needed with gradient accumulation, which stacks batches of one shape)
    every batch keeps all ``max_segments`` windows, the leading padding ones hidden by the masks. Evaluation and
    prediction keep the file's order.
    """
    import tensorflow as tf

    if not (is_training and bucket):
        ds = make_dataset(paths, batch_size, is_training, **kwargs)
        return ds if is_training else ds.map(tf.autograph.experimental.do_not_convert(trim_windows))

    ds = make_dataset(paths, 1, is_training, drop_remainder=False, **kwargs).unbatch()
    ds = ds.group_by_window(
        key_func=tf.autograph.experimental.do_not_convert(lambda f: tf.cast(f["num_segments"], tf.int64)),
        reduce_func=tf.autograph.experimental.do_not_convert(lambda _, w: w.batch(batch_size, drop_remainder=True)),
        window_size=batch_size)
    return ds.map(tf.autograph.experimental.do_not_convert(trim_windows)).prefetch(tf.data.AUTOTUNE)
