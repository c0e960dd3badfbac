"""Element-wise op constructors: SQR..COS, LEAKY_RELU, UNARY and GLU, with ggml.h's named wrappers.

Each named wrapper is written out, as ggml.c writes it, so `grep "def ggml_gelu"` finds it: the
wrapper records ggml_unary (or ggml_glu) with its op in op_params[0]. Like every op constructor
here, nothing is computed; the kernels do that.
"""

from __future__ import annotations

import struct

import numpy as np

from engine.compute.kernels.floatmath import ggml_compute_softplus_f32
from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS
from engine.core.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_dup_tensor, ggml_is_contiguous_1, \
    ggml_is_contiguous_rows, ggml_new_tensor_impl, ggml_view_tensor
from engine.ops.base import dup_or_view, ggml_set_op_params, ggml_set_op_params_f32, \
    ggml_set_op_params_i32, set_op_src, shape_of


# --- element-wise ops with their own op (not UNARY) ------------------------------------------

def _simple(ctx: Context, a: Tensor, op: GGMLOp, inplace: bool) -> Tensor:
    return set_op_src(dup_or_view(ctx, a, inplace), op, a)


@op
def ggml_sqr(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sqr: GGML_OP_SQR."""
    return _simple(ctx, a, GGMLOp.SQR, False)


@op
def ggml_sqr_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sqr_inplace: GGML_OP_SQR into a view of a."""
    return _simple(ctx, a, GGMLOp.SQR, True)


@op
def ggml_sqrt(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sqrt: GGML_OP_SQRT."""
    return _simple(ctx, a, GGMLOp.SQRT, False)


@op
def ggml_sqrt_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sqrt_inplace: GGML_OP_SQRT into a view of a."""
    return _simple(ctx, a, GGMLOp.SQRT, True)


@op
def ggml_log(ctx: Context, a: Tensor) -> Tensor:
    """ggml_log: GGML_OP_LOG."""
    return _simple(ctx, a, GGMLOp.LOG, False)


@op
def ggml_log_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_log_inplace: GGML_OP_LOG into a view of a."""
    return _simple(ctx, a, GGMLOp.LOG, True)


@op
def ggml_sin(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sin: GGML_OP_SIN."""
    return _simple(ctx, a, GGMLOp.SIN, False)


@op
def ggml_sin_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sin_inplace: GGML_OP_SIN into a view of a."""
    return _simple(ctx, a, GGMLOp.SIN, True)


@op
def ggml_cos(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cos: GGML_OP_COS."""
    return _simple(ctx, a, GGMLOp.COS, False)


@op
def ggml_cos_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cos_inplace: GGML_OP_COS into a view of a."""
    return _simple(ctx, a, GGMLOp.COS, True)


@op
def ggml_leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool) -> Tensor:
    """ggml_leaky_relu: max(x, 0) + slope·min(x, 0); op_params[0] = slope (f32)."""
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<f", negative_slope))
    return set_op_src(result, GGMLOp.LEAKY_RELU, a)


@op
def ggml_clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002
    """ggml_clamp: always in place (a view of a); op_params = {min, max} (f32)."""
    result = ggml_view_tensor(ctx, a)
    ggml_set_op_params(result, struct.pack("<2f", min, max))
    return set_op_src(result, GGMLOp.CLAMP, a)


# --- unary -----------------------------------------------------------------------------------

def _unary(ctx: Context, a: Tensor, op: int, inplace: bool, fn: str) -> Tensor:
    """ggml_unary_impl: dup(a) or view(a), op UNARY, op_params[0] = the unary op."""
    ggml_assert(ggml_is_contiguous_rows(a), "ggml_is_contiguous_rows(a)", fn,
                f"'{a.name}' has nb[0] = {int(a.nb[0])}")
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params_i32(result, 0, int(op))
    return set_op_src(result, GGMLOp.UNARY, a)


@op
def ggml_unary(ctx: Context, a: Tensor, op: int) -> Tensor:
    """ggml_unary: an element-wise GGML_UNARY_OP_* of a."""
    return _unary(ctx, a, op, False, "ggml_unary")


@op
def ggml_unary_inplace(ctx: Context, a: Tensor, op: int) -> Tensor:
    """ggml_unary_inplace."""
    return _unary(ctx, a, op, True, "ggml_unary_inplace")


# the named wrappers of ggml.h (hardswish and hardsigmoid have no _inplace form)


@op
def ggml_abs(ctx: Context, a: Tensor) -> Tensor:
    """ggml_abs: ggml_unary(a, GGML_UNARY_OP_ABS)."""
    return _unary(ctx, a, GGMLUnaryOp.ABS, False, "ggml_unary")


@op
def ggml_abs_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_abs_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_ABS)."""
    return _unary(ctx, a, GGMLUnaryOp.ABS, True, "ggml_unary_inplace")


@op
def ggml_sgn(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sgn: ggml_unary(a, GGML_UNARY_OP_SGN)."""
    return _unary(ctx, a, GGMLUnaryOp.SGN, False, "ggml_unary")


@op
def ggml_sgn_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sgn_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_SGN)."""
    return _unary(ctx, a, GGMLUnaryOp.SGN, True, "ggml_unary_inplace")


@op
def ggml_neg(ctx: Context, a: Tensor) -> Tensor:
    """ggml_neg: ggml_unary(a, GGML_UNARY_OP_NEG)."""
    return _unary(ctx, a, GGMLUnaryOp.NEG, False, "ggml_unary")


@op
def ggml_neg_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_neg_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_NEG)."""
    return _unary(ctx, a, GGMLUnaryOp.NEG, True, "ggml_unary_inplace")


@op
def ggml_step(ctx: Context, a: Tensor) -> Tensor:
    """ggml_step: ggml_unary(a, GGML_UNARY_OP_STEP)."""
    return _unary(ctx, a, GGMLUnaryOp.STEP, False, "ggml_unary")


@op
def ggml_step_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_step_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_STEP)."""
    return _unary(ctx, a, GGMLUnaryOp.STEP, True, "ggml_unary_inplace")


@op
def ggml_tanh(ctx: Context, a: Tensor) -> Tensor:
    """ggml_tanh: ggml_unary(a, GGML_UNARY_OP_TANH)."""
    return _unary(ctx, a, GGMLUnaryOp.TANH, False, "ggml_unary")


@op
def ggml_tanh_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_tanh_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_TANH)."""
    return _unary(ctx, a, GGMLUnaryOp.TANH, True, "ggml_unary_inplace")


@op
def ggml_elu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_elu: ggml_unary(a, GGML_UNARY_OP_ELU)."""
    return _unary(ctx, a, GGMLUnaryOp.ELU, False, "ggml_unary")


@op
def ggml_elu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_elu_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_ELU)."""
    return _unary(ctx, a, GGMLUnaryOp.ELU, True, "ggml_unary_inplace")


@op
def ggml_relu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_relu: ggml_unary(a, GGML_UNARY_OP_RELU)."""
    return _unary(ctx, a, GGMLUnaryOp.RELU, False, "ggml_unary")


