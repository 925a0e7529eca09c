"""Shared test fixtures: where the real data lives, quiet TensorFlow logs, and the test tiers (pytest.ini)."""

import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as the run_*.py entry points (the library sets nothing)

import pytest  # noqa: E402

from xlnet_tf.hardware import usable_cpus  # noqa: E402  (imports no TensorFlow: the shares below come first)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One XLA compilation cache for the run, shared by both workers and every process they start (the environment is
# inherited): the suite compiles the same few XLA clusters again and again (a tiny model's grouped optimizer
# update, its float16 step), and TensorFlow's persistent cache (keyed by the cluster's HLO) compiles each once.
# Per run, in the temporary folder (nothing outlives the TensorFlow version that wrote it).
XLA_CACHE = os.path.join(tempfile.gettempdir(), "xlnet_tf_suite_xla_cache",
                         os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid()))
os.makedirs(XLA_CACHE, exist_ok=True)
os.environ["TF_XLA_FLAGS"] = f"{os.environ.get('TF_XLA_FLAGS', '')} --tf_xla_persistent_cache_directory={XLA_CACHE}"
# The suite's models are tiny and it compiles ~1,300 XLA clusters, ~0.2 s each: LLVM's optimisation level 1 instead
# of XLA's default 2 compiles them faster and ran the tiny models' training no slower (PERFORMANCE.md "Test suite").
# The same HLO, so the same math; a run's own level wins.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=1".strip()


