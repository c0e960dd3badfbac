"""The records a trace is made of: immutable steps and what each one changed, and how a step
says its call (the whole statement) and its changes in plain words.

The records are the seam between the engine and whoever shows a trace (the web app, the command
line): frozen dataclasses and enums, so nothing is read by position.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import astuple, asdict, dataclass
from enum import StrEnum

import numpy as np

from engine.compute.shares import ThreadShare, plain
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.core.notes import Note, tell
from engine.core.tensor import Tensor

TensorRef = tuple[int, int]  # a tensor as steps name it: (context or buffer id, struct offset)


def tensor_ref(t: Tensor) -> TensorRef:
    return (t.ctx.id, t.offs)


class StepKind(StrEnum):
    """What a step is."""

    CALL = "call"  # a facade call the program made
    VISIT = "visit"  # a tensor new to a graph being built
    NODE = "node"  # a node computed, with each thread's share
    END = "end"  # the program returned
    ERROR = "error"  # the program raised: its message is the trace's error
    CAP = "cap"  # the step cap ended a runaway program
    ALLOC = "alloc"  # one decision of the graph allocator's plan (allocate, reuse in place, free)
    PASS = "pass"  # one pass of the backend scheduler, with the backend it gave each tensor
    SPLIT = "split"  # one split of the scheduled graph: a run of nodes on one backend
    COPY = "copy"  # the scheduler copied a split's input to the split's backend


@dataclass(frozen=True, slots=True)
class ContextMeta:
    """A context's metadata after a step: enough, with its pool bytes, to rebuild it."""

    id: int  # the context's small stable id
    base: int  # simulated address of pool byte 0
    mem_size: int
    objects_end: int | None  # header offset of the last object, None while empty
    no_alloc: bool
    freed: bool = False  # ggml_free released its pool: a rebuilt state no longer holds it

    def astuple(self) -> tuple:
        t = astuple(self)
        return t if self.freed else t[:-1]  # (as before `freed` was recorded: hashes stay)


@dataclass(frozen=True, slots=True)
class ComputePlan:
    """ggml_graph_plan's answer for a compute step."""

    n_threads: int
    work_size: int  # bytes of the work buffer
    n_tasks: tuple[int, ...]  # per node

    def astuple(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True, slots=True)
class BufferMeta:
    """A backend buffer after a step: enough, with its bytes, to rebuild it."""

    id: int  # from the same count as the contexts' ids
    base: int  # simulated address of its first byte
    size: int
    name: str  # its buffer type's name (CPU, GPU0, ...)
    usage: int  # GGML_BACKEND_BUFFER_USAGE_ANY / WEIGHTS / COMPUTE
    is_host: bool

    def astuple(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True, slots=True)
class Placement:
    """The backend a scheduler pass gave one tensor, and why (ggml's cause codes: 1.dst, 1.inp,
    1.wgt0, 1.off, 2.sup, 3.best, 3.upg, 4.vsrc, 4.cur, usr; 5.cpy for a split input's copy)."""

    tensor: tuple[int, int]  # (ctx, struct offset)
    backend_id: int
    backend: str
    cause: str


@dataclass(frozen=True, slots=True)
class AllocDecision:
    """One decision of the graph allocator: 'alloc', 'inplace' (take over `parent`'s bytes) or
    'free' (after the tensor's last child), at node `node` (-1: leafs and inputs, before any)."""

    kind: str
    tensor: tuple[int, int]
    buffer_id: int
    buffer: str  # the buffer type's name
    chunk: int
    offset: int
    size: int
    node: int
    parent: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class SplitInfo:
    """One split of a scheduled graph: nodes [i_start, i_end) on one backend, and the tensors
    copied in for it."""

    index: int
    backend_id: int
    backend: str
    i_start: int
    i_end: int
    inputs: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class ObjectAdded:
    ctx: int  # context id
    header: int  # offset of the object header
    offs: int
    size: int
    type: str  # TENSOR, GRAPH, WORK_BUFFER
    name: str  # the tensor's name when the step ended


