"""Files: atomic writes (a file or a whole directory is built under a temporary name beside the target, carrying
the writer's pid so a dead writer's leftovers are recognisable, then renamed over it) and the two identities of
a source: ``stat_identity`` (size and mtime, what caches of derived files record) and ``content_hash`` (the
bytes, what a run's manifest records).

**We delete only what we wrote.** A directory writer names what it writes (a ``Written``: the names every one of
its directories holds, and every top-level name it may hold); ``atomic_directory`` replaces an existing directory
only when it is empty or one of that writer's own (``check_replaceable``), else refuses in one line naming the
directory and the first entry that is not the writer's, before any work."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from typing import IO, FrozenSet, Iterator


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields ``path.tmp-PID`` for a writer that takes a path (a TFRecordWriter, ``np.savez``); it replaces
    ``path`` when the block succeeds, else it is removed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator[IO]:
    """Yields a file open on ``path.tmp-PID`` (see ``atomic_path``)."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f


def write_json(path: str, obj, newline: bool = True, **dump_options) -> None:
    """``json.dump(obj, **dump_options)`` into ``path`` atomically (plus a final newline)."""
    with atomic_write(path) as f:
        json.dump(obj, f, **dump_options)
        if newline:
            f.write("\n")


@dataclasses.dataclass(frozen=True)
class Written:
    """What one directory writer writes: ``what`` names it in messages ("SavedModel export"); ``marks``: the
    names every directory it writes holds; ``names``: every top-level name it may hold (marks included)."""
    what: str
    marks: FrozenSet[str]
    names: FrozenSet[str]

    def __post_init__(self):
        object.__setattr__(self, "marks", frozenset(self.marks))
        object.__setattr__(self, "names", frozenset(self.names) | frozenset(self.marks))

    def holds_only_ours(self, directory: str) -> bool:
        entries = set(os.listdir(directory))
        return not entries or (self.marks <= entries and entries <= self.names)


# A SavedModel export (tf.saved_model.save's names, and what the export adds beside them).
SERVING_INFO = "serving_info.json"
SAVED_MODEL = Written("SavedModel export", marks={"saved_model.pb", SERVING_INFO},
                      names={"variables", "assets", "assets.extra", "fingerprint.pb"})


def check_replaceable(directory: str, written: Written, *also: Written) -> None:
    """Refuses (ValueError, one line) to write ``written`` at ``directory`` when something there is not an earlier
    one of its own (or of ``also``, the same writer's other formats): a file, or a directory holding anything but
    an earlier directory of these writers (or nothing). Called before the work, so a refusal costs nothing and
    loses nothing."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise ValueError(f"{directory}: exists and is not a directory; the {written.what} writes a directory "
                         f"there: remove it or choose another path")
    if any(w.holds_only_ours(directory) for w in (written,) + also):
        return
    entries = sorted(os.listdir(directory))
    names = frozenset().union(*(w.names for w in (written,) + also))
    foreign = [e for e in entries if e not in names]
    missing = sorted(written.marks - set(entries))
    why = (f"holds {foreign[0]!r}" + (f" (+{len(foreign) - 1} more)" if len(foreign) > 1 else "")
           + f", which no {written.what} writes") if foreign else \
        f"is not an earlier {written.what} (no {missing[0]})"
    raise ValueError(f"{directory}: {why}; it would be replaced whole, so nothing is written: choose a new or "
                     f"empty directory, or remove it yourself")


@contextlib.contextmanager
def atomic_directory(directory: str, written: Written, *also: Written) -> Iterator[str]:
    """Yields a temp directory; when the block succeeds it replaces ``directory``, else it is removed.

    ``directory`` must be absent, empty or an earlier directory of the same writer (``written``, or ``also``:
    ``check_replaceable``, checked before the block runs). An earlier one is only moved aside (then deleted) once the new one is complete, so an
    interrupted or failed write never leaves a half-written directory at the final path.
    """
    check_replaceable(directory, written, *also)
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=parent)  # the pid: a dead run's leftover is known
    try:
        yield tmp
        normal_permissions(tmp)
        old = None
        if os.path.exists(directory):
            check_replaceable(directory, written, *also)  # (still ours: nothing was added while we wrote)
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


def stat_identity(path: str) -> dict:
    """A source file or directory as a cache records it, to notice an edit without reading it: the absolute path,
    the bytes and the latest mtime (ns); for a directory the totals over its files (walked) and their count."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        st = os.stat(path)
        return {"path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    files = size = mtime = 0
    for root, _, names in os.walk(path):
        for name in names:
            st = os.stat(os.path.join(root, name))
            files, size, mtime = files + 1, size + st.st_size, max(mtime, st.st_mtime_ns)
    return {"path": path, "files": files, "bytes": size, "mtime_ns": mtime}


def content_hash(path: str) -> str:
    """sha256 of a file's bytes, or of a directory's relative paths and file bytes (sorted walk)."""
    h = hashlib.sha256()
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                h.update(os.path.relpath(full, path).encode("utf-8") + b"\0")
                _hash_file(full, h)
    else:
        _hash_file(path, h)
    return h.hexdigest()


def _hash_file(path: str, h) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
