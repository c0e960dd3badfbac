"""What a debugger lists of a context or a graph, read in bulk from the pool.

Not a ggml API: ggml walks `ggml_get_first_tensor` / `ggml_get_next_tensor` and reads each struct.
A debugger showing a pool of a thousand tensors at every step wants them in one gather instead, so
`tensor_infos` reads every tensor struct of a context at once (with `ggml_nbytes` computed over
the whole array: a test checks it against `ggml_nbytes` on every tensor of every walkthrough), and
`graph_edges` lists a graph's src links as addresses, without making a handle per tensor;
`layout_digest` and `graph_digest` tell whether two states of a pool hold the same
objects, or of a graph draw the same; `layer_of` and `graph_layers` say which transformer layer a
tensor belongs to (the recorder's step marks, the DAG's folded layers and the GGUF tensor table
all ask them).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from engine.core.context import GGML_OBJECT_TYPE_TENSOR, Context
from engine.core.graph import Graph
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, TENSOR
from engine.core.types import TYPE_TRAITS

_BLCK = np.array([tr.blck_size or 1 for tr in TYPE_TRAITS], dtype=np.int64)
_TSIZE = np.array([tr.type_size for tr in TYPE_TRAITS], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor struct of a context, as plain values."""

    offs: int  # offset of the struct in the pool
    address: int  # the struct's (simulated) address
    name: str
    type: int  # ggml_type
    ne: tuple[int, int, int, int]
    op: int  # ggml_op
    flags: int  # GGML_TENSOR_FLAG_*
    view_src: int  # address of the viewed tensor, 0 for none
    data: int  # address, 0 for NULL
    nbytes: int  # ggml_nbytes

    @property
    def is_view(self) -> bool:
        return self.view_src != 0


def tensor_infos(ctx: Context) -> list[TensorInfo]:
    """Every tensor of ctx in object order (one gather of the structs, ggml_nbytes vectorised)."""
    offsets = [offs for _, offs, _, type_, _ in ctx.headers() if type_ == GGML_OBJECT_TYPE_TENSOR]
    if not offsets:
        return []
    offs = np.asarray(offsets, dtype=np.int64)
    recs = ctx.pool[offs[:, None] + np.arange(GGML_TENSOR_SIZE)].view(TENSOR)[:, 0]
    types = recs["type"].astype(np.int64)
    ne = recs["ne"].astype(np.int64)
    nb = recs["nb"].astype(np.int64)
    blck, tsize = _BLCK[types], _TSIZE[types]
    # ggml_nbytes: the first dimension's span (whole blocks for a quantized type), then
    # (ne[i] - 1) * nb[i] for the others; 0 when a dimension is empty
    spans = ((ne[:, 1:] - 1) * nb[:, 1:]).sum(axis=1)
    first = np.where(blck == 1, tsize + (ne[:, 0] - 1) * nb[:, 0], ne[:, 0] * nb[:, 0] // blck)
    nbytes = np.where((ne <= 0).any(axis=1), 0, first + spans)
    # the fields as Python values in one conversion each, not a numpy scalar per field per tensor
    # (a name's bytes after its first NUL are what an earlier, longer name left there)
    names = [n.split(b"\0", 1)[0].decode("utf-8", "replace") for n in recs["name"].tolist()]
    return [TensorInfo(o, ctx.base + o, *fields) for o, fields in zip(offsets, zip(
        names, types.tolist(), map(tuple, ne.tolist()), recs["op"].tolist(), recs["flags"].tolist(),
        recs["view_src"].tolist(), recs["data"].tolist(), nbytes.tolist()))]


def _structs(pool: np.ndarray, offsets: list[int]) -> bytes:
    """The tensor structs at these offsets of a pool, gathered."""
    return pool[np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(GGML_TENSOR_SIZE)].tobytes()


def layout_digest(ctx: Context) -> bytes:
    """A digest of ctx's object headers and tensor structs, not of any data: two states of a
    pool with the same digest hold the same objects and tensors (names, shapes, pointers)."""
    objs = list(ctx.objects())
    h = hashlib.blake2b(digest_size=16)
    if objs:
        headers = np.asarray([o.header for o in objs], dtype=np.int64)
        h.update(ctx.pool[headers[:, None] + np.arange(GGML_OBJECT_SIZE)].tobytes())
    structs = [o.offs for o in objs if o.type == GGML_OBJECT_TYPE_TENSOR]
    if structs:
        h.update(_structs(ctx.pool, structs))
    return h.digest()


def graph_digest(g: Graph) -> bytes:
    """A digest of what a drawing of g reads (ggml_graph_dump_dot): its nodes and leafs in order,
    each one's address and struct (name, op, shape, sources), and its gradients' slots."""
    h = hashlib.blake2b(digest_size=16)
    tensors = g.nodes + g.leafs
    h.update(np.asarray([g.n_nodes, g.n_leafs], dtype=np.int64).tobytes())
    h.update(np.asarray([t.address for t in tensors], dtype=np.uint64).tobytes())
    for cid in sorted({t.ctx.id for t in tensors}):
        offsets = [t.offs for t in tensors if t.ctx.id == cid]
        h.update(_structs(next(t.ctx for t in tensors if t.ctx.id == cid).pool, offsets))
    grads = [table for table in (g.grad_addresses, g.grad_acc_addresses) if table is not None]
    if grads:  # found by their nodes' hash slots
        h.update(b"".join(a.tobytes() for a in (g.hash_keys, g.hash_used, *grads)))
    return h.digest()


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """node->src[slot] == src, as addresses."""

    src: int
    dst: int
    slot: int


def graph_edges(g: Graph) -> list[GraphEdge]:
    """The src links of a graph's nodes, in node order, then slot order."""
    return [GraphEdge(int(a), t.address, j) for t in g.nodes
            for j, a in enumerate(t._r["src"][0]) if a]


_BLK = re.compile(r"blk\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """N for a tensor named "blk.N.…" (GGUF's name for layer N's weights), else None."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def graph_layers(g: Graph) -> dict[int, int]:
    """The layer of each tensor of g that has one, by address: a "blk.N." weight is in layer N, a
    node in the highest layer among its sources (nodes come in dependency order, so their sources'
    layers are known first)."""
    out: dict[int, int] = {}
    for t in g.leafs + g.nodes:
        n = layer_of(t.name)
        if n is not None:
            out[t.address] = n
    srcs: dict[int, list[int]] = {}
    for e in graph_edges(g):
        srcs.setdefault(e.dst, []).append(e.src)
    for t in g.nodes:
        found = [out[a] for a in srcs.get(t.address, ()) if a in out]
        if found and t.address not in out:
            out[t.address] = max(found)
    return out
