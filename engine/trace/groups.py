"""Steps grouped like the program: forward passes, layers, calls — and finding steps.

While recording, each step is marked with where the program was (`ProgramMarks`): the layer, read
from the program's loop variable `il` (llama.cpp's name for it; a node or visit gets the layer its
tensor was made in), and the forward pass, read from `n_past` (the cache position a pass starts
at). `step_groups` turns the marks into a tree: passes, then layers, then the steps; a trace with
neither is one group. `find_steps` searches the steps' text and their tensors' names.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import wraps
from threading import Lock
from typing import Any

from cachetools import LRUCache, cached

from engine.core.infos import layer_of
from engine.core.notes import Note, tell
from engine.core.tensor import Tensor
from engine.trace.steps import Step, StepKind, tensor_ref

FOLLOW_TENSOR = (StepKind.NODE, StepKind.VISIT, StepKind.ALLOC, StepKind.COPY)


class ProgramMarks:
    """Where the program is at each call: the layer and the pass, read from its loop variables;
    and the layer each tensor was made in."""

    def __init__(self, sources: dict[str, str]) -> None:
        """`sources`: the text of each file whose calls are steps, by file name."""
        self.layer: int | None = None
        self.n_past: int | None = None
        self.tensor_layer: dict[tuple[int, int], int] = {}  # the layer each tensor was made in
        self.layer_loops = {f: layer_loops(text) for f, text in sources.items()}

    def read(self, frame: Any) -> None:
        """At a call from `frame` (the program's): the layer if the line is inside a `for il in
        ...` loop (after the loop `il` keeps its last value, which is not a layer any more), and
        the pass. A helper of the program's own (llama.cpp's `cb`) called from such a loop is in
        the loop's layer: the frames of the program's files are read outwards until one says."""
        self.layer = self.n_past = None
        while frame is not None and frame.f_code.co_filename in self.layer_loops:
            local_vars, line = frame.f_locals, frame.f_lineno
            loops = self.layer_loops[frame.f_code.co_filename]
            il, n_past = local_vars.get("il"), local_vars.get("n_past")
            if self.layer is None and type(il) is int and \
                    any(a <= line <= b for a, b in loops):
                self.layer = il
            if self.n_past is None and type(n_past) is int:
                self.n_past = n_past
            frame = frame.f_back

    def for_step(self, kind: StepKind, tensor: Tensor | None) -> tuple[int | None, int | None]:
        """The marks of a step about to be recorded (`tensor`: the one it made or computed): its
        layer and its pass (n_past)."""
        ref = None if tensor is None else tensor_ref(tensor)
        layer: int | None
        if kind == StepKind.VISIT and self.layer is not None:
            layer = self.layer  # a graph walked inside a layer's loop: that layer
        elif kind in FOLLOW_TENSOR:
            layer = self.tensor_layer.get(ref) if ref is not None else None
            if layer is None and tensor is not None:  # a layer's weight, named as GGUF names them
                layer = layer_of(tensor.name)
        else:
            layer = self.layer
            if ref is not None and layer is not None and kind == StepKind.CALL:
                self.tensor_layer.setdefault(ref, layer)
        return layer, self.n_past


def layer_loops(source: str) -> list[tuple[int, int]]:
    """The line spans of the program's `for il in ...` loops (`for il, layer in enumerate(...)`
    too, as the model builders write them)."""
    def binds_il(target) -> bool:
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        return any(isinstance(t, ast.Name) and t.id == "il" for t in names)

    return [(node.lineno, node.end_lineno or node.lineno) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.For) and binds_il(node.target)]


@dataclass
class StepGroup:
    kind: str  # "pass", "layer" or "call"
    label: Note  # a call group's: the call, verbatim
    first: int  # step indices, inclusive
    last: int
    children: list["StepGroup"] = field(default_factory=list)

    def holds(self, k: int) -> bool:
        return self.first <= k <= self.last


def _runs(steps: list[Step], key) -> list[tuple[Any, int, int]]:
    """Maximal runs of consecutive steps with the same key: (key, first, last)."""
    out: list[tuple[Any, int, int]] = []
    for s in steps:
        v = key(s)
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1], s.index)
        else:
            out.append((v, s.index, s.index))
    return out


def _layers(steps: list[Step]) -> list[StepGroup]:
    groups = []
    runs = _runs(steps, lambda s: s.layer)
    for layer, a, b in runs:
        label = Note.of("group_layer", layer=layer) if layer is not None else \
            Note("group_outside" if len(runs) > 1 else "group_steps")
        groups.append(StepGroup("layer", label, a, b))
    return groups


def _phases(steps: list[Step]) -> list[StepGroup]:
    """A call that has steps inside it across layers (a graph computed, a scheduler's passes) is
    a group of its own, with those steps by layer; other steps, a call inside one layer with its
    inner steps included, are grouped by layer."""
    last_child: dict[int, int] = {}
    layers: dict[int, set] = {}  # a call's layer and its inner steps' layers
    for s in steps:
        if s.parent is not None:
            last_child[s.parent] = max(last_child.get(s.parent, s.index), s.index)
            layers.setdefault(s.parent, set()).add(s.layer)
    base0 = steps[0].index if steps else 0
    for call, inner in list(layers.items()):
        if 0 <= call - base0 < len(steps) and inner == {steps[call - base0].layer} \
                and steps[call - base0].layer is not None:
            del last_child[call]  # a call inside one layer stays in that layer's group
    out: list[StepGroup] = []
    base, i = steps[0].index if steps else 0, 0
    while i < len(steps):
        s = steps[i]
        if s.index in last_child:
            end = min(last_child[s.index], steps[-1].index)
            label = Note.verbatim(s.call if len(s.call) <= 72 else s.call[:69] + "...")
            out.append(StepGroup("call", label, s.index, end, _layers(steps[i + 1:end - base + 1])))
            i = end - base + 1
        else:
            j = i
            while j < len(steps) and steps[j].index not in last_child:
                j += 1
            out += _layers(steps[i:j])
            i = j
    return out


_BY_STEPS: LRUCache = LRUCache(16)  # what a few recorded traces' steps give (below)
_BY_STEPS_LOCK = Lock()


def _per_steps(what: str):
    """f(steps) made once per list of steps, the debugger asks on every page: keyed by the list
    itself and its length (a list still being recorded grows). The list is kept with its value,
    so no other list takes its id while the key lives."""
    def wrap(f):
        kept = cached(_BY_STEPS, key=lambda steps: (what, id(steps), len(steps)),
                      lock=_BY_STEPS_LOCK)(lambda steps: (steps, f(steps)))
        return wraps(f)(lambda steps: kept(steps)[1])
    return wrap


@_per_steps("groups")
def step_groups(steps: list[Step]) -> list[StepGroup]:
    """Forward passes (by n_past), each with its phases (calls with steps inside them, by layer);
    a trace without passes is its phases."""
    if not steps:
        return []
    if any(s.n_past is not None for s in steps):
        out = []
        for n_past, a, b in _runs(steps, lambda s: s.n_past):
            label = Note.of("group_pass", n_past=n_past) if n_past is not None else Note("group_setup")
            out.append(StepGroup("pass", label, a, b, _phases(steps[a:b + 1])))
        return out
    return _phases(steps)


@_per_steps("layers")
def _layer_runs(steps: list[Step]) -> list[tuple[int, int]]:
    """(layer, first step) of each run of steps in one layer."""
    return [(v, a) for v, a, _ in _runs(steps, lambda s: s.layer) if v is not None]


def layer_jump(steps: list[Step], k: int, direction: int) -> int | None:
    """The first step of the next (direction 1) or the previous (-1) layer run from step k."""
    runs = _layer_runs(steps)
    if direction > 0:
        return next((a for _, a in runs if a > k), None)
    cur = next((a for v, a in reversed(runs) if a <= k), None)
    earlier = [a for _, a in runs if a < (cur if cur is not None else k)]
    if cur is not None and cur < k and steps[k].layer is not None:
        return cur  # back to the start of this layer first
    return earlier[-1] if earlier else None


def find_steps(steps: list[Step], text: str, names: dict[tuple[int, int], str], limit: int = 200) -> list[int]:
    """Steps whose call, note or tensor's name contains `text` (case-insensitive)."""
    q = text.lower().strip()
    if not q:
        return []
    out = []
    for s in steps:
        name = names.get(s.tensor, "") if s.tensor is not None else ""
        if q in s.call.lower() or q in tell(s.notes).lower() or q in name.lower():
            out.append(s.index)
            if len(out) >= limit:
                break
    return out
