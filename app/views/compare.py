"""The Compare page's view-models: the form, the job's progress, one node of both runs with its
difference, the error through the layers as a sparkline (an SVG drawn from the engine's figures),
each position's next-token distributions with the KLD, and the weights' own quantization error.
Every number shown is the engine's (engine/models/compare.py); this module only arranges them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlencode

from app.i18n import N_, _
from app.jobs import Progress
from app.store import Fixture
from app.views.format import fmt_short, shape_text, token_text
from engine.quants.ftype import COPY, DEFAULT_TYPE, NEEDS_IMATRIX, QUANT_OPTIONS, QuantOption

PROMPT = "The capital of France is"
SHOWN_ROWS = 4  # rows of a node's values shown (its last ones)
SHOWN_COLS = 6  # values of each row shown (its first ones)

# the file types a quantization is made to here: llama-quantize's own list, without the aliases,
# COPY, those the engine has no type for and those that need an importance matrix
QUANTS: tuple[QuantOption, ...] = tuple(
    o for o in QUANT_OPTIONS
    if o.name != COPY and not o.desc.startswith("alias") and o.ftype in DEFAULT_TYPE
    and DEFAULT_TYPE[o.ftype] not in NEEDS_IMATRIX)

NO_FILE = N_("No GGUF file with this hash here: it was never uploaded, was evicted since, or holds "
             "only its header.")
QUANTIZE_FAILED = N_("The quantization could not be made: {error}")
BAD_QUANT = N_("'{quant}' is not a file type this page quantizes to.")
NO_PROMPT = N_("Write a prompt: the two models are run over it.")
MISMATCH = {
    "arch": N_("The two files are of different architectures ('{a}' and '{b}'): their graphs are not "
               "the same, so their nodes cannot be stepped side by side."),
    "missing": N_("The tensor '{name}' is missing from file {side}: the two files do not build the same "
                  "graph."),
    "shape": N_("The tensor '{name}' has the shape {a} in the first file and {b} in the second: the "
                "two files do not build the same graph."),
    "graph": N_("The two graphs differ at node {index}: {a} in the first, {b} in the second."),
    "no_tokenizer": N_("{path}: its vocabulary has no tokenizer built here, so it cannot read a prompt."),
    "too_long": N_("The prompt is {n} tokens long; this page runs at most {limit}: a shorter prompt."),
    "empty": N_("The prompt gives no tokens."),
    "not_decoder": N_("'{arch}' is not a decoder ggml-lens builds: this page compares next-token models."),
}


class Refused(ValueError):
    """What the page refuses, in words: a message key and its values."""

    def __init__(self, key: str, **args: object) -> None:
        super().__init__(key)
        self.key, self.values = key, args


def compare_refusal(e: BaseException) -> str | None:
    """A compare_refusal's words in the learner's language (None: not a compare_refusal, a fault)."""
    from engine.gguf import GGUFError
    from engine.models.bundled import BundledModelError
    from engine.models.common import ModelError
    from engine.models.compare import CompareError

    if isinstance(e, Refused):
        return _(e.key).format(**e.values)
    if isinstance(e, CompareError):
        return _(MISMATCH[e.kind.value]).format(**e.values)
    if isinstance(e, (ModelError, GGUFError, BundledModelError)):
        return str(e)
    return None


def quant_option(name: str) -> QuantOption | None:
    return next((o for o in QUANTS if o.name == name.upper()), None)


@dataclass(frozen=True, slots=True)
class FileChoice:
    value: str
    label: str
    selected: bool


@dataclass(frozen=True, slots=True)
class CompareForm:
    a: str | None
    b: str | None
    prompt: str
    models: tuple[FileChoice, ...]  # the first file: the models folder's
    files: tuple[FileChoice, ...]  # the second: the folder's files (and an upload, when chosen)
    quants: tuple[FileChoice, ...]  # or a quantization of the first

    def url(self, n: int | None = None) -> str:
        query = {"a": self.a or "", "b": self.b or "", "prompt": self.prompt}
        if n is not None:
            query["n"] = str(n)
        return "/compare?" + urlencode(query)


def compare_form(models: list[Fixture], a: str | None, b: str | None, prompt: str) -> CompareForm:
    """The form: the folder's files for both, a stored file named by the URL (an upload) among
    them, the file types to quantize the first to."""
    def choices(chosen: str | None) -> tuple[FileChoice, ...]:
        out = [FileChoice(m.digest, m.name, m.digest == chosen) for m in models]
        if chosen and len(chosen) == 64 and not any(f.selected for f in out):
            out.append(FileChoice(chosen, _("uploaded file {hash}").format(hash=chosen[:12] + "…"), True))
        return tuple(out)

    upper = (b or "").upper()
    quants = tuple(FileChoice(o.name, f"{o.name} —{o.desc}", o.name == upper) for o in QUANTS)
    return CompareForm(a, b, prompt, choices(a), choices(b), quants)


QUANTIZING = "quantize"  # the stage before the engine's: the second file being made
# what each stage says (the engine's Stage values, and the quantization's)
STAGES = {
    QUANTIZING: N_("Quantizing the model to {quant}: tensor {done} of {total}."),
    "run_a": N_("Running the first model: {done} nodes computed."),
    "run_b": N_("Running the second model: {done} of {total} nodes computed."),
    "weights": N_("Comparing the weights: {done} of {total} tensors."),
}


@dataclass(frozen=True, slots=True)
class CompareProgress:
    place: int  # 0: running
    seconds: int | None
    stage: str | None  # where it is, in words (None: starting)


def compare_progress(p: Progress, stage: tuple[str, int, int] | None, quant: str | None) -> CompareProgress:
    words = None
    if stage is not None:
        name, done, total = stage
        words = _(STAGES[name]).format(done=done, total=total, quant=quant)
    return CompareProgress(p.place, p.seconds, words)


@dataclass(frozen=True, slots=True)
class ValueRow:
    row: int  # its index among the node's rows
    a: tuple[str, ...]
    b: tuple[str, ...]
    diff: tuple[str, ...]  # b - a


@dataclass(frozen=True, slots=True)
class NodeView:
    index: int
    count: int
    name: str
    op: str
    type: str
    shape: str
    layer: int | None
    rows_kept: tuple[int, int, int]  # first, last, of
    cols_kept: tuple[int, int]  # values compared per row, of ne[0]
    cols_shown: int
    more_cols: bool
    rows: tuple[ValueRow, ...]
    max_abs: str
    rel_rms: str
    cosine: str
    n_values: int
    prev_url: str | None
    next_url: str | None
    url: str


@dataclass(frozen=True, slots=True)
class Point:
    layer: int
    x: float
    y: float
    grows: bool  # its error is larger than the layer before's
    url: str
    value: str


@dataclass(frozen=True, slots=True)
class Sparkline:
    width: int
    height: int
    points: tuple[Point, ...]
    marker_x: float | None  # the current node's layer
    top: str  # the largest value (the top of the scale)
    first_layer: int | None
    last_layer: int | None


@dataclass(frozen=True, slots=True)
class NodeBar:
    x: float
    y: float
    width: float
    height: float
    url: str
    name: str
    value: str
    here: bool  # the current node


@dataclass(frozen=True, slots=True)
class LayerBars:
    """The relative RMS of every node of the current node's layer, a bar each."""

    layer: int | None  # None: the nodes before or after the layers
    width: int
    height: int
    bars: tuple[NodeBar, ...]
    top: str


