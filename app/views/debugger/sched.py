"""The scheduler as the DAG shows it: each tensor coloured by the backend the passes gave it so
far, each split a cluster, each input copy a node of its own in the split that reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.i18n import _
from engine.core.graph import Graph
from engine.core.tensor import Tensor
from engine.trace import State, Step, StepKind, Trace

COLORS = ("#bfe3b4", "#f6d7a7", "#e3c9f2", "#f7c6c6")  # accelerators, by priority
CPU_COLOR = "#cfe0fa"


@dataclass
class SchedView:
    backends: dict[str, str] = field(default_factory=dict)  # backend name -> colour, for the legend
    color: dict[int, str] = field(default_factory=dict)  # tensor address -> colour
    clusters: list[tuple[str, list[int]]] = field(default_factory=list)  # (label, node addresses)
    copies: list[tuple[Tensor, int]] = field(default_factory=list)  # (copy tensor, cluster index)


def _color(name: str, backend_id: int) -> str:
    return CPU_COLOR if name == "CPU" else COLORS[backend_id % len(COLORS)]


def sched_view(trace: Trace, step: Step, state: State, graph: Graph) -> SchedView | None:
    """The scheduler's decisions up to step k for the graph being drawn (None when the newest
    scheduling was of another graph, or there is none)."""
    k = step.index
    passes = [s for s in trace.of_kinds(StepKind.PASS, StepKind.SPLIT) if s.index <= k]
    if not passes:
        return None
    group = [s for s in passes if s.parent == passes[-1].parent]
    graph_nodes = graph.nodes
    addresses = {t.address for t in graph_nodes}
    view = SchedView()
    for s in group:
        for p in s.placements:
            if p.tensor[0] not in state.contexts:
                continue
            t = state.tensor(p.tensor)
            view.color[t.address] = _color(p.backend, p.backend_id)
            view.backends[p.backend] = _color(p.backend, p.backend_id)
    if not any(a in addresses for a in view.color):
        return None  # the scheduling was of an earlier graph
    n = len(graph_nodes)
    for s in group:
        sp = s.split
        if sp is None or sp.i_end > n:
            continue
        members = [graph_nodes[i].address for i in range(sp.i_start, sp.i_end)]
        view.clusters.append((_("split {i}: {backend}").format(i=sp.index, backend=sp.backend), members))
        for node in graph_nodes[sp.i_start:sp.i_end]:
            for src in node.src:
                if src is not None and "#" in src.name and src.address not in addresses:
                    if all(c[0] != src for c in view.copies):
                        view.copies.append((src, len(view.clusters) - 1))
    return view
