"""Every project path and dotted project name that the docs cite exists, so references cannot drift again.

Scanned: README.md, BUILD.md, PERFORMANCE.md and the guides under docs/ (inline backticks, and the words of fenced
code blocks), and the
docstrings and comments of every project .py file (``.venv``, hidden and ``__pycache__`` folders excluded).
Read with ``ast``/``tokenize`` only: nothing is imported, so the test needs no TensorFlow.

Checked:

* a path whose first part is a top-level entry of the repo (``xlnet_tf/ram.py``, ``benchmarks/results/``,
  ``xlnet_tf/accel``), or, in a .py file, one that exists relative to that file's folder (``results/x.md`` in
  ``benchmarks/``): it must exist. A trailing ``:line`` or ``::test`` is ignored;
* a bare file name in backticks that names a root entry point or root doc (``run_squad.py``, ``BUILD.md``): it
  must exist at the root;
* a dotted name starting with a project package or root module (``xlnet_tf.``, ``tasks.``, ``heads.``, ``data.``,
  ``benchmarks.``, ``tests.``, ``run_common.``, ``run_state.``): the longest prefix that is a module file is
  taken, and what follows must be a top-level name of that file (defined, assigned or imported) and, after a
  class, a name of that class (class body or ``self.x =``), found with ``ast``.
* in the prose of a .md file (outside code): a markdown link's target (relative to the file) and a guide named as
  ``docs/NAME.md`` must exist, and a section cited as ``PERFORMANCE.md "Title"`` (or ``BUILD.md``, ``README``) must
  begin a heading of that file (or a bold label opening a line, as BUILD.md's decisions).

Skipped on purpose (a reference the test cannot judge, never a failure): globs and templates (``*``, ``?``, ``[``,
``{``, ``<family>``, ``...``), placeholders and paths outside the repo (``OUTPUT_DIR/...``, ``../shared/...``,
absolute paths, ``~``), URLs, other bare file names (``data_utils.py`` is the original's, ``modeling.py`` may be
HuggingFace's), and paths starting with a folder that is not a top-level entry of the repo.
"""

import ast
import io
import os
import re
import tokenize
from typing import Iterator, List, Optional, Set, Tuple

from tests.conftest import REPO

DOCS = ("README.md", "BUILD.md", "PERFORMANCE.md")


