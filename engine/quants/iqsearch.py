"""The lattice searches behind ggml's IQ quantizers that run without an importance matrix.

Mirrors `ggml_quantize_init` (the `iq2xs_init_impl` / `iq3xs_init_impl` neighbour tables) and
`quantize_row_iq3_xxs_impl`, `quantize_row_iq3_s_impl`, `quantize_row_iq2_s_impl` and
`quantize_row_iq1_m_impl` in ggml-quants.c, without quant_weights.

The grids: every grid point is a group of 8 (IQ2, IQ1) or 4 (IQ3) levels l, stored as the odd
values 2l+1. A group's code u packs its levels (2 bits each for IQ2/IQ1, 3 bits for IQ3). `kmap[u]`
is the grid index of u, or - for a point off the grid - a list of grid points around it: all the
points at the nwant smallest squared distances, ordered by (distance, index) like ggml's qsort.
The tables are built once, lazily, from the dequantization grids of `grids_iq2.py` and `grids_iq1_iq3.py`.

Every float operation is float32 in C's order (no FMA), and the searches keep ggml's strict
comparisons, so the first of equal candidates wins as in the C loops. The work is vectorised
over all sub-blocks and all candidate scales at once; only the scalar "keep the best so far"
recurrences loop in Python.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from engine.core.errors import GGMLAssertionError
from engine.quants import grids_iq1_iq3, grids_iq2
from engine.quants.common import F32, f2h, nearest_int
from engine.quants.iq_blocks import BLOCK_IQ1_M, BLOCK_IQ2_S, BLOCK_IQ3_S, BLOCK_IQ3_XXS

FLT_MAX = F32(np.finfo(np.float32).max)
CHUNK = 32  # super-blocks per vectorised pass (bounds the temporaries)


@dataclass(frozen=True)
class GridSearch:
    """One grid's search tables: odd levels per point, code -> index, neighbour lists."""

    pos: np.ndarray  # (ngrid, dim) int8: 2l+1 per element
    kmap: np.ndarray  # (ncodes,) int32: grid index, or -1 when the code is off the grid
    nbr: np.ndarray  # (ncodes, maxn) int32: neighbour grid indices, -1 padded (off-grid rows)
    bits: int  # bits per level in a code


def _levels(grid_bytes: np.ndarray) -> np.ndarray:
    """Map a dequantization grid's byte values to level numbers 0, 1, 2, ... (sorted values)."""
    vals = np.unique(grid_bytes)
    return np.searchsorted(vals, grid_bytes).astype(np.int64)


def _build(levels: np.ndarray, bits: int, nwant: int, lmax: int) -> GridSearch:
    ngrid, dim = levels.shape
    pos = (2 * levels + 1).astype(np.int8)
    shifts = bits * np.arange(dim)
    codes_of_grid = (levels << shifts).sum(-1)
    ncodes = 1 << (bits * dim)
    kmap = np.full(ncodes, -1, np.int32)
    kmap[codes_of_grid] = np.arange(ngrid, dtype=np.int32)
    # only codes whose levels are all <= lmax can occur (the quantizers clamp to it)
    lv = np.stack(np.meshgrid(*[np.arange(lmax + 1)] * dim, indexing="ij"), -1).reshape(-1, dim)
    codes = (lv << shifts).sum(-1)
    off = kmap[codes] < 0
    lv, codes = lv[off], codes[off]
    p = (2 * lv + 1).astype(np.float32)
    g = pos.astype(np.float32)
    lists = []
    for s in range(0, len(codes), 512):
        ps = p[s:s + 512]
        d2 = ((ps * ps).sum(-1)[:, None] + (g * g).sum(-1)[None, :] - 2 * ps @ g.T)
        d2 = np.rint(d2).astype(np.int64)  # exact small integers
        srt = np.sort(d2, axis=1)
        rank = np.concatenate([np.zeros((len(ps), 1), np.int64),
                               np.cumsum(srt[:, 1:] != srt[:, :-1], axis=1)], axis=1)
        thresh = np.where(rank < nwant, srt, -1).max(axis=1)
        key = np.where(d2 <= thresh[:, None], d2 * ngrid + np.arange(ngrid), np.iinfo(np.int64).max)
        key.sort(axis=1)
        lists.append(key)
    keys = np.concatenate(lists)
    valid = keys != np.iinfo(np.int64).max
    maxn = int(valid.sum(1).max())
    nbr = np.full((ncodes, maxn), -1, np.int32)
    nbr[codes] = np.where(valid[:, :maxn], keys[:, :maxn] % ngrid, -1)
    return GridSearch(pos, kmap, nbr, bits)


