"""What a debugger lists of a context or a graph, read in bulk from the pool.

Not a ggml API: ggml walks `ggml_get_first_tensor` / `ggml_get_next_tensor` and reads each struct.
A debugger showing a pool of a thousand tensors at every step wants them in one gather instead, so
`tensor_infos` reads every tensor struct of a context at once (with `ggml_nbytes` computed over
the whole array: a test checks it against `ggml_nbytes` on every tensor of every walkthrough), and
`graph_tensors` reads a graph's nodes and leafs (addresses, structs, so their src links) without
making a handle per tensor; `object_rows`, `layout_digest` and `graph_digest` tell whether two
states of a pool hold the same objects, or of a graph draw the same; `layer_of` and `graph_layers`
say which transformer layer a tensor belongs to (the recorder's step marks, the DAG's folded
layers and the GGUF tensor table all ask them).
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

import numpy as np

from engine.core.context import GGML_OBJECT_TYPE_TENSOR, Context
from engine.core.graph import Graph
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, TENSOR
from engine.core.types import TYPE_TRAITS

_BLCK = np.array([tr.blck_size or 1 for tr in TYPE_TRAITS], dtype=np.int64)
_TSIZE = np.array([tr.type_size for tr in TYPE_TRAITS], dtype=np.int64)


class PoolTensor(NamedTuple):
    """One tensor struct of a context's pool, as plain values (a named tuple: a context's
    thousand are made at once, each without a frozen dataclass's per-field setattr)."""

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


def tensor_infos(ctx: Context, objects: list[tuple[int, int, int, int, int]] | None = None) -> list[PoolTensor]:
    """Every tensor of ctx in object order (one gather of the structs, ggml_nbytes vectorised;
    `objects`: ctx.headers(), when read already)."""
    offsets = [offs for _, offs, _, type_, _ in (ctx.headers() if objects is None else objects)
               if type_ == GGML_OBJECT_TYPE_TENSOR]
    if not offsets:
        return []
    recs = np.frombuffer(_gather(ctx.pool, offsets, GGML_TENSOR_SIZE), dtype=TENSOR)
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
    names = record_names(recs)
    return list(map(PoolTensor._make, zip(
        offsets, (ctx.base + o for o in offsets), names, types.tolist(), map(tuple, ne.tolist()), recs["op"].tolist(),
        recs["flags"].tolist(), recs["view_src"].tolist(), recs["data"].tolist(), nbytes.tolist())))


def record_names(recs: np.ndarray) -> list[str]:
    """The names in TENSOR records: each one's bytes up to its first NUL (what follows is what an
    earlier, longer name left there)."""
    return [n.split(b"\0", 1)[0].decode("utf-8", "replace") for n in recs["name"].tolist()]


def _gather(pool: np.ndarray, offsets: list[int], size: int) -> bytes:
    """The `size` bytes at each of these offsets of a pool, one after another."""
    view = pool.data
    return b"".join([view[o:o + size] for o in offsets])


def object_rows(ctx: Context, objects: list[tuple[int, int, int, int, int]] | None = None) -> list[bytes]:
    """Each object's header bytes, followed by its tensor struct for a tensor: what an object of
    a layout is (`objects`: ctx.headers(), when read already)."""
    view = ctx.pool.data
    return [bytes(view[h:offs + GGML_TENSOR_SIZE if type_ == GGML_OBJECT_TYPE_TENSOR else h + GGML_OBJECT_SIZE])
            for h, offs, _size, type_, _next in (ctx.headers() if objects is None else objects)]


def layout_digest(ctx: Context, rows: list[bytes] | None = None) -> bytes:
    """A digest of ctx's object headers and tensor structs, not of any data: two states of a
    pool with the same digest hold the same objects and tensors (names, shapes, pointers).
    (`rows`: object_rows(ctx), when read already.)"""
    return hashlib.blake2b(b"".join(object_rows(ctx) if rows is None else rows), digest_size=16).digest()


def graph_tensors(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The addresses of g's nodes then leafs, and their tensor structs (TENSOR records), read in
    bulk without a handle per tensor. ValueError (as for a handle) when one of them, or one of
    their sources, is in no live pool: a graph whose tensors were in a context freed since."""
    addresses = np.concatenate([g.node_addresses[:g.n_nodes], g.leaf_addresses[:g.n_leafs]])
    space = g.ctx.space
    owners, which, offsets = space.resolve_all(addresses)
    views = [memoryview(b"") if o is None else o.pool.data for o in owners]  # (None: freed, never `which`)
    recs = np.frombuffer(b"".join([views[i][o:o + GGML_TENSOR_SIZE] for i, o in zip(which, offsets)]),
                         dtype=TENSOR)
    srcs = recs["src"]
    space.resolve_all(np.setdiff1d(srcs[srcs != 0], addresses))  # their sources outside the graph
    return addresses, recs


def graph_digest(g: Graph, tensors: tuple[np.ndarray, np.ndarray] | None = None) -> bytes:
    """A digest of what a drawing of g reads (ggml_graph_dump_dot): its nodes and leafs in order,
    each one's address and struct (name, op, shape, sources), and its gradients' slots
    (`tensors`: graph_tensors(g), when read already)."""
    addresses, recs = graph_tensors(g) if tensors is None else tensors
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray([g.n_nodes, g.n_leafs], dtype=np.int64).tobytes())
    h.update(addresses.astype(np.uint64).tobytes())
    h.update(recs.tobytes())
    grads = [table for table in (g.grad_addresses, g.grad_acc_addresses) if table is not None]
    if grads:  # found by their nodes' hash slots
        h.update(b"".join(a.tobytes() for a in (g.hash_keys, g.hash_used, *grads)))
    return h.digest()


_BLK = re.compile(r"blk\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """N for a tensor named "blk.N.…" (GGUF's name for layer N's weights), else None."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def graph_layers(g: Graph, tensors: tuple[np.ndarray, np.ndarray] | None = None,
                 known: dict[int, int] | None = None) -> dict[int, int]:
    """The layer of each tensor of g that has one, by address: a "blk.N." weight is in layer N, a
    node in the highest layer among its sources (nodes come in dependency order, so their sources'
    layers are known first). (`tensors`: graph_tensors(g), when read already.) `known`: nodes'
    layers a caller knows better, by address (llama.cpp's `il`, read while the program ran: a
    layer's first rms_norm reads only the layer before's output); the nodes after them follow."""
    addresses, recs = graph_tensors(g) if tensors is None else tensors
    address_list = addresses.tolist()
    out: dict[int, int] = {}
    for a, name in zip(address_list, record_names(recs)):
        n = layer_of(name)
        if n is not None:
            out[a] = n
    out.update(known or {})
    for a, srcs in zip(address_list[:g.n_nodes], recs["src"][:g.n_nodes].tolist()):
        if a not in out:
            found = [out[s] for s in srcs if s in out]
            if found:
                out[a] = max(found)
    return out
