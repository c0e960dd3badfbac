"""The records a trace is made of: immutable steps and what each one changed.

They are the seam between the engine and whoever shows a trace (the web app, the command line):
frozen dataclasses and enums, so nothing is read by position.
"""

from __future__ import annotations

from dataclasses import astuple, asdict, dataclass
from enum import StrEnum


class StepKind(StrEnum):
    """What a step is."""

    CALL = "call"  # a facade call the program made
    VISIT = "visit"  # a tensor new to a graph being built
    NODE = "node"  # a node computed, with each thread's share
    END = "end"  # the program returned
    ERROR = "error"  # the program raised: its message is the trace's error
    CAP = "cap"  # the step cap ended a runaway program


@dataclass(frozen=True, slots=True)
class ContextMeta:
    """A context's metadata after a step: enough, with its pool bytes, to rebuild it."""

    id: int  # the context's small stable id
    base: int  # simulated address of pool byte 0
    mem_size: int
    objects_end: int | None  # header offset of the last object, None while empty
    no_alloc: bool

    def astuple(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True, slots=True)
class ComputePlan:
    """ggml_graph_plan's answer for a compute step."""

    n_threads: int
    work_size: int  # bytes of the work buffer
    n_tasks: tuple[int, ...]  # per node

    def astuple(self) -> tuple:
        return astuple(self)


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
    data: bytes  # the bytes after the step

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True, slots=True)
class ThreadShare:
    ith: int
    kind: str
    ranges: tuple
    seconds: float
    note: str


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    kind: StepKind
    call: str  # the call as the program wrote it (or the node's description)
    line: int  # the program's line
    note: str  # what happened, in plain words
    parent: int | None = None  # the call step a visit or node belongs to
    objects: tuple[ObjectAdded, ...] = ()
    fields: tuple[FieldWrite, ...] = ()
    patches: tuple[Patch, ...] = ()
    contexts: tuple[ContextMeta, ...] = ()  # the contexts whose metadata the step changed
    tensor: tuple[int, int] | None = None  # (ctx, struct offset) of the tensor the step is about
    threads: tuple[ThreadShare, ...] = ()
    plan: ComputePlan | None = None  # for the step that planned a compute
    # False for a node whose values depend on the CPU: computed by a BLAS product, or from such
    # values (see engine.compute.kernels.BLAS_PATHS); the hash leaves its bytes out
    same_on_every_cpu: bool = True

    def changes(self) -> dict:
        """The step's changes as plain data (for JSON)."""
        return {"objects": [asdict(o) for o in self.objects],
                "fields": [asdict(f) for f in self.fields],
                "data": [{"ctx": p.ctx, "start": p.offset, "end": p.end} for p in self.patches]}
