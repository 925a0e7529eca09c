"""Shared test fixtures: where the real data lives, quiet TensorFlow logs, and the test tiers (pytest.ini)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as the run_*.py entry points (the library sets nothing)

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("SHARED_DATA") or os.path.join(REPO, "..", "shared", "data")


def shared_path(*parts: str) -> str:
    """A path under the shared real-data folder; skips the test with a clear reason when it is absent."""
    path = os.path.join(SHARED, *parts)
    if not os.path.exists(path):
        pytest.skip(f"real data not available: {path} (set SHARED_DATA to the folder holding it)")
    return path


def start_early(request, fixture: str) -> None:
    """From a module's autouse fixture: sets up ``fixture`` (one that starts a background process) before the
    module's first test when a selected test of the module needs it, so the process runs while the in-process
    tests do; a selection without such a test starts nothing, and no test depends on another's order."""
    if any(fixture in item.fixturenames for item in request.session.items
           if getattr(item, "module", None) is request.module):
        request.getfixturevalue(fixture)


def tiny(**overrides) -> dict:
    """The suite's one tiny model, as the shape keys of a config json: the library's ``tiny`` preset (2 layers,
    d_model 64, gelu, untied biases, the 32,000-piece vocabulary) with ``overrides`` (narrower, fewer layers, a
    smaller vocabulary, run options). Imports no TensorFlow."""
    from xlnet_tf.config import XLNetConfig

    return dict(XLNetConfig.preset("tiny").to_original_dict(), **overrides)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: ``-m "not slow"`` then leaves the outcome tests out too
def pytest_collection_modifyitems(items):
    """An outcome test (trains to an accuracy floor) is a slow test: one mechanism, no second marker to forget."""
    for item in items:
        if item.get_closest_marker("outcome") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
