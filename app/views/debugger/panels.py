"""The debugger's panels, one table: where the page shows each, the partial that renders it, the
view-models its template reads and the functions that build them, and a tab's label. The route
builds the view-models from it (`view_models`), the page includes the partials in its order
(templates/partials/debugger/debugger.html reads `LAYOUT`), and the tab bar lists its tabs
(`shown_tabs`): a panel is added here once, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from app.i18n import N_
from app.views.debugger.accountant import accounts
from app.views.debugger.answer import answer_view
from app.views.debugger.buffers import buffers
from app.views.debugger.chat import chat_view
from app.views.debugger.graph import GraphView
from app.views.debugger.hexview import hexview
from app.views.debugger.kernel import kernel_view
from app.views.debugger.kv import kv_view
from app.views.debugger.nav import nav
from app.views.debugger.plan import plan_view
from app.views.debugger.repacked import gemm_rows, repacked
from app.views.debugger.pool import pools
from app.views.debugger.returned import returned
from app.views.debugger.settings import settings_view
from app.views.debugger.source import source
from app.views.debugger.steps import steps_view
from app.views.debugger.strides import strides
from app.views.debugger.struct import struct
from app.views.debugger.tensors import tensor_list
from app.views.debugger.threads import ThreadsView, threads
from app.views.debugger.training import training_view
from app.views.debugger.values import gradient_of, values
from app.views.debugger.where import Where
from engine.core.tensor import Tensor
from engine.trace import State, Step, Trace

PARTIALS = "partials/debugger/"  # under app/templates/
# the partials that are no panel, and what each is instead
NOT_PANELS = {
    "debugger.html": "the debugger's root: it lays the panels out and owns their swap",
    "title.html": "the page's title (and the root's data-title), not a region of the page",
    "stepbtn.html": "the step button macro, imported by the nav and steps panels",
}


@dataclass(frozen=True)
class At:
    """The debugger at one step, as the panels' view-models read it: the step, the state rebuilt
    after it, the selected tensor, the step's graph, and what a request asks of the panels that
    take options. (Not slotted: `threads` is built once and kept on it.)"""

    where: Where
    trace: Trace
    step: Step
    state: State
    selected: Tensor | None
    graph: GraphView | None  # the step's newest graph, drawn by the route
    path: Path | None = None  # the file the walkthrough reads, for its chat template
    tp: int | None = None  # the tensor list's page
    tq: str = ""  # the tensor list's filter

    @cached_property
    def threads(self) -> ThreadsView:
        """The threads panel's view-model, whose shares the kernel panel shows too."""
        return threads(self.trace, self.step)


@dataclass(frozen=True, slots=True)
class ViewModel:
    """One view-model a panel's template reads: its name there, and the function that builds it."""

    name: str
    build: Callable[[At], Any]


class Place(Enum):
    """Where the page shows a panel."""

    TOP = "top"  # above the columns: the step controls
    LEFT = "left"  # the left column: the program and the step explained
    RIGHT = "right"  # the right column, always in view: the memory picture and the DAG
    TAB = "tab"  # a tab under the right column, the learner's choice remembered


@dataclass(frozen=True, slots=True)
class Panel:
    id: str  # its root element's id (a tab's data-panel and aria-controls)
    template: str  # its partial, under PARTIALS
    place: Place
    models: tuple[ViewModel, ...]  # what its template reads, each built once per step
    label: str = ""  # a tab's label, marked with N_ and translated where shown
    optional: bool = False  # left out (and its tab) while its first view-model is empty

    @property
    def path(self) -> str:
        """The partial, as the templates name it."""
        return PARTIALS + self.template


# the Prompt panel's view-model, which the Next token tab reads too
ANSWER = ViewModel("answer", lambda at: answer_view(at.trace, at.where))