# The workers share the machine (pytest.ini: -n 2 on CI's 2 cores): each worker, and every process it starts (the
# environment is inherited), gives TensorFlow's two thread pools its share of the CPUs instead of one thread per
# CPU each: 2 workers x (2 intra-op + 2 inter-op threads) on 2 cores spent their time contending (PERFORMANCE.md
# "Test suite"). A run's own setting wins; a test about a user's threading starts its processes without the shares
# (``default_threads``). Nothing is set for a single worker.
THREAD_SHARES = {}
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if WORKERS > 1:
    for _name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        if _name not in os.environ:  # each worker's share of the CPUs, at least 1
            THREAD_SHARES[_name] = os.environ[_name] = str(max(1, usable_cpus() // WORKERS))


def default_threads(env=None) -> dict:
    """``env`` (default: this process's environment) without the thread shares set above: a process started with
    it runs with TensorFlow's own thread pools, as a user's does (or with the run's own setting)."""
    env = dict(os.environ if env is None else env)
    for name in THREAD_SHARES:
        env.pop(name, None)
    return env


SHARED = os.environ.get("SHARED_DATA") or os.path.join(REPO, "..", "shared", "data")


def _not_available(path: str) -> str:
    return f"real data not available: {path} (set SHARED_DATA to the folder holding it)"


def shared_path(*parts: str) -> str:
    """A path under the shared real-data folder; skips the test with a clear reason when it is absent."""
    path = os.path.join(SHARED, *parts)
    if not os.path.exists(path):
        pytest.skip(_not_available(path))
    return path


def needs_shared(*parts: str):
    """``shared_path``'s skip as a mark, for a test that names the path before it runs (a parametrised case, a
    module constant): skips it with the same reason when the path is absent."""
    path = os.path.join(SHARED, *parts)
    return pytest.mark.skipif(not os.path.exists(path), reason=_not_available(path))


@pytest.fixture(scope="session")
def glue(tmp_path_factory):
    """Small GLUE folders cut from the real ones (SST-2 40 train / 20 dev rows, CoLA 39 / 20, STS-B 40 / 20) and
    ``cfg.json``, the ``TINIEST`` model: what the refusal and run-directory tests train in seconds."""
    d = tmp_path_factory.mktemp("glue")
    (d / "cfg.json").write_text(json.dumps(TINIEST))
    for task, n in (("SST-2", 41), ("CoLA", 40), ("STS-B", 41)):
        (d / task).mkdir()
        for split, rows in (("train", n), ("dev", 21)):
            lines = open(shared_path("glue", task, f"{split}.tsv"), encoding="utf-8").read().splitlines()
            (d / task / f"{split}.tsv").write_text("\n".join(lines[:rows]) + "\n", encoding="utf-8")
    return d


def tiny(**overrides) -> dict:
    """The suite's one tiny model, as the shape keys of a config json: the library's ``tiny`` preset (2 layers,
    d_model 64, gelu, untied biases, the 32,000-piece vocabulary) with ``overrides`` (narrower, fewer layers, a
    smaller vocabulary, run options). Imports no TensorFlow."""
    from xlnet_tf.config import XLNetConfig

    return dict(XLNetConfig.preset("tiny").to_original_dict(), **overrides)


# The smallest model the CLI tests train (1 layer, d_model 16): seconds per run.
TINIEST = tiny(n_layer=1, d_model=16, d_head=8, d_inner=32)


def classifier_args(task, data_dir, config_file, out, L=48, steps=20, extra=()) -> list:
    """run_classifier.py's flags for the suite's small runs from random initialisation (learning rate 5e-4)."""
    return [f"--task={task}", f"--data_dir={data_dir}", f"--model_config_path={config_file}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            f"--max_seq_length={L}", "--train_batch_size=32", f"--train_steps={steps}",
            f"--warmup_steps={max(steps // 10, 1)}", "--learning_rate=5e-4", "--progress=false",
            f"--save_steps={steps}", "--iterations=10"] + list(extra)


def glue_args(glue, task, out, *extra, steps=4) -> list:
    """run_classifier.py's flags for a few steps of ``task`` on the ``glue`` fixture's folders and ``TINIEST`` model
    (length 32, batch 8, a checkpoint every 2 steps), with training and evaluation."""
    return [f"--task={task}", f"--data_dir={glue / task}", f"--model_config_path={glue / 'cfg.json'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            "--max_seq_length=32", "--train_batch_size=8", f"--train_steps={steps}", "--save_steps=2",
            "--progress=false", "--do_train", "--do_eval", *extra]


def records(out):
    """The feature files (TFRecords) a run in ``out`` wrote, by name: [] when it wrote none."""
    return sorted(p.name for p in (out / "data").glob("*.tfrecord*")) if (out / "data").exists() else []


@pytest.fixture(scope="session")
def sst2_cache(tmp_path_factory):
    """The --cache_dir of the session's SST-2 runs: its 67,349 training sentences are tokenized once per
    --max_seq_length, not once per run (a run reuses only records valid for its data: task_features)."""
    return tmp_path_factory.mktemp("sst2_cache")


@pytest.fixture(scope="session")
def tiny_config_file(tmp_path_factory):
    """``tiny()`` as a config json (the model of the session's SST-2 run)."""
    path = tmp_path_factory.mktemp("tiny_config") / "config.json"
    path.write_text(json.dumps(tiny()))
    return str(path)


@pytest.fixture(scope="session")
def sst2_run(tmp_path_factory, tiny_config_file, sst2_cache):
    """THE finished classifier run many tests read (and none changes): SST-2 from random initialisation, the
    ``tiny()`` model, 400 steps at length 48, with evaluation, predictions, a SavedModel (``export``) and a
    HuggingFace export (``hf``), run through run_classifier.py's ``main`` in-process. Its checks: the SST-2
    floor (tests/test_run_classifier.py), the served answers in a fresh process, the bf16 export
    (tests/test_precision.py), the HuggingFace export (tests/test_huggingface_export.py)."""
    import types

    import run_classifier
    from tests.cli_util import succeeds

    root = tmp_path_factory.mktemp("sst2_run")
    args = classifier_args("SST-2", shared_path("glue", "SST-2"), tiny_config_file, root / "run", L=48, steps=400,
                           extra=["--do_train", "--do_eval", "--do_predict", f"--export_dir={root / 'export'}",
                                  f"--export_huggingface={root / 'hf'}", f"--cache_dir={sst2_cache}"])
    r = succeeds(run_classifier, *args)
    return types.SimpleNamespace(dir=root / "run", export=root / "export", hf=root / "hf", L=48,
                                 config=tiny_config_file, args=args, log=r.stderr)


# ------------------------------------------------------------------------------------------ pretraining artefacts
# The tiny pretraining setting of tests/test_pretrain.py and tests/test_generation.py: sequences of 24 pieces whose
# first 8 become memory, 12 positions of memory, 4 targets each.
PRETRAIN_SEQ, PRETRAIN_REUSE, PRETRAIN_MEM, PRETRAIN_PREDICT = 24, 8, 12, 4


def write_corpus(path: str, n_docs: int = 60, seed: int = 0) -> None:
    """Documents of short sentences from a small grammar (learnable), blank lines between documents."""
    import numpy as np

    rng = np.random.RandomState(seed)
    nouns, verbs, adjs = ["cat", "dog", "bird", "mat", "log", "tree"], ["sat", "ran", "flew", "saw"], \
        ["big", "small", "red", "green"]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_docs):
            for _ in range(rng.randint(3, 7)):
                a, b = rng.choice(adjs), rng.choice(nouns)
                f.write(f"the {a} {b} {rng.choice(verbs)} {rng.choice(['on', 'over', 'under'])} the "
                        f"{rng.choice(nouns)} {rng.choice(['quickly', 'slowly'])} .\n")
            f.write("\n")


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> dict:
    """A synthetic corpus (60 documents), its held-out part (20) and a 60-piece SentencePiece model trained on it:
    ``{"dir", "corpus", "heldout", "spm"}``."""
    from xlnet_tf import spm_train

    d = str(tmp_path_factory.mktemp("tiny_corpus"))
    corpus, held = os.path.join(d, "train.txt"), os.path.join(d, "held.txt")
    write_corpus(corpus, 60, seed=0)
    write_corpus(held, 20, seed=1)
    spm = spm_train.train_spm([corpus], os.path.join(d, "sp"), vocab_size=60, hard_vocab_limit=False, quiet=True)
    return {"dir": d, "corpus": corpus, "heldout": held, "spm": spm}


def tiny_pretrain_config(**overrides):
    """The pretraining tests' XLNetConfig: ``tiny()`` at d_model 16, 60 tokens, memory and reuse as above."""
    from xlnet_tf.config import XLNetConfig

    return XLNetConfig(**dict(tiny(d_model=16, d_head=8, d_inner=32, n_token=60, dropout=0.0, dropatt=0.0,
                                   mem_len=PRETRAIN_MEM, reuse_len=PRETRAIN_REUSE, bi_data=True), **overrides))


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, tiny_corpus):
    """THE tiny pretrained backbone: run_pretrain.py's ``main`` in-process on ``tiny_corpus`` (its own 48-piece
    SentencePiece model trained first, 6 steps, held-out loss every 2), saved in our format with its
    spiece.model. Read by tests/test_pretrain.py (the CLI's outputs, casing, loading into a task model) and
    tests/test_generation.py (greedy ids equal HuggingFace's on it). ``{"dir": the backbone, "train": the
    model_dir, "summary", "log", "corpus"}``."""
    import run_pretrain
    from tests.cli_util import succeeds

    out = str(tmp_path_factory.mktemp("pretrained"))
    tiny_pretrain_config().to_json_file(os.path.join(out, "config.json"))
    r = succeeds(run_pretrain, f"--train_input={tiny_corpus['corpus']}", "--train_spm", "--vocab_size=48",
                 f"--model_config_path={os.path.join(out, 'config.json')}", f"--seq_len={PRETRAIN_SEQ}",
                 f"--reuse_len={PRETRAIN_REUSE}", f"--mem_len={PRETRAIN_MEM}", f"--num_predict={PRETRAIN_PREDICT}",
                 "--perm_size=8", "--train_batch_size=4", "--train_steps=6", "--learning_rate=3e-3",
                 "--heldout_every=2", f"--heldout_input={tiny_corpus['heldout']}", "--heldout_batch_size=2",
                 "--heldout_steps=3", "--iterations=2", "--dropout=0.1", "--dropatt=0.0", "--jit=false",
                 f"--model_dir={out}/train", f"--output_dir={out}/pretrained", "--progress=false")
    return {"dir": os.path.join(out, "pretrained"), "train": os.path.join(out, "train"), "summary": r.value,
            "log": r.stderr, "corpus": tiny_corpus["corpus"]}