@functools.cache
def grid_search(name: str) -> GridSearch:
    """The tables ggml_quantize_init builds for 'iq3_xxs', 'iq3_s', 'iq2_s' or 'iq1_m'."""
    if name == "iq3_xxs":
        return _build(_levels(grids_iq1_iq3.IQ3XXS_GRID.view(np.uint8).reshape(-1, 4)), 3, 2, 7)
    if name == "iq3_s":
        return _build(_levels(grids_iq1_iq3.IQ3S_GRID.view(np.uint8).reshape(-1, 4)), 3, 3, 7)
    if name == "iq2_s":
        return _build(_levels(grids_iq2.IQ2S_GRID.view(np.uint8).reshape(-1, 8)), 2, 1, 2)
    if name == "iq1_m":
        return _build(_levels(grids_iq1_iq3.IQ1S_GRID.view(np.int8).reshape(-1, 8)), 2, 3, 2)
    raise KeyError(name)


# --- the shared pieces of the searches ----------------------------------------------------------

def _seq(a: np.ndarray) -> np.ndarray:
    """`float s = 0; for (i...) s += a[i];` over the last axis, strictly left to right."""
    return np.add.accumulate(a, axis=-1, dtype=F32)[..., -1] + F32(0)


def _levels_of(gs: GridSearch, gi: np.ndarray) -> np.ndarray:
    """`L[i] = (pg[i] - 1)/2` for grid indices gi (...) -> (..., dim) int8 levels."""
    return (gs.pos[gi] >> 1).astype(np.int8)


def _codes(gs: GridSearch, L: np.ndarray) -> np.ndarray:
    """Pack (..., dim) levels into (...,) codes `u |= L[i] << bits*i`."""
    dim = L.shape[-1]
    return (L.astype(np.int64) << (gs.bits * np.arange(dim))).sum(-1)


def _best_neighbour(gs: GridSearch, u: np.ndarray, xg: np.ndarray, wg: np.ndarray,
                    scale: np.ndarray, fn: str, qvals: np.ndarray | None = None) -> np.ndarray:
    """iq2/iq3_find_best_neighbour: among u's neighbours, the first with the least weighted
    squared error `d2 += w*diff*diff`, `diff = scale*q - x` (only d2 < FLT_MAX qualifies).

    q is the grid point's odd value 2l+1, or qvals[row, l] when given (iq1_find_best_neighbour2).
    """
    nb = gs.nbr[u]  # (M, maxn)
    if qvals is None:
        pg = gs.pos[np.maximum(nb, 0)].astype(F32)  # (M, maxn, dim)
    else:
        lv = gs.pos[np.maximum(nb, 0)] >> 1
        pg = qvals[np.arange(len(u))[:, None, None], lv]
    d2 = np.zeros(nb.shape, F32)
    sc = scale[:, None]
    for i in range(xg.shape[-1]):
        diff = sc * pg[..., i] - xg[:, i, None]
        d2 += (wg[:, i, None] * diff) * diff
    d2[(nb < 0) | np.isnan(d2)] = np.inf
    j = np.argmin(d2, axis=1)
    rows = np.arange(len(u))
    if len(u) and not (d2[rows, j] < FLT_MAX).all():
        raise GGMLAssertionError("grid_index >= 0", fn, "no neighbour with a finite error")
    return nb[rows, j].astype(np.int64)


