"""TFRecord writing and reading shared by every task.

One mechanism for all feature files:

* Features are dicts of name -> list[int] / list[float] / bytes (fixed lengths per name), described by a
  ``FeatureSpec`` (name -> (dtype, shape)).
* ``write_tfrecords(path, records, spec, meta)`` writes ``path.tmp-<pid>`` first, then a manifest
  ``path.json`` (count, spec, meta such as the tokenizer and max_seq_length), and renames both into place,
  the manifest last. A file without a manifest, or whose manifest ``meta`` differs from what the caller wants,
  is never trusted: ``cached_tfrecords`` rebuilds it. An interrupted writer leaves at most a ``.tmp-*`` file
  that nothing reads. The manifest also records the file's size and CRC32 (and the record count): a cache whose
  bytes changed since (truncated, bits flipped) is found by ``damage`` before any work, and rebuilt with a
  WARNING naming it, or refused in one line when its directory cannot be written (a shared read-only cache).
* ``make_dataset(paths, spec, ...)`` reads them back as batches of dict tensors.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import struct
import sys
import time
import zlib
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

from xlnet_tf.data import lengths

# name -> (dtype string: "int64" | "float32" | "string", shape tuple; () for scalars)
FeatureSpec = Dict[str, Tuple[str, Tuple[int, ...]]]

log = logging.getLogger("data")
_CHUNK = 1 << 22
_WHOLE: Dict[str, tuple] = {}  # path -> the file identity found whole in this process (checked once)


class Progress:
    """A small progress bar on stderr (count, rate, ETA); silent when ``total`` is 0 or ``enabled`` is False."""

    def __init__(self, total: Optional[int], desc: str, enabled: bool = True, every: float = 0.5):
        self.total, self.desc, self.enabled, self.every = total, desc, enabled, every
        self.n = 0
        self.start = self.last = time.time()

    def update(self, k: int = 1, extra: str = "") -> None:
        self.n += k
        now = time.time()
        if self.enabled and (now - self.last >= self.every or (self.total and self.n >= self.total)):
            self.last = now
            rate = self.n / max(now - self.start, 1e-9)
            if self.total:
                eta = (self.total - self.n) / max(rate, 1e-9)
                msg = f"\r{self.desc}: {self.n}/{self.total} ({rate:.0f}/s, ETA {eta:.0f}s) {extra}"
            else:
                msg = f"\r{self.desc}: {self.n} ({rate:.0f}/s) {extra}"
            sys.stderr.write(msg)
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.n:
            sys.stderr.write(f"\r{self.desc}: {self.n} done in {time.time() - self.start:.1f}s\n")
            sys.stderr.flush()


def serialize(record: Mapping[str, object], spec: FeatureSpec) -> bytes:
    """One feature dict -> serialized tf.train.Example; checks every field against the spec.

    Fills the protobuf directly (``extend`` on the repeated fields), several times faster than building
    ``tf.train.Feature`` objects one by one.
    """
    from tensorflow.core.example import example_pb2

    ex = example_pb2.Example()
    fmap = ex.features.feature
    for name, (dtype, shape) in spec.items():
        if name not in record:
            raise KeyError(f"feature {name!r} missing from record (have {sorted(record)})")
        value = record[name]
        if dtype == "string":
            vals = value if isinstance(value, (list, tuple)) else [value]
            fmap[name].bytes_list.value.extend(v.encode("utf-8") if isinstance(v, str) else v for v in vals)
            continue
        n = int(np.prod(shape)) if shape else 1
        arr = np.asarray(value).reshape(-1)
        if arr.size != n:
            raise ValueError(f"feature {name!r}: expected {n} values (shape {shape}), got {arr.size}")
        if dtype == "int64":
            fmap[name].int64_list.value.extend(arr.astype(np.int64).tolist())
        elif dtype == "float32":
            fmap[name].float_list.value.extend(arr.astype(np.float32).tolist())
        else:
            raise ValueError(f"unknown feature dtype {dtype!r}")
    return ex.SerializeToString()


def manifest_path(path: str) -> str:
    return path + ".json"


def read_manifest(path: str) -> Optional[dict]:
    try:
        with open(manifest_path(path), "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_tfrecords(path: str, records: Iterable[Mapping[str, object]], spec: FeatureSpec,
                    meta: Optional[dict] = None, total: Optional[int] = None, desc: str = "writing",
                    progress: bool = True) -> int:
    """Atomically writes ``records`` to ``path`` plus its manifest; returns the record count."""
    import tensorflow as tf

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{path}: cannot write the cached records: {folder} is read-only; pass a --cache_dir "
                         f"(pretraining: --record_dir) this run can write")
    tmp = f"{path}.tmp-{os.getpid()}"
    n = 0
    bar = Progress(total, desc, enabled=progress)
    try:
        with tf.io.TFRecordWriter(tmp) as w:
            for rec in records:
                w.write(serialize(rec, spec))
                n += 1
                bar.update()
        bar.close()
        manifest = {"count": n, "spec": {k: [d, list(s)] for k, (d, s) in spec.items()}, "meta": meta or {},
                    "bytes": os.path.getsize(tmp), "crc32": file_crc32(tmp)}
        mtmp = f"{manifest_path(path)}.tmp-{os.getpid()}"
        with open(mtmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        # The data file first, the manifest last: a manifest always describes a complete file.
        if os.path.exists(manifest_path(path)):
            os.remove(manifest_path(path))
        os.replace(tmp, path)
        os.replace(mtmp, manifest_path(path))
    finally:
        for leftover in (tmp, f"{manifest_path(path)}.tmp-{os.getpid()}"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return n


def file_crc32(path: str) -> str:
    """The CRC32 of a whole file, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def count_records(path: str) -> int:
    """Records in a TFRecord file by its framing (length, length CRC, data, data CRC); ValueError when the
    framing breaks off (a truncated file)."""
    n, size = 0, os.path.getsize(path)
    with open(path, "rb") as f:
        while f.tell() < size:
            header = f.read(12)
            if len(header) < 12:
                raise ValueError("it ends inside a record header")
            end = f.tell() + struct.unpack("<Q", header[:8])[0] + 4
            if end > size:
                raise ValueError(f"it ends inside record {n + 1}")
            f.seek(end)
            n += 1
    return n


