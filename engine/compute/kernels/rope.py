"""ROPE and ROPE_BACK: rotary position embedding, F32 and F16 rows (ggml-cpu/ops.cpp).

Rows (i1, i2, i3) of dst are split between threads with the dr formula over the flat row index.
For each token i2 a cache of (cos, sin) pairs is built over i0 = 0, 2, ..., ne0-2 with θ starting
at the position p and multiplied by theta_scale = base^(-2/n_dims) after each pair, in float, so
the rounding of the repeated product is ggml's own:

    θ_0 = p,  θ_{k+1} = θ_k · theta_scale        (float32 at every step)
    rope_yarn(θ_k / freq_factor[k]) -> cos·mscale, sin·mscale (·-1 for ROPE_BACK)

The pair k is (x[2k], x[2k+1]) in NORMAL mode and (x[k], x[k + n_dims/2]) in NEOX and the
multi-rope modes (VISION: (x[k], x[k + n_dims]) over the whole row); each becomes
(x0·cos - x1·sin, x0·sin + x1·cos). Dims from n_dims on are copied.

Numerics: powf, cosf, sinf and logf are the C library's (engine.libm), called as ggml calls
them; the θ recurrence and the rotation are ggml's float arithmetic, emulated with IEEE
operations: ggml's bits on every CPU.
"""

from __future__ import annotations

from threading import Lock

import numpy as np
from cachetools import LRUCache, cached

from engine.compute.kernels import all_threads, f32_row_per_task, kernel, not_supported, \
    run_prepared
from engine.compute.kernels.common import from_f32, row_blocks, thread_range, to_f32, view4
from engine.compute.kernels.nn_util import cosf, fmaf, logf, powf_scalar, sinf
from engine.compute.shares import ShareKind
from engine.lanes import lanes, twin
from engine.core.errors import ggml_assert
from engine.ops.rope import GGML_ROPE_TYPE_IMROPE, GGML_ROPE_TYPE_MROPE, GGML_ROPE_TYPE_NEOX, \
    GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_VISION, ggml_rope_yarn_corr_dims
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS

F32 = np.float32
FN = "ggml_compute_forward_rope_flt"