@op
def ggml_relu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_relu_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_RELU)."""
    return _unary(ctx, a, GGMLUnaryOp.RELU, True, "ggml_unary_inplace")


@op
def ggml_sigmoid(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sigmoid: ggml_unary(a, GGML_UNARY_OP_SIGMOID)."""
    return _unary(ctx, a, GGMLUnaryOp.SIGMOID, False, "ggml_unary")


@op
def ggml_sigmoid_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sigmoid_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_SIGMOID)."""
    return _unary(ctx, a, GGMLUnaryOp.SIGMOID, True, "ggml_unary_inplace")


@op
def ggml_gelu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_gelu: ggml_unary(a, GGML_UNARY_OP_GELU)."""
    return _unary(ctx, a, GGMLUnaryOp.GELU, False, "ggml_unary")


@op
def ggml_gelu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_gelu_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_GELU)."""
    return _unary(ctx, a, GGMLUnaryOp.GELU, True, "ggml_unary_inplace")


@op
def ggml_gelu_erf(ctx: Context, a: Tensor) -> Tensor:
    """ggml_gelu_erf: ggml_unary(a, GGML_UNARY_OP_GELU_ERF)."""
    return _unary(ctx, a, GGMLUnaryOp.GELU_ERF, False, "ggml_unary")


@op
def ggml_gelu_erf_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_gelu_erf_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_GELU_ERF)."""
    return _unary(ctx, a, GGMLUnaryOp.GELU_ERF, True, "ggml_unary_inplace")


