"""Atomic writes of whole directories: build in a temp dir beside the target, then rename over it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator


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
