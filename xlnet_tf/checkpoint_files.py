"""A training run's files in its model directory: checkpoints written whole (a failed save leaves no partial
files), the newest one that reads whole to resume from (damaged newer ones passed over), and the history of every
update (``train_history.json``)."""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import shutil
import time
from typing import Optional

import tensorflow as tf

from xlnet_tf.fileutil import atomic_write, write_json
from xlnet_tf.tf_checkpoint import CheckpointError, check_readable

log = logging.getLogger("xlnet_tf.training")

HISTORY_FILE = "train_history.json"  # in model_dir: [[step, loss], ...] of every update of the run


def write_history(path: str, history) -> None:
    """Writes [[step, loss], ...]; entries of an earlier (interrupted) process before this one's first step are
    kept, so a resumed run's file holds all its steps. Nothing to write (a rerun with every step done) keeps
    the file."""
    if not history:
        return
    old = []
    if os.path.isfile(path):
        try:
            with open(path) as f:
                old = [h for h in json.load(f) if h[0] < history[0][0]]
        except (OSError, ValueError):
            old = []

    write_json(path, old + [[int(s), float(l)] for s, l in history], newline=False)


def resume_point(model_dir: str) -> Optional[str]:
    """The newest checkpoint of ``model_dir`` that reads whole (``check_readable``), None when there is
    none; damaged newer ones are passed over with a WARNING naming each (a rerun then redoes their steps and
    writes them again). Refuses (``CheckpointError``) when every checkpoint is damaged."""
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None or not state.model_checkpoint_path:
        return None
    paths = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    damaged = []
    for path in reversed(paths):  # newest first
        try:
            check_readable(path)
        except CheckpointError as e:
            damaged.append(str(e))
            continue
        for problem in damaged:
            log.warning("%s; resuming from the previous checkpoint that reads whole, %s", problem,
                        os.path.basename(path))
        return path
    raise CheckpointError(f"{damaged[0]}" + (f" (and {len(damaged) - 1} earlier checkpoint(s) are damaged too)"
                                             if len(damaged) > 1 else "")
                          + f"; no checkpoint in {model_dir} reads whole: remove them to train from the start, or "
                            "use a new output directory")


def save(manager: tf.train.CheckpointManager, number: int, directory: str) -> str:
    """``manager.save`` as checkpoint ``number``; a failed save (a full disk, Ctrl-C) removes what it wrote first
    and puts back the directory's ``checkpoint`` file as it was (the manager names the new checkpoint there before
    its cleanup, so a Ctrl-C in between would leave it naming removed files); a full disk: OSError ENOSPC naming
    the checkpoint."""
    started = time.time()
    state_file = os.path.join(directory, "checkpoint")
    state = _read(state_file)
    try:
        return manager.save(checkpoint_number=number)
    except BaseException as e:  # a full disk (or Ctrl-C) mid-write: no partial checkpoint stays behind
        written = remove_partial(directory, number, started)
        if _read(state_file) != state:
            if state is None:
                os.remove(state_file)
            else:
                with atomic_write(state_file, "wb") as f:
                    f.write(state)
        if isinstance(e, Exception) and (getattr(e, "errno", None) == errno.ENOSPC
                                         or "No space left on device" in str(e)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          f"checkpoint {written} (its partial files removed)") from None
        raise


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def remove_partial(directory: str, number: int, started: float) -> str:
    """Removes what a failed save of checkpoint ``number`` wrote: TensorFlow's ``ckpt-N_temp`` directory and
    any ``ckpt-N.*`` file written since ``started``; returns the checkpoint's prefix."""
    prefix = os.path.join(directory, f"ckpt-{number}")
    for path in glob.glob(glob.escape(prefix) + "_temp*"):
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    for path in glob.glob(glob.escape(prefix) + ".*"):
        try:
            if os.path.getmtime(path) >= started - 1:
                os.remove(path)
        except OSError:
            pass
    return prefix
