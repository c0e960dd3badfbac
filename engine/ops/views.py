"""View and shape op constructors: dup, cpy, cast, cont, reshape, view, permute and transpose,
as ggml.c builds them, with ggml's automatic names ("a (view)", "a (copy of b)") and GGML_ASSERTs.
Views share their source's memory (view_src, view_offs); dup, cpy, cast and cont are copies the
kernels (engine/compute/kernels/copy.py) make.
"""

from __future__ import annotations

import struct

from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS
from engine.core.optable import GGMLOp
from engine.core.tensor import SIZE_T, Tensor, ggml_dup_tensor, ggml_format_name, ggml_is_contiguous, \
    ggml_nelements, ggml_new_tensor, ggml_new_tensor_4d, ggml_new_tensor_impl, ggml_view_tensor
from engine.ops.base import ggml_set_op_params, set_op_src


# --- dup, cpy, cast, cont --------------------------------------------------------------------

@op
def ggml_dup(ctx: Context, a: Tensor) -> Tensor:
    """ggml_dup: a new tensor that will hold a copy of a."""
    return set_op_src(ggml_dup_tensor(ctx, a), GGMLOp.DUP, a)


@op
def ggml_dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_dup_inplace: DUP into a view of a."""
    return set_op_src(ggml_view_tensor(ctx, a), GGMLOp.DUP, a)


@op
def ggml_cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cpy: copy a into b's memory. The result is a view of b, named after both."""
    ggml_assert(ggml_nelements(a) == ggml_nelements(b), "ggml_nelements(a) == ggml_nelements(b)",
                "ggml_cpy", f"{ggml_nelements(a)} vs {ggml_nelements(b)}")
    result = ggml_view_tensor(ctx, b)
    if b.name_bytes:
        ggml_format_name(result, "%s (copy of %s)", b.name_bytes, a.name_bytes)
    else:
        ggml_format_name(result, "%s (copy)", a.name_bytes)
    return set_op_src(result, GGMLOp.CPY, a, b)


@op
def ggml_cast(ctx: Context, a: Tensor, type_: int) -> Tensor:
    """ggml_cast: a new tensor of another type; op CPY whose src[1] is the result itself."""
    result = ggml_new_tensor(ctx, type_, GGML_MAX_DIMS, a.ne)
    ggml_format_name(result, "%s (copy)", a.name_bytes)
    return set_op_src(result, GGMLOp.CPY, a, result)


