"""ggml's AVX2 dot products of the IQ grid types with Q8_K activations, for vecdot.py: the numpy
form of engine/_lanes_iq.c (decode_weights, block_lanes and quant_dot call these).

- ggml_vec_dot_iq3_xxs_q8_K: per run of 32, 8 indices into iq3xxs_grid (4 values each), 4
  seven-bit sign fields (ksigns_iq2xs: the 8th sign makes the parity even) and a 4-bit ls; the
  result 0.25f * hsum_float_8(acc).
- ggml_vec_dot_iq3_s_q8_K: per run, 8 nine-bit indices into iq3s_grid (qs and a bit of qh), a
  sign bit per element, ls a nibble of scales[r / 2]; the result hsum_float_8(acc).
- ggml_vec_dot_iq2_s_q8_K: per run, 4 ten-bit indices into iq2s_grid (8 values each; qs and two
  bits of qh), a sign bit per element, an ls per 16 (scales[r]'s low nibble, then its high one);
  the result 0.125f * hsum_float_8(acc).

The grid values are unsigned; ggml negates the activation where the sign is set (sign_epi8, or
xor and subtract), so a y of -128 stays -128: the product with the signed value q = -g is q * 128
(vecdot.SIGNED_LANES' rule). Each run's (or 16's) products are times 2 * ls + 1; the lanes, fmas
and horizontal sum are vecdot.quant_dot's, one accumulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.types import GGMLType
from engine.quants.grids_iq1_iq3 import IQ3S_GRID, IQ3XXS_GRID
from engine.quants.grids_iq2 import IQ2S_GRID, KSIGNS_IQ2XS

F32 = np.float32


@dataclass(frozen=True, slots=True)
class IQGrid:
    """An IQ grid type as its vec_dot reads it."""

    scales: int  # scales a block: 8 (one per run of 32) or 16 (one per 16)
    result: np.float32  # what ggml multiplies hsum_float_8(acc) by


IQ_GRIDS = {GGMLType.IQ3_XXS: IQGrid(8, F32(0.25)), GGMLType.IQ3_S: IQGrid(8, F32(1.0)),
            GGMLType.IQ2_S: IQGrid(16, F32(0.125))}


def _sign_bits(signs: np.ndarray) -> np.ndarray:
    """Sign bytes (n, 32) -> (n, 256) bool: element e is negative where bit e % 8 of byte e // 8
    is set."""
    return np.unpackbits(signs, axis=-1, bitorder="little").astype(bool)


def decode_iq(type_: GGMLType, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blocks (n, size) uint8 of an IQ grid type -> (q int16 (n, 256): the grid values with their
    signs, scales int16 (n, 8 or 16): 2 * ls + 1)."""
    n = len(raw)
    if type_ == GGMLType.IQ3_XXS:  # qs: 64 indices; then 8 words of 4 sign fields and ls
        g = IQ3XXS_GRID[raw[:, 2:66]].view(np.uint8).reshape(n, 256)
        aux = np.ascontiguousarray(raw[:, 66:98]).view("<u4")  # (n, 8)
        s7 = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # (n, 8, 4)
        neg = _sign_bits(KSIGNS_IQ2XS[s7].reshape(n, 32))
        ls = aux >> 28
    elif type_ == GGMLType.IQ3_S:  # qs 64, qh 8, signs 32, scales 4
        hbit = (raw[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1  # (n, run, j)
        idx = raw[:, 2:66].reshape(n, 8, 8).astype(np.uint16) | hbit.astype(np.uint16) << 8
        g = IQ3S_GRID[idx].view(np.uint8).reshape(n, 256)
        neg = _sign_bits(raw[:, 74:106])
        ls = np.stack([raw[:, 106:110] & 0x0F, raw[:, 106:110] >> 4], axis=-1).reshape(n, 8)
    else:  # IQ2_S: qs 32 indices, then 32 sign bytes; qh 8, scales 8
        hbits = (raw[:, 66:74, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3  # (n, run, k)
        idx = raw[:, 2:34].reshape(n, 8, 4).astype(np.uint16) | hbits.astype(np.uint16) << 8
        g = IQ2S_GRID[idx].view(np.uint8).reshape(n, 256)
        neg = _sign_bits(raw[:, 34:66])
        ls = np.stack([raw[:, 74:82] & 0x0F, raw[:, 74:82] >> 4], axis=-1).reshape(n, 16)
    q = np.where(neg, -g.astype(np.int16), g.astype(np.int16))
    return q, (2 * ls.astype(np.int16) + 1)


def scaled_products(p: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The products (..., 256) int32 times their scale (..., 8 or 16): each run of 32 (or 16)."""
    return (p.reshape(*p.shape[:-1], scales.shape[-1], -1) * scales[..., None]).reshape(p.shape)


def iq_result(type_: GGMLType, h: np.ndarray) -> np.ndarray:
    """The row's result from hsum_float_8(acc): IQ3_XXS's times 0.25f, IQ2_S's times 0.125f."""
    result = IQ_GRIDS[type_].result
    return h if result == 1 else result * h
