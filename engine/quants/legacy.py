"""The legacy block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32 elements) and Q1_0 (128).

Mirrors `quantize_row_<t>_ref` and `dequantize_row_<t>` in ggml-quants.c, plus the CPU's AVX2
`quantize_row_q8_0` / `quantize_row_q8_1` (ggml-cpu/arch/x86/quants.c), which round half to even
with `id = 127/amax` and are what mul_mat really feeds its dot products.
Leaves out: the imatrix-weighted `quantize_row_<t>_impl` paths.
"""

from __future__ import annotations

import numpy as np

from engine.lanes import lanes, twin
from engine.quants.common import (F32, DotBlocks, Lanes, Mins, QuantKind, VecDot, absmax_signed,
                                  block_dtype, byte_rows, c_int, c_int8, copy_runs,
                                  dequantize_by_lanes, f2h, first_max, first_min, flip_nan_signs,
                                  fp16_value, h2f, half_at, nibble_of, nibbles, pack_nibbles,
                                  round_away, safe_inv, scaled, seq_sum, unpack_nibbles)
from engine.core.types import GGMLType as T

BLOCK_Q4_0 = block_dtype(("d", "<u2"), ("qs", "u1", 16))
BLOCK_Q4_1 = block_dtype(("d", "<u2"), ("m", "<u2"), ("qs", "u1", 16))
BLOCK_Q5_0 = block_dtype(("d", "<u2"), ("qh", "u1", 4), ("qs", "u1", 16))
BLOCK_Q5_1 = block_dtype(("d", "<u2"), ("m", "<u2"), ("qh", "u1", 4), ("qs", "u1", 16))
BLOCK_Q8_0 = block_dtype(("d", "<u2"), ("qs", "i1", 32))
BLOCK_Q8_1 = block_dtype(("d", "<u2"), ("s", "<u2"), ("qs", "i1", 32))
BLOCK_Q1_0 = block_dtype(("d", "<u2"), ("qs", "u1", 16))

_BITS32 = np.arange(32, dtype=np.uint32)


def _qh_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 quants -> qh[4] (one little-endian uint32, bit j for element j)."""
    word = ((((q >> 4) & 1).astype(np.uint32)) << _BITS32).sum(axis=-1, dtype=np.uint32)
    return word.astype("<u4").view(np.uint8).reshape(-1, 4)


def _qh_unpack(qh: np.ndarray) -> np.ndarray:
    """qh[4] (nb, 4) -> (nb, 32) high bits 0/1: bit j of the little-endian uint32 is element j."""
    qh = np.ascontiguousarray(qh, dtype=np.uint8)
    return np.unpackbits(qh.reshape(-1), bitorder="little").reshape(len(qh), 32)


def _run(raw: np.ndarray, start: int, n: int) -> np.ndarray:
    """Bytes [start, start+n) of every block, as a contiguous (nb, n) array."""
    out = np.empty((len(raw), n), np.uint8)
    copy_runs(out, raw[:, start:start + n])
    return out


def nibbles_with_qh(raw: np.ndarray, qh: int, qs: int) -> np.ndarray:
    """Q5_0 / Q5_1 quants 0..31: `(nibble | hbit << 4)`, qh at byte qh, qs at byte qs."""
    q = nibbles(raw, qs, qs + 16, 16)
    q |= _qh_unpack(_run(raw, qh, 4)) * np.uint8(16)  # hbit << 4 (numpy's uint8 << is slow)
    return q


# --- Q4_0 / Q5_0: symmetric, d = max / -8 (or -16) ----------------------------------------------

def _quantize_sym(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """The shared part of quantize_row_q4_0_ref / q5_0_ref: fp16 d and int quants 0..2*levels-1."""
    _, vmax = absmax_signed(x)
    d = vmax / F32(-levels)
    iv = safe_inv(d)
    q = np.minimum(2 * levels - 1, c_int8(x * iv[:, None] + F32(levels + 0.5)))
    return f2h(d), q & 0xFF


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_0_ref."""
    y = np.zeros(len(x), BLOCK_Q4_0)
    y["d"], q = _quantize_sym(x, 8)
    y["qs"] = pack_nibbles(q)
    return y


