"""The recorder: run a ggml program once and keep every step as an immutable record.

A step is one facade call made by the program (ggml_init, each tensor, each op, each name, data
writes, graph building, planning, compute), a tensor visited while a graph is built, or a node
computed — with each thread's share of it. Each step keeps what it changed: objects added to a pool,
struct fields written (old -> new), byte ranges written and their new bytes. From those patches the
pools at any step are rebuilt without running anything (`Trace.state_at`), forwards or backwards.

How it watches: `sys.setprofile` sees every call of a facade function made from the program's own
file (calls inside the engine are not steps); graph visits come through the graph's visit hook and
nodes through the compute observer. The program runs in a fresh address space, so the same program
and inputs give the same steps, addresses and hash.

Leaves out: writes the program makes with raw numpy on a data view (use `set_data`, ggml's memcpy).
"""

from __future__ import annotations

from bisect import bisect_right
import hashlib
import json
import sys
import time
from operator import attrgetter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine import ggml as G
from engine import ggml_alloc as GA
from engine import ggml_backend as GB
from engine import ggml_opt as GO
from engine.backend.sched import COPY_OBSERVER
from engine.compute.kernels import same_bits_on_every_cpu
from engine.compute.threadpool import COMPUTE_OBSERVER, Share
from engine.core.context import (GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR,
                            GGML_OBJECT_TYPE_WORK_BUFFER, AddressSpace, Context, ObjectInfo,
                            current_address_space, fresh_address_space, ggml_used_mem)
from engine.core.api import is_query
from engine.core.errors import ProgramStopped, StepCapReached, program_line
from engine.core.graph import Graph
from engine.core.infos import TensorInfo, tensor_infos
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, TENSOR, field_spans
from engine.core.notes import Note, tell
from engine.core.optable import GGMLOp
from engine.trace.steps import (ComputePlan, ContextMeta, FieldWrite, ObjectAdded, Patch, Step, StepKind,
                          ThreadShare, assigned_names, describe_changes, field_text, statement_spans)
from engine.core.tensor import GGML_TENSOR_FLAG_COMPUTE, Tensor, ggml_nbytes
from engine.trace.cpu_bytes import CpuDependence
from engine.trace.opt import OPT_LOOPS, OPT_STRUCT_WRITERS, opt_parts
from engine.trace.groups import ProgramMarks
from engine.trace.pools import changed_runs, fresh_pool, frozen
from engine.trace.backend import (BACKEND_DATA_WRITERS, STRUCT_WRITERS, BackendRecording,
                                  restored_buffers)
from engine.core.types import TYPE_TRAITS

STEP_CAP = 20_000
DATA_WRITERS = ("set_data", "ggml_set_f32", "ggml_set_i32", "ggml_set_f32_1d", "ggml_set_i32_1d",
                *BACKEND_DATA_WRITERS)  # a runaway program ends with a clear final step instead of a hang
UNNAMED = "(unnamed)"  # a note's words for a tensor with no name: `a (unnamed)`, after its variable

