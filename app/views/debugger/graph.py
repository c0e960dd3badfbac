"""The DAG panel: the graph as ggml_graph_dump_dot writes it, decorated with links and ids, big
graphs folded layer by layer; rendered to SVG by graphviz once per distinct drawing and served
from its own URL, keyed by the drawing's hash."""

from __future__ import annotations

import hashlib
import inspect
import subprocess
from dataclasses import dataclass
from html import escape
from pathlib import Path
from threading import Lock
from typing import TYPE_CHECKING, Callable

import numpy as np
from cachetools import LRUCache, cached

from app import i18n
from app.i18n import N_, _
from app.views.debugger.where import Where, tensor_key
from engine.core.graph import DotStyle, Graph, ggml_graph_dump_dot
from engine.core.infos import graph_digest, graph_layers, record_names
from engine.core.optable import GGMLOp, ggml_op_symbol
from engine.core.tensor import Tensor
from engine.trace import State, Step, StepKind
from engine.trace.steps import tensor_ref

if TYPE_CHECKING:
    from app.views.debugger.sched import SchedView

FOLD_OVER = 60  # graphs of more nodes show each layer as one box
HEADER = ("  bgcolor = transparent;", '  node [fontname = "DejaVu Sans Mono", fontsize = 10];',
          '  edge [fontname = "DejaVu Sans", fontsize = 8, color = "#666677"];')


# what a node of an op that does the work of several says (its tooltip, and a line under the
# drawing when the graph has one)
OP_NOTES: dict[int, str] = {
    GGMLOp.FLASH_ATTN_EXT: N_("one node for KQ = K·Q, softmax, KQV = V·softmax: the MUL_MAT → "
                              "SOFT_MAX → MUL_MAT of the path without flash attention"),
}


@dataclass(frozen=True, slots=True)
class OpNote:
    op: str  # ggml's name for it: "FLASH_ATTN_EXT"
    symbol: str  # how the drawing writes it (ggml_op_symbol): "flash_attn_ext"
    note: str


@dataclass(frozen=True, slots=True)
class LayerLink:
    name: str  # "3"
    url: str  # opens (draws in full) this layer
    open: bool


@dataclass(frozen=True, slots=True)
class GraphView:
    key: str  # the drawing's name: its SVG's URL and the id of the element holding it
    highlight: list[tuple[str, str]]  # (svg node id, css class): the current and selected nodes
    layers: list[LayerLink]
    n_nodes: int
    n_leafs: int
    drawing: Callable[[], str]  # the drawing's DOT, made when asked (the SVG may be drawn already)
    backends: tuple[tuple[str, str], ...] = ()  # (backend, colour) when the scheduler coloured it
    backward: bool = False  # the graph has a backward pass (its nodes are outlined in purple)
    svg_url: str = ""  # the drawing's own URL at this step, for a page that does not inline it
    notes: tuple[OpNote, ...] = ()  # the graph's ops that stand for several (OP_NOTES)

    @property
    def dot(self) -> str:
        return self.drawing()


def node_id(t: Tensor) -> str:
    """The id of a tensor's node in the SVG."""
    return f"t{t.address:x}"


def _attr(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True, eq=False)
class MadeIn:
    """The layer each tensor was made in, by (context id, struct offset), as the program's own loop
    said while it ran (the trace's call steps: the steps panel's layers). One per trace, compared
    by identity (a cache key)."""

    layers: dict[tuple[int, int], int]


_MADE_IN: LRUCache = LRUCache(16)  # a few traces' (steps, MadeIn)
_MADE_IN_LOCK = Lock()


def made_in(steps: list[Step]) -> MadeIn:
    """The layers the trace's call steps made their tensors in (the first call that names one)."""
    key = (id(steps), len(steps))  # (the steps are kept with it: no other list takes their id)
    with _MADE_IN_LOCK:
        hit = _MADE_IN.get(key)
    if hit is not None and hit[0] is steps:
        return hit[1]
    layers: dict[tuple[int, int], int] = {}
    for s in steps:
        if s.kind == StepKind.CALL and s.tensor is not None and s.layer is not None:
            layers.setdefault(s.tensor, s.layer)
    made = MadeIn(layers)
    with _MADE_IN_LOCK:
        _MADE_IN[key] = (steps, made)
    return made


