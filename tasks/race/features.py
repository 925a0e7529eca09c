"""RACE features: one record per question, its 4 options as 4 left-padded sequences.

For option ``o`` of question ``q``: ``qa = q.replace("_", o)`` if ``"_" in q`` else ``q + " " + o``; the qa pieces
keep their LAST ``max_qa_length``; the article keeps its FIRST ``max_seq_length - 3 - len(qa)`` pieces::

    [pad ... pad] article <sep> qa <sep> <cls>
    segment ids:   4 ... 4 | 0 ... 0   0 | 1 .. 1  1 |  2        padding_mask: 0 at padding, 1 elsewhere

Each option is built from fresh lists (the original run_race.py appended to the shared context list, so later
options saw earlier ones whenever the article fitted; not reproduced). Each article is tokenised once per file.

Record features (BUILD.md): ``input_ids``, ``segment_ids``, ``padding_mask`` [4, L]; ``label`` (0-3, -1 when
unlabelled); ``level`` (0 middle, 1 high).
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from data import tfrecord_io
from tasks.race import reader as race_task
from xlnet_tf.fileutil import stat_identity
from xlnet_tf.tokenizer import SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, XLNetTokenizer

LAYOUT_VERSION = 1  # bump when the feature layout changes, so cached files are rebuilt
PAD_ID = 0


def race_feature_spec(max_seq_length: int, num_choices: int = race_task.NUM_CHOICES) -> tfrecord_io.FeatureSpec:
    shape = (num_choices, max_seq_length)
    return {"input_ids": ("int64", shape), "segment_ids": ("int64", shape), "padding_mask": ("int64", shape),
            "label": ("int64", ()), "level": ("int64", ())}


def qa_text(question: str, option: str) -> str:
    """The question with its blank(s) filled by ``option``, or ``question + " " + option``."""
    return question.replace("_", option) if "_" in question else question + " " + option


def _check_lengths(max_seq_length: int, max_qa_length: int) -> None:
    if max_qa_length < 1 or max_seq_length - 3 < max_qa_length:
        raise ValueError(f"need 1 <= max_qa_length <= max_seq_length - 3; got max_qa_length={max_qa_length}, "
                         f"max_seq_length={max_seq_length}")


def encode_choices(context_ids: Sequence[int], qa_ids: Sequence[Sequence[int]], max_seq_length: int,
                   max_qa_length: int, sep_id: int, cls_id: int) -> Dict[str, np.ndarray]:
    """Token ids of the article and of each option's qa text -> int32 arrays [len(qa_ids), max_seq_length]."""
    _check_lengths(max_seq_length, max_qa_length)
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


def encode_race(tokenizer: XLNetTokenizer, article: str, question: str, options: Sequence[str],
                max_seq_length: int = 512, max_qa_length: int = 128,
                context_ids: Optional[Sequence[int]] = None) -> Dict[str, np.ndarray]:
    """Raw strings -> ``input_ids``/``segment_ids``/``padding_mask`` int32 [len(options), max_seq_length].

    ``context_ids`` (the article already encoded) skips re-tokenising an article shared by several questions.
    """
    if context_ids is None:
        context_ids = tokenizer.encode(article)
    qa_ids = [tokenizer.encode(qa_text(question, o)) for o in options]
    return encode_choices(context_ids, qa_ids, max_seq_length, max_qa_length, tokenizer.sep_id, tokenizer.cls_id)


def document_features(tokenizer: XLNetTokenizer, doc: race_task.RaceDocument, max_seq_length: int,
                      max_qa_length: int) -> List[Dict[str, object]]:
    """Records of every question of one file (the article tokenised once)."""
    context_ids = tokenizer.encode(doc.article)
    out = []
    for ex in doc.examples:
        feats = encode_race(tokenizer, ex.article, ex.question, ex.options, max_seq_length, max_qa_length,
                            context_ids=context_ids)
        feats["label"] = -1 if ex.label is None else ex.label
        feats["level"] = race_task.LEVELS.index(ex.level)
        out.append(feats)
    return out


# ---------------------------------------------------------------------------------------------- writing
_WORKER = {}


