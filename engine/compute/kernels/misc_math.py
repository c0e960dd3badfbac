"""ADD1, ACC, SET, SCALE, CLAMP, LEAKY_RELU, REPEAT, CONCAT, OUT_PROD and ARANGE.

Mirrors ggml-cpu/ops.cpp. The thread splits are ggml's own and differ from op to op:
* ADD1, SCALE: generic row range of src0; ACC, SET: generic row range of src1, after thread 0 has
  copied src0 into dst (unless in place) and everyone has passed a barrier;
* CLAMP: rows interleaved (j = ith; j += nth); CONCAT: dim 2 interleaved, for every i3;
  ARANGE: elements interleaved;
* LEAKY_RELU and REPEAT: thread 0 alone;
* OUT_PROD: thread 0 zeroes dst, barrier, then the generic range of dst rows (ne1·ne2·ne3).
SCALE, CLAMP and LEAKY_RELU walk rows flat (row j at data + j·nb1), as ggml does.

Numerics: IEEE operations, and fmaf where the -mfma build fuses (emulated exactly in float64):
ggml's bits on every CPU.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.compute.kernels import floatmath as fm
from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread, \
    run_prepared, src0_row_per_task
from engine.compute.kernels.common import from_f32, row_blocks, thread_range, to_f32, view4
from engine.compute.kernels.views import flat_rows, strided
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_can_repeat, ggml_is_contiguous, \
    ggml_is_scalar, ggml_nbytes, ggml_nelements, ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS

F32 = np.float32
T = GGMLType


def _dst_bytes(dst: Tensor) -> np.ndarray:
    return strided(dst, (ggml_nbytes(dst),), (1,), dtype=np.uint8)


# --- add1 ------------------------------------------------------------------------------------

ADD1_TYPES = {(T.F32, T.F32), (T.F16, T.F16), (T.F16, T.F32), (T.BF16, T.BF16), (T.BF16, T.F32)}


@kernel(GGMLOp.ADD1, n_tasks=all_threads, work=src0_row_per_task, barrier=False)
def compute_forward_add1(params, dst: Tensor) -> None:
    """ggml_compute_forward_add1: y = x + v, v the scalar src1 (read in its own type)."""
    src0, src1 = dst.source(0), dst.source(1)
    if (src0.type, src1.type) not in ADD1_TYPES or dst.type != src0.type:
        raise not_supported(dst, "quantized src0 (add1_q_f32) and other type pairs")
    fn = "ggml_compute_forward_add1"
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(ggml_is_scalar(src1), "ggml_is_scalar(src1)", fn)
    size = TYPE_TRAITS[src0.type].type_size
    ggml_assert(int(dst.nb[0]) == size, "nb0 == sizeof(float)" if size == 4 else
                "nb0 == sizeof(ggml_fp16_t)", fn)
    ggml_assert(int(src0.nb[0]) == size, "nb00 == sizeof(float)" if size == 4 else
                "nb00 == sizeof(ggml_fp16_t)", fn)
    v = to_f32(view4(src1).reshape(-1)[:1], src1.type)[0]
    s4, d4 = view4(src0), view4(dst)
    ir0, ir1 = thread_range(ggml_nrows(src0), params.ith, params.nth)
    for i3, i2, a, b in row_blocks(int(src0.ne[1]), int(src0.ne[2]), ir0, ir1):
        d4[i3, i2, a:b] = from_f32(to_f32(s4[i3, i2, a:b], src0.type) + v, dst.type)
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


# --- acc, set --------------------------------------------------------------------------------

def _copy_then_view(params, dst: Tensor, fn: str, strict: bool):
    """The shared start of acc and set: checks, thread 0's copy of src0, the barrier, and the
    views of dst (and src0) with src1's shape at the op_params' strides and offset."""
    src0, src1 = dst.source(0), dst.source(1)
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(ggml_is_contiguous(dst) and ggml_is_contiguous(src0),
                "ggml_is_contiguous(dst) && ggml_is_contiguous(src0)", fn)
    nb1, nb2, nb3, offset, inplace = (int(x) for x in dst.op_params[:5])
    if not inplace:
        if params.ith == 0:
            _dst_bytes(dst)[:] = strided(src0, (ggml_nbytes(dst),), (1,), dtype=np.uint8)
        params.barrier()
    ne1 = [int(x) for x in src1.ne]
    es = TYPE_TRAITS[src0.type].type_size
    last = offset + sum((n - 1) * s for n, s in zip(ne1, (es, nb1, nb2, nb3)) if n > 0)
    if strict:  # acc: the last element must lie inside dst and src0
        ggml_assert(last < ggml_nbytes(dst), "offset + (ne10 == 0 ? 0 : ne10-1)*nb0  + "
                    "(ne11 == 0 ? 0 : ne11-1)*nb1  + (ne12 == 0 ? 0 : ne12-1)*nb2  + "
                    "(ne13 == 0 ? 0 : ne13-1)*nb3  < ggml_nbytes(dst)", fn)
        ggml_assert(last < ggml_nbytes(src0), "offset + (ne10 == 0 ? 0 : ne10-1)*nb00 + "
                    "(ne11 == 0 ? 0 : ne11-1)*nb01 + (ne12 == 0 ? 0 : ne12-1)*nb02 + "
                    "(ne13 == 0 ? 0 : ne13-1)*nb03 < ggml_nbytes(src0)", fn)
    else:
        ggml_assert(last <= ggml_nbytes(dst),
                    "offset + im0*nb0  + im1*nb1  + im2*nb2  + im3*nb3  <= ggml_nbytes(dst)", fn)
    ggml_assert(int(src1.nb[0]) == es, "nb10 == sizeof(float)" if src0.type == T.F32 else
                "nb10 == sizeof(int32_t)", fn)
    shape = tuple(reversed(ne1))
    strides = (nb3, nb2, nb1, es)
    return (strided(dst, shape, strides, offset), strided(src0, shape, strides, offset),
            view4(src1))


def _src1_rows(params, dst: Tensor):
    src1 = dst.source(1)
    ir0, ir1 = thread_range(ggml_nrows(src1), params.ith, params.nth)
    return ir0, ir1, row_blocks(int(src1.ne[1]), int(src1.ne[2]), ir0, ir1)


def _took_after_copy(params, dst: Tensor, ir0: int, ir1: int) -> None:
    first = params.ith == 0 and not int(dst.op_params[4])
    params.took(ShareKind.ROWS, Interval(ir0, ir1),
                note=Note("rows_src1_after_copy" if first else "rows_src1"))


def _acc_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's ACC: a row of src1 as floats per task when src0 is quantized."""
    if not TYPE_TRAITS[node.source_type(0)].is_quantized:
        return 0
    return 4 * int(node.source(1).ne[0]) * n_tasks


