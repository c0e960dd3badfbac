"""Op constructors: each records a result tensor's shape, `op`, `op_params` and `src`; none computes.

Mirrors the graph-building functions of ggml.c. This part holds the view and shape ops (view,
reshape, permute, transpose, cont, cpy, dup, cast), with ggml's automatic names and GGML_ASSERTs.
"""

from __future__ import annotations

import struct

import numpy as np

from engine.core.api import query
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS, GGML_MAX_OP_PARAMS
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_can_repeat, ggml_dup_tensor, ggml_format_name, \
    ggml_is_contiguous, ggml_is_transposed, ggml_nelements, ggml_new_tensor, ggml_new_tensor_4d, \
    ggml_new_tensor_impl, ggml_view_tensor
from engine.core.types import GGMLType

# --- op_params -------------------------------------------------------------------------------

def ggml_set_op_params(t: Tensor, params: bytes) -> None:
    """ggml_set_op_params: copy raw bytes into op_params (at most 64)."""
    ggml_assert(len(params) <= GGML_MAX_OP_PARAMS, "params_size <= GGML_MAX_OP_PARAMS",
                "ggml_set_op_params", f"{len(params)} bytes")
    t.op_params.view(np.uint8)[:len(params)] = np.frombuffer(params, dtype=np.uint8)


def ggml_set_op_params_i32(t: Tensor, i: int, value: int) -> None:
    """ggml_set_op_params_i32."""
    t.op_params[i] = value


@query
def ggml_get_op_params_i32(t: Tensor, i: int) -> int:
    """ggml_get_op_params_i32."""
    return int(t.op_params[i])


def ggml_set_op_params_f32(t: Tensor, i: int, value: float) -> None:
    """ggml_set_op_params_f32: a float stored in an int32 slot."""
    t.op_params.view(np.float32)[i] = value


@query
def ggml_get_op_params_f32(t: Tensor, i: int) -> float:
    """ggml_get_op_params_f32."""
    return float(t.op_params.view(np.float32)[i])


def _record(result: Tensor, op: GGMLOp, *srcs: Tensor | None) -> Tensor:
    result.op = op
    for i, s in enumerate(srcs):
        result.src[i] = s
    return result


def _ne(t: Tensor) -> list[int]:
    """t->ne as a list of ints (for shapes and messages)."""
    return [int(x) for x in t.ne]


def _dup_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    """The result of an op and its _inplace twin: a new tensor like a, or a view of a."""
    return ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)


# --- dup, cpy, cast, cont --------------------------------------------------------------------

def ggml_dup(ctx: Context, a: Tensor) -> Tensor:
    """ggml_dup: a new tensor that will hold a copy of a."""
    return _record(ggml_dup_tensor(ctx, a), GGMLOp.DUP, a)


def ggml_dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_dup_inplace: DUP into a view of a."""
    return _record(ggml_view_tensor(ctx, a), GGMLOp.DUP, a)


def ggml_cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cpy: copy a into b's memory. The result is a view of b, named after both."""
    ggml_assert(ggml_nelements(a) == ggml_nelements(b), "ggml_nelements(a) == ggml_nelements(b)",
                "ggml_cpy", f"{ggml_nelements(a)} vs {ggml_nelements(b)}")
    result = ggml_view_tensor(ctx, b)
    if b.name_bytes:
        ggml_format_name(result, "%s (copy of %s)", b.name_bytes, a.name_bytes)
    else:
        ggml_format_name(result, "%s (copy)", a.name_bytes)
    return _record(result, GGMLOp.CPY, a, b)


def ggml_cast(ctx: Context, a: Tensor, type_: int) -> Tensor:
    """ggml_cast: a new tensor of another type; op CPY whose src[1] is the result itself."""
    result = ggml_new_tensor(ctx, type_, GGML_MAX_DIMS, a.ne)
    ggml_format_name(result, "%s (copy)", a.name_bytes)
    return _record(result, GGMLOp.CPY, a, result)


