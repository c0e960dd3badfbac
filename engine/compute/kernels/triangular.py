"""The triangular-matrix ops: FILL, DIAG, TRI, CUMSUM and SOLVE_TRI (ggml-cpu/ops.cpp), F32 (FILL
also F16).

cumsum, tri and fill split rows as get_thread_range does (rows [dr·ith, dr·ith + dr),
dr = ceil(nrows/nth)); diag runs on thread 0 alone; solve_tri splits the (batch, column) pairs
the same way.

Numerics: copies, float32 additions one element at a time (a row's running sum in order, as
ggml_vec_cumsum_f32 adds), solve_tri's sums as the oracle's build compiles them: ggml's bits on
every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import from_f32, row_index, thread_range, view4
from engine.compute.kernels.floatmath import mac_in_order
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert, ggml_assert_not_null
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nrows
from engine.core.types import GGMLType


@kernel(GGMLOp.CUMSUM, n_tasks=all_threads, work=no_work)
def compute_forward_cumsum(params, dst: Tensor) -> None:
    """ggml_compute_forward_cumsum_f32: y[i] = y[i-1] + x[i] along each row."""
    src = dst.source(0)
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(int(src.nb[0]) == 4, "src0->nb[0] == sizeof(float)", "ggml_compute_forward_cumsum_f32")
    ggml_assert(int(dst.nb[0]) == 4, "dst->nb[0] == sizeof(float)", "ggml_compute_forward_cumsum_f32")
    ir0, ir1 = thread_range(ggml_nrows(src), params.ith, params.nth)
    s4, d4 = view4(src), view4(dst)
    for ir in range(ir0, ir1):
        i3, i2, i1 = row_index(ir, src)
        d4[i3, i2, i1] = np.add.accumulate(s4[i3, i2, i1], dtype=np.float32)
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.DIAG, n_tasks=one_thread, work=no_work)
def compute_forward_diag(params, dst: Tensor) -> None:
    """ggml_compute_forward_diag_f32: thread 0 writes each [n, n] matrix, src's row on its
    diagonal and zeros elsewhere."""
    src = dst.source(0)
    fn = "ggml_compute_forward_diag_f32"
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    n = int(src.ne[0])
    ggml_assert(int(dst.ne[0]) == n and int(dst.ne[1]) == n, "ne00 == ne0 && ne00 == ne1", fn)
    ggml_assert(int(src.nb[0]) == 4, "nb00 == sizeof(float)", fn)
    ggml_assert(int(dst.nb[0]) == 4, "nb0  == sizeof(float)", fn)
    s4, d4 = view4(src), view4(dst)
    d4[...] = 0
    idx = np.arange(n)
    d4[:, :, idx, idx] = s4[:, :, 0, :]
    params.took(ShareKind.ALL)


_KEEP = {0: np.greater_equal, 1: np.greater, 2: np.less_equal, 3: np.less}  # (i0, i01) -> kept?


@kernel(GGMLOp.TRI, n_tasks=all_threads, work=no_work)
def compute_forward_tri(params, dst: Tensor) -> None:
    """ggml_compute_forward_tri_f32: element i0 of row i01 kept where the triangle holds it."""
    src = dst.source(0)
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(ggml_is_contiguous(src), "ggml_is_contiguous(src0)", "ggml_compute_forward_tri_f32")
    keep = ggml_assert_not_null(_KEEP.get(int(dst.op_params[0])), "tri type", "ggml_compute_forward_tri_f32",
                                "invalid tri type")
    ir0, ir1 = thread_range(ggml_nrows(src), params.ith, params.nth)
    s4, d4 = view4(src), view4(dst)
    i0 = np.arange(int(dst.ne[0]))
    for ir in range(ir0, ir1):
        i3, i2, i1 = row_index(ir, src)
        d4[i3, i2, i1] = np.where(keep(i0, i1), s4[i3, i2, i1], np.float32(0))
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.FILL, n_tasks=all_threads, work=no_work)
def compute_forward_fill(params, dst: Tensor) -> None:
    """ggml_compute_forward_fill_f32/f16: every element of this thread's rows set to c."""
    if dst.source(0).type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst)
    c = np.array([dst.op_params[0]], np.int32).view(np.float32)
    value = from_f32(c, dst.type)[0]
    ir0, ir1 = thread_range(ggml_nrows(dst), params.ith, params.nth)
    d4 = view4(dst)
    for ir in range(ir0, ir1):
        i3, i2, i1 = row_index(ir, dst)
        d4[i3, i2, i1] = value
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.SOLVE_TRI, n_tasks=all_threads, work=no_work)
def compute_forward_solve_tri(params, dst: Tensor) -> None:
    """ggml_compute_forward_solve_tri_f32: A·X = B by forward substitution (A lower triangular),
    one column of X at a time; the threads split the (batch, column) pairs. Row i's running sum
    of A[i, t]·X[t] is the compiled loop's (floatmath.mac_in_order), then x = (b - sum) / diag."""
    a, b = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_solve_tri_f32"
    for tensor, name in ((a, "src0"), (b, "src1"), (dst, "dst")):
        ggml_assert(tensor.type == GGMLType.F32, f"{name}->type == GGML_TYPE_F32", fn)
    n, k = int(b.ne[1]), int(b.ne[0])
    ne02 = int(a.ne[2])
    nr = ne02 * int(a.ne[3]) * k
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    a4, b4, x4 = view4(a), view4(b), view4(dst)
    units: dict[tuple[int, int], list[int]] = {}
    for ir in range(ir0, ir1):
        units.setdefault((ir // (ne02 * k), ir // k % ne02), []).append(ir % k)
    for (i03, i02), cols in units.items():
        A, B, X = a4[i03, i02], b4[i03, i02], x4[i03, i02]
        for i in range(n):
            s = np.zeros(len(cols), np.float32)
            for t in range(i):
                s = mac_in_order(s, A[i, t], X[t, cols], t, i)
            X[i, cols] = (B[i, cols] - s) / A[i, i]
    params.took(ShareKind.ROWS, Interval(ir0, ir1))
