"""The rooms' import rule: the model library (xlnet_tf/) imports nothing from the rooms above it."""

import ast
import os

from tests.conftest import REPO

ABOVE = ("heads", "tasks", "data", "run_common", "run_state")


def test_library_imports_nothing_from_the_rooms_above():
    found = []
    for root, _, files in os.walk(os.path.join(REPO, "xlnet_tf")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{os.path.relpath(path, REPO)}:{node.lineno} {m}" for m in modules
                          if m.split(".")[0] in ABOVE]
    assert not found, found