def _snap(gs: GridSearch, L: np.ndarray, xval: np.ndarray, waux: np.ndarray,
          scale: np.ndarray, fn: str) -> tuple[np.ndarray, np.ndarray]:
    """Look up each group's code; off-grid groups take their best neighbour.

    L, xval, waux: (..., G, dim); scale broadcasts to (..., G). Returns (grid index, on grid).
    """
    gi = gs.kmap[_codes(gs, L)].astype(np.int64)
    off = gi < 0
    if off.any():
        sc = np.broadcast_to(scale, off.shape)
        u = _codes(gs, L[off])
        gi[off] = _best_neighbour(gs, u, xval[off], waux[off], sc[off], fn)
    return gi, ~off


def _grid_scale_search(gs: GridSearch, xval, weight, waux, vmax, kmaxq: int, tries, step,
                       init_on_grid: bool, redo_all: bool, fn: str):
    """The scale search of quantize_row_iq3_xxs/iq3_s/iq2_s_impl over sub-blocks (S, n).

    For each candidate `id = (2*kMaxQ-1 + is*step)/max` the levels are rounded, snapped to the
    grid, and the candidate with the best weighted least-squares fit wins (strictly better only).
    Groups that were off the grid are then re-snapped with the winning scale. Returns (scale (S,),
    grid indices (S, G)).
    """
    S, n = xval.shape
    dim = gs.pos.shape[1]
    G = n // dim
    isv = np.array(tries, dtype=F32)
    ids = (F32(2 * kmaxq - 1) + isv * F32(step))[None, :] / vmax[:, None]  # (S, T)
    this_scale = F32(1) / ids
    l = nearest_int(F32(0.5) * (ids[..., None] * xval[:, None, :] - F32(1)))
    l = np.clip(l, 0, kmaxq - 1).astype(np.int8).reshape(S, len(tries), G, dim)
    xg = np.broadcast_to(xval.reshape(S, 1, G, dim), l.shape)
    wg = np.broadcast_to(waux.reshape(S, 1, G, dim), l.shape)
    gi, on = _snap(gs, l, xg, wg, this_scale[..., None], fn)  # (S, T, G)
    q = (F32(2) * _levels_of(gs, gi).reshape(S, len(tries), n) + F32(1)).astype(F32)
    wx = weight * xval
    sumqx = _seq(wx[:, None, :] * q)
    sumq2 = _seq((weight[:, None, :] * q) * q)
    scale, pick = _keep_best(sumqx, sumq2, np.zeros(S, F32), vmax / F32(2 * kmaxq - 1))
    rows = np.arange(S)
    taken = pick >= 0
    bgi = np.where(taken[:, None], gi[rows, np.maximum(pick, 0)], 0)  # no winner: L = 0 -> point 0
    bon = np.where(taken[:, None], on[rows, np.maximum(pick, 0)], init_on_grid)
    redo = (~bon).any(axis=1) & (scale > 0)
    if redo.any():
        xr, wr, sr = xval[redo], waux[redo], scale[redo]
        lr = nearest_int(F32(0.5) * ((F32(1) / sr)[:, None] * xr - F32(1)))
        lr = np.clip(lr, 0, kmaxq - 1).astype(np.int8).reshape(-1, G, dim)
        ngi, _ = _snap(gs, lr, xr.reshape(-1, G, dim), wr.reshape(-1, G, dim), sr[:, None], fn)
        if not redo_all:
            ngi = np.where(bon[redo], bgi[redo], ngi)
        bgi[redo] = ngi
        q = (F32(2) * _levels_of(gs, ngi).reshape(-1, n) + F32(1)).astype(F32)
        sqx = _seq((weight[redo] * xr) * q)
        sq2 = _seq((weight[redo] * q) * q)
        scale[redo] = np.where(sq2 > 0, sqx / sq2, sr)
    return scale.astype(F32), bgi


def _keep_best(sumqx: np.ndarray, sumq2: np.ndarray, best: np.ndarray, scale: np.ndarray):
    """The C loop `if (sumq2 > 0 && sumqx*sumqx > best*sumq2) { scale = sumqx/sumq2;
    best = scale*sumqx; }` over the candidates (columns) in order, for every row at once.

    Instead of stepping through each candidate it jumps to the next one that beats the current
    best, so the Python loop runs once per accepted candidate. Returns (scale, index of the last
    accepted candidate or -1).
    """
    n, m = sumqx.shape
    rows = np.arange(n)
    cols = np.arange(m)
    pos = np.full(n, -1)
    pick = np.full(n, -1)
    best, scale = best.copy(), scale.copy()
    sq = sumqx * sumqx
    ok = sumq2 > 0
    active = rows
    while len(active):
        cond = ok[active] & (sq[active] > best[active, None] * sumq2[active]) & \
            (cols[None, :] > pos[active, None])
        has = cond.any(axis=1)
        active, first = active[has], np.argmax(cond[has], axis=1)
        a, b = sumqx[active, first], sumq2[active, first]
        scale[active] = a / b
        best[active] = scale[active] * a
        pos[active] = pick[active] = first
    return scale, pick


