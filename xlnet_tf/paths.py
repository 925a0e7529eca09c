"""What a forward pass runs: the plain math, or the speed paths ``config.accelerate`` names.

The model's files (``modeling.py`` -> ``block.py`` -> ``attention.py``, ``feedforward.py``) hold the math as plain
TensorFlow ops and take their speed paths as a ``Paths``, handed in through each call's ``LayerInputs``:

* ``ops``: the elementwise ops table (``ops.PLAIN``, or ``xlnet_tf.accel.fusions.FUSED``: the same functions as
  XLA clusters with hand-written gradients);
* ``core``: the attention core, a function with ``attention.rel_attn_core``'s signature (None: that function;
  else a fused and/or query-chunked one from ``xlnet_tf.accel``);
* ``kernel``: the compiled attention ops (``xlnet_tf.accel.fused_attention``), which take the keys in their own
  layout, or None; ``chunk``: the query-chunk rows the attention dropout masks are drawn in (0: one piece).

``xlnet_tf/path_choice.py`` is the one place the plain model meets ``xlnet_tf.accel`` (this module, which the
attention layer imports for the type, imports nothing of it: no import circle).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from xlnet_tf import ops


@dataclasses.dataclass(frozen=True)
class Paths:
    ops: ops.OpsTable = ops.PLAIN
    core: Optional[Callable] = None
    kernel: Optional[object] = None
    chunk: int = 0
    why: str = "the plain math (accelerate=False)"


PLAIN = Paths()
