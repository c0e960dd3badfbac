"""ADD, SUB, MUL, DIV: element-wise with src1 broadcast by modulo (ggml-cpu/binary-ops.cpp), and
ADD_ID: each row plus the row of src1 that ids names (ggml-cpu/ops.cpp).

Each thread takes the generic row range of dst; src1's row is (i1 % ne11, i2 % ne12, i3 % ne13) and
repeats along dimension 0 when ne10 divides ne00. Values are computed in f32 and rounded to dst's
type, so f32 results are bit-exact with ggml. ADD_ID is F32 only.

Numerics: IEEE operations only (ggml's own arithmetic): the same bits as ggml on every CPU.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread, \
    src0_row_per_task
from engine.compute.kernels.common import from_f32, row_blocks, row_index, thread_range, to_f32, view4
from engine.compute.shares import Interval, ShareKind
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_nrows
from engine.core.errors import ggml_assert
from engine.core.types import GGMLType, TYPE_TRAITS

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
SUPPORTED = {(F32, F32, F32), (F16, F16, F16), (BF16, BF16, BF16), (BF16, F32, BF16),
             (BF16, F32, F32), (F16, F32, F16), (F16, F32, F32)}

OPS = {GGMLOp.ADD: np.add, GGMLOp.SUB: np.subtract, GGMLOp.MUL: np.multiply,
       GGMLOp.DIV: np.divide}


def src1_rows(s1: np.ndarray, i3: int, i2: int, a: int, b: int, ne0: int) -> np.ndarray:
    """src1's rows broadcast onto dst rows [a, b) of (i3, i2), repeated along dim 0 to ne0."""
    ne13, ne12, ne11, ne10 = s1.shape
    m = s1[i3 % ne13, i2 % ne12]
    if ne11 == 1:
        rows = m[0:1]  # numpy broadcasts the one row
    elif b <= ne11:
        rows = m[a:b]
    else:
        rows = m[np.arange(a, b) % ne11]
    if ne10 != ne0:
        rows = np.tile(rows, (1, ne0 // ne10))
    return rows


def _prepare_f32(params, dst: Tensor):
    """All-f32 nodes whose src1 rows are views (no repeat along dimension 0, no row gather):
    the node as one ufunc call per (i3, i2) block, writing into dst."""
    src0, src1 = dst.source(0), dst.source(1)
    if (src0.type, src1.type, dst.type) != (F32, F32, F32) or int(src0.nb[0]) != 4 \
            or int(dst.nb[0]) != 4 or int(src1.ne[0]) != int(dst.ne[0]):
        return None
    fn = OPS[GGMLOp(dst.op)]
    d4, s0, s1 = view4(dst), view4(src0), view4(src1)
    ne1, ne2 = int(dst.ne[1]), int(dst.ne[2])
    ir0, ir1 = thread_range(ggml_nrows(dst), params.ith, params.nth)
    parts = []
    for i3, i2, a, b in row_blocks(ne1, ne2, ir0, ir1):
        ne11 = s1.shape[2]
        if ne11 != 1 and b > ne11:
            return None  # src1's rows gathered by modulo: a copy, made at each compute
        parts.append((s0[i3, i2, a:b], src1_rows(s1, i3, i2, a, b, int(dst.ne[0])), d4[i3, i2, a:b]))

    return tuple(partial(fn, x, y, out=out) for x, y, out in parts)


@kernel(GGMLOp.ADD, n_tasks=all_threads, work=src0_row_per_task, barrier=False,
        prepare=_prepare_f32)
@kernel(GGMLOp.MUL, GGMLOp.DIV, n_tasks=all_threads, work=no_work, barrier=False,
        prepare=_prepare_f32)
@kernel(GGMLOp.SUB, n_tasks=one_thread, work=no_work, barrier=False, prepare=_prepare_f32)
def compute_forward_binary(params, dst: Tensor) -> None:
    """ggml_compute_forward_add / _sub / _mul / _div (non-quantized)."""
    src0, src1 = dst.source(0), dst.source(1)
    types = (src0.type, src1.type, dst.type)
    if types not in SUPPORTED:
        if dst.op == GGMLOp.ADD:
            from engine.compute.kernels.quant_copy import add_quantized  # dequantize, add, requantize

            return add_quantized(params, dst)
        raise not_supported(dst, "unsupported types")
    ggml_assert(int(src0.nb[0]) == TYPE_TRAITS[src0.type].type_size, "nb00 == sizeof(src0_t)",
                "binary_op", f"'{src0.name}' rows are not contiguous")
    ggml_assert(int(dst.nb[0]) == TYPE_TRAITS[dst.type].type_size, "nb0 == sizeof(dst_t)", "binary_op")
    fn = OPS[GGMLOp(dst.op)]
    d4, s0, s1 = view4(dst), view4(src0), view4(src1)
    ne1, ne2, ne0 = int(dst.ne[1]), int(dst.ne[2]), int(dst.ne[0])
    ir0, ir1 = thread_range(ggml_nrows(dst), params.ith, params.nth)
    with np.errstate(all="ignore"):
        for i3, i2, a, b in row_blocks(ne1, ne2, ir0, ir1):
            x = to_f32(s0[i3, i2, a:b], src0.type)
            y = to_f32(src1_rows(s1, i3, i2, a, b, ne0), src1.type)
            d4[i3, i2, a:b] = from_f32(fn(x, y, dtype=np.float32), dst.type)
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.ADD_ID, n_tasks=all_threads, work=src0_row_per_task)
def compute_forward_add_id(params, dst: Tensor) -> None:
    """ggml_compute_forward_add_id_f32: row (i1, i2) of a plus the row of b that ids[i1, i2] names."""
    a, b, ids = dst.source(0), dst.source(1), dst.source(2)
    fn = "ggml_compute_forward_add_id_f32"
    if a.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(dst.type == GGMLType.F32, "dst->type  == GGML_TYPE_F32", fn)
    ggml_assert(b.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
    ggml_assert(ids.type == GGMLType.I32, "src2->type == GGML_TYPE_I32", fn)
    ggml_assert(int(a.nb[0]) == 4 and int(b.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    ir0, ir1 = thread_range(ggml_nrows(a), params.ith, params.nth)
    a4, b4, d4, id4 = view4(a), view4(b), view4(dst), view4(ids)
    ne11 = int(b.ne[1])
    for ir in range(ir0, ir1):
        i3, i2, i1 = row_index(ir, a)
        i11 = int(id4[0, 0, i2, i1])
        ggml_assert(0 <= i11 < ne11, "i11 >= 0 && i11 < ne11", fn, f"id {i11} of {ne11} rows")
        d4[i3, i2, i1] = a4[i3, i2, i1] + b4[0, 0, i11]
    params.took(ShareKind.ROWS, Interval(ir0, ir1))