PANELS = (
    Panel("stepnav", "nav.html", Place.TOP, (
        ViewModel("nav", lambda at: nav(at.trace, at.where)),)),
    Panel("answer", "answer.html", Place.LEFT, (
        ANSWER, ViewModel("settings", lambda at: settings_view(at.where))), optional=True),
    Panel("source", "source.html", Place.LEFT, (
        ViewModel("source", lambda at: source(at.trace, at.step)),
        ViewModel("returned", lambda at: returned(at.trace, at.step)))),
    Panel("steps", "steps.html", Place.LEFT, (
        ViewModel("steps", lambda at: steps_view(at.trace, at.where)),)),
    Panel("pool", "pool.html", Place.RIGHT, (
        ViewModel("pools", lambda at: pools(at.state, at.step, at.where)),)),
    Panel("graph", "graph.html", Place.RIGHT, (ViewModel("graph", lambda at: at.graph),)),
    # the tabs, in the tab bar's order
    Panel("struct", "struct.html", Place.TAB, (
        ViewModel("struct", lambda at: struct(at.selected, at.where)),), N_("Struct")),
    Panel("strides", "strides.html", Place.TAB, (
        ViewModel("strides", lambda at: strides(at.selected)),), N_("Strides")),
    Panel("values", "values.html", Place.TAB, (
        ViewModel("values", lambda at: values(at.selected, at.where)),
        ViewModel("grad", lambda at: values(gradient_of(at.state, at.selected), at.where))),
        N_("Values")),
    Panel("hexview", "hexview.html", Place.TAB, (
        ViewModel("hex", lambda at: hexview(at.step, at.selected, at.where.hex)),), N_("Bytes")),
    Panel("tensors", "tensors.html", Place.TAB, (
        ViewModel("tensors",
                  lambda at: tensor_list(at.state, at.where, at.selected, at.tp, at.tq)),),
        N_("Tensors")),
    Panel("threads", "threads.html", Place.TAB, (
        ViewModel("threads", lambda at: at.threads),
        ViewModel("gemm_rows", lambda at: gemm_rows(at.state, at.step))), N_("Threads")),
    Panel("kernel", "kernel.html", Place.TAB, (
        ViewModel("kernel", lambda at: kernel_view(at.step, at.state, at.where, at.threads.shares)),),
        N_("Kernel")),
    Panel("accountant", "accountant.html", Place.TAB, (
        ViewModel("accounts", lambda at: accounts(at.state)),),
        "mem_size"),  # (ggml's own name for what it answers: never translated)
    Panel("buffers", "buffers.html", Place.TAB, (
        ViewModel("buffers", lambda at: buffers(at.state, at.step, at.where)),),
        N_("Buffers"), optional=True),
    Panel("repacked", "repacked.html", Place.TAB, (
        ViewModel("repacked", lambda at: repacked(at.state, at.step, at.selected, at.where)),),
        N_("Repacked"), optional=True),
    Panel("plan", "plan.html", Place.TAB, (
        ViewModel("plan", lambda at: plan_view(at.trace, at.step, at.state, at.where)),),
        N_("Memory plan"), optional=True),
    Panel("kv", "kv.html", Place.TAB, (
        ViewModel("kv", lambda at: kv_view(at.trace, at.step, at.state, at.where)),),
        N_("KV cache"), optional=True),
    Panel("nexttoken", "nexttoken.html", Place.TAB, (ANSWER,), N_("Next token"), optional=True),
    Panel("chat", "chat.html", Place.TAB, (
        ViewModel("chat", lambda at: chat_view(at.trace, at.where, at.path)),),
        N_("Chat"), optional=True),
    Panel("training", "training.html", Place.TAB, (
        ViewModel("training", lambda at: training_view(at.trace)),),
        N_("Training"), optional=True),
)


@dataclass(frozen=True, slots=True)
class PanelLayout:
    """The panels by place, each in the table's order: what the page includes where."""

    top: tuple[Panel, ...]
    left: tuple[Panel, ...]
    right: tuple[Panel, ...]
    tabs: tuple[Panel, ...]


LAYOUT = PanelLayout(*(tuple(p for p in PANELS if p.place == place) for place in
                       (Place.TOP, Place.LEFT, Place.RIGHT, Place.TAB)))


def view_models(at: At) -> dict[str, Any]:
    """Every panel's view-models at one step, by the names their templates read them by (a
    view-model two panels read is built once)."""
    builders = {m.name: m.build for p in PANELS for m in p.models}
    return {name: build(at) for name, build in builders.items()}


def shown_tabs(models: dict[str, Any]) -> list[Panel]:
    """The tabs the tab bar lists at a step: an optional one only while it has something to show."""
    return [p for p in LAYOUT.tabs if not p.optional or models[p.models[0].name]]
