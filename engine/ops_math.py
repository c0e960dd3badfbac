"""Op constructors for arithmetic, reductions, norms and activations; each only records.

Mirrors the graph-building functions of ggml.c for ADD1, ACC, SQR..COS, SUM, SUM_ROWS, MEAN,
ARGMAX, COUNT_EQUAL, REPEAT, CONCAT, NORM, RMS_NORM, GROUP_NORM, L2_NORM, OUT_PROD, SCALE, SET,
CLAMP, LEAKY_RELU, UNARY (and its named wrappers), GLU (and its named wrappers), ARANGE, ARGSORT,
TOP_K and CROSS_ENTROPY_LOSS: result shape and type, op_params, src slots, automatic names, and
the GGML_ASSERTs with ggml's condition text. Computing is the kernels' business.

Leaves out: the backward ops (silu_back, rms_norm_back, repeat_back, cross_entropy_loss_back).
"""

from __future__ import annotations

import struct

import numpy as np

from engine import libm
from engine.context import Context
from engine.errors import ggml_assert
from engine.layout import GGML_MAX_DIMS
from engine.ops import _record, ggml_set_op_params, ggml_set_op_params_f32, \
    ggml_set_op_params_i32, ggml_view_4d
from engine.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp
from engine.tensor import Tensor, ggml_are_same_shape, ggml_can_repeat, ggml_dup_tensor, \
    ggml_is_contiguous, ggml_is_contiguous_1, ggml_is_contiguous_rows, ggml_is_empty, \
    ggml_is_matrix, ggml_is_scalar, ggml_is_transposed, ggml_nelements, ggml_new_tensor, \
    ggml_new_tensor_1d, ggml_new_tensor_4d, ggml_new_tensor_impl, ggml_view_tensor
from engine.types import GGMLType, TYPE_TRAITS

GGML_SORT_ORDER_ASC = 0
GGML_SORT_ORDER_DESC = 1
INT32_MAX = 2**31 - 1


def _shape(t: Tensor) -> list[int]:
    return [int(x) for x in t.ne]


def _int32(v: int) -> int:
    """C's conversion of a size_t to int32_t: keep the low 32 bits, as a signed value."""
    return (int(v) + 2**31) % 2**32 - 2**31


def _dup_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    return ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)


def ggml_is_padded_1d(t: Tensor) -> bool:
    """ggml_is_padded_1d: rows packed, and dims 2 and 3 packed after them (dim 1 may be padded)."""
    ne, nb = _shape(t), [int(x) for x in t.nb]
    return (nb[0] == TYPE_TRAITS[t.type].type_size and nb[2] == nb[1] * ne[1]
            and nb[3] == nb[2] * ne[2])


# --- add1, acc, set --------------------------------------------------------------------------

def _add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool, fn: str) -> Tensor:
    ggml_assert(ggml_is_scalar(b), "ggml_is_scalar(b)", fn, f"b has ne {_shape(b)}")
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


# --- element-wise ops with their own op (not UNARY) ------------------------------------------

def _simple(op: GGMLOp, inplace: bool):
    def build(ctx: Context, a: Tensor) -> Tensor:
        return _record(_dup_or_view(ctx, a, inplace), op, a)
    return build


for _op in (GGMLOp.SQR, GGMLOp.SQRT, GGMLOp.LOG, GGMLOp.SIN, GGMLOp.COS):
    for _inplace in (False, True):
        _fn = f"ggml_{_op.name.lower()}" + ("_inplace" if _inplace else "")
        _f = _simple(_op, _inplace)
        _f.__name__ = _f.__qualname__ = _fn
        _f.__doc__ = f"{_fn}: GGML_OP_{_op.name}" + (" into a view of a." if _inplace else ".")
        globals()[_fn] = _f


def ggml_leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool) -> Tensor:
    """ggml_leaky_relu: max(x, 0) + slope·min(x, 0); op_params[0] = slope (f32)."""
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, struct.pack("<f", negative_slope))
    return _record(result, GGMLOp.LEAKY_RELU, a)


def ggml_clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002
    """ggml_clamp: always in place (a view of a); op_params = {min, max} (f32)."""
    result = ggml_view_tensor(ctx, a)
    ggml_set_op_params(result, struct.pack("<2f", min, max))
    return _record(result, GGMLOp.CLAMP, a)


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
    ne = [1] + _shape(a)[1:]
    return _record(ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, ne), GGMLOp.SUM_ROWS, a)


def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    """ggml_mean: F32 [1, ne1, ne2, ne3], each the mean of one row."""
    ne = [1] + _shape(a)[1:]
    return _record(ggml_new_tensor(ctx, GGMLType.F32, 4, ne), GGMLOp.MEAN, a)


