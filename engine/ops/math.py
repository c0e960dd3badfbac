"""Op constructors for arithmetic, reductions and norms; each only records (activations:
engine/ops/unary.py).

Mirrors the graph-building functions of ggml.c for ADD1, ACC, SUM, SUM_ROWS, MEAN, ARGMAX,
COUNT_EQUAL, REPEAT, CONCAT, NORM, RMS_NORM, GROUP_NORM, L2_NORM, OUT_PROD, SCALE, SET, ARANGE,
ARGSORT, TOP_K and CROSS_ENTROPY_LOSS: result shape and type, op_params, src slots, automatic names, and
the GGML_ASSERTs with ggml's condition text. Computing is the kernels' business.

Leaves out: the backward ops (silu_back, rms_norm_back, repeat_back, cross_entropy_loss_back).
"""

from __future__ import annotations

import struct

import numpy as np

from engine.core.api import query
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS
from engine.ops.base import _dup_or_view, _ne, _record, ggml_set_op_params, ggml_set_op_params_f32, \
    ggml_set_op_params_i32, ggml_view_4d
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_can_repeat, ggml_is_contiguous, \
    ggml_is_empty, ggml_is_matrix, ggml_is_scalar, ggml_is_transposed, ggml_nelements, \
    ggml_new_tensor, ggml_new_tensor_1d, ggml_new_tensor_4d
from engine.core.types import GGMLType, TYPE_TRAITS

GGML_SORT_ORDER_ASC = 0
GGML_SORT_ORDER_DESC = 1
INT32_MAX = 2**31 - 1



def _int32(v: int) -> int:
    """C's conversion of a size_t to int32_t: keep the low 32 bits, as a signed value."""
    return (int(v) + 2**31) % 2**32 - 2**31



@query
def ggml_is_padded_1d(t: Tensor) -> bool:
    """ggml_is_padded_1d: rows packed, and dims 2 and 3 packed after them (dim 1 may be padded)."""
    ne, nb = _ne(t), [int(x) for x in t.nb]
    return (nb[0] == TYPE_TRAITS[t.type].type_size and nb[2] == nb[1] * ne[1]
            and nb[3] == nb[2] * ne[2])


# --- add1, acc, set --------------------------------------------------------------------------

def _add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_is_scalar(b), "ggml_is_scalar(b)", fn, f"b has ne {_ne(b)}")
    ggml_assert(ggml_is_padded_1d(a), "ggml_is_padded_1d(a)", fn, f"a has nb {list(a.nb)}")
    return _record(_dup_or_view(ctx, a, inplace), GGMLOp.ADD1, a, b)


def ggml_add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add1: a + the scalar b."""
    return _add1(ctx, a, b, False, "ggml_add1")


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
    result = _dup_or_view(ctx, a, inplace)
    params = [_int32(v) for v in (nb1, nb2, nb3, offset, 1 if inplace else 0)]
    ggml_set_op_params(result, struct.pack("<5i", *params))
    return _record(result, GGMLOp.ACC, a, b)


def ggml_acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
             offset: int) -> Tensor:
    """ggml_acc: a copy of a with b added into the view (nb1, nb2, nb3, offset) of it."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, False, "ggml_acc")


def ggml_acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                     offset: int) -> Tensor:
    """ggml_acc_inplace."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, True, "ggml_acc_inplace")


def _set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
         inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_nelements(a) >= ggml_nelements(b), "ggml_nelements(a) >= ggml_nelements(b)",
                fn, f"{ggml_nelements(a)} < {ggml_nelements(b)}")
    result = _dup_or_view(ctx, a, inplace)
    ggml_assert(offset < (1 << 30), "offset < (size_t)(1 << 30)", fn, f"offset {offset}")
    params = [_int32(v) for v in (nb1, nb2, nb3, offset, 1 if inplace else 0)]
    ggml_set_op_params(result, struct.pack("<5i", *params))
    return _record(result, GGMLOp.SET, a, b)


def ggml_set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
             offset: int) -> Tensor:
    """ggml_set: a copy of a with b written into the view (nb1, nb2, nb3, offset) of it."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, False, "ggml_set")


def ggml_set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                     offset: int) -> Tensor:
    """ggml_set_inplace."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, True, "ggml_set_inplace")


def ggml_set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """ggml_set_1d: ggml_set with a's own strides."""
    return _set(ctx, a, b, int(a.nb[1]), int(a.nb[2]), int(a.nb[3]), offset, False, "ggml_set_1d")


def ggml_set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """ggml_set_1d_inplace."""
    return _set(ctx, a, b, int(a.nb[1]), int(a.nb[2]), int(a.nb[3]), offset, True,
                "ggml_set_1d_inplace")


