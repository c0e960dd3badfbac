"""ggml_graph_plan: how many threads each node may use, and how big the shared work buffer is.

Mirrors ggml_get_n_tasks and the work-size switch of ggml_graph_plan in ggml-cpu.c (oracle version).
n_tasks only plans: at compute time every thread runs every node with nth = cplan.n_threads.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from engine.compute.compiled import remembered
from engine.core.api import query
from engine.core.graph import Graph
from engine.ops.custom import GGML_N_TASKS_MAX
from engine.core.optable import GGMLOp, GGMLUnaryOp
from engine.core.tensor import Tensor, ggml_is_empty, ggml_nelements, ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS, ggml_row_size

GGML_DEFAULT_N_THREADS = 4
CACHE_LINE_SIZE = 64  # x86-64
GGML_IM2COL_WORK_SIZE = 16 * 1024 * 1024
GGML_FA_TILE_Q = GGML_FA_TILE_KV = 64
MMID_ROW_MAPPING_SIZE = 8  # struct mmid_row_mapping {int32 i1 (expert slot); int32 i2 (token)}

O = GGMLOp
_ALL_THREADS = {
    O.CPY, O.DUP, O.CONT, O.ADD, O.ADD_ID, O.ADD1, O.ACC, O.CUMSUM, O.TRI, O.FILL, O.COUNT_EQUAL,
    O.SOLVE_TRI, O.GATED_DELTA_NET, O.SILU_BACK, O.MUL, O.DIV, O.NORM, O.RMS_NORM, O.RMS_NORM_BACK,
    O.L2_NORM, O.GROUP_NORM, O.CONCAT, O.MUL_MAT, O.MUL_MAT_ID, O.OUT_PROD, O.DIAG_MASK_ZERO,
    O.DIAG_MASK_INF, O.SOFT_MAX_BACK, O.ROPE, O.ROPE_BACK, O.ADD_REL_POS, O.IM2COL, O.IM2COL_BACK,
    O.IM2COL_3D, O.CONV_2D, O.CONV_3D, O.CONV_2D_DW, O.COL2IM_1D, O.CONV_TRANSPOSE_1D,
    O.CONV_TRANSPOSE_2D, O.UPSCALE, O.PAD, O.PAD_REFLECT_1D, O.ROLL, O.ARANGE, O.TIMESTEP_EMBEDDING,
    O.ARGSORT, O.TOP_K, O.FLASH_ATTN_EXT, O.FLASH_ATTN_BACK, O.SSM_CONV, O.SSM_SCAN,
    O.CROSS_ENTROPY_LOSS, O.CROSS_ENTROPY_LOSS_BACK, O.OPT_STEP_ADAMW, O.OPT_STEP_SGD, O.GLU,
}
_ONE_THREAD = {
    O.NONE, O.SUB, O.SQR, O.SQRT, O.LOG, O.SIN, O.COS, O.SUM, O.SUM_ROWS, O.MEAN, O.ARGMAX,
    O.REPEAT, O.REPEAT_BACK, O.LEAKY_RELU, O.GET_ROWS, O.SET_ROWS, O.SCALE, O.SET, O.RESHAPE,
    O.VIEW, O.PERMUTE, O.TRANSPOSE, O.GET_ROWS_BACK, O.DIAG, O.CLAMP, O.POOL_1D, O.POOL_2D,
    O.POOL_2D_BACK, O.WIN_PART, O.WIN_UNPART, O.GET_REL_POS,
}
_UNARY_ALL_THREADS = {GGMLUnaryOp.GELU, GGMLUnaryOp.GELU_ERF, GGMLUnaryOp.GELU_QUICK,
                      GGMLUnaryOp.SILU, GGMLUnaryOp.XIELU}


@query
def ggml_get_n_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks: how many threads this node's op can use."""
    if ggml_is_empty(node):
        return 1
    op = node.op
    if op in _ALL_THREADS:
        return n_threads
    if op in _ONE_THREAD:
        return 1
    if op == O.UNARY:
        return n_threads if int(node.op_params[0]) in _UNARY_ALL_THREADS else 1
    if op == O.SOFT_MAX:
        return min(n_threads, ggml_nrows(node.src[0]))
    if op in (O.RWKV_WKV6, O.GATED_LINEAR_ATTN, O.RWKV_WKV7):
        return min(n_threads, int(node.src[1].ne[1]))
    if op in (O.MAP_CUSTOM1, O.MAP_CUSTOM2, O.MAP_CUSTOM3, O.CUSTOM):
        n_tasks = int(node.op_params[2])  # struct {fun, n_tasks, userdata}: n_tasks at byte 8
        return n_threads if n_tasks == GGML_N_TASKS_MAX else min(n_tasks, n_threads)
    raise ValueError(f"ggml_get_n_tasks: op not implemented: {GGMLOp(op).name}")


