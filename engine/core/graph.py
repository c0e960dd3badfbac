"""ggml_cgraph: the computation graph, laid out in the pool as ggml lays it out.

Mirrors ggml_new_graph_custom / ggml_graph_nbytes (one GRAPH object: the 96-byte struct, then the
nodes, leafs, use_counts, hash keys, optional grads and grad_accs, and the `used` bitset), the visited
hash set (keyed by tensor address >> 4, linear probing), ggml_visit_parents (post-order DFS, leaf vs
node, default names, use counts) under ggml_build_forward_expand and _select, the graph's accessors,
ggml_graph_view and ggml_graph_cpy, ggml_graph_get_grad and _grad_acc, ggml_graph_print and
ggml_graph_dump_dot.

The backward pass (ggml_build_backward_expand, which fills grads and grad_accs, and
ggml_graph_reset) is engine/autodiff.py's. Observers may watch ggml_build_forward_expand walk the
graph through `visit_hook` and `enter_hook`.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.core.api import Writes, query, writes
from engine.core.context import GGML_OBJECT_TYPE_GRAPH, Context, ggml_new_object
from engine.core.errors import ggml_assert, ggml_assert_not_null
from engine.core.layout import CGRAPH, GGML_MAX_SRC, GGML_MEM_ALIGN, GGML_OBJECT_SIZE, GGML_PAD, struct_at
from engine.core.optable import ggml_op_name, ggml_op_symbol
from engine.core.tensor import GGML_TENSOR_FLAG_COMPUTE, GGML_TENSOR_FLAG_PARAM, Tensor, ggml_format_name, \
    ggml_is_matrix, ggml_nelements
from engine.core.types import TYPE_TRAITS

GGML_DEFAULT_GRAPH_SIZE = 2048
GGML_HASHSET_FULL = (1 << 64) - 1
GGML_HASHSET_ALREADY_EXISTS = (1 << 64) - 2

# next primes after powers of two: ggml_hash_size picks the smallest one that fits
_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537,
           131101, 262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467,
           67108879, 134217757, 268435459, 536870923, 1073741827, 2147483659)


@query
def ggml_hash_size(min_sz: int) -> int:
    """ggml_hash_size: the smallest prime of ggml's table >= min_sz (or min_sz | 1 beyond it)."""
    i = bisect_left(_PRIMES, min_sz)
    return _PRIMES[i] if i < len(_PRIMES) else min_sz | 1


def _bitset_words(n: int) -> int:
    return (n + 31) // 32


def _graph_layout(size: int, grads: bool) -> tuple[dict[str, int], int]:
    """Offsets of the arrays after the struct, and ggml_graph_nbytes (each piece self-aligned)."""
    hash_size = ggml_hash_size(size * 2)
    pieces = [("nodes", size * 8, 8), ("leafs", size * 8, 8), ("use_counts", hash_size * 4, 4),
              ("hash_keys", hash_size * 8, 8)]
    if grads:
        pieces += [("grads", hash_size * 8, 8), ("grad_accs", hash_size * 8, 8)]
    pieces.append(("hash_used", _bitset_words(hash_size) * 4, 4))
    p, offsets = CGRAPH.itemsize, {}
    for name, nbytes, align in pieces:
        p = GGML_PAD(p, align)
        offsets[name] = p
        p += nbytes
    return offsets, p


@query
def ggml_graph_nbytes(size: int, grads: bool) -> int:
    """ggml_graph_nbytes: bytes of a graph of `size` nodes (struct and arrays)."""
    return _graph_layout(size, grads)[1]


@query
def ggml_graph_overhead_custom(size: int, grads: bool) -> int:
    """ggml_graph_overhead_custom: object header plus the padded graph."""
    return GGML_OBJECT_SIZE + GGML_PAD(ggml_graph_nbytes(size, grads), GGML_MEM_ALIGN)


@query
def ggml_graph_overhead() -> int:
    """ggml_graph_overhead: a default-sized graph (2048 nodes, no grads)."""
    return ggml_graph_overhead_custom(GGML_DEFAULT_GRAPH_SIZE, False)