@dataclass
class Trace:
    program: str
    source: str
    n_threads: int
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    printed: str = ""  # what the program printed (a learner's program in the playground)

    @property
    def hash(self) -> str:
        """Content hash over everything but timings and which thread took which chunk."""
        cached = self.__dict__.get("_hash")
        if cached is not None and cached[0] == len(self.steps):
            return cached[1]
        h = hashlib.sha256()
        h.update(self.program.encode())
        h.update(str(self.n_threads).encode())
        for s in self.steps:
            h.update(s.hash_bytes())
        self.__dict__["_hash"] = (len(self.steps), h.hexdigest()[:16])
        return self.__dict__["_hash"][1]

    # --- rebuilding a state -----------------------------------------------------------------
    @property
    def recorded_bytes(self) -> int:
        """The bytes the steps' patches hold (what keeping this trace costs)."""
        self._flat_patches()
        return self._flat[3]

    def state_at(self, k: int) -> "State":
        """The pools after step k: the last checkpoint at or before k, then the patches of the
        steps after it (from step 0 when there is none)."""
        k = max(0, min(k, len(self.steps) - 1))
        metas: dict[int, ContextMeta] = {}
        buffers: dict[int, Any] = {}
        for s in self.steps[:k + 1]:
            for c in s.contexts:
                metas[c.id] = c
            for b in s.buffers:
                buffers[b.id] = b
        metas = {cid: m for cid, m in metas.items() if not m.freed}  # their memory is gone
        flat, ends = self._flat_patches()
        start, saved = 0, {}
        for index, pools_then in self._checkpoints():
            if index > ends[k]:
                break
            start, saved = index, pools_then
        # a pool no patch after the checkpoint touches is the checkpoint's own (read-only) array:
        # a loaded model's weights are not copied for every step a learner opens
        touched = {p[0] for p in flat[start:ends[k]]}
        sizes = {**{cid: m.mem_size for cid, m in metas.items()},
                 **{bid: m.size for bid, m in buffers.items()}}
        pools = {cid: saved[cid] if cid in saved and cid not in touched
                 else fresh_pool(size, saved.get(cid)) for cid, size in sizes.items()}
        views = {cid: memoryview(a) for cid, a in pools.items() if cid in touched}
        for cid, a, b, data in flat[start:ends[k]]:
            view = views.get(cid)
            if view is not None:
                view[a:b] = data
        return State(self, k, metas, pools, buffers)

    def _checkpoints(self) -> list[tuple[int, dict[int, np.ndarray]]]:
        """Copies of every pool at some step boundaries, as (patches before it, pools): one each
        time the patches since the last reach the pools' total size, so a rebuild copies one
        checkpoint and replays at most that many bytes. Made once, on the first rebuild."""
        cached = getattr(self, "_cps", None)
        if cached is not None and cached[0] == len(self.steps):
            return cached[1]
        flat, ends = self._flat_patches()
        sizes: dict[int, int] = {}
        for s in self.steps:
            for c in s.contexts:
                sizes[c.id] = c.mem_size
            for b in s.buffers:
                sizes[b.id] = b.size
        checkpoints: list[tuple[int, dict[int, np.ndarray]]] = []
        if self.recorded_bytes > min(checkpoint_every(sum(sizes.values())), BIG_STEP_BYTES):
            pools: dict[int, np.ndarray] = {}
            dirty: set[int] = set()  # pools written since the last checkpoint
            since, done, spent = 0, 0, 0
            for k, s in enumerate(self.steps):
                for c in s.contexts:
                    if c.freed:
                        pools.pop(c.id, None)
                    else:
                        pools.setdefault(c.id, np.zeros(c.mem_size, dtype=np.uint8))
                for b in s.buffers:
                    pools.setdefault(b.id, np.zeros(b.size, dtype=np.uint8))
                step_bytes = 0
                for cid, a, b, data in flat[done:ends[k]]:
                    if cid in pools:
                        pools[cid][a:b] = np.frombuffer(data, np.uint8)
                        dirty.add(cid)
                    step_bytes += b - a
                since += step_bytes
                done = ends[k]
                # also right after a step that writes a lot (a model's weights loaded): the
                # states after it share that checkpoint's pool instead of rebuilding it
                cost = sum(a.nbytes for cid, a in pools.items() if cid in dirty)
                if (since >= checkpoint_every(cost) or step_bytes >= BIG_STEP_BYTES) and k + 1 < len(self.steps) \
                        and spent + cost <= CHECKPOINT_BYTES:
                    last = checkpoints[-1][1] if checkpoints else {}
                    # a pool nothing wrote since the last checkpoint is that checkpoint's copy
                    checkpoints.append((done, {cid: last[cid] if cid in last and cid not in dirty
                                               else frozen(a) for cid, a in pools.items()}))
                    since, dirty, spent = 0, set(), spent + cost
        self._cps = (len(self.steps), checkpoints)
        self._cp_bytes = sum({id(a): a.nbytes for _, pools in checkpoints for a in pools.values()}.values())
        return checkpoints

    @property
    def held_bytes(self) -> int:
        """What keeping this trace costs: its patches, and its checkpoints once a rebuild made them."""
        return self.recorded_bytes + getattr(self, "_cp_bytes", 0)

    def _flat_patches(self) -> tuple[list[tuple[int, int, int, bytes]], list[int]]:
        """Every patch in order as (ctx, start, end, bytes), and how many steps 0..k wrote."""
        if getattr(self, "_flat", None) is None or self._flat[2] != len(self.steps):
            flat, ends = [], []
            for s in self.steps:
                flat += [(p.ctx, p.offset, p.offset + len(p.data), p.data) for p in s.patches]
                ends.append(len(flat))
            self._flat = (flat, ends, len(self.steps), sum(len(p[3]) for p in flat))
        return self._flat[0], self._flat[1]

    def to_json(self) -> dict:
        return {"program": self.program, "hash": self.hash, "n_threads": self.n_threads,
                "error": self.error,
                "steps": [{"index": s.index, "kind": s.kind.value, "call": s.call, "line": s.line,
                           "note": tell(s.notes), "parent": s.parent, "changes": s.changes(),
                           "same_on_every_cpu": s.same_on_every_cpu,
                           "threads": [{"ith": t.ith, "kind": t.kind, "ranges": t.ranges, "seconds": t.seconds,
                                        "note": tell(t.notes)} for t in s.threads]} for s in self.steps],
                "outputs": self.outputs}


