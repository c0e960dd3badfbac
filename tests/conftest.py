"""Test set-up shared by every tier."""

import os

# numpy's BLAS must not start threads of its own inside the engine's compute threads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests that compare with real llama.cpp are marked `llamacpp`: `make test` runs them with
    every other test, `make test-models` runs only them."""
    for item in items:
        if "llama_cpp" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.llamacpp)
