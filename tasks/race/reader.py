"""RACE (reading comprehension from examinations): reading the original layout, and accuracy.

The release is ``RACE/{train,dev,test}/{middle,high}/N.txt``, one JSON object per file::

    {"id": "high123.txt", "article": "...", "questions": [q, ...],
     "options": [[o1, o2, o3, o4], ...], "answers": ["A"|"B"|"C"|"D", ...]}

``source`` may be the ``RACE`` directory (or its parent) or the ``RACE.tar.gz`` archive itself, streamed without
extracting. Files are returned in a fixed order (middle before high, as the original, then by file number), so a
directory and its archive give identical lists. Questions without ``answers`` get ``label=None``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tarfile
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from xlnet_tf.tasks.errors import DataError

SPLITS = ("train", "dev", "test")
LEVELS = ("middle", "high")  # level feature: 0 middle, 1 high
NUM_CHOICES = 4
ANSWER_LETTERS = "ABCD"


@dataclasses.dataclass(frozen=True)
class RaceExample:
    """One question: ``options`` has 4 strings; ``label`` 0-3 (A-D) or None when unlabelled."""

    example_id: str
    level: str
    article: str
    question: str
    options: Tuple[str, ...]
    label: Optional[int]


@dataclasses.dataclass(frozen=True)
class RaceDocument:
    """One RACE file: its article and questions (``where`` names the file, and the tar member if any)."""

    where: str
    level: str
    article: str
    examples: Tuple[RaceExample, ...]


def select_levels(high_only: bool = False, middle_only: bool = False) -> Tuple[str, ...]:
    """The original ``--high_only`` / ``--middle_only`` filters as a tuple of levels."""
    if high_only and middle_only:
        raise ValueError("high_only and middle_only are mutually exclusive")
    return ("high",) if high_only else ("middle",) if middle_only else LEVELS


def parse_race_json(text, where: str, level: str, default_id: str = "") -> RaceDocument:
    """One file's bytes/str -> RaceDocument; DataError naming ``where`` and the field on bad input."""
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise DataError(where, None, f"malformed JSON ({e}); expected one RACE JSON object") from None
    if not isinstance(data, dict):
        raise DataError(where, None, f"expected a JSON object with article/questions/options/answers, "
                                     f"got {type(data).__name__}")
    article = data.get("article")
    if not isinstance(article, str) or not article.strip():
        raise DataError(where, None, "missing or empty; expected the passage text", field="article")
    questions, options, answers = data.get("questions"), data.get("options"), data.get("answers")
    for name, value in (("questions", questions), ("options", options), ("answers", answers)):
        if not isinstance(value, list) and not (name == "answers" and value is None):
            raise DataError(where, None, f"is {type(value).__name__}; expected a list", field=name)
    counts = (len(questions), len(options), len(answers) if answers is not None else len(questions))
    if len(set(counts)) != 1:
        raise DataError(where, None, f"fields 'questions', 'options', 'answers' have {counts[0]}, {counts[1]}, "
                                     f"{counts[2]} entries; expected one of each per question")
    doc_id = str(data.get("id") or default_id)
    examples = []
    for i, question in enumerate(questions):
        if not isinstance(question, str):
            raise DataError(where, None, f"is {type(question).__name__}; expected a string",
                            field=f"questions[{i}]")
        opts = options[i]
        if not isinstance(opts, list) or len(opts) != NUM_CHOICES:
            got = f"{len(opts)} options" if isinstance(opts, list) else type(opts).__name__
            raise DataError(where, None, f"has {got}; expected a list of {NUM_CHOICES}", field=f"options[{i}]")
        if not all(isinstance(o, str) for o in opts):
            raise DataError(where, None, f"holds a non-string; expected {NUM_CHOICES} strings",
                            field=f"options[{i}]")
        label = None
        if answers is not None:
            a = answers[i]
            if not (isinstance(a, str) and len(a) == 1 and a in ANSWER_LETTERS):
                raise DataError(where, None, f"is {a!r}; expected one of A, B, C, D", field=f"answers[{i}]")
            label = ANSWER_LETTERS.index(a)
        examples.append(RaceExample(f"{doc_id}-{i}", level, article, question, tuple(opts), label))
    return RaceDocument(where, level, article, tuple(examples))


