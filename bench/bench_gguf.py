"""GGUF metadata parsing: engine.gguf's GGUFReader against ggml's C gguf_init_from_file
(no_alloc, no context) and against gguf-py's GGUFReader, on the fixtures and every
llama.cpp vocabulary file. Goals: within 2x of C, at least 100x faster than gguf-py.

gguf-py builds a numpy view per array element, so it takes seconds on large vocabularies: it
is timed once per file (best of 1), C and ours best of 5.
"""

from __future__ import annotations

from pathlib import Path

import ggml
import gguf

from bench.common import best_time
from engine.gguf import GGUFReader
from tests.support.vocab import vocab_files
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR


def _files() -> list[Path]:
    return [FIXTURES / "minilm-q8_0.gguf", FIXTURES / "ggml-vocab-llama-spm.gguf",
            *vocab_files()]


def _ggml_read(path: bytes) -> None:
    ctx = ggml.gguf_init_from_file(path, ggml.gguf_init_params(no_alloc=True, ctx=None))
    assert ctx
    ggml.gguf_free(ctx)


def _ours_read(path: Path) -> None:
    GGUFReader(path).close()


def run(report) -> None:
    for path in _files():
        name = f"gguf parse {path.name.removeprefix('ggml-vocab-')}"
        ours = best_time(lambda: _ours_read(path), repeat=5)
        theirs = best_time(lambda: _ggml_read(str(path).encode()), repeat=5)
        report(name, ours, theirs, "ggml C")
        slow = best_time(lambda: gguf.GGUFReader(path, "r"), repeat=1, min_time=0)
        report(name, ours, slow, "gguf-py")