def _chunked(fn):
    """Run a per-super-block quantizer over CHUNK super-blocks at a time."""
    @functools.wraps(fn)
    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, F32).reshape(-1, 256)
        parts = [fn(x[s:s + CHUNK]) for s in range(0, len(x), CHUNK)]
        return np.concatenate(parts) if parts else fn(x)
    return run


# --- IQ3_XXS and IQ3_S --------------------------------------------------------------------------

def _iq3_signs_xxs(xb: np.ndarray, weight: np.ndarray):
    """|x| per element with an even number of sign flips per 8 (the least important element
    keeps its sign otherwise); returns (xval, 7-bit sign codes (S, 4))."""
    S = len(xb)
    neg = (xb < 0).reshape(S, 4, 8)
    xval = np.where(xb >= 0, xb, -xb).reshape(S, 4, 8)
    s = (neg.astype(np.int64) << np.arange(8)).sum(-1)
    odd = neg.sum(-1) % 2 == 1
    imp = (weight * xb) * xb
    imin = np.argmin(imp.reshape(S, 4, 8), axis=-1)  # first strict minimum
    flip = np.zeros((S, 4, 8), bool)
    np.put_along_axis(flip, imin[..., None], odd[..., None], -1)
    xval = np.where(flip, -xval, xval)
    s = s ^ np.where(odd, 1 << imin, 0)
    return xval.reshape(S, 32).astype(F32), (s & 127)


def _iq3_sub_blocks(x: np.ndarray, grid: str, xxs: bool):
    """Per 32-element sub-block: (scales (nb, 8), grid indices (nb, 8, 8), signs, done mask)."""
    gs = grid_search(grid)
    fn = f"quantize_row_{grid}_impl"
    xb = x.reshape(-1, 32)
    weight = xb * xb
    waux = np.sqrt(weight)
    if xxs:
        xval, signs = _iq3_signs_xxs(xb, weight)
    else:
        neg = (xb < 0).reshape(-1, 4, 8)
        xval = np.where(xb >= 0, xb, -xb).astype(F32)
        signs = (neg.astype(np.int64) << np.arange(8)).sum(-1)
    vmax = xval.max(axis=1)
    live = ~(vmax < F32(1e-8)) if xxs else vmax != 0
    S = len(xb)
    scale = np.zeros(S, F32)
    gi = np.zeros((S, 8), np.int64)
    if live.any():
        tries = range(-15, 16) if xxs else range(-9, 10)
        sc, g = _grid_scale_search(gs, xval[live], weight[live], waux[live], vmax[live], 8,
                                   tries, 0.2, xxs, not xxs, fn)
        neg_scale = sc < 0  # never happens (all xval >= 0 would give a positive fit)
        sc = np.where(neg_scale, -sc, sc)
        sg = signs[live]
        signs[live] = np.where(neg_scale[:, None], ~sg & (127 if xxs else 255), sg)
        scale[live], gi[live] = sc, g
    signs[~live] = 0  # skipped sub-blocks write nothing
    return scale.reshape(-1, 8), gi.reshape(-1, 8, 8), signs.reshape(-1, 8, 4), live.reshape(-1, 8)


def _iq3_super_scale(scales: np.ndarray, fudge: float):
    """d = max_scale/31 stored as fp16(d*fudge); per-sub-block 4-bit l from 0.5*(s/d - 1)."""
    max_scale = scales.max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = max_scale / F32(31)
        dh = f2h(d * F32(fudge))
        idd = F32(1) / d
        l = np.clip(nearest_int(F32(0.5) * (idd[:, None] * scales - F32(1))), 0, 15)
    return max_scale, dh, l