@op
def ggml_cont(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cont: a contiguous copy of a (of a's shape)."""
    result = ggml_dup_tensor(ctx, a)
    ggml_format_name(result, "%s (cont)", a.name_bytes)
    return set_op_src(result, GGMLOp.CONT, a)


@op
def ggml_cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_cont_4d: a contiguous copy of a with a new shape of the same element count."""
    ggml_assert(ggml_nelements(a) == ne0 * ne1 * ne2 * ne3, "ggml_nelements(a) == (ne0*ne1*ne2*ne3)",
                "ggml_cont_4d", f"{ggml_nelements(a)} vs {ne0 * ne1 * ne2 * ne3}")
    result = ggml_new_tensor_4d(ctx, a.type, ne0, ne1, ne2, ne3)
    ggml_format_name(result, "%s (cont)", a.name_bytes)
    return set_op_src(result, GGMLOp.CONT, a)


@op
def ggml_cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """ggml_cont_1d."""
    return ggml_cont_4d(ctx, a, ne0, 1, 1, 1)


@op
def ggml_cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """ggml_cont_2d."""
    return ggml_cont_4d(ctx, a, ne0, ne1, 1, 1)


@op
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
    return set_op_src(result, GGMLOp.RESHAPE, a)


@op
def ggml_reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_reshape: a view of contiguous a with b's shape (b may be non-contiguous)."""
    return _reshape(ctx, a, [int(x) for x in b.ne], "ggml_reshape",
                    "ggml_nelements(a) == ggml_nelements(b)")


@op
def ggml_reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """ggml_reshape_1d."""
    return _reshape(ctx, a, [ne0], "ggml_reshape_1d", "ggml_nelements(a) == ne0")


@op
def ggml_reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """ggml_reshape_2d."""
    return _reshape(ctx, a, [ne0, ne1], "ggml_reshape_2d", "ggml_nelements(a) == ne0*ne1")


@op
def ggml_reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """ggml_reshape_3d."""
    return _reshape(ctx, a, [ne0, ne1, ne2], "ggml_reshape_3d", "ggml_nelements(a) == ne0*ne1*ne2")


@op
def ggml_reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_reshape_4d."""
    return _reshape(ctx, a, [ne0, ne1, ne2, ne3], "ggml_reshape_4d",
                    "ggml_nelements(a) == ne0*ne1*ne2*ne3")


# --- views -----------------------------------------------------------------------------------

def _view(ctx: Context, a: Tensor, ne: list[int], offset: int, fn: str) -> Tensor:
    """ggml_view_impl: a VIEW of a at byte offset; op_params[0..1] hold the size_t offset."""
    result = ggml_new_tensor_impl(ctx, a.type, len(ne), ne, a, offset, fn)
    ggml_format_name(result, "%s (view)", a.name_bytes)
    ggml_set_op_params(result, struct.pack("<Q", int(offset) % SIZE_T))
    return set_op_src(result, GGMLOp.VIEW, a)


@op
def ggml_view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    """ggml_view_1d."""
    return _view(ctx, a, [ne0], offset, "ggml_view_1d")


@op
def ggml_view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """ggml_view_2d: rows of ne0 elements, nb1 bytes apart."""
    result = _view(ctx, a, [ne0, ne1], offset, "ggml_view_2d")
    nb1, ne1 = int(nb1), int(ne1)
    result.nb[1:] = [x % SIZE_T for x in (nb1, nb1 * ne1, nb1 * ne1)]  # (size_t products)
    return result


@op
def ggml_view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
                 offset: int) -> Tensor:
    """ggml_view_3d."""
    result = _view(ctx, a, [ne0, ne1, ne2], offset, "ggml_view_3d")
    nb1, nb2, ne2 = int(nb1), int(nb2), int(ne2)
    result.nb[1:] = [x % SIZE_T for x in (nb1, nb2, nb2 * ne2)]
    return result


@op
def ggml_view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int,
                 nb2: int, nb3: int, offset: int) -> Tensor:
    """ggml_view_4d."""
    result = _view(ctx, a, [ne0, ne1, ne2, ne3], offset, "ggml_view_4d")
    result.nb[1:] = [int(x) % SIZE_T for x in (nb1, nb2, nb3)]
    return result


@op
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
        # ggml stages ne and nb in plain ints: only their low 32 bits, signed, come through
        ne[ax] = _c_int(int(a.ne[i]))
        nb[ax] = _c_int(int(a.nb[i])) % SIZE_T
    result.ne[:] = ne
    result.nb[:] = nb
    set_op_src(result, GGMLOp.PERMUTE, a)
    ggml_set_op_params(result, struct.pack("<4i", *axes))
    return result


def _c_int(x: int) -> int:
    """(int) x in C: the low 32 bits of x, read as a signed int."""
    return (x + (1 << 31)) % (1 << 32) - (1 << 31)


@op
def ggml_transpose(ctx: Context, a: Tensor) -> Tensor:
    """ggml_transpose: swap dimensions 0 and 1 (a view)."""
    result = ggml_view_tensor(ctx, a)
    ggml_format_name(result, "%s (transposed)", a.name_bytes)
    result.ne[0], result.ne[1] = int(a.ne[1]), int(a.ne[0])
    result.nb[0], result.nb[1] = int(a.nb[1]), int(a.nb[0])
    return set_op_src(result, GGMLOp.TRANSPOSE, a)

