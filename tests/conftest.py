"""Test set-up shared by every tier."""

import os

# numpy's BLAS must not start threads of its own inside the engine's compute threads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests that compare with real llama.cpp are the `llamacpp` tier: `make test-models` builds
    llama-cpp-python (about 17 minutes on 2 cores) and runs them; `make test` runs the rest."""
    for item in items:
        if "llama_cpp" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.llamacpp)