def ggml_cont(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cont: a contiguous copy of a (of a's shape)."""
    result = ggml_dup_tensor(ctx, a)
    ggml_format_name(result, "%s (cont)", a.name_bytes)
    return _record(result, GGMLOp.CONT, a)


def ggml_cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_cont_4d: a contiguous copy of a with a new shape of the same element count."""
    ggml_assert(ggml_nelements(a) == ne0 * ne1 * ne2 * ne3, "ggml_nelements(a) == (ne0*ne1*ne2*ne3)",
                "ggml_cont_4d", f"{ggml_nelements(a)} vs {ne0 * ne1 * ne2 * ne3}")
    result = ggml_new_tensor_4d(ctx, a.type, ne0, ne1, ne2, ne3)
    ggml_format_name(result, "%s (cont)", a.name_bytes)
    return _record(result, GGMLOp.CONT, a)


def ggml_cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """ggml_cont_1d."""
    return ggml_cont_4d(ctx, a, ne0, 1, 1, 1)


def ggml_cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """ggml_cont_2d."""
    return ggml_cont_4d(ctx, a, ne0, ne1, 1, 1)


def ggml_cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """ggml_cont_3d."""
    return ggml_cont_4d(ctx, a, ne0, ne1, ne2, 1)


# --- reshape ---------------------------------------------------------------------------------

def _reshape(ctx: Context, a: Tensor, ne: list[int], fn: str, cond: str) -> Tensor:
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn, f"'{a.name}' is not contiguous")
    n = 1
    for x in ne:
        n *= int(x)
    ggml_assert(ggml_nelements(a) == n, cond, fn, f"a{f' ({a.name!r})' if a.name else ''} has "
                f"{ggml_nelements(a)} elements, {'×'.join(str(int(x)) for x in ne)} = {n}")
    result = ggml_new_tensor_impl(ctx, a.type, len(ne), ne, a, 0, fn)
    ggml_format_name(result, "%s (reshaped)", a.name_bytes)
    return _record(result, GGMLOp.RESHAPE, a)


def ggml_reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_reshape: a view of contiguous a with b's shape (b may be non-contiguous)."""
    return _reshape(ctx, a, [int(x) for x in b.ne], "ggml_reshape",
                    "ggml_nelements(a) == ggml_nelements(b)")


def ggml_reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """ggml_reshape_1d."""
    return _reshape(ctx, a, [ne0], "ggml_reshape_1d", "ggml_nelements(a) == ne0")


def ggml_reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """ggml_reshape_2d."""
    return _reshape(ctx, a, [ne0, ne1], "ggml_reshape_2d", "ggml_nelements(a) == ne0*ne1")


def ggml_reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """ggml_reshape_3d."""
    return _reshape(ctx, a, [ne0, ne1, ne2], "ggml_reshape_3d", "ggml_nelements(a) == ne0*ne1*ne2")


def ggml_reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_reshape_4d."""
    return _reshape(ctx, a, [ne0, ne1, ne2, ne3], "ggml_reshape_4d",
                    "ggml_nelements(a) == ne0*ne1*ne2*ne3")


# --- views -----------------------------------------------------------------------------------

def _view(ctx: Context, a: Tensor, ne: list[int], offset: int, fn: str) -> Tensor:
    """ggml_view_impl: a VIEW of a at byte offset; op_params[0..1] hold the size_t offset."""
    result = ggml_new_tensor_impl(ctx, a.type, len(ne), ne, a, offset, fn)
    ggml_format_name(result, "%s (view)", a.name_bytes)
    ggml_set_op_params(result, struct.pack("<Q", offset))
    return _record(result, GGMLOp.VIEW, a)


def ggml_view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    """ggml_view_1d."""
    return _view(ctx, a, [ne0], offset, "ggml_view_1d")


def ggml_view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """ggml_view_2d: rows of ne0 elements, nb1 bytes apart."""
    result = _view(ctx, a, [ne0, ne1], offset, "ggml_view_2d")
    result.nb[1:] = [nb1, nb1 * ne1, nb1 * ne1]
    return result


def ggml_view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
                 offset: int) -> Tensor:
    """ggml_view_3d."""
    result = _view(ctx, a, [ne0, ne1, ne2], offset, "ggml_view_3d")
    result.nb[1:] = [nb1, nb2, nb2 * ne2]
    return result


def ggml_view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int,
                 nb2: int, nb3: int, offset: int) -> Tensor:
    """ggml_view_4d."""
    result = _view(ctx, a, [ne0, ne1, ne2, ne3], offset, "ggml_view_4d")
    result.nb[1:] = [nb1, nb2, nb3]
    return result


def ggml_permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """ggml_permute: source dimension i moves to position axis_i (a view; no data moves)."""
    axes = (axis0, axis1, axis2, axis3)
    for i, ax in enumerate(axes):
        ggml_assert(0 <= ax < GGML_MAX_DIMS, f"axis{i} >= 0 && axis{i} < GGML_MAX_DIMS",
                    "ggml_permute", f"axis{i} = {ax}")
    for i in range(4):
        for j in range(i + 1, 4):
            ggml_assert(axes[i] != axes[j], f"axis{i} != axis{j}", "ggml_permute", f"axes {axes}")

    result = ggml_view_tensor(ctx, a)
    ggml_format_name(result, "%s (permuted)", a.name_bytes)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        # ggml stages ne and nb in plain ints: values beyond 32 bits would be truncated there
        ne[ax] = int(a.ne[i])
        nb[ax] = int(a.nb[i])
    result.ne[:] = ne
    result.nb[:] = nb
    _record(result, GGMLOp.PERMUTE, a)
    ggml_set_op_params(result, struct.pack("<4i", *axes))
    return result


def ggml_transpose(ctx: Context, a: Tensor) -> Tensor:
    """ggml_transpose: swap dimensions 0 and 1 (a view)."""
    result = ggml_view_tensor(ctx, a)
    ggml_format_name(result, "%s (transposed)", a.name_bytes)
    result.ne[0], result.ne[1] = int(a.ne[1]), int(a.ne[0])
    result.nb[0], result.nb[1] = int(a.nb[1]), int(a.nb[0])
    return _record(result, GGMLOp.TRANSPOSE, a)


# --- binary arithmetic and mul_mat -----------------------------------------------------------

def _binary(ctx: Context, a: Tensor, b: Tensor, op: GGMLOp, inplace: bool, fn: str) -> Tensor:
    """ggml_add_impl and friends: b is broadcast onto a (by modulo) at compute time."""
    ggml_assert(ggml_can_repeat(b, a), "ggml_can_repeat(b, a)", fn,
                f"b {[int(x) for x in b.ne]} does not tile a {[int(x) for x in a.ne]}")
    result = ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)
    return _record(result, op, a, b)


def ggml_add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add: a + b."""
    return _binary(ctx, a, b, GGMLOp.ADD, False, "ggml_add")


def ggml_add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_add_inplace: a += b (the result is a view of a)."""
    return _binary(ctx, a, b, GGMLOp.ADD, True, "ggml_add_inplace")


def ggml_sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub: a - b."""
    return _binary(ctx, a, b, GGMLOp.SUB, False, "ggml_sub")


def ggml_sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub_inplace."""
    return _binary(ctx, a, b, GGMLOp.SUB, True, "ggml_sub_inplace")


def ggml_mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul: a * b, element-wise."""
    return _binary(ctx, a, b, GGMLOp.MUL, False, "ggml_mul")


def ggml_mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_inplace."""
    return _binary(ctx, a, b, GGMLOp.MUL, True, "ggml_mul_inplace")


def ggml_div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_div: a / b, element-wise."""
    return _binary(ctx, a, b, GGMLOp.DIV, False, "ggml_div")


def ggml_div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_div_inplace."""
    return _binary(ctx, a, b, GGMLOp.DIV, True, "ggml_div_inplace")


@query
def ggml_can_mul_mat(a: Tensor, b: Tensor) -> bool:
    """ggml_can_mul_mat: same row length; b's matrices are a whole multiple of a's."""
    return (int(a.ne[0]) == int(b.ne[0]) and int(b.ne[2]) % int(a.ne[2]) == 0
            and int(b.ne[3]) % int(a.ne[3]) == 0)


def ggml_mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: F32 [a.ne1, b.ne1, b.ne2, b.ne3] = a · bᵀ for each matrix (a broadcast)."""
    ggml_assert(ggml_can_mul_mat(a, b), "ggml_can_mul_mat(a, b)", "ggml_mul_mat",
                f"a {[int(x) for x in a.ne]}, b {[int(x) for x in b.ne]}")
    ggml_assert(not ggml_is_transposed(a), "!ggml_is_transposed(a)", "ggml_mul_mat")
    ne = [int(a.ne[1]), int(b.ne[1]), int(b.ne[2]), int(b.ne[3])]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    return _record(result, GGMLOp.MUL_MAT, a, b)


def ggml_mul_mat_set_prec(a: Tensor, prec: int) -> None:
    """ggml_mul_mat_set_prec: op_params[0] = prec (GGML_PREC_DEFAULT 0 or GGML_PREC_F32 10)."""
    ggml_assert(a.op == GGMLOp.MUL_MAT, "a->op == GGML_OP_MUL_MAT", "ggml_mul_mat_set_prec")
    ggml_set_op_params_i32(a, 0, prec)


GGML_HINT_NONE, GGML_HINT_SRC0_IS_HADAMARD = 0, 1


def ggml_mul_mat_set_hint(a: Tensor, hint: int) -> None:
    """ggml_mul_mat_set_hint: op_params[1] of a MUL_MAT node says what src0 is (GGML_HINT_*)."""
    ggml_assert(a.op == GGMLOp.MUL_MAT, "a->op == GGML_OP_MUL_MAT", "ggml_mul_mat_set_hint")
    ggml_set_op_params_i32(a, 1, int(hint))


def ggml_mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: mixture of experts. as_ [cols, rows, n_expert] holds one matrix per
    expert, b [cols, n_b, n_tokens] the inputs, ids [n_expert_used, n_tokens] (I32) which experts
    each token uses; F32 [rows, n_expert_used, n_tokens] with
    result[:, e, t] = as_[:, :, ids[e, t]] · b[:, e % n_b, t]."""
    fn = "ggml_mul_mat_id"
    ggml_assert(not ggml_is_transposed(as_), "!ggml_is_transposed(as)", fn)
    ggml_assert(ids.type == GGMLType.I32, "ids->type == GGML_TYPE_I32", fn)
    ggml_assert(int(as_.ne[3]) == 1, "as->ne[3] == 1", fn, "as is 3-d: one matrix per expert")
    ggml_assert(int(b.ne[3]) == 1, "b->ne[3] == 1", fn, "b is 3-d")
    ggml_assert(int(ids.ne[2]) == 1 and int(ids.ne[3]) == 1, "ids->ne[2] == 1 && ids->ne[3] == 1", fn,
                "ids is 2-d")
    ggml_assert(int(ids.ne[1]) == int(b.ne[2]), "ids->ne[1] == b->ne[2]", fn,
                f"{int(ids.ne[1])} expert lists for {int(b.ne[2])} tokens")
    ggml_assert(int(as_.ne[0]) == int(b.ne[0]), "as->ne[0] == b->ne[0]", fn,
                f"rows of {int(as_.ne[0])} against rows of {int(b.ne[0])}")
    ggml_assert(int(ids.ne[0]) % int(b.ne[1]) == 0, "ids->ne[0] % b->ne[1] == 0", fn,
                f"{int(ids.ne[0])} experts per token cannot broadcast {int(b.ne[1])} inputs")
    ne = [int(as_.ne[1]), int(ids.ne[0]), int(b.ne[2]), 1]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    return _record(result, GGMLOp.MUL_MAT_ID, as_, b, ids)