@kernel(GGMLOp.ACC, n_tasks=all_threads, work=_acc_work)
def compute_forward_acc(params, dst: Tensor) -> None:
    """ggml_compute_forward_acc_f32: dst = src0, then view(dst) = view(src0) + src1."""
    if dst.source(0).type != T.F32:
        raise not_supported(dst, "F32 only")
    d, s0, s1 = _copy_then_view(params, dst, "ggml_compute_forward_acc_f32", True)
    ir0, ir1, blocks = _src1_rows(params, dst)
    for i3, i2, a, b in blocks:
        d[i3, i2, a:b] = s0[i3, i2, a:b] + s1[i3, i2, a:b]
    _took_after_copy(params, dst, ir0, ir1)


@kernel(GGMLOp.SET, n_tasks=one_thread, work=no_work)
def compute_forward_set(params, dst: Tensor) -> None:
    """ggml_compute_forward_set_f32 / _i32: dst = src0, then view(dst) = src1."""
    if dst.source(0).type not in (T.F32, T.I32):
        raise not_supported(dst, "F32 and I32 only")
    fn = f"ggml_compute_forward_set_{'f32' if dst.source(0).type == T.F32 else 'i32'}"
    d, _, s1 = _copy_then_view(params, dst, fn, False)
    ir0, ir1, blocks = _src1_rows(params, dst)
    for i3, i2, a, b in blocks:
        d[i3, i2, a:b] = s1[i3, i2, a:b]
    _took_after_copy(params, dst, ir0, ir1)


# --- scale, clamp, leaky_relu ----------------------------------------------------------------

