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
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        yield tmp
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
