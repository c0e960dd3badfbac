"""ggml_backend_graph_copy and ggml_backend_compare_graph_backend: a graph copied onto another
backend, and the two computed node by node side by side (how ggml's test-backend-ops checks a
backend against the CPU).

The copy duplicates every tensor the graph reaches, with the same layout, op, flags, op_params and
name: tensors that hold data go into a context whose tensors are allocated in one buffer of the
target backend (their bytes copied over), views into a second context (they point into the
copies of their view_src).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.backend.ctx_alloc import ggml_backend_alloc_ctx_tensors
from engine.backend.buffer import Buffer, ggml_backend_buffer_free, ggml_backend_tensor_copy, ggml_backend_view_init
from engine.backend.device import Backend, ggml_backend_graph_compute
from engine.core.api import writes
from engine.core.context import Context, ggml_free, ggml_init, ggml_init_params, ggml_tensor_overhead
from engine.core.errors import ggml_assert
from engine.core.graph import Graph, ggml_graph_overhead_custom, ggml_graph_view, ggml_new_graph_custom
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_dup_tensor, ggml_set_name

VIEW_OPS = frozenset((GGMLOp.VIEW, GGMLOp.RESHAPE, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE))


@dataclass
class GraphCopy:
    """struct ggml_backend_graph_copy."""
    buffer: Buffer | None
    ctx_allocated: Context | None
    ctx_unallocated: Context | None
    graph: Graph | None


def _dup(copies: dict, allocated: Context, unallocated: Context, src: Tensor) -> Tensor:
    ggml_assert(src is not None, "src != NULL", "graph_copy_dup_tensor")
    ggml_assert(src.data is not None, "src->data && \"graph must be allocated\"", "graph_copy_dup_tensor")
    if src in copies:
        return copies[src]
    dst = ggml_dup_tensor(allocated if src.view_src is None else unallocated, src)
    dst.nb[:] = src.nb
    if src.view_src is not None:
        dst.view_src = _dup(copies, allocated, unallocated, src.view_src)
        dst.view_offs = src.view_offs
    dst.op = src.op
    dst.flags = src.flags
    dst.op_params[:] = src.op_params
    ggml_set_name(dst, src.name_bytes)
    for i, s in enumerate(src.src):
        if s is not None:
            dst.src[i] = _dup(copies, allocated, unallocated, s)
    copies[src] = dst
    return dst


def _init(copies: dict, done: set, src: Tensor) -> None:
    if src in done:
        return
    done.add(src)
    dst = copies[src]
    if dst.view_src is not None:
        view_src = src.view_src
        assert view_src is not None  # (dst, src's copy, views the copy of src's view_src)
        _init(copies, done, view_src)
        ggml_backend_view_init(dst)
    else:
        ggml_backend_tensor_copy(src, dst)
    for s in src.src:
        if s is not None:
            _init(copies, done, s)


@writes()
def ggml_backend_graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    n_hash = graph.hash_size
    mem = ggml_tensor_overhead() * n_hash + ggml_graph_overhead_custom(graph.size, False)
    allocated = ggml_init(ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
    unallocated = ggml_init(ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
    copies: dict[Tensor, Tensor] = {}
    nodes = graph.nodes
    for node in nodes:
        _dup(copies, allocated, unallocated, node)
    buffer = ggml_backend_alloc_ctx_tensors(allocated, backend)
    done: set[Tensor] = set()
    for node in nodes:
        _init(copies, done, node)
    g = ggml_new_graph_custom(allocated, graph.size, False)
    for i, node in enumerate(nodes):
        g.node_addresses[i] = copies[node].address
    g._r["n_nodes"] = len(nodes)
    return GraphCopy(buffer, allocated, unallocated, g)


@writes()
def ggml_backend_graph_copy_free(copy: GraphCopy) -> None:
    ggml_backend_buffer_free(copy.buffer)
    ggml_free(copy.ctx_allocated)
    ggml_free(copy.ctx_unallocated)


@writes()
def ggml_backend_compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph,
                                       callback: Callable[[int, Tensor, Tensor], bool],
                                       test_nodes: list[Tensor] | None = None) -> bool:
    """Copy the graph onto backend2, then compute both node by node (or whole, when test_nodes
    are given) and hand each pair of results to callback(i, t1, t2); it returns False to stop."""
    copy = ggml_backend_graph_copy(backend2, graph)
    if copy.buffer is None:
        return False
    g1, g2 = graph, copy.graph
    assert g2 is not None  # (a copy with a buffer has its graph)
    n1, n2 = g1.nodes, g2.nodes
    if test_nodes:
        ggml_backend_graph_compute(backend1, g1)
        ggml_backend_graph_compute(backend2, g2)
        verified = False
        for i, t1 in enumerate(n1):
            for t in test_nodes:
                if t1 == t:
                    callback(i, t1, n2[i])
                    verified = True
        ggml_assert(verified, "verified", "ggml_backend_compare_graph_backend")
    else:
        for i, (t1, t2) in enumerate(zip(n1, n2)):
            ggml_backend_graph_compute(backend1, ggml_graph_view(g1, i, i + 1))
            ggml_backend_graph_compute(backend2, ggml_graph_view(g2, i, i + 1))
            if t1.op in VIEW_OPS:
                continue
            if not callback(i, t1, t2):
                break
    ggml_backend_graph_copy_free(copy)
    return True
