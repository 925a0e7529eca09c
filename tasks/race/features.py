"""RACE features: one record per question, its 4 options as 4 left-padded sequences.

For option ``o`` of question ``q``: ``qa = q.replace("_", o)`` if ``"_" in q`` else ``q + " " + o``; the qa pieces
keep their LAST ``max_qa_length``; the article keeps its FIRST ``max_seq_length - 3 - len(qa)`` pieces::

    [pad ... pad] article <sep> qa <sep> <cls>
    segment ids:   4 ... 4 | 0 ... 0   0 | 1 .. 1  1 |  2        padding_mask: 0 at padding, 1 elsewhere

Each option is built from fresh lists (the original run_race.py appended to the shared context list, so later
options saw earlier ones whenever the article fitted; not reproduced). Each article is tokenised once per file.

Record features (BUILD.md): ``input_ids``, ``segment_ids``, ``padding_mask`` [4, L]; ``label`` (0-3, -1 when
unlabelled); ``level`` (0 middle, 1 high).

Long articles (``max_segments``, memory mode): per option, the whole sequence ``article <sep> qa <sep> <cls>``
(the article cut to its FIRST ``max_segments * L - 3 - len(qa)`` pieces, as truncation keeps its beginning) is
split into windows of L from its END, as the classifier's ``build_windows``: the last window holds the article's
tail, ``<sep> qa <sep> <cls>``, earlier windows the preceding article pieces, only the first one partial and
LEFT-padded. Sequence features [4, max_segments, L], each option right-aligned (leading all-padding windows),
and ``num_segments`` = the most windows of the 4 options. An article that fits one window gives exactly the
one-window features; ``max_segments=1`` gives exactly the truncated ones.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from xlnet_tf.data import tfrecord_io
from xlnet_tf.data.lengths import report_truncation
from xlnet_tf.tasks.classification.features import cut_windows, make_window_dataset, right_align
from xlnet_tf.tasks.race import reader as race_task
from xlnet_tf.fileutil import stat_identity
from xlnet_tf.tokenizer import SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, XLNetTokenizer

LAYOUT_VERSION = 1  # bump when the feature layout changes, so cached files are rebuilt
PAD_ID = 0


def race_feature_spec(max_seq_length: int, num_choices: int = race_task.NUM_CHOICES,
                      max_segments: Optional[int] = None) -> tfrecord_io.FeatureSpec:
    shape = (num_choices, max_seq_length) if not max_segments else (num_choices, int(max_segments), max_seq_length)
    spec = {"input_ids": ("int64", shape), "segment_ids": ("int64", shape), "padding_mask": ("int64", shape),
            "label": ("int64", ()), "level": ("int64", ())}
    if max_segments:
        spec["num_segments"] = ("int64", ())
    return spec


def qa_text(question: str, option: str) -> str:
    """The question with its blank(s) filled by ``option``, or ``question + " " + option``."""
    return question.replace("_", option) if "_" in question else question + " " + option


def check_lengths(max_seq_length: int, max_qa_length: int, flags: bool = False) -> None:
    """The RACE length rule, its one home (run_race.py's flags, these features and their in-graph twin in
    ``serving.py`` check it here): ``<sep> qa <sep> <cls>`` must fit, so 1 <= max_qa_length <= max_seq_length - 3.
    ``flags``: name them as the command line's flags."""
    if max_qa_length < 1 or max_seq_length - 3 < max_qa_length:
        qa, seq = ("--max_qa_length", "--max_seq_length") if flags else ("max_qa_length", "max_seq_length")
        raise ValueError(f"need 1 <= {qa} <= {seq} - 3; got {qa}={max_qa_length}, {seq}={max_seq_length}")


def encode_choices(context_ids: Sequence[int], qa_ids: Sequence[Sequence[int]], max_seq_length: int,
                   max_qa_length: int, sep_id: int, cls_id: int) -> Dict[str, np.ndarray]:
    """Token ids of the article and of each option's qa text -> int32 arrays [len(qa_ids), max_seq_length]."""
    check_lengths(max_seq_length, max_qa_length)
    n = len(qa_ids)
    out = {k: np.zeros((n, max_seq_length), np.int32) for k in ("input_ids", "segment_ids", "padding_mask")}
    for j, qa in enumerate(qa_ids):
        qa = list(qa)[-max_qa_length:]
        ctx = list(context_ids[:max_seq_length - 3 - len(qa)])
        ids = ctx + [sep_id] + qa + [sep_id, cls_id]
        segs = [SEG_ID_A] * (len(ctx) + 1) + [SEG_ID_B] * (len(qa) + 1) + [SEG_ID_CLS]
        pad = max_seq_length - len(ids)
        out["input_ids"][j] = [PAD_ID] * pad + ids
        out["segment_ids"][j] = [SEG_ID_PAD] * pad + segs
        out["padding_mask"][j, pad:] = 1
    return out


