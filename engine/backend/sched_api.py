"""ggml-backend.h's scheduler functions (ggml_backend_sched_new, _reserve, _alloc_graph,
_graph_compute, the getters and setters): the doors a program uses into the scheduler,
engine/backend/sched.py's Sched, each checking what ggml asserts before it asks it.
"""

from __future__ import annotations

from typing import Callable

from engine.backend.alloc import ggml_gallocr_free, ggml_gallocr_get_buffer_size
from engine.backend.buffer import BufferType
from engine.backend.device import Backend, ggml_backend_synchronize
from engine.backend.sched import Sched
from engine.core.api import Writes, query, writes
from engine.core.context import ggml_free
from engine.core.errors import ggml_assert
from engine.core.tensor import Tensor

def _id_of(sched: Sched, backend: Backend, fn: str) -> int:
    i = next((k for k, b in enumerate(sched.backends) if b is backend), -1)
    ggml_assert(0 <= i < len(sched.backends), "backend_index >= 0 && backend_index < sched->n_backends", fn)
    return i


@writes()
def ggml_backend_sched_new(backends: list[Backend], bufts: list[BufferType] | None, n_backends: int,
                           graph_size: int, parallel: bool, op_offload: bool) -> Sched:
    return Sched(list(backends)[:n_backends], list(bufts)[:n_backends] if bufts else None, graph_size, parallel,
                 op_offload)


@writes()
def ggml_backend_sched_free(sched: Sched | None) -> None:
    if sched is None:
        return
    ggml_gallocr_free(sched.galloc)
    if sched.ctx is not None:
        ggml_free(sched.ctx)
        sched.ctx = None


@writes()
def ggml_backend_sched_reset(sched: Sched) -> None:
    sched.reset()


@writes()
def ggml_backend_sched_reserve_size(sched: Sched, measure_graph) -> list[int]:
    """The compute buffer size each backend would need (C writes them into `sizes`)."""
    ggml_assert(sched.graph_size >= measure_graph.n_nodes + measure_graph.n_leafs,
                "(int)sched->hash_set.size >= measure_graph->n_nodes + measure_graph->n_leafs",
                "ggml_backend_sched_reserve_size")
    sched.reset()
    ggml_backend_sched_synchronize(sched)
    sched.split_graph(measure_graph)
    sched.galloc.reserve(sched.graph, sched.node_backend_ids, sched.leaf_backend_ids, no_alloc=True)
    return [sum(c.max_size for c in t.chunks) for t in sched.galloc.tallocs]


@writes()
def ggml_backend_sched_reserve(sched: Sched, measure_graph) -> bool:
    ggml_assert(sched.graph_size >= measure_graph.n_nodes + measure_graph.n_leafs,
                "(int)sched->hash_set.size >= measure_graph->n_nodes + measure_graph->n_leafs",
                "ggml_backend_sched_reserve")
    ggml_backend_sched_synchronize(sched)
    sched.split_graph(measure_graph)
    sched.galloc.reserve(sched.graph, sched.node_backend_ids, sched.leaf_backend_ids)
    sched.reset()
    return True


@writes(Writes.PLACES)
def ggml_backend_sched_alloc_graph(sched: Sched, graph) -> bool:
    ggml_assert(sched.graph_size >= graph.n_nodes + graph.n_leafs,
                "(int)sched->hash_set.size >= graph->n_nodes + graph->n_leafs", "ggml_backend_sched_alloc_graph")
    ggml_assert(not sched.is_alloc, "!sched->is_alloc", "ggml_backend_sched_alloc_graph")
    sched.cur_copy = sched.next_copy
    sched.next_copy = (sched.next_copy + 1) % sched.n_copies
    sched.split_graph(graph)
    if not sched.alloc_splits():
        return False
    sched.is_alloc = True
    return True


@writes(Writes.PLACES)
def ggml_backend_sched_graph_compute_async(sched: Sched, graph) -> int:
    if not sched.is_reset and not sched.is_alloc:
        sched.reset()
    if not sched.is_alloc and not ggml_backend_sched_alloc_graph(sched, graph):
        return 2  # GGML_STATUS_ALLOC_FAILED
    return sched.compute_splits()


@writes(Writes.PLACES)
def ggml_backend_sched_graph_compute(sched: Sched, graph) -> int:
    status = ggml_backend_sched_graph_compute_async(sched, graph)
    ggml_backend_sched_synchronize(sched)
    return status


@writes()
def ggml_backend_sched_synchronize(sched: Sched) -> None:
    for be in sched.backends:
        ggml_backend_synchronize(be)
    if not sched.is_alloc:
        sched.next_copy = 0  # the same copy is used after a synchronization


@writes()
def ggml_backend_sched_split_graph(sched: Sched, graph) -> None:
    sched.split_graph(graph)


@writes()
def ggml_backend_sched_set_eval_callback(sched: Sched, callback: Callable | None, user_data=None) -> None:
    """callback(t, ask) -> bool, as ggml_backend_sched_eval_callback without user_data (a
    closure carries it); called before a node (ask=True: do you want its data?) and after."""
    sched.callback_eval = callback


@query
def ggml_backend_sched_get_n_splits(sched: Sched) -> int:
    return len(sched.splits)


@query
def ggml_backend_sched_get_n_copies(sched: Sched) -> int:
    return sched.n_copies


@query
def ggml_backend_sched_get_n_backends(sched: Sched) -> int:
    return len(sched.backends)


@query
def ggml_backend_sched_get_backend(sched: Sched, i: int) -> Backend:
    ggml_assert(0 <= i < len(sched.backends), "i >= 0 && i < sched->n_backends", "ggml_backend_sched_get_backend")
    return sched.backends[i]


@query
def ggml_backend_sched_get_buffer_type(sched: Sched, backend: Backend) -> BufferType:
    return sched.bufts[_id_of(sched, backend, "ggml_backend_sched_get_buffer_type")]


@query
def ggml_backend_sched_get_buffer_size(sched: Sched, backend: Backend) -> int:
    return ggml_gallocr_get_buffer_size(sched.galloc, _id_of(sched, backend, "ggml_backend_sched_get_buffer_size"))


@writes()
def ggml_backend_sched_set_tensor_backend(sched: Sched, node: Tensor, backend: Backend) -> None:
    sched._pass_log = []
    sched.set_tid(node, _id_of(sched, backend, "ggml_backend_sched_set_tensor_backend"), "usr")
    sched.is_reset = False


@query
def ggml_backend_sched_get_tensor_backend(sched: Sched, node: Tensor) -> Backend | None:
    b = sched.tid(node)
    return None if b == -1 else sched.backends[b]
