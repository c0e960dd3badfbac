"""ggml_backend_sched: one graph run on several backends, as llama.cpp runs a model on a GPU and a CPU.

`ggml_backend_sched_split_graph` decides, in ggml's five passes, which backend computes each node:

1. tensors already in a buffer stay with a backend that can use that buffer; graph inputs go to
   the CPU (the last backend); an op reading weights runs where its weights are (or on a
   higher-priority backend that asks to take it over: `offload_op`);
2. the accelerators' assignments spread down and then up the node list, over nodes they support
   (the CPU's do not spread), then every assignment spreads down and up;
3. a node moves to a higher-priority backend with the same buffer type when all its sources can
   be read there; a node still unassigned goes to the backend that can read most of its sources;
4. sources left unassigned follow their node (a view follows its view_src);
5. the node list is cut into splits, one run of nodes per backend; a source that the split's
   backend cannot read gets a copy there ("<backend>#<name>#<copy>") and becomes a split input.

The scheduler then builds a graph of its own (each split's input copies, then its nodes) and
plans all backends' compute buffers with one gallocr (one buffer per backend);
`ggml_backend_sched_graph_compute` copies each split's inputs and computes the split on its
backend. Every decision is kept (`Sched.history`) so a learner can replay the passes.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Callable

from engine.backend.alloc import GraphAllocator, ggml_gallocr_alloc_graph
from engine.backend.buffer import (
    GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
    BufferType,
    ggml_backend_tensor_copy,
    tensor_buffer,
)
from engine.backend.device import (
    GGML_BACKEND_DEVICE_TYPE_CPU,
    Backend,
    ggml_backend_graph_compute_async,
    ggml_backend_offload_op,
    ggml_backend_supports_buft,
    ggml_backend_supports_op,
    ggml_backend_synchronize,
)
from engine.core.context import Context, ggml_free, ggml_init, ggml_init_params
from engine.core.errors import GGMLAbortError, ggml_assert
from engine.core.graph import Graph, ggml_graph_overhead_custom, ggml_graph_view
from engine.core.layout import GGML_OBJECT_SIZE
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import (
    GGML_TENSOR_FLAG_INPUT,
    GGML_TENSOR_SIZE,
    Tensor,
    ggml_dup_tensor,
    ggml_format_name,
    ggml_set_input,
    ggml_set_output,
    ggml_view_tensor,
)

GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_SPLIT_INPUTS = 30
GGML_SCHED_MAX_COPIES = 4

VIEW_OPS = frozenset((GGMLOp.VIEW, GGMLOp.RESHAPE, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE))


# told of each split input the scheduler copies: (input, its copy, from backend, to backend)
COPY_OBSERVER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("sched_copy_observer", default=None)


@dataclass
class Split:
    """struct ggml_backend_sched_split: nodes [i_start, i_end) of the graph on one backend."""
    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)
    graph: Graph | None = None  # ggml_graph_view of the nodes (made by _build_graph_copy)


@dataclass
class SchedGraph:
    """The scheduler's own graph (sched->graph): nodes and leafs only, by value."""
    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Assignment:
    """One pass's result for one tensor: which backend it got, and why (ggml's SET_CAUSE)."""
    tensor: Tensor
    backend_id: int
    cause: str


