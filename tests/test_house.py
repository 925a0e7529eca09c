"""The rooms' import rules: the model library (xlnet_tf/) imports nothing from the rooms above it, and the plain
math of the model imports nothing from its speed paths (xlnet_tf/accel: they are handed in, xlnet_tf/paths.py)."""

import ast
import os

import pytest

from tests.conftest import REPO

ABOVE = ("heads", "tasks", "data", "run_common", "run_state", "run_flags", "run_main")
ROOMS = ("xlnet_tf.heads", "xlnet_tf.tasks", "xlnet_tf.data")  # the rooms' installed names (pyproject.toml)


def _above(module: str) -> bool:
    return module.split(".")[0] in ABOVE or module.startswith(tuple(r + "." for r in ROOMS)) or module in ROOMS
# The model's math, read top to bottom (modeling -> block -> attention / feedforward -> ops, encodings, masks).
PLAIN_MATH = ("modeling.py", "block.py", "attention.py", "feedforward.py", "encodings.py", "ops.py", "masks.py")


def _imports(path):
    """(line, module) of every import in ``path`` (inside functions too), ``from a import b`` also as a.b."""
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.lineno, node.module or ""
            yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)


def _py_files(folder: str):
    """Every .py file under ``REPO/folder``, as a path."""
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        yield from (os.path.join(root, name) for name in files if name.endswith(".py"))


def test_library_imports_nothing_from_the_rooms_above():
    found = [f"{os.path.relpath(path, REPO)}:{line} {m}" for path in _py_files("xlnet_tf")
             for line, m in _imports(path) if _above(m)]
    assert not found, found


def test_the_plain_math_imports_no_speed_path():
    found = [f"xlnet_tf/{name}:{line} {m}" for name in PLAIN_MATH
             for line, m in _imports(os.path.join(REPO, "xlnet_tf", name)) if m.startswith("xlnet_tf.accel")]
    assert not found, found


def test_no_import_circle_between_task_modules():
    """The modules under tasks/ import each other one way only (a lazy import inside a function counts too)."""
    modules = {}
    for path in _py_files("tasks"):
        rel = "xlnet_tf." + os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        modules[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    graph = {}
    for module, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xlnet_tf.tasks"):
                for alias in node.names:  # "from xlnet_tf.tasks.squad import reader" names that module
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in modules else node.module)
        graph[module] = deps - {module}
    assert len(graph) > 10

    def visit(module, path):
        assert module not in path, " -> ".join(path + [module])
        for dep in graph.get(module, ()):
            visit(dep, path + [module])

    for module in graph:
        visit(module, [])


def _import_graph(folder: str, package: str) -> dict:
    """{module: the package's modules it imports (inside functions too)} for every module under ``folder``."""
    modules = {}
    for path in _py_files(folder):
        rel = os.path.relpath(path, os.path.join(REPO, folder))[:-3]
        modules[".".join([package] + [p for p in rel.split(os.sep) if p != "__init__"])] = path
    graph = {}
    for module, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "") in modules:
                for alias in node.names:  # "from xlnet_tf import ops" names the module xlnet_tf.ops
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in modules else node.module)
        graph[module] = deps - {module}
    return graph


def _circles(graph: dict) -> list:
    found, state = [], {}

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                found.append(" -> ".join(path[path.index(dep):] + [module, dep]) if dep in path
                             else f"{module} -> {dep}")
            elif dep not in state:
                visit(dep, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return found


def test_no_import_circle_in_the_library():
    """No module of xlnet_tf imports, even lazily inside a function, a module that imports it back (the one
    circle there was, attention -> paths -> accel -> attention, went when the choice of paths left paths.py)."""
    graph = _import_graph("xlnet_tf", "xlnet_tf")
    assert len(graph) > 30 and "xlnet_tf.accel.fusions" in graph
    assert not _circles(graph), _circles(graph)
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}})  # the check finds one


@pytest.mark.slow
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


