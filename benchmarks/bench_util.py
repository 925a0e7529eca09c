"""Small helpers shared by the benchmark scripts (pure Python: also imported by peer workers in other venvs)."""

from __future__ import annotations

import json
import os
from importlib import metadata
from typing import Dict, Optional, Sequence


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("?" when unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def versions(dists: Sequence[str]) -> Dict[str, Optional[str]]:
    """Installed versions of ``dists`` (None when absent)."""
    out: Dict[str, Optional[str]] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def write_json(path: str, obj) -> None:
    """Writes ``obj`` to ``path`` atomically (a temporary file, then a rename) and says so."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
    print(f"wrote {path}")
