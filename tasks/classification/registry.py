"""Classification tasks by name: GLUE (tasks/classification/glue.py) and the text-classification sets
(tasks/classification/text.py)."""

from __future__ import annotations

from typing import Callable, Dict, List

from xlnet_tf.tasks.classification import glue
from xlnet_tf.tasks.classification import text as text_classification
from xlnet_tf.tasks.classification.reader import ClassificationTask


def _registry() -> Dict[str, Callable[..., ClassificationTask]]:
    return {**glue.TASKS, **text_classification.TASKS}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def task_names() -> List[str]:
    return sorted(_registry())


def get_task(name: str, **options) -> ClassificationTask:
    """Task by name (case-insensitive, '-'/'_' optional). ``options`` configure ``generic`` only."""
    reg = _registry()
    by_key = {_key(k): k for k in reg}
    if _key(name) not in by_key:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(reg))}")
    canonical = by_key[_key(name)]
    if options and canonical != "generic":
        raise ValueError(f"task {canonical!r} takes no options (got {sorted(options)}); only 'generic' does")
    return reg[canonical](**options)
