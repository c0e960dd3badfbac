"""SOFT_MAX, DIAG_MASK_INF and DIAG_MASK_ZERO (ggml-cpu/ops.cpp), F32 rows.

Both ops interleave rows: thread ith takes rows i1 = ith, ith + nth, ... of every matrix (i2, i3).

soft_max, per row: w = x·scale (+ slope·mask[i1, i2 % ne12, i3 % ne13]); max over w (and the
head's sink); y = exp(w - max); sum in double (plus exp(sink - max)); y *= (float)(1/sum).
As in the AVX2 build, exp is the ggml_v_expf polynomial for whole 8-lane vectors (each vector's
lanes summed in float, in the order of the SSE shuffles, before joining the double sum) and expf
for the tail of the row.

diag_mask: unless in place, thread 0 copies src0 to dst and everyone meets at a barrier; then
dst[i, j] = value wherever i > n_past + j.

Numerics: ggml_v_expf is ggml's own polynomial, emulated with IEEE operations; the row tail's
expf is the C library's (engine.libm): ggml's bits on every CPU.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.compute.kernels import CLoop, all_threads, f32_row_per_task, kernel, no_work, \
    not_supported, run_prepared
from engine.compute.kernels.common import span_of, spans, view4
from engine.compute.kernels.floatmath import v_expf_lanes
from engine.compute.kernels.nn_util import alibi_slopes, expf, fmaf
from engine.compute.kernels.views import strided
from engine.compute.shares import ShareKind
from engine.core.errors import ggml_assert
from engine.lanes import lanes, twin
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nelements, ggml_nrows
from engine.core.types import GGMLType

F32, F64 = np.float32, np.float64


LANES = 8  # AVX2


def soft_max_rows(w: np.ndarray, mx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml_vec_soft_max_f32 on every row (last axis): y = exp(w - max) and the double sum of y
    (lanes.soft_max: in C, or its twin below)."""
    n = w.shape[-1]
    rows = w.size // n if n else 0
    w2 = np.ascontiguousarray(w, F32).reshape(rows, n)
    shape = (*w.shape[:-1], 1)
    m2 = np.ascontiguousarray(mx if mx.shape == shape else np.broadcast_to(mx, shape), F32).reshape(rows)
    y = np.empty((rows, n), F32)
    total = np.empty(rows, F64)
    lanes.soft_max(w2, m2, y, total, rows, n)
    return y.reshape(w.shape), total.reshape(*w.shape[:-1], 1)