def find_layer(state: State, query: str, made: MadeIn | None = None) -> str | None:
    """The folded layer of the newest graph that holds a tensor whose name contains `query`
    (None: no folded layer does), so a search can open it (`made`: as graph_view's)."""
    graphs = state.graphs()
    if not graphs or graphs[-1].n_nodes <= FOLD_OVER:
        return None
    g = graphs[-1]
    tensors = state.graph_tensors(g)
    layers = _layer_map(graph_digest(g, tensors), g, tensors, made)[0]
    q = query.strip().lower()
    named = list(zip(tensors[0].tolist(), record_names(tensors[1])))
    return next((layers[a] for a, name in named[g.n_nodes:] + named[:g.n_nodes]  # leafs first
                 if a in layers and q in name.lower()), None)


def graph_view(state: State, where: Where, current: Tensor | None, selected: Tensor | None,
               expand: str | None = None, sched_of=None, made: MadeIn | None = None) -> GraphView | None:
    """The newest graph, every tensor a link that selects it.

    Graphs of more than FOLD_OVER nodes show each layer as one box: a tensor belongs to layer N
    when it is a "blk.N." weight, when the program made it in layer N (`made`: the steps panel's
    layers), else when it consumes one (the highest N among its sources). The layer holding the
    current or selected tensor is drawn in full, as is the one named by `expand`.

    The drawing does not depend on the step, only on the graph's bytes and what is folded, so
    stepping through a graph's nodes draws it once. It is named by a hash of what it is made
    from (`_drawing_key`), so a step whose drawing graphviz has drawn already does not make its
    DOT again.
    """
    graphs = state.graphs()
    if not graphs:
        return None
    g = graphs[-1]
    sched: SchedView | None = sched_of(g) if sched_of is not None else None
    tensors = state.graph_tensors(g)
    shape = graph_digest(g, tensors)
    layers, backward = _layer_map(shape, g, tensors, made)
    shown = {expand} | {layers.get(t.address) for t in (current, selected) if t is not None}
    open_layers = tuple(sorted((name for name in shown if name is not None), key=int))
    key = _drawing_key(shape, where, open_layers, sched, bool(made and made.layers))
    highlight = [(node_id(t), cls) for t, cls in ((current, "current"), (selected, "selected"))
                 if t is not None]
    links = [LayerLink(name, where.query(expand=name), name in open_layers)
             for name in sorted(set(layers.values()), key=int)]
    svg_url = f"{where.base}/steps/{where.step}/graph/{key}.svg" + where.query(expand=expand)
    ops = set(tensors[1]["op"][:g.n_nodes].tolist())
    notes = tuple(OpNote(GGMLOp(op).name, ggml_op_symbol(op), _(note)) for op, note in OP_NOTES.items()
                  if int(op) in ops)
    return GraphView(key, highlight, links, g.n_nodes, g.n_leafs,
                     lambda: _dot(g, where, layers, backward, set(open_layers), sched),
                     tuple(sched.backends.items()) if sched else (), bool(backward), svg_url, notes)


_LAYERS: LRUCache = LRUCache(128)  # what a graph's layers cost to find, shared by every request
_LAYERS_LOCK = Lock()


@cached(_LAYERS, key=lambda shape, g, tensors, made: (shape, made), lock=_LAYERS_LOCK)
def _layer_map(shape: bytes, g: Graph, tensors: tuple[np.ndarray, np.ndarray],
               made: MadeIn | None) -> tuple[dict[int, str], set[int]]:
    """Each tensor's layer by address (none where the graph is drawn whole) and the backward
    pass's nodes, of the graph g whose digest is `shape` (`tensors`: graph_tensors(g); `made`: the
    layers the program made its nodes in)."""
    layers = {}
    if g.n_nodes > FOLD_OVER:
        known = {} if made is None or not made.layers else {
            t.address: made.layers[tensor_ref(t)] for t in g.nodes if tensor_ref(t) in made.layers}
        layers = {a: str(n) for a, n in graph_layers(g, tensors, known).items()}
    return layers, backward_nodes(g, tensors)


