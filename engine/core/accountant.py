"""The mem_size accountant: where every byte of a ggml_context's pool went.

"How big must my ggml_context be?" ggml answers with formulas (`ggml_tensor_overhead()` is the
32-byte object header plus the 336-byte tensor struct; `ggml_graph_overhead()` a header plus the
padded graph) and a pool that aborts when the next object does not fit. This module reads a
context's object list and splits what the program used into object headers, tensor structs,
graphs, data, work buffers and alignment padding (every payload is padded to GGML_MEM_ALIGN),
with the unused slack left over; and it says which object would have failed with a smaller pool
(ggml_new_object needs `end of the last object + 32 + padded size <= mem_size`).

Not a ggml function: ggml keeps no such account. Everything here is computed from the same pool
bytes and formulas ggml uses (checked against real ggml in tests/conformance/test_accountant.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from engine.core.context import GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR, Context, \
    ggml_used_mem
from engine.core.graph import ggml_graph_nbytes
from engine.core.layout import CGRAPH, GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, struct_at
from engine.core.infos import PoolTensor, tensor_infos


class ObjectCost(NamedTuple):
    """One object of the pool and what its bytes hold (a named tuple: a model's pool has
    thousands)."""

    kind: str  # TENSOR, GRAPH or WORK_BUFFER
    name: str  # the tensor's name, "graph of N nodes" or "work buffer"
    header: int  # offset of its 32-byte header
    end: int  # offset just past its payload: the pool must be at least this big to hold it
    struct: int  # the tensor struct (336), or the graph's struct and arrays (ggml_graph_nbytes)
    data: int  # tensor data allocated here (ggml_nbytes; 0 for views and no_alloc), or work bytes
    padding: int  # what GGML_PAD added to reach a multiple of GGML_MEM_ALIGN


@dataclass(frozen=True, slots=True)
class MemAccount:
    """A context's pool: mem_size = headers + structs + graphs + data + work + padding + slack."""

    mem_size: int
    used: int  # ggml_used_mem
    headers: int
    structs: int
    graphs: int
    data: int
    work: int
    padding: int
    objects: tuple[ObjectCost, ...]

    @property
    def slack(self) -> int:
        """Bytes asked for and never used."""
        return self.mem_size - self.used

    @property
    def min_mem_size(self) -> int:
        """The smallest pool that holds every object (ggml_init pads mem_size to 16 anyway)."""
        return self.used

    @property
    def data_padding(self) -> int:
        """The padding after tensors (ggml_tensor_overhead does not count it: no formula does)."""
        return sum(o.padding for o in self.objects if o.kind == "TENSOR")

    @property
    def graph_padding(self) -> int:
        """The padding after graphs (inside ggml_graph_overhead)."""
        return sum(o.padding for o in self.objects if o.kind == "GRAPH")

    @property
    def work_buffers(self) -> tuple[ObjectCost, ...]:
        """The work buffers ggml_graph_compute_with_ctx made (one per compute, even of 0 bytes)."""
        return tuple(o for o in self.objects if o.kind == "WORK_BUFFER")

    def first_to_fail(self, mem_size: int) -> ObjectCost | None:
        """The object whose ggml_new_object would fail in a pool of mem_size bytes, if any."""
        return next((o for o in self.objects if o.end > mem_size), None)


def account(ctx: Context, infos: list[PoolTensor] | None = None) -> MemAccount:
    """Split ctx's used bytes by what they hold (see the module docstring). `infos`: ctx's
    tensor_infos, if the caller has them already."""
    tensors_at = {t.offs: t for t in (tensor_infos(ctx) if infos is None else infos)}
    objects = []
    for header, offs, size, type_, _next in ctx.headers():
        if type_ == GGML_OBJECT_TYPE_TENSOR:
            t = tensors_at[offs]
            # the tensor owns the bytes after its struct: its data points right there
            owns = not t.is_view and t.data == ctx.base + offs + GGML_TENSOR_SIZE
            data = t.nbytes if owns else 0
            cost = ObjectCost("TENSOR", t.name, header, offs + size, GGML_TENSOR_SIZE, data,
                              size - GGML_TENSOR_SIZE - data)
        elif type_ == GGML_OBJECT_TYPE_GRAPH:
            r = struct_at(ctx.pool, offs, CGRAPH)[0]
            nbytes = ggml_graph_nbytes(int(r["size"]), bool(int(r["grads"])))
            cost = ObjectCost("GRAPH", f"graph of {int(r['size'])} nodes", header, offs + size, nbytes, 0,
                              size - nbytes)
        else:  # a work buffer: its size was padded by the caller's request only
            cost = ObjectCost("WORK_BUFFER", "work buffer", header, offs + size, 0, size, 0)
        objects.append(cost)
    tensors = [o for o in objects if o.kind == "TENSOR"]
    return MemAccount(
        mem_size=ctx.mem_size, used=ggml_used_mem(ctx),
        headers=GGML_OBJECT_SIZE * len(objects),
        structs=sum(o.struct for o in tensors),
        graphs=sum(o.struct for o in objects if o.kind == "GRAPH"),
        data=sum(o.data for o in tensors),
        work=sum(o.data for o in objects if o.kind == "WORK_BUFFER"),
        padding=sum(o.padding for o in objects),
        objects=tuple(objects))


def format_account(acc: MemAccount) -> str:
    """The account as a learner reads it: totals, then one line per object."""
    rows = [("object headers", acc.headers, f"{len(acc.objects)} x {GGML_OBJECT_SIZE}"),
            ("tensor structs", acc.structs, f"{acc.structs // GGML_TENSOR_SIZE} x "
                                            f"{GGML_TENSOR_SIZE}"),
            ("graphs", acc.graphs, "ggml_graph_nbytes"),
            ("tensor data", acc.data, "ggml_nbytes"),
            ("work buffers", acc.work, "ggml_graph_plan's work_size"),
            ("alignment padding", acc.padding, "GGML_PAD(size, 16)"),
            ("unused (slack)", acc.slack, "mem_size - ggml_used_mem")]
    out = [f"mem_size {acc.mem_size} bytes, used {acc.used} (ggml_used_mem)"]
    out += [f"  {label:<18} {n:>10}   {how}" for label, n, how in rows]
    out.append(f"  the smallest mem_size that holds these objects: {acc.min_mem_size}")
    out.append("  objects:")
    for o in acc.objects:
        out.append(f"    {o.header:>8}..{o.end:<8} {o.kind:<11} {o.name:<24} struct {o.struct:>6}"
                   f"  data {o.data:>8}  padding {o.padding:>2}")
    return "\n".join(out)
