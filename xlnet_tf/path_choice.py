"""The one place the plain model meets its speed paths (``xlnet_tf/paths.py`` says what a ``Paths`` holds): a model
whose config names no acceleration never imports ``xlnet_tf.accel``; otherwise ``accel.choose`` decides once per
forward pass what applies, and why. Apart from ``paths.py`` so that the attention layer, which imports ``Paths``,
is not on an import circle through ``accel`` (tests/test_house.py holds the library free of circles)."""

from __future__ import annotations

from xlnet_tf.paths import PLAIN, Paths


def choose(config, dtype, training: bool, per_example_pos_dropout: bool) -> Paths:
    """The paths of one forward pass of ``config``'s model (compute ``dtype``; ``per_example_pos_dropout``:
    dropout on the positional encodings with a mask per example)."""
    if not config.accelerations:
        return PLAIN
    from xlnet_tf import accel

    return accel.choose(config, dtype, training, per_example_pos_dropout)