def _tf_functions_with_autograph(source: str, path: str = "<source>"):
    """(line) of every ``tf.function`` in ``source`` (a decorator, bare or called, or a call) that does not pass
    ``autograph=False``."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        targets = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            targets = [d for d in node.decorator_list if not isinstance(d, ast.Call)]
        elif isinstance(node, ast.Call):
            targets = [node]
        for t in targets:
            func = t.func if isinstance(t, ast.Call) else t
            if isinstance(func, ast.Attribute) and func.attr == "function" and \
                    isinstance(func.value, ast.Name) and func.value.id == "tf":
                off = isinstance(t, ast.Call) and any(
                    k.arg == "autograph" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in t.keywords)
                if not off:
                    found.append(t.lineno)
    return found


# tf.data's transformations that trace a function of ours, and the arguments that carry it
DATASET_FUNCTION_ARGS = {"map": ("map_func",), "filter": ("predicate",), "flat_map": ("map_func",),
                         "interleave": ("map_func",), "scan": ("scan_func",),
                         "group_by_window": ("key_func", "reduce_func", "window_size_func")}


def _dataset_functions_with_autograph(source: str, path: str = "<source>"):
    """(line) of every function handed to a tf.data transformation (``DATASET_FUNCTION_ARGS``) in ``source`` that
    is not wrapped in ``tf.autograph.experimental.do_not_convert`` (tf.data converts the others with AutoGraph)."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in DATASET_FUNCTION_ARGS):
            continue
        names = DATASET_FUNCTION_ARGS[node.func.attr]
        given = node.args[:1] if node.func.attr != "group_by_window" else []
        given += [k.value for k in node.keywords if k.arg in names]
        for arg in given:
            wrapped = isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and \
                arg.func.attr == "do_not_convert"
            if not wrapped:
                found.append(arg.lineno)
    return found


def test_every_tf_function_traces_without_autograph():
    """The project writes its graph control flow itself (``tf.while_loop``, ``tf.cond``), so every ``tf.function``
    it makes passes ``autograph=False``: AutoGraph's source rewriting of every function a trace reaches cost a tiny
    run's first step 1.6 of its 5.7 s (PERFORMANCE.md "Time to the first step"), and a Python ``if`` on a tensor
    then fails at trace time instead of being rewritten silently."""
    files = [path for top in ("xlnet_tf", "heads", "tasks", "data") for path in _py_files(top)]
    files += [os.path.join(REPO, f) for f in os.listdir(REPO) if f.endswith(".py")]
    bad = {os.path.relpath(p, REPO): lines for p in files
           if (lines := _tf_functions_with_autograph(open(p, encoding="utf-8").read(), p))}
    assert not bad, bad
    # the functions tf.data traces (a map's, group_by_window's): AutoGraph off for them too (1.2 -> 0.3 s to build
    # the pretraining pipeline)
    bad = {os.path.relpath(p, REPO): lines for p in files
           if (lines := _dataset_functions_with_autograph(open(p, encoding="utf-8").read(), p))}
    assert not bad, bad
    assert _dataset_functions_with_autograph("ds = ds.map(f, num_parallel_calls=2)\n") == [1]
    assert _dataset_functions_with_autograph("ds.group_by_window(key_func=k, reduce_func=r, window_size=2)\n") == [1, 1]
    assert _dataset_functions_with_autograph("ds.map(tf.autograph.experimental.do_not_convert(f))\n") == []
    assert len(files) > 50
    assert _tf_functions_with_autograph("@tf.function\ndef f(): pass\n") == [1]  # the check finds each form
    assert _tf_functions_with_autograph("g = tf.function(f, jit_compile=True)\n") == [1]
    assert _tf_functions_with_autograph("@tf.function(input_signature=[])\ndef f(): pass\n") == [1]
    assert _tf_functions_with_autograph("g = tf.function(f, autograph=False)\n") == []


