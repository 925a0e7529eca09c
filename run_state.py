"""One run per output directory, and no silent mixing of runs (used by the run_*.py entry points).

``RunGuard(run_dir, ...)`` is entered before any work:

* **Lock**: ``RUN_DIR/.lock`` held with ``flock`` for the run's life; a second run fails at once naming the
  holder's pid. The kernel releases the lock when its holder dies (kill -9 included), so a dead run never
  blocks the next one; its pid left in the file is reported as taken over.
* **Stale temporaries** of dead runs are removed: ``*.tmp-PID`` files and ``.tmp-PID-*`` directories whose
  process is gone, and TensorFlow's ``ckpt-N_temp`` checkpoint directories (only ever written under the lock).
* **Manifest** ``RUN_DIR/run_manifest.json``: what determines the trained model (script, task, training data
  content fingerprints, tokenizer fingerprint, model config, the flags that change the model or the data).
  A training run that finds a different manifest refuses with one line naming the differing fields and the
  two ways on (``--overwrite_output_dir`` or another output directory); an identical one resumes (a run that
  saved no checkpoint binds nothing: its manifest is replaced). Runs that
  only evaluate, predict or export compare the fields that identify the model (script, task, tokenizer, model
  shape) and write no manifest. ``--overwrite_output_dir`` removes the run's checkpoints and cached features
  first.

``run_manifest(F, ...)`` builds a run's manifest from its parsed flags and ``take_run_dir`` enters the guard for the
rest of the run (``run_common.start_run`` calls both after its checks).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
from typing import Dict, Iterable, Mapping, Optional, Sequence

from xlnet_tf.fileutil import content_hash, stat_identity, write_json

MANIFEST = "run_manifest.json"
LOCK = ".lock"
IDENTITY_KEYS = ("script", "task", "tokenizer", "model_shape")  # what a non-training run must agree on
_TMP_FILE = re.compile(r"\.tmp-(\d+)(\.|$)")
_TMP_DIR = re.compile(r"^\.tmp-(\d+)-")
_CKPT_TEMP = re.compile(r"^ckpt-\d+_temp$")

log = logging.getLogger("run")


class RunConflict(ValueError):
    """Another run holds the directory, or the directory holds another run."""


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directories: Iterable[str]) -> list:
    """Removes dead runs' temporaries in ``directories`` (recursively); returns the removed paths."""
    removed = []
    for top in dict.fromkeys(d for d in directories if d and os.path.isdir(d)):
        for root, dirs, files in os.walk(top):
            for name in list(dirs):
                m = _TMP_DIR.match(name)
                if (m and not _alive(int(m.group(1)))) or _CKPT_TEMP.match(name):
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                    removed.append(os.path.join(root, name))
                    dirs.remove(name)
            for name in files:
                m = _TMP_FILE.search(name)
                if m and not _alive(int(m.group(1))):
                    os.remove(os.path.join(root, name))
                    removed.append(os.path.join(root, name))
    return removed


def _flatten(d: Mapping, prefix: str = "") -> Dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def manifest_differences(old: Mapping, new: Mapping, keys: Optional[Sequence[str]] = None) -> list:
    """Dotted names of the fields that differ (restricted to the top-level ``keys`` when given)."""
    if keys is not None:
        old = {k: old.get(k) for k in keys}
        new = {k: new.get(k) for k in keys}
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))


class RunGuard:
    """Context manager: lock, cleanup, manifest check (see the module docstring).

    ``run_dir``: the directory the run owns (its manifest and lock); ``work_dirs``: the run's checkpoint and
    cache directories (removed by ``overwrite``; cleaned of temporaries); ``temp_dirs``: more directories to
    clean of dead runs' temporaries (e.g. the export's parent)."""

    def __init__(self, run_dir: str, manifest: Mapping, training: bool, overwrite: bool = False,
                 work_dirs: Sequence[str] = (), temp_dirs: Sequence[str] = ()):
        self.run_dir = run_dir
        self.manifest = json.loads(json.dumps(manifest))  # plain JSON types, as read back
        self.training, self.overwrite = training, overwrite
        self.work_dirs, self.temp_dirs = list(work_dirs), list(temp_dirs)
        self._lock = None

    def __enter__(self) -> "RunGuard":
        os.makedirs(self.run_dir, exist_ok=True)
        self._acquire()
        try:
            removed = remove_stale_temporaries([self.run_dir] + self.work_dirs + self.temp_dirs)
            if removed:
                log.warning("removed %d temporaries of a dead run (e.g. %s)", len(removed), removed[0])
            self._check_manifest()
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._release()

    # ------------------------------------------------------------------ lock
    def _acquire(self) -> None:
        path = os.path.join(self.run_dir, LOCK)
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RunConflict(f"{self.run_dir} is in use by another run (pid {holder}); wait for it to finish "
                              f"or pass another --output_dir") from None
        f.seek(0)
        previous = f.read().strip()
        if previous.isdigit() and int(previous) != os.getpid():
            log.warning("took over the lock of %s from a run that is gone (pid %s)", self.run_dir, previous)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock = f

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.seek(0)
            self._lock.truncate()  # an empty lock file: the run ended normally
            self._lock.flush()
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ manifest
    def _check_manifest(self) -> None:
        path = os.path.join(self.run_dir, MANIFEST)
        old = None
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    old = json.load(f)
            except ValueError:
                old = {"unreadable manifest": True}
        if self.overwrite and self.training:
            for d in self.work_dirs:
                self._clear(d)
            old = None
        if old is not None:
            # a key this run leaves out (e.g. pretraining records reused without --train_input) is not compared
            keys = list(self.manifest) if self.training else list(IDENTITY_KEYS)
            diff = manifest_differences(old, self.manifest, keys)
            if diff and self.training and not self._has_checkpoints():
                log.info("%s: replacing the manifest of a run that saved no checkpoint", self.run_dir)
                old, diff = None, []
            if diff:
                shown = ", ".join(diff[:8]) + (f" (+{len(diff) - 8} more)" if len(diff) > 8 else "")
                raise RunConflict(f"{self.run_dir} holds another run (differs in: {shown}); pass "
                                  f"--overwrite_output_dir to replace it, or use a new --output_dir")
        elif self.training and self._has_checkpoints():
            raise RunConflict(f"{self.run_dir} holds checkpoints but no {MANIFEST} (an older or foreign run); "
                              f"pass --overwrite_output_dir to replace it, or use a new --output_dir")
        if self.training:
            write_json(path, {**(old or {}), **self.manifest}, indent=2, sort_keys=True)

    def _clear(self, directory: str) -> None:
        """Removes what a run wrote in ``directory`` (its checkpoints, summaries, history, manifest and cached
        features); anything else there stays (we delete only what we wrote)."""
        if not os.path.isdir(directory):
            return
        names = set(os.listdir(directory))
        for name in names:
            full = os.path.join(directory, name)
            if name == "checkpoint" or name.startswith(("ckpt-", "events.out.tfevents")) or name in (
                    MANIFEST, "train_history.json") or _cached_records(full, names):
                shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)

    def _has_checkpoints(self) -> bool:
        return any(os.path.exists(os.path.join(d, "checkpoint")) for d in self.work_dirs + [self.run_dir])


