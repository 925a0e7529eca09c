"""Test helper: wait for a child process; on timeout kill it and fail with its stderr tail."""

from __future__ import annotations

import subprocess
from typing import Tuple

import pytest


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
