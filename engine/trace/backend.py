"""What the recorder does for ggml-backend programs: backend buffers recorded like pools, and the
graph allocator's and the scheduler's decisions as steps of their own.

Buffers are found as they appear in the recording's address space (the program's, a gallocr's,
the scheduler's), diffed like pools, and rebuilt in a state at their addresses
(`RestoredBuffer`), so tensor data in them resolves. After a call that planned a graph, each
decision of the allocator becomes a step; after a call that split a graph, each pass of the
scheduler (with the backend it gave every tensor and why) and each split; each input copy the
scheduler makes while computing is a step too.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from engine.backend.buffer import _BUFFERS, Buffer, ggml_backend_buffer_free, live_buffers
from engine.backend.device import Backend
from engine.compute.compiled import forget
from engine.backend.sched import Sched
from engine.core.context import GGML_OBJECT_TYPE_TENSOR, AddressSpace, Context
from engine.core.graph import Graph
from engine.core.notes import Note, tell
from engine.core.optable import GGMLOp
from engine.trace.pools import StructOf
from engine.trace.steps import AllocDecision, BufferMeta, Placement, SplitInfo, StepKind, tensor_ref
from engine.core.tensor import Tensor, ggml_nbytes


class RestoredBuffer:
    """A backend buffer's bytes rebuilt from a trace, mapped at its original address."""

    def __init__(self, space: AddressSpace, meta: BufferMeta, pool: np.ndarray) -> None:
        self.id, self.base, self.size, self.name = meta.id, meta.base, meta.size, meta.name
        self.usage, self.is_host = meta.usage, meta.is_host
        self.pool, self.mem_size, self.freed = pool, pool.size, False
        space.place_at(self, self.base)

    def __repr__(self) -> str:
        return f"<buffer {self.id} {self.name} size={self.size}>"


