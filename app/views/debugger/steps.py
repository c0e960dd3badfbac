"""The steps panel: the trace grouped like the program (forward passes, calls with steps inside
them, layers), the group holding the current step open, its steps listed around the current one."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import note
from app.views.debugger.source import call_text
from app.views.debugger.where import Where, ref_key
from engine.trace import Trace
from engine.trace.groups import StepGroup, find_steps, layer_jump, step_groups

AROUND = 12  # steps listed on each side of the current one in its open group


@dataclass(frozen=True, slots=True)
class StepLink:
    index: int
    kind: str
    text: str
    url: str
    current: bool


@dataclass(frozen=True, slots=True)
class GroupView:
    kind: str
    label: str
    first: int
    last: int
    url: str  # its first step
    open: bool
    children: list["GroupView"]
    steps: list[StepLink]  # listed only for the innermost open group
    more_before: bool
    more_after: bool


@dataclass(frozen=True, slots=True)
class StepsView:
    groups: list[GroupView]
    prev_layer_url: str | None
    next_layer_url: str | None
    long: bool  # a long trace: groups start collapsed


def _text(s) -> str:
    """A step's line beside its kind's chip: its call without the kind the chip says already
    (a visit's call is "visit 'node_0'"), else its note."""
    call = call_text(s).removeprefix(f"{s.kind} ")
    t = call if len(call) <= 64 else call[:61] + "..."
    return t or note(s.notes)[:64]


def _view(trace: Trace, g: StepGroup, where: Where, k: int) -> GroupView:
    is_open = g.holds(k)
    children = [_view(trace, c, where, k) for c in g.children] if is_open else []
    steps: list[StepLink] = []
    before = after = False
    if is_open and not any(c.open for c in children):
        a, b = max(g.first, k - AROUND), min(g.last, k + AROUND)
        before, after = a > g.first, b < g.last
        steps = [StepLink(i, str(trace.steps[i].kind), _text(trace.steps[i]), where.url(step=i, tensor=None), i == k)
                 for i in range(a, b + 1)]
    return GroupView(g.kind, note([g.label]), g.first, g.last, where.url(step=g.first, tensor=None), is_open, children,
                     steps, before, after)


def steps_view(trace: Trace, where: Where) -> StepsView:
    k = where.step
    groups = [_view(trace, g, where, k) for g in step_groups(trace.steps)]
    prev_k, next_k = layer_jump(trace.steps, k, -1), layer_jump(trace.steps, k, 1)
    return StepsView(groups, None if prev_k is None else where.url(step=prev_k, tensor=None),
                     None if next_k is None else where.url(step=next_k, tensor=None), len(trace.steps) > 200)


def search_results(trace: Trace, where: Where, names: dict, q: str) -> list[StepLink]:
    """Each step found, linked; a search for a tensor's whole name links the steps with that
    tensor selected (its struct shown, the tensor list opened at its page)."""
    wanted = q.strip().lower()
    named = next((ref_key(*ref) for ref, name in names.items() if wanted and name.lower() == wanted),
                 None)
    return [StepLink(i, str(trace.steps[i].kind), _text(trace.steps[i]), where.url(step=i, tensor=named), False)
            for i in find_steps(trace.steps, q, names)]