def _worker_init(tokenizer_args: dict, max_seq_length: int, max_qa_length: int) -> None:
    _WORKER.update(tokenizer=XLNetTokenizer(**tokenizer_args), lengths=(max_seq_length, max_qa_length))


def _worker_encode(doc: race_task.RaceDocument) -> List[Dict[str, object]]:
    return document_features(_WORKER["tokenizer"], doc, *_WORKER["lengths"])


def _tokenizer_args(tok: XLNetTokenizer) -> dict:
    return {"spiece_model_file": tok.spiece_model_file, "lower": tok.lower, "remove_space": tok.remove_space,
            "keep_accents": tok.keep_accents}


def source_signature(source: str, split: str) -> dict:
    """An archive's ``stat_identity``; for a directory, its split's."""
    return stat_identity(source if os.path.isfile(source) else race_task._split_dir(source, split))


def features_meta(source: str, split: str, tokenizer: XLNetTokenizer, max_seq_length: int, max_qa_length: int,
                  high_only: bool = False, middle_only: bool = False) -> dict:
    """What a cached RACE TFRecord must match to be reused."""
    return {"task": "race", "layout": LAYOUT_VERSION, "split": split, "source": source_signature(source, split),
            "levels": list(race_task.select_levels(high_only, middle_only)),
            "tokenizer": dict(_tokenizer_args(tokenizer), model=stat_identity(tokenizer.spiece_model_file)),
            "max_seq_length": max_seq_length, "max_qa_length": max_qa_length}


def iter_features(docs: Sequence[race_task.RaceDocument], tokenizer: XLNetTokenizer, max_seq_length: int,
                  max_qa_length: int, num_workers: Optional[int] = None) -> Iterator[Dict[str, object]]:
    """Records of ``docs`` in order; ``num_workers`` > 1 tokenises in a process pool (default: CPU count)."""
    _check_lengths(max_seq_length, max_qa_length)
    num_workers = min(os.cpu_count() or 1, 8) if num_workers is None else num_workers
    if num_workers <= 1 or len(docs) < 64:
        for doc in docs:
            yield from document_features(tokenizer, doc, max_seq_length, max_qa_length)
        return
    ctx = multiprocessing.get_context("spawn")  # safe whatever threads (TF) the parent runs
    with ctx.Pool(num_workers, _worker_init, (_tokenizer_args(tokenizer), max_seq_length, max_qa_length)) as pool:
        for feats in pool.imap(_worker_encode, docs, chunksize=16):
            yield from feats


def write_race_features(source: str, split: str, output_path: str, tokenizer: XLNetTokenizer,
                        max_seq_length: int = 512, max_qa_length: int = 128, high_only: bool = False,
                        middle_only: bool = False, num_workers: Optional[int] = None,
                        progress: bool = True) -> int:
    """Writes (or reuses, when its manifest matches) the TFRecord of one split; returns the question count."""
    meta = features_meta(source, split, tokenizer, max_seq_length, max_qa_length, high_only, middle_only)
    if tfrecord_io.is_valid_cache(output_path, meta):
        return int(tfrecord_io.read_manifest(output_path)["count"])
    docs = race_task.read_race_documents(source, split, high_only, middle_only)
    total = sum(len(d.examples) for d in docs)
    return tfrecord_io.cached_tfrecords(
        output_path, lambda: iter_features(docs, tokenizer, max_seq_length, max_qa_length, num_workers),
        race_feature_spec(max_seq_length), meta=meta, total=total, desc=f"RACE {split}", progress=progress)


# ---------------------------------------------------------------------------------------------- reading
def race_dataset(paths, max_seq_length: int, batch_size: int, is_training: bool, **kwargs):
    """TFRecords -> tf.data batches of {input_ids, segment_ids, padding_mask: [b, 4, L], label, level: [b]}."""
    return tfrecord_io.make_dataset(paths, race_feature_spec(max_seq_length), batch_size, is_training, **kwargs)


def flatten_choices(features: Dict[str, object]) -> Dict[str, object]:
    """[b, 4, L] sequence features -> [b*4, L] backbone inputs (label/level are left out)."""
    import tensorflow as tf

    return {k: tf.reshape(features[k], [-1, tf.shape(features[k])[-1]])
            for k in ("input_ids", "segment_ids", "padding_mask")}
