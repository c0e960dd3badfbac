"""Tiny decoder files with random weights, in any weight type, for the comparisons with llama.cpp.

`TinyFile` writes a GGUF file as llama.cpp's converter lays one out (gguf-py's GGUFWriter): the
architecture's keys, then each tensor; `mat` stores a weight matrix in the file's weight type,
quantized by real ggml's ggml_quantize_chunk (the rows llama-quantize would write), or as F32 when
its rows do not fill whole blocks (as llama-quantize falls back). `WEIGHT_TYPES` are the types
real ggml quantizes without an importance matrix; `exact_types()` those whose products the engine
computes as ggml's plain path does (bit for bit), which the per-architecture tests run.

`plain_logits_many` asks one llama.cpp process for the logits of many files (its plain kernels:
no repacked weights, no tiled K-quant products), so a test over every weight type starts
llama.cpp once.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from engine.core.types import GGMLType, TYPE_TRAITS
from tests.support.llamacpp_run import ask_many

N_CTX = 128
PLAIN = dict(extra_bufts=False, tiled=False)

# the weight types a file may hold (llama-quantize's targets and the float types)
_CANDIDATES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
               "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
               "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4")


def _weight_types() -> tuple[GGMLType, ...]:
    import ggml as real

    return tuple(GGMLType[n] for n in _CANDIDATES
                 if not real.ggml_quantize_requires_imatrix(int(GGMLType[n])))


WEIGHT_TYPES = _weight_types()


def exact_types() -> tuple[GGMLType, ...]:
    """The weight types whose products the engine computes bit for bit as ggml's plain path."""
    from engine.compute.kernels.vecdot import EXACT_QUANT

    return tuple(t for t in WEIGHT_TYPES
                 if t in EXACT_QUANT or t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16))


def quantize_rows(type_: GGMLType, rows: np.ndarray) -> np.ndarray:
    """Real ggml's quantizer: float rows -> the type's blocks (uint8, one row of bytes per row)."""
    import ggml as real

    rows = np.ascontiguousarray(rows, np.float32)
    n, k = rows.shape
    tr = TYPE_TRAITS[type_]
    out = np.zeros((n, k // tr.blck_size * tr.type_size), np.uint8)
    src = rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    real.ggml_quantize_chunk(int(type_), src, out.ctypes.data, 0, n, k, None)
    return out


class TinyFile:
    """A GGUF file being written: `with TinyFile(path, arch, type_, seed) as f: f.mat(...)`.
    Its vocabulary is none (prompts are token ids), or `vocab`'s: every tokenizer.* key of that
    GGUF file (one of llama.cpp's ggml-vocab-*.gguf, say)."""

    def __init__(self, path: Path, arch: str, type_: GGMLType = GGMLType.F32, seed: int = 0,
                 vocab: Path | None = None) -> None:
        import gguf

        self.gguf = gguf
        self.path = path
        self.type = type_
        self.rng = np.random.default_rng(seed)
        self.w = gguf.GGUFWriter(str(path), arch)
        if vocab is None:
            self.w.add_tokenizer_model("none")
            self.n_vocab = None
        else:
            fields = gguf.GGUFReader(str(vocab)).fields
            for key, field in fields.items():
                if key.startswith("tokenizer."):
                    sub = field.types[1] if len(field.types) > 1 else None
                    self.w.add_key_value(key, field.contents(), field.types[0], sub)
            self.n_vocab = len(fields["tokenizer.ggml.tokens"].data)

    def decoder_keys(self, n_ctx: int, n_embd: int, n_layer: int, n_ff: int, n_head: int,
                     n_head_kv: int, n_vocab: int, rms_eps: float = 1e-5,
                     freq_base: float = 10000.0) -> None:
        """The keys every transformer decoder's converter writes: context, sizes, heads, the
        RMS norm's epsilon, rope's base, the vocabulary size."""
        w = self.w
        w.add_context_length(n_ctx)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_layer_norm_rms_eps(rms_eps)
        w.add_rope_freq_base(freq_base)
        w.add_vocab_size(n_vocab)

    def mat(self, name: str, *ne: int) -> None:
        """A weight of ggml shape `ne` (ne[0] inputs per row), random with unit-variance outputs."""
        n_in = ne[0]
        a = (self.rng.standard_normal(tuple(reversed(ne))) / np.sqrt(n_in)).astype(np.float32)
        self.store(name, a)

    def store(self, name: str, a: np.ndarray) -> None:
        """A float array (numpy order: rows last) stored in the file's weight type."""
        t, g = self.type, self.gguf.GGMLQuantizationType
        if t == GGMLType.F32 or a.shape[-1] % TYPE_TRAITS[t].blck_size:
            self.w.add_tensor(name, a)
        elif t == GGMLType.F16:
            self.w.add_tensor(name, a.astype(np.float16))
        else:
            q = quantize_rows(t, a.reshape(-1, a.shape[-1]))
            shape = (*a.shape[:-1], q.shape[-1])
            self.w.add_tensor(name, q.reshape(shape), raw_shape=shape, raw_dtype=g(int(t)))

    def vec(self, name: str, n: int, scale: float = 0.1, mean: float = 1.0) -> None:
        """A norm's weight or a bias: F32, near `mean`."""
        self.w.add_tensor(name, (mean + scale * self.rng.standard_normal(n)).astype(np.float32))

    def __enter__(self) -> "TinyFile":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.w.write_header_to_file()
            self.w.write_kv_data_to_file()
            self.w.write_tensors_to_file()
        self.w.close()


def nmse(a, b) -> float:
    """Normalised mean squared error of `a` against `b`, in double: Σ(a-b)² / Σb²."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / (b ** 2).sum())


def plain_logits_many(paths: list[Path], tokens: list[int], tmp: Path,
                      n_threads: int = 2) -> list[np.ndarray]:
    """llama.cpp's logits for every position of `tokens`, one array per file, all files in one
    llama.cpp process on its plain kernels."""
    outs = [tmp / f"logits-{i}.npy" for i in range(len(paths))]
    ask_many([(p, {"logits": tokens, "out": str(o)}) for p, o in zip(paths, outs)], n_threads,
             n_ctx=N_CTX, **PLAIN)
    return [np.load(o) for o in outs]
