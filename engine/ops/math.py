"""Arithmetic op constructors: element-wise ADD, SUB, MUL, DIV (and ADD_ID, add_cast), ADD1, ACC,
SET, SCALE, FILL; reductions and scans (SUM, SUM_ROWS, MEAN, ARGMAX, COUNT_EQUAL, CUMSUM); REPEAT,
CONCAT; the norms (NORM, RMS_NORM, GROUP_NORM, L2_NORM); DIAG and TRI; ARANGE, ARGSORT, TOP_K
and CROSS_ENTROPY_LOSS. Activations are in unary.py, matrix products in matmul.py.

Mirrors ggml.c's graph-building functions: result shape and type, op_params, src slots, automatic
names, and the GGML_ASSERTs with ggml's condition text. Each only records; the kernels compute.
Leaves out: the backward ops (silu_back, rms_norm_back, repeat_back, cross_entropy_loss_back:
backward.py).
"""

from __future__ import annotations

import struct

import numpy as np

from engine.core.api import op, query
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_can_repeat, ggml_can_repeat_rows, \
    ggml_dup_tensor, ggml_is_contiguous, ggml_is_empty, ggml_is_matrix, ggml_is_scalar, \
    ggml_nelements, ggml_new_tensor, ggml_new_tensor_1d, ggml_new_tensor_4d
from engine.core.types import GGMLType, TYPE_TRAITS, CFloat
from engine.ops.base import dup_or_view, ggml_set_op_params, ggml_set_op_params_f32, \
    ggml_set_op_params_i32, set_op_src, shape_of
from engine.ops.views import ggml_view_4d

GGML_SORT_ORDER_ASC = 0
GGML_SORT_ORDER_DESC = 1
# enum ggml_tri_type: which triangle (with or without the diagonal) ggml_tri keeps
GGML_TRI_TYPE_UPPER_DIAG, GGML_TRI_TYPE_UPPER, GGML_TRI_TYPE_LOWER_DIAG, GGML_TRI_TYPE_LOWER = 0, 1, 2, 3
INT32_MAX = 2**31 - 1


def _int32(v: int) -> int:
    """C's conversion of a size_t to int32_t: keep the low 32 bits, as a signed value."""
    return (int(v) + 2**31) % 2**32 - 2**31


@query
def ggml_is_padded_1d(t: Tensor) -> bool:
    """ggml_is_padded_1d: rows packed, and dims 2 and 3 packed after them (dim 1 may be padded)."""
    ne, nb = shape_of(t), [int(x) for x in t.nb]
    return (nb[0] == TYPE_TRAITS[t.type].type_size and nb[2] == nb[1] * ne[1]
            and nb[3] == nb[2] * ne[2])


# --- add, sub, mul, div ----------------------------------------------------------------------

def _binary(ctx: Context, a: Tensor, b: Tensor, op: GGMLOp, inplace: bool, fn: str) -> Tensor:
    """ggml_add_impl and friends: b is broadcast onto a (by modulo) at compute time."""
    ggml_assert(ggml_can_repeat(b, a), "ggml_can_repeat(b, a)", fn,
                f"b {shape_of(b)} does not tile a {shape_of(a)}")
    return set_op_src(dup_or_view(ctx, a, inplace), op, a, b)


@op
def ggml_add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add: a + b."""
    return _binary(ctx, a, b, GGMLOp.ADD, False, "ggml_add")


@op
def ggml_add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add_inplace: a += b (the result is a view of a)."""
    return _binary(ctx, a, b, GGMLOp.ADD, True, "ggml_add_inplace")


@op
def ggml_sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub: a - b."""
    return _binary(ctx, a, b, GGMLOp.SUB, False, "ggml_sub")


@op
def ggml_sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub_inplace."""
    return _binary(ctx, a, b, GGMLOp.SUB, True, "ggml_sub_inplace")


@op
def ggml_mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul: a * b, element-wise."""
    return _binary(ctx, a, b, GGMLOp.MUL, False, "ggml_mul")


@op
def ggml_mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_inplace."""
    return _binary(ctx, a, b, GGMLOp.MUL, True, "ggml_mul_inplace")