@dataclass(frozen=True, slots=True)
class FieldWrite:
    ctx: int
    struct: int  # offset of the tensor struct
    tensor: str
    field: str
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class Patch:
    ctx: int
    offset: int
    data: bytes  # the bytes after the step (or a read-only memoryview of a file's pages: a model's weights)

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    kind: StepKind
    call: str  # the call as the program wrote it (or the node's description)
    line: int  # the program's line
    notes: tuple[Note, ...]  # what happened, in plain words (engine/core/notes.py tells them)
    parent: int | None = None  # the call step a visit or node belongs to
    objects: tuple[ObjectAdded, ...] = ()
    fields: tuple[FieldWrite, ...] = ()
    patches: tuple[Patch, ...] = ()
    contexts: tuple[ContextMeta, ...] = ()  # the contexts whose metadata the step changed
    tensor: tuple[int, int] | None = None  # (ctx, struct offset) of the tensor the step is about
    threads: tuple[ThreadShare, ...] = ()
    plan: ComputePlan | None = None  # for the step that planned a compute
    # False for a node whose values depend on the CPU: computed by a BLAS product, or from such
    # values (see KernelInfo.blas, engine.compute.kernels); the hash leaves its bytes out
    same_on_every_cpu: bool = True
    buffers: tuple[BufferMeta, ...] = ()  # the backend buffers whose metadata the step changed
    placements: tuple[Placement, ...] = ()  # a scheduler pass's assignments
    decision: AllocDecision | None = None  # a graph allocator step's decision
    split: SplitInfo | None = None  # a scheduler split step's split
    # where in the program: the layer (the program's loop variable `il`, as llama.cpp names it;
    # a node's or visit's: the layer its tensor was made in) and the forward pass (its `n_past`)
    layer: int | None = None
    n_past: int | None = None
    # which file `line` is in: 0 the program's, k > 0 the walkthrough's k-th other file
    # (Trace.also[k - 1]: the engine's model builders a model walkthrough steps through)
    file: int = 0

    def hash_bytes(self) -> bytes:
        """What the trace's content hash takes from this step: everything but timings, which
        thread took which chunk (that varies from run to run: the union is taken) and the bytes
        whose values depend on the CPU (only which contexts they changed)."""
        shares = (sorted({str(t.kind) for t in self.threads}),
                  sorted(repr(plain(r)) for t in self.threads for r in t.ranges))
        data = [(p.ctx, p.offset, hashlib.sha1(p.data).hexdigest()) for p in self.patches] \
            if self.same_on_every_cpu else sorted({p.ctx for p in self.patches})
        # (kind, contexts, plan and notes as the plain values they were before they were records,
        # so hashes and golden traces stay as they were)
        out = repr((self.index, self.kind.value, self.call, self.line, tell(self.notes), self.parent,
                    self.objects, self.fields, data, tuple(c.astuple() for c in self.contexts),
                    self.tensor, shares, self.plan.astuple() if self.plan else ())).encode()
        if self.buffers or self.placements or self.decision or self.split:  # backend programs
            out += repr((self.buffers, self.placements, self.decision, self.split)).encode()
        if self.layer is not None or self.n_past is not None:  # programs with layers or passes
            out += repr((self.layer, self.n_past)).encode()
        if self.file:  # a line in another file of the walkthrough
            out += repr(("file", self.file)).encode()
        return out

    def changes(self) -> dict:
        """The step's changes as plain data (for JSON)."""
        return {"objects": [asdict(o) for o in self.objects],
                "fields": [asdict(f) for f in self.fields],
                "data": [{"ctx": p.ctx, "start": p.offset, "end": p.end} for p in self.patches]}


# --- a step's call and changes in plain words -------------------------------------------------------

def field_text(v) -> str:
    """A struct field's value as a step shows it (old -> new): names as text, big numbers as
    addresses."""
    if isinstance(v, bytes):
        return repr(v.split(b"\0", 1)[0].decode("utf-8", "replace"))
    if isinstance(v, np.ndarray):
        return "[" + ", ".join(f"{int(x):#x}" if v.dtype == np.uint64 and int(x) > 1 << 32
                               else str(int(x)) for x in v) + "]"
    if isinstance(v, (np.integer, int)):
        x = int(v)
        return f"{x:#x}" if x > 1 << 32 else str(x)
    return str(v)


MANY_OBJECTS = 4  # a step that makes more objects than this says so in one sentence


def describe_changes(call: str, objects, fields, patches) -> tuple[Note, ...]:
    """A plain-words summary of a step's changes."""
    fn = call.split("(")[0].split("=")[-1].strip()
    parts = []
    if len(objects) > MANY_OBJECTS:  # (a file's tensors loaded at once: one sentence, not hundreds)
        tensors = [o for o in objects if o.type == "TENSOR"]
        parts.append(Note.of(
            "reserved_many", fn=fn, n=len(objects), first=f"{min(o.header for o in objects):#x}",
            end=f"{max(o.offs + o.size for o in objects):#x}", tensors=len(tensors), struct=GGML_TENSOR_SIZE,
            header=GGML_OBJECT_SIZE, data=sum(o.size - GGML_TENSOR_SIZE for o in tensors),
            graphs=sum(o.type == "GRAPH" for o in objects), work=sum(o.type == "WORK_BUFFER" for o in objects)))
    for o in objects if len(objects) <= MANY_OBJECTS else ():
        if o.type == "TENSOR":
            data = o.size - GGML_TENSOR_SIZE
            sizes: dict[str, str | int] = dict(fn=fn, header=GGML_OBJECT_SIZE, struct=GGML_TENSOR_SIZE,
                                               offset=f"{o.header:#x}")
            parts.append(Note.of("reserved_tensor", data=data, **sizes) if data > 0 else
                         Note.of("reserved_tensor_no_data", **sizes))
        elif o.type == "GRAPH":
            parts.append(Note.of("reserved_graph", fn=fn, size=o.size, offset=f"{o.offs:#x}"))
        else:
            parts.append(Note.of("reserved_work", fn=fn, size=o.size, offset=f"{o.offs:#x}"))
    for f in fields[:6]:
        parts.append(Note.of("set_field", field=f.field, tensor=f.tensor, old=f.old, new=f.new))
    if len(fields) > 6:
        parts.append(Note.of("more_fields", n=len(fields) - 6))
    if not objects and not fields and patches:
        parts.append(Note.of("wrote", n=sum(len(p.data) for p in patches)))
    return tuple(parts) or (Note.of("nothing", fn=fn),)


ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][\w, ]*?)\s*=[^=]")


def assigned_names(statement: str) -> list[str]:
    """The variables a statement assigns (`a = …`: ["a"]; `x, y = …`: ["x", "y"]; else [])."""
    m = ASSIGNMENT.match(statement)
    return m.group(1).replace(" ", "").split(",") if m else []


def statement_spans(source: str) -> dict[int, tuple[int, int]]:
    """For each line, the (first, last) line of the simple statement containing it."""
    spans: dict[int, tuple[int, int]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.If, ast.For,
                                                                ast.While, ast.With, ast.Try,
                                                                ast.ClassDef)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                spans[line] = (node.lineno, node.end_lineno or node.lineno)
    return spans
