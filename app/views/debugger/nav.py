"""The step navigation bar: previous/next step, jumps to the next call or node, thread count."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.debugger.where import Where
from engine.trace import StepKind, Trace


@dataclass(frozen=True, slots=True)
class Nav:
    index: int
    count: int
    prev_url: str | None
    next_url: str | None
    next_call_url: str | None
    next_node_url: str | None
    threads: int
    kind: StepKind


CALL_LIKE = (StepKind.CALL, StepKind.END, StepKind.ERROR, StepKind.CAP)


def nav(trace: Trace, where: Where) -> Nav:
    k, n = where.step, len(trace.steps)

    def jump(kinds: tuple[StepKind, ...]) -> str | None:
        nxt = next((s.index for s in trace.steps[k + 1:] if s.kind in kinds), None)
        return None if nxt is None else where.url(step=nxt, tensor=None)

    return Nav(k, n, where.url(step=k - 1, tensor=None) if k > 0 else None,
               where.url(step=k + 1, tensor=None) if k < n - 1 else None,
               jump(CALL_LIKE), jump((StepKind.NODE,)),
               trace.n_threads, trace.steps[k].kind)
