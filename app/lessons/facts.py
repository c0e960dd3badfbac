"""The facts a lesson asks about, read from a recorded trace: never typed into a lesson.

A question names a step of a walkthrough (a `Selector`: the step's call text, its kind, which
occurrence) and a fact of the state after it (a `TraceFact`: a kind from the table below and the few
parameters that kind reads: a tensor, a field, a thread, a split...). `resolve` rebuilds the
state after that step and reads the fact there, as ggml would answer it at that moment:
`ggml_used_mem` of the context, a tensor's `nb[1]`, the offset its data lands at, the graph's node
count, a node's `n_tasks` in the compute plan, the tensor gallocr places at an offset, a quant
block's bytes, the KV cells in use...

Tensors are named by a spec: `$b` is the tensor the program last assigned to its variable `b`
(a step whose call is `b = ggml_...`), `kq-0` the tensor ggml names so (the newest, when several
contexts hold one), `@` the tensor the step itself is about; a suffix `.src0`, `.src1` or
`.view_src` follows that pointer. The engine owns every number: this module only finds the step,
the tensor and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from engine.compute.kernels.common import view4
from engine.compute.shares import Interval
from engine.core.context import GGML_OBJECT_TYPE_TENSOR, Pool, ggml_used_mem
from engine.core.graph import Graph
from engine.core.layout import GGML_OBJECT_SIZE
from engine.core.optable import ggml_op_name
from engine.core.tensor import Tensor, ggml_n_dims, ggml_nbytes
from engine.core.types import TYPE_TRAITS, ggml_type_name
from engine.trace import State, Step, StepKind, Trace

TensorRef = tuple[int, int]  # (context or buffer id, struct offset), as steps name a tensor
SUFFIXES = ("src0", "src1", "src2", "view_src")  # the pointers a tensor spec may follow


class FactError(ValueError):
    """A question that does not resolve on this trace: its step or its tensor is not there, or
    the fact has no value at that step. The message names what is missing."""


@dataclass(frozen=True, slots=True)
class Picked:
    """A fact whose value is a tensor (a graph's first leaf, the tensor gallocr placed)."""

    ref: TensorRef


@dataclass(frozen=True, slots=True)
class Shape:
    """A fact whose value is a shape: ne without its trailing 1s (ggml's n_dims)."""

    ne: tuple[int, ...]


Value = int | float | str | Picked | Shape


@dataclass(frozen=True, slots=True)
class Selector:
    """Which step of a trace a question is about: the `nth` step (1-based; -1 the last) whose
    call text contains `call`, of kind `kind` when given. `call` may be left out for a kind
    alone; `index` names the step by its number (fragile: a program edited moves it)."""

    call: str | None = None
    kind: StepKind | None = None
    nth: int = 1
    index: int | None = None

    def find(self, trace: Trace) -> int:
        """The step's index in `trace` (FactError when there is none)."""
        if self.nth == 0:
            raise FactError("nth counts from 1 (or from -1, the last)")
        if self.index is not None:
            if not 0 <= self.index < len(trace.steps):
                raise FactError(f"step {self.index} is outside the trace (0..{len(trace.steps) - 1})")
            return self.index
        found = [s.index for s in trace.steps
                 if (self.call is None or self.call in s.call) and (self.kind is None or s.kind == self.kind)]
        at = self.nth - 1 if self.nth > 0 else self.nth
        if not found or not -len(found) <= at < len(found):
            raise FactError(f"no step #{self.nth} whose call holds {self.call!r} (kind {self.kind}): "
                            f"{len(found)} found")
        return found[at]


@dataclass(frozen=True, slots=True)
class TraceFact:
    """A fact of the state after a step: its kind (a row of FACTS) and what that kind reads."""

    kind: str
    tensor: str | None = None  # a tensor spec ($var, a name, @)
    field: str | None = None  # a struct field: ne[i], nb[i], view_offs, op, type, n_dims
    of: str | None = None  # a second tensor spec (offset_in: the tensor the offset is from)
    index: int | None = None  # an element, a leaf or node, a split, an output's item
    ith: int | None = None  # a thread
    key: str | None = None  # an output of the program (what run() returned)

    def check(self) -> None:
        """ValueError unless the kind exists and gets exactly the parameters it reads."""
        kind = FACTS.get(self.kind)
        if kind is None:
            raise ValueError(f"unknown fact kind {self.kind!r}; the kinds are {', '.join(FACTS)}")
        given = {name for name in ("tensor", "field", "of", "index", "ith", "key") if getattr(self, name) is not None}
        if given - kind.reads or kind.needs - given:
            raise ValueError(f"fact {self.kind!r} reads {sorted(kind.reads)} (needs {sorted(kind.needs)}); "
                             f"given {sorted(given)}")


class Scene:
    """A trace after step k, as the facts read it: the step, the state rebuilt (once), the
    tensors found by spec."""

    def __init__(self, trace: Trace, k: int, state: State | None = None) -> None:
        self.trace, self.k, self.step = trace, k, trace.steps[k]
        if state is not None:
            self.__dict__["state"] = state

    @cached_property
    def state(self) -> State:
        return self.trace.state_at(self.k)

    def tensor(self, spec: str | None) -> Tensor:
        """The tensor a spec names at this step (FactError when none does; None: a fact that names
        none, which its kind's check refuses)."""
        if spec is None:
            raise FactError("the fact names no tensor")
        base, _, follow = spec.rpartition(".")
        if follow in SUFFIXES and base:
            t = self.tensor(base)
            found = t.view_src if follow == "view_src" else t.src[int(follow[3:])]
            if found is None:
                raise FactError(f"{base} has no {follow}")
            return found
        ref = self.ref(spec)
        if ref[0] not in self.state.contexts:
            raise FactError(f"{spec}'s context is freed after step {self.k}")
        return self.state.tensor(ref)

    def ref(self, spec: str | None) -> TensorRef:
        """The (context, struct offset) of the tensor a spec names (no pointer suffix)."""
        if spec is None:
            raise FactError("the fact names no tensor")
        if spec == "@":
            if self.step.tensor is None:
                raise FactError(f"step {self.k} ({self.step.call!r}) is about no tensor")
            return self.step.tensor
        if spec.startswith("$"):
            var = spec[1:]
            for s in reversed(self.trace.steps[:self.k + 1]):
                if s.kind == StepKind.CALL and s.tensor is not None and var in assigned(s.call):
                    return s.tensor
            raise FactError(f"no call up to step {self.k} assigns a tensor to {var!r}")
        named = [(t.ctx.id, t.offs) for t in self.state.tensors() if t.name == spec]
        if not named:
            raise FactError(f"no tensor is named {spec!r} after step {self.k}")
        return named[-1]

    def context(self, t: Tensor | None = None):
        """The context a fact about memory reads: the tensor's, else the step's tensor's, else
        the newest context."""
        if t is not None:
            return t.ctx
        if self.step.tensor is not None and self.step.tensor[0] in self.state.contexts:
            return self.state.contexts[self.step.tensor[0]]
        if not self.state.contexts:
            raise FactError(f"no context is live after step {self.k}")
        return self.state.contexts[max(self.state.contexts)]

    def graph(self) -> Graph:
        """The newest graph in the pools."""
        graphs = self.state.graphs()
        if not graphs:
            raise FactError(f"no graph is in the pools after step {self.k}")
        return graphs[-1]

    def latest(self, test: Callable[[Step], bool]) -> Step:
        """The last step up to this one that passes `test`."""
        for s in reversed(self.trace.steps[:self.k + 1]):
            if test(s):
                return s
        raise FactError(f"no step up to {self.k} has what this fact reads")


ASSIGNMENT = re.compile(r"^\s*([\w.]+(?:\s*,\s*[\w.]+)*)\s*=(?!=)")


def assigned(call: str) -> list[str]:
    """The variables (or attributes, `model.a`) a statement assigns: `x, y = …` gives x and y."""
    m = ASSIGNMENT.match(call)
    return [v.strip() for v in m.group(1).split(",")] if m else []


# --- the table of fact kinds ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FactKind:
    name: str
    read: Callable[[Scene, TraceFact], Value]
    needs: frozenset[str]  # the parameters it must be given
    reads: frozenset[str]  # every parameter it reads
    doc: str  # what it is, for the lesson format's reference (docs and tests)


FACTS: dict[str, FactKind] = {}


def fact(name: str, needs: tuple[str, ...] = (), optional: tuple[str, ...] = ()):
    """Registers a fact kind: `needs` the parameters it must be given, `optional` those it may."""
    def register(fn: Callable[[Scene, TraceFact], Value]) -> Callable[[Scene, TraceFact], Value]:
        FACTS[name] = FactKind(name, fn, frozenset(needs), frozenset(needs + optional),
                               (fn.__doc__ or "").strip())
        return fn
    return register


def _index(f: TraceFact) -> int:
    """The fact's index, for a kind that needs one (its check refuses a fact without)."""
    if f.index is None:
        raise FactError(f"the fact {f.kind!r} names no index")
    return f.index


def _tensor(scene: Scene, f: TraceFact) -> Tensor | None:
    return scene.tensor(f.tensor) if f.tensor is not None else None


@fact("mem_size", optional=("tensor",))
def _mem_size(scene: Scene, f: TraceFact) -> int:
    """The context's mem_size: the pool's bytes (the tensor's context, else the step's)."""
    return scene.context(_tensor(scene, f)).mem_size


@fact("used_mem", optional=("tensor",))
def _used_mem(scene: Scene, f: TraceFact) -> int:
    """ggml_used_mem of the context after the step: where its last object ends."""
    return ggml_used_mem(scene.context(_tensor(scene, f)))


@fact("n_objects", optional=("tensor",))
def _n_objects(scene: Scene, f: TraceFact) -> int:
    """The objects in the context's list (tensors, graphs, work buffers)."""
    return len(scene.state.headers(scene.context(_tensor(scene, f)).id))


@fact("n_tensors", optional=("tensor",))
def _n_tensors(scene: Scene, f: TraceFact) -> int:
    """The tensor objects in the context's list."""
    return sum(h[3] == GGML_OBJECT_TYPE_TENSOR for h in scene.state.headers(scene.context(_tensor(scene, f)).id))


@fact("object_offset", needs=("tensor",))
def _object_offset(scene: Scene, f: TraceFact) -> int:
    """Where the tensor's ggml_object header lies in its context's pool."""
    return scene.tensor(f.tensor).offs - GGML_OBJECT_SIZE


@fact("object_bytes", needs=("tensor",))
def _object_bytes(scene: Scene, f: TraceFact) -> int:
    """The pool bytes the tensor's object takes: its header and its payload (struct, data, padding)."""
    t = scene.tensor(f.tensor)
    size = next((h[2] for h in scene.state.headers(t.ctx.id) if h[1] == t.offs), None)
    if size is None:
        raise FactError(f"{f.tensor} is no object of context {t.ctx.id}")
    return GGML_OBJECT_SIZE + size


def _where(t: Tensor, spec: str | None) -> tuple[Pool, int]:
    if t.data is None:
        raise FactError(f"{spec} has no data (NULL) at this step")
    return t.ctx.space.resolve(t.data)


@fact("data_offset", needs=("tensor",))
def _data_offset(scene: Scene, f: TraceFact) -> int:
    """Where the tensor's data starts: its offset in the pool or backend buffer holding it."""
    return _where(scene.tensor(f.tensor), f.tensor)[1]


@fact("offset_in", needs=("tensor", "of"))
def _offset_in(scene: Scene, f: TraceFact) -> int:
    """How far the tensor's data starts after the data of `of` (a tensor's offset in a blob)."""
    t, base = scene.tensor(f.tensor), scene.tensor(f.of)
    if t.data is None or base.data is None:
        raise FactError(f"{f.tensor} or {f.of} has no data at this step")
    return t.data - base.data


FIELD = re.compile(r"^(ne|nb)\[([0-3])\]$")


@fact("field", needs=("tensor", "field"))
def _field(scene: Scene, f: TraceFact) -> int | str:
    """A field of the tensor's struct: ne[i], nb[i], view_offs, n_dims, op (its name), type (its name)."""
    t = scene.tensor(f.tensor)
    m = FIELD.match(f.field or "")
    if m:
        return int((t.ne if m.group(1) == "ne" else t.nb)[int(m.group(2))])
    by_name: dict[str, Callable[[], int | str]] = {
        "view_offs": lambda: t.view_offs, "n_dims": lambda: ggml_n_dims(t),
        "op": lambda: ggml_op_name(t.op), "type": lambda: ggml_type_name(t.type)}
    if f.field not in by_name:
        raise FactError(f"unknown field {f.field!r}: ne[i], nb[i], {', '.join(by_name)}")
    return by_name[f.field]()


@fact("shape", needs=("tensor",))
def _shape(scene: Scene, f: TraceFact) -> Shape:
    """The tensor's ne, without the trailing 1s."""
    t = scene.tensor(f.tensor)
    return Shape(tuple(int(n) for n in t.ne[:ggml_n_dims(t)]))


@fact("nbytes", needs=("tensor",))
def _nbytes(scene: Scene, f: TraceFact) -> int:
    """ggml_nbytes: the bytes the tensor's elements span."""
    return ggml_nbytes(scene.tensor(f.tensor))


@fact("block_bytes", needs=("tensor",))
def _block_bytes(scene: Scene, f: TraceFact) -> int:
    """ggml_type_size of the tensor's type: the bytes of one block (one element for F32)."""
    return TYPE_TRAITS[scene.tensor(f.tensor).type].type_size


@fact("block_elements", needs=("tensor",))
def _block_elements(scene: Scene, f: TraceFact) -> int:
    """ggml_blck_size of the tensor's type: the elements one block holds."""
    return TYPE_TRAITS[scene.tensor(f.tensor).type].blck_size


@fact("source", needs=("tensor", "index"))
def _source(scene: Scene, f: TraceFact) -> Picked:
    """The tensor's src[index]."""
    found = scene.tensor(f.tensor).src[_index(f)]
    if found is None:
        raise FactError(f"{f.tensor} has no src[{f.index}]")
    return Picked((found.ctx.id, found.offs))


@fact("n_nodes")
def _n_nodes(scene: Scene, f: TraceFact) -> int:
    """The newest graph's n_nodes."""
    return scene.graph().n_nodes


@fact("n_leafs")
def _n_leafs(scene: Scene, f: TraceFact) -> int:
    """The newest graph's n_leafs."""
    return scene.graph().n_leafs


@fact("leaf", needs=("index",))
def _leaf(scene: Scene, f: TraceFact) -> Picked:
    """The newest graph's leafs[index]."""
    leafs, i = scene.graph().leafs, _index(f)
    if not -len(leafs) <= i < len(leafs):
        raise FactError(f"the graph has {len(leafs)} leafs; no leafs[{i}]")
    return Picked((leafs[i].ctx.id, leafs[i].offs))


@fact("node", needs=("index",))
def _node(scene: Scene, f: TraceFact) -> Picked:
    """The newest graph's nodes[index] (-1: the last, the result)."""
    nodes, i = scene.graph().nodes, _index(f)
    if not -len(nodes) <= i < len(nodes):
        raise FactError(f"the graph has {len(nodes)} nodes; no nodes[{i}]")
    return Picked((nodes[i].ctx.id, nodes[i].offs))


@fact("node_index", needs=("tensor",))
def _node_index(scene: Scene, f: TraceFact) -> int:
    """The tensor's place among the newest graph's nodes (the order they are computed in)."""
    t = scene.tensor(f.tensor)
    nodes = scene.graph().nodes
    if t not in nodes:
        raise FactError(f"{f.tensor} is no node of the graph")
    return nodes.index(t)


@fact("n_tasks", needs=("tensor",))
def _n_tasks(scene: Scene, f: TraceFact) -> int:
    """The threads the latest compute plan gives the node (ggml_graph_plan's n_tasks)."""
    t = scene.tensor(f.tensor)
    plan = scene.latest(lambda s: s.plan is not None).plan
    assert plan is not None  # (latest found a step with one)
    for g in reversed(scene.state.graphs()):
        nodes = g.nodes
        if len(nodes) == len(plan.n_tasks) and t in nodes:
            return plan.n_tasks[nodes.index(t)]
    raise FactError(f"{f.tensor} is in no graph of the plan's {len(plan.n_tasks)} nodes")


@fact("work_size")
def _work_size(scene: Scene, f: TraceFact) -> int:
    """The work buffer's bytes in the latest compute plan."""
    plan = scene.latest(lambda s: s.plan is not None).plan
    assert plan is not None  # (latest found a step with one)
    return plan.work_size


def _share(scene: Scene, f: TraceFact):
    if scene.step.kind != StepKind.NODE:
        raise FactError(f"step {scene.k} computes no node")
    share = next((t for t in scene.step.threads if t.ith == f.ith), None)
    if share is None or share.kind != "rows":
        raise FactError(f"thread {f.ith} took no rows of step {scene.k}'s node")
    return [(int(r.start), int(r.end)) for r in share.ranges if isinstance(r, Interval)]  # (rows: Intervals)


@fact("thread_rows", needs=("ith",))
def _thread_rows(scene: Scene, f: TraceFact) -> int:
    """How many rows thread `ith` computed of the step's node (a kernel that splits by rows)."""
    return sum(end - start for start, end in _share(scene, f))


@fact("thread_first_row", needs=("ith",))
def _thread_first_row(scene: Scene, f: TraceFact) -> int:
    """The first row thread `ith` computed of the step's node."""
    rows = _share(scene, f)
    if not rows:
        raise FactError(f"thread {f.ith} computed no rows at step {scene.k}")
    return rows[0][0]


def _decision(scene: Scene, ref: TensorRef | None = None):
    if ref is None:
        if scene.step.decision is None:
            raise FactError(f"step {scene.k} is no decision of the graph allocator")
        return scene.step.decision
    return scene.latest(lambda s: s.decision is not None and s.decision.kind != "free"
                        and s.decision.tensor == ref).decision


@fact("gallocr_offset", needs=("tensor",))
def _gallocr_offset(scene: Scene, f: TraceFact) -> int:
    """The offset in its buffer that gallocr's latest decision up to the step gave the tensor."""
    return _decision(scene, scene.ref(f.tensor)).offset


@fact("gallocr_tensor")
def _gallocr_tensor(scene: Scene, f: TraceFact) -> Picked:
    """The tensor the step's gallocr decision places (or frees)."""
    return Picked(_decision(scene).tensor)


@fact("gallocr_kind")
def _gallocr_kind(scene: Scene, f: TraceFact) -> str:
    """What the step's gallocr decision is: alloc, inplace (a parent's bytes reused) or free."""
    return _decision(scene).kind


@fact("buffer_size", needs=("tensor",))
def _buffer_size(scene: Scene, f: TraceFact) -> int:
    """The size of the backend buffer (or pool) holding the tensor's data."""
    holder = _where(scene.tensor(f.tensor), f.tensor)[0]
    return holder.mem_size


def _splits(scene: Scene) -> list:
    """The splits of the scheduling the step belongs to (its sched call and the steps under it),
    else of the latest one before it."""
    call: int | None = scene.step.parent if scene.step.parent is not None else scene.k
    splits = [s.split for s in scene.trace.steps if s.split is not None and s.parent == call]
    if not splits:
        call = scene.latest(lambda s: s.split is not None).parent
        splits = [s.split for s in scene.trace.steps if s.split is not None and s.parent == call]
    return splits


def _split(scene: Scene, f: TraceFact):
    splits, i = _splits(scene), _index(f)
    if not 0 <= i < len(splits):
        raise FactError(f"the scheduler made {len(splits)} splits; no split {i}")
    return splits[i]


@fact("n_splits")
def _n_splits(scene: Scene, f: TraceFact) -> int:
    """The splits ggml_backend_sched cut the graph into (the scheduling the step is part of)."""
    return len(_splits(scene))


@fact("split_backend", needs=("index",))
def _split_backend(scene: Scene, f: TraceFact) -> str:
    """The backend that computes split `index`."""
    return _split(scene, f).backend


@fact("split_first_node", needs=("index",))
def _split_first_node(scene: Scene, f: TraceFact) -> int:
    """The graph node split `index` starts at (i_start)."""
    return _split(scene, f).i_start


@fact("split_inputs", needs=("index",))
def _split_inputs(scene: Scene, f: TraceFact) -> int:
    """How many inputs the scheduler copies to split `index`'s backend."""
    return len(_split(scene, f).inputs)


def _element(t: Tensor, spec: str | None, index: int) -> int | float:
    if t.data is None or TYPE_TRAITS[t.type].is_quantized:
        raise FactError(f"{spec} has no plain elements to read")
    flat = view4(t).reshape(-1)
    if not -flat.size <= index < flat.size:
        raise FactError(f"{spec} has {flat.size} elements; no element {index}")
    x = flat[index].item()
    return int(x) if float(x).is_integer() else float(x)


@fact("value", needs=("tensor", "index"))
def _value(scene: Scene, f: TraceFact) -> int | float:
    """The tensor's element `index` (in ggml's order: ne[0] fastest; -1 the last), after the step."""
    return _element(scene.tensor(f.tensor), f.tensor, _index(f))


@fact("kv_cells_used")
def _kv_cells_used(scene: Scene, f: TraceFact) -> int | float:
    """The KV cells holding a token after the step: one past the largest position of the newest
    `inp_pos` (llama.cpp's name for the positions a pass writes into the cache)."""
    t = scene.tensor("inp_pos")
    return max(_element(t, "inp_pos", i) for i in range(int(t.ne[0]))) + 1


@fact("output", needs=("key",), optional=("index",))
def _output(scene: Scene, f: TraceFact) -> int | float | str:
    """What the program returned under `key` (its item `index` of a list)."""
    if f.key not in scene.trace.outputs:
        raise FactError(f"the program returned no {f.key!r}")
    got = scene.trace.outputs[f.key]
    if f.index is not None:
        got = list(got)[f.index]
    if isinstance(got, bool) or not isinstance(got, (int, float, str)):
        raise FactError(f"output {f.key!r} is a {type(got).__name__}, not a number or a name")
    return got


def resolve(trace: Trace, at: Selector, what: TraceFact, state: State | None = None) -> tuple[int, Value]:
    """The step `at` names and the value of `what` after it (FactError when it does not resolve)."""
    k = at.find(trace)
    scene = Scene(trace, k, state if state is not None and state.k == k else None)
    return k, FACTS[what.kind].read(scene, what)


def tensor_refs(trace: Trace, k: int, specs: tuple[str, ...], state: State | None = None) -> list[TensorRef]:
    """The tensors the specs name after step k (a question's choices)."""
    scene = Scene(trace, k, state)
    return [(t.ctx.id, t.offs) for t in map(scene.tensor, specs)]
