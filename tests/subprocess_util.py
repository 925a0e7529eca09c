"""Test helpers for child processes: wait for one (on timeout kill it and fail with its stderr tail); run code
in a fresh Python that imports only TensorFlow and tensorflow_text, as a serving host does."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Tuple

import pytest


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a child the test interrupts with SIGINT: Ctrl-C's default action, even when the suite
    runs as a shell's background job (which starts with SIGINT ignored, and Python keeps an ignored SIGINT, so
    the child would never see the Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, timeout: float) -> Tuple[str, str]:
    """(stdout, stderr) of ``proc``; fails the test if it times out or exits non-zero."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"subprocess timed out after {timeout}s\n{err[-3000:]}")
    assert proc.returncode == 0, err[-4000:]
    return out, err


def run_like_a_server(code: str, cwd, timeout: float = 300) -> None:
    """Runs ``code`` in a fresh Python with only numpy, tensorflow and tensorflow_text imported (``json``,
    ``sys``, ``np``, ``tf`` are bound), then checks it never imported the project (``xlnet_tf``, ``heads``); fails
    the test with the child's stderr tail otherwise."""
    script = ("import json, sys, numpy as np, tensorflow as tf, tensorflow_text\n" + code +
              "\nassert 'xlnet_tf' not in sys.modules and 'heads' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=str(cwd), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