@op
def ggml_gelu_quick(ctx: Context, a: Tensor) -> Tensor:
    """ggml_gelu_quick: ggml_unary(a, GGML_UNARY_OP_GELU_QUICK)."""
    return _unary(ctx, a, GGMLUnaryOp.GELU_QUICK, False, "ggml_unary")


@op
def ggml_gelu_quick_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_gelu_quick_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_GELU_QUICK)."""
    return _unary(ctx, a, GGMLUnaryOp.GELU_QUICK, True, "ggml_unary_inplace")


@op
def ggml_silu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_silu: ggml_unary(a, GGML_UNARY_OP_SILU)."""
    return _unary(ctx, a, GGMLUnaryOp.SILU, False, "ggml_unary")


@op
def ggml_silu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_silu_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_SILU)."""
    return _unary(ctx, a, GGMLUnaryOp.SILU, True, "ggml_unary_inplace")


@op
def ggml_hardswish(ctx: Context, a: Tensor) -> Tensor:
    """ggml_hardswish: ggml_unary(a, GGML_UNARY_OP_HARDSWISH)."""
    return _unary(ctx, a, GGMLUnaryOp.HARDSWISH, False, "ggml_unary")


@op
def ggml_hardsigmoid(ctx: Context, a: Tensor) -> Tensor:
    """ggml_hardsigmoid: ggml_unary(a, GGML_UNARY_OP_HARDSIGMOID)."""
    return _unary(ctx, a, GGMLUnaryOp.HARDSIGMOID, False, "ggml_unary")


@op
def ggml_exp(ctx: Context, a: Tensor) -> Tensor:
    """ggml_exp: ggml_unary(a, GGML_UNARY_OP_EXP)."""
    return _unary(ctx, a, GGMLUnaryOp.EXP, False, "ggml_unary")


@op
def ggml_exp_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_exp_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_EXP)."""
    return _unary(ctx, a, GGMLUnaryOp.EXP, True, "ggml_unary_inplace")


@op
def ggml_expm1(ctx: Context, a: Tensor) -> Tensor:
    """ggml_expm1: ggml_unary(a, GGML_UNARY_OP_EXPM1)."""
    return _unary(ctx, a, GGMLUnaryOp.EXPM1, False, "ggml_unary")


@op
def ggml_expm1_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_expm1_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_EXPM1)."""
    return _unary(ctx, a, GGMLUnaryOp.EXPM1, True, "ggml_unary_inplace")


@op
def ggml_softplus(ctx: Context, a: Tensor) -> Tensor:
    """ggml_softplus: ggml_unary(a, GGML_UNARY_OP_SOFTPLUS)."""
    return _unary(ctx, a, GGMLUnaryOp.SOFTPLUS, False, "ggml_unary")


@op
def ggml_softplus_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_softplus_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_SOFTPLUS)."""
    return _unary(ctx, a, GGMLUnaryOp.SOFTPLUS, True, "ggml_unary_inplace")