@op
def ggml_div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_div: a / b, element-wise."""
    return _binary(ctx, a, b, GGMLOp.DIV, False, "ggml_div")


@op
def ggml_div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_div_inplace."""
    return _binary(ctx, a, b, GGMLOp.DIV, True, "ggml_div_inplace")


@op
def ggml_add_id(ctx: Context, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_add_id: a [n, n_used, n_tokens] plus, for each (slot, token), the row of b that
    ids[slot, token] picks (mixture of experts: each chosen expert's bias)."""
    fn = "ggml_add_id"
    ggml_assert(int(a.ne[0]) == int(b.ne[0]), "a->ne[0] == b->ne[0]", fn)
    ggml_assert(int(a.ne[1]) == int(ids.ne[0]), "a->ne[1] == ids->ne[0]", fn)
    ggml_assert(int(a.ne[2]) == int(ids.ne[1]), "a->ne[2] == ids->ne[1]", fn)
    ggml_assert(ids.type == GGMLType.I32, "ids->type == GGML_TYPE_I32", fn)
    return set_op_src(ggml_dup_tensor(ctx, a), GGMLOp.ADD_ID, a, b, ids)


@op
def ggml_add_cast(ctx: Context, a: Tensor, b: Tensor, type_: int) -> Tensor:
    """ggml_add_cast: ADD whose result has another type (a quantized, F16 or BF16 a)."""
    fn = "ggml_add_cast_impl"
    ggml_assert(ggml_can_repeat_rows(b, a), "ggml_can_repeat_rows(b, a)", fn)
    ggml_assert(TYPE_TRAITS[a.type].is_quantized or a.type in (GGMLType.F16, GGMLType.BF16),
                "ggml_is_quantized(a->type) || a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16", fn)
    result = ggml_new_tensor(ctx, type_, GGML_MAX_DIMS, a.ne)
    return set_op_src(result, GGMLOp.ADD, a, b)


# --- add1, acc, set, scale, fill -------------------------------------------------------------

def _add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_is_scalar(b), "ggml_is_scalar(b)", fn, f"b has ne {shape_of(b)}")
    ggml_assert(ggml_is_padded_1d(a), "ggml_is_padded_1d(a)", fn, f"a has nb {list(a.nb)}")
    return set_op_src(dup_or_view(ctx, a, inplace), GGMLOp.ADD1, a, b)


@op
def ggml_add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add1: a + the scalar b."""
    return _add1(ctx, a, b, False, "ggml_add1")


@op
def ggml_add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add1_inplace."""
    return _add1(ctx, a, b, True, "ggml_add1_inplace")


def _acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
         inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_nelements(b) <= ggml_nelements(a), "ggml_nelements(b) <= ggml_nelements(a)",
                fn, f"{ggml_nelements(b)} > {ggml_nelements(a)}")
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", fn)
    ggml_assert(b.type == GGMLType.F32, "b->type == GGML_TYPE_F32", fn)
    result = dup_or_view(ctx, a, inplace)
    params = [_int32(v) for v in (nb1, nb2, nb3, offset, 1 if inplace else 0)]
    ggml_set_op_params(result, struct.pack("<5i", *params))
    return set_op_src(result, GGMLOp.ACC, a, b)


@op
def ggml_acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
             offset: int) -> Tensor:
    """ggml_acc: a copy of a with b added into the view (nb1, nb2, nb3, offset) of it."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, False, "ggml_acc")


@op
def ggml_acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                     offset: int) -> Tensor:
    """ggml_acc_inplace."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, True, "ggml_acc_inplace")


def _set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
         inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_nelements(a) >= ggml_nelements(b), "ggml_nelements(a) >= ggml_nelements(b)",
                fn, f"{ggml_nelements(a)} < {ggml_nelements(b)}")
    result = dup_or_view(ctx, a, inplace)
    ggml_assert(offset < (1 << 30), "offset < (size_t)(1 << 30)", fn, f"offset {offset}")
    params = [_int32(v) for v in (nb1, nb2, nb3, offset, 1 if inplace else 0)]
    ggml_set_op_params(result, struct.pack("<5i", *params))
    return set_op_src(result, GGMLOp.SET, a, b)