def vec_dot_type(type_: int) -> GGMLType:
    vdt = TYPE_TRAITS[type_].vec_dot_type
    return GGMLType(type_) if vdt is None else vdt


# the ops that may need a work buffer (node_work_size returns 0 at once for the others)
_WORK_OPS = {O.CPY, O.DUP, O.ADD, O.ADD_ID, O.ADD1, O.ACC, O.COUNT_EQUAL, O.MUL_MAT, O.MUL_MAT_ID,
             O.CONV_TRANSPOSE_1D, O.CONV_TRANSPOSE_2D, O.OUT_PROD, O.SOFT_MAX, O.ROPE, O.ROPE_BACK,
             O.CONV_2D, O.CONV_3D, O.TOP_K, O.FLASH_ATTN_EXT, O.GATED_DELTA_NET, O.CROSS_ENTROPY_LOSS}


_SAME_TYPE_AS_SRC0 = {O.ADD_ID, O.ADD1, O.ACC}


def node_work_size(node: Tensor, n_tasks: int) -> int:
    """The work-buffer bytes one node needs (`cur` in ggml_graph_plan)."""
    op = node.op
    if op not in _WORK_OPS or (op in _SAME_TYPE_AS_SRC0 and not TYPE_TRAITS[node.type].is_quantized) \
            or (op == O.ADD and not TYPE_TRAITS[node.source_type(0)].is_quantized):
        return 0  # (ADD1, ADD_ID, ACC: the result has src0's type; ADD's may differ: add_cast)
    src = node.src
    f32 = 4
    if op in (O.CPY, O.DUP):
        s0, s1 = src[0], src[1]
        pair = (s0.type, s1.type if s1 is not None else None)
        if TYPE_TRAITS[node.type].is_quantized or pair in (
                (GGMLType.F16, GGMLType.BF16), (GGMLType.BF16, GGMLType.F16),
                (GGMLType.F32, GGMLType.I32), (GGMLType.I32, GGMLType.F32)):
            return f32 * int(node.ne[0]) * n_tasks
    elif op in (O.ADD, O.ADD_ID, O.ADD1):
        if TYPE_TRAITS[src[0].type].is_quantized:
            return f32 * int(src[0].ne[0]) * n_tasks
    elif op == O.ACC:
        if TYPE_TRAITS[src[0].type].is_quantized:
            return f32 * int(src[1].ne[0]) * n_tasks
    elif op == O.COUNT_EQUAL:
        return TYPE_TRAITS[node.type].type_size * n_tasks
    elif op == O.MUL_MAT:
        vdt = vec_dot_type(src[0].type)
        if src[1].type != vdt:
            return ggml_row_size(vdt, ggml_nelements(src[1]))
    elif op == O.MUL_MAT_ID:  # src1 converted, then per expert: row counts, row mappings, chunk counters
        vdt, n_as, ids = vec_dot_type(src[0].type), int(src[0].ne[2]), src[2]
        cur = ggml_row_size(vdt, ggml_nelements(src[1])) + 8 if src[1].type != vdt else 0
        cur += n_as * 8 + 8
        cur += n_as * int(ids.ne[0]) * int(ids.ne[1]) * MMID_ROW_MAPPING_SIZE + 8
        return cur + CACHE_LINE_SIZE * n_as + CACHE_LINE_SIZE
    elif op == O.CONV_TRANSPOSE_1D:  # the kernel as (C_in, K, C_out) and the input transposed
        s0, s1 = src[0], src[1]
        size = 2 if s0.type in (GGMLType.F16, GGMLType.BF16) else 4
        return size * (ggml_nelements(s0) + int(s1.ne[0]) * int(s1.ne[1]))
    elif op == O.CONV_TRANSPOSE_2D:  # the kernel and the image, channels innermost
        s0, s1 = src[0], src[1]
        size = TYPE_TRAITS[s0.type].type_size
        return size * (ggml_nelements(s0) + int(s1.ne[0]) * int(s1.ne[1]) * int(s1.ne[2]))
    elif op == O.OUT_PROD:
        if TYPE_TRAITS[src[0].type].is_quantized:
            return f32 * int(src[0].ne[0]) * n_tasks
    elif op in (O.SOFT_MAX, O.ROPE, O.ROPE_BACK):
        return f32 * int(node.ne[0]) * n_tasks
    elif op in (O.CONV_2D, O.CONV_3D):
        return GGML_IM2COL_WORK_SIZE
    elif op == O.TOP_K:
        return 4 * int(src[0].ne[0]) * n_tasks
    elif op == O.FLASH_ATTN_EXT:
        neq2, dk, dv = int(src[0].ne[2]), int(src[1].ne[0]), int(src[2].ne[0])
        q, kv = GGML_FA_TILE_Q, GGML_FA_TILE_KV
        prefill = f32 * (q * dk + 2 * q * kv + q * dv + kv * dv + kv * dk) * n_tasks
        decode = f32 * (neq2 * n_tasks * (2 + dv) + n_tasks * (dk + 2 * dv))
        return max(prefill, decode)
    elif op == O.GATED_DELTA_NET:  # per thread: delta (S_v), and with K > 1 a scratch state (S_v²)
        s_v, k = int(src[2].ne[0]), int(node.op_params[0])
        return f32 * (s_v + (s_v * s_v if k > 1 else 0)) * n_tasks
    elif op == O.CROSS_ENTROPY_LOSS:
        return TYPE_TRAITS[node.type].type_size * (n_tasks + int(src[0].ne[0]) * n_tasks)
    return 0


