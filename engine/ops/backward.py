"""Op constructors of the backward pass and the optimizer steps; each only records.

Mirrors the graph-building functions of ggml.c for REPEAT_BACK, SILU_BACK, RMS_NORM_BACK,
GET_ROWS_BACK, SOFT_MAX_BACK, IM2COL_BACK, POOL_2D_BACK, CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW
and OPT_STEP_SGD: result shape and type, op_params, src slots and the GGML_ASSERTs with ggml's
condition text (ROPE_BACK is with the other RoPE constructors, in rope.py). `engine.autodiff`
builds them into a graph; the kernels are in engine/compute/kernels/backward.py.
FLASH_ATTN_BACK's constructor aborts, as ggml 0.15.3's does before it builds anything.
"""

from __future__ import annotations

import struct

from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import GGMLAbortError, ggml_assert
from engine.core.layout import GGML_MAX_DIMS
from engine.core.optable import GGMLOp
from engine.core.tensor import GGML_TENSOR_FLAG_PARAM, Tensor, ggml_are_same_shape, ggml_can_repeat, \
    ggml_dup_tensor, ggml_is_matrix, ggml_is_scalar, ggml_is_vector, ggml_nelements, \
    ggml_new_tensor, ggml_new_tensor_2d, ggml_view_tensor
from engine.core.types import GGMLType
from engine.ops.base import dup_or_view, ggml_set_op_params, set_op_src, shape_of


@op
def ggml_repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_repeat_back: sum a's repetitions back into b's shape (the gradient of REPEAT)."""
    ggml_assert(ggml_can_repeat(b, a), "ggml_can_repeat(b, a)", "ggml_repeat_back",
                f"b {shape_of(b)} does not tile a {shape_of(a)}")
    return set_op_src(ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, shape_of(b)), GGMLOp.REPEAT_BACK, a)


@op
def ggml_silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_silu_back: a = the gradient of silu's output, b = silu's input."""
    return set_op_src(ggml_dup_tensor(ctx, a), GGMLOp.SILU_BACK, a, b)


@op
def ggml_rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm_back: a = the gradient of rms_norm's output, b = its input; op_params eps."""
    result = ggml_dup_tensor(ctx, a)
    ggml_set_op_params(result, struct.pack("<f", eps))
    return set_op_src(result, GGMLOp.RMS_NORM_BACK, a, b)


@op
def ggml_get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_get_rows_back: add the rows of a into an F32 tensor shaped like c, at rows b."""
    fn = "ggml_get_rows_back"
    ggml_assert(ggml_is_matrix(a) and ggml_is_vector(b) and b.type == GGMLType.I32,
                "ggml_is_matrix(a) && ggml_is_vector(b) && b->type == GGML_TYPE_I32", fn)
    ggml_assert(ggml_is_matrix(c) and int(a.ne[0]) == int(c.ne[0]),
                "ggml_is_matrix(c) && (a->ne[0] == c->ne[0])", fn)
    result = ggml_new_tensor_2d(ctx, GGMLType.F32, int(c.ne[0]), int(c.ne[1]))
    return set_op_src(result, GGMLOp.GET_ROWS_BACK, a, b)


def _soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float,
                       inplace: bool) -> Tensor:
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<2f", scale, max_bias))
    return set_op_src(result, GGMLOp.SOFT_MAX_BACK, a, b)


@op
def ggml_soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float,
                           max_bias: float) -> Tensor:
    """ggml_soft_max_ext_back: a = the gradient of soft_max's output, b = that output."""
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, False)


@op
def ggml_soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float,
                                   max_bias: float) -> Tensor:
    """ggml_soft_max_ext_back_inplace: into a view of a."""
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, True)


@op
def ggml_im2col_back(ctx: Context, a: Tensor, b: Tensor, ne: list[int], s0: int, s1: int,
                     p0: int, p1: int, d0: int, d1: int, is_2D: bool) -> Tensor:  # noqa: N803
    """ggml_im2col_back: the gradient of im2col (a) folded back into an F32 image of shape ne;
    b is im2col's kernel (only its shape is used)."""
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [int(x) for x in ne])
    ggml_set_op_params(result, struct.pack("<7i", s0, s1, p0, p1, d0, d1, 1 if is_2D else 0))
    return set_op_src(result, GGMLOp.IM2COL_BACK, a, b)


