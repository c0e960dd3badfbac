"""The recording base every op constructor builds on: op_params get/set as ggml.c's
ggml_set_op_params* and ggml_get_op_params*, and the few steps each ggml_<op> function repeats
(record the op and its sources, the result as a new tensor or a view, a shape as ints, packed
op_params).
"""

from __future__ import annotations

import struct

import numpy as np

from engine.core.api import op, query
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_OP_PARAMS
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_dup_tensor, ggml_view_tensor

# --- op_params -------------------------------------------------------------------------------

@op
def ggml_set_op_params(t: Tensor, params: bytes) -> None:
    """ggml_set_op_params: copy raw bytes into op_params (at most 64)."""
    ggml_assert(len(params) <= GGML_MAX_OP_PARAMS, "params_size <= GGML_MAX_OP_PARAMS",
                "ggml_set_op_params", f"{len(params)} bytes")
    t.op_params.view(np.uint8)[:len(params)] = np.frombuffer(params, dtype=np.uint8)


@op
def ggml_set_op_params_i32(t: Tensor, i: int, value: int) -> None:
    """ggml_set_op_params_i32."""
    t.op_params[i] = value


@query
def ggml_get_op_params_i32(t: Tensor, i: int) -> int:
    """ggml_get_op_params_i32."""
    return int(t.op_params[i])


@op
def ggml_set_op_params_f32(t: Tensor, i: int, value: float) -> None:
    """ggml_set_op_params_f32: a float stored in an int32 slot."""
    t.op_params.view(np.float32)[i] = value


@query
def ggml_get_op_params_f32(t: Tensor, i: int) -> float:
    """ggml_get_op_params_f32."""
    return float(t.op_params.view(np.float32)[i])


def i32_params(*values: int) -> bytes:
    """op_params bytes of int32 values, in order."""
    return struct.pack(f"<{len(values)}i", *values)


def f32_params(*values: float) -> bytes:
    """op_params bytes of float values, in order."""
    return struct.pack(f"<{len(values)}f", *values)


# --- recording ---------------------------------------------------------------------------------

def set_op_src(result: Tensor, op: GGMLOp, *srcs: Tensor | None) -> Tensor:
    """result->op = op and result->src[i] = srcs[i]: what every ggml_<op> ends with."""
    result.op = op
    for i, s in enumerate(srcs):
        result.src[i] = s
    return result


def shape_of(t: Tensor) -> list[int]:
    """t->ne as a list of ints (for shapes and messages)."""
    return [int(x) for x in t.ne]


def dup_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    """The result of an op and its _inplace twin: a new tensor like a, or a view of a."""
    return ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)
