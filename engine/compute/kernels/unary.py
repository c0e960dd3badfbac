"""UNARY (every ggml_unary_op) and SQR, SQRT, LOG, SIN, COS: one function applied per element.

Mirrors ggml-cpu/unary-ops.cpp (apply_unary_op: convert to f32, apply, convert to dst's type) and
the dedicated f32/f16 kernels of ops.cpp for GELU, GELU_ERF, GELU_QUICK and SILU. Every thread
takes the generic row range [ir0, ir1) of src0 (even for ops whose n_tasks is 1: at compute time
every thread runs every node).

Numerics follow the oracle's AVX2 build (see floatmath). Where ggml calls the C library (tanhf,
expm1f, expf, logf, sinf, cosf, erff) the engine calls the same functions (engine.libm); GELU and
GELU_QUICK go through ggml's fp16 lookup tables (f32 GELU clamps at ±10 first), and SILU is ggml's
own ggml_v_silu polynomial on whole 8-float groups of each row (emulated with IEEE operations)
and libm's expf on the rest. Every result is bit-exact with ggml on any x86-64 CPU.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from engine.compute.kernels import floatmath as fm
from engine.compute.kernels import CLoop, kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import from_f32, row_blocks, thread_range, to_f32, view4
from engine.compute.kernels.views import strided
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp, GGMLUnaryOp as U
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_is_contiguous, \
    ggml_is_contiguous_1, ggml_is_contiguous_rows, ggml_nelements, ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS, fp16_bits_to_fp32, fp32_to_fp16_bits
from engine.lanes import lanes

F32 = np.float32
T = GGMLType
# (src0, dst) type pairs of unary_op
UNARY_TYPES = {(T.F32, T.F32), (T.F16, T.F16), (T.BF16, T.BF16), (T.BF16, T.F32), (T.F16, T.F32)}


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """roundf: halves away from zero (numpy's round goes to even)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= F32(0.5), t + np.copysign(F32(1), x), t).astype(F32)


def _hardsigmoid(x: np.ndarray) -> np.ndarray:
    return np.fmin(F32(1), np.fmax(F32(0), (x + F32(3)) / F32(6)))


# f32 -> f32 element functions, written as the C expressions they mirror
ELEMENT_FNS: dict[int, Callable[[np.ndarray], np.ndarray]] = {  # (by op_params[0])
    U.ABS: np.abs,
    U.SGN: lambda x: np.where(x > 0, F32(1), np.where(x < 0, F32(-1), F32(0))),
    U.NEG: np.negative,
    U.STEP: lambda x: np.where(x > 0, F32(1), F32(0)),
    U.TANH: fm.tanhf,
    U.ELU: lambda x: np.where(x > 0, x, fm.expm1f(x)),
    U.RELU: lambda x: np.where(x > 0, x, F32(0)),
    U.SIGMOID: lambda x: F32(1) / (F32(1) + fm.expf(-x)),
    U.HARDSWISH: lambda x: x * _hardsigmoid(x),
    U.HARDSIGMOID: _hardsigmoid,
    U.EXP: fm.expf,
    U.EXPM1: lambda x: fm.expf(x) - F32(1),  # op_expm1 is expf(x) - 1, not expm1f
    U.SOFTPLUS: fm.ggml_compute_softplus_f32,
    U.FLOOR: np.floor,
    U.CEIL: np.ceil,
    U.ROUND: _round_half_away,
    U.TRUNC: np.trunc,
}
OP_FNS = {
    GGMLOp.SQR: lambda x: x * x,
    GGMLOp.SQRT: np.sqrt,
    GGMLOp.LOG: fm.logf,
    GGMLOp.SIN: fm.sinf,
    GGMLOp.COS: fm.cosf,
}


def _xielu(dst: Tensor):
    """op_xielu with its four f32 parameters (op_params[1..4])."""
    p = dst.op_params.view(np.float32)
    alpha_n, alpha_p, beta, eps = (F32(v) for v in p[1:5])

    def fn(x: np.ndarray) -> np.ndarray:
        # the -mfma build fuses the final product into the sum: fmaf(alpha·x, x, beta·x) above 0,
        # fmaf(expm1f(min(x, eps)) - x, alpha_n, beta·x) below
        pos = fm.fmaf(alpha_p * x, x, beta * x)
        neg = fm.fmaf(fm.expm1f(np.fmin(x, eps)) - x, alpha_n, beta * x)
        return np.where(x > 0, pos, neg)
    return fn


def apply_rows(params, dst: Tensor, fn, *, fn_bits=None, into=None) -> None:
    """The generic unary loop: rows [ir0, ir1) of src0 (flat row = (i3·ne2 + i2)·ne1 + i1),
    y = to_dst(fn(to_f32(x))). fn_bits, when given, maps src bits to dst bits directly (the f16
    table lookups); into(x, out), when given, writes f32 results straight into f32 dst rows."""
    src0 = dst.source(0)
    s4, d4 = view4(src0), view4(dst)
    ne1, ne2 = int(src0.ne[1]), int(src0.ne[2])
    ir0, ir1 = thread_range(ggml_nrows(src0), params.ith, params.nth)
    with np.errstate(all="ignore"):
        for i3, i2, a, b in row_blocks(ne1, ne2, ir0, ir1):
            x = s4[i3, i2, a:b]
            if into is not None and src0.type == dst.type == GGMLType.F32:
                into(x, d4[i3, i2, a:b])
            elif fn_bits is not None:
                d4[i3, i2, a:b] = fn_bits(x.view(np.uint16)).view(d4.dtype)
            else:
                d4[i3, i2, a:b] = from_f32(fn(to_f32(x, src0.type)), dst.type)
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


def _check_rows(dst: Tensor, fn: str, contiguous_1: bool = False) -> None:
    src0 = dst.source(0)
    if contiguous_1:
        ggml_assert(ggml_is_contiguous_1(src0) and ggml_is_contiguous_1(dst)
                    and ggml_are_same_shape(src0, dst),
                    "ggml_is_contiguous_1(src0) && ggml_is_contiguous_1(dst) && "
                    "ggml_are_same_shape(src0, dst)", fn)
    else:
        ggml_assert(ggml_is_contiguous_rows(src0) and ggml_is_contiguous_rows(dst)
                    and ggml_are_same_shape(src0, dst),
                    "ggml_is_contiguous_rows(src0) && ggml_is_contiguous_rows(dst) && "
                    "ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(int(dst.nb[0]) == TYPE_TRAITS[dst.type].type_size, "nb0 == sizeof(dst_t)", fn)
    ggml_assert(int(src0.nb[0]) == TYPE_TRAITS[src0.type].type_size, "nb00 == sizeof(src0_t)", fn)


def _unary_op(params, dst: Tensor, fn, contiguous_1: bool = False) -> None:
    """unary_op<op>: the five supported (src0, dst) type pairs, computed in f32."""
    if (dst.source(0).type, dst.type) not in UNARY_TYPES:
        raise not_supported(dst, "unsupported types")
    _check_rows(dst, "apply_unary_op", contiguous_1)
    apply_rows(params, dst, fn)


def _f32_or_f16(dst: Tensor) -> None:
    """The dedicated gelu/silu kernels exist for F32 and F16 only (dst of the same type)."""
    if dst.source(0).type not in (T.F32, T.F16) or dst.type != dst.source(0).type:
        raise not_supported(dst, "this activation has F32 and F16 kernels only")


def _gelu_erf_f32(x: np.ndarray) -> np.ndarray:
    return F32(0.5) * x * (F32(1) + fm.erff(x * fm.SQRT_2_INV))


# the f32 table lookups gelu_lookup computes: op -> (its table, clamped at ±10)
LOOKUPS: dict[int, tuple[str, bool]] = {U.GELU: ("gelu", True), U.GELU_QUICK: ("gelu_quick", False)}


def _lookup(params, dst: Tensor):
    """An F32 GELU or GELU_QUICK node of packed tensors, whole, ready to run: ggml_vec_gelu_f32
    (ggml_vec_gelu_quick_f32) by lanes.gelu_lookup, element by element as every thread's rows
    would be (None: the node takes compute_forward_unary's path)."""
    src0 = dst.source(0)
    op = int(dst.op_params[0])
    if op not in LOOKUPS or src0.type != T.F32 or dst.type != T.F32 or not (
            ggml_is_contiguous(src0) and ggml_is_contiguous(dst)
            and ggml_are_same_shape(src0, dst)):
        return None
    n = ggml_nelements(src0)
    x, y = strided(src0, (n,), (4,)), strided(dst, (n,), (4,))
    name, clamp = LOOKUPS[op]
    return partial(lanes.gelu_lookup, x, fm.widened_table(name), y, clamp, None, params.c_threads)


# the unary ops ggml_get_n_tasks gives every thread (the others take one)
ALL_THREADS_UNARY = frozenset({U.GELU, U.GELU_ERF, U.GELU_QUICK, U.SILU, U.XIELU})


def _unary_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks's UNARY: by the ggml_unary_op (op_params[0])."""
    return n_threads if int(node.op_params[0]) in ALL_THREADS_UNARY else 1


@kernel(GGMLOp.UNARY, n_tasks=_unary_tasks, work=no_work, barrier=False, holds_gil=True,
        in_c=CLoop("v_silu", "ggml_vec_silu_f32", U.SILU), prepare=_lookup)
def compute_forward_unary(params, dst: Tensor) -> None:
    """ggml_compute_forward_unary: dispatch on op_params[0] (the ggml_unary_op)."""
    op = int(dst.op_params[0])
    if op in ELEMENT_FNS:
        return _unary_op(params, dst, ELEMENT_FNS[op])
    if op == U.XIELU:
        return _unary_op(params, dst, _xielu(dst), contiguous_1=True)
    _f32_or_f16(dst)
    f16 = dst.source(0).type == T.F16
    if op == U.GELU:
        if f16:  # the table entry itself
            return apply_rows(params, dst, None, fn_bits=lambda h: fm.gelu_table()[h])
        return apply_rows(params, dst, fm.gelu_via_table)
    if op == U.GELU_QUICK:
        if f16:
            return apply_rows(params, dst, None, fn_bits=lambda h: fm.gelu_quick_table()[h])
        return apply_rows(params, dst, fm.gelu_quick_via_table)
    if op == U.GELU_ERF:
        return apply_rows(params, dst, _gelu_erf_f32)
    if op == U.SILU:
        return apply_rows(params, dst, fm.silu_scalar if f16 else fm.silu_rows, into=fm.silu_rows)
    raise not_supported(dst, f"unknown unary op {op}")


@kernel(GGMLOp.SQR, GGMLOp.SQRT, GGMLOp.LOG, GGMLOp.SIN, GGMLOp.COS, n_tasks=one_thread,
        work=no_work, barrier=False)
def compute_forward_sqr(params, dst: Tensor) -> None:
    """ggml_compute_forward_sqr / _sqrt / _log / _sin / _cos: unary_op with x², √x, ..."""
    _unary_op(params, dst, OP_FNS[GGMLOp(dst.op)])


def f16_table_times(table: np.ndarray, x_bits: np.ndarray, g: np.ndarray) -> np.ndarray:
    """ggml_vec_geglu(_quick)_f16: fp16(float(table[x]) · float(g))."""
    return fp32_to_fp16_bits(fp16_bits_to_fp32(table[x_bits]) * g)