def damage(path: str, manifest: Optional[dict] = None) -> Optional[str]:
    """What is wrong with a TFRecord file against its manifest (``path.json``: record count, size and CRC32
    recorded when it was written), or None when it is whole. A manifest of an older writer without size and CRC:
    every record read back by TensorFlow (which checks each record's CRC32C) and counted."""
    m = manifest if manifest is not None else read_manifest(path)
    if not m:
        return "no manifest"
    try:
        st = os.stat(path)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    identity = (st.st_size, st.st_mtime_ns, st.st_ino, m.get("crc32"), m.get("count"))
    if _WHOLE.get(path) == identity:
        return None
    if "bytes" in m and st.st_size != m["bytes"]:
        how = "truncated" if st.st_size < m["bytes"] else "changed"
        return f"{st.st_size:,} bytes, {m['bytes']:,} when written ({how})"
    if "crc32" in m and file_crc32(path) != m["crc32"]:
        return "its CRC32 differs from the one recorded when it was written (corrupted bytes)"
    try:
        count = count_records(path)
    except ValueError as e:
        return f"broken record framing: {e}"
    if count != m.get("count"):
        return f"{count:,} records, {m.get('count')} when written"
    if "crc32" not in m:
        import tensorflow as tf

        try:
            tf.data.TFRecordDataset(path).reduce(0, lambda k, _: k + 1).numpy()
        except tf.errors.DataLossError as e:
            return f"a record fails its CRC ({str(e).strip().splitlines()[0][:120]})"
    _WHOLE[path] = identity
    return None