@op
def ggml_set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
             offset: int) -> Tensor:
    """ggml_set: a copy of a with b written into the view (nb1, nb2, nb3, offset) of it."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, False, "ggml_set")


@op
def ggml_set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                     offset: int) -> Tensor:
    """ggml_set_inplace."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, True, "ggml_set_inplace")


@op
def ggml_set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """ggml_set_1d: ggml_set with a's own strides."""
    return _set(ctx, a, b, int(a.nb[1]), int(a.nb[2]), int(a.nb[3]), offset, False, "ggml_set_1d")


@op
def ggml_set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """ggml_set_1d_inplace."""
    return _set(ctx, a, b, int(a.nb[1]), int(a.nb[2]), int(a.nb[3]), offset, True,
                "ggml_set_1d_inplace")


@op
def ggml_set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """ggml_set_2d: ggml_set with row stride nb1 and a's strides above."""
    return _set(ctx, a, b, nb1, int(a.nb[2]), int(a.nb[3]), offset, False, "ggml_set_2d")


@op
def ggml_set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """ggml_set_2d_inplace."""
    return _set(ctx, a, b, nb1, int(a.nb[2]), int(a.nb[3]), offset, True, "ggml_set_2d_inplace")


def _scale(ctx: Context, a: Tensor, s: CFloat, b: CFloat, inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_is_padded_1d(a), "ggml_is_padded_1d(a)", fn, f"a has nb {list(a.nb)}")
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<2f", s, b))
    return set_op_src(result, GGMLOp.SCALE, a)


@op
def ggml_scale(ctx: Context, a: Tensor, s: CFloat) -> Tensor:
    """ggml_scale: s·a; op_params = {s, 0} (f32)."""
    return _scale(ctx, a, s, 0.0, False, "ggml_scale")


@op
def ggml_scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """ggml_scale_inplace."""
    return _scale(ctx, a, s, 0.0, True, "ggml_scale_inplace")


@op
def ggml_scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """ggml_scale_bias: s·a + b; op_params = {s, b} (f32)."""
    return _scale(ctx, a, s, b, False, "ggml_scale_bias")


@op
def ggml_scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """ggml_scale_bias_inplace."""
    return _scale(ctx, a, s, b, True, "ggml_scale_bias_inplace")


def _fill(ctx: Context, a: Tensor, c: float, inplace: bool) -> Tensor:
    fn = "ggml_fill_impl"
    ggml_assert(a.type in (GGMLType.F32, GGMLType.F16), "a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16",
                fn)
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params_f32(result, 0, c)
    return set_op_src(result, GGMLOp.FILL, a)


@op
def ggml_fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    """ggml_fill: a tensor like a with every element c; op_params[0] = c (f32)."""
    return _fill(ctx, a, c, False)


@op
def ggml_fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    """ggml_fill_inplace: the same, into a view of a."""
    return _fill(ctx, a, c, True)


# --- reductions ------------------------------------------------------------------------------

@op
def ggml_sum(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sum: every element summed into a 1-element tensor of a's type."""
    return set_op_src(ggml_new_tensor_1d(ctx, a.type, 1), GGMLOp.SUM, a)


@op
def ggml_sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sum_rows: [1, ne1, ne2, ne3] of a's type, each the sum of one row."""
    ne = [1] + shape_of(a)[1:]
    return set_op_src(ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, ne), GGMLOp.SUM_ROWS, a)


@op
def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    """ggml_mean: F32 [1, ne1, ne2, ne3], each the mean of one row."""
    ne = [1] + shape_of(a)[1:]
    return set_op_src(ggml_new_tensor(ctx, GGMLType.F32, 4, ne), GGMLOp.MEAN, a)


@op
def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    """ggml_argmax: I32 [ne1], the index of each row's maximum (a must be a matrix)."""
    ggml_assert(ggml_is_matrix(a), "ggml_is_matrix(a)", "ggml_argmax", f"a has ne {shape_of(a)}")
    ggml_assert(int(a.ne[0]) <= INT32_MAX, "a->ne[0] <= INT32_MAX", "ggml_argmax")
    return set_op_src(ggml_new_tensor_1d(ctx, GGMLType.I32, int(a.ne[1])), GGMLOp.ARGMAX, a)


