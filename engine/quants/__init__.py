"""ggml's quantized types: block structs, quantize, dequantize and the quantized dot product.

The facade uses ggml's names: `ggml_quantize_chunk`, `ggml_get_type_traits`,
`ggml_quantize_requires_imatrix`. One module per family holds the block dtypes (numpy mirrors of
ggml-common.h) and the vectorised algorithms; `QUANT_KINDS` maps each ggml_type to them.
Leaves out: importance-matrix (imatrix) quantization (so IQ2_XXS, IQ2_XS and IQ1_S, which need
one, cannot be quantized), and the repacked/interleaved CPU layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.core.api import query, writes
from engine.core.errors import GGMLAssertionError, ggml_assert
from engine.quants import fp4, iq4, iqgrid, kquants, legacy, ternary
# the families' repacked layouts register themselves in engine/quants/repack.py's LAYOUTS
from engine.quants import repack_kquant, repack_legacy  # noqa: F401
from engine.quants.common import QuantKind
from engine.core.types import (GGMLType, bf16_bits_to_fp32, fp16_bits_to_fp32, fp32_to_bf16_bits,
                          fp32_to_fp16_bits, traits)

# every quantized type's record (QuantKind), from its family's module
QUANT_KINDS: dict[GGMLType, QuantKind] = {
    k.type: k for mod in (legacy, kquants, iq4, ternary, fp4, iqgrid) for k in mod.KINDS
}


@query
def ggml_quantize_requires_imatrix(type_: int) -> bool:
    """ggml_quantize_requires_imatrix: IQ2_XXS, IQ2_XS and IQ1_S cannot be quantized without one
    (their records say so)."""
    kind = QUANT_KINDS.get(GGMLType(type_))
    return kind is not None and kind.requires_imatrix


def _kind(type_: int) -> QuantKind:
    t = GGMLType(type_)
    if t not in QUANT_KINDS:
        raise ValueError(f"{traits(t).type_name}: not a quantized type the engine knows")
    return QUANT_KINDS[t]


def _blocks(type_: int, raw: np.ndarray | bytes, n: int) -> np.ndarray:
    """View the first n elements' worth of raw bytes as the type's block structs (nb,)."""
    tr = traits(type_)
    ggml_assert(n % tr.blck_size == 0, "k % qk == 0", f"dequantize_row_{tr.type_name}",
                f"{n} elements of {tr.type_name} (block size {tr.blck_size})")
    nb = n // tr.blck_size
    buf = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray)) else raw
    buf = np.ascontiguousarray(np.asarray(buf).reshape(-1).view(np.uint8)[: nb * tr.type_size])
    if buf.size < nb * tr.type_size:
        raise ValueError(f"{tr.type_name}: {n} elements need {nb * tr.type_size} bytes, "
                         f"got {buf.size}")
    return buf.view(_kind(type_).dtype)


def dequantize(type_: int, raw: np.ndarray | bytes, n: int) -> np.ndarray:
    """to_float (dequantize_row_<type>): n elements from raw block bytes -> float32 (n,)."""
    t = GGMLType(type_)
    if t == GGMLType.F32:
        return np.frombuffer(bytes(raw), np.float32, n).copy() if isinstance(raw, bytes) \
            else np.asarray(raw).reshape(-1).view(np.float32)[:n].copy()
    if t in (GGMLType.F16, GGMLType.BF16):
        bits = np.asarray(np.frombuffer(raw, np.uint16) if isinstance(raw, bytes)
                          else np.asarray(raw).reshape(-1).view(np.uint16))[:n]
        return fp16_bits_to_fp32(bits) if t == GGMLType.F16 else bf16_bits_to_fp32(bits)
    kind = _kind(t)
    if kind.dequantize is None:
        raise ValueError(f"{traits(t).type_name}: ggml has no to_float for this type")
    with np.errstate(all="ignore"):  # inf/nan scales behave as in C, silently
        return kind.dequantize(_blocks(t, raw, n)).reshape(-1)


def _check_rows(type_: int, x: np.ndarray, fn: str) -> np.ndarray:
    tr = traits(type_)
    x = np.ascontiguousarray(x, dtype=np.float32)
    ggml_assert(x.shape[-1] % tr.blck_size == 0, f"n_per_row % {tr.blck_size} == 0", fn,
                f"row of {x.shape[-1]} elements is not a multiple of {tr.type_name}'s block "
                f"size {tr.blck_size}")
    return x.reshape(-1, tr.blck_size)


def quantize(type_: int, x2d: np.ndarray, *, ref: bool = False, cpu: bool = False) -> np.ndarray:
    """quantize_<type> without imatrix (the ggml_quantize_chunk path): float32 rows -> uint8 bytes.

    x2d has shape (nrows, n_per_row); the result has shape (nrows, row_size). `ref=True` uses the
    type's from_float_ref instead (it differs for IQ4_NL), `cpu=True` the CPU's from_float
    (it differs for Q8_0 and Q8_1 on x86 AVX2).
    """
    t = GGMLType(type_)
    tr = traits(t)
    x2d = np.atleast_2d(np.asarray(x2d, dtype=np.float32))
    if t == GGMLType.F16:
        return fp32_to_fp16_bits(x2d).view(np.uint8).reshape(len(x2d), -1)
    if t == GGMLType.BF16:
        return fp32_to_bf16_bits(x2d).view(np.uint8).reshape(len(x2d), -1)
    if t == GGMLType.F32:
        return x2d.copy().view(np.uint8)
    kind = _kind(t)
    fn = kind.quantize
    if ref or cpu:
        fn = kind.quantize_ref or fn
    if cpu:
        fn = kind.from_float_cpu or fn
    if fn is None and ggml_quantize_requires_imatrix(t):
        raise ValueError(f"{tr.type_name}: quantizing needs an importance matrix "
                         "(ggml_quantize_requires_imatrix), which the engine does not implement")
    if fn is None:
        raise ValueError(f"{tr.type_name}: the engine has no port of ggml's quantize_{tr.type_name}; "
                         "it can only dequantize this type")
    blocks = _check_rows(t, x2d, f"quantize_{tr.type_name}")
    with np.errstate(all="ignore"):  # overflow to inf and 0/0 behave as in C, silently
        return fn(blocks).view(np.uint8).reshape(len(x2d), -1)


@writes()
def ggml_quantize_chunk(type_: int, src: np.ndarray, dst: np.ndarray, start: int, nrows: int,
                        n_per_row: int, imatrix: np.ndarray | None = None) -> int:
    """ggml_quantize_chunk: quantize rows [start/n_per_row, +nrows) of src into dst; bytes written."""
    t = GGMLType(type_)
    tr = traits(t)
    if ggml_quantize_requires_imatrix(t):
        ggml_assert(imatrix is not None, "imatrix != NULL", "ggml_quantize_chunk",
                    f"{tr.type_name} needs an importance matrix")
    if imatrix is not None:
        raise ValueError(f"{tr.type_name}: imatrix quantization is not implemented by the engine")
    ggml_assert(tr.blck_size > 0 and start % tr.blck_size == 0,
                "start % type_traits[type].blck_size == 0", "ggml_quantize_chunk",
                f"start {start}, {tr.type_name} block size {tr.blck_size}")
    ggml_assert(start % n_per_row == 0, "start % n_per_row == 0", "ggml_quantize_chunk",
                f"start {start}, n_per_row {n_per_row}")
    if t not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16) and t not in QUANT_KINDS:
        raise ValueError(f"{tr.type_name}: ggml_quantize_chunk has no quantizer for this type")
    src = np.asarray(src, dtype=np.float32).reshape(-1)
    x = src[start: start + nrows * n_per_row].reshape(nrows, n_per_row)
    out = quantize(t, x).reshape(-1)
    row_size = out.size // max(nrows, 1)
    offset = (start // n_per_row) * row_size
    dst.reshape(-1).view(np.uint8)[offset: offset + out.size] = out
    return int(out.size)


@dataclass(frozen=True)
class TypeTraits:
    """struct ggml_type_traits, with the conversions as numpy functions."""

    type_name: str
    blck_size: int
    type_size: int
    is_quantized: bool
    to_float: Callable[[np.ndarray | bytes, int], np.ndarray] | None  # (raw bytes, k) -> float32
    from_float_ref: Callable[[np.ndarray], np.ndarray] | None  # float32 (k,) -> uint8 bytes


@query
def ggml_get_type_traits(type_: int) -> TypeTraits:
    """ggml_get_type_traits: name, block geometry and the to_float / from_float_ref functions."""
    t = GGMLType(type_)
    tr = traits(t)
    kind = QUANT_KINDS.get(t)
    plain = t in (GGMLType.F16, GGMLType.BF16)
    # ggml's base traits have no to_float for Q8_1/Q8_K (intermediate types) and no
    # from_float_ref for Q8_K, IQ1_M and the types that need an imatrix (their records say so)
    has_to = plain or (kind is not None and kind.dequantize is not None and kind.traits_to_float)
    has_from = plain or (kind is not None and (kind.quantize_ref or kind.quantize) is not None
                         and kind.traits_from_float_ref and not kind.requires_imatrix)
    to_float = (lambda raw, k, _t=t: dequantize(_t, raw, k)) if has_to else None
    from_ref = (lambda x, _t=t: quantize(_t, np.asarray(x).reshape(1, -1), ref=True).reshape(-1)) \
        if has_from else None
    return TypeTraits(tr.type_name, tr.blck_size, tr.type_size, tr.is_quantized, to_float,
                      from_ref)


def from_float(type_: int, x: np.ndarray) -> np.ndarray:
    """The CPU's from_float (type_traits_cpu): how mul_mat converts src1 rows to vec_dot_type."""
    return quantize(type_, np.atleast_2d(x), cpu=True)


__all__ = [
    "GGMLAssertionError", "QUANT_KINDS", "dequantize", "from_float", "ggml_get_type_traits",
    "ggml_quantize_chunk", "ggml_quantize_requires_imatrix", "quantize",
]