# GGML_USE_LLAMAFILE: llama.cpp builds ggml with llamafile's sgemm (tinyBLAS), which takes float
# products of two or more src1 rows with one accumulator per output; ggml's own build (the
# engine's reference, ggml-python's) leaves it off. A model run as llama.cpp runs it plans its
# graphs inside `llamafile_build()`.
LLAMAFILE: contextvars.ContextVar[bool] = contextvars.ContextVar("llamafile", default=False)


@contextlib.contextmanager
def llamafile_build() -> Iterator[None]:
    """Plan graphs as a ggml built with GGML_USE_LLAMAFILE (llama.cpp's build) computes them."""
    token = LLAMAFILE.set(True)
    try:
        yield
    finally:
        LLAMAFILE.reset(token)


@dataclass(slots=True)
class CPlan:
    """struct ggml_cplan, plus the per-node n_tasks the plan was made from (for display)."""

    work_size: int
    n_threads: int
    work_data: int | None = None  # address of the work buffer
    abort_callback: Callable[[Any], bool] | None = None
    abort_callback_data: Any = None
    use_ref: bool = False
    n_tasks: list[int] = field(default_factory=list)
    llamafile: bool = field(default_factory=LLAMAFILE.get)  # the build, not a ggml_cplan field


def ggml_graph_plan(cgraph: Graph, n_threads: int = GGML_DEFAULT_N_THREADS,
                    threadpool: Any = None) -> CPlan:
    """ggml_graph_plan: threads = min(most tasks of any node, n_threads); the largest work size
    plus one cache line per thread."""
    if n_threads <= 0:  # a threadpool's thread count when one is given
        n_threads = threadpool.n_threads if threadpool is not None else GGML_DEFAULT_N_THREADS
    work_size, n_threads, per_node = remembered(cgraph, ("plan", n_threads),
                                                lambda: _plan(cgraph, n_threads))
    return CPlan(work_size=work_size, n_threads=n_threads, n_tasks=list(per_node))


def _plan(cgraph: Graph, n_threads: int) -> tuple[int, int, list[int]]:
    work_size, max_tasks, per_node = 0, 1, []
    for node in cgraph.nodes:
        n_tasks = ggml_get_n_tasks(node, n_threads)
        per_node.append(n_tasks)
        max_tasks = max(max_tasks, n_tasks)
        work_size = max(work_size, node_work_size(node, n_tasks))
    if work_size > 0:
        work_size += CACHE_LINE_SIZE * n_threads
    return work_size, min(max_tasks, n_threads), per_node
