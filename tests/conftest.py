"""Shared test fixtures: where the real data lives, and quiet TensorFlow logs."""

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
