"""The threads panel: the compute plan, and each thread's share of the node with its time."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _
from engine.core.notes import Note
from engine.trace import ComputePlan, Step, StepKind, Trace


@dataclass(frozen=True, slots=True)
class Share:
    ith: int
    kind: str  # how the op splits its work: rows, chunks, ...
    ranges: str
    us: float  # microseconds
    width: float  # percent of the longest share
    notes: tuple[Note, ...]


@dataclass(frozen=True, slots=True)
class ThreadsView:
    plan: ComputePlan | None
    node: str | None
    shares: list[Share]


def threads(trace: Trace, step: Step) -> ThreadsView:
    parent = trace.steps[step.parent] if step.parent is not None else None
    plan = step.plan or (parent.plan if parent is not None else None)
    longest = max((t.seconds for t in step.threads), default=0) or 1
    shares = [Share(t.ith, t.kind, ranges_text(t.kind, t.ranges), t.seconds * 1e6,
                    100 * t.seconds / longest, t.notes) for t in step.threads]
    return ThreadsView(plan, step.call if step.kind == StepKind.NODE else None, shares)


def ranges_text(kind: str, ranges: tuple) -> str:
    if kind == "chunks":
        return "; ".join(_("chunk {c}: rows {r0}-{r1} x cols {c0}-{c1}").format(
            c=c, r0=a[0], r1=a[1] - 1, c0=b[0], c1=b[1] - 1) for c, a, b in ranges) or _("no chunk left")
    if not ranges:
        return _("nothing")
    return ", ".join(f"[{r[0]}, {r[1]})" if isinstance(r, (tuple, list)) and len(r) == 2 else str(r)
                     for r in ranges)
