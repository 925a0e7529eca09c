"""What a training run shows while it runs: the progress line and TensorBoard scalars."""

from __future__ import annotations

import math
import sys
import time

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def write_scalar(name: str, value: float, step: int) -> None:
    """A TensorBoard scalar via core ``tf.summary.write`` (``tf.summary.scalar`` needs the tensorboard package)."""
    tf.summary.write(name, tf.constant(float(value), tf.float32), step=step, metadata=_SCALAR_METADATA)



class Progress:
    """Single carriage-return line on a tty, plain lines every ``log_steps`` otherwise."""

    def __init__(self, total: int, log_steps: int, stream=None):
        self.total, self.log_steps, self.stream = total, max(int(log_steps), 1), stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, step: int, loss: float, lr: float, steps_per_sec: float) -> None:
        if not self.tty and step % self.log_steps and step != self.total:
            return
        eta = (self.total - step) / steps_per_sec if steps_per_sec > 0 else float("nan")
        eta_s = "?" if math.isnan(eta) else time.strftime("%H:%M:%S", time.gmtime(eta))
        width = len(str(self.total))
        line = (f"step {step:>{width}}/{self.total} loss {loss:.4f} lr {lr:.3e} "
                f"{steps_per_sec:.2f} steps/s ETA {eta_s}")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if step == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