def is_valid_cache(path: str, meta: Optional[dict]) -> bool:
    """True when ``path`` has a complete manifest whose meta equals ``meta`` and the file is whole (``damage``).
    A damaged file with the right meta: a WARNING naming it and False (its manifest removed, so the caller
    rebuilds it from the source data), or, when its directory cannot be written, a ValueError in one line."""
    m = read_manifest(path)
    if not (bool(m) and os.path.isfile(path) and m.get("meta") == json.loads(json.dumps(meta or {}))):
        return False
    problem = damage(path, m)
    if problem is None:
        return True
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{path}: damaged cached records ({problem}) in a read-only directory: rebuild them in a "
                         f"--cache_dir (pretraining: --record_dir) this run can write")
    log.warning("%s: damaged cached records (%s): rebuilding them from the source data", path, problem)
    os.remove(manifest_path(path))
    return False


def cached_tfrecords(path: str, build: Callable[[], Iterable[Mapping[str, object]]], spec: FeatureSpec,
                     meta: Optional[dict] = None, total: Optional[int] = None, desc: str = "writing",
                     progress: bool = True) -> int:
    """Writes ``path`` from ``build()`` unless a valid cache with the same meta exists; returns the count."""
    if is_valid_cache(path, meta):
        return int(read_manifest(path)["count"])
    return write_tfrecords(path, build(), spec, meta=meta, total=total, desc=desc, progress=progress)


def parse_spec(spec: FeatureSpec):
    import tensorflow as tf

    out = {}
    for name, (dtype, shape) in spec.items():
        tf_dtype = {"int64": tf.int64, "float32": tf.float32, "string": tf.string}[dtype]
        out[name] = tf.io.FixedLenFeature(list(shape), tf_dtype)
    return out


def make_dataset(paths: Sequence[str] | str, spec: FeatureSpec, batch_size: int, is_training: bool,
                 seed: Optional[int] = None, shuffle_buffer: int = 10000, drop_remainder: Optional[bool] = None,
                 repeat: Optional[bool] = None, int32: bool = True, input_context=None,
                 dynamic: Optional[str] = None, length_multiple: Optional[int] = None):
    """TFRecords -> tf.data of dict batches (int64 features cast to int32 when ``int32``).

    ``input_context`` (a ``tf.distribute.InputContext``) shards files/records per input pipeline.
    ``dynamic`` ("left" or "right": the side one-window records are padded on; classification and RACE pad on
    the left, SQuAD on the right): each batch padded to its own longest example, and in training the examples
    grouped by length first (``data.lengths``), lengths rounded up to ``length_multiple`` (required then); None:
    every batch keeps the records' ``max_seq_length``.
    """
    import tensorflow as tf

    if dynamic not in (None, "left", "right"):
        raise ValueError(f"dynamic: expected None, 'left' or 'right', got {dynamic!r}")
    if dynamic and not length_multiple:
        raise ValueError("make_dataset: dynamic batches need a length_multiple")
    if isinstance(paths, str):
        paths = sorted(glob.glob(paths)) or [paths]
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"TFRecord file not found: {p}")
    features = parse_spec(spec)
    ds = tf.data.TFRecordDataset(list(paths))
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if is_training if repeat is None else repeat:
        ds = ds.repeat()
    if is_training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    def _parse(serialized):
        ex = tf.io.parse_single_example(serialized, features)
        if int32:
            ex = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in ex.items()}
        return ex

    ds = ds.map(tf.autograph.experimental.do_not_convert(_parse), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    drop_remainder = is_training if drop_remainder is None else drop_remainder
    left = dynamic == "left"
    if dynamic and is_training:
        ds = lengths.length_buckets(ds, batch_size, spec["input_ids"][1][-1], length_multiple,
                                    drop_remainder=drop_remainder, left=left)
    else:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        if dynamic:
            ds = ds.map(tf.autograph.experimental.do_not_convert(
                lambda b: lengths.trim_batch(b, left, length_multiple)))
    return ds.prefetch(tf.data.AUTOTUNE)