class State:
    """The engine's objects over rebuilt pools: contexts, tensors and graphs as they were."""

    def __init__(self, trace: Trace, k: int, metas: dict[int, ContextMeta], pools: dict,
                 buffers: dict | None = None) -> None:
        self.trace, self.k = trace, k
        self.space = AddressSpace(weak=True)  # the state holds the contexts
        self.contexts = {cid: Context.restored(self.space, cid, m.base, pools[cid],
                                               m.objects_end, m.no_alloc)
                         for cid, m in sorted(metas.items())}
        self.buffers = restored_buffers(self.space, buffers or {}, pools)  # backend buffers
        # what keeping this state costs: its own pools (a checkpoint's read-only ones are shared)
        self.nbytes = sum(p.nbytes for p in pools.values() if p.flags.writeable)
        self._infos: dict[int, list[TensorInfo]] = {}
        self._graphs: list[Graph] | None = None

    def tensor_infos(self, cid: int) -> list[TensorInfo]:
        """tensor_infos of context cid, read once: a state's pools never change."""
        if cid not in self._infos:
            self._infos[cid] = tensor_infos(self.contexts[cid])
        return self._infos[cid]

    def tensor(self, ref: tuple[int, int]) -> Tensor:
        return Tensor(self.contexts[ref[0]], ref[1])

    def tensors(self) -> list[Tensor]:
        out = []
        for ctx in self.contexts.values():
            out += [Tensor(ctx, o.offs) for o in ctx.objects()
                    if o.type == GGML_OBJECT_TYPE_TENSOR]
        return out

    def graphs(self) -> list[Graph]:
        """The graphs in the state's pools (found once: a state's pools never change)."""
        from engine.core.layout import CGRAPH, record

        if self._graphs is None:
            out = []
            for ctx in self.contexts.values():
                out += [Graph(ctx, record(ctx.pool, o.offs, CGRAPH), o.offs)
                        for o in ctx.objects() if o.type == GGML_OBJECT_TYPE_GRAPH]
            self._graphs = [g for g in out if _readable(g)]
        return list(self._graphs)


def _readable(g: Graph) -> bool:
    """A graph whose nodes and leafs all still exist: one whose tensors were in a context freed
    since holds dangling pointers (in C too), and is not shown."""
    try:
        for t in g.nodes + g.leafs:
            t.src  # noqa: B018 - resolving the sources' addresses is the test
        return True
    except ValueError:
        return False


# --- recording -------------------------------------------------------------------------------

def _facade_codes() -> dict[Any, str]:
    """The code objects of the facade's functions that make steps (all but the queries)."""
    codes = {}
    for module in (G, GB, GA, GO):  # ggml.h, ggml-backend.h, ggml-alloc.h, ggml-opt.h
        for name in dir(module):
            fn = getattr(module, name)
            if callable(fn) and hasattr(fn, "__code__") and (
                    name.startswith(("ggml_", "gguf_")) or name == "set_data"):
                if not is_query(fn):
                    codes[fn.__code__] = name
    return codes


