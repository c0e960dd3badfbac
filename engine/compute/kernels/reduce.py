"""Reductions and orderings: SUM, SUM_ROWS, MEAN, ARGMAX, COUNT_EQUAL, ARGSORT, TOP_K and
CROSS_ENTROPY_LOSS.

Mirrors ggml-cpu/ops.cpp. SUM, SUM_ROWS, MEAN and ARGMAX run on thread 0 alone (the others return
at once); COUNT_EQUAL and CROSS_ENTROPY_LOSS split rows with the generic range, leave per-thread
partial results in the work buffer, and thread 0 adds them after a barrier; ARGSORT and TOP_K take
rows interleaved. F32 row sums are double (numpy adds pairwise, ggml left to right: see norm.py);
the F16/BF16 SUM adds in float, left to right, as ggml does.

Ties: ARGMAX returns the last index of the maximum, as ggml does. ARGSORT uses a stable sort, while
ggml's std::sort is not stable, so rows with equal values may order their indices differently.
TOP_K returns the k largest in descending order with the first two swapped, as ggml does; among
equal values the choice may differ from std::partial_sort's.

Numerics: CROSS_ENTROPY_LOSS calls the C library's expf and logf (engine.libm), as ggml does;
the rest are IEEE operations and orderings: the same bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import floatmath as fm
from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import from_f32, thread_range, to_f32, view4
from engine.compute.kernels.views import flat_rows, strided
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_is_scalar, ggml_nbytes, ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS

F32, F64 = np.float32, np.float64
T = GGMLType


def _thread0(params) -> bool:
    """The `if (params->ith != 0) return;` of single-threaded kernels."""
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return False
    return True


def _ggml_rows(t: Tensor) -> np.ndarray:
    """t's rows as SUM and MEAN walk them: row (i1, i2, i3) at i1·nb1 + i2·nb2 + i3·nb3, its
    ne0 elements side by side whatever nb0 says (ggml only asserts nb0 in debug builds, so a
    transposed source is read as ggml reads it)."""
    size = TYPE_TRAITS[t.type].type_size
    ne, nb = [int(x) for x in t.ne], [int(x) for x in t.nb]
    return strided(t, (ne[3], ne[2], ne[1], ne[0]), (nb[3], nb[2], nb[1], size))


def float_sum_lr(x: np.ndarray) -> np.ndarray:
    """Float sums of the last axis, left to right (cumsum accumulates in order)."""
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], F32)
    return np.cumsum(x, axis=-1, dtype=F32)[..., -1]


@kernel(GGMLOp.SUM, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_sum(params, dst: Tensor) -> None:
    """ggml_compute_forward_sum: all elements into dst[0] (thread 0)."""
    src0 = dst.source(0)
    if src0.type not in (T.F32, T.F16, T.BF16):
        raise not_supported(dst, "SUM has F32, F16 and BF16 kernels only")
    if not _thread0(params):
        return
    x = to_f32(_ggml_rows(src0), src0.type)
    if src0.type == T.F32:  # double row sums, added in double
        total = x.sum(axis=-1, dtype=F64).sum()
        view4(dst).reshape(-1)[0] = F32(total)
    else:  # float row sums (left to right), added in float
        total = float_sum_lr(float_sum_lr(x).reshape(-1))
        view4(dst).reshape(-1)[:1] = from_f32(np.array([total], F32), dst.type)
    params.took(ShareKind.ALL)


def _row_sums(params, dst: Tensor) -> np.ndarray | None:
    src0 = dst.source(0)
    if src0.type != T.F32:
        raise not_supported(dst, "F32 only")
    if not _thread0(params):
        return None
    return _ggml_rows(src0).sum(axis=-1, dtype=F64).astype(F32)  # ggml_vec_sum_f32: double


@kernel(GGMLOp.SUM_ROWS, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_sum_rows(params, dst: Tensor) -> None:
    """ggml_compute_forward_sum_rows_f32: dst[0, i1, i2, i3] = Σ row (thread 0)."""
    src0 = dst.source(0)
    fn = "ggml_compute_forward_sum_rows_f32"
    if src0.type == T.F32:
        ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
        ggml_assert(int(dst.nb[0]) == 4, "dst->nb[0] == sizeof(float)", fn)
        ggml_assert(int(dst.ne[0]) == 1, "ne0 == 1", fn)
        for i in (1, 2, 3):
            ggml_assert(int(dst.ne[i]) == int(src0.ne[i]), f"ne{i} == ne0{i}", fn)
    sums = _row_sums(params, dst)
    if sums is not None:
        view4(dst)[..., 0] = sums
        params.took(ShareKind.ALL)


@kernel(GGMLOp.MEAN, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_mean(params, dst: Tensor) -> None:
    """ggml_compute_forward_mean_f32: row sum (double, to float) / (float)ne00 (thread 0)."""
    sums = _row_sums(params, dst)
    if sums is not None:
        view4(dst)[..., 0] = sums / F32(int(dst.source(0).ne[0]))
        params.took(ShareKind.ALL)


@kernel(GGMLOp.ARGMAX, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_argmax(params, dst: Tensor) -> None:
    """ggml_compute_forward_argmax_f32: per row, the last index holding the maximum (thread 0)."""
    src0 = dst.source(0)
    if src0.type != T.F32:
        raise not_supported(dst, "F32 only")
    if not _thread0(params):
        return
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    x = strided(src0, (ne01, ne00), (int(src0.nb[1]), int(src0.nb[0])))
    m = x.max(axis=-1, initial=-np.inf)
    last = ne00 - 1 - np.argmax((x == m[:, None])[:, ::-1], axis=-1)
    strided(dst, (ne01,), (int(dst.nb[0]),))[:] = last
    params.took(ShareKind.ALL)


def _count_equal_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's COUNT_EQUAL: one element of dst's type per task."""
    return TYPE_TRAITS[node.type].type_size * n_tasks


