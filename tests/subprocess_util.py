"""Test helpers for child processes: wait for one (on timeout kill it and fail with its stderr tail); run code in
a serving host, a Python that imports only numpy, TensorFlow and tensorflow_text and never the project."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from typing import Optional, Tuple

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


# The modules a SavedModel must not need: the project's own (and the tokenizer and reference stacks it uses).
PROJECT_MODULES = ("xlnet_tf", "heads", "tasks", "data", "sentencepiece", "torch", "transformers")

# The serving host: one Python per test worker, started on first use, that runs each test's serving code in a
# namespace of its own (``json``, ``sys``, ``np``, ``tf`` bound) after changing to the test's directory, and
# replies with one JSON line: {} or {"error": ...}. What the code prints goes to the host's log (fd 1 is the log;
# the replies have a descriptor of their own).
_HOST = r"""
import gc, json, os, sys, traceback
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
import numpy as np, tensorflow as tf, tensorflow_text  # noqa: F401
project = set(json.loads(sys.argv[1]))
for line in sys.stdin:
    request = json.loads(line)
    try:
        os.chdir(request["cwd"])
        exec(compile(request["code"], "<served code>", "exec"), {"json": json, "sys": sys, "np": np, "tf": tf})
        used = sorted(project & {m.split(".")[0] for m in sys.modules})
        reply = {"error": f"the served code needed the project's modules {used}"} if used else {}
    except BaseException:
        reply = {"error": traceback.format_exc()}
    gc.collect()  # the loaded SavedModels' resources go with the request
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


class _Host:
    proc: Optional[subprocess.Popen] = None
    log = None

    @classmethod
    def run(cls, code: str, cwd, timeout: float) -> None:
        if cls.proc is None or cls.proc.poll() is not None:
            cls.stop()
            cls.log = tempfile.TemporaryFile("w+")
            cls.proc = subprocess.Popen([sys.executable, "-c", _HOST, json.dumps(PROJECT_MODULES)], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=cls.log,
                                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=tempfile.gettempdir())
        proc, start = cls.proc, cls.log.seek(0, os.SEEK_END)
        try:
            proc.stdin.write(json.dumps({"code": code, "cwd": str(cwd)}) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout)
        except BrokenPipeError:  # the host had died
            ready = [proc.stdout]
        line = proc.stdout.readline() if ready else ""
        cls.log.seek(start)
        log = cls.log.read()[-3000:]
        if not line:
            cls.stop()
        assert line, f"the serving host {'timed out after %ss' % timeout if not ready else 'died'}:\n{log}"
        reply = json.loads(line)
        if "error" in reply:
            cls.stop()  # the next test gets a host that has run nothing that failed
        assert "error" not in reply, reply["error"][-3000:] + "\n" + log

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None:
            if cls.proc.poll() is None:
                cls.proc.kill()
            cls.proc.communicate()  # (closes the pipes)
            cls.log.close()
        cls.proc = None


atexit.register(_Host.stop)


def run_like_a_server(code: str, cwd, timeout: float = 300) -> None:
    """Runs ``code`` in the serving host, a Python that imports only numpy, tensorflow and tensorflow_text (``json``,
    ``sys``, ``np``, ``tf`` are bound) and has never imported the project, in ``cwd``; then checks the code did not
    import the project either (``PROJECT_MODULES``). Fails the test with the error and the host's log otherwise.
    One host serves every test of a worker, as one serving process loads many SavedModels: what each test proves
    (its SavedModel answers without the project's code) holds without a TensorFlow start per test."""
    _Host.run(code, cwd, timeout)