def _is_archive(source: str) -> bool:
    return os.path.isfile(source) and source.endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz"))


def _split_dir(source: str, split: str) -> str:
    for cand in (os.path.join(source, split), os.path.join(source, "RACE", split)):
        if os.path.isdir(cand):
            return cand
    raise FileNotFoundError(f"RACE split {split!r} not found under {source!r} "
                            f"(expected {split}/ or RACE/{split}/ with middle/ and high/)")


def _order(level: str, name: str):
    stem = os.path.splitext(name)[0]
    return (LEVELS.index(level), (0, int(stem), "") if stem.isdigit() else (1, 0, stem))


def _iter_raw(source: str, split: str, levels: Sequence[str]) -> Iterator[Tuple[str, str, str, bytes]]:
    """(where, level, file name, bytes) for every file of ``split``/``levels``, in archive/listing order."""
    if _is_archive(source):
        with tarfile.open(source, "r:*") as tar:
            for member in tar:
                parts = member.name.split("/")
                if (member.isfile() and len(parts) >= 3 and parts[-3] == split and parts[-2] in levels
                        and parts[-1].endswith(".txt") and not parts[-1].startswith(".")):
                    data = tar.extractfile(member).read()
                    yield f"{source} (member {member.name})", parts[-2], parts[-1], data
        return
    split_dir = _split_dir(source, split)
    for level in levels:
        level_dir = os.path.join(split_dir, level)
        if not os.path.isdir(level_dir):
            continue
        for name in os.listdir(level_dir):
            if name.endswith(".txt") and not name.startswith("."):
                path = os.path.join(level_dir, name)
                with open(path, "rb") as f:
                    yield path, level, name, f.read()


def read_race_documents(source: str, split: str, high_only: bool = False,
                        middle_only: bool = False) -> List[RaceDocument]:
    """All files of one split as RaceDocuments (middle then high, by file number)."""
    if split not in SPLITS:
        raise ValueError(f"unknown RACE split {split!r}; expected one of {SPLITS}")
    if not os.path.exists(source):
        raise FileNotFoundError(f"RACE source not found: {source!r}")
    levels = select_levels(high_only, middle_only)
    keyed = []
    for where, level, name, data in _iter_raw(source, split, levels):
        keyed.append((_order(level, name), parse_race_json(data, where, level, default_id=level + name)))
    if not keyed:
        raise DataError(source, None, f"no RACE files for split {split!r}, levels {levels} "
                                      f"(expected {split}/{{{','.join(levels)}}}/N.txt)")
    keyed.sort(key=lambda kv: kv[0])
    return [doc for _, doc in keyed]


def read_race(source: str, split: str, high_only: bool = False, middle_only: bool = False) -> List[RaceExample]:
    """All questions of one split, flattened (each example carries its article)."""
    return [ex for doc in read_race_documents(source, split, high_only, middle_only) for ex in doc.examples]


def count_levels(examples: Iterable[RaceExample]) -> Dict[str, int]:
    """{"middle": n, "high": n, "total": n}."""
    out = {level: 0 for level in LEVELS}
    for ex in examples:
        out[ex.level] += 1
    out["total"] = sum(out[level] for level in LEVELS)
    return out


def race_accuracy(labels: Sequence[int], choices: Sequence[int], levels: Sequence[str]) -> Dict[str, float]:
    """Accuracy overall and per level (the paper reports all three); levels are names or 0/1 ids."""
    if not (len(labels) == len(choices) == len(levels)):
        raise ValueError(f"labels/choices/levels lengths differ: {len(labels)}, {len(choices)}, {len(levels)}")
    names = [lv if isinstance(lv, str) else LEVELS[int(lv)] for lv in levels]
    out = {}
    for key, keep in (("accuracy", None), ("accuracy_middle", "middle"), ("accuracy_high", "high")):
        pairs = [(int(l), int(c)) for l, c, n in zip(labels, choices, names) if keep in (None, n)]
        if pairs:
            out[key] = sum(l == c for l, c in pairs) / len(pairs)
    return out
