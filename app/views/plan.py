"""The memory plan page: what llama.cpp allocates for a model file and a context's settings
(engine/models/plan.py's `plan` and `fit`), as a stacked bar, llama.cpp's own log lines, the
caches, the compute buffer's largest tensors, flash attention on and off side by side, and a
table per layer. Every figure is the engine's; this module only arranges them.

Plans are kept in a small LRU per process (keyed by the file's identity and the settings), so
moving a slider back and forth asks no plan twice; each keeps how long it took to make. Each plan
is made in an address space of its own (the engine's simulated memory is per context, and
requests are served by several threads at once).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from cachetools import LRUCache

from app.cli_plan import plan_lines
from app.i18n import N_, _
from app.views.format import shape_text
from app.views.plan_inputs import MIB, Asked, FileFacts, fit_too_large, plan_url, read_asked, \
    too_large
from engine.core.context import fresh_address_space
from engine.core.types import TYPE_TRAITS
from engine.gguf import GGUFError
from engine.models import ModelError
from engine.models.params import ContextParams, ParamsError
from engine.models.plan import MAPPED, Fit, Plan, fit, plan

log = logging.getLogger("ggml-lens")
PLAN_CACHE = 64  # plans kept per process
FIT_CACHE = 16  # --fit answers kept per process
PEAK_ROWS = 8  # the compute buffer's tensors shown


class BufferKind(Enum):
    """The four kinds of buffers llama.cpp makes (each a colour of the bar)."""

    MODEL = "model"
    CACHE = "cache"
    COMPUTE = "compute"
    OUTPUT = "output"


KIND_LABELS = {BufferKind.MODEL: N_("model weights"), BufferKind.CACHE: N_("cache"),
               BufferKind.COMPUTE: N_("compute"), BufferKind.OUTPUT: N_("output")}
# what a graph tensor at the compute buffer's peak holds, by its name (without the "-<layer>")
TENSOR_MEANINGS = {
    "result_output": N_("the logits: a score for every token of the vocabulary, for each token "
                        "of the ubatch"),
    "kq": N_("the attention scores: one for each cached cell, token of the ubatch and head"),
    "kq_soft_max": N_("the attention scores after the softmax"),
    "attn_inp_kq_mask": N_("the attention mask: which cached cells each token may see"),
    "attn_inp_kq_mask_swa": N_("the sliding-window layers' attention mask"),
    "inp_embd": N_("the ubatch's token embeddings"),
    "result_norm": N_("the last hidden states, normalized, before the output head"),
    "__fattn__": N_("flash attention's output for the ubatch"),
}


@dataclass(frozen=True, slots=True)
class Made:
    """A plan (or --fit's answer) and the seconds it took to make."""

    value: object
    seconds: float


_plans: LRUCache = LRUCache(PLAN_CACHE)
_fits: LRUCache = LRUCache(FIT_CACHE)
_lock = threading.Lock()


def _identity(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def planned(path: Path, params: ContextParams, mmap: bool) -> Made:
    """plan(path, params), kept: a file's plans are keyed by its identity (path, size, mtime)."""
    key = (_identity(path), params, mmap)
    with _lock:
        found = _plans.get(key)
    if found is None:
        t0 = time.perf_counter()
        with fresh_address_space():  # its own simulated memory: requests plan in parallel
            found = Made(plan(path, params, mmap=mmap), time.perf_counter() - t0)
        with _lock:
            _plans[key] = found
    return found


def fitted(path: Path, free: int, params: ContextParams, mmap: bool, margin: int) -> Made:
    """fit(path, free, ...) with the context left to it, kept."""
    params = params.with_(n_ctx=0)
    key = (_identity(path), free, params, mmap, margin)
    with _lock:
        found = _fits.get(key)
    if found is None:
        t0 = time.perf_counter()
        with fresh_address_space():
            found = Made(fit(path, free, params, mmap, margin), time.perf_counter() - t0)
        with _lock:
            _fits[key] = found
    return found


def mib(n: int) -> str:
    """Bytes in MiB to two decimals, as llama.cpp's log writes them."""
    return f"{n / MIB:.2f}"


@dataclass(frozen=True, slots=True)
class BufferSegment:
    """One buffer: a segment of the bar and a row of the table under it."""

    kind: BufferKind
    name: str  # CPU_Mapped, CPU_REPACK, CPU; the cache's name; CPU
    logged_by: str  # the llama.cpp function that logs it
    size: int  # bytes
    share: float  # percent of the plan's total
    shade: int  # its place among the buffers of its kind (a lighter colour each)

    @property
    def mib(self) -> str:
        return mib(self.size)

    @property
    def label(self) -> str:
        return _(KIND_LABELS[self.kind])


@dataclass(frozen=True, slots=True)
class CacheRow:
    name: str
    cells: int
    n_layers: int
    type_k: str
    k_bytes: int
    type_v: str
    v_bytes: int
    size: int
    recurrent: bool  # Mamba's r and s states, not K and V


@dataclass(frozen=True, slots=True)
class PeakRow:
    """A tensor of the compute buffer where its largest graph peaks."""

    name: str
    meaning: str
    op: str
    type: str
    shape: str
    size: int


@dataclass(frozen=True, slots=True)
class FlashSide:
    """The plan with flash attention on, or off: its compute buffer and its largest tensor."""

    on: bool
    compute: int | None  # None: llama.cpp refuses these settings (refused says why)
    top: PeakRow | None
    current: bool  # the page's own setting
    refused: str = ""
    href: str = ""  # the page with this -fa


@dataclass(frozen=True, slots=True)
class LayerRow:
    label: str  # "0", "1", ...; "—" for the weights of no layer
    weights: tuple[int, ...]  # bytes in each buffer type of LayerTable.buffers
    types: tuple[tuple[str, int], ...]  # (ggml type, bytes), largest first
    cache: int
    cells: int
    swa: bool


@dataclass(frozen=True, slots=True)
class LayerTable:
    buffers: tuple[str, ...]  # the buffer types the weights went to
    rows: tuple[LayerRow, ...]
    recurrent: bool
    has_swa: bool


@dataclass(frozen=True, slots=True)
class FitView:
    free: int
    margin: int
    n_ctx: int | None  # llama-fit-params' -c (None: it gives up)
    n_ubatch: int
    largest: int | None  # the largest context whose whole plan fits free - margin
    used_max: int
    used_min: int
    total: int | None  # the whole plan at n_ctx
    href: str  # the page at n_ctx
    largest_href: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Figures:
    """Everything the page shows of one plan."""

    settings: str  # the settings resolved, as llama.cpp prints them
    n_ctx: int
    total: int
    segments: tuple[BufferSegment, ...]
    log_lines: tuple[str, ...]  # the plan as llama.cpp's log lines
    caches: tuple[CacheRow, ...]
    graphs: tuple[tuple[str, int, int, int], ...]  # (pp|tg, n_tokens, n_nodes, bytes)
    compute: int
    peak: tuple[PeakRow, ...]
    flash: tuple[FlashSide, FlashSide]
    flash_note: str
    layers: LayerTable
    seconds: float  # how long the plan took to make


def _segments(p: Plan) -> tuple[BufferSegment, ...]:
    total = p.total or 1
    rows = [(BufferKind.MODEL, b.name, "load_tensors", b.size) for b in p.model]
    rows += [(BufferKind.CACHE, c.name, "llama_memory_recurrent" if c.name == "RS"
              else "llama_kv_cache", c.size) for c in p.caches]
    rows += [(BufferKind.COMPUTE, "CPU", "sched_reserve", p.compute),
             (BufferKind.OUTPUT, "CPU", "llama_context::output_reserve", p.output)]
    return tuple(BufferSegment(kind, name, by, size, 100 * size / total,
                         sum(1 for r in rows[:i] if r[0] == kind))
                 for i, (kind, name, by, size) in enumerate(rows))


def _peak_row(t) -> PeakRow:
    meaning = TENSOR_MEANINGS.get(t.name) or TENSOR_MEANINGS.get(t.name.rsplit("-", 1)[0], "")
    ne = tuple(t.ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne = ne[:-1]
    return PeakRow(t.name, _(meaning) if meaning else "", t.op, t.type, shape_text(ne), t.size)


def _layers(p: Plan) -> LayerTable:
    buffers = tuple(dict.fromkeys(b for la in p.layers for b in la.weights))
    rows = tuple(LayerRow("—" if la.il < 0 else str(la.il),
                          tuple(la.weights.get(b, 0) for b in buffers),
                          tuple(sorted(la.types.items(), key=lambda kv: -kv[1])),
                          la.cache_bytes, la.cells, la.swa) for la in p.layers)
    # with mmap the CPU weights lie in the buffer over the file's mapping (plan.model_buffers)
    names = tuple(MAPPED if b == "CPU" and p.mmap else b for b in buffers)
    return LayerTable(names, rows, any(c.name == "RS" for c in p.caches),
                      any(la.swa for la in p.layers))


def _logged(p: Plan) -> tuple[str, ...]:
    """llama.cpp's own log lines of the plan: from the model's buffers to sched_reserve's
    (plan_lines' first line names the file by its path on the server; what follows the compute
    buffer's line is the engine's)."""
    lines = plan_lines(p)
    end = next(i for i, line in enumerate(lines) if line.startswith("sched_reserve"))
    return tuple(lines[1:end + 1])


def settings_text(p: Plan) -> str:
    """The settings resolved, as plan_lines' first line says them (without the file's path)."""
    return plan_lines(p)[0][len(f"{p.path}: "):]


def refusal(e: Exception, path: Path, title: str) -> str:
    """An error of the engine as the page says it: its own words, the server's path replaced by
    the file's name."""
    return str(e).replace(str(path), title)


def _flash(key: str, path: Path, title: str, p: Plan, asked: Asked) -> tuple[FlashSide, FlashSide]:
    """The plan with flash attention on and off (one of them the page's own)."""
    assert asked.params is not None
    sides = []
    for on in (True, False):
        href = plan_url(key, asked, fa="on" if on else "off")
        if p.context.flash_attn == on:
            other: Plan | None = p
        else:
            try:
                made = planned(path, asked.params.with_(flash_attn="on" if on else "off"),
                               asked.mmap)
                other = made.value  # type: ignore[assignment]
            except (ModelError, ParamsError) as e:
                sides.append(FlashSide(on, None, None, False, refusal(e, path, title), href))
                continue
        assert other is not None
        top = _peak_row(other.peak[0]) if other.peak else None
        sides.append(FlashSide(on, other.compute, top, other is p, "", href))
    return sides[0], sides[1]


def _flash_note(on: FlashSide, off: FlashSide) -> str:
    """What flash attention changes here, in a sentence of the two plans' figures."""
    if on.compute is None or off.compute is None:
        return ""
    if off.compute > on.compute:
        return _("Without flash attention the compute buffer is {off} MiB, {diff} MiB more: the "
                 "graph writes the attention scores of a whole layer to memory (KQ, then its "
                 "softmax), while FLASH_ATTN_EXT computes them a block of cells at a time and "
                 "never keeps them.").format(off=mib(off.compute), diff=mib(off.compute - on.compute))
    if off.compute < on.compute:
        return _("With flash attention the compute buffer is {on} MiB, {diff} MiB more than "
                 "without: its largest tensor at the peak is {name}.").format(
            on=mib(on.compute), diff=mib(on.compute - off.compute),
            name=on.top.name if on.top else "—")
    return _("Here flash attention leaves the compute buffer as it is ({size} MiB): its peak is "
             "{name}, larger than the attention scores at this context and ubatch. The scores "
             "grow with the context (one per cell), {name} does not.").format(
        size=mib(on.compute), name=on.top.name if on.top else "—")


def _fit_view(key: str, path: Path, asked: Asked) -> FitView:
    assert asked.params is not None and asked.fit is not None
    made = fitted(path, asked.fit, asked.params, asked.mmap, asked.margin)
    f: Fit = made.value  # type: ignore[assignment]
    return FitView(f.free, f.margin, f.n_ctx, f.n_ubatch, f.largest, f.used_max, f.used_min,
                   f.plan.total if f.plan is not None else None,
                   plan_url(key, asked, c=str(f.n_ctx)) if f.n_ctx else "",
                   plan_url(key, asked, c=str(f.largest)) if f.largest else "", made.seconds)


def figures(key: str, path: Path, title: str, asked: Asked) -> tuple[Figures | None, str]:
    """The page's figures for the file at `path` with the settings asked (which must have been
    read without errors), or why there are none: llama.cpp's refusal in its words, the
    engine's (an architecture it does not plan), or the file's."""
    assert asked.params is not None
    try:
        made = planned(path, asked.params, asked.mmap)
        p: Plan = made.value  # type: ignore[assignment]
        flash = _flash(key, path, title, p, asked)
    except (ModelError, ParamsError, GGUFError) as e:
        return None, refusal(e, path, title)
    except OSError as e:
        return None, _("The file could not be read: {error}").format(error=e.strerror or e)
    except Exception as e:  # noqa: BLE001 - a file the builders trip over: say so, never a traceback
        log.exception("plan failed for %s", path)
        return None, _("This file could not be planned: {error}").format(
            error=f"{type(e).__name__}: {refusal(e, path, title)}")
    caches = tuple(CacheRow(c.name, c.cells, len(c.layers), TYPE_TRAITS[c.type_k].type_name,
                            c.k_bytes, TYPE_TRAITS[c.type_v].type_name, c.v_bytes, c.size,
                            c.name == "RS") for c in p.caches)
    return Figures(
        settings_text(p), p.context.n_ctx, p.total, _segments(p),
        _logged(p), caches,
        tuple((g.what, g.n_tokens, g.n_nodes, g.size) for g in p.graphs), p.compute,
        tuple(_peak_row(t) for t in p.peak[:PEAK_ROWS]), flash, _flash_note(*flash),
        _layers(p), made.seconds), ""



@dataclass(frozen=True, slots=True)
class PlanSource:
    """The file a plan page is of."""

    key: str  # its name in the page's URL: "bundled", or its hash in the upload store
    path: Path
    title: str  # general.name, or the file's name
    origin: str  # "models folder: NAME", "upload", "header-only upload ...", "the bundled model"
    inspector: str  # its GGUF inspector page ("" when it has none)


@dataclass(frozen=True, slots=True)
class PlanPage:
    source: PlanSource
    facts: FileFacts
    asked: Asked
    figures: Figures | None
    errors: tuple[str, ...]  # why there are no figures: the settings refused, or the file

    @property
    def url(self) -> str:
        return plan_url(self.source.key, self.asked)

    @property
    def fit_url(self) -> str:
        """Where --fit's answer for these settings is."""
        q = self.asked.query()
        return f"/plan/{self.source.key}/fit" + (f"?{q}" if q else "")

    @property
    def status(self) -> int:
        return 422 if self.errors else 200

    @property
    def slider(self) -> int:
        """The context slider's position: the plan's context, else the one asked, else the
        model's."""
        if self.figures is not None:
            return min(self.figures.n_ctx, self.facts.ctx_cap)
        c = self.asked.values["c"]
        return int(c) if c.isdigit() and 0 < int(c) <= self.facts.ctx_cap else self.facts.ctx_cap


def plan_page(source: PlanSource, facts: FileFacts, query) -> PlanPage:
    """The plan page of a file for a query's settings: read, checked, capped, then planned."""
    asked = read_asked(query, facts)
    refused = too_large(facts)
    if refused:
        return PlanPage(source, facts, asked, None, (refused,))
    if asked.errors:
        return PlanPage(source, facts, asked, None, asked.errors)
    found, error = figures(source.key, source.path, source.title, asked)
    return PlanPage(source, facts, asked, found, (error,) if error else ())


@dataclass(frozen=True, slots=True)
class FitPage:
    """--fit's answer for a file and the page's other settings (its context left to --fit)."""

    source: PlanSource
    asked: Asked
    fit: FitView | None
    errors: tuple[str, ...]

    @property
    def status(self) -> int:
        return 422 if self.errors else 200


def fit_page(source: PlanSource, facts: FileFacts, query) -> FitPage:
    """The largest context that fits the memory asked (`fit` in the query): llama-fit-params'
    answer and a bisection over whole plans. Takes a plan per halving, so the plan page loads it
    after its own figures."""
    asked = read_asked(query, facts)
    errors = (fit_too_large(facts),) if fit_too_large(facts) else asked.errors
    if not errors and asked.fit is None:
        errors = (_("--fit: give the memory there is (8G, 1536M...)"),)
    if errors:
        return FitPage(source, asked, None, errors)
    try:
        return FitPage(source, asked, _fit_view(source.key, source.path, asked), ())
    except (ModelError, ParamsError, GGUFError) as e:
        return FitPage(source, asked, None, (refusal(e, source.path, source.title),))
    except Exception as e:  # noqa: BLE001 - a file the builders trip over: say so, never a traceback
        log.exception("fit failed for %s", source.path)
        return FitPage(source, asked, None, (_("This file could not be planned: {error}").format(
            error=f"{type(e).__name__}: {refusal(e, source.path, source.title)}"),))