def ggml_set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """ggml_set_2d: ggml_set with row stride nb1 and a's strides above."""
    return _set(ctx, a, b, nb1, int(a.nb[2]), int(a.nb[3]), offset, False, "ggml_set_2d")


def ggml_set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """ggml_set_2d_inplace."""
    return _set(ctx, a, b, nb1, int(a.nb[2]), int(a.nb[3]), offset, True, "ggml_set_2d_inplace")


def _scale(ctx: Context, a: Tensor, s: float, b: float, inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_is_padded_1d(a), "ggml_is_padded_1d(a)", fn, f"a has nb {list(a.nb)}")
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<2f", s, b))
    return _record(result, GGMLOp.SCALE, a)


def ggml_scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """ggml_scale: s·a; op_params = {s, 0} (f32)."""
    return _scale(ctx, a, s, 0.0, False, "ggml_scale")


def ggml_scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """ggml_scale_inplace."""
    return _scale(ctx, a, s, 0.0, True, "ggml_scale_inplace")


def ggml_scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """ggml_scale_bias: s·a + b; op_params = {s, b} (f32)."""
    return _scale(ctx, a, s, b, False, "ggml_scale_bias")


def ggml_scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """ggml_scale_bias_inplace."""
    return _scale(ctx, a, s, b, True, "ggml_scale_bias_inplace")


# --- reductions ------------------------------------------------------------------------------

def ggml_sum(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sum: every element summed into a 1-element tensor of a's type."""
    return _record(ggml_new_tensor_1d(ctx, a.type, 1), GGMLOp.SUM, a)


def ggml_sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """ggml_sum_rows: [1, ne1, ne2, ne3] of a's type, each the sum of one row."""
    ne = [1] + _ne(a)[1:]
    return _record(ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, ne), GGMLOp.SUM_ROWS, a)


def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    """ggml_mean: F32 [1, ne1, ne2, ne3], each the mean of one row."""
    ne = [1] + _ne(a)[1:]
    return _record(ggml_new_tensor(ctx, GGMLType.F32, 4, ne), GGMLOp.MEAN, a)


def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    """ggml_argmax: I32 [ne1], the index of each row's maximum (a must be a matrix)."""
    ggml_assert(ggml_is_matrix(a), "ggml_is_matrix(a)", "ggml_argmax", f"a has ne {_ne(a)}")
    ggml_assert(int(a.ne[0]) <= INT32_MAX, "a->ne[0] <= INT32_MAX", "ggml_argmax")
    return _record(ggml_new_tensor_1d(ctx, GGMLType.I32, int(a.ne[1])), GGMLOp.ARGMAX, a)


def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_count_equal: I64 [1], how many elements of a and b are equal."""
    ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", "ggml_count_equal",
                f"{_ne(a)} vs {_ne(b)}")
    return _record(ggml_new_tensor_1d(ctx, GGMLType.I64, 1), GGMLOp.COUNT_EQUAL, a, b)


# --- repeat, concat --------------------------------------------------------------------------

def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_repeat: a tiled to b's shape (a's type)."""
    ggml_assert(ggml_can_repeat(a, b), "ggml_can_repeat(a, b)", "ggml_repeat",
                f"a {_ne(a)} does not tile b {_ne(b)}")
    result = ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, b.ne)
    return _record(result, GGMLOp.REPEAT, a)


def ggml_repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_repeat_4d: a tiled to [ne0, ne1, ne2, ne3]."""
    ne = (ne0, ne1, ne2, ne3)
    can_repeat = ggml_is_empty(a) or all(n % int(m) == 0 for n, m in zip(ne, a.ne))
    ggml_assert(can_repeat, "can_repeat", "ggml_repeat_4d", f"a {_ne(a)} does not tile {ne}")
    return _record(ggml_new_tensor_4d(ctx, a.type, *ne), GGMLOp.REPEAT, a)


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
    return _record(result, GGMLOp.CONCAT, a, b)


# --- norms -----------------------------------------------------------------------------------

def _eps_op(op: GGMLOp, ctx: Context, a: Tensor, eps: float, inplace: bool) -> Tensor:
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<f", eps))
    return _record(result, op, a)


def ggml_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_norm: (x - mean)/sqrt(var + eps) along dim 0; op_params[0] = eps (f32)."""
    return _eps_op(GGMLOp.NORM, ctx, a, eps, False)