@kernel(GGMLOp.COUNT_EQUAL, n_tasks=all_threads, work=_count_equal_work)
def compute_forward_count_equal(params, dst: Tensor) -> None:
    """ggml_compute_forward_count_equal_i32: per-thread counts over its row range, kept in wdata
    (int64 per thread), then added by thread 0 after a barrier.

    ggml derives a row's (i01, i02, i03) with `i02 = (ir - i03*ne03)/ne01` and
    `i01 = ir - i03*ne03 - i02*ne02`: right for matrices, not in general. The same formula is
    used here, so 3-d and 4-d inputs count what ggml counts.
    """
    src0, src1 = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_count_equal_i32"
    if src0.type != T.I32:
        raise not_supported(dst, "I32 only")
    ggml_assert(src1.type == T.I32, "src1->type == GGML_TYPE_I32", fn)
    ggml_assert(ggml_are_same_shape(src0, src1), "ggml_are_same_shape(src0, src1)", fn)
    ggml_assert(ggml_is_scalar(dst), "ggml_is_scalar(dst)", fn)
    ggml_assert(dst.type == T.I64, "dst->type == GGML_TYPE_I64", fn)
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ir0, ir1 = thread_range(ggml_nrows(src0), params.ith, params.nth)
    ir = np.arange(ir0, ir1, dtype=np.int64)
    i03 = ir // (ne02 * ne01)
    i02 = (ir - i03 * ne03) // ne01
    i01 = ir - i03 * ne03 - i02 * ne02
    count = 0
    if len(ir):
        rows = []
        for t in (src0, src1):
            nb = [int(x) for x in t.nb]
            offs = i03 * nb[3] + i02 * nb[2] + i01 * nb[1]
            lo, hi = int(offs.min()), int(offs.max()) + (ne00 - 1) * nb[0] + 4
            if lo < 0 or hi > ggml_nbytes(t):
                raise not_supported(dst, "ggml's row index formula reads outside the tensor here")
            flat = strided(t, (ggml_nbytes(t) // 4,), (4,))
            rows.append(flat[(offs // 4)[:, None] + np.arange(ne00) * (nb[0] // 4)])
        count = int(np.count_nonzero(rows[0] == rows[1]))
    sums = params.wdata[:8 * params.nth].view(np.int64)
    if params.ith != 0:
        sums[params.ith] = count
    params.barrier()
    if params.ith == 0:
        total = count + int(sums[1:params.nth].sum())
        strided(dst, (1,), (8,))[0] = total
        params.took(ShareKind.ROWS, Interval(ir0, ir1), note=Note("adds_counts"))
    else:
        params.took(ShareKind.ROWS, Interval(ir0, ir1))


def _sorted_rows(params, dst: Tensor) -> tuple[np.ndarray, np.ndarray]:
    src0 = dst.source(0)
    if src0.type != T.F32:
        raise not_supported(dst, "F32 only")
    fn = f"ggml_compute_forward_{GGMLOp(dst.op).name.lower()}_f32"
    ggml_assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)", fn)
    rows = np.arange(params.ith, ggml_nrows(src0), params.nth)
    return rows, flat_rows(src0)[rows]


@kernel(GGMLOp.ARGSORT, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_argsort(params, dst: Tensor) -> None:
    """ggml_compute_forward_argsort_f32: each row's sorting indices; op_params[0] = order."""
    order = int(dst.op_params[0])
    if order not in (0, 1):
        raise not_supported(dst, f"invalid sort order {order}")
    rows, x = _sorted_rows(params, dst)
    if len(rows):
        idx = np.argsort(x if order == 0 else -x, axis=-1, kind="stable")
        flat_rows(dst)[rows] = idx
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("flat_rows"))


def _top_k_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's TOP_K: a row of src0 as int32 indices per task."""
    return 4 * int(node.source(0).ne[0]) * n_tasks


@kernel(GGMLOp.TOP_K, n_tasks=all_threads, work=_top_k_work)
def compute_forward_top_k(params, dst: Tensor) -> None:
    """ggml_compute_forward_top_k_f32: the k largest of each row, descending, then dst[0] and
    dst[1] swapped ("the order is not important")."""
    k = int(dst.ne[0])
    rows, x = _sorted_rows(params, dst)
    if len(rows):
        idx = np.argsort(-x, axis=-1, kind="stable")[:, :k]
        if k > 1:
            idx[:, [0, 1]] = idx[:, [1, 0]]
        flat_rows(dst)[rows] = idx
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("flat_rows"))


def _cross_entropy_loss_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's CROSS_ENTROPY_LOSS: per task, a sum and a row of src0 (dst's type)."""
    return TYPE_TRAITS[node.type].type_size * (n_tasks + int(node.source(0).ne[0]) * n_tasks)


@kernel(GGMLOp.CROSS_ENTROPY_LOSS, n_tasks=all_threads, work=_cross_entropy_loss_work)
def compute_forward_cross_entropy_loss(params, dst: Tensor) -> None:
    """ggml_compute_forward_cross_entropy_loss_f32: -1/nr · Σ_rows Σ labels·log_softmax(logits).

    Per row: max, then val = x - max, L = logf(Σ(double) expf(val)), st = (val - L)·label, summed
    in double to a float; each thread adds its rows' sums in float and leaves the result in wdata;
    thread 0 adds those (in double) and scales by -1/nr.
    """
    src0, src1 = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_cross_entropy_loss_f32"
    if src0.type != T.F32:
        raise not_supported(dst, "F32 only")
    ggml_assert(src1.type == T.F32, "src1->type == GGML_TYPE_F32", fn)
    ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == ggml_type_size(src0->type)", fn)
    ggml_assert(int(src1.nb[0]) == 4, "src1->nb[0] == ggml_type_size(src1->type)", fn)
    ggml_assert(ggml_are_same_shape(src0, src1), "ggml_are_same_shape(src0, src1)", fn)
    ggml_assert(ggml_is_scalar(dst), "ggml_is_scalar(dst)", fn)
    ggml_assert(dst.type == T.F32, "dst->type == GGML_TYPE_F32", fn)
    nc, nr, nth = int(src0.ne[0]), ggml_nrows(src0), params.nth
    ggml_assert(params.wsize >= 4 * (nth + nth * nc),
                "params->wsize >= sizeof(float) * (nth + nth * nc)", fn)
    ir0, ir1 = thread_range(nr, params.ith, nth)
    sum_thread: np.float32 | np.ndarray = F32(0)  # (then float_sum_lr's: a float32 scalar)
    if ir0 < ir1:
        s0, s1 = flat_rows(src0)[ir0:ir1], flat_rows(src1)[ir0:ir1]
        with np.errstate(all="ignore"):
            mx = s0.max(axis=-1, initial=-np.inf)
            val = s0 - mx[:, None]
            lse = fm.logf(fm.expf(val).sum(axis=-1, dtype=F64).astype(F32))
            st = (val - lse[:, None]) * s1
            row_sums = st.sum(axis=-1, dtype=F64).astype(F32)
            sum_thread = float_sum_lr(row_sums)
    sums = params.wdata[:4 * nth].view(np.float32)
    sums[params.ith] = sum_thread
    params.barrier()
    if params.ith == 0:
        total = F32(sums[:nth].astype(F64).sum())
        strided(dst, (1,), (4,))[0] = total * (F32(-1) / F32(nr))
        params.took(ShareKind.ROWS, Interval(ir0, ir1), note=Note("adds_sums"))
    else:
        params.took(ShareKind.ROWS, Interval(ir0, ir1))