class Graph:
    """struct ggml_cgraph *: a handle onto a cgraph struct (in a pool, or detached for views)."""

    __slots__ = ("ctx", "offs", "_r", "visit_hook", "enter_hook", "_views")

    def __init__(self, ctx: Context, r: np.ndarray, offs: int | None) -> None:
        self.ctx = ctx  # resolves the struct's pointers
        self.offs = offs  # payload offset in ctx.pool, None for a graph view (a struct by value)
        self._r = r
        # called as visit_hook(tensor, slot, is_leaf) for each newly visited tensor, and as
        # enter_hook(tensor) whenever the walk reaches a tensor (observers of the build)
        self.visit_hook: Callable[[Tensor, int, bool], None] | None = None
        self.enter_hook: Callable[[Tensor], None] | None = None
        # the arrays' views (their pointers never change) and the node and leaf handles, cached
        self._views: dict = {}

    def __repr__(self) -> str:
        return f"<ggml_cgraph size={self.size} n_nodes={self.n_nodes} n_leafs={self.n_leafs}>"

    def _field(self, name: str) -> int:
        return int(self._r[name][0])

    def _array(self, field: str, dtype: str, count: int) -> np.ndarray:
        key = (field, dtype, count)
        view = self._views.get(key)
        if view is None:
            ctx, off = self.ctx.space.resolve(self._field(field))
            view = self._views[key] = ctx.pool[off:off + count * np.dtype(dtype).itemsize].view(dtype)
        return view

    @property
    def address(self) -> int | None:
        return None if self.offs is None else self.ctx.base + self.offs

    size = property(lambda self: self._field("size"))
    n_nodes = property(lambda self: self._field("n_nodes"))
    n_leafs = property(lambda self: self._field("n_leafs"))
    hash_size = property(lambda self: self._field("hash_size"))
    order = property(lambda self: self._field("order"))

    @property
    def node_addresses(self) -> np.ndarray:
        return self._array("nodes", "<u8", max(self.size, self.n_nodes))

    @property
    def leaf_addresses(self) -> np.ndarray:
        return self._array("leafs", "<u8", self.size)

    @property
    def use_counts(self) -> np.ndarray:
        return self._array("use_counts", "<i4", self.hash_size)

    @property
    def hash_keys(self) -> np.ndarray:
        return self._array("hash_keys", "<u8", self.hash_size)

    @property
    def grad_addresses(self) -> np.ndarray | None:
        """cgraph->grads (one slot per hash slot), None for a graph without gradients."""
        return self._array("grads", "<u8", self.hash_size) if self._field("grads") else None

    @property
    def grad_acc_addresses(self) -> np.ndarray | None:
        """cgraph->grad_accs, None for a graph without gradients."""
        return self._array("grad_accs", "<u8", self.hash_size) if self._field("grad_accs") \
            else None

    @property
    def grad_tables(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(cgraph->grads, cgraph->grad_accs), None for a graph without gradients (ggml allocates
        both or neither)."""
        grads, accs = self.grad_addresses, self.grad_acc_addresses
        return None if grads is None or accs is None else (grads, accs)

    @property
    def hash_used(self) -> np.ndarray:
        return self._array("hash_used", "<u4", _bitset_words(self.hash_size))

    def tensor(self, address: int) -> Tensor:
        ctx, off = self.ctx.space.resolve(address)
        return Tensor(ctx, off)

    @property
    def nodes(self) -> list[Tensor]:
        return self._handles("nodes", self.node_addresses[:self.n_nodes])

    @property
    def leafs(self) -> list[Tensor]:
        return self._handles("leafs", self.leaf_addresses[:self.n_leafs])

    def _handles(self, which: str, addresses: np.ndarray) -> list[Tensor]:
        """Tensor handles for the pointer array, made again only when its pointers changed."""
        key = addresses.tobytes()
        hit = self._views.get(which)
        if hit is None or hit[0] != key:
            hit = self._views[which] = (key, [self.tensor(int(a)) for a in addresses])
        return list(hit[1])

    # --- the visited hash set ---------------------------------------------------------------
    def is_used(self, slot: int) -> bool:
        return bool(self.hash_used[slot >> 5] & (1 << (slot & 31)))

    def hash_find(self, t: Tensor) -> int:
        """ggml_hash_find: t's slot, or the first free slot on its probe path, or FULL."""
        size = self.hash_size
        used, keys = self.hash_used, self.hash_keys
        key = t.address
        h = (key >> 4) % size
        i = h
        while used[i >> 5] & (1 << (i & 31)) and int(keys[i]) != key:
            i = (i + 1) % size
            if i == h:
                return GGML_HASHSET_FULL
        return i

    def hash_insert(self, t: Tensor) -> int:
        """ggml_hash_insert: ALREADY_EXISTS if present, else the new slot (asserting not full)."""
        i = self.hash_find(t)
        ggml_assert(i != GGML_HASHSET_FULL, "i != GGML_HASHSET_FULL", "ggml_hash_insert")
        if self.is_used(i):
            return GGML_HASHSET_ALREADY_EXISTS
        self.hash_keys[i] = t.address
        self.hash_used[i >> 5] |= np.uint32(1 << (i & 31))
        return i

    def slot_of(self, t: Tensor) -> int | None:
        i = self.hash_find(t)
        return i if i != GGML_HASHSET_FULL and self.is_used(i) else None

    def use_count(self, t: Tensor) -> int:
        slot = self.slot_of(t)
        return 0 if slot is None else int(self.use_counts[slot])


@writes()
def ggml_new_graph_custom(ctx: Context, size: int, grads: bool) -> Graph:
    """ggml_new_graph_custom: one GRAPH object holding the struct and all its arrays."""
    offsets, nbytes = _graph_layout(size, grads)
    offs = ggml_new_object(ctx, GGML_OBJECT_TYPE_GRAPH, nbytes)
    r = struct_at(ctx.pool, offs, CGRAPH)
    hash_size = ggml_hash_size(size * 2)
    ctx.pool[offs:offs + CGRAPH.itemsize] = 0
    r["size"] = size
    for name in ("nodes", "leafs", "use_counts", "hash_keys", "hash_used"):
        r[name] = ctx.address(offs + offsets[name])
    if grads:
        for name in ("grads", "grad_accs"):
            r[name] = ctx.address(offs + offsets[name])
            ctx.pool[offs + offsets[name]:offs + offsets[name] + hash_size * 8] = 0
    r["hash_size"] = hash_size
    used = offs + offsets["hash_used"]
    ctx.pool[used:used + _bitset_words(hash_size) * 4] = 0
    return Graph(ctx, r, offs)


@writes()
def ggml_new_graph(ctx: Context) -> Graph:
    """ggml_new_graph: a graph of GGML_DEFAULT_GRAPH_SIZE (2048) nodes without gradients."""
    return ggml_new_graph_custom(ctx, GGML_DEFAULT_GRAPH_SIZE, False)


def _visit_parents(g: Graph, node: Tensor, compute: bool) -> int:
    """ggml_visit_parents_graph: post-order DFS; returns node's hash slot.

    Written as generators driven by an explicit stack: ggml recurses in C, but a graph thousands of
    nodes deep would exhaust Python's recursion limit. Each `yield (src, compute)` is a recursive
    call, and the value sent back is that call's result.
    """
    stack = [_visit(g, node, compute)]
    result = None
    while stack:
        try:
            child = stack[-1].send(result)
        except StopIteration as done:
            stack.pop()
            result = done.value
        else:
            stack.append(_visit(g, *child))
            result = None
    assert result is not None  # the first visit's slot
    return result


def _visit(g: Graph, node: Tensor, compute: bool):
    if g.enter_hook is not None:
        g.enter_hook(node)
    if node.op != 0 and compute:
        node.flags |= GGML_TENSOR_FLAG_COMPUTE
    slot = g.hash_find(node)
    ggml_assert(slot != GGML_HASHSET_FULL, "node_hash_pos != GGML_HASHSET_FULL", "ggml_visit_parents")

    srcs = node.sources()  # (the walk writes no src pointer: read once)
    if g.is_used(slot):  # already visited: only propagate the compute flag
        if compute:
            for src in srcs:
                if src is not None and not src.flags & GGML_TENSOR_FLAG_COMPUTE:
                    yield src, True
        return slot

    g.hash_keys[slot] = node.address
    g.hash_used[slot >> 5] |= np.uint32(1 << (slot & 31))
    g.use_counts[slot] = 0

    order = range(GGML_MAX_SRC) if g.order != 1 else range(GGML_MAX_SRC - 1, -1, -1)
    for k in order:
        src = srcs[k]
        if src is not None:
            src_slot = yield src, compute
            g.use_counts[src_slot] += 1

    is_leaf = node.op == 0 and not node.flags & GGML_TENSOR_FLAG_PARAM
    kind, count, array = ("leaf", "n_leafs", g.leaf_addresses) if is_leaf else \
        ("node", "n_nodes", g.node_addresses)
    n = g._field(count)
    ggml_assert(n < g.size, f"cgraph->{count} < cgraph->size", "ggml_visit_parents",
                f"the graph holds {g.size} {kind}s; use ggml_new_graph_custom with a larger size")
    if not node.name_bytes:
        ggml_format_name(node, f"{kind}_%d", n)
    array[n] = node.address
    g._r[count] = n + 1
    if g.visit_hook is not None:
        g.visit_hook(node, slot, is_leaf)
    return slot


def _build_forward(g: Graph, t: Tensor, compute: bool) -> None:
    n_old = g.n_nodes
    _visit_parents(g, t, compute)
    if g.n_nodes - n_old > 0:
        ggml_assert(int(g.node_addresses[g.n_nodes - 1]) == t.address,
                    "cgraph->nodes[cgraph->n_nodes - 1] == tensor", "ggml_build_forward_expand")


@writes(Writes.WALK)
def ggml_build_forward_expand(g: Graph, t: Tensor) -> None:
    """ggml_build_forward_expand: add t and everything it depends on, in dependency order."""
    _build_forward(g, t, True)


@writes(Writes.WALK)
def ggml_build_forward_select(g: Graph, tensors: list[Tensor], idx: int) -> Tensor:
    """ggml_build_forward_select: build all tensors, marking only tensors[idx] for compute."""
    ggml_assert(0 <= idx < len(tensors), "idx >= 0 && idx < n_tensors", "ggml_build_forward_select")
    for i, t in enumerate(tensors):
        _build_forward(g, t, i == idx)
    return tensors[idx]


@query
def ggml_graph_size(g: Graph) -> int:
    """ggml_graph_size."""
    return g.size


@query
def ggml_graph_n_nodes(g: Graph) -> int:
    """ggml_graph_n_nodes."""
    return g.n_nodes


@query
def ggml_graph_node(g: Graph, i: int) -> Tensor:
    """ggml_graph_node: the i-th node; negative i counts from the end (-1 is the last)."""
    if i < 0:
        ggml_assert(g.n_nodes + i >= 0, "cgraph->n_nodes + i >= 0", "ggml_graph_node")
        return g.tensor(int(g.node_addresses[g.n_nodes + i]))
    ggml_assert(i < g.n_nodes, "i < cgraph->n_nodes", "ggml_graph_node")
    return g.tensor(int(g.node_addresses[i]))


@writes()
def ggml_graph_add_node(g: Graph, t: Tensor) -> None:
    """ggml_graph_add_node: append a node without hashing it."""
    ggml_assert(g.size > g.n_nodes, "cgraph->size > cgraph->n_nodes", "ggml_graph_add_node")
    g.node_addresses[g.n_nodes] = t.address
    g._r["n_nodes"] = g.n_nodes + 1


@query
def ggml_graph_get_tensor(g: Graph, name: str) -> Tensor | None:
    """ggml_graph_get_tensor: search the leafs, then the nodes, by name."""
    return next((t for t in g.leafs + g.nodes if t.name == name), None)


@writes()
def ggml_graph_clear(g: Graph) -> None:
    """ggml_graph_clear: forget all nodes and leafs and empty the hash set."""
    g._r["n_nodes"] = 0
    g._r["n_leafs"] = 0
    g.hash_used[:] = 0


@writes()
def ggml_graph_view(g: Graph, i0: int, i1: int) -> Graph:
    """ggml_graph_view: nodes [i0, i1) of g, as a struct by value (not in any pool)."""
    r = np.zeros(1, dtype=CGRAPH)
    r["n_nodes"] = i1 - i0
    r["nodes"] = g._field("nodes") + 8 * i0
    for name in ("use_counts", "hash_size", "hash_used", "hash_keys", "order"):
        r[name] = g._field(name)
    view = Graph(g.ctx, r, None)
    return view


@writes()
def ggml_graph_cpy(src: Graph, dst: Graph) -> None:
    """ggml_graph_cpy: copy nodes, leafs and the hash set (re-hashed for dst's size)."""
    ggml_assert(dst.size >= src.n_leafs, "dst->size >= src->n_leafs", "ggml_graph_cpy")
    ggml_assert(dst.size >= src.n_nodes, "dst->size >= src->n_nodes", "ggml_graph_cpy")
    ggml_assert(dst.hash_size >= src.hash_size,
                "dst->visited_hash_set.size >= src->visited_hash_set.size", "ggml_graph_cpy")
    for name in ("n_leafs", "n_nodes", "order"):
        dst._r[name] = src._field(name)
    dst.leaf_addresses[:src.n_leafs] = src.leaf_addresses[:src.n_leafs]
    dst.node_addresses[:src.n_nodes] = src.node_addresses[:src.n_nodes]
    keys, counts = src.hash_keys, src.use_counts
    for i in range(src.hash_size):
        if src.is_used(i):
            slot = dst.hash_insert(src.tensor(int(keys[i])))
            if slot != GGML_HASHSET_ALREADY_EXISTS:
                dst.use_counts[slot] = counts[i]
    dst_tables, src_tables = dst.grad_tables, src.grad_tables
    if dst_tables is not None:
        for table in dst_tables:
            table[:] = 0
    if src_tables is not None:
        fn = "ggml_graph_cpy"
        dst_grads, dst_accs = ggml_assert_not_null(dst_tables, "dst->grads != NULL", fn)
        src_grads, src_accs = src_tables
        for node in src.nodes:  # dst's nodes are src's
            i_src, i_dst = src.slot_of(node), dst.slot_of(node)
            ggml_assert(i_src is not None, "ggml_bitset_get(src->visited_hash_set.used, igrad_src)",
                        fn)
            ggml_assert(i_dst is not None, "ggml_bitset_get(dst->visited_hash_set.used, igrad_dst)",
                        fn)
            dst_grads[i_dst] = src_grads[i_src]
            dst_accs[i_dst] = src_accs[i_src]


@query
def ggml_graph_print(g: Graph) -> str:
    """ggml_graph_print: the node and leaf lists (returned, and printed)."""
    lines = ["=== GRAPH ===", f"n_nodes = {g.n_nodes}"]
    for i, n in enumerate(g.nodes):
        ne = [int(x) for x in n.ne]
        mark = "x" if n.flags & GGML_TENSOR_FLAG_PARAM else " "
        lines.append(f" - {i:3d}: [ {ne[0]:5d}, {ne[1]:5d}, {ne[2]:5d}] {ggml_op_name(n.op):>16s} {mark}")
    lines.append(f"n_leafs = {g.n_leafs}")
    for i, n in enumerate(g.leafs):
        ne = [int(x) for x in n.ne]
        lines.append(f" - {i:3d}: [ {ne[0]:5d}, {ne[1]:5d}] {ggml_op_name(n.op):>8s} {n.name:>16s}")
    lines.append("=" * 40)
    text = "\n".join(lines)
    print(text)
    return text


def _by_slot(g: Graph, node: Tensor, table: np.ndarray | None) -> Tensor | None:
    """The tensor a per-hash-slot table (grads, grad_accs) holds for node, or None."""
    if table is None:  # a graph without gradients
        return None
    slot = g.slot_of(node)
    if slot is None or not int(table[slot]):
        return None
    return g.tensor(int(table[slot]))


@query
def ggml_graph_get_grad(g: Graph, node: Tensor) -> Tensor | None:
    """ggml_graph_get_grad: the gradient recorded for node, or None."""
    return _by_slot(g, node, g.grad_addresses)


@query
def ggml_graph_get_grad_acc(g: Graph, node: Tensor) -> Tensor | None:
    """ggml_graph_get_grad_acc: the gradient accumulator of node, or None."""
    return _by_slot(g, node, g.grad_acc_addresses)


@dataclass(frozen=True, slots=True)
class DotStyle:
    """How a caller (a debugger) decorates one tensor in ggml_graph_dump_dot's output."""

    attrs: str = ""  # DOT attributes added to the tensor's node: 'id = "t1"; URL = "?t=1"'
    fold: str | None = None  # the id of a node declared in `extra` drawn instead of this tensor


def _dot_escape(s: str) -> str:
    """A name made safe inside a DOT record label."""
    for ch in '\\"{}<>|':
        s = s.replace(ch, "\\" + ch)
    return s


@query
def ggml_graph_dump_dot(gb: Graph, cgraph: Graph | None = None, filename: str | None = None,
                        decorate: Callable[[Tensor], DotStyle | None] | None = None,
                        extra: tuple[str, ...] = ()) -> str:
    """ggml_graph_dump_dot: the graph in graphviz DOT, as ggml writes it; also to `filename`.

    With gradients, a node that is some node's gradient is drawn as that node (dashed edges),
    a node with a gradient is green (lightblue if it is not in `cgraph`) and shows its
    gradient's op; parameters are yellow, other nodes white.

    Not in ggml: `decorate(t)` may add attributes to a tensor's node (links, ids) or fold it
    into a node of the caller's own, declared among the `extra` statements that follow the
    header; edges into, out of and inside a fold are drawn once. When decorating, tensor names
    are escaped for graphviz's record labels (ggml writes them as they are; its op symbols are
    escaped already).
    """
    p = lambda t: f"{t.address:#x}"  # noqa: E731 - C's %p
    esc = _dot_escape if decorate else (lambda s: s)
    grads = {n.address: ggml_graph_get_grad(gb, n) for n in gb.nodes}
    parent: dict[int, Tensor] = {}  # ggml_graph_get_parent: the first node a tensor is grad of
    for n in gb.nodes:
        g = grads[n.address]
        if g is not None:
            parent.setdefault(g.address, n)
    in_cgraph = None if cgraph is None else {n.address for n in cgraph.nodes}
    out = ["digraph G {", "  newrank = true;", "  rankdir = TB;", *extra]
    styles = {t.address: decorate(t) if decorate else None for t in gb.nodes + gb.leafs}
    drawn = {a: st.fold if st is not None and st.fold else f"{a:#x}"  # the DOT node it is drawn as
             for a, st in styles.items()}

    def attrs(t: Tensor) -> str:
        st = styles[t.address]
        return f"{st.attrs}; " if st is not None and st.attrs else ""

    for i, node in enumerate(gb.nodes):
        grad = grads[node.address]
        if node.address in parent or drawn[node.address] != p(node):
            continue
        if node.flags & GGML_TENSOR_FLAG_PARAM:
            color = "yellow"
        elif grad is not None:
            color = "green" if in_cgraph is None or node.address in in_cgraph else "lightblue"
        else:
            color = "white"
        label = f"{esc(node.name)} ({TYPE_TRAITS[node.type].type_name})|" if node.name_bytes \
            else f"({TYPE_TRAITS[node.type].type_name})|"
        ne = [int(x) for x in node.ne]
        shape = f"[{ne[0]}, {ne[1]}]" if ggml_is_matrix(node) else f"[{ne[0]}, {ne[1]}, {ne[2]}]"
        label += f"{i} {shape} | <x>{ggml_op_symbol(node.op)}"
        if grad is not None:
            label += f" | <g>{ggml_op_symbol(grad.op)}"
        out.append(f'  "{p(node)}" [ style = filled; fillcolor = {color}; shape = record; '
                   f'label="{label}"; {attrs(node)}]')
    for i, leaf in enumerate(gb.leafs):
        if drawn[leaf.address] != p(leaf):
            continue
        label = f"{esc(leaf.name)} ({TYPE_TRAITS[leaf.type].type_name})|" if leaf.name_bytes \
            else f"({TYPE_TRAITS[leaf.type].type_name})|"
        ne = [int(x) for x in leaf.ne]
        label += f"CONST {i} [{ne[0]}, {ne[1]}]"
        nel = ggml_nelements(leaf)
        if nel < 5 and leaf.data is not None:
            label += " | (" + ", ".join("#" for _ in range(nel)) + ")"
        out.append(f'  "{p(leaf)}" [ style = filled; fillcolor = pink; shape = record; '
                   f'label="<x>{label}"; {attrs(leaf)}]')
    seen: set[tuple[str, str, int]] = set()

    def ends(src: Tensor, dst: Tensor, j: int) -> tuple[str, str] | None:
        a, b = drawn.get(src.address, p(src)), drawn.get(dst.address, p(dst))
        if (a, b) != (p(src), p(dst)):  # folded: one edge per pair of boxes and slot
            if a == b or (a, b, j) in seen:
                return None
            seen.add((a, b, j))
        return a, b

    for node in gb.nodes:
        for j, src in enumerate(node.src):
            if src is not None:
                gp, gp0 = parent.get(node.address), parent.get(src.address)
                e = ends(gp0 or src, gp or node, j)
                if e is not None:
                    out.append(f'  "{e[0]}" -> "{e[1]}" [ arrowhead = '
                               f'{"empty" if gp else "vee"}; style = {"dashed" if gp else "solid"}; '
                               f'label = "src {j}"; ]')
    for leaf in gb.leafs:
        for j, src in enumerate(leaf.src):
            e = None if src is None else ends(src, leaf, j)
            if e is not None:
                out.append(f'  "{e[0]}" -> "{e[1]}" [ label = "src {j}"; ]')
    out.append("}")
    text = "\n".join(out) + "\n"
    if filename:
        with open(filename, "w") as f:
            f.write(text)
    return text
