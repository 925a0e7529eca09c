"""How every entry point runs: its own flags parsed, the job, and one ``error:`` line with an exit code.

Each script is three functions and a guard::

    def define_flags(fv): ...                 # run_flags.Definer(fv, section) ... (nothing at import)
    def job(F): ...                           # the work, from the parsed flags
    def main(argv=None) -> run_main.Exit:
        return run_main.main(argv, define_flags, job, __doc__)
    if __name__ == "__main__":
        run_main.exit(main())

``main(argv)`` is the same code path in a process and in a caller's process (tests call it with a list of
arguments and read ``Exit.code`` and ``Exit.error``): a fresh ``FlagValues`` per call, so it runs any number of
times; what a run holds (its output directory's lock) is released when it returns.

Exit codes: 0 done; 2 a refusal (bad flag, bad input, a conflicting run, no space left), with ONE line
``error: ...`` on stderr and no traceback; 3 ``--fail_if_unhealthy`` and the run is not learning (its results
were written; the line is the health warning: ``tasks.health.NotLearning``); 130 Ctrl-C (the line says where the
run resumes). Anything else is a bug: in a process its traceback and exit code 1; in-process the exception
propagates to the caller.

Process settings made here, before TensorFlow is imported (a user's own setting wins): ``TF_ENABLE_ONEDNN_OPTS=1``
(oneDNN doubles float32 matmul speed on the AMD CPUs measured, where TensorFlow leaves it off) and
``TF_CPP_MIN_LOG_LEVEL=3`` (TensorFlow's C++ start-up lines, such as ``failed call to cuInit`` on a CPU-only
host, are not errors of the run; set it to 0 to see them).
"""

from __future__ import annotations

import dataclasses
import errno
import faulthandler
import gc
import io
import logging
import os
import signal
import sys
import tempfile
import textwrap
import threading
from typing import Any, Callable, Optional, Sequence

from absl import flags

import run_flags
import run_state
from xlnet_tf.tasks.health import NotLearning

_QUIET_TF = "TF_CPP_MIN_LOG_LEVEL" not in os.environ  # the user did not ask for TensorFlow's C++ lines
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HELP = ("--help", "-h", "--helpfull", "--helpshort", "-?")
# What a refusal is: bad input of every kind (tasks.errors.DataError and xlnet_tf.checkpoint.CheckpointError are
# ValueErrors too), a missing file, another run in the way.
REFUSALS = (ValueError, FileNotFoundError)
UNHEALTHY = 3  # --fail_if_unhealthy: the run finished, not learning (tasks.health.NotLearning)


@dataclasses.dataclass(frozen=True)
class Exit:
    """How a call of an entry point ended: ``code`` (0, 2, 3 or 130), ``error`` (the ``error:`` line's text, None
    when it succeeded) and ``value`` (what the job returned)."""
    code: int
    error: Optional[str] = None
    value: Any = None


def main(argv: Optional[Sequence[str]], define: Callable[[flags.FlagValues], None],
         job: Callable[[flags.FlagValues], Any], doc: str = "", required: Sequence[str] = ("output_dir",)) -> Exit:
    """Parses ``argv`` (``sys.argv`` when None; ``argv[0]`` is the program) into the flags ``define`` declares,
    then runs ``job(flags)``: see the module docstring for what it returns and prints."""
    argv = list(sys.argv if argv is None else argv)
    fv = flags.FlagValues()
    define(fv)
    if any(a in HELP for a in argv[1:]):
        try:
            print(usage(os.path.basename(argv[0]), doc, fv))
        except BrokenPipeError:  # --help | head
            pass
        return Exit(0)
    try:
        fv(argv)
        missing = [name for name in required if fv[name].value is None]
        if missing:
            raise ValueError(f"--{missing[0]} is required (python {os.path.basename(argv[0])} --help lists the flags)")
        run_flags.settle(fv)
    except (flags.Error, ValueError) as e:
        return _refuse(str(e))
    setup_logging()
    import_tensorflow()

    interrupted = finished = False
    opened = open_descriptors()
    try:
        value = job(fv)
        finished = True
        return Exit(0, value=value)
    except KeyboardInterrupt as e:
        interrupted = True
        return _refuse(interrupted_message(e), 130)
    except NotLearning as e:
        return _refuse(str(e), UNHEALTHY)
    except REFUSALS as e:
        return _refuse(str(e))
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        return _refuse(f"no space left on device writing {e.filename or 'the output'}; the last complete "
                       f"checkpoint and export are kept: free space and run again to resume")
    except Exception as e:  # TensorFlow's own writers report a full disk as an OpError
        if "No space left on device" not in str(e):
            raise
        return _refuse(f"no space left on device ({str(e).strip().splitlines()[0][:200]}); the last complete "
                       f"checkpoint and export are kept: free space and run again to resume")
    finally:
        run_state.release_held()
        # A failed job's objects may hold files open from reference cycles of its frames: collected here when the
        # job left a file descriptor open (a full collection costs 0.2-0.5 s in a fresh process, more in a long-lived
        # one; a finished job lets go of its input files itself), except after Ctrl-C, where collecting would
        # finalise a summary writer the interrupt may have stopped mid-write (closing such a writer was seen to
        # block for minutes).
        if not finished and not interrupted and sys.exc_info()[0] is None and left_open(opened):
            gc.collect()


