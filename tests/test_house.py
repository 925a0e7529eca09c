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


def test_no_import_circle_between_task_modules():
    """tasks/*.py import each other one way only (a lazy import inside a function counts too)."""
    graph = {}
    folder = os.path.join(REPO, "tasks")
    for name in os.listdir(folder):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            deps = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "tasks":
                    deps |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tasks."):
                    deps.add(node.module.split(".")[1])
            graph[name[:-3]] = deps

    def visit(module, path):
        assert module not in path, " -> ".join(path + [module])
        for dep in graph.get(module, ()):
            visit(dep, path + [module])

    for module in graph:
        visit(module, [])


def test_importing_the_library_sets_no_process_settings():
    import subprocess
    import sys

    # (TensorFlow's own import sets a few variables of its own, e.g. TF2_BEHAVIOR: only ours are checked)
    code = ("import os; import xlnet_tf; xlnet_tf.XLNetModel; from xlnet_tf import attention, training; "
            "ours = {k: v for k, v in os.environ.items() if k in ('TF_ENABLE_ONEDNN_OPTS', 'TF_CPP_MIN_LOG_LEVEL') "
            "or k.startswith('XLNET_TF')}; assert not ours, ours")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "XLNET_TF"))}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
