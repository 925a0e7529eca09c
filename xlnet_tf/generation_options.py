"""The options of a generation (``GenerationOptions``), apart from the loop (``xlnet_tf/generation.py``) so that
``generate.py`` reads their defaults for its flags without importing TensorFlow."""

from __future__ import annotations

import dataclasses
from typing import Optional


# Prompts per batch of ``Generator.generate``, and the pieces of a prompt the export keeps (its last ones).
BATCH_SIZE = 8
MAX_PROMPT_LENGTH = 512


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """``max_new_tokens``; ``do_sample`` (False: greedy); sampling: ``temperature`` > 0, ``top_k`` (0 = off),
    ``top_p`` in (0, 1] (1 = off), ``seed``; ``eos_id`` (None: never stop early) and ``pad_id`` (after eos; the
    defaults are the released spiece.model's </s> and <pad>);
    ``mem_len``: None keeps all memory, m >= 1 keeps the last m positions (HF's ``config.mem_len = m + 2``)."""
    max_new_tokens: int = 20
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    eos_id: Optional[int] = 2
    pad_id: int = 5
    mem_len: Optional[int] = None

    def __post_init__(self):
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
            ("temperature", self.temperature > 0, "> 0"),
            ("top_k", self.top_k >= 0, ">= 0 (0 = off)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1] (1 = off)"),
            ("mem_len", self.mem_len is None or self.mem_len >= 1, ">= 1 or None (keep all)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")
