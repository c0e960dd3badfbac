"""Copies into and out of quantized tensors, and ADD with a quantized src0 (ggml-cpu/ops.cpp).

- float -> quantized (dup_to_q): threads split src0's dimension 1; each row is converted to f32
  and quantized with the CPU's from_float into the contiguous destination.
- quantized -> f32 (dup_from_q): threads split the blocks; each block is dequantized into place.
- add_q_f32: dequantize a row of src0, add src1's row, quantize the sum into dst's row.

Numerics: the quantizers and dequantizers of engine.quants, IEEE operations only: ggml's
bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import not_supported
from engine.compute.kernels.common import data_place, thread_range, to_f32, view4
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.quants import dequantize, from_float
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_is_contiguous, ggml_nelements, \
    ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS, ggml_row_size


def _pool(t: Tensor) -> tuple[np.ndarray, int]:
    ctx, off = data_place(t)
    return ctx.pool, off


def dup_quantized(params, dst: Tensor, src0: Tensor) -> None:
    s_tr, d_tr = TYPE_TRAITS[src0.type], TYPE_TRAITS[dst.type]
    if d_tr.is_quantized and not s_tr.is_quantized:
        return _dup_to_q(params, dst, src0)
    if s_tr.is_quantized and dst.type == GGMLType.F32:
        return _dup_from_q(params, dst, src0)
    raise not_supported(dst, f"no copy from {s_tr.type_name} to {d_tr.type_name}")


def _dup_to_q(params, dst: Tensor, src0: Tensor) -> None:
    """ggml_compute_forward_dup_to_q: quantize src0's rows [ir0, ir1) of every (i2, i3)."""
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ggml_assert(ggml_is_contiguous(dst) and int(src0.nb[0]) == TYPE_TRAITS[src0.type].type_size,
                "ggml_is_contiguous(dst) && nb00 == sizeof(src_t)", "ggml_compute_forward_dup_to_q")
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    rs = ggml_row_size(dst.type, ne00)
    pool, off = _pool(dst)
    s4 = view4(src0)
    if ir0 < ir1:
        for i03 in range(ne03):
            for i02 in range(ne02):
                rows = to_f32(s4[i03, i02, ir0:ir1], src0.type).astype(np.float32)
                q = from_float(dst.type, rows).reshape(-1)
                start = off + ((i03 * ne02 + i02) * ne01 + ir0) * rs
                pool[start:start + q.size] = q
    params.took(ShareKind.ROWS, Interval(ir0, ir1), note=Note("rows_src0"))


def _dup_from_q(params, dst: Tensor, src0: Tensor) -> None:
    """ggml_compute_forward_dup_from_q: dequantize this thread's blocks into dst."""
    tr = TYPE_TRAITS[src0.type]
    qk = tr.blck_size
    ne00, ne01, ne02, _ = (int(x) for x in src0.ne)
    nb00, nb01, nb02, nb03 = (int(x) for x in src0.nb)
    ggml_assert(int(dst.nb[0]) == 4, "nb10 == ggml_type_size(dst->type)",
                "ggml_compute_forward_dup_from_q")
    ggml_assert(int(dst.ne[0]) % qk == 0 or ggml_is_contiguous(dst),
                "(ne10 % qk) == 0 || ggml_is_contiguous(dst)", "ggml_compute_forward_dup_from_q")
    nr = ggml_nelements(dst) // qk
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 < ir1:
        i = np.arange(ir0, ir1, dtype=np.int64) * qk  # first element of each block
        i03, r = np.divmod(i, ne00 * ne01 * ne02)
        i02, r = np.divmod(r, ne00 * ne01)
        i01, i00 = np.divmod(r, ne00)
        pool, off = _pool(src0)
        starts = off + (i00 // qk) * nb00 + i01 * nb01 + i02 * nb02 + i03 * nb03
        blocks = pool[starts[:, None] + np.arange(tr.type_size)]
        vals = dequantize(src0.type, blocks.reshape(-1), (ir1 - ir0) * qk)
        d4 = view4(dst)
        idx = np.unravel_index(np.arange(ir0 * qk, ir1 * qk), d4.shape)
        d4[idx] = vals
    params.took(ShareKind.BLOCKS, Interval(ir0, ir1))


def add_quantized(params, dst: Tensor) -> None:
    """ggml_compute_forward_add_q_f32: dst row = quantize(dequantize(src0 row) + src1 row)."""
    src0, src1 = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_add_q_f32"
    if not TYPE_TRAITS[src0.type].is_quantized or src1.type != GGMLType.F32:
        raise not_supported(dst, "unsupported types")
    ggml_assert(ggml_are_same_shape(src0, src1) and ggml_are_same_shape(src0, dst),
                "ggml_are_same_shape(src0, src1) && ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(int(src0.nb[0]) == TYPE_TRAITS[src0.type].type_size,
                "nb00 == ggml_type_size(type)", fn)
    ggml_assert(int(src1.nb[0]) == 4, "nb10 == sizeof(float)", fn)
    ne00, ne01, ne02, _ = (int(x) for x in src0.ne)
    ir0, ir1 = thread_range(ggml_nrows(src0), params.ith, params.nth)
    rs0, rsd = ggml_row_size(src0.type, ne00), ggml_row_size(dst.type, ne00)
    p0, o0 = _pool(src0)
    pd, od = _pool(dst)
    s1 = view4(src1)
    for ir in range(ir0, ir1):
        i03, r = divmod(ir, ne02 * ne01)
        i02, i01 = divmod(r, ne01)
        a = o0 + i01 * int(src0.nb[1]) + i02 * int(src0.nb[2]) + i03 * int(src0.nb[3])
        row = dequantize(src0.type, p0[a:a + rs0], ne00) + s1[i03, i02, i01]
        b = od + i01 * int(dst.nb[1]) + i02 * int(dst.nb[2]) + i03 * int(dst.nb[3])
        pd[b:b + rsd] = from_float(dst.type, row.astype(np.float32)).reshape(-1)
    params.took(ShareKind.ROWS, Interval(ir0, ir1))
