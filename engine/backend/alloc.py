"""ggml-alloc's graph allocator as a planner: where `ggml_gallocr` puts every tensor of a graph.

This is the planning half of ggml's `ggml_gallocr` (src/ggml-alloc.c): given a graph whose tensors
have no data yet (a `no_alloc` context), it decides, node by node, which tensors get memory in
the compute buffer, at which (chunk, offset), which node takes over its parent's bytes in place,
and when a tensor's bytes return to the free list. The result is the plan real ggml writes into
each tensor's `data` field (buffer base + offset) and the size of the compute buffer it
allocates; `tests/conformance/test_alloc.py` checks both against real ggml.

`GraphAllocator.reserve` is ggml_gallocr_reserve_n: it plans the graph, remembers for each node
(by its index in the graph) and each of its sources where they go, and (re)allocates the compute
buffers when a chunk must grow; `ggml_gallocr_alloc_graph` then writes `buffer` and `data` into
the tensors from that plan, planning again only when the graph no longer fits it. The planning
algorithm, in ggml's order:

- leafs first, then inputs (nodes and sources flagged INPUT), then for each node: its sources,
  then the node itself, then each source loses a child and is freed when it has no children and
  no views left (a view frees its view_src when that has no children and views left);
- a tensor is allocated only if it has no data, no buffer, is not a view and is not already
  owned by the allocator;
- a node whose op can work in place (`ggml_op_can_inplace`) takes the bytes of the first
  source that the allocator owns, is not an output (nor a view of one), has the node's exact
  layout, and whose only child is this node with no views — through a view only when the view
  and its view_src have the same data pointer (both unset while planning); the bytes the node does not need are freed;
- the dynamic allocator keeps per chunk a free list sorted by offset; it picks the smallest
  block that fits among all but the last block of each chunk (ties: the later block), else the
  last block of the chunk whose high-water mark grows least, else a new chunk; freeing merges
  with the neighbouring blocks.
"""

from __future__ import annotations

import heapq

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from engine.backend import buffer as be
from engine.core.api import Writes, query, writes
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import GGML_TENSOR_FLAG_INPUT, GGML_TENSOR_FLAG_OUTPUT, Tensor

if TYPE_CHECKING:
    from engine.trace.steps import AllocDecision

T = TypeVar("T")  # how a Bar names its tensor: a Tensor, or a trace's reference to one

MAX_FREE_BLOCKS = 256
GGML_VBUFFER_MAX_CHUNKS = 16
SIZE_MAX = (1 << 64) - 1
GGML_MAX_SRC = 10

INPLACE_OPS = frozenset(GGMLOp[n] for n in (
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV",
    "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK",
    "CLAMP", "SOFT_MAX", "SOFT_MAX_BACK"))


def ggml_op_can_inplace(op: int) -> bool:
    """Ops whose result may overwrite a source (their kernels read each element before writing it)."""
    return op in INPLACE_OPS


def padded(size: int, alignment: int) -> int:
    """size rounded up to a multiple of alignment (ggml-alloc's aligned sizes)."""
    return size + (alignment - size % alignment) % alignment


CPU_BUFT = be.ggml_backend_cpu_buffer_type()


@dataclass
class _Chunk:
    free_blocks: list[list[int]]  # [offset, size], sorted by offset
    max_size: int = 0