def _yarn(theta_extrap: np.ndarray, i0, freq_scale, corr_dims, ext_factor, mscale):
    """rope_yarn for pair indices i0 (a number, or a vector along the last axis) over θ:
    (cos·mscale, sin·mscale)."""
    theta_interp = freq_scale * theta_extrap
    theta = theta_interp
    if ext_factor != 0:
        y = (np.asarray(i0 // 2, F32) - F32(corr_dims[0])) / \
            max(F32(0.001), F32(corr_dims[1] - corr_dims[0]))
        ramp_mix = (F32(1) - np.minimum(F32(1), np.maximum(F32(0), y.astype(F32)))) * ext_factor
        theta = fmaf(theta_interp, F32(1) - ramp_mix, theta_extrap * ramp_mix)
        mscale = F32(mscale * fmaf(F32(0.1), logf(F32(1) / freq_scale), F32(1)))
    return cosf(theta) * mscale, sinf(theta) * mscale


def _rotate(x0, x1, cos, sin) -> tuple[np.ndarray, np.ndarray]:
    """(x0·cos - x1·sin, x0·sin + x1·cos), each one FMA as ggml's -mfma build contracts them."""
    return fmaf(x0, cos, -(x1 * sin)), fmaf(x0, sin, x1 * cos)


def _span(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """A block of float32 rows (rows, n) lying ld floats apart as one flat buffer from its first
    element, and ld."""
    ld = rows.strides[0] // 4 if rows.shape[0] > 1 else rows.shape[1]
    size = (rows.shape[0] - 1) * ld + rows.shape[1] if rows.shape[0] else 0
    return np.lib.stride_tricks.as_strided(rows, shape=(size,), strides=(4,)), ld


@twin("rope_pairs")
def rope_pairs_into(x, y, cs, sn, rows: int, n: int, ldx: int, ldy: int, h: int, step: int,
                    off: int) -> None:
    """engine._lanes.rope_pairs: each of `rows` rows of n floats (ldx, ldy apart) copied from x to
    y, then pair k, elements (k*step, k*step + off), rotated by cs[k], sn[k] (_rotate)."""
    if rows == 0:
        return
    xs = np.frombuffer(x, F32)
    ys = np.frombuffer(y, F32)
    X = np.lib.stride_tricks.as_strided(xs, shape=(rows, n), strides=(ldx * 4, 4))
    Y = np.lib.stride_tricks.as_strided(ys, shape=(rows, n), strides=(ldy * 4, 4))
    first, second = slice(0, h * step, step), slice(off, off + h * step, step)
    r0, r1 = _rotate(X[:, first], X[:, second], np.frombuffer(cs, F32)[:h],
                     np.frombuffer(sn, F32)[:h])
    Y[...] = X
    Y[:, first], Y[:, second] = r0, r1


def _made_from(p: np.ndarray, ne0: int, theta_scale, freq_factors, yarn) -> tuple:
    """What a rope cache is made from (its key): the positions, the dims, θ's scale and factors,
    yarn's parameters (numbers and a pair of them: hashable as they are)."""
    ff = None if freq_factors is None else np.asarray(freq_factors[:(ne0 + 1) // 2], F32).tobytes()
    return p.tobytes(), ne0, theta_scale, ff, yarn


@cached(LRUCache(16), key=_made_from, lock=Lock())  # recent rope caches (q and k, every layer)
def rope_cache(p: np.ndarray, ne0: int, theta_scale, freq_factors, yarn) -> tuple:
    """ggml_rope_cache_init for positions p (vector): cos, sin arrays (len(p), ceil(ne0/2)).

    θ_k = θ_{k-1}·theta_scale is rounded to float at every step (a sequential float32
    accumulate along each row), then every pair at once through rope_yarn. The same positions
    and parameters give the same cache (every layer's Q and K): the last few are kept."""
    n = (ne0 + 1) // 2
    ff = None if freq_factors is None else np.asarray(freq_factors[:n], F32)
    steps = np.empty((len(p), n), F32)
    steps[:, 0] = p.astype(F32)
    steps[:, 1:] = F32(theta_scale)
    theta = np.multiply.accumulate(steps, axis=1, dtype=F32)  # in order, one rounding per step
    if ff is not None:
        theta = theta / ff
    cos, sin = _yarn(theta, 2 * np.arange(n), *yarn)
    out = (np.ascontiguousarray(cos, F32), np.ascontiguousarray(sin, F32))
    for a in out:
        a.setflags(write=False)  # shared: no kernel may change it
    return out


def mrope_cache(pos4: np.ndarray, ne0: int, sections, is_imrope: bool, indep_sects: bool,
                theta_scale, freq_factors, yarn) -> tuple:
    """ggml_mrope_cache_init: one θ per position kind (t, h, w, e), chosen per sector."""
    base = [pos4[k].astype(F32) for k in range(4)]
    theta = [b.copy() for b in base]
    sect_dims = sum(sections)
    ggml_assert(sect_dims <= ne0, "sect_dims <= ne0", "ggml_mrope_cache_init")
    sec_w = sections[1] + sections[0]
    sec_e = sections[2] + sec_w
    n = (ne0 + 1) // 2
    cos, sin = np.empty((len(base[0]), n), F32), np.empty((len(base[0]), n), F32)
    for k in range(n):
        ff = F32(1) if freq_factors is None else F32(freq_factors[k])
        sector = k % sect_dims
        if indep_sects:  # vision: each section restarts its θ
            for kind, start in enumerate((0, sections[0], sec_w, sec_e)):
                if sector == start:
                    theta[kind] = base[kind].copy()
                    break
        if is_imrope:
            if sector % 3 == 1 and sector < 3 * sections[1]:
                th = theta[1]
            elif sector % 3 == 2 and sector < 3 * sections[2]:
                th = theta[2]
            elif sector % 3 == 0 and sector < 3 * sections[0]:
                th = theta[0]
            else:
                th = theta[3]
        elif sections[0] <= sector < sec_w:
            th = theta[1]
        elif sec_w <= sector < sec_w + sections[2]:
            th = theta[2]
        elif sector >= sec_w + sections[2]:
            th = theta[3]
        else:
            th = theta[0]
        cos[:, k], sin[:, k] = _yarn(th / ff, 2 * k, *yarn)
        theta = [t * theta_scale for t in theta]
    return cos, sin


def _rope(params, dst: Tensor, forward: bool = True):
    """This thread's rows of ggml_compute_forward_rope_flt, ready to run (the cache made from the
    positions' values when it runs)."""
    src0, src1, src2 = dst.source(0), dst.source(1), dst.src[2]
    ggml_assert(src0.type in (GGMLType.F32, GGMLType.F16),
                "src0->type == GGML_TYPE_F32 || src0->type == GGML_TYPE_F16", FN)
    ggml_assert(src1.type == GGMLType.I32, "src1->type == GGML_TYPE_I32", FN)
    op = dst.op_params
    n_dims, mode, n_ctx_orig = int(op[1]), int(op[2]), int(op[4])
    fp = op.view(np.float32)
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = \
        (F32(v) for v in fp[5:11])
    sections = [int(v) for v in op[11:15]]
    ne0, ne1, ne2, ne3 = (int(x) for x in dst.ne)
    ggml_assert(int(dst.nb[0]) == int(src0.nb[0]), "nb0 == nb00", FN)
    ggml_assert(int(dst.nb[0]) == TYPE_TRAITS[src0.type].type_size, "nb0 == sizeof(T)", FN)
    ggml_assert(n_dims <= ne0, "n_dims <= ne0", FN, f"n_dims {n_dims}, ne0 {ne0}")
    ggml_assert(n_dims % 2 == 0, "n_dims % 2 == 0", FN, f"n_dims {n_dims}")
    ir0, ir1 = thread_range(ggml_nrows(dst), params.ith, params.nth)

    theta_scale = powf_scalar(freq_base, F32(-2.0) / F32(n_dims))
    corr_dims = ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    is_imrope = mode == GGML_ROPE_TYPE_IMROPE
    mrope_used = bool(mode & GGML_ROPE_TYPE_MROPE)
    is_vision = mode == GGML_ROPE_TYPE_VISION
    if mrope_used:
        ggml_assert(sections[0] > 0 or sections[1] > 0 or sections[2] > 0,
                    "sections[0] > 0 || sections[1] > 0 || sections[2] > 0", FN)
    if is_vision:
        ggml_assert(n_dims == ne0 // 2, "n_dims == ne0/2", FN)
    freq_factors = None
    if src2 is not None:
        ggml_assert(src2.type == GGMLType.F32, "src2->type == GGML_TYPE_F32", FN)
        ggml_assert(int(src2.ne[0]) >= n_dims // 2, "src2->ne[0] >= n_dims / 2", FN)
        freq_factors = view4(src2)[0, 0, 0]
        # the cache reads freq_factors[i0/2] for every pair of the row, as ggml does
        short = (ne0 + 1) // 2 - len(freq_factors)
    if mode not in (GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_MROPE,
                    GGML_ROPE_TYPE_IMROPE, GGML_ROPE_TYPE_VISION):
        raise not_supported(dst, f"rope type {mode} not supported (ggml aborts)")

    sin_sign = F32(1) if forward else F32(-1)
    yarn = (freq_scale, corr_dims, ext_factor, attn_factor)
    pos = view4(src1)[0, 0, 0]
    s4, d4 = view4(src0), view4(dst)
    blocks = list(row_blocks(ne1, ne2, ir0, ir1))
    i2s = np.array(sorted({b[1] for b in blocks}), np.int64)
    slot = {int(i2): j for j, i2 in enumerate(i2s)}
    # F32 rows whose rows lie a whole number of floats apart go to lanes.rope_pairs as flat
    # spans; the others are widened (copied) first
    f32 = src0.type == GGMLType.F32 and all(
        v[i3, i2].strides[0] % 4 == 0 and v[i3, i2].strides[0] >= 0
        for i3, i2, _a, _b in blocks for v in (s4, d4))
    spans = [(slot[i2], b - a, _span(s4[i3, i2, a:b]), _span(d4[i3, i2, a:b]))
             for i3, i2, a, b in blocks] if f32 else []
    arrays = [] if f32 else [(slot[i2], s4[i3, i2, a:b], d4[i3, i2, a:b]) for i3, i2, a, b in blocks]
    mrope_pos = [i2s + ne2 * k for k in range(4)] if mrope_used else []
    rotated = slice(0, n_dims) if mode == GGML_ROPE_TYPE_NORMAL else None
    h = n_dims // 2 if mode == GGML_ROPE_TYPE_NORMAL else ne0 // 2 if is_vision else n_dims // 2
    off = n_dims if is_vision else n_dims // 2  # (the other modes: pairs (k, k + off))
    step, pair_off = (2, 1) if rotated is not None else (1, off)  # pair k: (k*step, k*step + off)
    rope_pairs = lanes.rope_pairs
    if not blocks:
        return ()
    at = slice(int(i2s[0]), int(i2s[-1]) + 1) if bool(np.all(np.diff(i2s) == 1)) else i2s

    def run() -> None:
        factors = freq_factors
        if factors is not None and short > 0:
            factors = np.concatenate([factors, np.ones(short, F32)])
        if mrope_used:
            cos, sin = mrope_cache(np.stack([pos[i] for i in mrope_pos]), ne0, sections, is_imrope,
                                   is_vision, theta_scale, factors, yarn)
        else:
            cos, sin = rope_cache(pos[at], ne0, theta_scale, factors, yarn)
        if not forward:
            sin = sin * sin_sign
        # (the caches' rows are packed: each goes as it lies)
        for j, count, (x, ldx), (y, ldy) in spans:
            rope_pairs(x, y, cos[j], sin[j], count, ne0, ldx, ldy, h, step, pair_off)
        for j, src, out in arrays:
            x = to_f32(src, src0.type)  # (rows, ne0)
            y = np.empty_like(x)
            rope_pairs_into(x, y, cos[j], sin[j], len(x), ne0, ne0, ne0, h, step, pair_off)
            out[...] = from_f32(y, src0.type)
    return run


def _rope_back(params, dst: Tensor):
    return _rope(params, dst, False)


@kernel(GGMLOp.ROPE, n_tasks=all_threads, work=f32_row_per_task, barrier=False, prepare=_rope)
def compute_forward_rope(params, dst: Tensor) -> None:
    """ggml_compute_forward_rope."""
    run_prepared(_rope(params, dst))
    params.took(ShareKind.ROWS, thread_range(ggml_nrows(dst), params.ith, params.nth))


@kernel(GGMLOp.ROPE_BACK, n_tasks=all_threads, work=f32_row_per_task, barrier=False,
        prepare=_rope_back)
def compute_forward_rope_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_rope_back: the same rotation with sin negated."""
    run_prepared(_rope_back(params, dst))
    params.took(ShareKind.ROWS, thread_range(ggml_nrows(dst), params.ith, params.nth))
