"""The recorder: run a ggml program once and keep every step as an immutable record.

A step is one facade call made by the program (ggml_init, each tensor, each op, each name, data
writes, graph building, planning, compute), a tensor visited while a graph is built, or a node
computed — with each thread's share of it. Each step keeps what it changed: objects added to a pool,
struct fields written (old -> new), byte ranges written and their new bytes. From those patches the
pools at any step are rebuilt without running anything (`Trace.state_at`, states.py), forwards or backwards.

How it watches: `sys.settrace` sees every call of a facade function made from the program's own
file (calls inside the engine are not steps); what the function declares where it is defined
(engine/core/api.py: `@query`, `@op`, `@writes(...)`) says whether the call is a step and what it
may have written, never its name. Graph visits come through the graph's visit hook and nodes
through the compute observer. The program runs in a fresh address space, so the same program and
inputs give the same steps, addresses and hash.

Its collaborators: the program's marks (groups.ProgramMarks: layer and pass), the CPU-dependent
bytes (cpu_bytes.CpuBytes), and backend buffers with the allocator's and scheduler's decisions
(backend.BackendRecorder). The trace it returns, and the states rebuilt from it: states.py.

Leaves out: writes the program makes with raw numpy on a data view (use `set_data`, ggml's memcpy).
"""

from __future__ import annotations

import sys
import time
from bisect import bisect_right
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from types import CodeType
from typing import Any, Callable

import numpy as np

from engine import ggml as G
from engine import ggml_alloc as GA
from engine import ggml_backend as GB
from engine import ggml_cpu as GC
from engine import ggml_opt as GO
from engine.backend.buffer import GGML_BACKEND_BUFFER_USAGE_WEIGHTS, Buffer
from engine.backend.sched import COPY_OBSERVER
from engine.compute.threadpool import COMPUTE_OBSERVER
from engine.core.api import Kind, Writes, declaration_of
from engine.core.context import (GGML_OBJECT_TYPE_TENSOR, GGML_OBJECT_TYPE_WORK_BUFFER, AddressSpace, Context,
                                 ObjectInfo, current_address_space, fresh_address_space, ggml_used_mem)
from engine.core.errors import ProgramStopped, StepCapReached, TensorBoundsError, program_line
from engine.core.graph import Graph
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, TENSOR, field_spans
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import GGML_TENSOR_FLAG_COMPUTE, Tensor, ggml_nbytes, name_in
from engine.core.types import TYPE_TRAITS
from engine.trace.backend import BackendRecorder, release
from engine.trace.cpu_bytes import CpuBytes, written_sources
from engine.trace.groups import ProgramMarks
from engine.trace.opt import opt_parts
from engine.trace.pools import (FileMaps, Mirrors, PoolRange, Region, Shadow, StructOf, changed_runs,
                                visit_spans)
from engine.trace.states import Trace
from engine.trace.steps import (ComputePlan, ContextMeta, FieldWrite, ObjectAdded, Patch, Step, StepKind,
                                ThreadShare, assigned_names, describe_changes, field_text, statement_spans,
                                tensor_ref)

STEP_CAP = 20_000  # a runaway program ends with a clear final step instead of a hang
UNNAMED = "(unnamed)"  # a note's words for a tensor with no name: `a (unnamed)`, after its variable

# --- recording -------------------------------------------------------------------------------

def _shown_path(path: str, package: Path) -> str:
    """A source file's path as the debugger names it: under the package (engine/models/llama.py)."""
    p = Path(path).resolve()
    return str(p.relative_to(package)) if p.is_relative_to(package) else p.name


FACADES = (G, GB, GA, GO, GC)  # ggml.h, ggml-backend.h, ggml-alloc.h, ggml-opt.h, ggml-cpu.h


@dataclass(frozen=True, slots=True)
class Watched:
    """A facade function whose calls from the program are steps, as it declared itself."""
    name: str  # ggml_add, set_data...: its step's notes name it
    kind: Kind  # OP (its step compares tensor structs only) or WRITES
    writes: Writes  # what it writes besides its arguments and its result


