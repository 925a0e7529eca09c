"""The entry points called in the test's own process, through the same ``main(argv)`` a process runs
(``run_main``): a refusal costs milliseconds instead of a Python start and a TensorFlow import, and a run's log is
read as the user would read it. A subprocess stays where the process is the point (exit codes, Ctrl-C, kill -9,
logical CPU devices, a fresh process loading a SavedModel)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from typing import Any, Optional

from tests.conftest import REPO


@dataclasses.dataclass
class Outcome:
    code: int
    error: Optional[str]  # the error: line's text
    stderr: str  # the log and the error line, as a process would print them
    stdout: str
    value: Any = None  # what the job returned


def call(module, *args, cwd: Optional[str] = None) -> Outcome:
    """``module.main([script] + args)`` in this process (``cwd``: run from that directory); its stdout and stderr
    captured."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd or REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = module.main([os.path.basename(module.__file__)] + [str(a) for a in args])
    finally:
        os.chdir(here)
    return Outcome(result.code, result.error, err.getvalue(), out.getvalue(), result.value)


def succeeds(module, *args, **kw) -> Outcome:
    """``call`` that must exit 0 (fails the test with the run's log tail otherwise)."""
    r = call(module, *args, **kw)
    assert r.code == 0, f"{module.__name__} exited {r.code}: {r.error}\n{r.stderr[-4000:]}"
    return r


def refused(module, *args, **kw) -> str:
    """``call`` that must be refused: exit code 2, one ``error:`` line and no traceback; returns the line."""
    r = call(module, *args, **kw)
    assert r.code == 2, f"{module.__name__} exited {r.code}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [f"error: {r.error}"], r.stderr[-3000:]
    return lines[0]
