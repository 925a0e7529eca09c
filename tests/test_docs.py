"""Every guide under docs/ opens with an example, and that example runs AS WRITTEN: its first fenced block is read
from the page (nothing is copied into this file), run from a scratch directory holding what the example names
(``spiece.model``, ``config.json``, ``glue/SST-2``, a model folder: small files or links to the suite's tiny
artefacts), python blocks ``exec``'d, bash blocks parsed with ``shlex`` and run in-process through the entry
point's own ``main`` (tests/cli_util.py). The README's command-line example is the command-line guide's, word for
word; the README's Keras block runs in tests/test_keras_tasks.py."""

import glob
import importlib
import json
import os
import re
import shlex
from typing import List, Tuple

import pytest

from tests.conftest import REPO, TINIEST, shared_path, write_corpus

DOCS = os.path.join(REPO, "docs")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def guides() -> List[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(DOCS, "*.md")))


def first_block(text: str) -> Tuple[str, str]:
    """(language, code) of the first fenced block of a markdown text."""
    m = FENCE.search(text)
    assert m, "no fenced code block"
    return m.group(1), m.group(2)


def guide_example(name: str) -> Tuple[str, str]:
    return first_block(open(os.path.join(DOCS, name), encoding="utf-8").read())


def commands(block: str) -> List[List[str]]:
    """The argv of each command of a bash block (continuation lines joined, comments dropped)."""
    return [argv for line in block.replace("\\\n", " ").splitlines()
            if (argv := shlex.split(line, comments=True))]


def run_bash(block: str, cwd) -> list:
    """Runs each ``python SCRIPT.py ...`` / ``python -m MODULE ...`` command of ``block`` through its ``main`` in
    this process, from ``cwd``; every one must succeed. Returns what each returned."""
    from tests.cli_util import succeeds

    out = []
    for argv in commands(block):
        assert argv[0] == "python", argv
        if argv[1] == "-m":
            here = os.getcwd()
            os.chdir(cwd)
            try:
                code = importlib.import_module(argv[2]).main(argv[3:])
            finally:
                os.chdir(here)
            assert code == 0, argv
            out.append(code)
        else:
            assert argv[1].endswith(".py") and "/" not in argv[1], argv
            out.append(succeeds(importlib.import_module(argv[1][:-3]), *argv[2:], cwd=str(cwd)))
    return out


def run_python(block: str, name: str, cwd, monkeypatch, **scope) -> dict:
    monkeypatch.chdir(cwd)
    exec(compile(block, f"docs/{name}", "exec"), scope)
    return scope


def _link(target, link) -> None:
    os.makedirs(os.path.dirname(str(link)) or ".", exist_ok=True)
    os.symlink(str(target), str(link))


# ---------------------------------------------------------------------------------------------- the pages
def test_every_guide_opens_with_an_example_this_file_runs():
    names = guides()
    assert {"keras.md", "command-lines.md", "serving.md", "checkpoints.md", "pretraining.md",
            "long-documents.md", "generation.md"} <= set(names)
    for name in names:
        text = open(os.path.join(DOCS, name), encoding="utf-8").read()
        assert text.startswith("# "), name
        before_sections = text.split("\n## ", 1)[0]
        lang, _ = first_block(before_sections)  # the example comes before the first section
        assert lang in ("python", "bash"), name
        assert f"test_{name[:-3].replace('-', '_')}_example" in open(__file__, encoding="utf-8").read(), name


def test_the_readme_command_line_example_is_the_guide_s():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert first_block(readme.split("## Command line", 1)[1]) == guide_example("command-lines.md")


def test_long_documents_example(tmp_path):
    lang, block = guide_example("long-documents.md")
    assert lang == "bash"
    assert run_bash(block, tmp_path) == [0]


@pytest.mark.slow
def test_keras_example(tmp_path, monkeypatch):
    lang, block = guide_example("keras.md")
    assert lang == "python"
    _link(shared_path("spiece", "spiece.model"), tmp_path / "spiece.model")
    scope = run_python(block, "keras.md", tmp_path, monkeypatch)
    assert int(scope["model"].optimizer.iterations) == 2 and scope["logits"].shape == (1, 2)


@pytest.mark.slow
def test_command_lines_example(tmp_path, glue):
    lang, block = guide_example("command-lines.md")
    assert lang == "bash"
    _link(glue / "SST-2", tmp_path / "glue" / "SST-2")
    _link(shared_path("spiece", "spiece.model"), tmp_path / "spiece.model")
    (tmp_path / "config.json").write_text(json.dumps(TINIEST))
    run_bash(block, tmp_path)
    results = json.loads((tmp_path / "out" / "sst2" / "eval_results.json").read_text())
    assert results["step"] == 4 and "accuracy" in results
    assert (tmp_path / "out" / "sst2" / "training_curve.png").is_file()


@pytest.mark.slow
def test_serving_example(tmp_path, monkeypatch, sst2_run):
    lang, block = guide_example("serving.md")
    assert lang == "python"
    _link(sst2_run.export, tmp_path / "export" / "sst2")
    code = block.rstrip().splitlines()
    code[-1] = "answer = " + code[-1]  # the example's last line shows the answer; keep it to look at
    scope = run_python("\n".join(code) + "\n", "serving.md", tmp_path, monkeypatch)
    assert {"label", "label_name", "probabilities", "logits"} <= set(scope["answer"])


def test_checkpoints_example(tmp_path, monkeypatch):
    from xlnet_tf import XLNetConfig, XLNetModel, XLNetTokenizer

    lang, block = guide_example("checkpoints.md")
    assert lang == "python"
    name = re.search(r'from_pretrained\("([^"]+)"', block).group(1)
    model = XLNetModel(XLNetConfig(**TINIEST))  # a tiny model in the released folder's place (a path wins)
    model(__import__("tensorflow").constant([[5, 6, 7]]))
    model.save_pretrained(str(tmp_path / name), tokenizer=XLNetTokenizer(shared_path("spiece", "spiece.model")))
    scope = run_python(block, "checkpoints.md", tmp_path, monkeypatch)
    assert scope["out"]["sequence_output"].shape[-1] == TINIEST["d_model"]
    assert (tmp_path / "xlnet-base-hf" / "config.json").is_file()


@pytest.mark.slow
def test_pretraining_example(tmp_path):
    lang, block = guide_example("pretraining.md")
    assert lang == "bash"
    write_corpus(str(tmp_path / "corpus.txt"), 60)
    run_bash(block, tmp_path)
    assert (tmp_path / "out" / "pretrained" / "spiece.model").is_file()
    assert json.loads((tmp_path / "out" / "pretrain_train" / "pretrain_results.json").read_text())["train_history"]


@pytest.mark.slow
def test_generation_example(tmp_path, pretrained):
    lang, block = guide_example("generation.md")
    assert lang == "bash"
    _link(pretrained["dir"], tmp_path / "my_model")
    (r,) = run_bash(block, tmp_path)
    assert r.code == 0
