"""MAP_CUSTOM1/2/3 and CUSTOM (ggml-cpu/ops.cpp): each thread calls the user's function with its
ith and nth; what a thread computes is the function's business, as in C."""

from __future__ import annotations

from engine.compute.kernels import kernel
from engine.ops.custom import custom_params
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor


@kernel(GGMLOp.MAP_CUSTOM1, GGMLOp.MAP_CUSTOM2, GGMLOp.MAP_CUSTOM3)
def compute_forward_map_custom(params, dst: Tensor) -> None:
    """ggml_compute_forward_map_custom1/2/3: fun(dst, a[, b[, c]], ith, nth, userdata)."""
    fun, _n_tasks, userdata = custom_params(dst)
    n_src = {GGMLOp.MAP_CUSTOM1: 1, GGMLOp.MAP_CUSTOM2: 2, GGMLOp.MAP_CUSTOM3: 3}[GGMLOp(dst.op)]
    params.took("all")
    fun(dst, *(dst.src[i] for i in range(n_src)), params.ith, params.nth, userdata)


@kernel(GGMLOp.CUSTOM)
def compute_forward_custom(params, dst: Tensor) -> None:
    """ggml_compute_forward_custom: fun(dst, ith, nth, userdata)."""
    fun, _n_tasks, userdata = custom_params(dst)
    params.took("all")
    fun(dst, params.ith, params.nth, userdata)
