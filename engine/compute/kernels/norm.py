"""NORM, RMS_NORM, L2_NORM (per row) and GROUP_NORM (per group of channels), F32 only.

Mirrors ggml-cpu/ops.cpp. Row norms take rows interleaved (i01 = ith; i01 += nth inside every
(i02, i03)); group_norm interleaves groups. Sums are accumulated in double where ggml uses
ggml_float. NORM's and RMS_NORM's rows add left to right as ggml does (engine._lanes.norm_rows
and rms_norm_rows, or their twins below), so their bits are ggml's. L2_NORM's and GROUP_NORM's
sums are numpy's float64 sums, which are pairwise: far more precise than the float they are
rounded to, so the results agree with ggml's except in the rare case where the two double sums
straddle a float rounding boundary.

NORM's variance follows ggml_vec_cvar_f32 on AVX2: each 8-float group of squares is added in float
in the order ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)), then accumulated in double.

Numerics: IEEE operations only (sqrt included); numpy's double sums have a fixed order, so the
bits are the same on every CPU.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported, run_prepared
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.common import view4
from engine.compute.kernels.views import strided
from engine.compute.shares import ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape
from engine.core.types import GGMLType
from engine.lanes import lanes, twin

F32, F64 = np.float32, np.float64
ROW_CHUNK = 1 << 18  # elements per block of rows (norms do few numpy calls per row)


def _eps(dst: Tensor, slot: int = 0) -> np.float32:
    return F32(dst.op_params.view(np.float32)[slot])


def _interleaved(params, ne01: int) -> np.ndarray:
    return np.arange(params.ith, ne01, params.nth)


def _my_rows(params, src0: Tensor, dst: Tensor):
    """This thread's rows (i1 = ith, ith + nth, ...) of every (i2, i3), as (src, dst) views of a
    few rows at a time, so numpy's temporaries stay in the CPU cache."""
    s4, d4 = view4(src0), view4(dst)
    ne01, ne00 = s4.shape[2], s4.shape[3]
    step = params.nth * max(1, ROW_CHUNK // max(1, ne00))
    for i3 in range(s4.shape[0]):
        for i2 in range(s4.shape[1]):
            for r in range(params.ith, ne01, step):
                sl = slice(r, min(r + step, ne01), params.nth)
                yield s4[i3, i2, sl], d4[i3, i2, sl]


def _f32_only(dst: Tensor) -> None:
    if dst.source(0).type != GGMLType.F32 or dst.type != GGMLType.F32:
        raise not_supported(dst, "F32 only")


def cvar_avx2(v: np.ndarray) -> np.ndarray:
    """ggml_vec_cvar_f32's terms of the centred rows v (last axis), in its order, as float64: the
    sum of each whole group of 8 squares, added in float as the SSE shuffles add them, then the
    tail's squares."""
    n = v.shape[-1]
    nv = n - n % 8
    sq = v * v
    g = sq[..., :nv].reshape(*v.shape[:-1], nv // 8, 8)
    t = g[..., 4:] + g[..., :4]  # hi + lo
    blocks = (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])
    return np.concatenate([blocks, sq[..., nv:]], axis=-1, dtype=F64)


def left_to_right(terms: np.ndarray) -> np.ndarray:
    """0.0 + terms[0] + terms[1] + ... in double, in order (np.sum's order is pairwise), of each
    row (last axis, at least one term)."""
    return np.add.accumulate(terms, axis=-1, dtype=F64)[..., -1] + 0.0  # + 0.0: -0.0's sign


@twin("norm_rows")
def norm_rows_into(x, y, rows: int, n: int, ldx: int, ldy: int, eps: float, portable: bool = False,
                   threads: int = 1) -> None:
    """ggml_compute_forward_norm_f32 on `rows` rows of n floats (row r at byte r * ldx of x, at
    r * ldy of y; x and y may be one buffer): mean = (float)(the row's sum in double, left to
    right) / n; y = x - mean; variance = (float)(ggml_vec_cvar_f32's sum of squares / n);
    y *= 1.0f / sqrtf(variance + eps). (portable, threads: how the C loop runs; the same bits.)"""
    if not rows or not n:
        return
    xs = np.ndarray((rows, n), F32, buffer=x, strides=(ldx, 4))
    ys = np.ndarray((rows, n), F32, buffer=y, strides=(ldy, 4))
    with np.errstate(all="ignore"):
        mean = left_to_right(xs).astype(F32) / F32(n)
        v = xs - mean[:, None]
        variance = (left_to_right(cvar_avx2(v)) / n).astype(F32)
        np.multiply(v, (F32(1) / np.sqrt(variance + F32(eps)))[:, None], out=ys)


def _row_spans(params, src0: Tensor, dst: Tensor):
    """This thread's rows (i1 = ith, ith + nth, ...) of every (i2, i3), a few at a time, as
    (x bytes, y bytes, rows, ldx, ldy): the bytes from the first row to the end of the last, the
    rows ldx and ldy bytes apart."""
    ne00, ne01, ne02, ne03 = (int(v) for v in src0.ne)
    nb01, nb02, nb03 = (int(v) for v in src0.nb[1:])
    nb1, nb2, nb3 = (int(v) for v in dst.nb[1:])
    step = params.nth * max(1, ROW_CHUNK // max(1, ne00))
    ldx, ldy = params.nth * nb01, params.nth * nb1
    for i3 in range(ne03):
        for i2 in range(ne02):
            for r in range(params.ith, ne01, step):
                k = len(range(r, min(r + step, ne01), params.nth))
                x = strided(src0, ((k - 1) * ldx + 4 * ne00,), (1,),
                            i3 * nb03 + i2 * nb02 + r * nb01, np.uint8)
                y = strided(dst, ((k - 1) * ldy + 4 * ne00,), (1,),
                            i3 * nb3 + i2 * nb2 + r * nb1, np.uint8)
                yield x, y, k, ldx, ldy


def _norm(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_norm_f32, ready to run."""
    _f32_only(dst)
    src0 = dst.source(0)
    fn = "ggml_compute_forward_norm_f32"
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    eps = _eps(dst)
    ggml_assert(eps >= 0, "eps >= 0.0f", fn, f"eps = {eps}")
    ne00 = int(src0.ne[0])
    if int(src0.nb[0]) == 4 and int(dst.nb[0]) == 4:
        return tuple(partial(lanes.norm_rows, x, y, k, ne00, ldx, ldy, float(eps), False,
                             params.c_threads)
                     for x, y, k, ldx, ldy in _row_spans(params, src0, dst))
    rows = _interleaved(params, int(src0.ne[1]))

    def run_strided() -> None:  # float sums, left to right (measured: no fused multiply-add)
        with np.errstate(all="ignore"):
            x = view4(src0)[:, :, rows]  # (ne03, ne02, my rows, ne00)
            s = np.zeros(x.shape[:-1], F32)
            for i in range(ne00):
                s = s + x[..., i]
            mean = s / F32(ne00)
            v = x - mean[..., None]
            variance = np.zeros(x.shape[:-1], F32)
            for i in range(ne00):
                variance = fmaf(v[..., i], v[..., i], variance)
            variance = variance / F32(ne00)
            scale = F32(1) / np.sqrt(variance + eps)
            view4(dst)[:, :, rows] = v * scale[..., None]
    return run_strided


@kernel(GGMLOp.NORM, n_tasks=all_threads, work=no_work, barrier=False, prepare=_norm)
def compute_forward_norm(params, dst: Tensor) -> None:
    """ggml_compute_forward_norm_f32: y = (x - mean) / sqrtf(var + eps)."""
    run_prepared(_norm(params, dst))
    params.took(ShareKind.INTERLEAVED, *_interleaved(params, int(dst.ne[1])).tolist(),
                note=Note("rows_i1"))


@twin("rms_norm_rows")
def rms_norm_rows_into(x, y, rows: int, n: int, ldx: int, ldy: int, eps: float,
                       threads: int = 1) -> None:
    """ggml_compute_forward_rms_norm_f32 on `rows` rows of n floats (row r at byte r * ldx of x,
    at r * ldy of y; x and y may be one buffer): mean = (float)(the squares' sum in double, left
    to right, / n); y = x * (1.0f / sqrtf(mean + eps)). (threads: how many threads the C loop
    shares the rows out to; the same bits.)"""
    if not rows or not n:
        return
    xs = np.ndarray((rows, n), F32, buffer=x, strides=(ldx, 4))
    ys = np.ndarray((rows, n), F32, buffer=y, strides=(ldy, 4))
    with np.errstate(all="ignore"):
        mean = (left_to_right(xs * xs) / n).astype(F32)
        np.multiply(xs, (F32(1) / np.sqrt(mean + F32(eps)))[:, None], out=ys)


def _rms_norm(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_rms_norm_f32, ready to run (lanes.rms_norm_rows
    on spans of a few rows)."""
    _f32_only(dst)
    src0 = dst.source(0)
    fn = "ggml_compute_forward_rms_norm_f32"
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    eps = _eps(dst)
    ggml_assert(eps >= 0, "eps >= 0.0f", fn, f"eps = {eps}")
    ne00 = int(src0.ne[0])
    if int(dst.nb[0]) == 4:
        return tuple(partial(lanes.rms_norm_rows, x, y, k, ne00, ldx, ldy, float(eps),
                             params.c_threads)
                     for x, y, k, ldx, ldy in _row_spans(params, src0, dst))
    blocks = list(_my_rows(params, src0, dst))

    def run_strided() -> None:  # (dst's elements apart: the same arithmetic in numpy)
        for x, y in blocks:
            mean = (left_to_right(x * x) / ne00).astype(F32)
            np.multiply(x, (F32(1) / np.sqrt(mean + eps))[:, None], out=y)
    return run_strided


@kernel(GGMLOp.RMS_NORM, n_tasks=all_threads, work=no_work, barrier=False, prepare=_rms_norm)
def compute_forward_rms_norm(params, dst: Tensor) -> None:
    """ggml_compute_forward_rms_norm_f32: y = x / sqrtf(mean(x²) + eps), the mean in double."""
    run_prepared(_rms_norm(params, dst))
    params.took(ShareKind.INTERLEAVED, *_interleaved(params, int(dst.ne[1])).tolist(),
                note=Note("rows_i1"))


@kernel(GGMLOp.L2_NORM, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_l2_norm(params, dst: Tensor) -> None:
    """ggml_compute_forward_l2_norm_f32: y = x / max(sqrtf(Σx²), eps), the sum in double."""
    _f32_only(dst)
    src0 = dst.source(0)
    fn = "ggml_compute_forward_l2_norm_f32"
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    eps = _eps(dst)
    ggml_assert(eps >= 0, "eps >= 0.0f", fn, f"eps = {eps}")
    rows = _interleaved(params, int(src0.ne[1]))
    with np.errstate(all="ignore"):
        for x, y in _my_rows(params, src0, dst):
            ss = (x * x).sum(axis=-1, dtype=F64).astype(F32)
            y[:] = x * (F32(1) / np.fmax(np.sqrt(ss), eps))[:, None]
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("rows_i1"))


@kernel(GGMLOp.GROUP_NORM, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_group_norm(params, dst: Tensor) -> None:
    """ggml_compute_forward_group_norm_f32: each group of channels (dim 2) of each i3 is
    normalised over all its ne0·ne1·step elements; threads take groups interleaved."""
    _f32_only(dst)
    src0 = dst.source(0)
    fn = "ggml_compute_forward_group_norm_f32"
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    eps = _eps(dst, 1)
    n_channels = int(src0.ne[2])
    n_groups = int(dst.op_params[0])
    per_group = (n_channels + n_groups - 1) // n_groups
    s4, d4 = view4(src0), view4(dst)
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    groups = list(range(params.ith, n_groups, params.nth))
    with np.errstate(all="ignore"):
        for i in groups:
            start = i * per_group
            end = min(start + per_group, n_channels)
            step = end - start
            if step <= 0:
                continue
            n = ne00 * ne01 * step
            for i3 in range(s4.shape[0]):
                x = s4[i3, start:end]  # (step, ne01, ne00)
                mean = F32(x.sum(axis=-1, dtype=F64).sum() / n)
                v = x - mean
                variance = F32((v * v).sum(axis=-1, dtype=F64).sum() / n)
                scale = F32(1) / np.sqrt(variance + eps)
                d4[i3, start:end] = v * scale
    params.took(ShareKind.INTERLEAVED, *groups, note=Note("channel_groups"))
