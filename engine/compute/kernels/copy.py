"""DUP, CPY and CONT: copy src0's elements, in ggml's element order, into dst (converting types).

Mirrors ggml_compute_forward_dup in ggml-cpu/ops.cpp: elements are read row-major over src0 (i0
fastest) and written in dst's own row-major order, so shapes may differ as long as the counts agree.
Same-type contiguous copies split blocks between threads; the others split src0's dimension 1.
Copies to and from quantized types (de)quantize whole rows through engine.quants.

Numerics: copies and IEEE conversions (fp16/bf16 rounding as ggml's): ggml's bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported
from engine.compute.kernels.common import data_place, from_f32, thread_range, to_f32, view4
from engine.compute.shares import ShareKind
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nelements
from engine.core.types import GGMLType, TYPE_TRAITS

_FLOAT_PAIRS = {(a, b) for a in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
                for b in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)}
_FLOAT_PAIRS |= {(GGMLType.F32, GGMLType.I32), (GGMLType.I32, GGMLType.F32)}


def _same_cont(src0: Tensor, dst: Tensor) -> bool:
    return src0.type == dst.type and ggml_is_contiguous(src0) and ggml_is_contiguous(dst)


def _dup(params, dst: Tensor):
    """This thread's part of ggml_compute_forward_dup between non-quantized types (or the same
    quantized type, contiguous), ready to run; None for a copy to or from a quantized type."""
    src0 = dst.source(0)
    ggml_nel = ggml_nelements(dst)
    assert ggml_nel == ggml_nelements(src0)
    st, dt = GGMLType(src0.type), GGMLType(dst.type)
    s_tr, d_tr = TYPE_TRAITS[st], TYPE_TRAITS[dt]
    if s_tr.is_quantized or d_tr.is_quantized:
        if st != dt:
            return None
    elif st != dt and (st, dt) not in _FLOAT_PAIRS:
        raise not_supported(dst, f"no conversion from {s_tr.type_name} to {d_tr.type_name}")

    ith, nth = params.ith, params.nth
    if _same_cont(src0, dst):  # dup_same_cont: a memcpy of this thread's range of blocks
        k0, k1 = thread_range(ggml_nel // s_tr.blck_size, ith, nth)
        src = _bytes(src0, s_tr.type_size * k0, s_tr.type_size * k1)
        out = _bytes(dst, s_tr.type_size * k0, s_tr.type_size * k1)

        def memcpy() -> None:
            out[:] = src
        return memcpy
    if s_tr.is_quantized:  # same quantized type, not contiguous: copy whole rows of blocks
        raise not_supported(dst, "non-contiguous copy of quantized rows")

    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ir0, ir1 = thread_range(ne01, ith, nth)  # each thread takes rows [ir0, ir1) of every i02, i03
    s4, d4 = view4(src0), view4(dst)
    flat = d4.reshape(-1) if ggml_is_contiguous(dst) else None
    parts = []
    whole = flat is not None and ir0 == 0 and ir1 == ne01  # every row, in one copy: the blocks
    for i03 in range(ne03 if ir0 < ir1 and not whole else 0):  # below one after the other
        for i02 in range(ne02):
            k0 = ((i03 * ne02 + i02) * ne01 + ir0) * ne00
            n = (ir1 - ir0) * ne00  # written to dst's elements k0.. in ggml order (i0 fastest)
            at = slice(k0, k0 + n) if flat is not None else np.unravel_index(np.arange(k0, k0 + n),
                                                                                 d4.shape)
            parts.append((s4[i03, i02, ir0:ir1], at))
    if whole and ggml_nel:
        parts.append((s4, slice(0, ggml_nel)))

    def copy() -> None:
        for rows, at in parts:
            vals = rows if st == dt else from_f32(to_f32(rows, st), dt)
            if flat is not None:
                flat[at] = vals.reshape(-1)
            else:
                d4[at] = np.ascontiguousarray(vals).reshape(-1)
    return copy


# the copies ggml_graph_plan gives a row of floats per task: F16 <-> BF16 and F32 <-> I32
_THROUGH_F32 = {(GGMLType.F16, GGMLType.BF16), (GGMLType.BF16, GGMLType.F16),
                (GGMLType.F32, GGMLType.I32), (GGMLType.I32, GGMLType.F32)}


def _dup_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's CPY and DUP: a row of dst as floats per task when dst is quantized, or
    when src0 and src1 (CPY's destination) are a pair of _THROUGH_F32."""
    src0, src1 = node.source(0), node.src[1]
    pair = (src0.type, src1.type if src1 is not None else None)
    if TYPE_TRAITS[node.type].is_quantized or pair in _THROUGH_F32:
        return 4 * int(node.ne[0]) * n_tasks
    return 0


@kernel(GGMLOp.DUP, GGMLOp.CPY, n_tasks=all_threads, work=_dup_work, barrier=False, prepare=_dup)
@kernel(GGMLOp.CONT, n_tasks=all_threads, work=no_work, barrier=False, prepare=_dup)
def compute_forward_dup(params, dst: Tensor) -> None:
    """ggml_compute_forward_dup: dst = src0, element by element in row-major order."""
    src0 = dst.source(0)
    run = _dup(params, dst)
    if run is None:
        return _compute_quant_dup(params, dst, src0)
    run()
    if _same_cont(src0, dst):
        n_blocks = ggml_nelements(dst) // TYPE_TRAITS[dst.type].blck_size
        params.took(ShareKind.BLOCKS, thread_range(n_blocks, params.ith, params.nth))
    else:
        params.took(ShareKind.ROWS, thread_range(int(src0.ne[1]), params.ith, params.nth),
                    note=Note("rows_src0"))


def _bytes(t: Tensor, start: int, end: int) -> np.ndarray:
    ctx, off = data_place(t)
    return ctx.pool[off + start:off + end]


def _compute_quant_dup(params, dst: Tensor, src0: Tensor) -> None:
    """Copies to or from a quantized type: whole rows are (de)quantized."""
    from engine.compute.kernels.quant_copy import dup_quantized

    dup_quantized(params, dst, src0)
