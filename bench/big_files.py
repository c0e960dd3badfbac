"""Files of the sizes learners bring: Llama-3-shaped GGUFs of 1B, 3B and 8B parameters in Q4_K,
with llama.cpp's llama-bpe vocabulary (128,256 tokens), written once by the project's own
TinyFile and kept in ~/.cache/ggml-lens/bench/ (a few GB: `rm` it to take them back).

The weights are random but not all different: each shape's quantized rows are made once, for
ROWS rows, and repeated down the matrix and across the layers (a bench measures memory and time,
which do not depend on the values; quantizing 8 billion random floats would take most of an hour).

`python -m bench.big_files 1B` writes (or finds) the file and prints its path.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core.types import GGMLType

CACHE = Path.home() / ".cache" / "ggml-lens" / "bench"
ROWS = 256  # distinct rows made per weight shape, repeated to its height
TYPE = GGMLType.Q4_K


@dataclass(frozen=True, slots=True)
class Shape:
    """A Llama 3 model's hyperparameters, as its converter writes them."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    tied: bool  # the output head is the token table (Llama 3.2 1B/3B); 8B has its own


SHAPES = {
    "1B": Shape(2048, 16, 32, 8, 8192, True),
    "3B": Shape(3072, 28, 24, 8, 8192, True),
    "8B": Shape(4096, 32, 32, 8, 14336, False),
}
N_CTX_TRAIN = 131072
ROPE_BASE = 500000.0


def _rows(f, n_in: int, n_out: int) -> np.ndarray:
    """A weight [n_out rows of n_in] in TYPE: ROWS random quantized rows repeated to n_out."""
    from tests.support.tiny_models import quantize_rows

    a = (f.rng.standard_normal((min(ROWS, n_out), n_in)) / np.sqrt(n_in)).astype(np.float32)
    q = quantize_rows(TYPE, a)
    return np.resize(q, (n_out, q.shape[1]))


def write(path: Path, shape: Shape) -> None:
    import gguf

    from tests.support.tiny_models import TinyFile
    from tests.support.vocab import vocab_files

    vocab = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-bpe.gguf")
    with TinyFile(path, "llama", TYPE, 0, vocab) as f:
        assert f.n_vocab is not None
        e, hd = shape.n_embd, shape.n_embd // shape.n_head
        q, kv = e, hd * shape.n_head_kv
        f.decoder_keys(N_CTX_TRAIN, e, shape.n_layer, shape.n_ff, shape.n_head, shape.n_head_kv,
                       f.n_vocab, freq_base=ROPE_BASE)
        f.w.add_rope_dimension_count(hd)
        made: dict[tuple[int, int], np.ndarray] = {}

        def mat(name: str, n_in: int, n_out: int) -> None:
            rows = made.get((n_in, n_out))
            if rows is None:
                rows = made[(n_in, n_out)] = _rows(f, n_in, n_out)
            f.w.add_tensor(name, rows, raw_shape=rows.shape, raw_dtype=gguf.GGMLQuantizationType(int(TYPE)))

        mat("token_embd.weight", e, f.n_vocab)
        for i in range(shape.n_layer):
            f.vec(f"blk.{i}.attn_norm.weight", e)
            mat(f"blk.{i}.attn_q.weight", e, q)
            mat(f"blk.{i}.attn_k.weight", e, kv)
            mat(f"blk.{i}.attn_v.weight", e, kv)
            mat(f"blk.{i}.attn_output.weight", q, e)
            f.vec(f"blk.{i}.ffn_norm.weight", e)
            mat(f"blk.{i}.ffn_gate.weight", e, shape.n_ff)
            mat(f"blk.{i}.ffn_up.weight", e, shape.n_ff)
            mat(f"blk.{i}.ffn_down.weight", shape.n_ff, e)
        f.vec("output_norm.weight", e)
        if not shape.tied:
            mat("output.weight", e, f.n_vocab)


def big_file(size: str) -> Path:
    """The cached file of `size` ('1B', '3B' or '8B'), written first if missing."""
    path = CACHE / f"llama3-{size}-{TYPE.name.lower()}.gguf"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        write(part, SHAPES[size])
        part.rename(path)
    return path


if __name__ == "__main__":
    for size in sys.argv[1:] or ["1B"]:
        print(big_file(size))
