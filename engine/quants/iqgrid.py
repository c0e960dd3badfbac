"""IQ grid types: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (super-blocks of 256).

Mirrors the block structs of ggml-common.h and `dequantize_row_<t>` in ggml-quants.c. Groups of 8
(IQ2, IQ1) or 4 (IQ3) elements are one index into a lattice table (`grids_iq2.py`, `grids_iq1_iq3.py`), with signs
from `ksigns_iq2xs` (7 stored bits, the 8th makes the parity even) or, for IQ1, a shared +-1/8 shift.
Dequantizing gathers each row of 8 (or 4) already-signed int8 quants from tables built here at
import (every grid row times every sign pattern), then scales them in one float32 pass.
The quantizers ggml runs without an importance matrix (IQ3_XXS, IQ3_S, IQ2_S, IQ1_M) are in
`iqsearch.py`. Leaves out: the quantizers of IQ2_XXS, IQ2_XS and IQ1_S, which ggml only runs with
an importance matrix (ggml_quantize_requires_imatrix); the engine raises for them.
"""

from __future__ import annotations

import numpy as np

from engine.quants import grids_iq1_iq3, grids_iq2
from engine.quants.common import (F32, DotBlocks, Lanes, Mins, QuantKind, VecDot, copy_runs,
                                  flip_nan_signs, h2f, half_at, scaled)
from engine.quants.iq_blocks import (BLOCK_IQ1_M, BLOCK_IQ1_S, BLOCK_IQ2_S, BLOCK_IQ2_XS,
                                     BLOCK_IQ2_XXS, BLOCK_IQ3_S, BLOCK_IQ3_XXS)
from engine.quants.iqsearch import quantize_iq1_m, quantize_iq2_s, quantize_iq3_s, quantize_iq3_xxs
from engine.core.types import GGMLType as T

IQ1S_DELTA = F32(0.125)
IQ1M_DELTA = F32(0.125)  # the worth of IQ1_M's shifts in its vec_dot

# Each grid row with every sign pattern applied, as int8 rows packed in one uint64 (8 elements)
# or uint32 (4 elements): one gather per row of 8 (or 4) signed quants, no float table.
# Grid values are 1..62, so +-g fits int8. Signs come as ksigns_iq2xs[7 bits] for a row of 8,
# or as the nibble (4 of the 8 sign bits) that covers a row of 4.
_KSIGN_BITS = (grids_iq2.KSIGNS_IQ2XS[:, None] >> np.arange(8)) & 1  # (128, 8)
_NIBBLE_BITS = (np.arange(16)[:, None] >> np.arange(4)) & 1  # (16, 4)


def _signed_rows(grid: np.ndarray, width: int, sign_bits: np.ndarray) -> np.ndarray:
    """Entry s * ngrid + g: grid row g (width bytes) with element j negated where
    sign_bits[s, j] is set, as int8 packed into one uint64 / uint32."""
    g = grid.view(np.uint8).reshape(-1, width).astype(np.int8)  # (ngrid, width)
    v = np.where(sign_bits[:, None, :] != 0, -g, g).astype(np.int8)  # (nsign, ngrid, width)
    return v.reshape(-1).view(np.uint64 if width == 8 else np.uint32)


_IQ2XXS_ROWS = _signed_rows(grids_iq2.IQ2XXS_GRID, 8, _KSIGN_BITS)  # [s7 << 8 | grid]
_IQ2XS_ROWS = _signed_rows(grids_iq2.IQ2XS_GRID, 8, _KSIGN_BITS)  # [s7 << 9 | grid]: the qs word
_IQ2S_QUADS = _signed_rows(grids_iq2.IQ2S_GRID, 4, _NIBBLE_BITS)  # [nibble << 11 | grid << 1 | half]
_IQ3XXS_QUADS = _signed_rows(grids_iq1_iq3.IQ3XXS_GRID, 4, _NIBBLE_BITS)  # [nibble << 8 | grid]
_IQ3S_QUADS = _signed_rows(grids_iq1_iq3.IQ3S_GRID, 4, _NIBBLE_BITS)  # [nibble << 9 | grid]
# IQ1: grid + delta (grid in {-1, 0, 1}, delta = +-1/8) is exactly q/8 for the odd int8
# q = 8*grid +- 1; entry [delta < 0] << 11 | grid.
_G1S = grids_iq1_iq3.IQ1S_GRID.view(np.int8).reshape(-1, 8)
_IQ1_ROWS = np.concatenate([8 * _G1S + 1, 8 * _G1S - 1]).astype(np.int8).reshape(-1).view(np.uint64)


