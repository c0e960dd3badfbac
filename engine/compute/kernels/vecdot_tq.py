"""ggml's AVX2 vec_dot of TQ2_0, TQ1_0 (with Q8_K activations) and MXFP4 (with Q8_0): their
blocks decoded and their lanes, the numpy twins of engine/_lanes_tq.c, which kernels/vecdot.py's
decode_weights, block_lanes and quant_dot run as they run the other types'.

- ggml_vec_dot_tq2_0_q8_K: the 2-bit quants t = value + 1, unsigned as maddubs multiplies them;
  16 int16 lanes, lane m summing t * y over bytes 2m and 2m+1 of every run of 32, less the
  block sum bsums[m] (which brings in the -1 of every value), wrapping as int16; then lane
  l = m[2l] + m[2l+1] in int32, and acc = fmaf(lane, y.d * x.d, acc) as for the other types.
- ggml_vec_dot_tq1_0_q8_K: the same lanes of its trits (value + 1), which ggml's AVX2 code reads
  as the top two bits of 3q by byte averages: ((uint8_t)(q * 3^n) * 3) >> 8 for every byte.
- ggml_vec_dot_mxfp4_q8_0: IQ4_NL's arithmetic (vecdot.SIGNED_LANES and PAIRED_BLOCKS) over
  kvalues_mxfp4[nibble], the scale y.d * 2^(e - 128) (ggml_e8m0_to_fp32_half).
"""

from __future__ import annotations

import numpy as np

from engine.core.types import GGMLType
from engine.quants.common import KVALUES_MXFP4, half_at, nibbles, tq1_0_values, unpack_2bit
from engine.quants.fp4 import e8m0_to_fp32_half

F32 = np.float32
TERNARY = frozenset({GGMLType.TQ2_0, GGMLType.TQ1_0})  # lanes of unsigned quants less the block sums
TYPES = TERNARY | {GGMLType.MXFP4}  # the types this module decodes


def decode(type_: GGMLType, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weight blocks (nb, size) uint8 -> (q int16 (nb, 256 or 32), d float32 (nb)): TQ2_0's
    unsigned quants (element 128c + 32k + l at bits 2k of qs[32c + l]), TQ1_0's trits or MXFP4's
    values (low nibbles: elements 0-15), and the scale."""
    if type_ == GGMLType.MXFP4:
        return nibbles(raw, 1, 17, 16, KVALUES_MXFP4).astype(np.int16), e8m0_to_fp32_half(raw[:, 0])
    if type_ == GGMLType.TQ1_0:
        return tq1_0_values(raw) + 1, half_at(raw, 52)
    return unpack_2bit(raw[:, :64]).astype(np.int16), half_at(raw, 64)


def ternary_lanes(t: np.ndarray, yq: np.ndarray, bsums: np.ndarray) -> np.ndarray:
    """The 8 lanes of unsigned quants t (..., 256) and activation quants yq (..., 256) with their
    block sums bsums (..., 16) int16 (the leading axes broadcast) -> int32 (..., 8): int16 lane
    m = the products of bytes 2m, 2m+1 of each run of 32, less bsums[m], wrapped to int16."""
    p = np.multiply(t, yq, dtype=np.int32)
    pairs = p.reshape(*p.shape[:-1], 8, 16, 2).sum((-3, -1), dtype=np.int32)  # (..., 16)
    h = (pairs - bsums).astype(np.int16)  # _mm256_sub_epi16: wraps
    return h[..., 0::2].astype(np.int32) + h[..., 1::2]
