"""Ternary types for BitNet b1.58 / TriLM weights: TQ1_0 (1.6875 bpw) and TQ2_0 (2.0625 bpw).

Mirrors `quantize_row_tq1_0_ref`, `quantize_row_tq2_0_ref` and their dequantizers in
ggml-quants.c. Each element is -1, 0 or +1 times one fp16 scale d = amax per 256 elements.
TQ2_0 stores 2 bits per element; TQ1_0 packs 5 trits per byte as a base-3 fraction of 256
(`ceil(q * 256 / 243)`), read back by multiplying by 3^n and taking the top of `q * 3`.
Leaves out: nothing; neither type takes an imatrix.
"""

from __future__ import annotations

import numpy as np

from engine.quants.common import (F32, DotBlocks, Lanes, QuantKind, VecDot, block_dtype,
                                  dequantize_by_lanes, f2h, fp16_value, h2f, half_at, round_away,
                                  safe_inv, scaled, tq1_0_values, unpack_2bit)
from engine.core.types import GGMLType as T

BLOCK_TQ1_0 = block_dtype(("qs", "u1", 48), ("qh", "u1", 4), ("d", "<u2"))
BLOCK_TQ2_0 = block_dtype(("qs", "u1", 64), ("d", "<u2"))

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.int64)


def _trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d = amax and the trits lroundf(x/d) + 1 in {0, 1, 2}."""
    d = np.abs(x).max(axis=-1)
    return d, round_away(x * safe_inv(d)[:, None]) + 1


def _pack_trits(t: np.ndarray) -> np.ndarray:
    """(..., 5) trits, first most significant -> ceil(q * 256 / 243) as uint8."""
    q = (t * _POW3[::-1]).sum(axis=-1) & 0xFF
    return ((q * 256 + 242) // 243).astype(np.uint8)


def quantize_tq1_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_tq1_0_ref."""
    nb = len(x)
    y = np.zeros(nb, BLOCK_TQ1_0)
    d, t = _trits(x)
    y["d"] = f2h(d)
    # elements 0..159: byte m of 32 holds elements m + 32n; 160..239: byte m of 16, m + 16n
    a = t[:, :160].reshape(nb, 5, 32).transpose(0, 2, 1)
    b = t[:, 160:240].reshape(nb, 5, 16).transpose(0, 2, 1)
    y["qs"] = np.concatenate([_pack_trits(a), _pack_trits(b)], axis=1)
    # elements 240..255: byte j holds elements j + 4m (4 trits, shifted up one place)
    c = t[:, 240:].reshape(nb, 4, 4).transpose(0, 2, 1)
    c = np.concatenate([c, np.zeros((nb, 4, 1), np.int64)], axis=-1)
    y["qh"] = _pack_trits(c)
    return y


# dequantize_row_tq1_0: (trit - 1) * d, trit n of byte q being ((uint8_t)(q * 3^n) * 3) >> 8
dequantize_tq1_0 = dequantize_by_lanes(T.TQ1_0)


def quantize_tq2_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_tq2_0_ref: byte m of each 32-byte group holds elements m + 32n at bits 2n."""
    nb = len(x)
    y = np.zeros(nb, BLOCK_TQ2_0)
    d, t = _trits(x)
    y["d"] = f2h(d)
    t = (t & 3).reshape(nb, 2, 4, 32)
    y["qs"] = (t << (2 * np.arange(4))[None, None, :, None]).sum(axis=2).reshape(nb, 64)
    return y


def dequantize_tq2_0(b: np.ndarray) -> np.ndarray:
    """dequantize_row_tq2_0: (q - 1) * d, with qs packed like Q2_K's."""
    q = unpack_2bit(b["qs"])
    q -= np.uint8(1)  # wraps; read back as int8
    return scaled(q.view(np.int8), h2f(b["d"]))


def _trit_quants(dequantize_with_d):
    """Each element's trit minus 1 (in {-1, 0, 1}): the block dequantized with d = 1.0."""
    def unpack(b: np.ndarray) -> np.ndarray:
        one = b.copy()
        one["d"] = 0x3C00
        return dequantize_with_d(one).astype(int)
    return unpack


# --- as vec_dot multiplies them (ggml_vec_dot_tq1_0_q8_K, _tq2_0_q8_K) -------------------------
# The values plus 1, unsigned as maddubs multiplies them; vec_dot takes the 1 back through the
# activations' block sums (Lanes.TERNARY).

def dot_blocks_tq1_0(raw: np.ndarray) -> DotBlocks:
    """TQ1_0: the trits, as ggml's AVX2 code reads them: the top two bits of 3q, by byte
    averages ((uint8_t)(q * 3^n) * 3) >> 8 of every byte."""
    return DotBlocks(tq1_0_values(raw) + 1, half_at(raw, 52))


def dot_blocks_tq2_0(raw: np.ndarray) -> DotBlocks:
    """TQ2_0: the 2-bit quants (element 128c + 32k + l at bits 2k of qs[32c + l])."""
    return DotBlocks(unpack_2bit(raw[:, :64]).astype(np.int16), half_at(raw, 64))


def dequantize_ref_tq2_0(b: np.void) -> list:
    """dequantize_row_tq2_0, one element at a time."""
    d = F32(fp16_value(b["d"]))
    y = []
    for j in (0, 32):  # two groups of 32 bytes, each holding 4 x 32 elements
        for n in range(4):
            y += [F32(int((b["qs"][j + m] >> (2 * n)) & 3) - 1) * d for m in range(32)]
    return y


_TRIT_FORMULA = "value = d × q (q ∈ {−1, 0, 1})"
KINDS = [
    QuantKind(T.TQ1_0, BLOCK_TQ1_0, dequantize_tq1_0, quantize_tq1_0,
              fields=(("qs", "5 trits per byte, base 3 scaled to 256 (elements m+32n, m+16n)"),
                      ("qh", "4 trits per byte for the last 16 elements (j + 4m)"),
                      ("d", "scale = amax, fp16")),
              formula=_TRIT_FORMULA, unpack=_trit_quants(dequantize_tq1_0),
              vec_dot=VecDot(dot_blocks_tq1_0, Lanes.TERNARY)),
    QuantKind(T.TQ2_0, BLOCK_TQ2_0, dequantize_tq2_0, quantize_tq2_0,
              fields=(("qs", "2 bits per element: byte m holds elements m+32n at bits 2n"),
                      ("d", "scale = amax, fp16")),
              formula=_TRIT_FORMULA, unpack=_trit_quants(dequantize_tq2_0),
              dequantize_ref=dequantize_ref_tq2_0, vec_dot=VecDot(dot_blocks_tq2_0, Lanes.TERNARY)),
]