def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    """ggml_argmax: I32 [ne1], the index of each row's maximum (a must be a matrix)."""
    ggml_assert(ggml_is_matrix(a), "ggml_is_matrix(a)", "ggml_argmax", f"a has ne {_shape(a)}")
    ggml_assert(int(a.ne[0]) <= INT32_MAX, "a->ne[0] <= INT32_MAX", "ggml_argmax")
    return _record(ggml_new_tensor_1d(ctx, GGMLType.I32, int(a.ne[1])), GGMLOp.ARGMAX, a)


def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_count_equal: I64 [1], how many elements of a and b are equal."""
    ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", "ggml_count_equal",
                f"{_shape(a)} vs {_shape(b)}")
    return _record(ggml_new_tensor_1d(ctx, GGMLType.I64, 1), GGMLOp.COUNT_EQUAL, a, b)


# --- repeat, concat --------------------------------------------------------------------------

def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_repeat: a tiled to b's shape (a's type)."""
    ggml_assert(ggml_can_repeat(a, b), "ggml_can_repeat(a, b)", "ggml_repeat",
                f"a {_shape(a)} does not tile b {_shape(b)}")
    result = ggml_new_tensor(ctx, a.type, GGML_MAX_DIMS, b.ne)
    return _record(result, GGMLOp.REPEAT, a)


def ggml_repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_repeat_4d: a tiled to [ne0, ne1, ne2, ne3]."""
    ne = (ne0, ne1, ne2, ne3)
    can_repeat = ggml_is_empty(a) or all(n % int(m) == 0 for n, m in zip(ne, a.ne))
    ggml_assert(can_repeat, "can_repeat", "ggml_repeat_4d", f"a {_shape(a)} does not tile {ne}")
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

def ggml_can_out_prod(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_out_prod: same ne1; t1's dims 2 and 3 whole multiples of t0's."""
    return (int(t0.ne[1]) == int(t1.ne[1]) and int(t1.ne[2]) % int(t0.ne[2]) == 0
            and int(t1.ne[3]) % int(t0.ne[3]) == 0)


def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_out_prod: F32 [a.ne0, b.ne0, b.ne2, b.ne3] = Σ_k a[:, k] ⊗ b[:, k] (a broadcast)."""
    ggml_assert(ggml_can_out_prod(a, b), "ggml_can_out_prod(a, b)", "ggml_out_prod",
                f"a {_shape(a)}, b {_shape(b)}")
    ggml_assert(not ggml_is_transposed(a), "!ggml_is_transposed(a)", "ggml_out_prod")
    ne = [int(a.ne[0]), int(b.ne[0]), int(b.ne[2]), int(b.ne[3])]
    return _record(ggml_new_tensor(ctx, GGMLType.F32, 4, ne), GGMLOp.OUT_PROD, a, b)


# --- unary -----------------------------------------------------------------------------------

def _unary(ctx: Context, a: Tensor, op: int, inplace: bool, fn: str) -> Tensor:
    """ggml_unary_impl: dup(a) or view(a), op UNARY, op_params[0] = the unary op."""
    ggml_assert(ggml_is_contiguous_rows(a), "ggml_is_contiguous_rows(a)", fn,
                f"'{a.name}' has nb[0] = {int(a.nb[0])}")
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params_i32(result, 0, int(op))
    return _record(result, GGMLOp.UNARY, a)


def ggml_unary(ctx: Context, a: Tensor, op: int) -> Tensor:
    """ggml_unary: an element-wise GGML_UNARY_OP_* of a."""
    return _unary(ctx, a, op, False, "ggml_unary")


def ggml_unary_inplace(ctx: Context, a: Tensor, op: int) -> Tensor:
    """ggml_unary_inplace."""
    return _unary(ctx, a, op, True, "ggml_unary_inplace")


def _named_unary(fn: str, op: GGMLUnaryOp, inplace: bool):
    def build(ctx: Context, a: Tensor) -> Tensor:
        return _unary(ctx, a, op, inplace, "ggml_unary_inplace" if inplace else "ggml_unary")
    build.__name__ = build.__qualname__ = fn
    build.__doc__ = f"{fn}: ggml_unary{'_inplace' if inplace else ''}(a, GGML_UNARY_OP_{op.name})."
    return build


# the named wrappers ggml.h declares; hardswish and hardsigmoid have no _inplace form
_NAMED_UNARY = {"abs": "ABS", "sgn": "SGN", "neg": "NEG", "step": "STEP", "tanh": "TANH",
                "elu": "ELU", "relu": "RELU", "sigmoid": "SIGMOID", "gelu": "GELU",
                "gelu_erf": "GELU_ERF", "gelu_quick": "GELU_QUICK", "silu": "SILU",
                "hardswish": "HARDSWISH", "hardsigmoid": "HARDSIGMOID", "exp": "EXP",
                "expm1": "EXPM1", "softplus": "SOFTPLUS", "floor": "FLOOR", "ceil": "CEIL",
                "round": "ROUND", "trunc": "TRUNC"}
for _short, _op_name in _NAMED_UNARY.items():
    globals()[f"ggml_{_short}"] = _named_unary(f"ggml_{_short}", GGMLUnaryOp[_op_name], False)
    if _short not in ("hardswish", "hardsigmoid"):
        globals()[f"ggml_{_short}_inplace"] = _named_unary(f"ggml_{_short}_inplace",
                                                           GGMLUnaryOp[_op_name], True)


def ggml_compute_softplus_f32(x: float) -> float:
    """ggml_compute_softplus_f32: x above 20, else logf(1 + expf(x)), with the C library's
    float functions (the value is stored in op_params, so it must match to the bit)."""
    x = float(np.float32(x))
    if x > 20.0:
        return x
    return float(libm.scalar(libm.logf, np.float32(1) + libm.scalar(libm.expf, x)))


def ggml_xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float,
               eps: float) -> Tensor:
    """ggml_xielu: UNARY XIELU with op_params {op, beta + softplus(alpha_n), softplus(alpha_p),
    beta, eps}. Unlike ggml_unary it does not check a's rows."""
    result = ggml_dup_tensor(ctx, a)
    ggml_set_op_params_i32(result, 0, int(GGMLUnaryOp.XIELU))
    ggml_set_op_params_f32(result, 1, float(np.float32(beta)
                                            + np.float32(ggml_compute_softplus_f32(alpha_n))))
    ggml_set_op_params_f32(result, 2, ggml_compute_softplus_f32(alpha_p))
    ggml_set_op_params_f32(result, 3, beta)
    ggml_set_op_params_f32(result, 4, eps)
    return _record(result, GGMLOp.UNARY, a)