class Recorder(BackendRecording, CpuDependence, ProgramMarks):
    """Watches one program run and turns what it does into steps."""

    def __init__(self, source_file: str, n_threads: int,
                 on_step: Callable[[Step, list[Context]], None] | None = None,
                 step_cap: int | None = None) -> None:
        self.step_cap = step_cap or STEP_CAP
        self.on_step = on_step  # sees the live contexts after each step (tests compare with them)
        self.file = source_file
        self.n_threads = n_threads
        self.codes = _facade_codes()
        self.steps: list[Step] = []
        self.contexts: list[Context] = []
        self.shadow: dict[int, np.ndarray] = {}  # each pool as of the last step
        self.cpu_dependent: dict[int, list[tuple[int, int]]] = {}  # byte ranges, per context
        self.meta: dict[int, ContextMeta] = {}
        self.object_lists: dict[int, list[ObjectInfo]] = {}  # see objects_of
        self.active: Any = None  # the frame of the facade call in progress
        self.args: tuple = ()  # the call's arguments, and what the ggml-opt objects among them hold
        self.raw_args: tuple = ()
        text = Path(source_file).read_text()
        self.lines = text.splitlines()
        self.statements = statement_spans(text)
        self.variables: dict[tuple[int, int], str] = {}  # tensor -> the variable it was made into
        self.call_step: int | None = None  # index of the call step that visits/nodes belong to
        self.visiting: list[Tensor] = []  # tensors the graph walk has reached
        self.line = 0
        self.t_start = time.perf_counter()
        self.init_backend_recording()
        self.init_marks(text)

    # the profile hook: only calls from the program's own file into the facade are steps
    def profile(self, frame, event: str, arg) -> None:
        if event == "call":
            if self.active is None and frame.f_code in self.codes:
                caller = frame.f_back
                if caller is not None and caller.f_code.co_filename == self.file:
                    self.active = frame
                    self.line = caller.f_lineno
                    self.read_marks(caller)
                    self.raw_args = tuple(frame.f_locals.values())
                    self.args = self.raw_args + tuple(opt_parts(self.raw_args))
                    self.call_step = None
                    if self.codes[frame.f_code].startswith("ggml_build_forward"):
                        # the call comes first; each tensor it visits is a step inside it
                        self.call_step = self.emit(
                            StepKind.CALL, self.source(self.line),
                            (Note("build_forward"),), []).index
        elif event == "return" and frame is self.active:
            self.active = None
            self.finish_call(self.codes[frame.f_code], arg)

    def source(self, line: int) -> str:
        a, b = self.statements.get(line, (line, line))
        return " ".join(x.strip() for x in self.lines[a - 1:b])

    # --- diffs ------------------------------------------------------------------------------
    def track(self, ctx: Context) -> None:
        if ctx.id not in self.shadow:
            self.contexts.append(ctx)
            self.shadow[ctx.id] = np.zeros(ctx.mem_size, dtype=np.uint8)

    def regions(self, things: list[Any]) -> list[tuple[Context, int, int]]:
        """Byte ranges a step may have written: new objects, and the structs, data and graphs
        of the tensors and graphs it touched."""
        out = []
        for ctx in self.contexts:
            old_used = self._objects_end(ctx.id)
            old_end = 0 if old_used is None else _end_of(ctx, old_used)
            new_end = ggml_used_mem(ctx) if not ctx.freed else old_end
            if new_end > old_end:
                out.append((ctx, old_end, new_end))
                if old_used is not None:  # the old last object's `next` now points at the new one
                    out.append((ctx, old_used, old_used + GGML_OBJECT_SIZE))
            elif new_end < old_end:  # ggml_reset: the list restarts at 0
                out.append((ctx, 0, min(old_end, ctx.mem_size)))
        for t in things:
            if isinstance(t, str) and t == "work buffers":  # kernels write scratch data (converted rows) there
                for ctx in self.contexts:
                    if not ctx.freed:
                        out += [(ctx, o.offs, o.offs + o.size) for o in self.objects_of(ctx)
                                if o.type == GGML_OBJECT_TYPE_WORK_BUFFER and o.size]
                out += self.work_buffer_regions()
            elif isinstance(t, str) and t == "all memory":
                out += [(c, 0, c.mem_size) for c in [*self.contexts, *self.buffers] if not c.freed]
            elif isinstance(t, tuple) and t[0] == "struct":  # only the struct of a tensor
                out.append((t[1].ctx, t[1].offs, t[1].offs + GGML_TENSOR_SIZE))
            elif isinstance(t, Tensor):
                chain = [t] + ([t.view_src] if t.view_src is not None else [])
                for x in chain:
                    out.append((x.ctx, x.offs, x.offs + GGML_TENSOR_SIZE))
                    if x.data is not None:
                        try:
                            ctx, off = x.ctx.space.resolve(x.data)
                        except ValueError:  # data in a buffer freed since
                            continue
                        out.append((ctx, off, off + ggml_nbytes(x)))
            elif isinstance(t, Graph) and t.offs is not None:
                obj = t.ctx.object_header(t.offs - GGML_OBJECT_SIZE)[0]
                out.append((t.ctx, t.offs, t.offs + int(obj["size"])))
        return out

    def diff(self, things: list[Any]) -> tuple[list[Patch], list[FieldWrite], list[ObjectAdded]]:
        patches, fields, objects = [], [], []
        for ctx, a, b in self.regions(things):
            if ctx.id not in self.shadow or (ctx.freed and getattr(ctx, "mem_buffer_owned", True)):
                continue  # released memory (a freed context's own pool, a freed buffer)
            cur, old = ctx.pool[a:b], self.shadow[ctx.id][a:b]
            starts, ends = changed_runs(cur, old)
            for s, e in zip(starts, ends):
                if isinstance(ctx, Context):
                    fields += self.field_writes(ctx, a + int(s), a + int(e))
                patches.append(Patch(ctx.id, a + int(s), cur[s:e].tobytes()))
                self.shadow[ctx.id][a + s:a + e] = cur[s:e]
        seen = set()
        for ctx in self.contexts:
            if ctx.freed:
                continue
            old_end = self._objects_end(ctx.id)
            objs = self.objects_of(ctx)
            first = 0 if old_end is None else bisect_right(objs, old_end, key=attrgetter("header"))
            for o in objs[first:]:
                name = Tensor(ctx, o.offs).name if o.type == GGML_OBJECT_TYPE_TENSOR else ""
                key = (ctx.id, o.header)
                if key not in seen:
                    seen.add(key)
                    objects.append(ObjectAdded(ctx.id, o.header, o.offs, o.size, o.type_name, name))
        patches = _dedupe(patches)
        return patches, _dedupe(fields), objects

    def field_writes(self, ctx: Context, a: int, b: int) -> list[FieldWrite]:
        """Changed bytes that fall in an existing tensor struct, as field changes."""
        out = []
        objs = self.objects_of(ctx)
        for o in objs[bisect_right(objs, a - GGML_TENSOR_SIZE, key=attrgetter("offs")):]:
            if o.offs >= b:
                break
            if o.type != GGML_OBJECT_TYPE_TENSOR or o.offs + GGML_TENSOR_SIZE <= a:
                continue
            old_end = self._objects_end(ctx.id)
            if old_end is None or o.header > old_end:
                continue  # a new tensor: reported as an object, not as field writes
            old = self.shadow[ctx.id][o.offs:o.offs + GGML_TENSOR_SIZE].view(TENSOR)[0]
            new = ctx.pool[o.offs:o.offs + GGML_TENSOR_SIZE].view(TENSOR)[0]
            name = Tensor(ctx, o.offs).name
            for span in field_spans(TENSOR):
                lo, hi = o.offs + span.offset, o.offs + span.offset + span.size
                if hi <= a or lo >= b:
                    continue
                ov, nv = field_text(old[span.name]), field_text(new[span.name])
                if ov != nv:
                    out.append(FieldWrite(ctx.id, o.offs, name, span.name, ov, nv))
        return out

    def objects_of(self, ctx: Context) -> list[ObjectInfo]:
        """ctx's object list, walked once and then only from its last object on: objects are
        only ever appended (a ggml_reset empties the list, and the walk starts over)."""
        objs = self.object_lists.setdefault(ctx.id, [])
        last = ctx.objects_end
        if last is None or (objs and objs[-1].header > last):
            objs.clear()
        if last is None or (objs and objs[-1].header == last):
            return objs
        hdr = objs.pop().header if objs else ctx.objects_begin  # the old last: `next` changed
        while hdr is not None:
            obj = ctx.object_header(hdr)[0]
            nxt = int(obj["next"])
            objs.append(ObjectInfo(hdr, int(obj["offs"]), int(obj["size"]), int(obj["type"]), nxt))
            hdr = ctx.offset(nxt) if nxt else None
        return objs

    def _objects_end(self, cid: int) -> int | None:
        """The last object's header offset when the context's metadata was last recorded."""
        m = self.meta.get(cid)
        return None if m is None else m.objects_end

    def snapshot_meta(self) -> tuple[ContextMeta, ...]:
        changed = []
        for ctx in self.contexts:
            m = ContextMeta(ctx.id, ctx.base, ctx.mem_size, ctx.objects_end, ctx.no_alloc,
                            ctx.freed and getattr(ctx, "mem_buffer_owned", True))
            if self.meta.get(ctx.id) != m:
                self.meta[ctx.id] = m
                changed.append(m)
        return tuple(changed)

    # --- steps ------------------------------------------------------------------------------
    def emit(self, kind: StepKind, call: str, notes: tuple[Note, ...], things: list[Any],
             skip_if_empty: bool = False, fn: str = "", **kw) -> Step | None:
        """Record a step (no `notes`: its changes described; `fn`: the facade function a call step
        is for, which those notes name)."""
        if len(self.steps) >= self.step_cap:
            raise StepCapReached(self.step_cap)
        self.track_buffers()
        patches, fields, objects = self.diff(things)
        buffers = self.snapshot_buffers()
        if skip_if_empty and not (patches or fields or objects or buffers):
            self.snapshot_meta()
            return None
        step = Step(len(self.steps), kind, call, self.line,
                    notes or describe_changes(fn or call, objects, fields, patches),
                    objects=tuple(objects), fields=tuple(fields), patches=tuple(patches),
                    contexts=self.snapshot_meta(), buffers=buffers,
                    **self.marks_for(kind, kw.get("tensor"), call), **kw)
        self.steps.append(step)
        self.mark_cpu_dependent(step)
        if self.on_step is not None:
            self.on_step(step, [*self.contexts, *self.buffers])
        return step

    def finish_call(self, name: str, result: Any) -> None:
        if isinstance(result, Tensor) and len(names := assigned_names(self.source(self.line))) == 1:
            self.variables[_ref(result)] = names[0]  # `a = ggml_new_tensor_2d(...)`: the tensor's variable
        if name.startswith("ggml_opt_"):  # what the call made inside the contexts it holds
            self.args = self.raw_args + tuple(opt_parts((*self.raw_args, result)))
            for part in self.args:
                if isinstance(part, Context):
                    self.track(part)
        if isinstance(result, Context):
            self.track(result)
        if isinstance(result, tuple):  # gguf_init_from_file returns (gguf ctx, ggml ctx)
            for r in result:
                if isinstance(r, Context):
                    self.track(r)
        for g in [result, *self.args]:
            if isinstance(g, Graph):
                g.visit_hook, g.enter_hook = self.on_visit, self.on_enter
        things = list(self.args) + ([result] if result is not None else [])
        if name.startswith("ggml_build_forward"):  # flags may have changed on any tensor reached
            things += [("struct", t) for g in self.args if isinstance(g, Graph)
                       for t in g.nodes + g.leafs]
            self.visiting = []
        things += [x for a in self.args if isinstance(a, (list, tuple)) for x in a]
        if name in STRUCT_WRITERS or name in OPT_STRUCT_WRITERS:
            things += self.struct_writes()
        if name.startswith("ggml_opt_"):  # it writes tensors the program never named (weights,
            things.append("all memory")  # gradients, moments, batches): every byte is compared
        tensor = _ref(result) if isinstance(result, Tensor) else None
        notes: tuple[Note, ...] = ()
        if name in DATA_WRITERS and isinstance(self.args[0], Tensor):
            t = self.args[0]
            notes = (Note.of("wrote_data", fn=name, name=self.tensor_words(t), n=ggml_nbytes(t),
                             addr=f"{t.data:#x}"),)
        elif name == "ggml_init" and isinstance(result, Context):
            notes = (Note.of("init_no_alloc" if result.no_alloc else "init", size=result.mem_size,
                             addr=f"{result.base:#x}", id=result.id),)
        # after visits or nodes, the call's own step is only needed for changes not yet shown
        step = self.emit(StepKind.CALL, self.source(self.line), notes, things, tensor=tensor,
                         parent=self.call_step, skip_if_empty=self.call_step is not None, fn=name)
        self.after_backend_call(self.call_step if step is None else step.index)

    def tensor_words(self, t: Tensor) -> str:
        """How a note names a tensor: its name in quotes; when it has none, the program's
        variable it was made into (`a (unnamed)`), else `(unnamed)`."""
        if t.name:
            return f"'{t.name}'"
        var = self.variables.get(_ref(t))
        return f"{var} {UNNAMED}" if var else UNNAMED

    def on_enter(self, node: Tensor) -> None:
        # the walk is about to set this tensor's COMPUTE flag: the next step must show it
        if node.op != 0 and not node.flags & GGML_TENSOR_FLAG_COMPUTE:
            self.visiting.append(node)

    def on_visit(self, node: Tensor, slot: int, is_leaf: bool) -> None:
        words = self.tensor_words(node)
        self.emit(StepKind.VISIT, f"visit {words}",
                  (Note.of("visit_leaf" if is_leaf else "visit_node", name=words, op=GGMLOp(node.op).name,
                           slot=slot),),
                  [node, *(("struct", t) for t in self.visiting)] + self.graph_args(),
                  parent=self.call_step, tensor=_ref(node))
        self.visiting = []

    def graph_args(self) -> list[Graph]:
        return [a for a in self.args if isinstance(a, Graph)]

    def on_node(self, node: Tensor, ask: bool, shares: list[Share] | None) -> bool:
        fn = self.codes[self.active.f_code] if self.active is not None else ""
        if fn in OPT_LOOPS:
            if not ask:  # a training loop is one step: its nodes compute unwatched
                self.note_cpu_dependence(node)
            return True
        if ask:
            if self.call_step is None:
                plan = G.ggml_graph_plan(next(a for a in self.args if isinstance(a, Graph)),
                                         self.compute_threads())
                self.call_step = self.emit(
                    StepKind.CALL, self.source(self.line),
                    (Note.of("planned", n=plan.n_threads, size=plan.work_size), Note("walk_together")),
                    ["all memory"] if fn.startswith("ggml_opt_") else [],
                    plan=ComputePlan(plan.n_threads, plan.work_size, tuple(plan.n_tasks))).index
            return True
        threads = tuple(ThreadShare(s.ith, s.kind, s.ranges, s.seconds, s.notes)
                        for s in shares if s is not None)
        desc = f"{GGMLOp(node.op).name} -> '{node.name}'"
        same = self.note_cpu_dependence(node)
        self.emit(StepKind.NODE, desc, (Note.of("computed", desc=desc, n=len(threads)),),
                  [node, "work buffers", *_written_sources(node)], parent=self.call_step, tensor=_ref(node),
                  threads=threads, same_on_every_cpu=same)
        return True

    def note_cpu_dependence(self, node: Tensor) -> bool:
        """Does node's result have the same bits on every CPU? If not, all of its bytes (even
        those that happened not to change) are marked as depending on the CPU."""
        same = same_bits_on_every_cpu(node) and not any(
            self.depends_on_cpu(s) for s in node.src if s is not None)
        if not same:
            for t in (node, *_written_sources(node)):
                self.cpu_dependent_ranges(*self.data_range(t), add=True)
        return same

    def n_threads_arg(self) -> int:
        ints = [a for a in self.args if isinstance(a, int) and not isinstance(a, bool)]
        return ints[-1] if ints else self.n_threads


