"""IQ grid types: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (super-blocks of 256).

Mirrors the block structs of ggml-common.h and `dequantize_row_<t>` in ggml-quants.c. Groups of 8
(IQ2, IQ1) or 4 (IQ3) elements are one index into a lattice table (`iq_tables.py`), with signs
from `ksigns_iq2xs` (7 stored bits, the 8th makes the parity even) or, for IQ1, a shared +-1/8 shift.
The quantizers ggml runs without an importance matrix (IQ3_XXS, IQ3_S, IQ2_S, IQ1_M) are in
`iqsearch.py`. Leaves out: the quantizers of IQ2_XXS, IQ2_XS and IQ1_S, which ggml only runs with
an importance matrix (ggml_quantize_requires_imatrix); the engine raises for them.
"""

from __future__ import annotations

import numpy as np

from engine.quants import iq_tables as tab
from engine.quants.common import F32, QuantKind, block_dtype, h2f
from engine.types import GGMLType as T

BLOCK_IQ2_XXS = block_dtype(("d", "<u2"), ("qs", "<u2", 32))
BLOCK_IQ2_XS = block_dtype(("d", "<u2"), ("qs", "<u2", 32), ("scales", "u1", 8))
BLOCK_IQ2_S = block_dtype(("d", "<u2"), ("qs", "u1", 64), ("qh", "u1", 8), ("scales", "u1", 8))
BLOCK_IQ3_XXS = block_dtype(("d", "<u2"), ("qs", "u1", 96))
BLOCK_IQ3_S = block_dtype(("d", "<u2"), ("qs", "u1", 64), ("qh", "u1", 8), ("signs", "u1", 32),
                          ("scales", "u1", 4))
BLOCK_IQ1_S = block_dtype(("d", "<u2"), ("qs", "u1", 32), ("qh", "<u2", 8))
BLOCK_IQ1_M = block_dtype(("qs", "u1", 32), ("qh", "u1", 16), ("scales", "u1", 8))

IQ1S_DELTA = F32(0.125)
_G2XXS = tab.IQ2XXS_GRID.view(np.uint8).reshape(-1, 8).astype(F32)
_G2XS = tab.IQ2XS_GRID.view(np.uint8).reshape(-1, 8).astype(F32)
_G2S = tab.IQ2S_GRID.view(np.uint8).reshape(-1, 8).astype(F32)
_G3XXS = tab.IQ3XXS_GRID.view(np.uint8).reshape(-1, 4).astype(F32)
_G3S = tab.IQ3S_GRID.view(np.uint8).reshape(-1, 4).astype(F32)
_G1S = tab.IQ1S_GRID.view(np.int8).reshape(-1, 8).astype(F32)
# ksigns_iq2xs[i] as 8 factors +-1.0 (bit j set -> element j negative)
_SIGNS = np.where((tab.KSIGNS_IQ2XS[:, None] >> np.arange(8)) & 1, F32(-1), F32(1)).astype(F32)
_BYTE_SIGNS = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, F32(-1), F32(1)).astype(F32)