# --- glu -------------------------------------------------------------------------------------

def _glu(ctx: Context, a: Tensor, b: Tensor | None, op: int, swapped: bool) -> Tensor:
    """ggml_glu_impl: [ne0/2, ...] from one tensor's two halves, or a's shape with a split b."""
    fn = "ggml_glu_impl"
    ggml_assert(ggml_is_contiguous_1(a), "ggml_is_contiguous_1(a)", fn)
    if b is not None:
        ggml_assert(ggml_is_contiguous_1(b), "ggml_is_contiguous_1(b)", fn)
        ggml_assert(ggml_are_same_shape(a, b), "ggml_are_same_shape(a, b)", fn,
                    f"{_shape(a)} vs {_shape(b)}")
        ggml_assert(a.type == b.type, "a->type == b->type", fn)
    ne = _shape(a) if b is not None else [int(a.ne[0]) // 2] + _shape(a)[1:]
    result = ggml_new_tensor_impl(ctx, a.type, GGML_MAX_DIMS, ne, None, 0)
    ggml_set_op_params_i32(result, 0, int(op))
    ggml_set_op_params_i32(result, 1, int(bool(swapped)))
    return _record(result, GGMLOp.GLU, a, b)


def ggml_glu(ctx: Context, a: Tensor, op: int, swapped: bool) -> Tensor:
    """ggml_glu: op(first half of each row) · second half (halves exchanged when swapped)."""
    return _glu(ctx, a, None, op, swapped)


def ggml_glu_split(ctx: Context, a: Tensor, b: Tensor, op: int) -> Tensor:
    """ggml_glu_split: op(a) · b."""
    return _glu(ctx, a, b, op, False)


def _named_glu(name: str, op: GGMLGluOp):
    def fused(ctx: Context, a: Tensor) -> Tensor:
        return _glu(ctx, a, None, op, False)

    def swapped(ctx: Context, a: Tensor) -> Tensor:
        return _glu(ctx, a, None, op, True)

    def split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return _glu(ctx, a, b, op, False)

    for f, suffix, what in ((fused, "", "halves of a"), (swapped, "_swapped", "halves swapped"),
                            (split, "_split", "a and b")):
        f.__name__ = f.__qualname__ = f"ggml_{name}{suffix}"
        f.__doc__ = f"ggml_{name}{suffix}: GLU {op.name} of {what}."
        globals()[f.__name__] = f


for _name in ("reglu", "geglu", "swiglu", "geglu_erf", "geglu_quick"):
    _named_glu(_name, GGMLGluOp[_name.upper()])


def ggml_swiglu_oai(ctx: Context, a: Tensor, b: Tensor | None, alpha: float,
                    limit: float) -> Tensor:
    """ggml_swiglu_oai: GLU SWIGLU_OAI (gpt-oss); op_params[2] = alpha, [3] = limit (f32)."""
    result = _glu(ctx, a, b, GGMLGluOp.SWIGLU_OAI, False)
    ggml_set_op_params_f32(result, 2, alpha)
    ggml_set_op_params_f32(result, 3, limit)
    return result


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
                f"{_shape(a)} vs {_shape(b)}")
    return _record(ggml_new_tensor_1d(ctx, a.type, 1), GGMLOp.CROSS_ENTROPY_LOSS, a, b)