@dataclass(frozen=True, slots=True)
class TokenRow:
    position: int
    token: str  # the prompt's token at this position
    target: str  # the token it predicts (the prompt's next; at the end, A's most likely)
    predicted: bool  # the last position: its target is the first model's most likely token
    top_a: tuple[tuple[str, str], ...]  # (piece, probability %)
    top_b: tuple[tuple[str, str], ...]
    kld: str
    same_top: bool
    p_diff: str


@dataclass(frozen=True, slots=True)
class WeightRow:
    name: str
    shape: str
    type_a: str
    type_b: str
    max_abs: str
    rel_rms: str
    same: bool


@dataclass(frozen=True, slots=True)
class PageView:
    node: NodeView
    spark: Sparkline
    bars: LayerBars
    tokens: tuple[TokenRow, ...]
    n_same_top: int
    weights: tuple[WeightRow, ...]
    n_changed: int  # weights whose bytes differ
    n_tokens: int
    n_nodes: int


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    if math.isinf(v):
        return "∞"
    return fmt_short(float(v))


def node_view(c, form: CompareForm, n: int) -> NodeView:
    """Node n of both runs: a few of its rows side by side and the engine's difference."""
    x, y, d = c.a.nodes[n], c.b.nodes[n], c.diffs[n]
    count = len(c.a.nodes)
    rows, cols = x.values.shape if x.values.ndim == 2 else (0, 0)
    shown_cols = min(cols, SHOWN_COLS)
    value_rows = []
    for r in range(max(0, rows - SHOWN_ROWS), rows):
        va, vb = x.values[r, :shown_cols], y.values[r, :shown_cols]
        value_rows.append(ValueRow(x.first_row + r, tuple(_num(v) for v in va), tuple(_num(v) for v in vb),
                                   tuple(_num(float(q) - float(p)) for p, q in zip(va, vb))))
    from engine.models.compare import run_layers

    return NodeView(n, count, x.name, x.op, x.type, shape_text(tuple(i for i in x.ne)), run_layers(c.a)[n],
                    (x.first_row, x.first_row + rows - 1, x.n_rows), (cols, x.ne[0]), shown_cols,
                    cols > shown_cols, tuple(value_rows), _num(d.max_abs), _num(d.rel_rms), _num(d.cosine),
                    d.n, form.url(n - 1) if n > 0 else None, form.url(n + 1) if n + 1 < count else None,
                    form.url(n))