@_chunked
def quantize_iq3_xxs(x: np.ndarray) -> np.ndarray:
    """quantize_iq3_xxs without imatrix: float32 (nb, 256) -> block_iq3_xxs bytes (nb, 98)."""
    nb = len(x)
    scales, gi, signs, _ = _iq3_sub_blocks(x, "iq3_xxs", True)
    max_scale, dh, l = _iq3_super_scale(scales, 1.0125)
    y = np.zeros(nb, BLOCK_IQ3_XXS)
    live = max_scale != 0
    aux = (signs[..., 0] | signs[..., 1] << 7 | signs[..., 2] << 14 | signs[..., 3] << 21
           | l.astype(np.int64) << 28).astype("<u4")
    qs = np.concatenate([gi.reshape(nb, 64).astype(np.uint8), aux.view(np.uint8).reshape(nb, 32)],
                        axis=1)
    y["qs"] = np.where(live[:, None], qs, 0)
    y["d"] = np.where(live, dh, 0)
    return y


@_chunked
def quantize_iq3_s(x: np.ndarray) -> np.ndarray:
    """quantize_iq3_s without imatrix: float32 (nb, 256) -> block_iq3_s bytes (nb, 110)."""
    nb = len(x)
    scales, gi, signs, done = _iq3_sub_blocks(x, "iq3_s", False)
    max_scale, dh, l = _iq3_super_scale(scales, 1.033)
    y = np.zeros(nb, BLOCK_IQ3_S)
    # ggml advances the qs and signs pointers only for sub-blocks with a non-zero max, so each
    # written sub-block lands at the slot counting the written ones before it (qh uses ib)
    slot = np.cumsum(done, axis=1) - 1
    qs = np.zeros((nb, 8, 8), np.uint8)
    sg = np.zeros((nb, 8, 4), np.uint8)
    b, ib = np.nonzero(done)
    qs[b, slot[b, ib]] = gi[b, ib] & 255
    sg[b, slot[b, ib]] = signs[b, ib]
    y["qs"] = qs.reshape(nb, 64)
    y["signs"] = sg.reshape(nb, 32)
    y["qh"] = ((gi >> 8) << np.arange(8)).sum(-1).astype(np.uint8)
    live = max_scale != 0
    y["d"] = np.where(live, dh, 0)
    y["scales"] = np.where(live[:, None], l[:, 0::2] | l[:, 1::2] << 4, 0).astype(np.uint8)
    return y


# --- IQ2_S ----------------------------------------------------------------------------------------

@_chunked
def quantize_iq2_s(x: np.ndarray) -> np.ndarray:
    """quantize_iq2_s without imatrix: float32 (nb, 256) -> block_iq2_s bytes (nb, 82).

    16-element sub-blocks of two 8-element grid groups; w = sigma2/4 + x^2 with
    sigma2 = 2*sum(x^2)/256 over the super-block; sign bytes are stored as they are.
    """
    gs = grid_search("iq2_s")
    nb = len(x)
    sumx2 = _seq(x * x)
    sigma2 = F32(2) * sumx2 / F32(256)
    xb: np.ndarray = x.reshape(nb, 16, 16)  # (then (nb * 16, 16))
    weight = (F32(0.25) * sigma2[:, None, None] + xb * xb).reshape(-1, 16)
    waux = np.sqrt(weight)
    xb = xb.reshape(-1, 16)
    xval = np.where(xb >= 0, xb, -xb).astype(F32)
    signs = ((xb < 0).reshape(-1, 2, 8).astype(np.int64) << np.arange(8)).sum(-1)
    vmax = xval.max(axis=1)
    live = ~(vmax < F32(1e-8))
    S = len(xb)
    scale = np.zeros(S, F32)
    gi = np.zeros((S, 2), np.int64)
    if live.any():
        sc, g = _grid_scale_search(gs, xval[live], weight[live], waux[live], vmax[live], 3,
                                   range(-9, 10), 0.1, True, False, "quantize_row_iq2_s_impl")
        neg_scale = sc < 0
        sg = signs[live]
        signs[live] = np.where(neg_scale[:, None], ~sg & 255, sg)
        scale[live], gi[live] = np.where(neg_scale, -sc, sc), g
    signs[~live] = 0
    scales = scale.reshape(nb, 16)
    gi = gi.reshape(nb, 32)
    max_scale = scales.max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = max_scale / F32(31)
        dh = f2h(d * F32(0.9875))
        l = np.clip(nearest_int(F32(0.5) * ((F32(1) / d)[:, None] * scales - F32(1))), 0, 15)
    y = np.zeros(nb, BLOCK_IQ2_S)
    y["qs"] = np.concatenate([(gi & 255).astype(np.uint8),
                              signs.reshape(nb, 32).astype(np.uint8)], axis=1)
    y["qh"] = ((gi >> 8).reshape(nb, 8, 4) << (2 * np.arange(4))).sum(-1).astype(np.uint8)
    live_b = max_scale != 0
    y["d"] = np.where(live_b, dh, 0)
    y["scales"] = np.where(live_b[:, None], l[:, 0::2] | l[:, 1::2] << 4, 0).astype(np.uint8)
    return y