class DynAllocator:
    """ggml_dyn_tallocr: offsets within up to 16 chunks, each with a free list and a high-water mark."""

    def __init__(self, alignment: int, max_buffer_size: int) -> None:
        self.alignment = alignment
        self.max_chunk_size = min(max_buffer_size, SIZE_MAX // 2)
        self.chunks: list[_Chunk] = []

    def reset(self) -> None:
        self.chunks = []

    def _new_chunk(self, min_size: int) -> int:
        if len(self.chunks) >= GGML_VBUFFER_MAX_CHUNKS:
            return -1
        size = max(min_size, self.max_chunk_size)
        if len(self.chunks) == GGML_VBUFFER_MAX_CHUNKS - 1:
            size = SIZE_MAX // 2
        self.chunks.append(_Chunk([[0, size]]))
        return len(self.chunks) - 1

    def alloc(self, size: int) -> tuple[int, int]:
        size = padded(size, self.alignment)
        best_chunk = best_block = -1
        max_avail = 0
        for c, chunk in enumerate(self.chunks):
            best_size = SIZE_MAX
            for i, (_, bsize) in enumerate(chunk.free_blocks[:-1]):
                max_avail = max(max_avail, bsize)
                if size <= bsize <= best_size:
                    best_chunk, best_block, best_size = c, i, bsize
        if best_block == -1:
            best_reuse = -(1 << 63)
            for c, chunk in enumerate(self.chunks):
                if chunk.free_blocks:
                    boff, bsize = chunk.free_blocks[-1]
                    max_avail = max(max_avail, bsize)
                    reuse = chunk.max_size - boff - size  # int64 in ggml; sizes here stay far below 2^63
                    better_reuse = best_reuse < 0 and reuse > best_reuse
                    better_fit = reuse >= 0 and reuse < best_reuse
                    if bsize >= size and (better_reuse or better_fit):
                        best_chunk, best_block, best_reuse = c, len(chunk.free_blocks) - 1, reuse
        if best_block == -1:
            best_chunk = self._new_chunk(size)
            best_block = 0
        ggml_assert(best_chunk != -1, "graph allocation: failed to reserve memory", "ggml_dyn_tallocr_alloc",
                    f"not enough space in the buffer to allocate {size} bytes, largest block available "
                    f"{max_avail} bytes")
        chunk = self.chunks[best_chunk]
        block = chunk.free_blocks[best_block]
        addr = (best_chunk, block[0])
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del chunk.free_blocks[best_block]
        chunk.max_size = max(chunk.max_size, addr[1] + size)
        return addr

    def free_bytes(self, addr: tuple[int, int], size: int) -> None:
        size = padded(size, self.alignment)
        chunk = self.chunks[addr[0]]
        offset = addr[1]
        blocks = chunk.free_blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:  # the freed bytes follow this block
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:  # the freed bytes precede this block
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        ggml_assert(len(blocks) < MAX_FREE_BLOCKS, "chunk->n_free_blocks < MAX_FREE_BLOCKS && \"out of free blocks\"",
                    "ggml_dyn_tallocr_insert_block")
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


@dataclass
class _HashNode:
    n_children: int = 0
    n_views: int = 0
    buffer_id: int = 0
    addr: tuple[int, int] = (0, 0)
    allocated: bool = False


@dataclass
class Decision:
    """One step of the allocator, for tracing: kind is 'alloc', 'inplace' or 'free'."""
    kind: str
    tensor: Tensor
    buffer_id: int
    chunk: int
    offset: int
    size: int
    parent: Tensor | None = None
    node: int = -1  # the node being processed when it happened (-1: leafs and inputs, before any node)


@dataclass
class AllocPlan:
    """What ggml_gallocr_reserve decided: where each tensor the allocator owns lives,
    tensor -> (buffer_id, chunk, offset)."""
    addresses: dict[Tensor, tuple[int, int, int]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    chunk_sizes: list[list[int]] = field(default_factory=list)  # per buffer, each chunk's max_size


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and list(a.ne) == list(b.ne) and list(a.nb) == list(b.nb)


class GraphAllocator:
    """ggml_gallocr's planning state: one dynamic allocator per distinct buffer type."""

    def __init__(self, bufts: list) -> None:
        self.bufts = list(bufts)
        self.tallocs: list[DynAllocator] = []
        for i, b in enumerate(self.bufts):
            shared = next((self.tallocs[j] for j in range(i) if self.bufts[j] is b), None)
            self.tallocs.append(shared or DynAllocator(b.alignment, b.max_size))
        self.buffers: list[list | None] = [None] * len(self.bufts)  # per buffer id: one buffer per chunk
        self.node_allocs: list[tuple[TensorAlloc, tuple[TensorAlloc, ...]]] = []
        self.leaf_allocs: list[TensorAlloc] = []
        self.plan: AllocPlan | None = None

    # -- the pass over the graph --
    def _hn(self, t: Tensor) -> _HashNode:
        hn = self._hash.get(t)
        if hn is None:
            hn = self._hash[t] = _HashNode()
        return hn

    def _is_own(self, t: Tensor) -> bool:
        return self._hn(t).allocated

    def _is_allocated(self, t: Tensor) -> bool:
        return t.data is not None or be.buffer_field(t) != 0 or self._is_own(t)

    def _free_extra(self, node: Tensor, parent: Tensor) -> None:
        hn, p_hn = self._hn(node), self._hn(parent)
        parent_size = self.bufts[p_hn.buffer_id].alloc_size(parent)
        node_size = self.bufts[hn.buffer_id].alloc_size(node)
        ggml_assert(parent_size >= node_size, "parent_size >= node_size", "ggml_gallocr_free_extra_space")
        alloc = self.tallocs[p_hn.buffer_id]
        parent_size, node_size = padded(parent_size, alloc.alignment), padded(node_size, alloc.alignment)
        if parent_size > node_size:
            alloc.free_bytes((p_hn.addr[0], p_hn.addr[1] + node_size), parent_size - node_size)

    def _allocate(self, node: Tensor, buffer_id: int) -> None:
        hn = self._hn(node)
        if self._is_allocated(node) or node.view_src is not None:
            return
        hn.allocated = True
        if ggml_op_can_inplace(node.op):
            for parent in node.src:
                if parent is None or not self._is_own(parent):
                    continue
                if parent.flags & GGML_TENSOR_FLAG_OUTPUT or (
                        parent.view_src is not None and parent.view_src.flags & GGML_TENSOR_FLAG_OUTPUT):
                    continue
                if not _same_layout(node, parent):
                    continue
                p_hn = self._hn(parent)
                if p_hn.n_children != 1 or p_hn.n_views != 0:
                    continue
                if parent.view_src is not None:
                    vs = parent.view_src
                    vs_hn = self._hn(vs)
                    if not (vs_hn.n_views == 1 and vs_hn.n_children == 0 and vs.data == parent.data):
                        continue
                    hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
                    p_hn.allocated = vs_hn.allocated = False
                    self._record("inplace", node, hn, vs)
                    self._free_extra(node, vs)
                    return
                hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
                p_hn.allocated = False
                self._record("inplace", node, hn, parent)
                self._free_extra(node, parent)
                return
        hn.buffer_id = buffer_id
        hn.addr = self.tallocs[buffer_id].alloc(self.bufts[buffer_id].alloc_size(node))
        self._record("alloc", node, hn)

    def _record(self, kind: str, t: Tensor, hn: _HashNode, parent: Tensor | None = None) -> None:
        self._decisions.append(Decision(kind, t, hn.buffer_id, hn.addr[0], hn.addr[1],
                                        self.bufts[hn.buffer_id].alloc_size(t), parent, self._node_i))

    def _free(self, node: Tensor) -> None:
        if node.flags & GGML_TENSOR_FLAG_OUTPUT:
            return
        hn = self._hn(node)
        self._record("free", node, hn)
        self.tallocs[hn.buffer_id].free_bytes(hn.addr, self.bufts[hn.buffer_id].alloc_size(node))
        hn.allocated = False

    def _pass(self, graph, node_buffer_ids, leaf_buffer_ids) -> None:
        self._hash: dict[Tensor, _HashNode] = {}
        self._decisions: list[Decision] = []
        self._node_i = -1
        nid = (lambda i: node_buffer_ids[i]) if node_buffer_ids else (lambda i: 0)
        lid = (lambda i: leaf_buffer_ids[i]) if leaf_buffer_ids else (lambda i: 0)
        nodes, leafs = graph.nodes, graph.leafs
        for i, leaf in enumerate(leafs):
            self._allocate(leaf, lid(i))
        for i, node in enumerate(nodes):
            if node.view_src is not None and node.op != GGMLOp.NONE:
                self._hn(node.view_src).n_views += 1
            if node.flags & GGML_TENSOR_FLAG_INPUT:
                self._allocate(node, nid(i))
            for src in node.src:
                if src is None:
                    continue
                self._hn(src).n_children += 1
                if src.flags & GGML_TENSOR_FLAG_INPUT:
                    self._allocate(src, nid(i))
        for i, node in enumerate(nodes):
            self._node_i = i
            for parent in node.src:
                if parent is not None:
                    self._allocate(parent, nid(i))
            self._allocate(node, nid(i))
            for parent in node.src:
                if parent is None:
                    continue
                p_hn = self._hn(parent)
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    if parent.view_src is not None:
                        vs = parent.view_src
                        vs_hn = self._hn(vs)
                        vs_hn.n_views -= 1
                        if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                            self._free(vs)
                    elif p_hn.allocated:
                        self._free(parent)

    def _tensor_alloc(self, t: Tensor | None) -> TensorAlloc:
        if t is None or t.view_src is not None or t.data is not None:
            return NO_ALLOC
        hn = self._hn(t)
        return TensorAlloc(hn.buffer_id, hn.addr[0], hn.addr[1], self.bufts[hn.buffer_id].alloc_size(t))

    def reserve(self, graph, node_buffer_ids=None, leaf_buffer_ids=None, no_alloc: bool = False) -> AllocPlan:
        """ggml_gallocr_reserve_n: plan the graph, remember each node's and leaf's place by index,
        and reallocate each buffer whose chunks must grow (with no_alloc: forget it instead)."""
        for t in self.tallocs:
            t.reset()
        self._pass(graph, node_buffer_ids, leaf_buffer_ids)
        nodes, leafs = graph.nodes, graph.leafs
        self.node_allocs = [(self._tensor_alloc(n), tuple(self._tensor_alloc(s) for s in n.src)) for n in nodes]
        self.leaf_allocs = [self._tensor_alloc(leaf) for leaf in leafs]
        for i, talloc in enumerate(self.tallocs):
            shared = next((j for j in range(i) if self.tallocs[j] is talloc), None)
            if shared is not None:
                self.buffers[i] = self.buffers[shared]
            cur = self.buffers[i]
            new = [c.max_size for c in talloc.chunks]
            grow = cur is None or any(s > (cur[c].size if c < len(cur) else 0) for c, s in enumerate(new))
            if grow:
                for buf in cur or []:
                    be.ggml_backend_buffer_free(buf)
                self.buffers[i] = None if no_alloc else self._vbuffer(self.bufts[i], new)
        plan = AllocPlan(decisions=self._decisions)
        for t in list(leafs) + list(nodes) + [s for n in nodes for s in n.src if s is not None]:
            if t.view_src is None and t.data is None and t in self._hash and t not in plan.addresses:
                if be.buffer_field(t) == 0:
                    hn = self._hash[t]
                    plan.addresses[t] = (hn.buffer_id, hn.addr[0], hn.addr[1])
        plan.chunk_sizes = [[c.max_size for c in t.chunks] for t in self.tallocs]
        self.plan = plan
        return plan

    @staticmethod
    def _vbuffer(buft, chunk_sizes: list[int]) -> list:
        """ggml_vbuffer_alloc: one backend buffer per chunk, for compute."""
        bufs = [be.ggml_backend_buft_alloc_buffer(buft, size) for size in chunk_sizes]
        for buf in bufs:
            be.ggml_backend_buffer_set_usage(buf, be.GGML_BACKEND_BUFFER_USAGE_COMPUTE)
        return bufs

    def _fits(self, t: Tensor, ta: TensorAlloc) -> bool:
        """ggml_gallocr_node_needs_realloc (true when the remembered place still holds t)."""
        size = 0
        if t.data is None and t.view_src is None:
            if ta.buffer_id < 0:
                return False
            size = self.bufts[ta.buffer_id].alloc_size(t)
        return ta.size_max >= size

    def needs_realloc(self, graph) -> bool:
        nodes = graph.nodes
        if len(nodes) != len(self.node_allocs) or len(graph.leafs) != len(self.leaf_allocs):
            return True
        for node, (dst, srcs) in zip(nodes, self.node_allocs):
            if not self._fits(node, dst):
                return True
            if any(s is not None and not self._fits(s, sa) for s, sa in zip(node.src, srcs)):
                return True
        return False

    def init_tensor(self, t: Tensor, ta: TensorAlloc) -> None:
        """ggml_gallocr_init_tensor: a view takes its view_src's buffer; a tensor without data
        takes its remembered place."""
        if t.view_src is not None:
            if be.buffer_field(t) == 0 and be.buffer_field(t.view_src) != 0:
                be.ggml_backend_view_init(t)
        elif t.data is None:
            chunks = self.buffers[ta.buffer_id]
            assert chunks is not None  # (the buffers are made before a graph is placed in them)
            buf = chunks[ta.chunk]
            be.ggml_backend_tensor_alloc(buf, t, buf.base + ta.offset)


@dataclass(frozen=True, slots=True)
class Bar(Generic[T]):
    """One tensor's bytes in a compute buffer over time: [offset, offset + size) of (buffer_id,
    chunk) from node `start` (-1: before the first node) through node `end` (the last node that
    needs them; n_nodes - 1 when they are never freed). `reuses`: the tensor whose bytes it took
    over in place."""
    tensor: T
    buffer_id: int
    chunk: int
    offset: int
    size: int
    start: int
    end: int
    reuses: T | None = None


def memory_plan(plan: AllocPlan | list[AllocDecision], n_nodes: int) -> list[Bar]:
    """The plan as bars, one per tensor the allocator placed: what a memory-plan picture draws
    (x: node order, y: offset). `plan` is an AllocPlan or its decisions as recorded in a trace
    (engine.trace.steps.AllocDecision: tensors by reference); the bars then name tensors the same way."""
    decisions = plan.decisions if isinstance(plan, AllocPlan) else plan
    open_: dict = {}
    bars: list[Bar] = []

    def close(t, end: int) -> None:
        d = open_.pop(t, None)
        if d is not None:
            bars.append(Bar(d.tensor, d.buffer_id, d.chunk, d.offset, d.size, d.node, end,
                            d.parent if d.kind == "inplace" else None))
    for d in decisions:
        if d.kind == "free":
            close(d.tensor, d.node)
        else:
            if d.kind == "inplace" and d.parent is not None:
                close(d.parent, d.node)
            open_[d.tensor] = d
    for t in list(open_):
        close(t, n_nodes - 1)
    return sorted(bars, key=lambda b: (b.buffer_id, b.chunk, b.start, b.offset))


def plan_peak(bars: list[Bar], n_nodes: int) -> tuple[int, int]:
    """(node, bytes): the first node at which the highest byte in use is highest. One sweep over
    the nodes: the bars that have started, the highest on top of a heap, those ended taken off
    as they surface."""
    best = (-1, 0)
    order = sorted(bars, key=lambda b: b.start)
    alive: list[tuple[int, int]] = []  # (-top, last node)
    j = 0
    for i in range(-1, n_nodes):
        while j < len(order) and order[j].start <= i:
            heapq.heappush(alive, (-(order[j].offset + order[j].size), order[j].end))
            j += 1
        while alive and alive[0][1] < i:
            heapq.heappop(alive)
        top = -alive[0][0] if alive else 0
        if top > best[1]:
            best = (i, top)
    return best


@dataclass(frozen=True, slots=True)
class TensorAlloc:
    """Where the plan put one tensor (struct tensor_alloc): size_max 0 = pre-allocated or a view."""
    buffer_id: int
    chunk: int
    offset: int
    size_max: int


NO_ALLOC = TensorAlloc(-1, -1, SIZE_MAX, 0)


@writes()
def ggml_gallocr_new_n(bufts: list) -> GraphAllocator:
    return GraphAllocator(bufts)


@writes()
def ggml_gallocr_new(buft=CPU_BUFT) -> GraphAllocator:
    return GraphAllocator([buft])


@writes()
def ggml_gallocr_reserve_n(galloc: GraphAllocator, graph, node_buffer_ids, leaf_buffer_ids) -> bool:
    galloc.reserve(graph, node_buffer_ids, leaf_buffer_ids)
    return True


@writes()
def ggml_gallocr_reserve(galloc: GraphAllocator, graph) -> bool:
    return ggml_gallocr_reserve_n(galloc, graph, None, None)


@writes()
def ggml_gallocr_reserve_n_size(galloc: GraphAllocator, graph, node_buffer_ids, leaf_buffer_ids) -> list[int]:
    """The size each buffer would need for this graph (the sum of its chunks' high-water marks);
    no buffer is allocated."""
    galloc.reserve(graph, node_buffer_ids, leaf_buffer_ids, no_alloc=True)
    return [sum(c.max_size for c in t.chunks) for t in galloc.tallocs]


@query
def ggml_gallocr_get_buffer_size(galloc: GraphAllocator, buffer_id: int) -> int:
    ggml_assert(0 <= buffer_id < len(galloc.bufts), "buffer_id >= 0 && buffer_id < galloc->n_buffers",
                "ggml_gallocr_get_buffer_size")
    bufs = galloc.buffers[buffer_id]
    if bufs is None:
        return 0
    if any(galloc.buffers[j] is bufs for j in range(buffer_id)):
        return 0  # shared with an earlier id (the same buffer type twice): counted there
    return sum(b.size for b in bufs)


@writes(Writes.PLACES)
def ggml_gallocr_alloc_graph(galloc: GraphAllocator, graph) -> bool:
    """Write `buffer` and `data` into the graph's tensors from the reserved plan. When the graph
    no longer fits the plan, a single-buffer gallocr reserves again; one with several buffers
    returns False (the caller must reserve with the buffer ids, as the scheduler does)."""
    if galloc.needs_realloc(graph):
        if len(galloc.bufts) != 1:
            return False
        galloc.reserve(graph)
    for bufs in galloc.buffers:
        for buf in bufs or []:
            be.ggml_backend_buffer_reset(buf)
    for leaf, ta in zip(graph.leafs, galloc.leaf_allocs):
        galloc.init_tensor(leaf, ta)
    for node, (dst, srcs) in zip(graph.nodes, galloc.node_allocs):
        for s, sa in zip(node.src, srcs):
            if s is not None:
                galloc.init_tensor(s, sa)
        galloc.init_tensor(node, dst)
    return True


@writes()
def ggml_gallocr_free(galloc: GraphAllocator | None) -> None:
    if galloc is None:
        return
    for i, bufs in enumerate(galloc.buffers):
        if bufs is not None and not any(galloc.buffers[j] is bufs for j in range(i)):
            for b in bufs:
                be.ggml_backend_buffer_free(b)
    galloc.buffers = [None] * len(galloc.bufts)