# ---------------------------------------------------------------------------------------------- the manifest
# Flags that change what a training run learns (besides the model config, the data and the tokenizer).
TRAINING_FLAGS = ("learning_rate", "train_steps", "warmup_steps", "min_lr_ratio", "weight_decay", "adam_epsilon",
                  "adam_bias_correction", "clip", "lr_layer_decay_rate", "layer_decay_mode", "grad_accum_steps",
                  "length_buckets", "precision", "num_trainable_layers", "head_hidden_sizes", "train_batch_size", "seed",
                  "summary_type", "init_checkpoint")


def _checkpoint_identity(path: Optional[str]):
    """The ``stat_identity`` of an init checkpoint's files (hashing gigabytes at every start would be slow)."""
    if not path:
        return None
    files = sorted(os.path.join(path, n) for n in os.listdir(path)) if os.path.isdir(path) else \
        sorted(p for p in (os.path.join(os.path.dirname(path) or ".", n)
                           for n in os.listdir(os.path.dirname(path) or ".")) if p.startswith(path))
    return [stat_identity(p) for p in files if os.path.isfile(p)]


def run_manifest(F, script: str, task: str, config, tokenizer, data: Optional[Dict] = None,
                 train_sources: Optional[Sequence[str]] = ()) -> Dict:
    """The manifest of a run from its parsed flags ``F``: script, task, tokenizer fingerprint, model config, the
    data settings, ``TRAINING_FLAGS`` and (unless ``train_sources`` is None) the training files' fingerprints."""
    manifest = {"script": script, "task": task,
                "tokenizer": {"sha256": content_hash(tokenizer.spiece_model_file), "uncased": bool(F.uncased)},
                "model_shape": config.to_original_dict(), "model": config.to_dict(),
                "data": dict(data or {}),
                "training": {k: (_checkpoint_identity(F.init_checkpoint) if k == "init_checkpoint"
                                 else getattr(F, k)) for k in TRAINING_FLAGS if hasattr(F, k)}}
    if train_sources is not None:
        manifest["train_data"] = {os.path.abspath(p): content_hash(p) for p in train_sources}
    return manifest


_HELD: list = []  # the guards taken by the run under way (run_main releases them when its job returns)


def release_held() -> None:
    """Releases every guard ``take_run_dir`` took (``run_main.main`` calls it when the job ends; a process that
    dies has its locks dropped by the kernel)."""
    while _HELD:
        _HELD.pop().__exit__(None, None, None)


def _cached_records(path: str, names) -> bool:
    """A cached TFRecord file or its manifest (``data/tfrecord_io.py``: ``X`` beside ``X.json`` with its count and
    meta)."""
    name = os.path.basename(path)
    manifest = path if name.endswith(".json") and name[:-5] in names else path + ".json"
    if manifest == path + ".json" and name + ".json" not in names:
        return False
    try:
        with open(manifest, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and {"count", "meta"} <= set(m)


def take_run_dir(F, run_dir: str, manifest: Dict, training: bool, work_dirs: Sequence[str] = ()) -> RunGuard:
    """Enters a ``RunGuard`` on ``run_dir`` (the export directories' parents are swept for stale temporaries too),
    held until ``release_held`` (the end of the entry point's job)."""
    temp_dirs = [os.path.dirname(os.path.abspath(d)) for d in (getattr(F, "export_dir", None),
                                                               getattr(F, "export_huggingface", None)) if d]
    guard = RunGuard(run_dir, manifest, training=training, overwrite=F.overwrite_output_dir,
                     work_dirs=work_dirs, temp_dirs=temp_dirs)
    guard.__enter__()
    _HELD.append(guard)
    return guard
