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

from engine.compute.kernels import kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import byte_span, from_f32, spans, thread_range, to_f32, view4
from engine.compute.kernels.nn_util import raw_rows4
from engine.compute.shares import ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_nelements
from engine.core.types import GGMLType, TYPE_TRAITS, fp32_to_bf16_bits, fp32_to_fp16_bits
from engine.lanes import lanes, twin


def _get_rows(params, dst: Tensor):
    """This thread's indices of ggml_compute_forward_get_rows, ready to run (the indices read
    when it runs)."""
    src0, src1 = dst.source(0), dst.source(1)
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
            assert s0 is not None  # (not quantized: read as elements)
            rows = s0[i12, i11, idx]
            if src0.type in (GGMLType.F16, GGMLType.BF16):
                rows = to_f32(rows, src0.type)
        d4[i12, i11, i10] = rows
    return run


@kernel(GGMLOp.GET_ROWS, n_tasks=one_thread, work=no_work, barrier=False, prepare=_get_rows)
def compute_forward_get_rows(params, dst: Tensor) -> None:
    """ggml_compute_forward_get_rows:
    dst[:, i10, i11, i12] = src0[:, src1[i10, i11, i12], i11, i12]."""
    _get_rows(params, dst)()
    params.took(ShareKind.ROWS, thread_range(ggml_nelements(dst.source(1)), params.ith, params.nth),
                note=Note("index_rows"))


_ROW_KIND: dict[int, int] = {GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.BF16: 2}  # lanes.set_rows' kinds


def _set_rows(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_set_rows, ready to run (the indices read when it
    runs)."""
    src0, src1 = dst.source(0), dst.source(1)
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml's set_rows takes F32 rows only")
    if src1.type not in (GGMLType.I32, GGMLType.I64):
        raise not_supported(dst, "indices must be I32 or I64")
    td = TYPE_TRAITS[dst.type]
    if not (td.is_quantized or dst.type in _ROW_KIND):
        raise not_supported(dst, "no from_float for this destination type")
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ne11, ne12 = int(src1.ne[1]), int(src1.ne[2])
    ne1 = int(dst.ne[1])
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    s4, c4 = view4(src0), view4(src1)
    out = raw_rows4(dst) if td.is_quantized else view4(dst)
    parts = [(c4[0, i03 % ne12, i02 % ne11, ir0:ir1], s4[i03, i02, ir0:ir1], out[i03, i02])
             for i03 in range(ne03) for i02 in range(ne02)] if ir0 < ir1 else []

    def check(at: np.ndarray, first_bad: int) -> None:
        ggml_assert(first_bad < 0, "i1 >= 0 && i1 < ne1", "ggml_compute_forward_set_rows",
                    f"index {int(at[first_bad])} outside [0, {ne1})")

    if not td.is_quantized and all(spans(a) for part in parts for a in part):
        # the C loop (or its twin): each part's rows, indices and destination as byte spans
        wide, kind = src1.type == GGMLType.I64, _ROW_KIND[dst.type]
        calls = []
        for at, rows, to in parts:
            (x, ldx), (i, ldi), (o, ldo) = byte_span(rows), byte_span(at[:, None]), byte_span(to)
            calls.append((at, (x, ldx, i, ldi, wide, o, ldo, ne1, len(rows), ne00, kind)))
        set_rows = lanes.set_rows

        def run_spans() -> None:
            for at, args in calls:
                first_bad = set_rows(*args)
                if first_bad >= 0:
                    check(at, first_bad)
        return run_spans

    def run() -> None:
        for at, rows, to in parts:
            idx = at.astype(np.int64, copy=False)
            bad = np.flatnonzero((idx < 0) | (idx >= ne1))
            if len(bad):
                check(at, int(bad[0]))
            idx, rows = _last_of_each(idx, rows)
            if td.is_quantized:
                from engine.quants import from_float

                to[idx] = from_float(dst.type, rows).reshape(len(idx), -1)
            else:  # (rows the C loop cannot take: a permuted view)
                to[idx] = from_f32(rows, dst.type)
    return run


def _last_of_each(idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows are written in order: for a repeated index the last one stays."""
    if len(idx) < 2 or bool((idx[1:] > idx[:-1]).all()):  # (rising: no index repeats)
        return idx, rows
    last = len(idx) - 1 - np.unique(idx[::-1], return_index=True)[1]
    return idx[last], rows[last]


@twin("set_rows")
def set_rows_into(x, ldx: int, idx, ldi: int, wide: bool, out, ldo: int, ne1: int, rows: int,
                  n: int, kind: int) -> int:
    """engine._lanes.set_rows: rows of n float32 (row r at byte r * ldx of x) into out's rows
    idx[r] (row i at byte i * ldo; index r at byte r * ldi, int64 if wide, else int32) as float32
    (kind 0), f16 (1) or bf16 (2), in order; every index checked against [0, ne1) first: -1, or
    the first r outside (nothing written)."""
    strided = np.lib.stride_tricks.as_strided
    if rows == 0:
        return -1
    isize = 8 if wide else 4
    at = strided(np.frombuffer(idx, np.uint8), (rows, isize), (ldi, 1)).copy()
    at = at.view(np.int64 if wide else np.int32)[:, 0].astype(np.int64)
    bad = np.flatnonzero((at < 0) | (at >= ne1))
    if len(bad):
        return int(bad[0])
    xs = strided(np.frombuffer(x, np.uint8), (rows, 4 * n), (ldx, 1)).copy().view(np.float32)
    esize = 4 if kind == 0 else 2
    to = strided(np.frombuffer(out, np.uint8), (ne1, esize * n), (ldo, 1), writeable=True)
    at, xs = _last_of_each(at, xs)
    values = xs if kind == 0 else fp32_to_fp16_bits(xs) if kind == 1 else fp32_to_bf16_bits(xs)
    to[at] = values.view(np.uint8)
    return -1


@kernel(GGMLOp.SET_ROWS, n_tasks=one_thread, work=no_work, barrier=False, prepare=_set_rows)
def compute_forward_set_rows(params, dst: Tensor) -> None:
    """ggml_compute_forward_set_rows (f32 rows):
    dst[:, src1[i, i02 % ne11, i03 % ne12], i02, i03] = src0[:, i, i02, i03]."""
    _set_rows(params, dst)()
    params.took(ShareKind.ROWS, thread_range(int(dst.source(0).ne[1]), params.ith, params.nth),
                note=Note("rows_src0"))