def _signed(db: np.ndarray, grid: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """db * grid[j] * (+-1.f): the compiled C flips the sign bit, so a NaN's sign flips too."""
    v = db[..., None] * grid
    return np.where(sign < 0, -v, v)


def dequantize_iq2_xxs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq2_xxs: per 32, four 8-element grid indices, then 4x7 sign bits + scale."""
    raw = b["qs"].view(np.uint8).reshape(-1, 8, 8)  # (nb, ib32, 8 bytes)
    aux1 = raw[:, :, 4:8].copy().view("<u4")[..., 0]  # (nb, 8)
    db = h2f(b["d"])[:, None] * (F32(0.5) + (aux1 >> 28).astype(F32)) * F32(0.25)
    sidx = (aux1[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # (nb, 8, 4)
    y = _signed(np.repeat(db[..., None], 4, -1), _G2XXS[raw[:, :, :4]], _SIGNS[sidx])
    return y.reshape(-1, 256)


def dequantize_iq2_xs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq2_xs: 9-bit grid index + 7 sign bits per 8, a 4-bit scale per 16."""
    qs = b["qs"].reshape(-1, 8, 4)
    sc = b["scales"]
    db = np.stack([sc & 0xF, sc >> 4], -1).astype(F32)  # (nb, 8, 2)
    db = h2f(b["d"])[:, None, None] * (F32(0.5) + db) * F32(0.25)
    db = np.repeat(db, 2, axis=-1)  # l // 2 picks the scale
    y = _signed(db, _G2XS[qs & 511], _SIGNS[qs >> 9])
    return y.reshape(-1, 256)


def dequantize_iq2_s(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq2_s: 10-bit grid index (8 in qs, 2 in qh), a full sign byte per 8."""
    qs = b["qs"][:, :32].reshape(-1, 8, 4).astype(np.int64)
    signs = b["qs"][:, 32:].reshape(-1, 8, 4)
    qh = b["qh"].astype(np.int64)[..., None]
    l = np.arange(4)
    idx = qs | ((qh << (8 - 2 * l)) & 0x300)
    sc = b["scales"]
    db = np.stack([sc & 0xF, sc >> 4], -1).astype(F32)
    db = np.repeat(h2f(b["d"])[:, None, None] * (F32(0.5) + db) * F32(0.25), 2, axis=-1)
    return _signed(db, _G2S[idx], _BYTE_SIGNS[signs]).reshape(-1, 256)


def dequantize_iq3_xxs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq3_xxs: two 4-element grid indices per 8, 4x7 sign bits + scale per 32."""
    qs = b["qs"][:, :64].reshape(-1, 8, 4, 2)
    aux = b["qs"][:, 64:].copy().view("<u4")  # (nb, 8)
    db = h2f(b["d"])[:, None] * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.5)
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    grid = _G3XXS[qs].reshape(-1, 8, 4, 8)  # grid1 then grid2
    return _signed(np.repeat(db[..., None], 4, -1), grid, _SIGNS[sidx]).reshape(-1, 256)


def dequantize_iq3_s(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq3_s: 9-bit grid indices (high bit in qh), sign bytes, 4-bit odd scales."""
    qs = b["qs"].reshape(-1, 8, 4, 2).astype(np.int64)
    qh = b["qh"].astype(np.int64)[:, :, None]  # (nb, 8, 1)
    l = np.arange(4)
    idx1 = qs[..., 0] | ((qh << (8 - 2 * l)) & 256)
    idx2 = qs[..., 1] | ((qh << (7 - 2 * l)) & 256)
    grid = np.concatenate([_G3S[idx1], _G3S[idx2]], axis=-1)  # (nb, 8, 4, 8)
    sc = b["scales"]
    s = np.stack([sc & 0xF, sc >> 4], -1).reshape(-1, 8).astype(np.int64)
    db = h2f(b["d"])[:, None] * (1 + 2 * s).astype(F32)  # (nb, 8)
    signs = _BYTE_SIGNS[b["signs"].reshape(-1, 8, 4)]
    return _signed(np.repeat(db[..., None], 4, -1), grid, signs).reshape(-1, 256)


def dequantize_iq1_s(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq1_s: 11-bit indices into the {-1,0,1} grid, plus a +-1/8 shift per 32."""
    qh = b["qh"].astype(np.int64)  # (nb, 8)
    dl = h2f(b["d"])[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    delta = np.where(qh & 0x8000, -IQ1S_DELTA, IQ1S_DELTA).astype(F32)
    idx = b["qs"].reshape(-1, 8, 4).astype(np.int64) | (((qh[..., None] >> (3 * np.arange(4)))
                                                         & 7) << 8)
    y = dl[..., None, None] * (_G1S[idx] + delta[..., None, None])
    return y.reshape(-1, 256)


def iq1_m_scale(b: np.ndarray) -> np.ndarray:
    """IQ1_M's fp16 super-scale, spread over the top nibbles of the four uint16 scale words."""
    sc = b["scales"].copy().view("<u2").astype(np.uint32)  # (nb, 4)
    u = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
    return h2f(u.astype(np.uint16))


def dequantize_iq1_m(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq1_m: like IQ1_S with 3-bit scales per 16 and a shift per 8."""
    d = iq1_m_scale(b)
    sc = b["scales"].copy().view("<u2").astype(np.int64)  # (nb, 4)
    ib = np.arange(8)
    word = sc[:, ib // 2]  # (nb, 8)
    dl1 = d[:, None] * (2 * ((word >> (6 * (ib % 2))) & 7) + 1).astype(F32)
    dl2 = d[:, None] * (2 * ((word >> (6 * (ib % 2) + 3)) & 7) + 1).astype(F32)
    qs = b["qs"].reshape(-1, 8, 4).astype(np.int64)
    qh = b["qh"].reshape(-1, 8, 2).astype(np.int64)
    qh4 = np.stack([qh[..., 0], qh[..., 0] >> 4, qh[..., 1], qh[..., 1] >> 4], -1)  # (nb, 8, 4)
    idx = qs | ((qh4 << 8) & 0x700)
    delta = np.where(qh4 & 0x08, -IQ1S_DELTA, IQ1S_DELTA).astype(F32)
    dl = np.stack([dl1, dl1, dl2, dl2], -1)  # (nb, 8, 4)
    y = dl[..., None] * (_G1S[idx] + delta[..., None])
    return y.reshape(-1, 256)


def quantize_iq3_xxs(x: np.ndarray) -> np.ndarray:
    from engine.quants import iqsearch
    return iqsearch.quantize_iq3_xxs(x)


def quantize_iq3_s(x: np.ndarray) -> np.ndarray:
    from engine.quants import iqsearch
    return iqsearch.quantize_iq3_s(x)


def quantize_iq2_s(x: np.ndarray) -> np.ndarray:
    from engine.quants import iqsearch
    return iqsearch.quantize_iq2_s(x)


def quantize_iq1_m(x: np.ndarray) -> np.ndarray:
    from engine.quants import iqsearch
    return iqsearch.quantize_iq1_m(x)


_D = (("d", "super-scale, fp16"),)
KINDS = [
    QuantKind(T.IQ2_XXS, BLOCK_IQ2_XXS, dequantize_iq2_xxs, None,
              fields=_D + (("qs", "per 32: 4 grid indices (bytes), then 4x7 sign bits + 4-bit scale"),)),
    QuantKind(T.IQ2_XS, BLOCK_IQ2_XS, dequantize_iq2_xs, None,
              fields=_D + (("qs", "per 8: 9-bit grid index | 7 sign bits << 9"),
                           ("scales", "4-bit scales, two per 32"))),
    QuantKind(T.IQ2_S, BLOCK_IQ2_S, dequantize_iq2_s, quantize_iq2_s,
              fields=_D + (("qs", "low 8 bits of 32 grid indices, then 32 sign bytes"),
                           ("qh", "high 2 bits of the grid indices, per 32"),
                           ("scales", "4-bit scales, two per 32"))),
    QuantKind(T.IQ3_XXS, BLOCK_IQ3_XXS, dequantize_iq3_xxs, quantize_iq3_xxs,
              fields=_D + (("qs", "64 grid indices (4 elements each), then per 32 a uint32 of "
                                  "4x7 sign bits + 4-bit scale"),)),
    QuantKind(T.IQ3_S, BLOCK_IQ3_S, dequantize_iq3_s, quantize_iq3_s,
              fields=_D + (("qs", "low 8 bits of 64 grid indices"),
                           ("qh", "9th bit of the grid indices, per 32"),
                           ("signs", "one sign bit per element"),
                           ("scales", "4-bit scales (1 + 2s), two per 64"))),
    QuantKind(T.IQ1_S, BLOCK_IQ1_S, dequantize_iq1_s, None,
              fields=_D + (("qs", "low 8 bits of 32 grid indices"),
                           ("qh", "per 32: 3x4 high index bits, 3-bit scale, shift sign"))),
    QuantKind(T.IQ1_M, BLOCK_IQ1_M, dequantize_iq1_m, quantize_iq1_m,
              fields=(("qs", "low 8 bits of 32 grid indices"),
                      ("qh", "per 8: 3 high index bits + shift sign bit"),
                      ("scales", "3-bit scales per 16; top nibbles hold the fp16 super-scale"))),
]
