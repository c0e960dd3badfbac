"""ggml's AVX2 vec_dot of TQ2_0, TQ1_0, IQ1_M (with Q8_K activations) and MXFP4 (with Q8_0):
their blocks decoded and their lanes, the numpy twins of engine/_lanes_tq.c, which
kernels/vecdot.py's decode_weights, block_lanes and quant_dot run as they run the other types'.

- ggml_vec_dot_tq2_0_q8_K: the 2-bit quants t = value + 1, unsigned as maddubs multiplies them;
  16 int16 lanes, lane m summing t * y over bytes 2m and 2m+1 of every run of 32, less the
  block sum bsums[m] (which brings in the -1 of every value), wrapping as int16; then lane
  l = m[2l] + m[2l+1] in int32, and acc = fmaf(lane, y.d * x.d, acc) as for the other types.
- ggml_vec_dot_tq1_0_q8_K: the same lanes of its trits (value + 1), which ggml's AVX2 code reads
  as the top two bits of 3q by byte averages: ((uint8_t)(q * 3^n) * 3) >> 8 for every byte.
- ggml_vec_dot_mxfp4_q8_0: IQ4_NL's arithmetic (vecdot.SIGNED_LANES and PAIRED_BLOCKS) over
  kvalues_mxfp4[nibble], the scale y.d * 2^(e - 128) (ggml_e8m0_to_fp32_half).
- ggml_vec_dot_iq1_m_q8_K: iq1s_grid's rows (-1, 0, 1) times the 3-bit scale 2s + 1 of their 16,
  by the sign trick (signed_lanes), and their shifts (+-1 per 8, times the same scales) in lanes
  of their own, fma'd with the same d into a second accumulator (vecdot's min lanes); the result
  fmaf(hsum8(acc_shifts), IQ1M_DELTA, hsum8(acc)).
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels.floatmath import fmaf
from engine.core.types import GGMLType
from engine.quants.common import KVALUES_MXFP4, half_at, nibbles, tq1_0_values, unpack_2bit
from engine.quants.fp4 import e8m0_to_fp32_half
from engine.quants.grids_iq1_iq3 import IQ1S_GRID
from engine.quants.iq_blocks import BLOCK_IQ1_M
from engine.quants.iqgrid import iq1_m_scale

F32 = np.float32
TERNARY = frozenset({GGMLType.TQ2_0, GGMLType.TQ1_0})  # unsigned quants' lanes less the bsums
TYPES = TERNARY | {GGMLType.MXFP4, GGMLType.IQ1_M}  # the types this module decodes
IQ1M_DELTA = F32(0.125)  # IQ1_M's shift
_GRID_ROWS = IQ1S_GRID.view(np.int8).reshape(-1, 8)


def decode(type_: GGMLType, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weight blocks (nb, size) uint8 -> (q int16 (nb, 256 or 32), d float32 (nb), aux int16
    (nb, 256 or 0)): TQ2_0's unsigned quants (element 128c + 32k + l at bits 2k of qs[32c + l]),
    TQ1_0's trits, MXFP4's values (low nibbles: elements 0-15) or IQ1_M's values times their
    scale, and the scale; aux: IQ1_M's shifts times their scale."""
    none = np.zeros((len(raw), 0), np.int16)
    if type_ == GGMLType.IQ1_M:  # group g of 8: grid row qs[g] | 3 bits of its qh nibble << 8
        nib = np.stack([raw[:, 32:48] & 0x0F, raw[:, 32:48] >> 4], axis=-1).reshape(-1, 32)
        rows = _GRID_ROWS[raw[:, :32].astype(np.uint16) | (nib & 7).astype(np.uint16) << 8]
        words = raw[:, 48:56].copy().view("<u2")  # half h's scale: bits 3 * (h % 4) of word h / 4
        h = np.arange(16)
        sc = 2 * ((words[:, h // 4] >> (3 * (h % 4))) & 7).astype(np.int16) + 1
        sc = np.repeat(sc, 16, axis=1)
        shifts = np.repeat(np.where(nib & 8, np.int16(-1), np.int16(1)), 8, axis=1)
        d = iq1_m_scale(raw.reshape(-1).view(BLOCK_IQ1_M))
        return rows.reshape(-1, 256) * sc, d, shifts * sc
    if type_ == GGMLType.MXFP4:
        q = nibbles(raw, 1, 17, 16, KVALUES_MXFP4).astype(np.int16)
        return q, e8m0_to_fp32_half(raw[:, 0]), none
    if type_ == GGMLType.TQ1_0:
        return tq1_0_values(raw) + 1, half_at(raw, 52), none
    return unpack_2bit(raw[:, :64]).astype(np.int16), half_at(raw, 64), none


def ternary_lanes(t: np.ndarray, yq: np.ndarray, bsums: np.ndarray) -> np.ndarray:
    """The 8 lanes of unsigned quants t (..., 256) and activation quants yq (..., 256) with their
    block sums bsums (..., 16) int16 (the leading axes broadcast) -> int32 (..., 8): int16 lane
    m = the products of bytes 2m, 2m+1 of each run of 32, less bsums[m], wrapped to int16."""
    p = np.multiply(t, yq, dtype=np.int32)
    pairs = p.reshape(*p.shape[:-1], 8, 16, 2).sum((-3, -1), dtype=np.int32)  # (..., 16)
    h = (pairs - bsums).astype(np.int16)  # _mm256_sub_epi16: wraps
    return h[..., 0::2].astype(np.int32) + h[..., 1::2]


def signed_lanes(v: np.ndarray, yq: np.ndarray) -> np.ndarray:
    """IQ1_M's lanes of values (or shifts) v (..., 256) times activation quants yq (..., 256), the
    leading axes broadcast: each product as _mm256_sign_epi8 and maddubs make it (a y of -128
    against a negative v counts as +128), lane l summing elements 4l..4l+3 of every run of 32
    -> int32 (..., 8)."""
    y = np.where((yq == -128) & (v < 0), np.int16(128), yq)
    p = np.multiply(v, y, dtype=np.int32)
    return p.reshape(*p.shape[:-1], 8, 8, 4).sum((-3, -1), dtype=np.int32)


def shifted_total(r: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """IQ1_M's result: hsum8(acc) r and hsum8 of the shifts' accumulator, fmaf(shifts,
    IQ1M_DELTA, r) (ggml's sum + IQ1M_DELTA * shifts, fused by the oracle: vfmadd132ss)."""
    return fmaf(shifts, IQ1M_DELTA, r)
