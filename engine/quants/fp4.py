"""4-bit float types: MXFP4 (32 elements, one E8M0 exponent) and NVFP4 (64, four UE4M3 scales).

Mirrors `quantize_row_mxfp4_ref`, `quantize_row_nvfp4_ref` and their dequantizers in
ggml-quants.c, with the scale converters of ggml-impl.h (`ggml_e8m0_to_fp32_half`,
`ggml_fp32_to_ue4m3`, `ggml_ue4m3_to_fp32`). Elements are e2m1 codes looked up in the doubled
table `kvalues_mxfp4`, so every scale is stored as half its nominal value.
Leaves out: nothing else; neither type takes an imatrix.
"""

from __future__ import annotations

import numpy as np

from engine.libm import log2f
from engine.quants.common import (F32, KVALUES_MXFP4, DotBlocks, Lanes, QuantKind, VecDot,
                                  block_dtype, byte_rows, c_int, f32, nibble_of, nibbles,
                                  pack_nibbles, scaled, SubScales, unpack_nibbles)
from engine.core.types import GGMLType as T

BLOCK_MXFP4 = block_dtype(("e", "u1"), ("qs", "u1", 16))
BLOCK_NVFP4 = block_dtype(("d", "u1", 4), ("qs", "u1", 32))

_KV = KVALUES_MXFP4.astype(F32)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e-128) as float32 (subnormal patterns for e < 2)."""
    e = np.asarray(e).astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23)
    return bits.astype(np.uint32).view(F32)


def _ue4m3_half_table() -> np.ndarray:
    """ggml_ue4m3_to_fp32 for all 256 codes (it returns half the UE4M3 value)."""
    out = np.zeros(256, F32)
    for x in range(256):
        exp, man = (x >> 3) & 0xF, x & 7
        if x in (0, 0x7F):
            continue
        raw = np.ldexp(F32(man), -9) if exp == 0 else np.ldexp(F32(1 + man / 8), exp - 7)
        out[x] = F32(raw) * F32(0.5)
    return out


UE4M3_HALF = _ue4m3_half_table()


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3: positive float32 -> UE4M3 code (bias 7, 3 mantissa bits, max 448)."""
    x = f32(x)
    pos = x > 0
    x = np.where(x > F32(448.0), F32(448.0), x)
    bits = x.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int64) - 127 + 7
    man = ((bits >> 20) & 7).astype(np.int64) + ((bits >> 19) & 1).astype(np.int64)
    carry = man > 7
    exp, man = np.where(carry, exp + 1, exp), np.where(carry, 0, man)
    normal = np.where(exp >= 15, 0x7E, (exp << 3) | man)
    sub = np.minimum(c_int(x * F32(512.0) + F32(0.5)), 7)
    sub = np.where(sub < 1, 0, sub)
    code = np.where(exp - carry <= 0, sub, normal)  # the subnormal test uses the exponent before rounding
    return np.where(pos, code, 0).astype(np.uint8)


def _best_index_fp4(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """best_index_mxfp4: the first of the 16 levels with the smallest |kvalue*d - x|."""
    err = np.abs(_KV * d[..., None, None] - x[..., None])  # (..., n, 16)
    return np.argmin(err, axis=-1)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127, then nearest e2m1 code."""
    y = np.zeros(len(x), BLOCK_MXFP4)
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = log2f(amax)  # C's log2f, as quantize_row_mxfp4_ref calls it
        e = np.where(amax > 0, c_int(np.floor(lg) - F32(2) + F32(127)) & 0xFF, 0)
    y["e"] = e
    y["qs"] = pack_nibbles(_best_index_fp4(x, e8m0_to_fp32_half(e)))
    return y


def dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    """dequantize_row_mxfp4: kvalue * 2^(e-128)."""
    return scaled(nibbles(byte_rows(b), 1, 17, 16, KVALUES_MXFP4), e8m0_to_fp32_half(b["e"]))


def quantize_nvfp4(x: np.ndarray) -> np.ndarray:
    """quantize_row_nvfp4_ref: per 16-element sub-block, d = ue4m3(amax/6), then nearest code."""
    y = np.zeros(len(x), BLOCK_NVFP4)
    xs = x.reshape(len(x), 4, 16)
    ue = fp32_to_ue4m3(np.abs(xs).max(axis=-1) / F32(6.0))  # (nb, 4)
    y["d"] = ue
    idx = _best_index_fp4(xs, UE4M3_HALF[ue])  # (nb, 4, 16)
    y["qs"] = pack_nibbles(idx).reshape(len(x), 32)
    return y


def dequantize_nvfp4(b: np.ndarray) -> np.ndarray:
    """dequantize_row_nvfp4: kvalue * ue4m3(d[s]) per 16-element sub-block s."""
    q = nibbles(byte_rows(b), 4, 36, 8, KVALUES_MXFP4)  # (nb, 64): per 8 bytes, low then high
    return scaled(q.reshape(-1, 4, 16), UE4M3_HALF[b["d"]]).reshape(-1, 64)


def _mxfp4_quants(b: np.ndarray) -> np.ndarray:
    return unpack_nibbles(b["qs"])


def _nvfp4_quants(b: np.ndarray) -> np.ndarray:
    return unpack_nibbles(b["qs"].reshape(-1, 4, 8))


def _nvfp4_sub_scales(b: np.ndarray) -> SubScales:
    return SubScales(tuple(float(UE4M3_HALF[v]) for v in b["d"][0]))


# --- as vec_dot multiplies them (ggml_vec_dot_mxfp4_q8_0) --------------------------------------

def dot_blocks_mxfp4(raw: np.ndarray) -> DotBlocks:
    """MXFP4: kvalues_mxfp4[nibble] (low nibbles: elements 0-15), the scale 2^(e - 128)
    (ggml_e8m0_to_fp32_half)."""
    q = nibbles(raw, 1, 17, 16, KVALUES_MXFP4).astype(np.int16)
    return DotBlocks(q, e8m0_to_fp32_half(raw[:, 0]))


def dequantize_ref_mxfp4(b: np.void) -> list:
    """dequantize_row_mxfp4, one element at a time."""
    e = int(b["e"])
    d = np.array([0x00200000 << e if e < 2 else (e - 1) << 23], np.uint32).view(F32)[0]
    return [F32(KVALUES_MXFP4[nibble_of(b, j)]) * d for j in range(32)]


KINDS = [
    QuantKind(T.MXFP4, BLOCK_MXFP4, dequantize_mxfp4, quantize_mxfp4,
              fields=(("e", "shared E8M0 exponent; scale = 2^(e-128) (half, for doubled codes)"),
                      ("qs", "e2m1 codes: low nibble = element j, high = j+16")),
              unpack=_mxfp4_quants, dequantize_ref=dequantize_ref_mxfp4,
              vec_dot=VecDot(dot_blocks_mxfp4, Lanes.SIGNED, paired=True)),
    QuantKind(T.NVFP4, BLOCK_NVFP4, dequantize_nvfp4, quantize_nvfp4,
              fields=(("d", "UE4M3 scale per 16-element sub-block"),
                      ("qs", "e2m1 codes, 8 bytes per sub-block: low nibble j, high j+8")),
              unpack=_nvfp4_quants, sub_scales=_nvfp4_sub_scales),
]