def ggml_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_norm_inplace."""
    return _eps_op(GGMLOp.NORM, ctx, a, eps, True)


def ggml_rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm: x/sqrt(mean(x²) + eps) along dim 0; op_params[0] = eps (f32)."""
    return _eps_op(GGMLOp.RMS_NORM, ctx, a, eps, False)


def ggml_rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm_inplace."""
    return _eps_op(GGMLOp.RMS_NORM, ctx, a, eps, True)


def ggml_l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_l2_norm: x/max(‖x‖, eps) along dim 0; op_params[0] = eps (f32)."""
    return _eps_op(GGMLOp.L2_NORM, ctx, a, eps, False)


def ggml_l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """ggml_l2_norm_inplace."""
    return _eps_op(GGMLOp.L2_NORM, ctx, a, eps, True)


def _group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool) -> Tensor:
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params_i32(result, 0, n_groups)
    ggml_set_op_params_f32(result, 1, eps)
    return _record(result, GGMLOp.GROUP_NORM, a)


def ggml_group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """ggml_group_norm: normalise over ne0·ne1·(channels of a group of dim 2);
    op_params = {n_groups, eps (f32)}."""
    return _group_norm(ctx, a, n_groups, eps, False)


def ggml_group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """ggml_group_norm_inplace."""
    return _group_norm(ctx, a, n_groups, eps, True)


# --- out_prod --------------------------------------------------------------------------------

@query
def ggml_can_out_prod(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_out_prod: same ne1; t1's dims 2 and 3 whole multiples of t0's."""
    return (int(t0.ne[1]) == int(t1.ne[1]) and int(t1.ne[2]) % int(t0.ne[2]) == 0
            and int(t1.ne[3]) % int(t0.ne[3]) == 0)


def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_out_prod: F32 [a.ne0, b.ne0, b.ne2, b.ne3] = Σ_k a[:, k] ⊗ b[:, k] (a broadcast)."""
    ggml_assert(ggml_can_out_prod(a, b), "ggml_can_out_prod(a, b)", "ggml_out_prod",
                f"a {_ne(a)}, b {_ne(b)}")
    ggml_assert(not ggml_is_transposed(a), "!ggml_is_transposed(a)", "ggml_out_prod")
    ne = [int(a.ne[0]), int(b.ne[0]), int(b.ne[2]), int(b.ne[3])]
    return _record(ggml_new_tensor(ctx, GGMLType.F32, 4, ne), GGMLOp.OUT_PROD, a, b)


# --- arange, argsort, top_k ------------------------------------------------------------------

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


def ggml_argsort(ctx: Context, a: Tensor, order: int) -> Tensor:
    """ggml_argsort: I32 with a's shape, each row the indices that sort it; op_params[0] = order
    (GGML_SORT_ORDER_ASC 0, GGML_SORT_ORDER_DESC 1)."""
    ggml_assert(int(a.ne[0]) <= INT32_MAX, "a->ne[0] <= INT32_MAX", "ggml_argsort")
    result = ggml_new_tensor(ctx, GGMLType.I32, GGML_MAX_DIMS, a.ne)
    ggml_set_op_params_i32(result, 0, int(order))
    return _record(result, GGMLOp.ARGSORT, a)


def ggml_argsort_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """ggml_argsort_top_k: the first k columns (a view) of a descending argsort."""
    ggml_assert(int(a.ne[0]) >= k, "a->ne[0] >= k", "ggml_argsort_top_k", f"k = {k}")
    result = ggml_argsort(ctx, a, GGML_SORT_ORDER_DESC)
    return ggml_view_4d(ctx, result, k, int(result.ne[1]), int(result.ne[2]), int(result.ne[3]),
                        int(result.nb[1]), int(result.nb[2]), int(result.nb[3]), 0)


def ggml_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """ggml_top_k: I32 [k, ne1, ne2, ne3], the indices of each row's k largest (unordered)."""
    ggml_assert(int(a.ne[0]) >= k, "a->ne[0] >= k", "ggml_top_k", f"k = {k} > ne0 = {int(a.ne[0])}")
    result = ggml_new_tensor_4d(ctx, GGMLType.I32, k, int(a.ne[1]), int(a.ne[2]), int(a.ne[3]))
    return _record(result, GGMLOp.TOP_K, a)


# --- loss ------------------------------------------------------------------------------------

def ggml_cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cross_entropy_loss: [1] of a's type, -mean over rows of Σ b·log_softmax(a)."""
    ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", "ggml_cross_entropy_loss",
                f"{_ne(a)} vs {_ne(b)}")
    return _record(ggml_new_tensor_1d(ctx, a.type, 1), GGMLOp.CROSS_ENTROPY_LOSS, a, b)