def _fields(x: np.ndarray, bits: int, n: int) -> np.ndarray:
    """The n bit fields of x, lowest first: (..., n) with field k = (x >> bits*k) & (2^bits - 1)."""
    out = np.empty((*x.shape, n), x.dtype)
    for k in range(n):
        np.bitwise_and(x >> (bits * k), (1 << bits) - 1, out=out[..., k])
    return out


def _gather(rows: np.ndarray, index: np.ndarray) -> np.ndarray:
    """rows[index] with each uint64 / uint32 row read back as its int8 elements: (nb, 256) int8."""
    return np.take(rows, index).view(np.int8).reshape(len(index), 256)


def _signed_scaled(q: np.ndarray, db: np.ndarray) -> np.ndarray:
    """`db * grid[j] * (sign ? -1.f : 1.f)` as db * (+-grid[j]): q (nb, 256) int8, db (nb, runs)."""
    q = q.reshape(*db.shape, 256 // db.shape[-1])
    y = scaled(q, db)
    flip_nan_signs(y, q, db)
    return y.reshape(-1, 256)


def _iq2_db(b: np.ndarray) -> np.ndarray:
    """db = d * (0.5f + ls) * 0.25f per 16 (IQ2_XS, IQ2_S): two 4-bit ls per byte, low first."""
    ls = _fields(b["scales"], 4, 2).reshape(len(b), 16).astype(F32)
    return h2f(b["d"])[:, None] * (F32(0.5) + ls) * F32(0.25)


def dequantize_iq2_xxs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq2_xxs: per 32, four 8-element grid indices, then 4x7 sign bits + scale."""
    raw = b["qs"].view(np.uint8).reshape(-1, 8, 8)  # (nb, ib32, 8 bytes)
    aux = np.empty((len(b), 8, 4), np.uint8)
    copy_runs(aux, raw[:, :, 4:8])
    aux1 = aux.view("<u4")[..., 0]  # (nb, 8)
    db = h2f(b["d"])[:, None] * (F32(0.5) + (aux1 >> 28).astype(F32)) * F32(0.25)
    sidx = _fields(aux1, 7, 4)  # (nb, 8, 4): row l's index into ksigns_iq2xs
    q = _gather(_IQ2XXS_ROWS, sidx << 8 | raw[:, :, :4])
    return _signed_scaled(q, db)


def dequantize_iq2_xs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq2_xs: 9-bit grid index + 7 sign bits per 8, a 4-bit scale per 16."""
    return _signed_scaled(_gather(_IQ2XS_ROWS, b["qs"]), _iq2_db(b))


def dequantize_iq2_s(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq2_s: 10-bit grid index (8 in qs, 2 in qh), a full sign byte per 8.

    Each row of 8 is read as two rows of 4 (grid << 1 | half), each signed by its sign nibble.
    """
    grid = b["qs"][:, :32].reshape(-1, 8, 4) | _fields(b["qh"], 2, 4).astype(np.uint32) << 8
    signs = _fields(b["qs"][:, 32:].reshape(-1, 8, 4), 4, 2)  # (nb, ib32, l, half)
    half = np.empty_like(signs, np.uint32)
    half[..., 0], half[..., 1] = grid << 1, grid << 1 | 1
    q = _gather(_IQ2S_QUADS, signs.astype(np.uint32) << 11 | half)
    return _signed_scaled(q, _iq2_db(b))


def dequantize_iq3_xxs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq3_xxs: two 4-element grid indices per 8, 4x7 sign bits + scale per 32."""
    qs = b["qs"][:, :64].reshape(-1, 8, 4, 2)  # (nb, ib32, l, grid1/grid2)
    aux = np.ascontiguousarray(b["qs"][:, 64:]).view("<u4")  # (nb, 8)
    db = h2f(b["d"])[:, None] * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.5)
    signs = grids_iq2.KSIGNS_IQ2XS[_fields(aux, 7, 4)]  # (nb, ib32, l): 8 sign bits per row of 8
    q = _gather(_IQ3XXS_QUADS, _fields(signs, 4, 2).astype(np.uint32) << 8 | qs)
    return _signed_scaled(q, db)


def dequantize_iq3_s(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq3_s: 9-bit grid indices (high bit in qh), sign bytes, 4-bit odd scales.

    Per 32: row r of 4 takes qs[r], bit r of qh and nibble r % 2 of signs[r // 2].
    """
    hbit = _fields(b["qh"], 1, 8).astype(np.uint32)  # (nb, ib32, r)
    signs = _fields(b["signs"], 4, 2).reshape(-1, 8, 8).astype(np.uint32)
    q = _gather(_IQ3S_QUADS, signs << 9 | hbit << 8 | b["qs"].reshape(-1, 8, 8))
    s = _fields(b["scales"], 4, 2).reshape(-1, 8).astype(F32)
    db = h2f(b["d"])[:, None] * (F32(1) + F32(2) * s)
    return _signed_scaled(q, db)


def dequantize_iq1_s(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq1_s: 11-bit indices into the {-1,0,1} grid, plus a +-1/8 shift per 32.

    y = dl * (grid + delta) = dl * q/8 for the odd int8 q = 8*grid +- 1, computed as (dl/8) * q:
    dl/8 is exact and both round the same product once.
    """
    qh = b["qh"]  # (nb, 8) uint16: 4x3 high index bits, 3-bit scale, the shift's sign
    dl = h2f(b["d"])[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    hi = _fields(qh, 3, 4) | (qh >> 15)[..., None] << 3  # (nb, 8, 4): bits 8-11 of the index
    q = _gather(_IQ1_ROWS, b["qs"].reshape(-1, 8, 4) | hi << 8)
    return scaled(q.reshape(-1, 8, 32), dl * IQ1S_DELTA).reshape(-1, 256)


def iq1_m_scale(b: np.ndarray) -> np.ndarray:
    """IQ1_M's fp16 super-scale, spread over the top nibbles of the four uint16 scale words."""
    sc = b["scales"].copy().view("<u2").astype(np.uint32)  # (nb, 4)
    u = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
    return h2f(u.astype(np.uint16))


def dequantize_iq1_m(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq1_m: like IQ1_S with 3-bit scales per 16 and a shift per 8.

    Row l of 8 takes nibble l of qh: 3 high index bits, then the shift's sign.
    """
    d = iq1_m_scale(b)
    sc = b["scales"].copy().view("<u2")  # (nb, 4): scale s (per 16) is 3 bits at 3*(s % 4)
    dl = d[:, None] * (2 * _fields(sc, 3, 4).reshape(-1, 16) + 1).astype(F32)
    nib = _fields(b["qh"], 4, 2).reshape(-1, 32).astype(np.uint16)
    q = _gather(_IQ1_ROWS, b["qs"] | nib << 8)
    return scaled(q.reshape(-1, 16, 16), dl * IQ1S_DELTA).reshape(-1, 256)


# --- as vec_dot multiplies them (ggml_vec_dot_iq3_xxs_q8_K, _iq3_s_q8_K, _iq2_s_q8_K,
# _iq1_m_q8_K) -------------------------------------------------------------------------------------
# The grid values are unsigned; ggml negates the activation where a value's sign is set
# (_mm256_sign_epi8, or xor and subtract), which is Lanes.SIGNED's product of the signed value.
# Each run's (IQ2_S: each 16's) products times 2 * ls + 1 (aux, VecDot.run_scales).

def _signed_grid(raw: np.ndarray, g: np.ndarray, neg: np.ndarray, ls: np.ndarray) -> DotBlocks:
    """Grid values g (n, 256) uint8, negative where neg, and the scales ls (n, 8 or 16) of
    blocks raw whose fp16 d comes first."""
    q = np.where(neg, -g.astype(np.int16), g.astype(np.int16))
    return DotBlocks(q, half_at(raw, 0), aux=2 * ls.astype(np.int16) + 1)


def _sign_bits(signs: np.ndarray) -> np.ndarray:
    """Sign bytes (n, 32) -> (n, 256) bool: element e is negative where bit e % 8 of byte e // 8
    is set."""
    return np.unpackbits(signs, axis=-1, bitorder="little").astype(bool)


def dot_blocks_iq3_xxs(raw: np.ndarray) -> DotBlocks:
    """IQ3_XXS: per run of 32, 8 indices into iq3xxs_grid (qs, 4 values each), and a word of 4
    seven-bit sign fields (ksigns_iq2xs: the 8th sign makes the parity even) and a 4-bit ls."""
    n = len(raw)
    g = grids_iq1_iq3.IQ3XXS_GRID[raw[:, 2:66]].view(np.uint8).reshape(n, 256)
    words = np.ascontiguousarray(raw[:, 66:98]).view("<u4")  # (n, 8)
    s7 = (words[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # (n, 8, 4)
    neg = _sign_bits(grids_iq2.KSIGNS_IQ2XS[s7].reshape(n, 32))
    return _signed_grid(raw, g, neg, words >> 28)


def dot_blocks_iq3_s(raw: np.ndarray) -> DotBlocks:
    """IQ3_S: per run, 8 nine-bit indices into iq3s_grid (qs[8r + j] and bit j of qh[r]), a
    sign bit per element, ls the nibble r % 2 of scales[r / 2]."""
    n = len(raw)
    hbit = (raw[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1  # (n, run, j)
    idx = raw[:, 2:66].reshape(n, 8, 8).astype(np.uint16) | hbit.astype(np.uint16) << 8
    g = grids_iq1_iq3.IQ3S_GRID[idx].view(np.uint8).reshape(n, 256)
    ls = np.stack([raw[:, 106:110] & 0x0F, raw[:, 106:110] >> 4], axis=-1).reshape(n, 8)
    return _signed_grid(raw, g, _sign_bits(raw[:, 74:106]), ls)


def dot_blocks_iq2_s(raw: np.ndarray) -> DotBlocks:
    """IQ2_S: per run, 4 ten-bit indices into iq2s_grid (qs[4r + k] and bits 2k, 2k+1 of qh[r],
    8 values each), sign bits as IQ3_S's (from qs[32..63]), an ls per 16 (scales[r]'s low
    nibble, then its high one)."""
    n = len(raw)
    hbits = (raw[:, 66:74, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3  # (n, run, k)
    idx = raw[:, 2:34].reshape(n, 8, 4).astype(np.uint16) | hbits.astype(np.uint16) << 8
    g = grids_iq2.IQ2S_GRID[idx].view(np.uint8).reshape(n, 256)
    ls = np.stack([raw[:, 74:82] & 0x0F, raw[:, 74:82] >> 4], axis=-1).reshape(n, 16)
    return _signed_grid(raw, g, _sign_bits(raw[:, 34:66]), ls)


def dot_blocks_iq1_m(raw: np.ndarray) -> DotBlocks:
    """IQ1_M: iq1s_grid's rows (-1, 0, 1; group g of 8: row qs[g] | 3 bits of its qh nibble << 8)
    times the 3-bit scale 2s + 1 of their 16; their shifts (+-1 per 8, the nibble's 4th bit)
    times the same scales apart (aux, Mins.SHIFTS)."""
    nib = np.stack([raw[:, 32:48] & 0x0F, raw[:, 32:48] >> 4], axis=-1).reshape(-1, 32)
    rows = _G1S[raw[:, :32].astype(np.uint16) | (nib & 7).astype(np.uint16) << 8]
    words = raw[:, 48:56].copy().view("<u2")  # half h's scale: bits 3 * (h % 4) of word h / 4
    h = np.arange(16)
    sc = 2 * ((words[:, h // 4] >> (3 * (h % 4))) & 7).astype(np.int16) + 1
    sc = np.repeat(sc, 16, axis=1)
    shifts = np.repeat(np.where(nib & 8, np.int16(-1), np.int16(1)), 8, axis=1)
    d = iq1_m_scale(raw.reshape(-1).view(BLOCK_IQ1_M))
    return DotBlocks(rows.reshape(-1, 256) * sc, d, aux=shifts * sc)


_D = (("d", "super-scale, fp16"),)
KINDS = [
    QuantKind(T.IQ2_XXS, BLOCK_IQ2_XXS, dequantize_iq2_xxs, None,
              fields=_D + (("qs", "per 32: 4 grid indices (bytes), then 4x7 sign bits + 4-bit "
                                  "scale"),),
              requires_imatrix=True),
    QuantKind(T.IQ2_XS, BLOCK_IQ2_XS, dequantize_iq2_xs, None,
              fields=_D + (("qs", "per 8: 9-bit grid index | 7 sign bits << 9"),
                           ("scales", "4-bit scales, two per 32")),
              requires_imatrix=True),
    QuantKind(T.IQ2_S, BLOCK_IQ2_S, dequantize_iq2_s, quantize_iq2_s,
              fields=_D + (("qs", "low 8 bits of 32 grid indices, then 32 sign bytes"),
                           ("qh", "high 2 bits of the grid indices, per 32"),
                           ("scales", "4-bit scales, two per 32")),
              vec_dot=VecDot(dot_blocks_iq2_s, Lanes.SIGNED, run_scales=True, result=0.125)),
    QuantKind(T.IQ3_XXS, BLOCK_IQ3_XXS, dequantize_iq3_xxs, quantize_iq3_xxs,
              fields=_D + (("qs", "64 grid indices (4 elements each), then per 32 a uint32 of "
                                  "4x7 sign bits + 4-bit scale"),),
              vec_dot=VecDot(dot_blocks_iq3_xxs, Lanes.SIGNED, run_scales=True, result=0.25)),
    QuantKind(T.IQ3_S, BLOCK_IQ3_S, dequantize_iq3_s, quantize_iq3_s,
              fields=_D + (("qs", "low 8 bits of 64 grid indices"),
                           ("qh", "9th bit of the grid indices, per 32"),
                           ("signs", "one sign bit per element"),
                           ("scales", "4-bit scales (1 + 2s), two per 64")),
              vec_dot=VecDot(dot_blocks_iq3_s, Lanes.SIGNED, run_scales=True)),
    QuantKind(T.IQ1_S, BLOCK_IQ1_S, dequantize_iq1_s, None,
              fields=_D + (("qs", "low 8 bits of 32 grid indices"),
                           ("qh", "per 32: 3x4 high index bits, 3-bit scale, shift sign")),
              requires_imatrix=True),
    QuantKind(T.IQ1_M, BLOCK_IQ1_M, dequantize_iq1_m, quantize_iq1_m,
              fields=(("qs", "low 8 bits of 32 grid indices"),
                      ("qh", "per 8: 3 high index bits + shift sign bit"),
                      ("scales", "3-bit scales per 16; top nibbles hold the fp16 super-scale")),
              traits_from_float_ref=False,
              vec_dot=VecDot(dot_blocks_iq1_m, Lanes.SIGNED, Mins.SHIFTS, shift=float(IQ1M_DELTA))),
]
