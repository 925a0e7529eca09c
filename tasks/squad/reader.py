"""SQuAD v1.1 / v2.0: reading the official json into :class:`SquadExample` records.

Every problem is a :class:`tasks.errors.DataError` naming the file and the json path of the bad field, e.g.
``data[3].paragraphs[2].qas[5].answers[0].answer_start``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from xlnet_tf.tasks.errors import DataError

log = logging.getLogger("squad")


@dataclass
class SquadExample:
    """One question. ``answer_text``/``answer_start`` (characters in ``context``) are the first gold answer
    (the training target); ``answers`` holds every gold text for scoring. ``context_id`` is shared by the
    questions of one paragraph (so the paragraph is tokenised once)."""

    qas_id: str
    question: str
    context: str
    context_id: int
    answer_text: str = ""
    answer_start: int = -1
    is_impossible: bool = False
    answers: List[str] = field(default_factory=list)
    answer_starts: List[int] = field(default_factory=list)
    title: str = ""

    @property
    def answer_end(self) -> int:
        """Exclusive character end of the first gold answer (-1 when impossible)."""
        return self.answer_start + len(self.answer_text) if self.answer_start >= 0 else -1


def _get(obj: Any, key: str, kind, src: str, where: str):
    if not isinstance(obj, dict):
        raise DataError(src, None, f"expected a json object, got {type(obj).__name__}", field=where)
    if key not in obj:
        raise DataError(src, None, "missing field", field=f"{where}.{key}" if where else key)
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DataError(src, None, f"expected {kind.__name__}, got {type(value).__name__}",
                        field=f"{where}.{key}" if where else key)
    return value


def parse_squad(obj: Any, source: str = "<memory>", require_answers: bool = True) -> Tuple[List[SquadExample], str]:
    """Parsed SQuAD json -> (examples, version) with version "1.1" or "2.0" (v2 = any ``is_impossible`` field
    or a version string starting with "v2"/"2"). ``require_answers=False`` accepts unlabelled questions (a test
    set to predict): they get an empty ``answers`` list."""
    data = _get(obj, "data", list, source, "")
    examples: List[SquadExample] = []
    seen = {}
    v2 = str(obj.get("version", "")).lstrip("v").startswith("2")
    context_id = 0
    both = []  # questions marked impossible that carry answers too
    for ai, article in enumerate(data):
        wa = f"data[{ai}]"
        paragraphs = _get(article, "paragraphs", list, source, wa)
        title = article.get("title", "") if isinstance(article.get("title", ""), str) else ""
        for pi, para in enumerate(paragraphs):
            wp = f"{wa}.paragraphs[{pi}]"
            context = _get(para, "context", str, source, wp)
            if not context.strip():
                raise DataError(source, None, "empty context", field=f"{wp}.context")
            for qi, qa in enumerate(_get(para, "qas", list, source, wp)):
                wq = f"{wp}.qas[{qi}]"
                qid = _get(qa, "id", str, source, wq)
                if qid in seen:
                    raise DataError(source, None, f"duplicate question id {qid!r} (first at {seen[qid]})",
                                    field=f"{wq}.id")
                seen[qid] = wq
                question = _get(qa, "question", str, source, wq)
                if not question.strip():
                    raise DataError(source, None, "empty question", field=f"{wq}.question")
                impossible = False
                if "is_impossible" in qa:
                    impossible = _get(qa, "is_impossible", bool, source, wq)
                    v2 = True
                answers = _get(qa, "answers", list, source, wq)
                texts, starts = [], []
                for ni, ans in enumerate(answers):
                    wn = f"{wq}.answers[{ni}]"
                    text = _get(ans, "text", str, source, wn)
                    start = _get(ans, "answer_start", int, source, wn)
                    if not text:
                        raise DataError(source, None, "empty answer text", field=f"{wn}.text")
                    if start < 0 or context[start:start + len(text)] != text:
                        found = context[max(start, 0):max(start, 0) + len(text)]
                        raise DataError(source, None, f"answer {text!r} is not at character {start} of the "
                                        f"context (found {found!r})", field=f"{wn}.answer_start")
                    texts.append(text)
                    starts.append(start)
                if not impossible and not texts and require_answers:
                    raise DataError(source, None, "answerable question without answers", field=f"{wq}.answers")
                if impossible and texts:
                    both.append(f"{wq} (id {qid!r})")
                ex = SquadExample(qas_id=qid, question=question, context=context, context_id=context_id,
                                  is_impossible=impossible, answers=texts, answer_starts=starts, title=title)
                if not impossible and texts:
                    ex.answer_text, ex.answer_start = texts[0], starts[0]
                examples.append(ex)
            context_id += 1
    if both:
        log.warning("%s: %d question(s) have is_impossible: true and answers too (the first: %s): they are trained "
                    "as impossible, as the original, but scored as answerable (the official scorer reads only the "
                    "answers)", source, len(both), both[0])
    return examples, ("2.0" if v2 else "1.1")


def read_squad(path: str) -> List[SquadExample]:
    """Reads a SQuAD v1.1 or v2.0 json file."""
    return read_squad_with_version(path)[0]


def read_squad_with_version(path: str, require_answers: bool = True) -> Tuple[List[SquadExample], str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SQuAD file not found: {path}")
    try:
        with open(path, "r", encoding="utf-8") as f:
            obj = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(path, getattr(e, "lineno", None), f"malformed json: {e}") from e
    return parse_squad(obj, source=path, require_answers=require_answers)


def load_dataset(path: str) -> list:
    """The raw ``data`` list of a SQuAD file (what the official scorers read)."""
    with open(path, "r", encoding="utf-8") as f:
        try:
            obj = json.load(f)
        except ValueError as e:
            raise DataError(path, getattr(e, "lineno", None), f"malformed json: {e}") from e
    return _get(obj, "data", list, path, "")


def split_by_article(examples: List[SquadExample], eval_fraction: float = 0.2,
                     every: Optional[int] = None) -> Tuple[List[SquadExample], List[SquadExample]]:
    """Splits examples by article title (no paragraph in both parts): every ``every``-th article (default
    ``round(1/eval_fraction)``) goes to the second part. For training on a dev set where no train set exists."""
    every = every or max(2, round(1 / eval_fraction))
    titles = list(dict.fromkeys(ex.title for ex in examples))
    held = {t for i, t in enumerate(titles) if i % every == every - 1}
    return [e for e in examples if e.title not in held], [e for e in examples if e.title in held]