def watched_functions() -> dict[CodeType, Watched]:
    """Every function the facades export that is not declared a query, by its code object (what
    the trace hook sees)."""
    out = {}
    for module in FACADES:
        for name in module.__all__:
            fn = getattr(module, name)
            declared = declaration_of(fn)
            if declared is not None and declared.kind is not Kind.QUERY:
                out[fn.__code__] = Watched(name, declared.kind, declared.writes)
    return out


TENSOR_SPANS = field_spans(TENSOR)
SMALL_REGION = 4096  # bytes: a region this small is first compared whole


class Recorder:
    """Watches one program run and turns what it does into steps."""

    def __init__(self, source_file: str, n_threads: int,
                 on_step: Callable[[Step, list[Context | Buffer]], None] | None = None,
                 step_cap: int | None = None, also: tuple[str, ...] = ()) -> None:
        self.step_cap = step_cap or STEP_CAP
        self.on_step = on_step  # sees the live contexts after each step (tests compare with them)
        self.n_threads = n_threads
        self.watched = watched_functions()
        self.steps: list[Step] = []
        self.contexts: list[Context] = []
        self.shadow: dict[int, Shadow] = {}  # each pool as of the last step
        self.file_maps = FileMaps()  # the files pools were read from (a model's weights)
        self.mirrors = Mirrors()  # weights buffers' bytes
        self.file_patches: list[Patch] = []  # those bytes, for the step that first sees them
        self.cpu = CpuBytes()  # which bytes hold values that depend on the CPU
        self.meta: dict[int, ContextMeta] = {}
        self.object_lists: dict[int, list[ObjectInfo]] = {}  # see objects_of
        self.work_buffer_lists: dict[int, tuple] = {}  # see work_buffers_of
        self.active: Any = None  # the frame of the facade call in progress
        self.args: tuple = ()  # the call's arguments, and what the ggml-opt objects among them hold
        self.raw_args: tuple = ()
        # the files whose facade calls are steps: the program's (0), then `also`'s (1, 2, ...)
        self.files = {f: k for k, f in enumerate((source_file, *also))}
        texts = [Path(f).read_text() for f in self.files]
        self.texts = [(t.splitlines(), statement_spans(t)) for t in texts]
        self.file_no = 0  # the file of the call in progress
        self.lines, self.statements = self.texts[0]
        self.variables: dict[tuple[int, int], str] = {}  # tensor -> the variable it was made into
        self.call_step: int | None = None  # index of the call step that visits/nodes belong to
        self.visiting: list[Tensor] = []  # tensors the graph walk has reached
        # the tensors the graph walk of the call in progress entered (their flags and hash slots),
        # those since its last visit step being walked[shown:]; and the slot of the node that
        # step showed (its parent counts it after it)
        self.walked: list[Tensor] = []
        self.shown = 0
        self.last_visited: int | None = None
        self.line = 0
        self.t_start = time.perf_counter()
        self.marks = ProgramMarks(dict(zip(self.files, texts)))  # the layer and pass of each call
        self.space: AddressSpace | None = None  # the recording's address space (set by record)
        self.backend = BackendRecorder(self)

    # the trace hook (sys.settrace: called for each Python call, never for a C one): only calls
    # from the program's own files into the facade are steps; their frames get a local trace
    # function that sees them return
    def on_call(self, frame, event: str, arg):
        if self.active is None and frame.f_code in self.watched:
            caller = frame.f_back
            if caller is not None and caller.f_code.co_filename in self.files:
                self.active = frame
                self.file_no = self.files[caller.f_code.co_filename]
                self.lines, self.statements = self.texts[self.file_no]
                self.line = caller.f_lineno
                self.marks.read(caller)
                self.raw_args = tuple(frame.f_locals.values())
                self.args = self.raw_args + tuple(opt_parts(self.raw_args))
                self.call_step = None
                self.walked, self.shown, self.last_visited = [], 0, None
                if Writes.WALK in self.watched[frame.f_code].writes:
                    # the call comes first; each tensor it visits is a step inside it
                    self.call_step = self.emitted(
                        StepKind.CALL, self.source(self.line), (Note("build_forward"),), []).index
                frame.f_trace_lines = False
                return self.on_return
        return None

    def on_return(self, frame, event: str, arg):
        """The local trace function of the facade call in progress (its return, or an exception
        passing through it; a return by exception has arg None)."""
        if event == "return" and frame is self.active:
            self.active = None
            self.finish_call(self.watched[frame.f_code], arg)
        return self.on_return

    def source(self, line: int) -> str:
        a, b = self.statements.get(line, (line, line))
        return " ".join(x.strip() for x in self.lines[a - 1:b])

    # --- diffs ------------------------------------------------------------------------------
    def track(self, ctx: Context) -> None:
        """Watch ctx's pool from now on. Its bytes read from a file (a model's weights) are
        that file's, in the shadow and in the patch of the step that first sees them: the
        step's comparison then finds only what differs from the file (nothing, after a load)."""
        if ctx.id not in self.shadow:
            self.contexts.append(ctx)
            self.shadow_pool(ctx)

    def shadow_pool(self, owner: Context | Buffer) -> None:
        """A shadow for a pool or a buffer seen for the first time: zeros, but where its bytes
        are a file's (`read_from`: a GGUF's data section, a CPU_Mapped buffer's pages) that
        file's, as the patch of the step that first sees them holds them."""
        fb = owner.read_from
        pooled = self.mirrors.adopt(owner) if isinstance(owner, Buffer) else None
        if pooled is not None:  # (its pool is its mirror's pages)
            self.shadow[owner.id] = pooled
        elif fb is None:
            self.shadow[owner.id] = Shadow(owner.mem_size)
        else:
            data, private = self.file_maps.bytes_of(fb)
            self.shadow[owner.id] = Shadow(owner.mem_size, fb.start, private)
            # (the file's pages as they are, no copy: Patch.data is typed bytes for msgspec,
            # which decodes it as bytes, and a read-only memoryview reads as bytes do)
            self.file_patches.append(Patch(owner.id, fb.start, data))  # type: ignore[arg-type]  # (see above)

    def regions(self, things: list[Any]) -> list[tuple[Context | Buffer, int, int]]:
        """Byte ranges a step may have written: new objects, and the structs, data and graphs
        of the tensors and graphs it touched."""
        out: list[tuple[Context | Buffer, int, int]] = []
        for ctx in self.contexts:
            old_used = self._objects_end(ctx.id)
            old_end = 0 if old_used is None else ctx.object_end(old_used)
            new_end = ggml_used_mem(ctx) if not ctx.freed else old_end
            if new_end > old_end:
                out.append((ctx, old_end, new_end))
                if old_used is not None:  # the old last object's `next` now points at the new one
                    out.append((ctx, old_used, old_used + GGML_OBJECT_SIZE))
            elif new_end < old_end:  # ggml_reset: the list restarts at 0
                out.append((ctx, 0, min(old_end, ctx.mem_size)))
        for t in things:
            if t is Region.WORK_BUFFERS:
                for ctx in self.contexts:
                    if not ctx.freed:
                        out += self.work_buffers_of(ctx)
                out += self.backend.work_buffer_regions()
            elif t is Region.ALL_MEMORY:
                pools: list[Context | Buffer] = [*self.contexts, *self.backend.buffers]
                out += [(c, 0, c.mem_size) for c in pools if not c.freed]
            elif isinstance(t, StructOf):
                out.append((t.tensor.ctx, t.tensor.offs, t.tensor.offs + GGML_TENSOR_SIZE))
            elif isinstance(t, PoolRange):
                out.append((t.ctx, t.start, t.stop))
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
        patches, objects = [], []
        fields: list[FieldWrite] = []
        for ctx, a, b in self.regions(things):
            if ctx.id not in self.shadow or (ctx.freed and getattr(ctx, "mem_buffer_owned", True)):
                continue  # released memory (a freed context's own pool, a freed buffer)
            shadow = self.shadow[ctx.id]
            mirror = shadow.pooled  # (a pool that is its mirror's pages: Mirror.first_writes)
            for x, y, held in mirror.written.split(a, b) if mirror is not None else [(a, b, True)]:
                if not held and mirror is not None:
                    patches += [Patch(ctx.id, at, view) for at, view in mirror.first_writes(ctx.pool, x, y)]
                    continue
                for at, old in shadow.pieces(x, y):
                    patches += self._changes(ctx, shadow, at, old, fields)
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
        patches = self.file_patches + _dedupe(patches)  # (a file's bytes first: the changes are on top)
        self.file_patches = []
        return patches, _dedupe(fields), objects

    def _changes(self, ctx: Context | Buffer, shadow: Shadow, at: int, old: np.ndarray,
                 fields: list[FieldWrite]) -> list[Patch]:
        """One piece of a pool against its shadow: its patches (its fields' changes to fields)."""
        cur = ctx.pool[at:at + old.size]
        if old.size <= SMALL_REGION and cur.tobytes() == old.tobytes():
            return []  # (most regions are a struct nothing wrote: one compare, no numpy passes)
        patches = []
        starts, ends = changed_runs(cur, None if shadow.known_zeros(at, at + old.size) else old)
        for s, e in zip(starts, ends):
            if isinstance(ctx, Context):
                fields += self.field_writes(ctx, at + int(s), at + int(e))
            weights = isinstance(ctx, Buffer) and ctx.usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS
            data = self.mirrors.write(self.shadow, ctx.id, ctx.mem_size, weights, at + int(s), cur[s:e])
            if data is None:
                data = cur[s:e].tobytes()
                self.shadow[ctx.id].write(at + int(s), cur[s:e])
            patches.append(Patch(ctx.id, at + int(s), data))
        return patches

    def field_writes(self, ctx: Context, a: int, b: int) -> list[FieldWrite]:
        """Changed bytes that fall in an existing tensor struct, as field changes."""
        out = []
        objs = self.objects_of(ctx)
        old_end = self._objects_end(ctx.id)
        for o in objs[bisect_right(objs, a - GGML_TENSOR_SIZE, key=attrgetter("offs")):]:
            if o.offs >= b:
                break
            if o.type != GGML_OBJECT_TYPE_TENSOR or o.offs + GGML_TENSOR_SIZE <= a:
                continue
            if old_end is None or o.header > old_end:
                continue  # a new tensor: reported as an object, not as field writes
            old = self.shadow[ctx.id].read(o.offs, o.offs + GGML_TENSOR_SIZE).view(TENSOR)[0]
            new = ctx.pool[o.offs:o.offs + GGML_TENSOR_SIZE].view(TENSOR)[0]
            name = name_in(ctx.pool, o.offs).decode("utf-8", errors="replace")
            for span in TENSOR_SPANS:
                lo, hi = o.offs + span.offset, o.offs + span.offset + span.size
                if hi <= a or lo >= b:
                    continue
                ov, nv = field_text(old[span.name]), field_text(new[span.name])
                if ov != nv:
                    out.append(FieldWrite(ctx.id, o.offs, name, span.name, ov, nv))
        return out

    def work_buffers_of(self, ctx: Context) -> list[tuple[Context, int, int]]:
        """The regions of ctx's work buffer objects (ggml_graph_compute_with_ctx's), found again
        only when its object list has changed."""
        objs = self.objects_of(ctx)
        key = (len(objs), objs[-1].header if objs else None)
        hit = self.work_buffer_lists.get(ctx.id)
        if hit is None or hit[0] != key:
            hit = self.work_buffer_lists[ctx.id] = (key, [
                (ctx, o.offs, o.offs + o.size) for o in objs
                if o.type == GGML_OBJECT_TYPE_WORK_BUFFER and o.size])
        return hit[1]

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
             skip_if_empty: bool = False, fn: str = "", tensor: Tensor | None = None, **kw) -> Step | None:
        """Record a step (no `notes`: its changes described; `fn`: the facade function a call step
        is for, which those notes name; `tensor`: the one it made or computed). `things` are what
        it may have written: tensors, graphs, StructOf and Region (regions() reads them); the
        call's other arguments are passed along and ignored."""
        if len(self.steps) >= self.step_cap:
            raise StepCapReached(self.step_cap)
        self.backend.track_buffers()
        patches, fields, objects = self.diff(things)
        buffers = self.backend.snapshot_buffers()
        if skip_if_empty and not (patches or fields or objects or buffers):
            self.snapshot_meta()
            return None
        layer, n_past = self.marks.for_step(kind, tensor)
        step = Step(len(self.steps), kind, call, self.line,
                    notes or describe_changes(fn or call, objects, fields, patches),
                    objects=tuple(objects), fields=tuple(fields), patches=tuple(patches),
                    contexts=self.snapshot_meta(), buffers=buffers,
                    tensor=None if tensor is None else tensor_ref(tensor),
                    layer=layer, n_past=n_past, file=self.file_no, **kw)
        self.steps.append(step)
        self.cpu.after_step(step)
        if self.on_step is not None:
            self.on_step(step, [*self.contexts, *self.backend.buffers])
        return step

    def emitted(self, kind: StepKind, call: str, notes: tuple[Note, ...], things: list[Any],
                **kw) -> Step:
        """emit, of a step that is always recorded (not skip_if_empty)."""
        step = self.emit(kind, call, notes, things, **kw)
        assert step is not None
        return step

    def finish_call(self, call: Watched, result: Any) -> None:
        if isinstance(result, Tensor) and len(names := assigned_names(self.source(self.line))) == 1:
            self.variables[tensor_ref(result)] = names[0]  # `a = ggml_new_tensor_2d(...)`: the tensor's variable
        if Writes.OPT in call.writes:  # what the call made inside the contexts it holds
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
        if Writes.WALK in call.writes:  # the flags of the tensors the walk entered
            things += [StructOf(t) for t in self.walked]
            self.visiting = []
        things += [x for a in self.args if isinstance(a, (list, tuple)) for x in a]
        if Writes.PLACES in call.writes:
            things += self.backend.struct_writes()
        if Writes.OPT in call.writes:  # it writes tensors the program never named (weights,
            things.append(Region.ALL_MEMORY)  # gradients, moments, batches): every byte is compared
        if call.kind is Kind.OP:
            things = [StructOf(t) if isinstance(t, Tensor) else t for t in things]
        tensor = result if isinstance(result, Tensor) else None
        notes: tuple[Note, ...] = ()
        if Writes.DATA in call.writes and isinstance(self.args[0], Tensor):
            t = self.args[0]
            notes = (Note.of("wrote_data", fn=call.name, name=self.tensor_words(t), n=ggml_nbytes(t),
                             addr=f"{t.data:#x}"),)
        elif Writes.CONTEXT in call.writes and isinstance(result, Context):
            notes = (Note.of("init_no_alloc" if result.no_alloc else "init", size=result.mem_size,
                             addr=f"{result.base:#x}", id=result.id),)
        # after visits or nodes, the call's own step is only needed for changes not yet shown
        step = self.emit(StepKind.CALL, self.source(self.line), notes, things, tensor=tensor,
                         parent=self.call_step, skip_if_empty=self.call_step is not None, fn=call.name)
        self.backend.after_call(self.call_step if step is None else step.index)

    def tensor_words(self, t: Tensor) -> str:
        """How a note names a tensor: its name in quotes; when it has none, the program's
        variable it was made into (`a (unnamed)`), else `(unnamed)`."""
        if t.name:
            return f"'{t.name}'"
        var = self.variables.get(tensor_ref(t))
        return f"{var} {UNNAMED}" if var else UNNAMED

    def on_enter(self, node: Tensor) -> None:
        self.walked.append(node)
        # the walk is about to set this tensor's COMPUTE flag: the next step must show it
        if node.op != 0 and not node.flags & GGML_TENSOR_FLAG_COMPUTE:
            self.visiting.append(node)

    def on_visit(self, node: Tensor, slot: int, is_leaf: bool) -> None:
        words = self.tensor_words(node)
        entered = self.walked[self.shown:]
        self.emit(StepKind.VISIT, f"visit {words}",
                  (Note.of("visit_leaf" if is_leaf else "visit_node", name=words, op=GGMLOp(node.op).name,
                           slot=slot),),
                  [StructOf(node), *(StructOf(t) for t in self.visiting),
                   *(span for g in self.graph_args()
                     for span in visit_spans(g, is_leaf, entered, self.last_visited))],
                  parent=self.call_step, tensor=node)
        self.visiting, self.shown, self.last_visited = [], len(self.walked), slot

    def graph_args(self) -> list[Graph]:
        return [a for a in self.args if isinstance(a, Graph)]

    def on_node(self, node: Tensor, ask: bool, shares: list[ThreadShare | None] | None) -> bool:
        if self.graph_only():  # (a loop's graph told node by node: one with an abort callback)
            if not ask:
                self.cpu.node(node)
            return True
        if ask:
            if self.call_step is None:
                plan = G.ggml_graph_plan(next(a for a in self.args if isinstance(a, Graph)),
                                         self.backend.compute_threads())
                self.call_step = self.emitted(
                    StepKind.CALL, self.source(self.line),
                    (Note.of("planned", n=plan.n_threads, size=plan.work_size), Note("walk_together")),
                    [Region.ALL_MEMORY] if Writes.OPT in self.active_writes() else [],
                    plan=ComputePlan(plan.n_threads, plan.work_size, tuple(plan.n_tasks))).index
            return True
        assert shares is not None  # (told after the node: its threads' shares)
        threads = tuple(s for s in shares if s is not None)
        desc = f"{GGMLOp(node.op).name} -> '{node.name}'"
        same = self.cpu.node(node)
        self.emit(StepKind.NODE, desc, (Note.of("computed", desc=desc, n=len(threads)),),
                  [node, Region.WORK_BUFFERS, *written_sources(node)], parent=self.call_step, tensor=node,
                  threads=threads, same_on_every_cpu=same)
        return True

    __call__ = on_node  # (the compute observer: COMPUTE_OBSERVER)

    def active_writes(self) -> Writes:
        """What the facade call in progress declares it writes (nothing outside one)."""
        return self.watched[self.active.f_code].writes if self.active is not None else Writes(0)

    def graph_only(self) -> bool:
        """In a training loop (one step) graphs compute unwatched; which nodes' values depend on
        the CPU is followed after each (after_graph)."""
        return Writes.LOOP in self.active_writes()

    def after_graph(self, nodes: list[Tensor]) -> None:
        for node in nodes:
            self.cpu.node(node)

    def n_threads_arg(self) -> int:
        ints = [a for a in self.args if isinstance(a, int) and not isinstance(a, bool)]
        return ints[-1] if ints else self.n_threads


