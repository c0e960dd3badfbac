"""MAP_CUSTOM1/2/3 and CUSTOM (ggml-cpu/ops.cpp): each thread calls the user's function with its
ith and nth; what a thread computes is the function's business, as in C."""

from __future__ import annotations

from engine.compute.kernels import kernel, no_work
from engine.compute.shares import ShareKind
from engine.ops.custom import GGML_N_TASKS_MAX, custom_params
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor


def _custom_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks's custom ops: the n_tasks the program gave the op (GGML_N_TASKS_MAX:
    every thread), at most n_threads."""
    n_tasks = int(node.op_params[2])  # struct {fun, n_tasks, userdata}: n_tasks at byte 8
    return n_threads if n_tasks == GGML_N_TASKS_MAX else min(n_tasks, n_threads)


@kernel(GGMLOp.MAP_CUSTOM1, GGMLOp.MAP_CUSTOM2, GGMLOp.MAP_CUSTOM3, n_tasks=_custom_tasks,
        work=no_work)
def compute_forward_map_custom(params, dst: Tensor) -> None:
    """ggml_compute_forward_map_custom1/2/3: fun(dst, a[, b[, c]], ith, nth, userdata)."""
    fun, _n_tasks, userdata = custom_params(dst)
    n_src = {GGMLOp.MAP_CUSTOM1: 1, GGMLOp.MAP_CUSTOM2: 2, GGMLOp.MAP_CUSTOM3: 3}[GGMLOp(dst.op)]
    params.took(ShareKind.ALL)
    fun(dst, *(dst.src[i] for i in range(n_src)), params.ith, params.nth, userdata)


@kernel(GGMLOp.CUSTOM, n_tasks=_custom_tasks, work=no_work)
def compute_forward_custom(params, dst: Tensor) -> None:
    """ggml_compute_forward_custom: fun(dst, ith, nth, userdata)."""
    fun, _n_tasks, userdata = custom_params(dst)
    params.took(ShareKind.ALL)
    fun(dst, params.ith, params.nth, userdata)