def encode_choice_windows(context_ids: Sequence[int], qa_ids: Sequence[Sequence[int]], max_seq_length: int,
                          max_qa_length: int, sep_id: int, cls_id: int,
                          max_segments: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Long articles (module docstring) -> int32 [len(qa_ids), W, max_seq_length] and ``num_segments``;
    W = ``max_segments``, or without it (no cap) the most windows of the options."""
    check_lengths(max_seq_length, max_qa_length)
    L, per = max_seq_length, []
    for qa in qa_ids:
        qa = list(qa)[-max_qa_length:]
        ctx = list(context_ids if not max_segments else context_ids[:int(max_segments) * L - 3 - len(qa)])
        ids = ctx + [sep_id] + qa + [sep_id, cls_id]
        segs = [SEG_ID_A] * (len(ctx) + 1) + [SEG_ID_B] * (len(qa) + 1) + [SEG_ID_CLS]
        per.append(cut_windows(ids, segs, L))
    most = max(len(w["input_ids"]) for w in per)
    aligned = [right_align(w, int(max_segments) if max_segments else most) for w in per]
    out = {k: np.asarray([a[k] for a in aligned], np.int32) for k in ("input_ids", "segment_ids", "padding_mask")}
    out["num_segments"] = np.int32(most)
    return out


def encode_article(tokenizer: XLNetTokenizer, article: str, max_seq_length: int, max_segments: Optional[int] = None,
                   windows: bool = False) -> List[int]:
    """The article's ids an option can keep (its first ``max_seq_length - 3``, or ``max_segments * max_seq_length - 3``
    in windows; all of them in windows without ``max_segments``), and one more when it is longer, so a cut is seen:
    tokenising costs what the features keep (``XLNetTokenizer.encode``)."""
    if (windows or max_segments) and not max_segments:
        return tokenizer.encode(article)
    return tokenizer.encode(article, first=(int(max_segments) if max_segments else 1) * max_seq_length - 2)


def encode_race(tokenizer: XLNetTokenizer, article: str, question: str, options: Sequence[str],
                max_seq_length: int = 512, max_qa_length: int = 128,
                context_ids: Optional[Sequence[int]] = None, max_segments: Optional[int] = None,
                windows: bool = False) -> Dict[str, np.ndarray]:
    """Raw strings -> ``input_ids``/``segment_ids``/``padding_mask`` int32 [len(options), max_seq_length]
    (``windows`` or ``max_segments``: the long-article windows [len(options), W, max_seq_length]).

    ``context_ids`` (the article already encoded) skips re-tokenising an article shared by several questions.
    """
    if context_ids is None:
        context_ids = encode_article(tokenizer, article, max_seq_length, max_segments, windows)
    qa_ids = [tokenizer.encode(qa_text(question, o), last=max_qa_length) for o in options]
    if windows or max_segments:
        return encode_choice_windows(context_ids, qa_ids, max_seq_length, max_qa_length, tokenizer.sep_id,
                                     tokenizer.cls_id, max_segments)
    return encode_choices(context_ids, qa_ids, max_seq_length, max_qa_length, tokenizer.sep_id, tokenizer.cls_id)


def document_features(tokenizer: XLNetTokenizer, doc: race_task.RaceDocument, max_seq_length: int,
                      max_qa_length: int, max_segments: Optional[int] = None) -> List[Dict[str, object]]:
    """Records of every question of one file (the article tokenised once; ``max_segments``: windows), each with
    ``truncated``: whether an option's sequence lost pieces of the article (not a TFRecord feature)."""
    context_ids = encode_article(tokenizer, doc.article, max_seq_length, max_segments)
    out = []
    for ex in doc.examples:
        feats = encode_race(tokenizer, ex.article, ex.question, ex.options, max_seq_length, max_qa_length,
                            context_ids=context_ids, max_segments=max_segments)
        feats["label"] = -1 if ex.label is None else ex.label
        feats["level"] = race_task.LEVELS.index(ex.level)
        kept = (feats["segment_ids"] == SEG_ID_A).reshape(len(ex.options), -1).sum(1) - 1  # article + its <sep>
        feats["truncated"] = bool((kept < len(context_ids)).any())
        out.append(feats)
    return out


# ---------------------------------------------------------------------------------------------- writing
_WORKER = {}


def _worker_init(tokenizer_args: dict, max_seq_length: int, max_qa_length: int,
                 max_segments: Optional[int] = None) -> None:
    _WORKER.update(tokenizer=XLNetTokenizer(**tokenizer_args), lengths=(max_seq_length, max_qa_length, max_segments))


def _worker_encode(doc: race_task.RaceDocument) -> List[Dict[str, object]]:
    return document_features(_WORKER["tokenizer"], doc, *_WORKER["lengths"])


def _tokenizer_args(tok: XLNetTokenizer) -> dict:
    return {"spiece_model_file": tok.spiece_model_file, "lower": tok.lower, "remove_space": tok.remove_space,
            "keep_accents": tok.keep_accents}


def source_signature(source: str, split: str) -> dict:
    """An archive's ``stat_identity``; for a directory, its split's."""
    return stat_identity(source if os.path.isfile(source) else race_task._split_dir(source, split))


