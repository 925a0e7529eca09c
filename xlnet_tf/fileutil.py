"""Atomic writes: a file or a whole directory is built under a temporary name beside the target (carrying the
writer's pid, so a dead writer's leftovers are recognisable), then renamed over it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator[IO]:
    """Yields a file open on ``path.tmp-PID``; it replaces ``path`` when the block succeeds, else it is removed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, obj, newline: bool = True, **dump_options) -> None:
    """``json.dump(obj, **dump_options)`` into ``path`` atomically (plus a final newline)."""
    with atomic_write(path) as f:
        json.dump(obj, f, **dump_options)
        if newline:
            f.write("\n")


@contextlib.contextmanager
def atomic_directory(directory: str) -> Iterator[str]:
    """Yields a temp directory; when the block succeeds it replaces ``directory``, else it is removed.

    An earlier ``directory`` is only moved aside (then deleted) once the new one is complete, so an interrupted
    or failed write never leaves a half-written directory at the final path.
    """
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=parent)  # the pid: a dead run's leftover is known
    try:
        yield tmp
        normal_permissions(tmp)
        old = None
        if os.path.exists(directory):
            old = tempfile.mkdtemp(prefix=".old-", dir=parent)
            os.rmdir(old)
            os.replace(directory, old)
        os.replace(tmp, directory)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def normal_permissions(top: str) -> None:
    """Gives ``top`` and everything under it the permissions the umask grants new files (mkdtemp makes 0700
    directories, which a server running as another user could not read)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(top, 0o777 & ~umask)
    for root, dirs, files in os.walk(top):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~umask)
        for f in files:
            path = os.path.join(root, f)
            os.chmod(path, (0o777 if os.access(path, os.X_OK) else 0o666) & ~umask)