@op
def ggml_floor(ctx: Context, a: Tensor) -> Tensor:
    """ggml_floor: ggml_unary(a, GGML_UNARY_OP_FLOOR)."""
    return _unary(ctx, a, GGMLUnaryOp.FLOOR, False, "ggml_unary")


@op
def ggml_floor_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_floor_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_FLOOR)."""
    return _unary(ctx, a, GGMLUnaryOp.FLOOR, True, "ggml_unary_inplace")


@op
def ggml_ceil(ctx: Context, a: Tensor) -> Tensor:
    """ggml_ceil: ggml_unary(a, GGML_UNARY_OP_CEIL)."""
    return _unary(ctx, a, GGMLUnaryOp.CEIL, False, "ggml_unary")


@op
def ggml_ceil_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_ceil_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_CEIL)."""
    return _unary(ctx, a, GGMLUnaryOp.CEIL, True, "ggml_unary_inplace")


@op
def ggml_round(ctx: Context, a: Tensor) -> Tensor:
    """ggml_round: ggml_unary(a, GGML_UNARY_OP_ROUND)."""
    return _unary(ctx, a, GGMLUnaryOp.ROUND, False, "ggml_unary")


@op
def ggml_round_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_round_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_ROUND)."""
    return _unary(ctx, a, GGMLUnaryOp.ROUND, True, "ggml_unary_inplace")


@op
def ggml_trunc(ctx: Context, a: Tensor) -> Tensor:
    """ggml_trunc: ggml_unary(a, GGML_UNARY_OP_TRUNC)."""
    return _unary(ctx, a, GGMLUnaryOp.TRUNC, False, "ggml_unary")


@op
def ggml_trunc_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_trunc_inplace: ggml_unary_inplace(a, GGML_UNARY_OP_TRUNC)."""
    return _unary(ctx, a, GGMLUnaryOp.TRUNC, True, "ggml_unary_inplace")


@op
def ggml_xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float,
               eps: float) -> Tensor:
    """ggml_xielu: UNARY XIELU with op_params {op, beta + softplus(alpha_n), softplus(alpha_p),
    beta, eps}. Unlike ggml_unary it does not check a's rows."""
    result = ggml_dup_tensor(ctx, a)
    ggml_set_op_params_i32(result, 0, int(GGMLUnaryOp.XIELU))
    ggml_set_op_params_f32(result, 1, float(np.float32(beta) + ggml_compute_softplus_f32(alpha_n)))
    ggml_set_op_params_f32(result, 2, float(ggml_compute_softplus_f32(alpha_p)))
    ggml_set_op_params_f32(result, 3, beta)
    ggml_set_op_params_f32(result, 4, eps)
    return set_op_src(result, GGMLOp.UNARY, a)


# --- glu -------------------------------------------------------------------------------------

