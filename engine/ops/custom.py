"""User ops: ggml_map_custom1/2/3 (and _inplace), ggml_custom_4d and ggml_custom_inplace.

As in ggml.c, the result records {fun, n_tasks, userdata} in op_params (fun at bytes 0..7,
n_tasks at 8..11, userdata at 16..23: ggml_get_n_tasks reads n_tasks there) and the kernel calls
fun once per thread with its ith and nth. fun and userdata are Python objects here; op_params
holds a simulated pointer to each (the engine's address space for callables), as C holds the
function's and the data's addresses.

    def double(dst, a, ith, nth, userdata):       # each thread its rows, as a C callback would
        rows = range(ith, ggml_nrows(a), nth)
        ...
    y = ggml_map_custom1(ctx, x, double, GGML_N_TASKS_MAX, None)
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_SRC
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_new_tensor_4d, ggml_view_tensor
from engine.ops.base import dup_or_view, ggml_set_op_params, set_op_src

GGML_N_TASKS_MAX = -1

# the simulated addresses of the callables and user data that op_params point at
_FIRST_ADDRESS = 0x5F00_0000_0000
_objects: dict[int, Any] = {}
_addresses: dict[int, int] = {}  # id(obj) -> address


def _address(obj: Any) -> int:
    """The pointer op_params stores for a Python object (0 for None, like NULL)."""
    if obj is None:
        return 0
    key = id(obj)
    if key not in _addresses or _objects.get(_addresses[key]) is not obj:
        _addresses[key] = _FIRST_ADDRESS + 16 * len(_objects)
        _objects[_addresses[key]] = obj
    return _addresses[key]


def custom_params(t: Tensor) -> tuple[Callable, int, Any]:
    """(fun, n_tasks, userdata) of a custom node, from its op_params."""
    fun, n_tasks, _pad, userdata = struct.unpack_from("<QiiQ", t.op_params.tobytes())
    return _objects[fun], n_tasks, _objects.get(userdata)


def _params(fun: Callable, n_tasks: int, userdata: Any) -> bytes:
    return struct.pack("<QiiQ", _address(fun), int(n_tasks), 0, _address(userdata))


def _map_custom(ctx: Context, op: GGMLOp, srcs: tuple[Tensor, ...], fun: Callable, n_tasks: int,
                userdata: Any, inplace: bool, fn: str) -> Tensor:
    ggml_assert(n_tasks == GGML_N_TASKS_MAX or n_tasks > 0, "n_tasks == GGML_N_TASKS_MAX || n_tasks > 0",
                fn, f"n_tasks = {n_tasks}")
    ggml_assert(callable(fun), "fun", fn, "fun must be callable")
    result = dup_or_view(ctx, srcs[0], inplace)
    ggml_set_op_params(result, _params(fun, n_tasks, userdata))
    return set_op_src(result, op, *srcs)


@op
def ggml_map_custom1(ctx: Context, a: Tensor, fun: Callable, n_tasks: int, userdata: Any) -> Tensor:
    """ggml_map_custom1: a tensor like a, computed by fun(dst, a, ith, nth, userdata) per thread."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM1, (a,), fun, n_tasks, userdata, False, "ggml_map_custom1_impl")


@op
def ggml_map_custom1_inplace(ctx: Context, a: Tensor, fun: Callable, n_tasks: int, userdata: Any) -> Tensor:
    """ggml_map_custom1_inplace: the same, into a view of a."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM1, (a,), fun, n_tasks, userdata, True, "ggml_map_custom1_impl")


@op
def ggml_map_custom2(ctx: Context, a: Tensor, b: Tensor, fun: Callable, n_tasks: int, userdata: Any) -> Tensor:
    """ggml_map_custom2: a tensor like a, computed by fun(dst, a, b, ith, nth, userdata)."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM2, (a, b), fun, n_tasks, userdata, False, "ggml_map_custom2_impl")


@op
def ggml_map_custom2_inplace(ctx: Context, a: Tensor, b: Tensor, fun: Callable, n_tasks: int,
                             userdata: Any) -> Tensor:
    """ggml_map_custom2_inplace: the same, into a view of a."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM2, (a, b), fun, n_tasks, userdata, True, "ggml_map_custom2_impl")


@op
def ggml_map_custom3(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: Callable, n_tasks: int,
                     userdata: Any) -> Tensor:
    """ggml_map_custom3: a tensor like a, computed by fun(dst, a, b, c, ith, nth, userdata)."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM3, (a, b, c), fun, n_tasks, userdata, False,
                       "ggml_map_custom3_impl")


@op
def ggml_map_custom3_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: Callable, n_tasks: int,
                             userdata: Any) -> Tensor:
    """ggml_map_custom3_inplace: the same, into a view of a."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM3, (a, b, c), fun, n_tasks, userdata, True,
                       "ggml_map_custom3_impl")


@op
def ggml_custom_4d(ctx: Context, type_: int, ne0: int, ne1: int, ne2: int, ne3: int, args: list[Tensor],
                   n_args: int, fun: Callable, n_tasks: int, userdata: Any) -> Tensor:
    """ggml_custom_4d: a new tensor of this type and shape with args as its sources, computed by
    fun(dst, ith, nth, userdata) per thread."""
    ggml_assert(n_args < GGML_MAX_SRC, "n_args < GGML_MAX_SRC", "ggml_custom_4d", f"n_args = {n_args}")
    result = ggml_new_tensor_4d(ctx, type_, ne0, ne1, ne2, ne3)
    ggml_set_op_params(result, _params(fun, n_tasks, userdata))
    return set_op_src(result, GGMLOp.CUSTOM, *list(args)[:n_args])


@op
def ggml_custom_inplace(ctx: Context, a: Tensor, args: list[Tensor], n_args: int, fun: Callable, n_tasks: int,
                        userdata: Any) -> Tensor:
    """ggml_custom_inplace: a view of a (its src[0]) with args after it, computed by fun."""
    ggml_assert(n_args < GGML_MAX_SRC - 1, "n_args < GGML_MAX_SRC - 1", "ggml_custom_inplace",
                f"n_args = {n_args}")
    result = ggml_view_tensor(ctx, a)
    ggml_set_op_params(result, _params(fun, n_tasks, userdata))
    return set_op_src(result, GGMLOp.CUSTOM, a, *list(args)[:n_args])
