"""llama.cpp's test vocabularies and their tokenizer test vectors, set up once through pip.

The `llama-cpp-python` 0.3.36 source package on PyPI ships llama.cpp's test vocabularies under
`vendor/llama.cpp/models/`: `ggml-vocab-*.gguf`, most with `.gguf.inp` (texts separated by
`__ggml_vocab_test__` lines) and `.gguf.out` (the token ids llama.cpp gives each, one line per
text), and llama.cpp's Unicode tables (`src/unicode-data.cpp`). `python -m tests.support.vocab`
(run by `make setup-test`) downloads the sdist with pip into ~/.cache/ggml-lens/sdist (kept, so
a second checkout does not download it again) and extracts just those files into
`var/cache/llama-src/`. Tests never download: `vocab_files()` and `vector_files()` raise when the
files are missing, so tests that need them fail rather than skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "var" / "cache" / "llama-src"
SDIST_DIR = Path(os.environ.get("GGML_LENS_SDISTS", Path.home() / ".cache" / "ggml-lens" / "sdist"))
SDIST = "llama-cpp-python==0.3.36"
PATTERN = "ggml-vocab-*.gguf"
MARKER = CACHE / ".complete-vectors"  # the vocabularies, their vectors and unicode-data.cpp
UNICODE_DATA = CACHE / "unicode-data.cpp"
SETUP_HINT = "run `make setup-test` (or `python -m tests.support.vocab`) once to set them up"


def vocab_files() -> list[Path]:
    """Every ggml-vocab-*.gguf of the sdist, sorted by name."""
    files = sorted((CACHE / "models").glob(PATTERN)) if MARKER.exists() else []
    if not files:
        raise RuntimeError(f"no {PATTERN} files in {CACHE / 'models'}: {SETUP_HINT}")
    return files


def vector_files() -> list[tuple[Path, Path, Path]]:
    """(vocabulary, .inp, .out) for every vocabulary that has test vectors."""
    out = [(p, p.with_name(p.name + ".inp"), p.with_name(p.name + ".out"))
           for p in vocab_files()]
    out = [t for t in out if t[1].exists() and t[2].exists()]
    if not out:
        raise RuntimeError(f"no .gguf.inp/.gguf.out test vectors in {CACHE / 'models'}: "
                           + SETUP_HINT)
    return out


def read_vectors(inp: Path, out: Path) -> list[tuple[bytes, list[int]]]:
    """The texts and their ids, as llama.cpp's test-tokenizer-0 reads them."""
    texts = inp.read_bytes().split(b"\n__ggml_vocab_test__\n")
    if texts and texts[-1] == b"":
        texts.pop()
    lines = out.read_text().split("\n")
    if len(lines) > len(texts) and not "".join(lines[len(texts):]).strip():
        lines = lines[:len(texts)]
    if len(texts) != len(lines):
        raise ValueError(f"{inp.name}: {len(texts)} texts but {len(lines)} lines of ids")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


def set_up() -> None:
    """Download the sdist (unless kept) and extract the vocabularies, vectors and tables."""
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    archives = sorted(SDIST_DIR.glob("llama_cpp_python-0.3.36.tar.gz"))
    if not archives:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               SDIST, "-d", str(SDIST_DIR)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        archives = sorted(SDIST_DIR.glob("llama_cpp_python-0.3.36.tar.gz"))
        if not archives:
            raise RuntimeError(f"pip download left no llama_cpp_python sdist in {SDIST_DIR}")
    models = CACHE / "models"
    models.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archives[-1]) as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = Path(member.name).name
            if "/vendor/llama.cpp/models/" in member.name and name.startswith("ggml-vocab-"):
                target = models / name
            elif member.name.endswith("/vendor/llama.cpp/src/unicode-data.cpp"):
                target = UNICODE_DATA
            else:
                continue
            src = tar.extractfile(member)
            assert src is not None
            target.write_bytes(src.read())
    MARKER.touch()


if __name__ == "__main__":
    if not MARKER.exists():
        set_up()
    for path in vocab_files():
        print(path, path.stat().st_size)