def _code_digest() -> bytes:
    """What a drawing's text is made by: this module, ggml_graph_dump_dot's and the catalogues of
    its labels (a drawing's URL is immutable, so a server whose drawings differ names them anew)."""
    h = hashlib.sha1()
    dump_dot = inspect.getsourcefile(ggml_graph_dump_dot)
    assert dump_dot is not None  # (engine/core/graph.py)
    for path in (Path(__file__), Path(dump_dot),
                 *sorted(i18n.LOCALE_DIR.glob("*/*/*.po"))):
        h.update(path.read_bytes())
    return h.digest()


_CODE = _code_digest()


def _drawing_key(shape: bytes, where: Where, open_layers: tuple[str, ...], sched: SchedView | None,
                 marked: bool) -> str:
    """A drawing's name: a hash of what it is made from (the graph, the layers open and whether
    the program's marks made them, the links' query, the language, the scheduler's colours and
    splits, and the code that draws it)."""
    made_of = (shape, open_layers, marked, where.query(tensor=None), i18n.current(),
               None if sched is None else (tuple(sched.color.items()), tuple(
                   (label, tuple(m)) for label, m in sched.clusters),
                   tuple((c.address, i) for c, i in sched.copies)))
    return hashlib.sha1(_CODE + repr(made_of).encode()).hexdigest()[:16]


def _dot(g: Graph, where: Where, layers: dict[int, str], backward: set[int], open_layers: set[str],
         sched: SchedView | None) -> str:
    """The drawing's DOT: ggml_graph_dump_dot's, each tensor a link, the closed layers folded."""
    folded: dict[str, int] = {}
    for t in g.nodes + g.leafs:
        layer = layers.get(t.address)
        if layer is not None and layer not in open_layers:
            folded[layer] = folded.get(layer, 0) + 1

    def decorate(t: Tensor) -> DotStyle:
        layer = layers.get(t.address)
        if layer in folded:
            return DotStyle(fold=f"layer_{layer}")
        url = where.query(tensor=tensor_key(t))  # no step: the drawing is reused across steps
        fill = f'fillcolor = "{sched.color[t.address]}"; ' if sched and t.address in sched.color else ""
        outline = 'color = "#8a3ffc"; penwidth = 2.5; ' if t.address in backward else ""
        note = OP_NOTES.get(t.op)
        tip = t.name if note is None else f"{t.name}: {GGMLOp(t.op).name}, {_(note)}"
        return DotStyle(f'{fill}{outline}id = "{node_id(t)}"; URL = "{url}"; target = "_top"; '
                        f'tooltip = "{_attr(tip)}"')

    def box_label(layer: str, n: int) -> str:
        lines = (_("layer {layer}").format(layer=layer), _("{n} tensors").format(n=n), _("(click to open)"))
        return "\\n".join(_attr(x) for x in lines)

    boxes = tuple(f'  "layer_{layer}" [id = "layer_{layer}"; shape = box3d; style = filled; '
                  f'fillcolor = "#e8eefc"; '
                  f'label = "{box_label(layer, n)}"; '
                  f'URL = "{where.query(expand=layer, tensor=None)}"; target = "_top"];'
                  for layer, n in folded.items())
    hidden = {t.address for t in g.nodes + g.leafs if layers.get(t.address) in folded}
    return ggml_graph_dump_dot(g, decorate=decorate, extra=HEADER + boxes + _splits(sched, where, hidden))


def backward_nodes(g: Graph, tensors: tuple[np.ndarray, np.ndarray]) -> set[int]:
    """The backward pass: ggml_build_backward_expand appends it after the forward nodes and names
    each gradient "grad for <tensor>", so it runs from the first such node to the end (the
    optimizer steps ggml-opt adds after it included). (`tensors`: graph_tensors(g).)"""
    names = record_names(tensors[1][:g.n_nodes])
    first = next((i for i, name in enumerate(names) if name.startswith("grad for ")), len(names))
    return set(tensors[0][first:g.n_nodes].tolist())