def doc_files() -> List[str]:
    """The root docs and every guide under docs/ (repo-relative)."""
    guides = sorted(n for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md"))
    return list(DOCS) + [f"docs/{n}" for n in guides]
DOTTED_ROOTS = ("xlnet_tf", "tasks", "heads", "data", "benchmarks", "tests", "run_common", "run_state", "run_flags",
                "run_main")
SKIP_DIRS = {".venv", ".git", "__pycache__"}
INLINE = re.compile(r"(`+)([^`\n]+?)\1(?!`)")
TEMPLATE = re.compile(r"[*?\[\]{}<>$]|\.\.\.|://")
ROOT_DOC = re.compile(r"^[A-Z]+\.md$")
ROOT_FILE = re.compile(r"^run_\w+\.py$|%s" % ROOT_DOC.pattern)
DOTTED = re.compile(r"^(%s)(\.[A-Za-z_]\w*)+$" % "|".join(DOTTED_ROOTS))
FILE_SUFFIX = re.compile(r"\.(py|md|json|sh|txt|toml|ini|png|cfg|yaml|yml)$")
PLACEHOLDER = re.compile(r"(?:^|[/_])[A-Z]{2,}[A-Z_]*(?:[/.]|$)")  # OUTPUT_DIR/..., tasks/NAME/, run_NAME.py
WORD = re.compile(r"[^\s`'\"(),;=|─▶→]+")


def _top_level() -> Set[str]:
    return {n for n in os.listdir(REPO) if not n.startswith(".") and n not in SKIP_DIRS}


# ---------------------------------------------------------------------------------------------- the texts
def doc_texts() -> Iterator[Tuple[str, int, str]]:
    """(file, line, text) of every place that may cite something: .md lines, docstrings and comments."""
    for name in doc_files():
        with open(os.path.join(REPO, name), encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                yield name, i, line
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                yield from _py_texts(os.path.relpath(path, REPO))


def _py_texts(rel: str) -> Iterator[Tuple[str, int, str]]:
    source = open(os.path.join(REPO, rel), encoding="utf-8").read()
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                for i, line in enumerate(first.value.value.splitlines()):
                    yield rel, first.lineno + i, line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield rel, tok.start[0], tok.string


def references(text: str, fenced: bool = False) -> List[str]:
    """The candidate references of one line: backticked spans (every word of a span with spaces), or with
    ``fenced`` (a line of a fenced code block) every word."""
    spans = [text] if fenced else [m.group(2) for m in INLINE.finditer(text)]
    return [w for span in spans for w in WORD.findall(span)]


# ---------------------------------------------------------------------------------------------- the checks
def check(word: str, source: str, top: Set[str], paths_only: bool = False) -> Optional[str]:
    """None when ``word`` (cited in ``source``, a repo-relative file) resolves or is not judged; else why not.
    ``paths_only``: a word of a code block, where a dotted name may be a command for another checkout."""
    word = word.strip(".:")
    word = re.split(r"::|:\d", word)[0]
    if not word or TEMPLATE.search(word) or word.startswith(("/", "~", "../", "./", "-")):
        return None
    if PLACEHOLDER.search(word) and not ROOT_DOC.match(word):
        return None
    if "/" in word:
        parts = word.rstrip("/").split("/")
        if parts[0] in top:
            return None if os.path.exists(os.path.join(REPO, *parts)) else f"no such path {word}"
        here = os.path.dirname(source)
        if source.endswith(".py") and here and os.path.exists(os.path.join(REPO, here, parts[0])):
            return None if os.path.exists(os.path.join(REPO, here, *parts)) else f"no such path {word} in {here}/"
        return None
    if FILE_SUFFIX.search(word):
        if ROOT_FILE.match(word):
            return None if os.path.exists(os.path.join(REPO, word)) else f"no such root file {word}"
        return None
    if DOTTED.match(word) and not paths_only:
        return resolve_dotted(word)
    return None


# The rooms installed inside the library's namespace (pyproject.toml): xlnet_tf.tasks is the folder tasks/.
ROOMS = ("heads", "tasks", "data")


def _module_file(parts: List[str]) -> Optional[str]:
    if len(parts) > 1 and parts[0] == "xlnet_tf" and parts[1] in ROOMS:
        parts = parts[1:]
    base = os.path.join(REPO, *parts)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def resolve_dotted(name: str) -> Optional[str]:
    """None when ``name`` is a project module, or a module plus a name it defines (plus a class member)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_file(parts[:i])
        if path:
            break
    else:
        return f"no module for {name}"
    rest = parts[i:]
    if not rest:
        return None
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    defined = _names(tree.body)
    if rest[0] not in defined:
        if os.path.isdir(os.path.join(REPO, *parts[:i + 1])):  # a subpackage folder without __init__.py
            return None
        return f"{'.'.join(parts[:i])} defines no {rest[0]} ({name})"
    if len(rest) > 1:
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == rest[0]), None)
        if cls is not None and rest[1] not in _names(cls.body) | _self_attributes(cls):
            return f"class {'.'.join(parts[:i + 1])} defines no {rest[1]} ({name})"
    return None


def _names(body) -> Set[str]:
    """Names bound by statements of one body (defs, classes, assignments, imports; inside if/try/with too)."""
    out = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                out |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        for field in ("body", "orelse", "finalbody", "handlers"):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out |= _names(getattr(node, field, []) or [])
    return out


def _self_attributes(cls: ast.ClassDef) -> Set[str]:
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target)
GUIDE = re.compile(r"(?<![\w/.])docs/[\w-]+\.md\b")  # a guide named in prose
SECTION = re.compile(r"\b(PERFORMANCE\.md|BUILD\.md|README(?:\.md)?)`?,?\s+\"([^\"]+)\"")  # FILE "Section"


BOLD_LABEL = re.compile(r"^(?:\* )?\*\*([^*]+)\*\*")  # "* **XLA where it pays** (...)": a decision's name


def _headings(name: str) -> List[str]:
    """The headings of a .md file, and the bold labels that open a line (BUILD.md's decisions)."""
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [line.lstrip("#").strip() for line in lines if line.startswith("#")] + \
        [m.group(1) for line in lines if (m := BOLD_LABEL.match(line))]


def prose_references(text: str, source: str) -> List[str]:
    """What a line of a .md file cites outside backticks: link targets and guides (must exist, relative to the
    file for a link), and ``FILE "Section"`` (a heading of that file must start with the quoted words)."""
    found = []
    for target in MD_LINK.findall(text):
        if "://" not in target and not os.path.exists(os.path.join(REPO, os.path.dirname(source), target)):
            found.append(f"no such link target {target}")
    for guide in GUIDE.findall(text):
        if not os.path.exists(os.path.join(REPO, guide)):
            found.append(f"no such guide {guide}")
    for name, section in SECTION.findall(text):
        name = "README.md" if name.startswith("README") else name
        if not any(h.startswith(section) for h in _headings(name)):
            found.append(f'{name} has no section "{section}"')
    return found


def stale_references() -> List[str]:
    top = _top_level()
    found, fence = [], {}
    for source, line, text in doc_texts():
        if source.endswith(".md") and text.lstrip().startswith("```"):
            fence[source] = not fence.get(source, False)
            continue
        if source.endswith(".md") and not fence.get(source, False):
            found += [f"{source}:{line}: {why}" for why in prose_references(text, source)]
        for word in references(text, fenced=fence.get(source, False)):
            why = check(word, source, top, paths_only=fence.get(source, False))
            if why:
                found.append(f"{source}:{line}: {why}")
    return found


# ---------------------------------------------------------------------------------------------- the tests
def test_every_cited_path_and_name_exists():
    stale = stale_references()
    assert not stale, "stale references:\n" + "\n".join(stale)


def test_the_matcher_flags_what_is_gone_and_skips_what_it_cannot_judge():
    top = _top_level()
    line = ("see `xlnet_tf/no_such_file.py`, ``data.race.flatten_choices``, `run_nothing.py`, "
            "``xlnet_tf.export.no_such_name``, ``tasks.runner.Plan.no_such_field``")
    assert [bool(check(w, "README.md", top)) for w in references(line)] == [True] * 5
    good = ("`xlnet_tf/ram.py:12`, ``xlnet_tf.lengths.padded_length``, `data.lengths`, `tasks/squad/`, "
            "``tasks.runner.run``, `run_squad.py`, `BUILD.md`, ``xlnet_tf.XLNetModel``, ``tasks.runner.Plan.do_train``")
    assert [check(w, "README.md", top) for w in references(good)] == [None] * 9
    skipped = ("`results/*.json`, `OUTPUT_DIR/model.ckpt`, `tasks/<family>.py`, `../shared/data/x.txt`, "
               "`https://github.com/zihangdai/xlnet/blob/master/data_utils.py`, `data_utils.py`, `/tmp/x/y.py`")
    assert [check(w, "README.md", top) for w in references(skipped)] == [None] * 7
    assert check("results/no_such.md", "benchmarks/memory_levers.py", top)
    assert references("python benchmarks/backbone.py --quick", fenced=True)[1] == "benchmarks/backbone.py"


def test_links_guides_and_cited_sections_are_checked():
    bad = 'see [x](nothing.md), docs/no_such_guide.md and PERFORMANCE.md "No such section"'
    assert len(prose_references(bad, "README.md")) == 3
    good = ('[k](docs/keras.md), docs/serving.md, BUILD.md "XLA where it pays", PERFORMANCE.md "Test suite", '
            '[up](../README.md), [web](https://example.com)')
    assert prose_references(good.replace("[up](../README.md), ", ""), "README.md") == []
    assert prose_references("[up](../README.md)", "docs/keras.md") == []