SPARK_W, SPARK_H, SPARK_PAD = 640, 100, 14


def sparkline(c, form: CompareForm, n: int) -> Sparkline:
    """The relative RMS of each layer's output (the engine's layer_errors) as points of an SVG,
    each a link to its node; the current node's layer marked."""
    from engine.models.compare import layer_errors, run_layers

    pts = layer_errors(c)
    finite = [p.rel_rms for p in pts if math.isfinite(p.rel_rms)]
    top = max(finite, default=0.0)
    span = max(len(pts) - 1, 1)
    x_of = lambda i: SPARK_PAD + (SPARK_W - 2 * SPARK_PAD) * i / span  # noqa: E731
    points = []
    for i, p in enumerate(pts):
        v = p.rel_rms if math.isfinite(p.rel_rms) else top
        y = SPARK_H - SPARK_PAD - (SPARK_H - 2 * SPARK_PAD) * (v / top if top > 0 else 0.0)
        grows = i > 0 and p.rel_rms > pts[i - 1].rel_rms
        points.append(Point(p.layer, round(x_of(i), 1), round(y, 1), grows, form.url(p.node), _num(p.rel_rms)))
    marker = None
    il = run_layers(c.a)[n]
    if pts:
        layers = [p.layer for p in pts]
        if il is not None and il in layers:
            marker = round(x_of(layers.index(il)), 1)
        elif n < pts[0].node:
            marker = float(SPARK_PAD / 2)
        elif n > pts[-1].node:
            marker = float(SPARK_W - SPARK_PAD / 2)
    return Sparkline(SPARK_W, SPARK_H, tuple(points), marker, _num(top),
                     pts[0].layer if pts else None, pts[-1].layer if pts else None)


BARS_H = 70


def layer_bars(c, form: CompareForm, n: int) -> LayerBars:
    """Each node of node n's layer (the engine's run_layers) as a bar of its relative RMS, each a
    link to its node: where inside the layer the error grows."""
    from engine.models.compare import run_layers

    layers = run_layers(c.a)
    il = layers[n]
    first = _first(layers)  # (the nodes of no layer: those before it, or those after the layers)
    group = [i for i, x in enumerate(layers) if x == il and (il is not None or (i < first) == (n < first))]
    values = [c.diffs[i].rel_rms for i in group]
    top = max((v for v in values if math.isfinite(v)), default=0.0)
    step = (SPARK_W - 2 * SPARK_PAD) / max(len(group), 1)
    bars = []
    for k, i in enumerate(group):
        v = values[k] if math.isfinite(values[k]) else top
        h = (BARS_H - 12) * (v / top if top > 0 else 0.0)
        bars.append(NodeBar(round(SPARK_PAD + k * step, 1), round(BARS_H - h, 1), round(max(step - 2, 1), 1),
                        round(h, 1), form.url(i), c.a.nodes[i].name, _num(values[k]), i == n))
    return LayerBars(il, SPARK_W, BARS_H, tuple(bars), _num(top))


def _first(layers: tuple[int | None, ...]) -> int:
    """The index of the first node in a layer (the nodes before it are 'before the layers')."""
    return next((i for i, x in enumerate(layers) if x is not None), len(layers))


def _percent(p: float) -> str:
    return f"{100 * p:.1f}%"


def token_rows(c) -> tuple[TokenRow, ...]:
    pieces = {**c.b.pieces, **c.a.pieces}
    piece = lambda i: token_text(pieces.get(i, str(i)))  # noqa: E731
    last = len(c.a.tokens) - 1
    return tuple(TokenRow(t.position, piece(c.a.tokens[t.position]), piece(t.target), t.position == last,
                          tuple((token_text(k.piece), _percent(k.p)) for k in t.top_a),
                          tuple((token_text(k.piece), _percent(k.p)) for k in t.top_b),
                          _num(t.kld), t.same_top, _num(t.p_diff)) for t in c.tokens)


def page_view(c, form: CompareForm, n: int | None) -> PageView:
    """The whole page at node n (default: the first layer's output; past the end: the last)."""
    from engine.models.compare import layer_errors

    count = len(c.a.nodes)
    if n is None:
        pts = layer_errors(c)
        n = pts[0].node if pts else 0
    n = min(n, count - 1)
    weights = tuple(WeightRow(w.name, shape_text(w.ne), w.type_a, w.type_b, _num(w.max_abs),
                              _num(w.rel_rms), w.same_bytes) for w in c.weights)
    return PageView(node_view(c, form, n), sparkline(c, form, n), layer_bars(c, form, n), token_rows(c),
                    sum(t.same_top for t in c.tokens), weights, sum(not w.same for w in weights),
                    len(c.a.tokens), count)