class BackendRecorder:
    """The recorder's part for backend buffers, the graph allocator and the scheduler: it finds
    buffers, diffs them through the recorder, and records the allocator's and the scheduler's
    decisions as steps of their own."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec  # the Recorder: its emit, track, objects_of, args, call_step and space
        self.buffers: list[Buffer] = []  # backend buffers, found as they appear
        self.buffer_meta: dict[int, BufferMeta] = {}
        # gallocr plans already shown as steps, and per scheduler the split it last showed; keyed
        # by id() and holding the object, so a freed one's id cannot be taken by a new one
        self.plans_seen: dict[int, object] = {}
        self.splits_seen: dict[int, tuple[Sched, int]] = {}

    def track_buffers(self) -> None:
        # in the order they were made (the registry's own order is its keys' first use, which
        # an earlier recording in the process may have set)
        for buf in sorted(list(_BUFFERS.values()), key=attrgetter("id")):
            if buf.space is self.rec.space and buf.id not in self.rec.shadow:
                self.buffers.append(buf)
                self.rec.shadow_pool(buf)

    def work_buffer_regions(self) -> list[tuple[Buffer, int, int]]:
        return [(buf, 0, buf.mem_size) for buf in self.buffers if buf.is_work and not buf.freed]

    def snapshot_buffers(self) -> tuple[BufferMeta, ...]:
        changed = []
        for buf in self.buffers:
            m = BufferMeta(buf.id, buf.base, buf.mem_size, buf.buft.name, buf.usage, buf.buft.is_host)
            if not buf.freed and self.buffer_meta.get(buf.id) != m:
                self.buffer_meta[buf.id] = m
                changed.append(m)
        return tuple(changed)

    def struct_writes(self) -> list:
        """The tensor structs a call that places many tensors may have written (one declared
        `@writes(Writes.PLACES)`: an allocator, the scheduler)."""
        out: list = []
        for a in self.rec.args:
            if isinstance(a, Context):
                out += [StructOf(Tensor(a, o.offs)) for o in self.rec.objects_of(a)
                        if o.type == GGML_OBJECT_TYPE_TENSOR]
            elif isinstance(a, Graph):
                for n in a.nodes + a.leafs:
                    out += [StructOf(n)] + [StructOf(x) for x in n.src if x is not None]
            elif isinstance(a, Sched):
                if a.ctx is not None:
                    self.rec.track(a.ctx)
                out += [StructOf(t) for t in a.graph.nodes + a.graph.leafs]
        return out

    def after_call(self, parent: int | None) -> None:
        """The scheduler's and the allocator's steps, if the call split or planned a graph."""
        sched = next((a for a in self.rec.args if isinstance(a, Sched)), None)
        if sched is not None and self.splits_seen.get(id(sched)) != (sched, sched.n_split_calls):
            self.splits_seen[id(sched)] = (sched, sched.n_split_calls)
            self.sched_steps(sched, parent)
        galloc = next((a for a in self.rec.args if hasattr(a, "plan") and hasattr(a, "tallocs")), None)
        galloc = galloc or (sched.galloc if sched is not None else None)
        if galloc is not None and galloc.plan is not None and id(galloc.plan) not in self.plans_seen:
            self.plans_seen[id(galloc.plan)] = galloc.plan
            self.alloc_steps(galloc, parent)

    def alloc_steps(self, galloc, parent: int | None) -> None:
        """One step per decision of the plan: nothing in memory changes yet (the plan is where
        tensors will go), so each step says what was decided and why."""
        names = [b.name for b in galloc.bufts]
        for d in galloc.plan.decisions:
            where = Note.of("where", id=d.buffer_id, name=names[d.buffer_id], chunk=d.chunk, offset=d.offset)
            if d.kind == "alloc":
                note = Note.of("gallocr_gets", name=d.tensor.name, size=d.size, where=where)
            elif d.kind == "inplace":
                note = Note.of("gallocr_inplace", name=d.tensor.name, parent=d.parent.name,
                               op=GGMLOp(d.tensor.op).name, where=where)
            else:
                note = Note.of("gallocr_frees", name=d.tensor.name, size=d.size, where=where)
            decision = AllocDecision(d.kind, tensor_ref(d.tensor), d.buffer_id, names[d.buffer_id], d.chunk, d.offset,
                                     d.size, d.node, None if d.parent is None else tensor_ref(d.parent))
            self.rec.emit(StepKind.ALLOC, f"{d.kind} '{d.tensor.name}'", (note,), [], parent=parent,
                      tensor=d.tensor, decision=decision)

    def sched_steps(self, sched: Sched, parent: int | None) -> None:
        names = [f"backend {i} ({b.name})" for i, b in enumerate(sched.backends)]
        for title, assigned in sched.history:
            if not assigned:
                continue
            placements = tuple(Placement(tensor_ref(a.tensor), a.backend_id, sched.backends[a.backend_id].name, a.cause)
                               for a in assigned)
            counts = tuple(Note.of("pass_count", n=n, b=b, name=be.name) for b, be in enumerate(sched.backends)
                           if (n := sum(1 for a in assigned if a.backend_id == b)))
            self.rec.emit(StepKind.PASS, f"pass {tell([title])}", (Note.of("sched_pass", title=title, counts=counts),),
                      [], parent=parent, placements=placements)
        for i, split in enumerate(sched.splits):
            ins = ", ".join(f"'{t.name}'" for t in split.inputs)
            info = SplitInfo(i, split.backend_id, sched.backends[split.backend_id].name, split.i_start, split.i_end,
                             tuple(tensor_ref(t) for t in split.inputs))
            self.rec.emit(StepKind.SPLIT, f"split {i} on {names[split.backend_id]}",
                      (Note.of("split", i=i, first=split.i_start, last=split.i_end - 1, b=split.backend_id,
                               name=sched.backends[split.backend_id].name),
                       Note.of("split_inputs", inputs=ins) if ins else Note("split_no_inputs")), [],
                      parent=parent, split=info)

    def on_copy(self, inp: Tensor, cpy: Tensor, src_backend: Backend, dst_backend: Backend) -> None:
        self.rec.emit(StepKind.COPY, f"copy '{inp.name}' -> '{cpy.name}'",
                  (Note.of("copied", name=inp.name, size=ggml_nbytes(inp), src=src_backend.name,
                           dst=dst_backend.name, copy=cpy.name),), [cpy], parent=self.rec.call_step, tensor=cpy)

    def compute_threads(self) -> int:
        """The thread count a compute call plans with: the backend's (the first split's, for a
        scheduler), else the program's argument."""
        for a in self.rec.args:
            if isinstance(a, Sched) and a.splits:
                return a.backends[a.splits[0].backend_id].n_threads
            if isinstance(a, Backend):
                return a.n_threads
        return self.rec.n_threads_arg()


def restored_buffers(space: AddressSpace, metas: dict[int, Any], pools: dict) -> dict[int, RestoredBuffer]:
    return {bid: RestoredBuffer(space, m, pools[bid]) for bid, m in sorted(metas.items())}


def release(space: AddressSpace) -> None:
    """The backend buffers a recorded program left allocated end with it, as a process's memory
    does when it exits (a model walkthrough's weights, cache and compute buffers: the trace holds
    what they held), and so does its graphs' prepared work, which views those buffers' bytes."""
    for buf in [b for b in live_buffers() if b.space is space]:
        ggml_backend_buffer_free(buf)
    for owner in space.owners():
        forget(owner)
