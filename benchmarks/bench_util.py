"""Small helpers shared by the benchmark scripts (pure Python: also imported by peer workers in other venvs)."""

from __future__ import annotations

import json
import os
from importlib import metadata
from typing import Dict, Optional, Sequence


def shared_dir() -> str:
    """The real datasets' folder: ``$SHARED_DATA``, else ``../shared/data`` beside the checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.environ.get("SHARED_DATA") or os.path.join(root, "..", "shared", "data")


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


def cpu_flags(names=("amx_bf16", "avx512_bf16", "avx512f", "avx2")) -> list:
    """Which of ``names`` the CPU has (/proc/cpuinfo's flags): the family a figure was measured on."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [n for n in names if n in have]
    except OSError:
        pass
    return []


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


PROTO = "@@"  # prefix of the protocol lines a benchmark worker prints on its stdout


class Worker:
    """One benchmark side in its own process: ``python SCRIPT --worker SPEC_JSON``, spoken to line by line.

    Each side gets a process of its own so that one framework's threads (PyTorch's OpenMP threads spin after
    each op) cannot slow the other's. The worker prints ``@@TAG payload`` lines; ``expect`` returns a payload.
    """

    def __init__(self, script, spec, log, label, python=None, env=None):
        import subprocess
        import sys

        self.spec, self.label = spec, label
        full_env = dict(os.environ)
        full_env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
        full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        full_env.update(env or {})
        self.proc = subprocess.Popen([python or sys.executable, os.path.abspath(script), "--worker",
                                      json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True, bufsize=1, env=full_env,
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def expect(self, tag):
        for line in self.proc.stdout:
            if line.startswith(PROTO + tag + " "):
                return line[len(PROTO) + len(tag) + 1:].strip()
        raise RuntimeError(f"worker {self.label} exited (rc={self.proc.wait()}); see the worker log")

    def send(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def ask(self, cmd, tag):
        self.send(cmd)
        return self.expect(tag)