@op
def ggml_pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: int, k0: int, k1: int, s0: int,
                      s1: int, p0: float, p1: float) -> Tensor:
    """ggml_pool_2d_back: the gradient of pool_2d (a) spread over the input af's shape; the
    paddings are stored as int32, as ggml stores them."""
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, shape_of(af))
    ggml_set_op_params(result, struct.pack("<7i", op, k0, k1, s0, s1, int(p0), int(p1)))
    return set_op_src(result, GGMLOp.POOL_2D_BACK, a, af)


@op
def ggml_cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_cross_entropy_loss_back: a = the loss's gradient (a scalar), b = the logits,
    c = the labels; the result is the gradient of the logits."""
    fn = "ggml_cross_entropy_loss_back"
    ggml_assert(ggml_is_scalar(a), "ggml_is_scalar(a)", fn)
    ggml_assert(ggml_are_same_shape(b, c), "ggml_are_same_shape(b, c)", fn)
    return set_op_src(ggml_dup_tensor(ctx, b), GGMLOp.CROSS_ENTROPY_LOSS_BACK, a, b, c)


@op
def ggml_opt_step_adamw(ctx: Context, a: Tensor, grad: Tensor, m: Tensor, v: Tensor,
                        adamw_params: Tensor) -> Tensor:
    """ggml_opt_step_adamw: update the parameter a in place from its gradient and the moments
    m and v; adamw_params = [alpha, beta1, beta2, eps, wd, beta1h, beta2h] (F32)."""
    fn = "ggml_opt_step_adamw"
    ggml_assert(bool(a.flags & GGML_TENSOR_FLAG_PARAM), "a->flags & GGML_TENSOR_FLAG_PARAM", fn)
    ggml_assert(ggml_are_same_shape(a, grad), "ggml_are_same_shape(a, grad)", fn)
    ggml_assert(ggml_are_same_shape(a, m), "ggml_are_same_shape(a, m)", fn)
    ggml_assert(ggml_are_same_shape(a, v), "ggml_are_same_shape(a, v)", fn)
    ggml_assert(adamw_params.type == GGMLType.F32, "adamw_params->type == GGML_TYPE_F32", fn)
    ggml_assert(ggml_nelements(adamw_params) == 7, "ggml_nelements(adamw_params) == 7", fn)
    return set_op_src(ggml_view_tensor(ctx, a), GGMLOp.OPT_STEP_ADAMW, a, grad, m, v, adamw_params)


@op
def ggml_opt_step_sgd(ctx: Context, a: Tensor, grad: Tensor, params: Tensor) -> Tensor:
    """ggml_opt_step_sgd: a = a·(1 - alpha·wd) - alpha·grad in place; params = [alpha, wd]."""
    fn = "ggml_opt_step_sgd"
    ggml_assert(bool(a.flags & GGML_TENSOR_FLAG_PARAM), "a->flags & GGML_TENSOR_FLAG_PARAM", fn)
    ggml_assert(ggml_are_same_shape(a, grad), "ggml_are_same_shape(a, grad)", fn)
    ggml_assert(params.type == GGMLType.F32, "params->type == GGML_TYPE_F32", fn)
    ggml_assert(ggml_nelements(params) == 2, "ggml_nelements(params) == 2", fn)
    return set_op_src(ggml_view_tensor(ctx, a), GGMLOp.OPT_STEP_SGD, a, grad, params)


@op
def ggml_flash_attn_back(ctx: Context, q: Tensor, k: Tensor, v: Tensor, d: Tensor, masked: bool) -> Tensor:
    """ggml_flash_attn_back: in ggml 0.15.3 its first statement is GGML_ABORT, left there when
    flash attention became ggml_flash_attn_ext; no graph can hold a FLASH_ATTN_BACK node (and
    autodiff has no rule for FLASH_ATTN_EXT)."""
    raise GGMLAbortError("TODO: adapt to ggml_flash_attn_ext() changes", "ggml_flash_attn_back")