# Modules whose import costs seconds: a function-local import of one of them, or of a project module importing one
# at its top, is a deliberate delay (a command line answers bad flags before TensorFlow loads; `import xlnet_tf`
# loads none of them), and the export formats' optional runtimes (not installed by requirements.txt). Any other
# function-local import is "light" and should sit at its module's top.
HEAVY = ("tensorflow", "keras", "tensorflow_text", "torch", "transformers", "matplotlib", "sentencepiece",
         "onnx", "onnxruntime", "onnxruntime_extensions", "tf2onnx", "openvino", "openvino_tokenizers")
MAX_LIGHT_LOCAL_IMPORTS = 30
PROJECT_CODE = ("xlnet_tf", "heads", "tasks", "data", "examples")  # and the root's *.py entry points


def _module_path(module: str):
    """The project file of a dotted module name (the rooms under their installed names), or None."""
    parts = module.split(".")
    if parts[0] == "xlnet_tf" and len(parts) > 1 and parts[1] in ("heads", "tasks", "data"):
        parts = parts[1:]
    base = os.path.join(REPO, *parts)
    return next((p for p in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(p)), None)


def _import_names(node) -> list:
    """The modules an import statement loads (``from a import b``: a, and a.b in case b is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def _top_level_imports(path: str) -> list:
    """The modules ``path`` imports when it is imported (every import outside a function)."""
    found = []

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                found.extend(_import_names(child))
                walk(child)

    walk(ast.parse(open(path, encoding="utf-8").read(), path))
    return found


def _is_heavy(module: str, cache: dict) -> bool:
    """Whether importing ``module`` (its packages' ``__init__`` included) imports one of ``HEAVY``."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name in HEAVY:
            return True
        path = _module_path(name)
        if path is None:
            continue
        if path not in cache:
            cache[path] = False  # (an import circle ends here)
            cache[path] = any(_is_heavy(m, cache) for m in _top_level_imports(path))
        if cache[path]:
            return True
    return False


def _light_local_imports() -> list:
    """(file:line, the statement's source) of every function-local import of a cheap module in the project code."""
    files = [p for top in PROJECT_CODE for p in _py_files(top)]
    files += [os.path.join(REPO, f) for f in sorted(os.listdir(REPO)) if f.endswith(".py")]
    cache, found = {}, {}
    for path in files:
        source = open(path, encoding="utf-8").read()
        lines = source.splitlines()
        for fn in ast.walk(ast.parse(source, path)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    names = _import_names(node)
                    if names and not any(_is_heavy(m, cache) for m in names):
                        where = f"{os.path.relpath(path, REPO)}:{node.lineno}"  # (a nested function's: once)
                        found[where] = "\n".join(lines[node.lineno - 1:node.end_lineno]).strip()
    return sorted(found.items())


def test_function_local_imports_are_few_and_say_why():
    """A function-local import of a cheap module hides a dependency from the module's reader: at most
    ``MAX_LIGHT_LOCAL_IMPORTS``, each with a comment saying why it is local (an import circle, a slow module, ...).
    Local imports of TensorFlow and the other ``HEAVY`` modules (or of a project module that imports one at its
    top) are free: they keep the command lines' flag checks and ``import xlnet_tf`` quick."""
    found = _light_local_imports()
    assert len(found) <= MAX_LIGHT_LOCAL_IMPORTS, "\n".join(f"{w}: {s}" for w, s in found)
    silent = [f"{w}: {s}" for w, s in found if "#" not in s]
    assert not silent, silent
    cache = {}
    assert _is_heavy("xlnet_tf.training", cache) and _is_heavy("xlnet_tf.heads.squad", cache)  # the check sees them
    assert not _is_heavy("xlnet_tf", cache) and not _is_heavy("xlnet_tf.tasks.squad.reader", cache)


MAX_FUNCTION_LINES = 80


def test_no_function_outside_tests_and_benchmarks_is_longer_than_80_lines():
    """A long function does several jobs: each piece gets a name for what it does (issue 71)."""
    files = [path for top in PROJECT_CODE for path in _py_files(top)]
    files += [os.path.join(REPO, f) for f in os.listdir(REPO) if f.endswith(".py")]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