def _glu(ctx: Context, a: Tensor, b: Tensor | None, op: int, swapped: bool) -> Tensor:
    """ggml_glu_impl: [ne0/2, ...] from one tensor's two halves, or a's shape with a split b."""
    fn = "ggml_glu_impl"
    ggml_assert(ggml_is_contiguous_1(a), "ggml_is_contiguous_1(a)", fn)
    if b is not None:
        ggml_assert(ggml_is_contiguous_1(b), "ggml_is_contiguous_1(b)", fn)
        ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", fn,
                    f"{shape_of(a)} vs {shape_of(b)}")
        ggml_assert(a.type == b.type, "a->type == b->type", fn)
    ne = shape_of(a) if b is not None else [int(a.ne[0]) // 2] + shape_of(a)[1:]
    result = ggml_new_tensor_impl(ctx, a.type, GGML_MAX_DIMS, ne, None, 0)
    ggml_set_op_params_i32(result, 0, int(op))
    ggml_set_op_params_i32(result, 1, int(bool(swapped)))
    return set_op_src(result, GGMLOp.GLU, a, b)


@op
def ggml_glu(ctx: Context, a: Tensor, op: int, swapped: bool) -> Tensor:
    """ggml_glu: op(first half of each row) · second half (halves exchanged when swapped)."""
    return _glu(ctx, a, None, op, swapped)


@op
def ggml_glu_split(ctx: Context, a: Tensor, b: Tensor, op: int) -> Tensor:
    """ggml_glu_split: op(a) · b."""
    return _glu(ctx, a, b, op, False)


# the named wrappers: fused (halves of a), _swapped (halves exchanged), _split (a and b)


@op
def ggml_reglu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_reglu: GLU REGLU of the halves of a."""
    return _glu(ctx, a, None, GGMLGluOp.REGLU, False)


@op
def ggml_reglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_reglu_swapped: GLU REGLU of the halves of a, exchanged."""
    return _glu(ctx, a, None, GGMLGluOp.REGLU, True)


@op
def ggml_reglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_reglu_split: GLU REGLU of a and b."""
    return _glu(ctx, a, b, GGMLGluOp.REGLU, False)


@op
def ggml_geglu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu: GLU GEGLU of the halves of a."""
    return _glu(ctx, a, None, GGMLGluOp.GEGLU, False)


@op
def ggml_geglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu_swapped: GLU GEGLU of the halves of a, exchanged."""
    return _glu(ctx, a, None, GGMLGluOp.GEGLU, True)


@op
def ggml_geglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_geglu_split: GLU GEGLU of a and b."""
    return _glu(ctx, a, b, GGMLGluOp.GEGLU, False)


@op
def ggml_swiglu(ctx: Context, a: Tensor) -> Tensor:
    """ggml_swiglu: GLU SWIGLU of the halves of a."""
    return _glu(ctx, a, None, GGMLGluOp.SWIGLU, False)


@op
def ggml_swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_swiglu_swapped: GLU SWIGLU of the halves of a, exchanged."""
    return _glu(ctx, a, None, GGMLGluOp.SWIGLU, True)


@op
def ggml_swiglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_swiglu_split: GLU SWIGLU of a and b."""
    return _glu(ctx, a, b, GGMLGluOp.SWIGLU, False)


@op
def ggml_geglu_erf(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu_erf: GLU GEGLU_ERF of the halves of a."""
    return _glu(ctx, a, None, GGMLGluOp.GEGLU_ERF, False)


@op
def ggml_geglu_erf_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu_erf_swapped: GLU GEGLU_ERF of the halves of a, exchanged."""
    return _glu(ctx, a, None, GGMLGluOp.GEGLU_ERF, True)


@op
def ggml_geglu_erf_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_geglu_erf_split: GLU GEGLU_ERF of a and b."""
    return _glu(ctx, a, b, GGMLGluOp.GEGLU_ERF, False)


@op
def ggml_geglu_quick(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu_quick: GLU GEGLU_QUICK of the halves of a."""
    return _glu(ctx, a, None, GGMLGluOp.GEGLU_QUICK, False)


@op
def ggml_geglu_quick_swapped(ctx: Context, a: Tensor) -> Tensor:
    """ggml_geglu_quick_swapped: GLU GEGLU_QUICK of the halves of a, exchanged."""
    return _glu(ctx, a, None, GGMLGluOp.GEGLU_QUICK, True)


@op
def ggml_geglu_quick_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_geglu_quick_split: GLU GEGLU_QUICK of a and b."""
    return _glu(ctx, a, b, GGMLGluOp.GEGLU_QUICK, False)


@op
def ggml_swiglu_oai(ctx: Context, a: Tensor, b: Tensor | None, alpha: float,
                    limit: float) -> Tensor:
    """ggml_swiglu_oai: GLU SWIGLU_OAI (gpt-oss); op_params[2] = alpha, [3] = limit (f32)."""
    result = _glu(ctx, a, b, GGMLGluOp.SWIGLU_OAI, False)
    ggml_set_op_params_f32(result, 2, alpha)
    ggml_set_op_params_f32(result, 3, limit)
    return result