# --- IQ1_M ----------------------------------------------------------------------------------------

IQ1M_DELTA = F32(0.125)
_X_P = np.array([-1 + 0.125, 0.125, 1 + 0.125], F32)  # the levels shifted up by delta
_X_M = np.array([-1 - 0.125, -0.125, 1 - 0.125], F32)  # ... and down
# per shift k (0..3), per half of the 16 (first 8 / last 8): which level set the group uses;
# k = 0: +,+  1: +,-  2: -,+  3: -,-
_XK = np.array([[_X_P, _X_P], [_X_P, _X_M], [_X_M, _X_P], [_X_M, _X_M]], F32)  # (k, half, g)
_COMBOS = np.array([(i1, i2) for i1 in range(17) for i2 in range(i1, 17)])
_GROUP = np.where(np.arange(16)[None, :] < _COMBOS[:, :1], 0,
                  np.where(np.arange(16)[None, :] < _COMBOS[:, 1:], 1, 2))  # (153, 16)
_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.uint8)


def _iq1m_sub_blocks(xb: np.ndarray):
    """The exhaustive 3-level split of each 16-element sub-block (S, 16).

    Elements sorted by value split into three runs (levels -1, 0, +1) at (i1, i2); with the 4
    shift patterns that is 153*4 least-squares fits, scanned in ggml's order keeping only
    strictly better ones. Returns (scale (S,), shift k (S,), grid indices (S, 2), written (S,)).
    """
    S = len(xb)
    gs = grid_search("iq1_m")
    fn = "quantize_row_iq1_m_impl"
    weight = xb * xb
    vmax = np.abs(xb).max(axis=1)
    live = ~(vmax < F32(1e-7))
    scale = np.zeros(S, F32)
    shift = np.zeros(S, np.int64)
    index = np.zeros((S, 2), np.int64)
    if not live.any():
        return scale, shift, index, live
    xl, wl = xb[live], weight[live]
    n = len(xl)
    order = np.argsort(xl, axis=1, kind="stable")  # glibc's qsort keeps ties in order here
    wj = np.take_along_axis(wl, order, 1)
    xj = np.take_along_axis(xl, order, 1)
    xv = _XK.transpose(1, 2, 0)[(order >= 8).astype(np.int64)]  # (n, 16, g, k)
    wq = wj[..., None, None] * xv
    tqx, tq2 = wq * xj[..., None, None], wq * xv
    sqx: np.ndarray = np.zeros((n, len(_COMBOS), 4), F32)  # (then (n, combos * 4))
    sq2: np.ndarray = np.zeros((n, len(_COMBOS), 4), F32)
    for j in range(16):
        sqx += tqx[:, j, _GROUP[:, j], :]
        sq2 += tq2[:, j, _GROUP[:, j], :]
    sqx, sq2 = sqx.reshape(n, -1), sq2.reshape(n, -1)
    with np.errstate(all="ignore"):
        sc, pick = _keep_best(sqx, sq2, np.full(n, -FLT_MAX, F32), np.zeros(n, F32))
    found = pick >= 0
    combo, k = np.maximum(pick, 0) // 4, np.maximum(pick, 0) % 4
    Ls = _GROUP[combo]  # level of each sorted position
    L = np.empty((n, 16), np.int64)
    np.put_along_axis(L, order, Ls, 1)
    neg = sc < 0
    L = np.where(neg[:, None], 2 - L, L)
    sc = np.where(neg, -sc, sc)
    k = np.where(neg, 3 - k, k)
    # level values per group: the first 8 use x_m when k >= 2, the last 8 when k is odd
    xx = np.stack([np.where((k < 2)[:, None], _X_P, _X_M),
                   np.where((k % 2 == 0)[:, None], _X_P, _X_M)], 1)  # (n, 2, 3)
    Lg = L.reshape(n, 2, 8)
    gi = gs.kmap[_codes(gs, Lg)].astype(np.int64)
    off = (gi < 0) & found[:, None]
    if off.any():
        r, g = np.nonzero(off)
        gi[off] = _best_neighbour(gs, _codes(gs, Lg[off]), xl.reshape(n, 2, 8)[off],
                                  wl.reshape(n, 2, 8)[off], sc[r], fn, qvals=xx[r, g])
        redo = off.any(axis=1)
        q = np.take_along_axis(xx, _levels_of(gs, gi).astype(np.int64), 2).reshape(n, 16)
        wq = wl * q
        fqx, fq2 = _seq(wq * xl), _seq(wq * q)
        sc = np.where(redo & (fqx > 0) & (fq2 > 0), fqx / fq2, sc)
    ok = live.copy()
    ok[live] = found
    scale[ok], shift[ok], index[ok] = sc[found], k[found], gi[found]
    return scale, shift, index, ok