@op
def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_count_equal: I64 [1], how many elements of a and b are equal."""
    ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", "ggml_count_equal",
                f"{shape_of(a)} vs {shape_of(b)}")
    return set_op_src(ggml_new_tensor_1d(ctx, GGMLType.I64, 1), GGMLOp.COUNT_EQUAL, a, b)


@op
def ggml_cumsum(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cumsum: each row's running sum along dim 0 (F32)."""
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", "ggml_cumsum")
    return set_op_src(ggml_dup_tensor(ctx, a), GGMLOp.CUMSUM, a)


# --- repeat, concat --------------------------------------------------------------------------

@op
def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_repeat: a tiled to b's shape (a's type)."""
    ggml_assert(ggml_can_repeat(a, b), "ggml_can_repeat(a, b)", "ggml_repeat",
                f"a {shape_of(a)} does not tile b {shape_of(b)}")
    result = ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, b.ne)
    return set_op_src(result, GGMLOp.REPEAT, a)


@op
def ggml_repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_repeat_4d: a tiled to [ne0, ne1, ne2, ne3]."""
    ne = (ne0, ne1, ne2, ne3)
    can_repeat = ggml_is_empty(a) or all(n % int(m) == 0 for n, m in zip(ne, a.ne))
    ggml_assert(can_repeat, "can_repeat", "ggml_repeat_4d", f"a {shape_of(a)} does not tile {ne}")
    return set_op_src(ggml_new_tensor_4d(ctx, a.type, *ne), GGMLOp.REPEAT, a)


@op
def ggml_concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """ggml_concat: a then b along dim; the other dims must agree. op_params[0] = dim."""
    ggml_assert(0 <= dim < GGML_MAX_DIMS, "dim >= 0 && dim < GGML_MAX_DIMS", "ggml_concat",
                f"dim {dim}")
    ggml_assert(a.type == b.type, "a->type == b->type", "ggml_concat")
    ne = []
    for d in range(GGML_MAX_DIMS):
        if d == dim:
            ne.append(int(a.ne[d]) + int(b.ne[d]))
            continue
        ggml_assert(int(a.ne[d]) == int(b.ne[d]), "a->ne[d] == b->ne[d]", "ggml_concat",
                    f"d = {d}: {int(a.ne[d])} vs {int(b.ne[d])}")
        ne.append(int(a.ne[d]))
    result = ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, ne)
    ggml_set_op_params_i32(result, 0, dim)
    return set_op_src(result, GGMLOp.CONCAT, a, b)


# --- norms -----------------------------------------------------------------------------------

def _eps_op(op: GGMLOp, ctx: Context, a: Tensor, eps: float, inplace: bool) -> Tensor:
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<f", eps))
    return set_op_src(result, op, a)


@op
def ggml_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_norm: (x - mean)/sqrt(var + eps) along dim 0; op_params[0] = eps (f32)."""
    return _eps_op(GGMLOp.NORM, ctx, a, eps, False)


@op
def ggml_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_norm_inplace."""
    return _eps_op(GGMLOp.NORM, ctx, a, eps, True)


@op
def ggml_rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm: x/sqrt(mean(x²) + eps) along dim 0; op_params[0] = eps (f32)."""
    return _eps_op(GGMLOp.RMS_NORM, ctx, a, eps, False)


@op
def ggml_rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm_inplace."""
    return _eps_op(GGMLOp.RMS_NORM, ctx, a, eps, True)


@op
def ggml_l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_l2_norm: x/max(‖x‖, eps) along dim 0; op_params[0] = eps (f32)."""
    return _eps_op(GGMLOp.L2_NORM, ctx, a, eps, False)


@op
def ggml_l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_l2_norm_inplace."""
    return _eps_op(GGMLOp.L2_NORM, ctx, a, eps, True)


def _group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool) -> Tensor:
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params_i32(result, 0, n_groups)
    ggml_set_op_params_f32(result, 1, eps)
    return set_op_src(result, GGMLOp.GROUP_NORM, a)


@op
def ggml_group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """ggml_group_norm: normalise over ne0·ne1·(channels of a group of dim 2);
    op_params = {n_groups, eps (f32)}."""
    return _group_norm(ctx, a, n_groups, eps, False)


@op
def ggml_group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """ggml_group_norm_inplace."""
    return _group_norm(ctx, a, n_groups, eps, True)


