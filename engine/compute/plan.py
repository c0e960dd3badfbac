"""ggml_graph_plan: how many threads each node may use, and how big the shared work buffer is.

Mirrors ggml_get_n_tasks and the work-size switch of ggml_graph_plan in ggml-cpu.c (oracle version):
each case is declared where its op's kernel is registered (`@kernel(..., n_tasks=, work=)`,
engine.compute.kernels.KernelInfo), and this module looks them up. n_tasks only plans: at compute
time every thread runs every node with nth = cplan.n_threads.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from engine.compute.compiled import remembered
from engine.compute.kernels import CACHE_LINE_SIZE, KERNELS
from engine.core.api import query, writes
from engine.core.graph import Graph
from engine.core.tensor import Tensor, ggml_is_empty

GGML_DEFAULT_N_THREADS = 4


@query
def ggml_get_n_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks: how many threads this node's op can use: its kernel's n_tasks, or one
    for an op without a kernel (a view has nothing to compute; compute_forward refuses the others
    with their reason)."""
    if ggml_is_empty(node):
        return 1
    info = KERNELS.get(node.op)
    return 1 if info is None else info.n_tasks(node, n_threads)


def node_work_size(node: Tensor, n_tasks: int) -> int:
    """The work-buffer bytes one node needs (`cur` in ggml_graph_plan): its kernel's work size."""
    info = KERNELS.get(node.op)
    return 0 if info is None else info.work(node, n_tasks)


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


# GGML_CPU_TILED_MM: llama.cpp's ggml (ggml-cpu/tiled/) computes MUL_MAT of K-quant and IQ weights
# by 8 or more src1 rows in tiles (engine/compute/kernels/tiled.py), on by default; ggml's own build
# has no such path, nor llama.cpp's with GGML_CPU_TILED_MM=0. A model run as llama.cpp runs it by
# default plans its graphs inside `tiled_build()` too.
TILED: contextvars.ContextVar[bool] = contextvars.ContextVar("tiled", default=False)


@contextlib.contextmanager
def tiled_build() -> Iterator[None]:
    """Plan graphs as llama.cpp's ggml with its tiled K-quant products on (GGML_CPU_TILED_MM)."""
    token = TILED.set(True)
    try:
        yield
    finally:
        TILED.reset(token)


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
    tiled: bool = field(default_factory=TILED.get)  # the build, not a ggml_cplan field


@writes()
def ggml_graph_plan(cgraph: Graph, n_threads: int = GGML_DEFAULT_N_THREADS,
                    threadpool: Any = None) -> CPlan:
    """ggml_graph_plan: threads = min(most tasks of any node, n_threads); the largest work size
    plus one cache line per thread."""
    if n_threads <= 0:  # a threadpool's thread count when one is given
        n_threads = threadpool.n_threads if threadpool is not None else GGML_DEFAULT_N_THREADS
    work_size, n_threads, per_node = remembered(cgraph, ("plan", n_threads, TILED.get()),
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
