"""The threads panel: the compute plan, and each thread's share of the node with its time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from app.i18n import N_, _
from engine.compute.shares import Chunk, Interval, ShareKind, Tile
from engine.core.notes import Note
from engine.trace import ComputePlan, Step, StepKind, Trace

# how each kind of split reads in the threads and kernel panels (translated where shown)
SPLIT_LABELS: dict[ShareKind, str] = {
    ShareKind.ROWS: N_("rows"), ShareKind.BLOCKS: N_("blocks"), ShareKind.KV: N_("KV positions"),
    ShareKind.INTERLEAVED: N_("interleaved"), ShareKind.CHUNKS: N_("chunks"),
    ShareKind.ALL: N_("all"), ShareKind.IDLE: N_("idle"),
}


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One thread's share of the node, as the threads and kernel panels list it."""

    ith: int
    kind: ShareKind  # how the op splits its work
    split: str  # the kind's label, translated
    ranges: str
    us: float  # microseconds
    width: float  # percent of the longest share
    notes: tuple[Note, ...]


@dataclass(frozen=True, slots=True)
class TaskRun:
    """Consecutive nodes of the plan that run on the same number of tasks."""

    n_tasks: int
    first: int  # node indices, inclusive
    last: int


@dataclass(frozen=True, slots=True)
class TaskCount:
    """How many of the plan's nodes run on n_tasks tasks (when the runs are too many to list)."""

    n_tasks: int
    nodes: int


@dataclass(frozen=True, slots=True)
class ThreadsView:
    plan: ComputePlan | None
    node: str | None
    shares: list[ShareRow]
    task_runs: list[TaskRun]  # the plan's n_tasks per node as runs of equal values, or
    task_counts: list[TaskCount]  # (past MAX_RUNS runs) as the number of nodes of each value


MAX_RUNS = 8  # runs of n_tasks listed; past it, counts per value


def threads(trace: Trace, step: Step) -> ThreadsView:
    parent = trace.steps[step.parent] if step.parent is not None else None
    plan = step.plan or (parent.plan if parent is not None else None)
    longest = max((t.seconds for t in step.threads), default=0) or 1
    shares = [ShareRow(t.ith, t.kind, _(SPLIT_LABELS[t.kind]), ranges_text(t.kind, t.ranges),
                    t.seconds * 1e6, 100 * t.seconds / longest, t.notes) for t in step.threads]
    runs = task_runs(plan.n_tasks) if plan is not None else []
    counts = [] if len(runs) <= MAX_RUNS else [
        TaskCount(n, sum(r.last - r.first + 1 for r in runs if r.n_tasks == n))
        for n in sorted({r.n_tasks for r in runs})]
    return ThreadsView(plan, step.call if step.kind == StepKind.NODE else None, shares,
                       runs if not counts else [], counts)


def task_runs(n_tasks: tuple[int, ...]) -> list[TaskRun]:
    """n_tasks per node as runs of equal values: (1, 1, 4, 4, 1) -> 1 for 0-1, 4 for 2-3, 1 for 4."""
    runs: list[TaskRun] = []
    for i, n in enumerate(n_tasks):
        if runs and runs[-1].n_tasks == n:
            runs[-1] = TaskRun(n, runs[-1].first, i)
        else:
            runs.append(TaskRun(n, i, i))
    return runs


def _tile_text(t: Tile) -> str:
    return _("chunk {c}: rows {r0}-{r1} x cols {c0}-{c1}").format(
        c=t.chunk, r0=t.rows.start, r1=t.rows.end - 1, c0=t.cols.start, c1=t.cols.end - 1)


def _chunk_text(c: Chunk) -> str:
    return _("chunk {c}: rows {r0}-{r1}").format(c=c.chunk, r0=c.rows.start, r1=c.rows.end - 1)


def _interval_text(i: Interval) -> str:
    return f"[{i.start}, {i.end})"


# each record of a range as the panels write it
_RANGE_TEXT: dict[type, Callable[[Any], str]] = {Tile: _tile_text, Chunk: _chunk_text,
                                                 Interval: _interval_text, int: str}


def ranges_text(kind: ShareKind, ranges: tuple) -> str:
    """A thread's ranges (ThreadShare.ranges: ShareRange records) in words: `[0, 16), [32, 48)`,
    `0, 4, 8`, `chunk 3: rows 0-15 x cols 16-31; ...`."""
    if not ranges:
        return _("no chunk left") if kind == ShareKind.CHUNKS else _("nothing")
    joint = "; " if kind == ShareKind.CHUNKS else ", "
    return joint.join(_RANGE_TEXT[type(r)](r) for r in ranges)
