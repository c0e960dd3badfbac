"""Prediction mode, on any trace (a walkthrough's or a learner's program): before stepping on,
the learner predicts where the next step's new object lands in its context's pool (a click on
the pool bar) or types its data offset, size or shape; the page then draws the truth over the
guess. This module says what the next step adds, as the engine rebuilt it after that step.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.context import GGML_OBJECT_TYPE_TENSOR, OBJECT_TYPE_NAMES
from engine.core.tensor import Tensor, ggml_n_dims, ggml_nbytes
from engine.trace import State, Trace


@dataclass(frozen=True, slots=True)
class Landed:
    """An object the next step adds to a context's pool."""

    ctx: int  # the context (its pool bar's data-ctx)
    header: int  # where its ggml_object header starts
    end: int  # where its payload ends (ggml_used_mem after it, if it is the last)
    type: str  # TENSOR, GRAPH, WORK_BUFFER
    name: str  # the tensor's name ("" when it has none yet)
    data: int | None  # a tensor's data offset in the pool (None: no data, or data elsewhere)
    nbytes: int | None  # a tensor's ggml_nbytes
    ne: list[int] | None  # a tensor's ne without the trailing 1s


@dataclass(frozen=True, slots=True)
class NextStep:
    step: int | None  # the next step's index (None: this is the last)
    objects: list[Landed]


def next_step(trace: Trace, k: int, state_after: State | None) -> NextStep:
    """What step k + 1 adds to the pools (`state_after`: the state rebuilt after it)."""
    if k + 1 >= len(trace.steps) or state_after is None:
        return NextStep(None, [])
    landed = []
    for o in trace.steps[k + 1].objects:
        ctx = state_after.contexts.get(o.ctx)
        if ctx is None:
            continue
        data = nbytes = ne = None
        name = o.name
        if o.type == OBJECT_TYPE_NAMES[GGML_OBJECT_TYPE_TENSOR]:
            t = Tensor(ctx, o.offs)
            name, nbytes = t.name, ggml_nbytes(t)
            ne = [int(n) for n in t.ne[:ggml_n_dims(t)]]
            if t.data is not None and ctx.base <= t.data <= ctx.base + ctx.mem_size:
                data = t.data - ctx.base
        landed.append(Landed(o.ctx, o.header, o.offs + o.size, o.type, name, data, nbytes, ne))
    return NextStep(k + 1, landed)