def dequantize_q4_0(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q4_0: (q - 8) * d."""
    q = nibbles(byte_rows(b), 2, 18, 16)
    q -= np.uint8(8)  # wraps; read back as int8 below
    return scaled(q.view(np.int8), h2f(b["d"]))


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_0_ref."""
    y = np.zeros(len(x), BLOCK_Q5_0)
    y["d"], q = _quantize_sym(x, 16)
    y["qs"] = pack_nibbles(q & 0x0F)
    y["qh"] = _qh_bits(q)
    return y


def dequantize_q5_0(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q5_0: ((nibble | hbit << 4) - 16) * d."""
    q = nibbles_with_qh(byte_rows(b), 2, 6)
    q -= np.uint8(16)
    return scaled(q.view(np.int8), h2f(b["d"]))


# --- Q4_1 / Q5_1: asymmetric, x = d * q + m -----------------------------------------------------

def _quantize_asym(x: np.ndarray, nmax: int):
    vmin, vmax = first_min(x), first_max(x)
    d = (vmax - vmin) / F32(nmax)
    iv = safe_inv(d)
    return f2h(d), f2h(vmin), c_int((x - vmin[:, None]) * iv[:, None] + F32(0.5))


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_1_ref."""
    y = np.zeros(len(x), BLOCK_Q4_1)
    y["d"], y["m"], q = _quantize_asym(x, 15)
    y["qs"] = pack_nibbles(np.minimum(15, ((q + 128) & 0xFF) - 128) & 0xFF)
    return y


def dequantize_q4_1(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q4_1: q * d + m."""
    y = scaled(nibbles(byte_rows(b), 4, 20, 16), h2f(b["d"]))
    y += h2f(b["m"])[:, None]
    return y


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_1_ref (no clamp: the cast to uint8 keeps the low byte)."""
    y = np.zeros(len(x), BLOCK_Q5_1)
    y["d"], y["m"], q = _quantize_asym(x, 31)
    q &= 0xFF
    y["qs"] = pack_nibbles(q & 0x0F)
    y["qh"] = _qh_bits(q)
    return y


def dequantize_q5_1(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q5_1: (nibble | hbit << 4) * d + m."""
    y = scaled(nibbles_with_qh(byte_rows(b), 4, 8), h2f(b["d"]))
    y += h2f(b["m"])[:, None]
    return y


# --- Q8_0 / Q8_1 -------------------------------------------------------------------------------

def _q8_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = np.abs(x).max(axis=-1) / F32(127)
    q = c_int8(round_away(x * safe_inv(d)[:, None]))
    return d, q


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d) (half away from zero)."""
    y = np.zeros(len(x), BLOCK_Q8_0)
    d, y["qs"] = _q8_ref(x)
    y["d"] = f2h(d)
    return y


dequantize_q8_0 = dequantize_by_lanes(T.Q8_0)  # dequantize_row_q8_0: q * d


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_1_ref: as Q8_0, plus s = fp16(d * sum(q))."""
    y = np.zeros(len(x), BLOCK_Q8_1)
    d, q = _q8_ref(x)
    y["qs"], y["d"] = q, f2h(d)
    y["s"] = f2h(q.sum(axis=-1).astype(F32) * d)
    return y


def _q8_avx2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The AVX2 path: id = 127/amax, round half to even, saturate to int8."""
    amax = np.abs(x).max(axis=-1)
    d = amax / F32(127)
    iv = np.zeros_like(amax)
    np.divide(F32(127), amax, out=iv, where=amax != 0)
    r = np.rint(x * iv[:, None])  # _mm256_round_ps(_MM_ROUND_NEAREST)
    qi = c_int(r)  # _mm256_cvtps_epi32; the int32 sum for Q8_1's s is taken before saturation
    return d, qi, np.clip(qi, -128, 127)


def from_float_q8_0_ref(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 (ggml-cpu, x86 AVX2) in numpy, beside from_float_q8_0 (the same in C)."""
    y = np.zeros(len(x), BLOCK_Q8_0)
    d, _, y["qs"] = _q8_avx2(x)
    y["d"] = f2h(d)
    return y


@twin("quantize_q8_0")
def quantize_q8_0_into(x, out) -> None:
    """engine._lanes.quantize_q8_0(x, out): whole blocks of 32 floats -> 34-byte Q8_0 blocks in
    out, as from_float_q8_0_ref computes them."""
    with np.errstate(all="ignore"):  # NaN and infinite blocks are quantized as C does
        np.frombuffer(out, BLOCK_Q8_0)[:] = from_float_q8_0_ref(np.frombuffer(x, F32).reshape(-1, 32))


def from_float_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 (ggml-cpu, x86 AVX2): mul_mat's src1 conversion for Q8_0 weights
    (lanes.quantize_q8_0: in C, or from_float_q8_0_ref)."""
    y = np.empty(len(x), BLOCK_Q8_0)
    lanes.quantize_q8_0(np.ascontiguousarray(x, dtype=np.float32), y.view(np.uint8))
    return y


def from_float_q8_1(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_1 (ggml-cpu, x86 AVX2)."""
    y = np.zeros(len(x), BLOCK_Q8_1)
    d, qi, y["qs"] = _q8_avx2(x)
    y["d"] = f2h(d)
    y["s"] = f2h(d * qi.sum(axis=-1).astype(np.int32).astype(F32))
    return y


# --- Q1_0: sign bits and one scale --------------------------------------------------------------

def quantize_q1_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q1_0_ref: d = mean |x| (summed left to right); bit j set when x[j] >= 0."""
    y = np.zeros(len(x), BLOCK_Q1_0)
    y["d"] = f2h(seq_sum(np.abs(x)) / F32(128))
    y["qs"] = np.packbits(x >= 0, axis=-1, bitorder="little")
    return y


def dequantize_q1_0(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q1_0: bit ? d : -d (as d * +-1, with C's -d for a NaN d)."""
    d = h2f(b["d"])
    bits = np.unpackbits(_run(byte_rows(b), 2, 16).reshape(-1), bitorder="little")
    s = bits * np.uint8(2) - np.uint8(1)  # 1 -> +1, 0 -> 255 = -1 as int8
    y = scaled(s.view(np.int8).reshape(-1, 128), d)
    flip_nan_signs(y, s.view(np.int8).reshape(-1, 128), d)
    return y


def _nibble_quants(b: np.ndarray) -> np.ndarray:
    """Q4_0/Q4_1: element j is the low nibble of qs[j], element j+16 the high one."""
    return unpack_nibbles(b["qs"])


def _q5_quants(b: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: the low nibbles with bit j of qh on top."""
    return unpack_nibbles(b["qs"]) | (_qh_unpack(b["qh"]) << 4)


def _q8_quants(b: np.ndarray) -> np.ndarray:
    return b["qs"]


def _q1_quants(b: np.ndarray) -> np.ndarray:
    return np.unpackbits(b["qs"], axis=-1, bitorder="little")


# --- as vec_dot multiplies them (ggml_vec_dot_q{4,5,8}_0_q8_0, _q{4,5}_1_q8_1) -------------------
# Blocks (n, size) uint8 -> DotBlocks: the 32 integers of each block (low nibbles: elements
# 0-15), d, and Q4_1's and Q5_1's m as dmin.

def dot_blocks_q4_0(raw: np.ndarray) -> DotBlocks:
    """Q4_0: nibble - 8."""
    return DotBlocks(nibbles(raw, 2, 18, 16).astype(np.int16) - 8, half_at(raw, 0))


def dot_blocks_q5_0(raw: np.ndarray) -> DotBlocks:
    """Q5_0: nibble + 16 * its qh bit - 16."""
    return DotBlocks(nibbles_with_qh(raw, 2, 6).astype(np.int16) - 16, half_at(raw, 0))


def dot_blocks_q8_0(raw: np.ndarray) -> DotBlocks:
    """Q8_0: the int8 quants."""
    return DotBlocks(raw[:, 2:].view(np.int8).astype(np.int16), half_at(raw, 0))


def dot_blocks_q4_1(raw: np.ndarray) -> DotBlocks:
    """Q4_1: the nibbles, unsigned; m apart."""
    return DotBlocks(nibbles(raw, 4, 20, 16).astype(np.int16), half_at(raw, 0), half_at(raw, 2))


def dot_blocks_q5_1(raw: np.ndarray) -> DotBlocks:
    """Q5_1: nibble + 16 * its qh bit, unsigned; m apart."""
    return DotBlocks(nibbles_with_qh(raw, 4, 8).astype(np.int16), half_at(raw, 0), half_at(raw, 2))


# --- one block, one element at a time (dequantize_row_<t>) -------------------------------------

def dequantize_ref_q4_0(b: np.void) -> list:
    """dequantize_row_q4_0, one element at a time."""
    d = F32(fp16_value(b["d"]))
    return [F32(nibble_of(b, j) - 8) * d for j in range(32)]


def dequantize_ref_q4_1(b: np.void) -> list:
    """dequantize_row_q4_1, one element at a time."""
    d, m = F32(fp16_value(b["d"])), F32(fp16_value(b["m"]))
    return [F32(nibble_of(b, j)) * d + m for j in range(32)]


def dequantize_ref_q5_0(b: np.void) -> list:
    """dequantize_row_q5_0, one element at a time."""
    d = F32(fp16_value(b["d"]))
    qh = int.from_bytes(bytes(b["qh"]), "little")
    return [F32((nibble_of(b, j) | (((qh >> j) & 1) << 4)) - 16) * d for j in range(32)]


def dequantize_ref_q8_0(b: np.void) -> list:
    """dequantize_row_q8_0, one element at a time."""
    d = F32(fp16_value(b["d"]))
    return [F32(q) * d for q in b["qs"]]


_F = (("d", "scale, fp16"),)
KINDS = [
    QuantKind(T.Q4_0, BLOCK_Q4_0, dequantize_q4_0, quantize_q4_0,
              fields=_F + (("qs", "4-bit quants: low nibble = element j, high = j+16; value (q-8)*d"),),
              formula="value = d × (q − 8)", unpack=_nibble_quants,
              dequantize_ref=dequantize_ref_q4_0, vec_dot=VecDot(dot_blocks_q4_0, Lanes.SIGNED)),
    QuantKind(T.Q4_1, BLOCK_Q4_1, dequantize_q4_1, quantize_q4_1,
              fields=_F + (("m", "minimum, fp16"),
                           ("qs", "4-bit quants: low nibble = element j, high = j+16; q*d+m")),
              formula="value = d × q + m", unpack=_nibble_quants,
              dequantize_ref=dequantize_ref_q4_1,
              vec_dot=VecDot(dot_blocks_q4_1, Lanes.PLAIN, Mins.OFFSETS)),
    QuantKind(T.Q5_0, BLOCK_Q5_0, dequantize_q5_0, quantize_q5_0,
              fields=_F + (("qh", "5th bit of each quant, one uint32: bit j = element j"),
                           ("qs", "low 4 bits: low nibble = element j, high = j+16; (q-16)*d")),
              formula="value = d × (q − 16)", unpack=_q5_quants,
              dequantize_ref=dequantize_ref_q5_0, vec_dot=VecDot(dot_blocks_q5_0, Lanes.SIGNED)),
    QuantKind(T.Q5_1, BLOCK_Q5_1, dequantize_q5_1, quantize_q5_1,
              fields=_F + (("m", "minimum, fp16"),
                           ("qh", "5th bit of each quant, one uint32: bit j = element j"),
                           ("qs", "low 4 bits: low nibble = element j, high = j+16; q*d+m")),
              formula="value = d × q + m", unpack=_q5_quants,
              vec_dot=VecDot(dot_blocks_q5_1, Lanes.PLAIN, Mins.OFFSETS)),
    QuantKind(T.Q8_0, BLOCK_Q8_0, dequantize_q8_0, quantize_q8_0, from_float_cpu=from_float_q8_0,
              fields=_F + (("qs", "int8 quants; value q*d"),),
              formula="value = d × q", unpack=_q8_quants,
              dequantize_ref=dequantize_ref_q8_0, vec_dot=VecDot(dot_blocks_q8_0, Lanes.SIGNED)),
    QuantKind(T.Q8_1, BLOCK_Q8_1, None, quantize_q8_1, from_float_cpu=from_float_q8_1,
              fields=_F + (("s", "d * sum(qs), fp16"), ("qs", "int8 quants; value q*d")),
              formula="value = d × q", unpack=_q8_quants),
    QuantKind(T.Q1_0, BLOCK_Q1_0, dequantize_q1_0, quantize_q1_0,
              fields=_F + (("qs", "sign bits, element j = bit j%8 of byte j/8; value bit ? d : -d"),),
              unpack=_q1_quants),
]
