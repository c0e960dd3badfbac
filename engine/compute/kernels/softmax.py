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

import itertools

import numpy as np

from engine.compute.kernels import CLoop, kernel, not_supported
from engine.compute.kernels.common import to_f32, view4
from engine.compute.kernels.floatmath import v_expf_lanes
from engine.compute.kernels.nn_util import alibi_slopes, expf, fmaf
from engine.compute.kernels.views import strided
from engine.core.errors import ggml_assert
from engine.lanes import lanes, twin
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nelements, ggml_nrows
from engine.core.types import GGMLType

F32, F64 = np.float32, np.float64


LANES = 8  # AVX2
BLOCK = 1 << 17  # elements per block of rows


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


def _soft_max(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_soft_max_f32, ready to run."""
    src0, mask, sinks = dst.src[0], dst.src[1], dst.src[2]
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml's soft_max computes F32 only")
    scale, max_bias = (F32(x) for x in dst.op_params.view(np.float32)[:2])
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    rows = np.arange(params.ith, ne01, params.nth)
    slopes = alibi_slopes(ne02, max_bias)
    sinks4 = view4(sinks) if sinks is not None else None
    x4, d4 = view4(src0), view4(dst)
    m4 = view4(mask) if mask is not None else None
    # every head of a block of rows at once (each row's arithmetic is its own): few numpy calls,
    # temporaries in the cache
    step = max(1, BLOCK // max(1, ne00 * ne02))
    heads = np.arange(ne02) % m4.shape[1] if m4 is not None else None  # each head's mask matrix
    slope3 = slopes[:, None, None]
    unit = bool(np.all(slopes == 1))  # (max_bias 0) fmaf(1, m, w) is w + m, one rounding either way
    blocks = []
    for i3, r in itertools.product(range(ne03), range(0, len(rows), step)):
        block = rows[r:r + step]  # rows i1 of every matrix (i2, i3): ith + k*nth
        sl = slice(block[0], block[-1] + 1, params.nth)
        m = m4[i3 % m4.shape[0], :, sl] if m4 is not None else None  # (mask heads, rows, ne00)
        blocks.append((x4[i3, :, sl], m, d4[i3, :, sl]))

    def run() -> None:
        sinks3 = sinks4[0, 0, 0, :ne02].astype(F32)[:, None, None] if sinks4 is not None else None
        for x, m, out in blocks:
            w = x * scale  # (heads, rows, ne00)
            if m is not None:
                mh = m if m.shape[0] in (1, ne02) else m[heads]  # (one matrix: broadcast)
                if unit:
                    np.add(w, to_f32(mh, mask.type), out=w)
                else:
                    w = fmaf(slope3, to_f32(mh, mask.type), w)  # wp[i] += slope*mp[i], contracted
            mx = w.max(axis=-1, keepdims=True)
            if sinks3 is not None:
                mx = np.maximum(mx, sinks3)
            y, total = soft_max_rows(w, mx)
            if sinks3 is not None:
                total = total + expf(sinks3 - mx).astype(F64)
            inv = (1.0 / total).astype(F32)
            np.multiply(y, inv, out=out)
    return run


@kernel(GGMLOp.SOFT_MAX, barrier=False, in_c=CLoop("soft_max", "ggml_vec_soft_max_f32"),
        prepare=_soft_max)
def compute_forward_soft_max(params, dst: Tensor) -> None:
    """ggml_compute_forward_soft_max (f32)."""
    _soft_max(params, dst)()
    params.took("interleaved", *range(params.ith, int(dst.src[0].ne[1]), params.nth),
                note=Note("rows_i1"))


def _diag_mask(params, dst: Tensor, value: float) -> None:
    """ggml_compute_forward_diag_mask_f32."""
    src0 = dst.src[0]
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
    params.took("interleaved", *rows.tolist(), note=Note("rows_j"))


@kernel(GGMLOp.DIAG_MASK_INF)
def compute_forward_diag_mask_inf(params, dst: Tensor) -> None:
    """ggml_compute_forward_diag_mask_inf."""
    _diag_mask(params, dst, -np.inf)


@kernel(GGMLOp.DIAG_MASK_ZERO)
def compute_forward_diag_mask_zero(params, dst: Tensor) -> None:
    """ggml_compute_forward_diag_mask_zero."""
    _diag_mask(params, dst, 0.0)