# --- diag, tri -------------------------------------------------------------------------------

@op
def ggml_diag(ctx: Context, a: Tensor) -> Tensor:
    """ggml_diag: a row vector [n, 1, ne2, ne3] made the diagonal of [n, n, ne2, ne3]."""
    ggml_assert(int(a.ne[1]) == 1, "a->ne[1] == 1", "ggml_diag", f"ne = {shape_of(a)}")
    ne = [int(a.ne[0]), int(a.ne[0]), int(a.ne[2]), int(a.ne[3])]
    return set_op_src(ggml_new_tensor(ctx, a.type, 4, ne), GGMLOp.DIAG, a)


@op
def ggml_tri(ctx: Context, a: Tensor, type_: int) -> Tensor:
    """ggml_tri: a square F32 matrix with one triangle kept (GGML_TRI_TYPE_*), the rest 0;
    op_params[0] = the triangle."""
    fn = "ggml_tri"
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", fn)
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    ggml_assert(int(a.ne[0]) == int(a.ne[1]), "a->ne[0] == a->ne[1]", fn, f"ne = {shape_of(a)}")
    result = ggml_dup_tensor(ctx, a)
    ggml_set_op_params_i32(result, 0, int(type_))
    return set_op_src(result, GGMLOp.TRI, a)


# --- arange, argsort, top_k ------------------------------------------------------------------

@op
def ggml_arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    """ggml_arange: F32 [ceilf((stop - start)/step)] holding start + step·i (no sources)."""
    ggml_assert(stop > start, "stop > start", "ggml_arange", f"start {start}, stop {stop}")
    f = np.float32
    steps = int(np.ceil((f(stop) - f(start)) / f(step)))
    result = ggml_new_tensor_1d(ctx, GGMLType.F32, steps)
    ggml_set_op_params_f32(result, 0, start)
    ggml_set_op_params_f32(result, 1, stop)
    ggml_set_op_params_f32(result, 2, step)
    result.op = GGMLOp.ARANGE
    return result


@op
def ggml_argsort(ctx: Context, a: Tensor, order: int) -> Tensor:
    """ggml_argsort: I32 with a's shape, each row the indices that sort it; op_params[0] = order
    (GGML_SORT_ORDER_ASC 0, GGML_SORT_ORDER_DESC 1)."""
    ggml_assert(int(a.ne[0]) <= INT32_MAX, "a->ne[0] <= INT32_MAX", "ggml_argsort")
    result = ggml_new_tensor(ctx, GGMLType.I32, GGML_MAX_DIMS, a.ne)
    ggml_set_op_params_i32(result, 0, int(order))
    return set_op_src(result, GGMLOp.ARGSORT, a)


@op
def ggml_argsort_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """ggml_argsort_top_k: the first k columns (a view) of a descending argsort."""
    ggml_assert(int(a.ne[0]) >= k, "a->ne[0] >= k", "ggml_argsort_top_k", f"k = {k}")
    result = ggml_argsort(ctx, a, GGML_SORT_ORDER_DESC)
    return ggml_view_4d(ctx, result, k, int(result.ne[1]), int(result.ne[2]), int(result.ne[3]),
                        int(result.nb[1]), int(result.nb[2]), int(result.nb[3]), 0)


@op
def ggml_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """ggml_top_k: I32 [k, ne1, ne2, ne3], the indices of each row's k largest (unordered)."""
    ggml_assert(int(a.ne[0]) >= k, "a->ne[0] >= k", "ggml_top_k", f"k = {k} > ne0 = {int(a.ne[0])}")
    result = ggml_new_tensor_4d(ctx, GGMLType.I32, k, int(a.ne[1]), int(a.ne[2]), int(a.ne[3]))
    return set_op_src(result, GGMLOp.TOP_K, a)


# --- loss ------------------------------------------------------------------------------------

@op
def ggml_cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cross_entropy_loss: [1] of a's type, -mean over rows of Σ b·log_softmax(a)."""
    ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", "ggml_cross_entropy_loss",
                f"{shape_of(a)} vs {shape_of(b)}")
    return set_op_src(ggml_new_tensor_1d(ctx, a.type, 1), GGMLOp.CROSS_ENTROPY_LOSS, a, b)