def _scale(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_scale_f32, ready to run."""
    src0 = dst.source(0)
    if src0.type != T.F32:
        raise not_supported(dst, "F32 only")
    fn = "ggml_compute_forward_scale_f32"
    ggml_assert(ggml_is_contiguous(src0), "ggml_is_contiguous(src0)", fn)
    ggml_assert(ggml_is_contiguous(dst), "ggml_is_contiguous(dst)", fn)
    ggml_assert(ggml_are_same_shape(src0, dst), "ggml_are_same_shape(src0, dst)", fn)
    s, b = (F32(v) for v in dst.op_params.view(np.float32)[:2])
    ir0, ir1 = thread_range(ggml_nrows(src0), params.ith, params.nth)
    x, y = flat_rows(src0)[ir0:ir1], flat_rows(dst)[ir0:ir1]

    if b == 0:
        return partial(np.multiply, x, s, out=y)

    def run() -> None:
        y[:] = fm.fmaf(x, s, b)
    return run


@kernel(GGMLOp.SCALE, n_tasks=one_thread, work=no_work, barrier=False, prepare=_scale)
def compute_forward_scale(params, dst: Tensor) -> None:
    """ggml_compute_forward_scale_f32: y = x·s, or fmaf(x, s, b) when b != 0 (ggml_vec_mad1_f32:
    FMA instructions on whole 32-float groups, and the -mfma build fuses the scalar tail too)."""
    run_prepared(_scale(params, dst))
    params.took(ShareKind.ROWS, thread_range(ggml_nrows(dst), params.ith, params.nth))


@kernel(GGMLOp.CLAMP, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_clamp(params, dst: Tensor) -> None:
    """ggml_compute_forward_clamp: y = MAX(MIN(x, max), min), rows interleaved (F32, F16)."""
    src0 = dst.source(0)
    if src0.type not in (T.F32, T.F16) or dst.type != src0.type:
        raise not_supported(dst, "F32 and F16 only")
    size = TYPE_TRAITS[src0.type].type_size
    name = "float" if size == 4 else "ggml_fp16_t"
    fn = f"ggml_compute_forward_clamp_{'f32' if size == 4 else 'f16'}"
    ggml_assert(int(dst.nb[0]) == size, f"nb0 == sizeof({name})", fn)
    ggml_assert(int(src0.nb[0]) == size, f"nb00 == sizeof({name})", fn)
    lo, hi = (F32(v) for v in dst.op_params.view(np.float32)[:2])
    rows = np.arange(params.ith, ggml_nrows(src0), params.nth)
    if len(rows):
        x = to_f32(flat_rows(src0)[rows], src0.type)
        t = np.where(x < hi, x, hi)  # MIN(x, max): a NaN becomes max
        flat_rows(dst)[rows] = from_f32(np.where(t > lo, t, lo), dst.type)
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("flat_rows"))


@kernel(GGMLOp.LEAKY_RELU, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_leaky_relu(params, dst: Tensor) -> None:
    """ggml_compute_forward_leaky_relu: y = (x > 0 ? x : 0) + slope·(x < 0 ? x : 0), thread 0."""
    src0 = dst.source(0)
    if src0.type not in (T.F32, T.F16) or dst.type != src0.type:
        raise not_supported(dst, "F32 and F16 only")
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    slope = F32(dst.op_params.view(np.float32)[0])
    x = to_f32(flat_rows(src0), src0.type)
    y = np.where(x > 0, x, F32(0)) + slope * np.where(x < 0, x, F32(0))
    flat_rows(dst)[:] = from_f32(y, dst.type)
    params.took(ShareKind.ALL)


# --- repeat, concat --------------------------------------------------------------------------

@kernel(GGMLOp.REPEAT, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_repeat(params, dst: Tensor) -> None:
    """ggml_compute_forward_repeat: tile src0 over dst (thread 0); elements copied as bits, so
    F32/I32 and F16/BF16/I16 alike."""
    src0 = dst.source(0)
    if src0.type not in (T.F32, T.I32, T.F16, T.BF16, T.I16) or dst.type != src0.type:
        raise not_supported(dst, "F32, I32, F16, BF16 and I16 only")
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    size = TYPE_TRAITS[src0.type].type_size
    fn = "ggml_compute_forward_repeat_" + ("f32" if size == 4 else "f16")
    ggml_assert(ggml_can_repeat(src0, dst), "ggml_can_repeat(src0, dst)", fn)
    name = "float" if size == 4 else "ggml_fp16_t"
    ggml_assert(int(dst.nb[0]) == size, f"nb0  == sizeof({name})", fn)
    ggml_assert(int(src0.nb[0]) == size, f"nb00 == sizeof({name})", fn)
    bits = np.uint32 if size == 4 else np.uint16
    s4 = view4(src0).view(bits)
    reps = tuple(int(d) // int(s) for d, s in zip(reversed(dst.ne), reversed(src0.ne)))
    view4(dst).view(bits)[:] = np.tile(s4, reps)
    params.took(ShareKind.ALL)


@kernel(GGMLOp.CONCAT, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_concat(params, dst: Tensor) -> None:
    """ggml_compute_forward_concat: dst[i] = src0[i] inside src0's extent, else src1[i - o] with
    o[dim] = src0.ne[dim]; threads take i2 interleaved. Any non-quantized type (copied as bits)."""
    src0, src1 = dst.source(0), dst.source(1)
    if TYPE_TRAITS[src0.type].is_quantized or TYPE_TRAITS[src0.type].blck_size != 1:
        raise not_supported(dst, "quantized types")
    dim = int(dst.op_params[0])
    ggml_assert(0 <= dim < 4, "dim >= 0 && dim < 4", "ggml_compute_forward_concat")
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[TYPE_TRAITS[src0.type].type_size]
    d4, s0, s1 = (view4(t).view(bits) for t in (dst, src0, src1))
    i2s = np.arange(params.ith, int(dst.ne[2]), params.nth)
    if len(i2s):
        axis = 3 - dim  # numpy axes are (i3, i2, i1, i0)
        n0 = int(src0.ne[dim])
        if dim == 2:
            a, b = i2s[i2s < n0], i2s[i2s >= n0]
            d4[:, a] = s0[:, a]
            d4[:, b] = s1[:, b - n0]
        else:
            head = [slice(None)] * 4
            head[axis] = slice(0, n0)
            tail = [slice(None)] * 4
            tail[axis] = slice(n0, None)
            out = d4[:, i2s]  # a copy (fancy index): fill, then write back
            out[tuple(head)] = s0[:, i2s]
            out[tuple(tail)] = s1[:, i2s]
            d4[:, i2s] = out
    params.took(ShareKind.INTERLEAVED, *i2s.tolist(), note=Note("i2_of_every_i3"))


# --- out_prod --------------------------------------------------------------------------------

@kernel(GGMLOp.OUT_PROD, n_tasks=all_threads, work=src0_row_per_task)
def compute_forward_out_prod(params, dst: Tensor) -> None:
    """ggml_compute_forward_out_prod_f32: dst[i0, i1, i2, i3] = Σ_k src0[i0, k, i2/r2, i3/r3] ·
    src1[i1, k, i2, i3], accumulated k by k with fused multiply-adds (ggml_vec_mad_f32: FMA
    instructions on whole 32-float groups, the scalar tail fused by the -mfma build)."""
    src0, src1 = dst.source(0), dst.source(1)
    if src0.type != T.F32:
        raise not_supported(dst, "F32 only (ggml aborts for F16; quantized src0 is not done here)")
    fn = "ggml_compute_forward_out_prod_f32"
    ggml_assert(dst.type == T.F32, "dst->type == GGML_TYPE_F32", fn)
    ggml_assert(src1.type == T.F32, "src1->type == GGML_TYPE_F32", fn)
    ne0, ne1, ne2, ne3 = (int(x) for x in dst.ne)
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ggml_assert(ne0 == ne00, "ne0 == ne00", fn)
    ggml_assert(ne1 == int(src1.ne[0]), "ne1 == ne10", fn)
    ggml_assert(ne2 == int(src1.ne[2]), "ne2 == ne12", fn)
    ggml_assert(ne3 == int(src1.ne[3]), "ne3 == ne13", fn)
    ggml_assert(ne2 % ne02 == 0, "ne2 % ne02 == 0", fn)
    ggml_assert(ne3 % ne03 == 0, "ne3 % ne03 == 0", fn)
    ggml_assert(int(src0.nb[0]) == 4, "nb00 == sizeof(float)", fn)
    ggml_assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)", fn)
    d4 = view4(dst)
    if params.ith == 0:
        d4[:] = 0
    params.barrier()
    ir0, ir1 = thread_range(ne1 * ne2 * ne3, params.ith, params.nth)
    if ir0 < ir1:
        ir = np.arange(ir0, ir1)
        i3, rest = np.divmod(ir, ne2 * ne1)
        i2, i1 = np.divmod(rest, ne1)
        a = view4(src0)[i3 // (ne3 // ne03), i2 // (ne2 // ne02)]  # (rows, ne01, ne00)
        v = view4(src1)[i3, i2, :, i1]  # (rows, ne11)
        with np.errstate(all="ignore"):  # (k by k: acc = fmaf(a[:, k], v[:, k], acc))
            acc = fm.fmaf_steps(np.moveaxis(a, 1, 0), np.moveaxis(v[:, :ne01], 1, 0)[..., None],
                                np.zeros((len(ir), ne0), F32))
        d4[i3, i2, i1] = acc
    note = (Note("dst_rows"), Note("zeroed_dst")) if params.ith == 0 else Note("dst_rows")
    params.took(ShareKind.ROWS, Interval(ir0, ir1), note=note)


# --- arange ----------------------------------------------------------------------------------

@kernel(GGMLOp.ARANGE, n_tasks=all_threads, work=no_work)
def compute_forward_arange(params, dst: Tensor) -> None:
    """ggml_compute_forward_arange_f32: dst[i] = start + step·i (one fused multiply-add),
    i interleaved."""
    if dst.type != T.F32:
        raise not_supported(dst, "F32 only")
    fn = "ggml_compute_forward_arange_f32"
    ggml_assert(int(dst.nb[0]) == 4, "dst->nb[0] == sizeof(float)", fn)
    start, stop, step = (F32(v) for v in dst.op_params.view(np.float32)[:3])
    steps = int(np.ceil((stop - start) / step))
    ggml_assert(ggml_nelements(dst) == steps, "ggml_nelements(dst) == steps", fn)
    i = np.arange(params.ith, steps, params.nth)
    strided(dst, (steps,), (4,))[i] = fm.fmaf(step, i.astype(F32), start)
    params.took(ShareKind.INTERLEAVED, *i.tolist(), note=Note("elements"))