@twin("soft_max")
def soft_max_into(w, mx, y, sums, rows: int, n: int) -> None:
    """ggml_vec_soft_max_f32 (AVX2) of `rows` rows of n floats less their max mx[r]: y = exp(w -
    max), v_expf on whole groups of 8 and libm's expf on the rest; each group's 8 lanes added in
    float as the SSE shuffles add them, ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)); then the groups'
    sums and the tail's values added in double, left to right, into sums[r]."""
    w2 = np.frombuffer(w, F32).reshape(rows, n)
    y2 = np.frombuffer(y, F32).reshape(rows, n)
    shifted = w2 - np.frombuffer(mx, F32)[:, None]
    n8 = n - n % LANES
    y2[:, :n8] = v_expf_lanes(shifted[:, :n8])
    y2[:, n8:] = expf(shifted[:, n8:])
    v = y2[:, :n8].reshape(rows, n8 // LANES, LANES)
    h = v[..., :4] + v[..., 4:]  # v0+v4, v1+v5, v2+v6, v3+v7
    groups = (h[..., 0] + h[..., 2]) + (h[..., 1] + h[..., 3])
    terms = np.concatenate([np.zeros((rows, 1)), groups, y2[:, n8:]], axis=1, dtype=F64)
    np.frombuffer(sums, F64)[:] = np.add.accumulate(terms, axis=1)[:, -1]  # in order, not pairwise


@twin("soft_max_heads")
def soft_max_heads(x, y, m, sinks, slopes, scale, heads: int, rows: int, n: int, xh: int, xr: int,
                   yh: int, yr: int, mheads: int, mh: int, mr: int, mf16: bool,
                   threads: int = 1) -> None:
    """engine._lanes.soft_max_heads: ggml_compute_forward_soft_max_f32 on the rows (h, r) of
    `heads` matrices of `rows` rows of n floats (row (h, r) at byte h*xh + r*xr of x, of y):
    w = x·scale (+ slopes[h]·mask row (h % mheads, r), contracted, unless every slope is 1:
    fmaf(1, m, w) is w + m, one rounding either way); max over w (a NaN if any) and the head's
    sink; y = exp(w - max) (soft_max_rows) over its double sum (plus exp(sink - max)), scaled
    by (float)(1/sum). (`threads`: how many threads the C loop shares the rows out to; the same
    bits.)"""
    if not heads or not rows:
        return
    as_strided = np.lib.stride_tricks.as_strided
    w = as_strided(np.frombuffer(x, F32), (heads, rows, n), (xh, xr, 4)) * F32(scale)
    if m is not None:
        mt = np.float16 if mf16 else F32
        mask = as_strided(np.frombuffer(m, mt), (mheads, rows, n), (mh, mr, 2 if mf16 else 4))
        mask = mask[np.arange(heads) % mheads].astype(F32)
        sl = np.frombuffer(slopes, F32)
        if bool(np.all(sl == 1)):
            np.add(w, mask, out=w)
        else:
            w = fmaf(np.broadcast_to(sl[:, None, None], w.shape), mask, w)
    mx = w.max(axis=-1, keepdims=True)
    sinks3 = None if sinks is None else np.frombuffer(sinks, F32)[:heads, None, None]
    if sinks3 is not None:
        mx = np.maximum(mx, sinks3)
    out, total = soft_max_rows(w, mx)
    if sinks3 is not None:
        total = total + expf(sinks3 - mx).astype(F64)
    inv = (1.0 / total).astype(F32)
    ys = as_strided(np.frombuffer(y, F32), (heads, rows, n), (yh, yr, 4), writeable=True)
    np.multiply(out, inv, out=ys)


def _soft_max(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_soft_max_f32 (rows i1 = ith, ith + nth, ... of
    every matrix), ready to run: one lanes.soft_max_heads per matrix group i3."""
    src0, mask, sinks = dst.source(0), dst.src[1], dst.src[2]
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml's soft_max computes F32 only")
    if mask is not None and mask.type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst, "the mask must be F32 or F16")
    scale, max_bias = (F32(x) for x in dst.op_params.view(np.float32)[:2])
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    slopes = alibi_slopes(ne02, max_bias)
    sinks3 = None
    if sinks is not None:
        sinks3 = view4(sinks)[0, 0, 0, :ne02]  # (read when it runs)
        if sinks.type != GGMLType.F32 or not sinks3.flags.c_contiguous:
            raise not_supported(dst, "the sinks must be packed F32")
    x4, d4 = view4(src0), view4(dst)
    m4 = view4(mask) if mask is not None else None
    mask_f16 = mask is not None and mask.type == GGMLType.F16
    first, step = params.ith, params.nth
    rows = len(range(first, ne01, step))
    if not rows or not ne00:
        return ()
    soft_max = lanes.soft_max_heads
    calls = []
    for i3 in range(ne03):
        x, y = x4[i3, :, first::step], d4[i3, :, first::step]  # (heads, rows, ne00)
        m = m4[i3 % m4.shape[0], :, first::step] if m4 is not None else None
        if not all(spans(a) for a in (x, y) + ((m,) if m is not None else ())):
            raise not_supported(dst, "soft_max's rows are not packed")
        mspan, (mh, mr) = (span_of(m), m.strides[:2]) if m is not None else (None, (0, 0))
        calls.append(partial(soft_max, span_of(x), span_of(y), mspan, sinks3, slopes, scale, ne02,
                             rows, ne00, *x.strides[:2], *y.strides[:2],
                             m.shape[0] if m is not None else 1, mh, mr,
                             m is not None and mask_f16, params.c_threads))
    return tuple(calls)


def _soft_max_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks's SOFT_MAX: a thread per row of src0, at most n_threads."""
    return min(n_threads, ggml_nrows(node.source(0)))


@kernel(GGMLOp.SOFT_MAX, n_tasks=_soft_max_tasks, work=f32_row_per_task, barrier=False,
        in_c=CLoop("soft_max", "ggml_vec_soft_max_f32"), prepare=_soft_max)
def compute_forward_soft_max(params, dst: Tensor) -> None:
    """ggml_compute_forward_soft_max (f32)."""
    run_prepared(_soft_max(params, dst))
    params.took(ShareKind.INTERLEAVED, *range(params.ith, int(dst.source(0).ne[1]), params.nth),
                note=Note("rows_i1"))


def _diag_mask(params, dst: Tensor, value: float) -> None:
    """ggml_compute_forward_diag_mask_f32."""
    src0 = dst.source(0)
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml's diag_mask computes F32 only")
    fn = "ggml_compute_forward_diag_mask_f32"
    n_past = int(dst.op_params[0])
    ggml_assert(n_past >= 0, "n_past >= 0", fn, f"n_past = {n_past}")
    if src0.data != dst.data:
        if params.ith == 0:
            ggml_assert(ggml_nelements(dst) == ggml_nelements(src0),
                        "ggml_nelements(dst) == ggml_nelements(src0)", fn)
            ggml_assert(ggml_is_contiguous(dst) and ggml_is_contiguous(src0),
                        "ggml_is_contiguous(dst) && ggml_is_contiguous(src0)", fn)
            n = ggml_nbytes(dst)
            strided(dst, (n,), (1,), dtype=np.uint8)[:] = strided(src0, (n,), (1,), dtype=np.uint8)
        params.barrier()
    ggml_assert(int(dst.nb[0]) == 4, "dst->nb[0] == sizeof(float)", fn)
    ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    nc, nr = int(src0.ne[0]), int(src0.ne[1])
    nz = ggml_nrows(src0) // nr
    rows = np.arange(params.ith, nr, params.nth)
    if len(rows):
        # matrices are reached through nb[2] only, as in ggml
        d = strided(dst, (nz, nr, nc), (int(dst.nb[2]), int(dst.nb[1]), 4), dtype=F32)
        sub = d[:, params.ith::params.nth, :]
        sub[:, np.arange(nc)[None, :] > (n_past + rows)[:, None]] = value
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("rows_j"))


@kernel(GGMLOp.DIAG_MASK_INF, n_tasks=all_threads, work=no_work)
def compute_forward_diag_mask_inf(params, dst: Tensor) -> None:
    """ggml_compute_forward_diag_mask_inf."""
    _diag_mask(params, dst, -np.inf)


@kernel(GGMLOp.DIAG_MASK_ZERO, n_tasks=all_threads, work=no_work)
def compute_forward_diag_mask_zero(params, dst: Tensor) -> None:
    """ggml_compute_forward_diag_mask_zero."""
    _diag_mask(params, dst, 0.0)