CHECKPOINT_MIN_BYTES = 4 << 20  # no checkpoints for traces whose patches replay faster than this
BIG_STEP_BYTES = 4 << 20  # a step that writes this much (weights loaded) is followed by a checkpoint
CHECKPOINT_BYTES = 1 << 30  # what one trace's checkpoints may copy together (then states replay more)


def checkpoint_every(dirty_bytes: int) -> int:
    """Patch bytes after which a checkpoint is made, when the pools written since the last one
    total dirty_bytes (what the checkpoint copies): a state replays at most that many bytes, and
    the checkpoints together copy at most ~4 times the bytes the steps wrote."""
    return max(CHECKPOINT_MIN_BYTES, dirty_bytes // 4)


def _end_of(ctx: Context, header: int) -> int:
    obj = ctx.object_header(header)[0]
    return int(obj["offs"]) + int(obj["size"])


def _written_sources(node: Tensor) -> list[Tensor]:
    """The sources an optimizer step overwrites in place: the parameter, and AdamW's moments."""
    if node.op == GGMLOp.OPT_STEP_ADAMW:
        return [node.src[0], node.src[2], node.src[3]]
    if node.op == GGMLOp.OPT_STEP_SGD:
        return [node.src[0]]
    return []


def _ref(t: Tensor) -> tuple[int, int]:
    return (t.ctx.id, t.offs)


def _dedupe(items: list) -> list:
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def record(program: Callable[..., dict], source_file: str, name: str, n_threads: int = 1,
           on_step: Callable[[Step, list[Context]], None] | None = None,
           step_cap: int | None = None, **kwargs) -> Trace:
    """Run `program(n_threads=..., **kwargs)` once and return its trace.

    The program returns its outputs as {name: tensor or value}; they are kept as nested lists.
    An exception it raises, or a limit that stops it (`ProgramStopped`: the step cap, a sandbox's
    limits), is the last step, at the program's line it passed through last.
    """
    rec = Recorder(source_file, n_threads, on_step, step_cap)
    trace = Trace(name, Path(source_file).read_text(), n_threads)
    outputs: dict = {}
    token = COMPUTE_OBSERVER.set(rec.on_node)
    copy_token = COPY_OBSERVER.set(rec.on_copy)
    with fresh_address_space():
        rec.space = current_address_space()
        prev = sys.getprofile()
        sys.setprofile(rec.profile)
        try:
            outputs = program(n_threads=n_threads, **kwargs) or {}
        except (Exception, ProgramStopped) as e:  # the program's error (or the limit that stopped it) is the
            # final step, at the program's line it passed through last
            sys.setprofile(prev)
            stopped = isinstance(e, ProgramStopped)
            trace.error = str(e) if stopped else f"{type(e).__name__}: {e}"
            rec.active = None
            line = program_line(e, source_file) or rec.line
            last = rec.steps[-1] if rec.steps else None
            if last is not None and last.kind == StepKind.CALL and last.line == line and \
                    not (last.patches or last.objects or last.fields):
                rec.steps.pop()  # the call that raised, seen returning: it did nothing
            rec.steps.append(Step(len(rec.steps), StepKind.CAP if stopped else StepKind.ERROR,
                                  rec.source(line), line, (Note.verbatim(trace.error),)))
        finally:
            sys.setprofile(prev)
            COMPUTE_OBSERVER.reset(token)
            COPY_OBSERVER.reset(copy_token)
        trace.outputs = {k: _plain(v) for k, v in outputs.items()}
    if trace.error is None:
        rec.emit(StepKind.END, "", (Note("returned"),), [])
    trace.steps = rec.steps
    return trace


def _plain(v: Any) -> Any:
    if isinstance(v, Tensor):
        return G.to_numpy(v).tolist() if not TYPE_TRAITS[v.type].is_quantized else \
            G.to_numpy(v).tobytes().hex()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def dumps(trace: Trace) -> str:
    return json.dumps(trace.to_json())
