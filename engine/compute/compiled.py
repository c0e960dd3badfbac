"""Work made from a graph's structs once, and kept while they stay the same: its plan and its
nodes' prepared kernel calls.

llama.cpp builds a graph once and computes it token after token, changing only the inputs' bytes;
so do the model builders here. Everything worked out from the tensors' structs (the plan's thread
counts and work size; each kernel's views into the pools, its chosen loop, its row blocks, the
thread count its C loop may use) is the same each time, so `remembered(cgraph, key, make)` makes
it once: the compute keeps each node's mode and, for a kernel registered with `prepare=`
(engine.compute.kernels.KernelInfo), a ready call computing the whole node that reads and writes
only bytes.

What was made is reused while everything it was made from is byte for byte the same (the
Fingerprint): the graph's struct and node pointers, each node's and each source's 336 bytes
(type, ne, nb, op, op_params, data pointer, sources, name...), the pools they point into. Checking
that compares a few byte ranges (the structs of a no_alloc context lie side by side); it does not
walk the tensors. The values computed never depend on it: a prepared call gives the bytes its
kernel's general path gives (the conformance tests run the prepared calls, the traced tests the
general path, both against real ggml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from engine.core.graph import Graph
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.core.tensor import Tensor
from engine.lanes import pure_numpy

_MERGE_GAP = 2 * GGML_OBJECT_SIZE  # struct ranges this close are compared as one
_KEPT = 16  # graphs kept per context


@dataclass(slots=True)
class Fingerprint:
    """What a graph's prepared work was made from: the graph's struct and node pointers, the
    struct bytes of its nodes and their sources (as few ranges as can be), and the contexts and
    buffers those structs and their data lie in, with their pools."""

    graph_bytes: bytes
    ranges: list[tuple[np.ndarray, int, int, bytes]]  # (pool, start, stop, the bytes there)
    owners: list
    pools: list

    def holds(self, cgraph: Graph) -> bool:
        if _graph_bytes(cgraph) != self.graph_bytes:
            return False
        for owner, pool in zip(self.owners, self.pools):
            if owner.pool is not pool or getattr(owner, "freed", False):
                return False
        return all(pool[a:b].tobytes() == expected for pool, a, b, expected in self.ranges)


def _graph_bytes(cgraph: Graph) -> bytes:
    return cgraph._r.tobytes() + cgraph.node_addresses[:cgraph.n_nodes].tobytes()


def _struct_ranges(tensors: list[Tensor]) -> list[tuple[np.ndarray, int, int, bytes]]:
    """The tensors' struct bytes as few ranges as can be: per pool, sorted, the close ones merged
    (in a no_alloc context only object headers lie between them)."""
    by_pool: dict[int, tuple[np.ndarray, list[list[int]]]] = {}
    for t in tensors:
        pool = t.ctx.pool
        by_pool.setdefault(id(pool), (pool, []))[1].append([t.offs, t.offs + GGML_TENSOR_SIZE])
    ranges = []
    for pool, spans in by_pool.values():
        spans.sort()
        merged = [spans[0]]
        for a, b in spans[1:]:
            if a <= merged[-1][1] + _MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        ranges += [(pool, a, b, pool[a:b].tobytes()) for a, b in merged]
    return ranges


def fingerprint(cgraph: Graph) -> Fingerprint:
    seen: dict[int, Tensor] = {}
    for node in cgraph.nodes:
        seen[node.address] = node
        for s in node.src:
            if s is not None:
                seen[s.address] = s
    tensors = list(seen.values())
    owners = {id(t.ctx): t.ctx for t in tensors}
    for t in tensors:
        if t.data:
            ctx, _ = t.ctx.space.resolve(t.data)
            owners[id(ctx)] = ctx
    owner_list = list(owners.values())
    return Fingerprint(_graph_bytes(cgraph), _struct_ranges(tensors) if tensors else [], owner_list,
                       [o.pool for o in owner_list])


def forget(ctx: Any) -> None:
    """Drop what was kept for the graphs of ctx (their prepared work holds views of the tensors'
    bytes: a program that ended must not keep its buffers' memory alive through them)."""
    ctx.__dict__.pop("_remembered", None)


def remembered(cgraph: Graph, key: tuple, make: Callable[[], Any]) -> Any:
    """make() for this graph and key, kept with the graph's context and made again only when
    something it was made from has changed (one Fingerprint per graph, checked on each call, for
    everything kept of it). The key says what else it depends on; the engine's pure-numpy switch
    is part of it."""
    kept = cgraph.ctx.__dict__.setdefault("_remembered", {})
    entry = kept.get(cgraph.offs)
    if entry is None or not entry[0].holds(cgraph):
        entry = (fingerprint(cgraph), {})
        if cgraph.offs is not None:  # (a graph view's struct is not in a pool: made each time)
            if len(kept) >= _KEPT:
                kept.clear()
            kept[cgraph.offs] = entry
    key = (*key, pure_numpy())
    if key not in entry[1]:
        entry[1][key] = make()
    return entry[1][key]
