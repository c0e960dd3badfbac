"""Test set-up shared by every tier."""

import os

# numpy's BLAS must not start threads of its own inside the engine's compute threads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests that compare with real llama.cpp are marked `llamacpp`: `make test` runs them with
    every other test, `make test-models` runs only them."""
    for item in items:
        if {"llama_cpp", "gemma_cpp"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.llamacpp)


@pytest.fixture(scope="module")
def llama_cpp():
    """Real llama.cpp must be there: its absence fails the tests (`make test` installs it). The
    comparisons run it in a process of their own (tests/support/llamacpp_run.py)."""
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - a set-up problem, reported as a failure
        pytest.fail(f"llama-cpp-python is not installed ({e}); "
                    "pip install llama-cpp-python==0.3.36")
    return llama_cpp


@pytest.fixture(scope="session")
def gemma_path():
    """The bundled Gemma 3 270M GGUF (`make setup` joins it into the data directory): missing,
    it fails the tests that need it, never skips them."""
    from app.settings import Settings
    from engine.models.bundled import BundledModelError, require

    try:
        return require(Settings.from_env().data_dir).resolve()
    except BundledModelError as e:  # pragma: no cover - a set-up problem, reported as a failure
        pytest.fail(str(e))
