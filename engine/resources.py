"""What a ggml program reaches for beyond ggml's headers: a scratch folder for the files it
writes, the fixture files, the bundled model, a small data set. The walkthroughs use these rather
than os, tempfile, pathlib or sklearn, so a copy of any of them runs unchanged in the playground,
where these are the doors to the world the sandbox leaves open (its scratch folder, and read-only
files of the project).
"""

from __future__ import annotations

import gzip
import importlib.util
import tempfile
from pathlib import Path

import numpy as np

from engine.models import bundled
from engine.programs import FIXTURES_DIR

__all__ = ["scratch_path", "fixture_path", "bundled_model_path", "load_digits"]


def scratch_path(name: str) -> str:
    """A path for a file the program writes, in a fresh folder of its own (in the playground,
    inside its scratch directory)."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"scratch_path({name!r}): a plain file name, without folders")
    return str(Path(tempfile.mkdtemp(prefix="ggml-lens-")) / name)


def fixture_path(name: str) -> str:
    """One of the GGUF files that come with ggml-lens (minilm-q8_0.gguf, ggml-vocab-llama-spm.gguf)."""
    path = FIXTURES_DIR / name
    if "/" in name or not path.is_file():
        names = ", ".join(sorted(p.name for p in FIXTURES_DIR.glob("*.gguf")))
        raise FileNotFoundError(f"fixture_path({name!r}): the fixtures are {names}")
    return str(path)


def bundled_model_path() -> str:
    """The bundled Gemma 3 270M GGUF (an error saying how to install it when it is missing)."""
    return str(bundled.require(bundled.data_dir()))


def _digits_file() -> Path | None:
    spec = importlib.util.find_spec("sklearn")  # (found, not imported)
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None


DIGITS = _digits_file()


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 8x8 handwritten digits scikit-learn ships (the file its load_digits reads):
    (pixels 0..16, shape (1797, 64); labels 0..9)."""
    if DIGITS is None or not DIGITS.is_file():
        raise FileNotFoundError("load_digits: scikit-learn's digits are not installed (pip install scikit-learn)")
    with gzip.open(DIGITS, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)