def _dedupe(items: list) -> list:
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def record(program: Callable[..., dict], source_file: str, name: str, n_threads: int = 1,
           on_step: Callable[[Step, list[Context | Buffer]], None] | None = None,
           step_cap: int | None = None, also: tuple[str, ...] = (), **kwargs) -> Trace:
    """Run `program(n_threads=..., **kwargs)` once and return its trace. The facade calls made
    from the files `also` names are steps too (a model walkthrough steps through the engine's
    model builders, engine/models/).

    The program returns its outputs as {name: tensor or value}; they are kept as nested lists.
    An exception it raises, or a limit that stops it (`ProgramStopped`: the step cap, a sandbox's
    limits), is the last step, at the program's line it passed through last.
    """
    rec = Recorder(source_file, n_threads, on_step, step_cap, also)
    package = Path(G.__file__).resolve().parents[1]
    trace = Trace(name, Path(source_file).read_text(), n_threads,
                  also=tuple((_shown_path(f, package), Path(f).read_text()) for f in also))
    outputs: dict = {}
    token = COMPUTE_OBSERVER.set(rec)
    copy_token = COPY_OBSERVER.set(rec.backend.on_copy)
    with fresh_address_space():
        rec.space = current_address_space()
        rec.space.pool_maker = rec.mirrors.pool_for  # (repacked weights: their mirror's pages)
        prev = sys.gettrace()
        sys.settrace(rec.on_call)
        try:
            outputs = program(n_threads=n_threads, **kwargs) or {}
        except (Exception, ProgramStopped) as e:  # noqa: BLE001 - any error of the program's (or the
            # limit that stopped it) is the final step, at the program's line it passed through last
            sys.settrace(prev)
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
            sys.settrace(prev)
            COMPUTE_OBSERVER.reset(token)
            COPY_OBSERVER.reset(copy_token)
        trace.outputs = {k: _plain(v) for k, v in outputs.items()}
    if trace.error is None:
        rec.emit(StepKind.END, "", (Note("returned"),), [])
    trace.steps = rec.steps
    release(rec.space)
    rec.shadow.clear()  # (now, not when the collector finds the recorder's cycles: a model's MBs)
    return trace


def _plain(v: Any) -> Any:
    if isinstance(v, Tensor):
        try:
            data = G.to_numpy(v)
        except TensorBoundsError as e:  # a view whose bytes leave its pool: the output says why
            return str(e)
        return data.tolist() if not TYPE_TRAITS[v.type].is_quantized else data.tobytes().hex()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v