class Sched:
    """struct ggml_backend_sched."""

    def __init__(self, backends: list[Backend], bufts: list[BufferType] | None, graph_size: int,
                 parallel: bool, op_offload: bool) -> None:
        n = len(backends)
        ggml_assert(n > 0, "n_backends > 0", "ggml_backend_sched_new")
        ggml_assert(n <= GGML_SCHED_MAX_BACKENDS, "n_backends <= GGML_SCHED_MAX_BACKENDS", "ggml_backend_sched_new")
        ggml_assert(backends[-1].device.type == GGML_BACKEND_DEVICE_TYPE_CPU,
                    "ggml_backend_dev_type(ggml_backend_get_device(backends[n_backends - 1])) == "
                    "GGML_BACKEND_DEVICE_TYPE_CPU", "ggml_backend_sched_new")
        self.backends = list(backends)
        self.bufts = [bufts[b] if bufts else be.device.buft for b, be in enumerate(backends)]
        for be, buft in zip(self.backends, self.bufts):
            ggml_assert(ggml_backend_supports_buft(be, buft),
                        "ggml_backend_supports_buft(backends[b], sched->bufts[b])", "ggml_backend_sched_new")
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.graph_size = graph_size
        self.op_offload = op_offload
        max_splits = graph_size
        self.context_buffer_size = (max_splits * GGML_SCHED_MAX_SPLIT_INPUTS * 2 * (GGML_TENSOR_SIZE + GGML_OBJECT_SIZE)
                                    + ggml_graph_overhead_custom(graph_size, False))
        self.galloc = GraphAllocator(self.bufts)
        self.ids: dict[Tensor, int] = {}  # hv_tensor_backend_ids (absent: -1)
        self.copies: dict[tuple[Tensor, int, int], Tensor] = {}  # hv_tensor_copies
        self.causes: dict[Tensor, str] = {}
        self.node_backend_ids: list[int] = []
        self.leaf_backend_ids: list[int] = []
        self.prev_node_backend_ids: list[int] = []
        self.prev_leaf_backend_ids: list[int] = []
        self.graph = SchedGraph()
        self.splits: list[Split] = []
        self.graph_inputs: list[Tensor] = []
        self.cur_copy = self.next_copy = 0
        self.ctx: Context | None = None  # the split graph's tensors (made by split_graph)
        self.callback_eval: Callable | None = None
        self.history: list[tuple[Note, list[Assignment]]] = []  # each pass (its title) and its assignments
        self.is_reset = False
        self.is_alloc = False
        self.n_split_calls = 0  # how many times the graph was split (the tracer shows each new split)
        self.reset()

    # -- the hash map ----------------------------------------------------------------------
    def tid(self, t: Tensor | None) -> int:
        return -1 if t is None else self.ids.get(t, -1)

    def set_tid(self, t: Tensor, backend_id: int, cause: str) -> None:
        self.ids[t] = backend_id
        if backend_id != -1:
            self.causes[t] = cause
            self._pass_log.append(Assignment(t, backend_id, cause))

    def reset(self) -> None:
        if not self.is_reset:
            self.ids.clear()
            self.copies.clear()
            self.causes.clear()
            self.is_reset = True
        self.is_alloc = False

    # -- helpers of the passes ---------------------------------------------------------------
    def backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        buf = tensor_buffer(t.view_src if t.view_src is not None else t)
        if buf is None:
            return -1
        for i, be in enumerate(self.backends):
            if ggml_backend_supports_buft(be, buf.buft) and ggml_backend_supports_op(be, op):
                return i
        return -1

    def backend_id_from_cur(self, t: Tensor) -> tuple[int, str]:
        b = self.backend_from_buffer(t, t)
        if b != -1:
            return b, "1.dst"
        if t.view_src is not None:
            b = self.backend_from_buffer(t.view_src, t)
            if b != -1:
                return b, "1.vsrc"
        owner = t.view_src if t.view_src is not None else t
        buf = tensor_buffer(owner) or tensor_buffer(t)
        if buf is not None:
            raise GGMLAbortError(f"pre-allocated tensor ({t.name}) in a buffer ({buf.buft.name}) that "
                                 f"cannot run the operation ({GGMLOp(t.op).name})",
                                 "ggml_backend_sched_backend_id_from_cur")
        if t.flags & GGML_TENSOR_FLAG_INPUT:
            return len(self.backends) - 1, "1.inp"
        for i, src in enumerate(t.src):
            if src is None:
                continue
            buf = tensor_buffer(src)
            if t.op != GGMLOp.ROPE and buf is not None and buf.usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS:
                b = self.backend_from_buffer(src, t)
                if self.op_offload and b == len(self.backends) - 1 and buf.buft.is_host:
                    for c in range(b):
                        be = self.backends[c]
                        if ggml_backend_supports_op(be, t) and ggml_backend_offload_op(be, t):
                            return c, "1.off"
                return b, f"1.wgt{i}"
        return -1, ""

    def buffer_supported(self, t: Tensor, backend_id: int) -> bool:
        buf = tensor_buffer(t.view_src if t.view_src is not None else t)
        buft = None
        if buf is not None:
            buft = buf.buft
        else:
            b = self.tid(t)
            if b == -1 and t.view_src is not None:
                b = self.tid(t.view_src)
            if b != -1:
                buft = self.bufts[b]
        return buft is not None and ggml_backend_supports_buft(self.backends[backend_id], buft)

    def set_if_supported(self, node: Tensor, backend_id: int, cause: str = "2.sup") -> None:
        if ggml_backend_supports_op(self.backends[backend_id], node):
            self.set_tid(node, backend_id, cause)

    def _begin(self, title: Note) -> None:
        self._pass_log: list[Assignment] = []
        self.history.append((title, self._pass_log))

    # -- the five passes ---------------------------------------------------------------------
    def split_graph(self, graph) -> None:
        """ggml_backend_sched_split_graph."""
        self.splits = []
        self.graph_inputs = []
        self.is_reset = False
        self.history = []
        self.n_split_calls += 1
        if self.ctx is not None:
            ggml_free(self.ctx)
        self.ctx = ggml_init(ggml_init_params(mem_size=self.context_buffer_size, mem_buffer=None, no_alloc=True))
        nodes, leafs = graph.nodes, graph.leafs
        last = len(self.backends) - 1

        self._begin(Note("pass_1"))
        for t in list(leafs) + list(nodes):
            if self.tid(t) == -1:  # keep the user's assignments
                b, cause = self.backend_id_from_cur(t)
                self.set_tid(t, b, cause)

        compute = [n for n in nodes if n.op not in VIEW_OPS]
        self._begin(Note("pass_2"))
        for order, skip_cpu in ((compute, True), (compute[::-1], True), (compute, False), (compute[::-1], False)):
            cur = -1
            for node in order:
                b = self.tid(node)
                if b != -1:
                    cur = -1 if (skip_cpu and b == last) else b
                elif cur != -1:
                    self.set_if_supported(node, cur)

        self._begin(Note("pass_3"))
        for node in compute:
            b = self.tid(node)
            if b == -1:
                best = -1
                for c, be in enumerate(self.backends):
                    if not ggml_backend_supports_op(be, node):
                        continue
                    n_ok = sum(1 for s in node.src if s is not None
                               and (self.tid(s) != -1 or self.tid(s.view_src) != -1) and self.buffer_supported(s, c))
                    if n_ok > best:
                        best = n_ok
                        self.set_tid(node, c, "3.best")
            else:
                for c in range(b):
                    if self.bufts[c] is self.bufts[b] and ggml_backend_supports_op(self.backends[c], node):
                        if all(s is None or self.buffer_supported(s, c) for s in node.src):
                            self.set_tid(node, c, "3.upg")
                            break

        self._begin(Note("pass_4"))
        for node in nodes:
            if node.view_src is not None and self.tid(node) == -1:
                self.set_tid(node, self.tid(node.view_src), "4.vsrc")
            for s in node.src:
                if s is None or self.tid(s) != -1:
                    continue
                if s.view_src is not None:
                    self.set_tid(s, self.tid(s.view_src), "4.vsrc")
                else:
                    self.set_tid(s, self.tid(node), "4.cur")
            for c in range(len(self.backends)):
                if self.tid(node) != -1:
                    break
                self.set_if_supported(node, c)
            ggml_assert(self.tid(node) != -1, "*cur_backend_id != -1", "ggml_backend_sched_split_graph",
                        f"no backend supports {node.name} ({GGMLOp(node.op).name})")

        self._begin(Note("pass_5"))
        self._pass5(graph)
        self._build_graph_copy(graph)

    def _pass5(self, graph) -> None:
        nodes = graph.nodes
        i = next((k for k, n in enumerate(nodes) if n.op not in VIEW_OPS), len(nodes))
        split = Split(self.tid(nodes[i]) if i < len(nodes) else 0, 0)
        self.splits = [split]
        cur = split.backend_id
        for i in range(i, len(nodes)):
            node = nodes[i]
            if node.op in VIEW_OPS:
                continue
            nb = self.tid(node)
            ggml_assert(nb != -1, "node_backend_id != -1", "ggml_backend_sched_split_graph")
            need_new = False
            if nb == cur and split.inputs:
                for s in node.src:
                    if s is None:
                        continue
                    buf = tensor_buffer(s)
                    if buf is not None and buf.usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS:
                        if self.tid(s) != cur and not self.buffer_supported(s, cur):
                            need_new = True
                            break
                    if len(split.inputs) == GGML_SCHED_MAX_SPLIT_INPUTS:
                        if (self.tid(s) != cur and (s, cur, 0) not in self.copies
                                and not self.buffer_supported(s, cur)):
                            need_new = True
                            break
            if nb != cur or need_new:
                split.i_end = i
                split = Split(nb, i)
                self.splits.append(split)
                cur = nb
            for j, s in enumerate(node.src):
                if s is None:
                    continue
                sb = self.tid(s)
                ggml_assert(sb != -1, "src_backend_id != -1", "ggml_backend_sched_split_graph")
                if s.flags & GGML_TENSOR_FLAG_INPUT and self.n_copies > 1 and (s, sb, 0) not in self.copies:
                    for c in range(self.n_copies):
                        if c == self.cur_copy:
                            cpy = s
                        else:
                            cpy = self._dup_layout(s)
                            ggml_format_name(cpy, "%s#%s#%d", self.backends[sb].name, s.name_bytes, c)
                        ggml_set_input(cpy)
                        ggml_set_output(cpy)
                        self.copies[(s, sb, c)] = cpy
                    ggml_assert(len(self.graph_inputs) < GGML_SCHED_MAX_SPLIT_INPUTS,
                                "n_graph_inputs < GGML_SCHED_MAX_SPLIT_INPUTS", "ggml_backend_sched_split_graph")
                    self.graph_inputs.append(s)
                if sb != cur and not self.buffer_supported(s, cur):
                    if (s, cur, 0) not in self.copies:
                        for c in range(self.n_copies):
                            cpy = self._dup_layout(s)
                            ggml_format_name(cpy, "%s#%s#%d", self.backends[cur].name, s.name_bytes, c)
                            if self.n_copies > 1:
                                ggml_set_input(cpy)
                                ggml_set_output(cpy)
                            self.copies[(s, cur, c)] = cpy
                            self.causes[cpy] = "4.cpy"
                        ggml_assert(len(split.inputs) < GGML_SCHED_MAX_SPLIT_INPUTS,
                                    "n_inputs < GGML_SCHED_MAX_SPLIT_INPUTS", "ggml_backend_sched_split_graph")
                        split.inputs.append(s)
                        self._pass_log.append(Assignment(self.copies[(s, cur, 0)], cur, "5.cpy"))
                    node.src[j] = self.copies[(s, cur, self.cur_copy)]
        split.i_end = len(nodes)

    def _dup_layout(self, t: Tensor) -> Tensor:
        assert self.ctx is not None  # (split_graph made it)
        dup = ggml_dup_tensor(self.ctx, t)
        dup.nb[:] = t.nb
        return dup

    def _build_graph_copy(self, graph) -> None:
        """The scheduler's graph: for each split, each input's dependency view and its copy, then
        the split's nodes; leafs: the input copies (with several copies) then the graph's leafs."""
        self.prev_node_backend_ids, self.node_backend_ids = self.node_backend_ids, []
        self.prev_leaf_backend_ids, self.leaf_backend_ids = self.leaf_backend_ids, []
        g = self.graph = SchedGraph()
        ctx = self.ctx
        assert ctx is not None  # (split_graph made it)
        nodes = graph.nodes
        for split in self.splits:
            split.graph = ggml_graph_view(graph, split.i_start, split.i_end)
            for inp in split.inputs:
                cpy = self.copies[(inp, split.backend_id, self.cur_copy)]
                dep = ggml_view_tensor(ctx, inp)
                dep.src[0] = inp
                g.nodes.append(dep)
                self.node_backend_ids.append(self.tid(inp))
                g.nodes.append(cpy)
                self.node_backend_ids.append(split.backend_id)
            for j in range(split.i_start, split.i_end):
                g.nodes.append(nodes[j])
                self.node_backend_ids.append(self.tid(nodes[j]))
        if self.n_copies > 1:
            for inp in self.graph_inputs:
                b = self.tid(inp)
                for c in range(self.n_copies):
                    g.leafs.append(self.copies[(inp, b, c)])
                    self.leaf_backend_ids.append(b)
            for split in self.splits:
                for inp in split.inputs:
                    for c in range(self.n_copies):
                        g.leafs.append(self.copies[(inp, split.backend_id, c)])
                        self.leaf_backend_ids.append(split.backend_id)
        for leaf in graph.leafs:
            g.leafs.append(leaf)
            self.leaf_backend_ids.append(self.tid(leaf))

    # -- allocation and compute ----------------------------------------------------------------
    def alloc_splits(self) -> bool:
        def changed(ids, prev):
            return any(i >= len(prev) or (a != prev[i] and self.bufts[a] is not self.bufts[prev[i]])
                       for i, a in enumerate(ids))
        ids_changed = changed(self.node_backend_ids, self.prev_node_backend_ids) or \
            changed(self.leaf_backend_ids, self.prev_leaf_backend_ids)
        if ids_changed or not _alloc_graph(self.galloc, self.graph):
            for be in self.backends:
                ggml_backend_synchronize(be)
            self.galloc.reserve(self.graph, self.node_backend_ids, self.leaf_backend_ids)
            if not _alloc_graph(self.galloc, self.graph):
                return False
        return True

    def compute_splits(self) -> int:
        for split in self.splits:
            be, sg = self.backends[split.backend_id], split.graph
            assert sg is not None  # (_build_graph_copy made every split's)
            for inp in split.inputs:
                cpy = self.copies[(inp, split.backend_id, self.cur_copy)]
                ggml_backend_synchronize(be)
                ggml_backend_tensor_copy(inp, cpy)
                observer = COPY_OBSERVER.get()
                if observer is not None:
                    observer(inp, cpy, self.backends[self.tid(inp)], be)
            if self.callback_eval is None:
                status = ggml_backend_graph_compute_async(be, sg)
                if status != 0:
                    return status
                continue
            n = sg.n_nodes
            j0 = 0
            while j0 < n:
                t = sg.nodes[j0]
                need = self.callback_eval(t, True)
                j1 = j0
                while not need and j1 < n - 1:
                    j1 += 1
                    t = sg.nodes[j1]
                    need = self.callback_eval(t, True)
                status = ggml_backend_graph_compute_async(be, ggml_graph_view(sg, j0, j1 + 1))
                if status != 0:
                    return status
                ggml_backend_synchronize(be)
                if need and not self.callback_eval(t, False):
                    break
                j0 = j1 + 1
        return 0


def _alloc_graph(galloc: GraphAllocator, graph: SchedGraph) -> bool:
    return ggml_gallocr_alloc_graph(galloc, graph)