def _splits(sched: SchedView | None, where: Where, hidden: set[int]) -> tuple[str, ...]:
    """The scheduler's splits as clusters, each holding its nodes (those drawn: not folded into
    a layer box) and the copies of its inputs (drawn as their own nodes: a copy lives in the
    split backend's compute buffer)."""
    if sched is None:
        return ()
    out = []
    for i, (label, members) in enumerate(sched.clusters):
        copies = [c for c, where_i in sched.copies if where_i == i]
        out.append(f'  subgraph cluster_split{i} {{ label = "{_attr(label)}"; style = "dashed,rounded"; '
                   f'color = "#888888"; fontname = "DejaVu Sans"; fontsize = 10;')
        tooltip = _attr(_("a copy of an input, made by the scheduler"))
        for c in copies:
            out.append(f'    "{c.address:#x}" [ shape = cds; style = filled; fillcolor = "#fff3c4"; '
                       f'label = "{_attr(c.name)}"; id = "{node_id(c)}"; '
                       f'URL = "{where.query(tensor=tensor_key(c))}"; target = "_top"; '
                       f'tooltip = "{tooltip}"; ]')
        out += [f'    "{a:#x}";' for a in members if a not in hidden]
        out.append("  }")
    return tuple(out)


DOT_SECONDS = 20  # graphviz's time to draw one graph; past it, the drawing is a message
DOT_BYTES = 8 << 20  # the largest DOT text given to graphviz


class NotDrawnInTime(Exception):
    """Graphviz was stopped at DOT_SECONDS: asked again (on a less busy machine) it may finish, so
    the message (`svg`) is shown, never kept as the drawing."""

    def __init__(self, svg: str) -> None:
        super().__init__(svg)
        self.svg = svg


def render_svg(dot: str) -> str:
    """DOT -> SVG with graphviz's dot (the svg element only). A graph too large to draw (its DOT
    over DOT_BYTES) is an SVG that says so: a learner's program may build any graph; dot still
    working after DOT_SECONDS is killed (NotDrawnInTime)."""
    data = dot.encode()
    if len(data) > DOT_BYTES:
        return _message_svg(_("This graph is too large to draw ({n} bytes of DOT).").format(n=f"{len(data):,}"))
    try:
        done = subprocess.run(["dot", "-Tsvg"], input=data, capture_output=True, timeout=DOT_SECONDS, check=True)
    except subprocess.TimeoutExpired:
        raise NotDrawnInTime(_message_svg(_("Graphviz did not finish drawing this graph in {n} s.").format(
            n=DOT_SECONDS))) from None
    except subprocess.CalledProcessError as e:
        return _message_svg(_("Graphviz could not draw this graph: {error}").format(
            error=e.stderr.decode("utf-8", "replace")[:300]))
    svg = done.stdout.decode()
    return svg[svg.index("<svg"):]


class SvgCache:
    """svg(key, dot): the SVG of the drawing whose hash is `key`, rendered from dot() unless it is
    among the last `size` drawn (an app's LRU, shared by its requests); svg.drawn(key) without
    drawing it. A drawing graphviz did not finish in time is not kept (NotDrawnInTime)."""

    def __init__(self, size: int) -> None:
        self._svgs: LRUCache = LRUCache(size)
        self._lock = Lock()

    def __call__(self, key: str, dot: Callable[[], str]) -> str:
        svg = self.drawn(key)
        if svg is None:
            svg = render_svg(dot())
            with self._lock:
                self._svgs[key] = svg
        return svg

    def drawn(self, key: str) -> str | None:
        with self._lock:
            return self._svgs.get(key)


def svg_cache(size: int) -> SvgCache:
    return SvgCache(size)


def _message_svg(text: str) -> str:
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="640" height="40" viewBox="0 0 640 40">'
            f'<text x="8" y="24">{escape(text)}</text></svg>')
