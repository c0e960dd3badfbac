"""GLU: y = act(x) · g, with x and g the two halves of each row of src0 (or src0 and src1).

Mirrors ggml_compute_forward_glu and the reglu/geglu/swiglu/swiglu_oai/geglu_erf/geglu_quick
kernels of ggml-cpu/ops.cpp. Rows are taken flat (row i at data + i·nb1; the constructor demands
contiguous_1 tensors) and split between threads by the generic row range. Without src1, x is the
first half of the row and g the second; op_params[1] (swapped) exchanges them.
F32 and F16 (SWIGLU_OAI: F32 only); the f16 kernels compute in f32 and round once at the end.

Numerics: erff and expf are the C library's (engine.libm), as ggml calls them; GEGLU and
GEGLU_QUICK use ggml's fp16 tables and SWIGLU ggml's own v_silu polynomial, emulated with IEEE
operations: ggml's bits on every CPU.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from engine.compute.kernels import floatmath as fm
from engine.compute.kernels import CLoop, all_threads, kernel, no_work, not_supported, run_prepared
from engine.compute.kernels.common import thread_range
from engine.compute.kernels.unary import f16_table_times
from engine.compute.kernels.views import flat_rows
from engine.compute.shares import ShareKind
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLGluOp as G, GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous_1, ggml_nrows
from engine.core.types import GGMLType, fp32_to_fp16_bits
from engine.lanes import lanes

F32 = np.float32


def _swiglu_f32(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """ggml_vec_swiglu_f32: v_silu(x)·g on whole 8-float groups, silu(x)·g on the rest."""
    return fm.silu_rows(x) * g


def _geglu_f32(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16): 0 at or below -10, x·g at or above 10, table(x)·g
    between (lanes.gelu_lookup with g)."""
    x, g = np.ascontiguousarray(x, F32), np.ascontiguousarray(g, F32)
    y = np.empty(x.shape, F32)
    lanes.gelu_lookup(x, fm.widened_table("gelu"), y, True, g)
    return y


def _geglu_erf(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return F32(0.5) * x * (F32(1) + fm.erff(x * fm.SQRT_2_INV)) * g


def _swiglu_oai(dst: Tensor):
    p = dst.op_params.view(np.float32)
    alpha, limit = F32(p[2]), F32(p[3])

    def fn(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        x = np.where(limit < x, limit, x)  # std::min(x, limit)
        y = np.where(g < -limit, -limit, np.where(limit < g, limit, g))  # std::clamp
        out_glu = x / (F32(1) + fm.expf(alpha * -x))
        return out_glu * (y + F32(1))
    return fn


# the tables are looked up by op_params[0], the op's number
F32_FNS: dict[int, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    G.REGLU: lambda x, g: np.where(x > 0, x * g, F32(0)),
    G.GEGLU: _geglu_f32,
    G.SWIGLU: _swiglu_f32,
    G.GEGLU_ERF: _geglu_erf,
    G.GEGLU_QUICK: lambda x, g: fm.gelu_quick_via_table(x) * g,
}
# f16: the table ops look up the f16 bits of x directly
F16_FNS: dict[int, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    G.REGLU: lambda x, g: np.where(x > 0, x * g, F32(0)),
    G.SWIGLU: lambda x, g: fm.silu_scalar(x) * g,
    G.GEGLU_ERF: _geglu_erf,
}
F16_TABLES: dict[int, Callable[[], np.ndarray]] = {G.GEGLU: fm.gelu_table, G.GEGLU_QUICK: fm.gelu_quick_table}


def _glu(params, dst: Tensor):
    """This thread's rows of ggml_compute_forward_glu (op_params[0], the ggml_glu_op), ready to
    run."""
    src0, src1 = dst.source(0), dst.src[1]
    op = int(dst.op_params[0])
    fn = "ggml_compute_forward_glu"
    if src0.type not in (GGMLType.F32, GGMLType.F16) or dst.type != src0.type or (
            op == G.SWIGLU_OAI and src0.type != GGMLType.F32):
        raise not_supported(dst, "GLU kernels exist for F32 and F16 (SWIGLU_OAI: F32) only")
    ggml_assert(ggml_is_contiguous_1(src0), "ggml_is_contiguous_1(src0)", fn)
    ggml_assert(ggml_is_contiguous_1(dst), "ggml_is_contiguous_1(dst)", fn)
    if src1 is not None:
        ggml_assert(ggml_is_contiguous_1(src1), "ggml_is_contiguous_1(src1)", fn)
        ggml_assert(src0.type == src1.type, "src0->type == src1->type", fn)
    nc = int(src0.ne[0]) if src1 is not None else int(src0.ne[0]) // 2
    nr = ggml_nrows(src0)
    ggml_assert(int(dst.ne[0]) == nc, "dst->ne[0] == nc", fn)
    ggml_assert(ggml_nrows(dst) == nr, "ggml_nrows(dst) == nr", fn)
    swapped = int(dst.op_params[1]) != 0

    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    r0 = flat_rows(src0)[ir0:ir1]
    if src1 is not None:
        x, g = r0, flat_rows(src1)[ir0:ir1]
    else:  # one row holds both halves
        x, g = (r0[:, nc:2 * nc], r0[:, :nc]) if swapped else (r0[:, :nc], r0[:, nc:2 * nc])
    out = flat_rows(dst)[ir0:ir1]
    f = (_swiglu_oai(dst) if op == G.SWIGLU_OAI else F32_FNS[op]) \
        if src0.type == GGMLType.F32 else None

    if ir0 >= ir1:
        return ()
    if f is not None and op in (G.GEGLU, G.SWIGLU) and all(
            a.flags.c_contiguous for a in (x, g, out)):  # (a row, or rows of their own)
        if op == G.GEGLU:
            return partial(lanes.gelu_lookup, x, fm.widened_table("gelu"), out, True, g,
                           params.c_threads)
        if nc % fm.SIMD_LANES == 0:  # (every row whole lanes: v_silu's lanes throughout)
            return partial(lanes.v_silu, x, out, g, params.c_threads)
        # (in place: the same products as _swiglu_f32, no temporaries)
        return partial(fm.silu_rows, x, out), partial(np.multiply, out, g, out=out)

    def run() -> None:
        if op == G.SWIGLU and f is not None and out.flags.c_contiguous:
            fm.silu_rows(x, out)  # (in place: the same products as _swiglu_f32, no temporaries)
            np.multiply(out, g, out=out)
        elif f is not None:
            out[:] = f(x, g)
        elif op in F16_TABLES:
            out.view(np.uint16)[:] = f16_table_times(F16_TABLES[op](), x.view(np.uint16),
                                                     g.astype(F32))
        else:
            y = F16_FNS[op](x.astype(F32), g.astype(F32))
            out.view(np.uint16)[:] = fp32_to_fp16_bits(y)
    return run


@kernel(GGMLOp.GLU, n_tasks=all_threads, work=no_work, barrier=False, holds_gil=True,
        in_c=CLoop("v_silu", "ggml_vec_swiglu_f32", G.SWIGLU), prepare=_glu)
def compute_forward_glu(params, dst: Tensor) -> None:
    """ggml_compute_forward_glu: dispatch on op_params[0] (the ggml_glu_op)."""
    run_prepared(_glu(params, dst))
    params.took(ShareKind.ROWS, thread_range(ggml_nrows(dst.source(0)), params.ith, params.nth))