# Session artefacts that cost a training run: the tests reading one run on the same pytest-xdist worker, so it is
# built once per suite, not once per worker.
SHARED_RUNS = ("sst2_run", "pretrained")


def pytest_itemcollected(item):
    """An outcome test (trains to an accuracy floor) is a slow test: one mechanism, no second marker to forget
    (marked as it is collected, before ``-m`` deselects: ``-m "not slow"`` then leaves the outcome tests out too).

    The suite runs on two pytest-xdist workers (pytest.ini: ``-n 2 --dist loadgroup``) in units: the tests that
    read one of ``SHARED_RUNS`` form one unit; a test reading a module- or class-scoped fixture goes with its
    module (such a fixture, a module's own training run or background process, is then built once); every other
    test goes to whichever worker is free. The group marks are set here, as each test is collected, because
    pytest-xdist turns them into units in its own ``pytest_collection_modifyitems``, which may run before a
    conftest's."""
    if item.get_closest_marker("outcome") and not item.get_closest_marker("slow"):
        item.add_marker(pytest.mark.slow)
    shared = [name for name in SHARED_RUNS if name in getattr(item, "fixturenames", ())]
    if shared:
        item.add_marker(pytest.mark.xdist_group(shared[0]))
    elif _reads_module_fixture(item):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def _reads_module_fixture(item) -> bool:
    """Whether the test reads a fixture built once per module or class (it then runs beside its module's others)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d[-1].scope in ("module", "class", "package") for d in defs)


# The units' rough costs, for their order (pytest.ini: --no-loadscope-reorder, so pytest-xdist hands the units out in
# the collection's order): an outcome test trains to a floor (minutes), a slow test trains or starts a process.
UNIT_COST = {"outcome": 100, "slow": 20}


def pytest_collection_modifyitems(config, items):
    """The costliest units first (longest processing time first): both workers start on the long training runs and
    the many short tests fill in at the end, instead of a long run starting last while the other worker waits.
    Within a unit, and between units of one cost, the collection's order is kept."""
    def unit(item):
        group = item.get_closest_marker("xdist_group")
        if group is None:
            return item.nodeid
        return group.args[0] if group.args else group.kwargs.get("name", "default")

    def cost(item):
        return next((c for mark, c in UNIT_COST.items() if item.get_closest_marker(mark)), 1)

    total = {}
    for item in items:
        total[unit(item)] = total.get(unit(item), 0) + cost(item)
    items.sort(key=lambda item: -total[unit(item)])
