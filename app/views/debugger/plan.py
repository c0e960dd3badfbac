"""The memory plan panel: where the graph allocator puts every tensor of a compute buffer, over
time — x the node order, y the offset, one bar per tensor from its allocation to its release,
the peak marked, the step's decision and the selected tensor highlighted; a bar links to its
tensor. Drawn as SVG from the plan's decisions recorded in the trace (engine.backend.alloc.memory_plan)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from app.i18n import _
from app.views.debugger.where import Where, ref_key
from engine.backend.alloc import memory_plan, plan_peak
from engine.trace import State, Step, StepKind, Trace

W, H, LEFT, TOP = 640.0, 170.0, 56.0, 8.0  # plot size and margins (px)


@dataclass(frozen=True, slots=True)
class PlanBar:
    x: float
    y: float
    w: float
    h: float
    cls: str  # alloc, inplace; plus current / selected
    title: str
    url: str


@dataclass(frozen=True, slots=True)
class PlanChart:
    buffer: str  # "buffer 1 (CPU), chunk 0"
    size: int  # the chunk's high-water mark: the bytes it needs
    n_nodes: int
    bars: list[PlanBar]
    peak_y: float
    peak_node: int
    peak_bytes: int
    width: float
    height: float


def _group(trace: Trace, k: int) -> list[Step]:
    """The allocator steps of the most recent plan at or before step k."""
    allocs = trace.of_kinds(StepKind.ALLOC)
    last = next((s for s in reversed(allocs) if s.index <= k), None)
    if last is None:
        return []
    return [s for s in allocs if s.parent == last.parent]


_PLANS: OrderedDict[int, tuple[Step, tuple]] = OrderedDict()  # by its first step's identity
_PLANS_KEPT = 8


def _plan_of(group: list[Step]) -> tuple[dict[int, str], int, list]:
    """The plan of one group of allocator steps: the buffers' names, the node count, and per
    (buffer, chunk) its bars, size, and peak (node, bytes). Worked out once per plan (the last
    few kept: whichever step of a trace shows it draws the same plan)."""
    kept = _PLANS.get(id(group[0]))
    if kept is not None and kept[0] is group[0]:
        return kept[1]
    made = _made_plan(group)
    _PLANS[id(group[0])] = (group[0], made)
    while len(_PLANS) > _PLANS_KEPT:
        _PLANS.popitem(last=False)
    return made


def _made_plan(group: list[Step]) -> tuple:
    decisions = [s.decision for s in group if s.decision is not None]  # (every allocator step's)
    n = max(d.node for d in decisions) + 1
    bars = memory_plan(decisions, n)
    chunks = []
    for key in sorted({(b.buffer_id, b.chunk) for b in bars}):
        mine = [b for b in bars if (b.buffer_id, b.chunk) == key]
        chunks.append((key, mine, max(b.offset + b.size for b in mine) or 1, *plan_peak(mine, n)))
    return {d.buffer_id: d.buffer for d in decisions}, n, chunks


def plan_view(trace: Trace, step: Step, state: State, where: Where) -> list[PlanChart]:
    group = _group(trace, step.index)
    if not group:
        return []
    current = step.decision.tensor if step.kind == StepKind.ALLOC and step.decision is not None \
        else step.tensor
    names, n, chunks = _plan_of(group)
    charts = []
    for key, mine, size, node, peak in chunks:
        col = W / (n + 1)

        def y(off: int) -> float:
            return TOP + H - H * off / size
        out = []
        for b in mine:
            t = state.tensor(b.tensor) if b.tensor[0] in state.contexts else None
            name = t.name if t is not None else "?"
            cls = "inplace" if b.reuses is not None else "alloc"
            if b.tensor == current:
                cls += " current"
            if where.tensor == ref_key(*b.tensor):
                cls += " selected"
            top, bottom = y(b.offset + b.size), y(b.offset)
            life = (_("nodes {first}..{last}").format(first=b.start, last=b.end) if b.start >= 0
                    else _("from the start to node {last}").format(last=b.end))
            out.append(PlanBar(LEFT + col * (b.start + 1), top, max(col * (b.end - b.start + 1), 1.5),
                               max(bottom - top, 1.5), cls,
                               _("'{name}': offset {offset}, {size} bytes, {life}").format(
                                   name=name, offset=b.offset, size=b.size, life=life)
                               + (_(" (in place of its source)") if b.reuses is not None else ""),
                               where.url(tensor=ref_key(*b.tensor))))
        title = _("buffer {id} ({name}), chunk {chunk}").format(id=key[0], name=names[key[0]], chunk=key[1])
        charts.append(PlanChart(title, size, n, out, y(peak), node, peak, LEFT + W + 8, TOP + H + 22))
    return charts
