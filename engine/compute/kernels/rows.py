"""GET_ROWS and SET_ROWS: gather rows by index, scatter rows by index (ggml-cpu/ops.cpp).

get_rows: thread ith takes the generic dr range of the *indices* (the flat elements of src1);
each index i01 = src1[i10, i11, i12] copies row (i01, i11, i12) of src0 into dst row (i10, i11,
i12), dequantizing quantized rows and widening f16/bf16 to f32 (f32 and i32 are copied).
set_rows: thread ith takes the dr range of src0's rows (dim 1) in every (i02, i03); the row goes to
dst row src1[i, i02 % ne11, i03 % ne12], converted with the CPU from_float of dst's type.
Leaves out: nothing of these two ops' CPU paths.

Numerics: copies and ggml's own conversions: ggml's bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import kernel, not_supported
from engine.compute.kernels.common import from_f32, thread_range, to_f32, view4
from engine.compute.kernels.nn_util import raw_rows4
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_nelements
from engine.core.types import GGMLType, TYPE_TRAITS


def _get_rows(params, dst: Tensor):
    """This thread's indices of ggml_compute_forward_get_rows, ready to run (the indices read
    when it runs)."""
    src0, src1 = dst.src[0], dst.src[1]
    t0 = TYPE_TRAITS[src0.type]
    if not (t0.is_quantized or src0.type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16,
                                             GGMLType.I32)):
        raise not_supported(dst, "ggml's get_rows aborts for this source type")
    if int(src0.nb[0]) != t0.type_size:
        # ggml copies ne00 packed elements from each row start (its nb00 check is a debug assert)
        raise not_supported(dst, f"src0 rows are not packed (nb00 = {int(src0.nb[0])})")
    ne10, ne11 = int(src1.ne[0]), int(src1.ne[1])
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    ir0, ir1 = thread_range(ggml_nelements(src1), params.ith, params.nth)
    # flat index i -> (i12, i11, i10), as ggml derives them
    i = np.arange(ir0, ir1)
    i12, rest = np.divmod(i, ne11 * ne10)
    i11, i10 = np.divmod(rest, ne10)
    s1, d4 = view4(src1), view4(dst)
    raw = raw_rows4(src0) if t0.is_quantized else None
    s0 = None if t0.is_quantized else view4(src0)

    def run() -> None:
        if ir0 >= ir1:
            return
        idx = s1[0, i12, i11, i10].astype(np.int64)
        bad = (idx < 0) | (idx >= ne01)
        ggml_assert(not bad.any(), "i01 >= 0 && i01 < ne01", "ggml_compute_forward_get_rows",
                    f"index {int(idx[bad][0]) if bad.any() else 0} outside [0, {ne01})")
        if raw is not None:
            from engine.quants import dequantize

            rows = dequantize(src0.type, np.ascontiguousarray(raw[i12, i11, idx]).reshape(-1),
                              len(i) * ne00).reshape(len(i), ne00)  # (n, row_bytes) raw rows
        else:
            rows = s0[i12, i11, idx]
            if src0.type in (GGMLType.F16, GGMLType.BF16):
                rows = to_f32(rows, src0.type)
        d4[i12, i11, i10] = rows
    return run


@kernel(GGMLOp.GET_ROWS, barrier=False, prepare=_get_rows)
def compute_forward_get_rows(params, dst: Tensor) -> None:
    """ggml_compute_forward_get_rows:
    dst[:, i10, i11, i12] = src0[:, src1[i10, i11, i12], i11, i12]."""
    _get_rows(params, dst)()
    params.took("rows", thread_range(ggml_nelements(dst.src[1]), params.ith, params.nth),
                note=Note("index_rows"))


def _set_rows(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_set_rows, ready to run (the indices read when it
    runs)."""
    src0, src1 = dst.src[0], dst.src[1]
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml's set_rows takes F32 rows only")
    if src1.type not in (GGMLType.I32, GGMLType.I64):
        raise not_supported(dst, "indices must be I32 or I64")
    td = TYPE_TRAITS[dst.type]
    if not (td.is_quantized or dst.type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)):
        raise not_supported(dst, "no from_float for this destination type")
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ne11, ne12 = int(src1.ne[1]), int(src1.ne[2])
    ne1 = int(dst.ne[1])
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    s4, c4 = view4(src0), view4(src1)
    out = raw_rows4(dst) if td.is_quantized else view4(dst)
    parts = [(c4[0, i03 % ne12, i02 % ne11, ir0:ir1], s4[i03, i02, ir0:ir1], out[i03, i02])
             for i03 in range(ne03) for i02 in range(ne02)] if ir0 < ir1 else []

    def run() -> None:
        for at, rows, to in parts:
            idx = at.astype(np.int64, copy=False)
            rising = len(idx) < 2 or bool((idx[1:] > idx[:-1]).all())  # (then no index repeats)
            if (idx[0] < 0 or idx[-1] >= ne1) if rising else (idx.min() < 0 or idx.max() >= ne1):
                bad = (idx < 0) | (idx >= ne1)
                ggml_assert(False, "i1 >= 0 && i1 < ne1", "ggml_compute_forward_set_rows",
                            f"index {int(idx[bad][0])} outside [0, {ne1})")
            if not rising:
                # rows are written in order: for a repeated index the last one stays
                last = len(idx) - 1 - np.unique(idx[::-1], return_index=True)[1]
                idx, rows = idx[last], rows[last]
            if td.is_quantized:
                from engine.quants import from_float

                to[idx] = from_float(dst.type, rows).reshape(len(idx), -1)
            else:
                to[idx] = from_f32(rows, dst.type)
    return run


@kernel(GGMLOp.SET_ROWS, barrier=False, prepare=_set_rows)
def compute_forward_set_rows(params, dst: Tensor) -> None:
    """ggml_compute_forward_set_rows (f32 rows):
    dst[:, src1[i, i02 % ne11, i03 % ne12], i02, i03] = src0[:, i, i02, i03]."""
    _set_rows(params, dst)()
    params.took("rows", thread_range(int(dst.src[0].ne[1]), params.ith, params.nth),
                note=Note("rows_src0"))