def open_descriptors() -> Optional[set]:
    """This process's open file descriptors with what each one names (None where the system does not list them)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    found = set()
    for name in names:
        try:
            found.add((name, os.readlink(f"/proc/self/fd/{name}")))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            pass
    return found


def left_open(before: Optional[set]) -> bool:
    """Whether a descriptor open now was not open at ``before`` (True where descriptors cannot be listed)."""
    now = open_descriptors()
    return before is None or now is None or not now <= before


def import_tensorflow() -> None:
    """Imports TensorFlow once, after the flags were checked. Unless the user set ``TF_CPP_MIN_LOG_LEVEL``, the
    lines its C++ start-up writes to stderr before its log level applies (oneDNN and CUDA notes) are held back,
    and shown only if the import fails."""
    if "tensorflow" in sys.modules:
        return
    if not _QUIET_TF:
        import tensorflow  # noqa: F401
        return

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def exit(result: Exit) -> None:  # noqa: A001 (the process's end, as sys.exit)
    sys.exit(result.code)


def _refuse(message: str, code: int = 2) -> Exit:
    message = " ".join(message.split("\n")) if message else "failed"
    print(f"error: {message}", file=sys.stderr, flush=True)
    return Exit(code, message)


def interrupted_message(e: KeyboardInterrupt) -> str:
    """Ctrl-C: where the run resumes from (``training.Interrupted`` carries the step and the last checkpoint)."""
    step = getattr(e, "step", None)
    if step is None:
        return "interrupted; finished checkpoints, features and outputs are kept: rerun the same command to go on"
    if e.checkpoint_step is None:
        return (f"interrupted at step {step}, before the first checkpoint in {e.model_dir}: rerun the same command "
                f"to start the training again")
    return (f"interrupted at step {step}; the last checkpoint is step {e.checkpoint_step} in {e.model_dir}: rerun "
            f"the same command to resume")


# ---------------------------------------------------------------------------------------------- logging
class _Stderr(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (a caller's redirection is honoured)."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


_FORMAT = "%(levelname).1s%(asctime)s %(name)s] %(message)s"  # W1126 10:22:39 run] ... (absl's shape)


def setup_logging() -> None:
    """INFO and above of every logger to stderr, one line each, installed once per process; in a process (not a
    caller's thread) ``kill -USR1 PID`` writes every thread's Python stack to stderr, for a run that seems stuck."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
        except (AttributeError, ValueError, io.UnsupportedOperation):  # stderr is not a file (a captured stream)
            pass
    root = logging.getLogger()
    if not any(isinstance(h, _Stderr) for h in root.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m%d %H:%M:%S"))
        root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


# ---------------------------------------------------------------------------------------------- --help
def _shown(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "empty"
    return repr(value) if isinstance(value, str) else str(value)


def usage(prog: str, doc: str, fv: flags.FlagValues) -> str:
    """``--help``: the script's docstring, then every flag of its job by section, with its default."""
    lines = [doc.strip(), "", f"Flags of {prog} (python {prog} --flag=value ...; --noflag for a false boolean):"]
    sections = {}
    for name in fv:
        flag = fv[name]
        if name != flag.name:  # a short name
            continue
        sections.setdefault(getattr(flag, "section", "Other"), []).append(flag)
    for title, group in sections.items():
        lines += ["", f"{title}:"]
        for flag in group:
            head = f"  --{'[no]' if flag.boolean else ''}{flag.name}"
            default = _shown(flag.default)
            text = f"{flag.help} (default: {default})"
            lines.append(head)
            lines += textwrap.wrap(text, width=110, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)