@_chunked
def quantize_iq1_m(x: np.ndarray) -> np.ndarray:
    """quantize_iq1_m without imatrix: float32 (nb, 256) -> block_iq1_m bytes (nb, 56)."""
    nb = len(x)
    with np.errstate(all="ignore"):
        scale, shift, index, _ = _iq1m_sub_blocks(x.reshape(-1, 16))
    scales = scale.reshape(nb, 16)
    shift = shift.reshape(nb, 16)
    index = index.reshape(nb, 16, 2)
    y = np.zeros(nb, BLOCK_IQ1_M)
    qs = (index & 255).astype(np.uint8).reshape(nb, 32)
    qh = ((index[..., 0] >> 8) | ((index[..., 1] >> 8) << 4)).astype(np.uint8)
    max_scale = scales.max(axis=1)
    live = max_scale != 0
    with np.errstate(all="ignore"):
        d = max_scale / F32(15)
        l = np.clip(nearest_int(F32(0.5) * ((F32(1) / d)[:, None] * scales - F32(1))), 0, 7)
        xx = np.stack([np.where((shift < 2)[..., None], _X_P, _X_M),
                       np.where((shift % 2 == 0)[..., None], _X_P, _X_M)], 2)  # (nb, 16, 2, 3)
        lv = (grid_search("iq1_m").pos[index] >> 1).astype(np.int64)  # (nb, 16, 2, 8)
        q = np.take_along_axis(xx, lv, 3) * (F32(2) * l.astype(F32) + F32(1))[..., None, None]
        q = q.reshape(nb, 256).astype(F32)
        w = x * x
        wq = w * q
        sqx, sq2 = _seq(wq * x), _seq(wq * q)
        d = np.where(sq2 > 0, sqx / sq2, d)
        s16 = f2h(d * F32(1.1125)).astype(np.uint32)
    sc = (l.reshape(nb, 4, 4).astype(np.uint32) << (3 * np.arange(4, dtype=np.uint32))).sum(-1)
    sc |= np.stack([(s16 & 0x000F) << 12, (s16 & 0x00F0) << 8, (s16 & 0x0F00) << 4,
                    s16 & 0xF000], 1)
    y["qs"] = qs
    y["qh"] = np.where(live[:, None], qh | _MASKS[shift], qh)
    y["scales"] = np.where(live[:, None], sc.astype("<u2").view(np.uint8).reshape(nb, 8), 0)
    return y