def features_meta(source: str, split: str, tokenizer: XLNetTokenizer, max_seq_length: int, max_qa_length: int,
                  high_only: bool = False, middle_only: bool = False, max_segments: Optional[int] = None) -> dict:
    """What a cached RACE TFRecord must match to be reused."""
    meta = {"task": "race", "layout": LAYOUT_VERSION, "split": split, "source": source_signature(source, split),
            "levels": list(race_task.select_levels(high_only, middle_only)),
            "tokenizer": dict(_tokenizer_args(tokenizer), model=stat_identity(tokenizer.spiece_model_file)),
            "max_seq_length": max_seq_length, "max_qa_length": max_qa_length}
    if max_segments:
        meta.update(long_doc_mode="memory", max_segments=int(max_segments))
    return meta


def iter_features(docs: Sequence[race_task.RaceDocument], tokenizer: XLNetTokenizer, max_seq_length: int,
                  max_qa_length: int, num_workers: Optional[int] = None,
                  max_segments: Optional[int] = None, name: str = "RACE") -> Iterator[Dict[str, object]]:
    """Records of ``docs`` in order; ``num_workers`` > 1 tokenises in a process pool (default: CPU count). At the
    end, how many questions lost article pieces (``data.lengths.report_truncation``, under ``name``)."""
    check_lengths(max_seq_length, max_qa_length)
    n = truncated = 0
    for feats in _document_records(docs, tokenizer, max_seq_length, max_qa_length, num_workers, max_segments):
        truncated += feats.pop("truncated")
        n += 1
        yield feats
    report_truncation(name, truncated, n, max_seq_length)


def _document_records(docs, tokenizer, max_seq_length, max_qa_length, num_workers, max_segments):
    num_workers = min(os.cpu_count() or 1, 8) if num_workers is None else num_workers
    if num_workers <= 1 or len(docs) < 64:
        for doc in docs:
            yield from document_features(tokenizer, doc, max_seq_length, max_qa_length, max_segments)
        return
    ctx = multiprocessing.get_context("spawn")  # safe whatever threads (TF) the parent runs
    with ctx.Pool(num_workers, _worker_init, (_tokenizer_args(tokenizer), max_seq_length, max_qa_length,
                                                   max_segments)) as pool:
        for feats in pool.imap(_worker_encode, docs, chunksize=16):
            yield from feats


def write_race_features(source: str, split: str, output_path: str, tokenizer: XLNetTokenizer,
                        max_seq_length: int = 512, max_qa_length: int = 128, high_only: bool = False,
                        middle_only: bool = False, num_workers: Optional[int] = None,
                        progress: bool = True, max_segments: Optional[int] = None) -> int:
    """Writes (or reuses, when its manifest matches) the TFRecord of one split; returns the question count."""
    meta = features_meta(source, split, tokenizer, max_seq_length, max_qa_length, high_only, middle_only,
                         max_segments)
    if tfrecord_io.is_valid_cache(output_path, meta):
        return int(tfrecord_io.read_manifest(output_path)["count"])
    docs = race_task.read_race_documents(source, split, high_only, middle_only)
    total = sum(len(d.examples) for d in docs)
    return tfrecord_io.cached_tfrecords(
        output_path, lambda: iter_features(docs, tokenizer, max_seq_length, max_qa_length, num_workers, max_segments,
                                           name=os.path.basename(output_path)),
        race_feature_spec(max_seq_length, max_segments=max_segments), meta=meta, total=total, desc=f"RACE {split}",
        progress=progress)


# ---------------------------------------------------------------------------------------------- reading
def race_dataset(paths, max_seq_length: int, batch_size: int, is_training: bool, max_segments: Optional[int] = None,
                 bucket: bool = True, length_multiple: Optional[int] = None, **kwargs):
    """TFRecords -> tf.data batches of {input_ids, segment_ids, padding_mask: [b, 4, L], label, level: [b]}
    (``max_segments``: windows [b, 4, W, L] and ``num_segments``, batched as the classifier's
    ``make_window_dataset``: W = the batch's most windows; training buckets by window count). One window: each
    batch padded to its longest example (rounded up to ``length_multiple``), training batches of one length
    group with ``bucket`` (``data.lengths``)."""
    if max_segments:
        return make_window_dataset(paths, batch_size, is_training, bucket=bucket, **kwargs)
    return tfrecord_io.make_dataset(paths, race_feature_spec(max_seq_length), batch_size, is_training,
                                    dynamic="left" if bucket or not is_training else None,
                                    length_multiple=length_multiple, **kwargs)


def flatten_choices(features: Dict[str, object]) -> Dict[str, object]:
    """[b, 4, L] sequence features -> [b*4, L] backbone inputs (label/level are left out)."""
    import tensorflow as tf

    return {k: tf.reshape(features[k], [-1, tf.shape(features[k])[-1]])
            for k in ("input_ids", "segment_ids", "padding_mask")}
