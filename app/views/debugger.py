"""View-models of the walkthrough debugger: one function per panel, each from a rebuilt state.

Panels only show what the engine computed: the pools rebuilt from the trace at this step, the
tensor structs read from those pools, the step's own record of what it changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.ggml import format_tensor
from engine.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, OBJECT, TENSOR, field_spans
from engine.optable import GGMLOp, ggml_op_symbol
from engine.programs import PROGRAMS
from engine.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nelements
from engine.trace import State, Step, Trace
from engine.types import TYPE_TRAITS


# --- addressing -----------------------------------------------------------------------------

def tensor_key(t: Tensor) -> str:
    return f"{t.ctx.id}.{t.offs}"


def parse_key(key: str | None) -> tuple[int, int] | None:
    if not key:
        return None
    try:
        ctx, offs = key.split(".")
        return int(ctx), int(offs)
    except ValueError:
        return None


@dataclass
class Where:
    """Everything that names a debugger view: program, step, threads, selected tensor."""

    name: str
    step: int
    threads: int | None = None
    tensor: str | None = None  # "ctx.offset" of the selected tensor struct
    row: int = 0  # quantized row and block shown in the block explainer
    block: int = 0
    file: str | None = None  # content hash of an uploaded GGUF, for gguf-load
    hex: str = "struct"  # what the Bytes panel shows: "struct" or "data"

    def query(self, **change) -> str:
        """A link relative to the current step's path: "?threads=..&t=..". Independent of the
        step, so the graph's SVG can be reused from step to step."""
        v = {**self.__dict__, **change}
        return "?" + _query((("threads", v["threads"]), ("file", v["file"]), ("t", v["tensor"]),
                             ("expand", change.get("expand"))))

    def url(self, **change) -> str:
        v = {**self.__dict__, **change}
        pairs = [("threads", v["threads"]), ("file", v["file"]), ("t", v["tensor"]),
                 ("hex", None if v["hex"] == "struct" else v["hex"])]
        if v["row"] or v["block"]:
            pairs += [("row", v["row"]), ("block", v["block"])]
        q = _query(pairs)
        return f"/walkthroughs/{v['name']}/steps/{v['step']}" + (f"?{q}" if q else "")


def _query(pairs) -> str:
    """A query string; every value here is a number, a hex hash or "ctx.offset": no escaping."""
    return "&".join(f"{k}={x}" for k, x in pairs if x is not None)


# --- navigation and source --------------------------------------------------------------------

@dataclass
class Nav:
    index: int
    count: int
    prev_url: str | None
    next_url: str | None
    next_call_url: str | None
    next_node_url: str | None
    first_url: str
    last_url: str
    threads: int
    default_threads: int
    kind: str


def nav(trace: Trace, where: Where) -> Nav:
    k, n = where.step, len(trace.steps)

    def jump(kinds: tuple[str, ...]) -> str | None:
        nxt = next((s.index for s in trace.steps[k + 1:] if s.kind in kinds), None)
        return None if nxt is None else where.url(step=nxt, tensor=None)

    return Nav(k, n, where.url(step=k - 1, tensor=None) if k > 0 else None,
               where.url(step=k + 1, tensor=None) if k < n - 1 else None,
               jump(("call", "end", "error", "cap")), jump(("node",)),
               where.url(step=0, tensor=None), where.url(step=n - 1, tensor=None),
               trace.n_threads, PROGRAMS[where.name].threads, trace.steps[k].kind)


@dataclass
class SourceLine:
    number: int
    text: str
    current: bool


@dataclass
class Source:
    lines: list[SourceLine]
    call: str
    note: str
    kind: str
    error: str | None
    fields: list
    parent_call: str | None


def source(trace: Trace, step: Step) -> Source:
    lines = trace.source.splitlines()
    parent = trace.steps[step.parent].call if step.parent is not None else None
    return Source([SourceLine(i + 1, text, i + 1 == step.line) for i, text in enumerate(lines)],
                  step.call, step.note, step.kind, trace.error if step.kind in ("error", "cap")
                  else None, list(step.fields), parent)


# --- the memory pool ------------------------------------------------------------------------

@dataclass
class Segment:
    kind: str  # header, struct, graph, data, padding, work, free
    start: int
    size: int
    width: float  # percent of the bar
    label: str
    changed: bool
    tensor: str | None = None  # key of the tensor this segment belongs to
    url: str | None = None


@dataclass
class PoolView:
    ctx: int
    base: int
    mem_size: int
    used: int
    segments: list[Segment]
    n_objects: int


def _scaled(size: int) -> float:
    """Bar width for a byte count: sqrt scaling keeps 32-byte headers and megabytes both visible."""
    return max(math.sqrt(max(size, 1)), 3.0)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What the pool bar and the tensor list need of one tensor struct."""

    key: str
    offs: int
    name: str
    type: int
    ne: tuple[int, int, int, int]
    op: int
    is_view: bool
    data: int  # address, 0 for NULL
    nbytes: int


_BLCK = np.array([tr.blck_size or 1 for tr in TYPE_TRAITS], dtype=np.int64)
_TSIZE = np.array([tr.type_size for tr in TYPE_TRAITS], dtype=np.int64)


def tensor_infos(ctx, offsets: list[int]) -> list[TensorInfo]:
    """Read every listed tensor struct of a pool at once (one gather, vectorised ggml_nbytes)."""
    if not offsets:
        return []
    offs = np.asarray(offsets, dtype=np.int64)
    recs = ctx.pool[offs[:, None] + np.arange(GGML_TENSOR_SIZE)].view(TENSOR)[:, 0]
    types = recs["type"].astype(np.int64)
    ne = recs["ne"].astype(np.int64)
    nb = recs["nb"].astype(np.int64)
    blck, tsize = _BLCK[types], _TSIZE[types]
    spans = ((ne[:, 1:] - 1) * nb[:, 1:]).sum(axis=1)
    first = np.where(blck == 1, tsize + (ne[:, 0] - 1) * nb[:, 0], ne[:, 0] * nb[:, 0] // blck)
    nbytes = np.where((ne <= 0).any(axis=1), 0, first + spans)
    out = []
    for i, o in enumerate(offsets):
        r = recs[i]
        name = bytes(r["name"]).decode("utf-8", "replace")
        out.append(TensorInfo(f"{ctx.id}.{o}", o, name, int(types[i]), tuple(int(x) for x in ne[i]),
                              int(r["op"]), int(r["view_src"]) != 0, int(r["data"]),
                              int(nbytes[i])))
    return out


def pools(state: State, step: Step, where: Where, selected: Tensor | None) -> list[PoolView]:
    changed = [(p.ctx, p.offset, p.end) for p in step.patches]
    added = {(o.ctx, o.header) for o in step.objects}
    views = []
    for cid, ctx in state.contexts.items():
        segs: list[Segment] = []
        mine = [(s_, e_) for c, s_, e_ in changed if c == cid]

        def hit(a: int, b: int) -> bool:
            return any(s_ < b and e_ > a for s_, e_ in mine)

        objs = list(ctx.objects())
        infos = {t.offs: t for t in tensor_infos(ctx, [o.offs for o in objs if o.type == 0])}
        end = 0
        for o in objs:
            new = (cid, o.header) in added
            segs.append(Segment("header", o.header, GGML_OBJECT_SIZE, 0,
                                f"ggml_object header ({o.type_name})", new or hit(o.header, o.offs)))
            if o.type == 0:
                t = infos[o.offs]
                url = where.url(tensor=t.key)
                label = f"tensor '{t.name}' struct" if t.name else "tensor struct"
                segs.append(Segment("struct", o.offs, GGML_TENSOR_SIZE, 0, label,
                                    new or hit(o.offs, o.offs + GGML_TENSOR_SIZE), t.key, url))
                inline = o.size - GGML_TENSOR_SIZE
                if inline > 0:
                    nbytes = t.nbytes if not t.is_view and t.data else 0
                    start = o.offs + GGML_TENSOR_SIZE
                    if nbytes:
                        segs.append(Segment("data", start, nbytes, 0, f"data of '{t.name}'",
                                            hit(start, start + nbytes), t.key,
                                            where.url(tensor=t.key, hex="data")))
                    if inline - nbytes > 0:
                        segs.append(Segment("padding", start + nbytes, inline - nbytes, 0,
                                            "padding to 16 bytes", False, t.key, url))
            elif o.type == 1:
                segs.append(Segment("graph", o.offs, o.size, 0, "ggml_cgraph: struct, nodes, "
                                    "leafs, use counts, hash keys, bitset",
                                    new or hit(o.offs, o.offs + o.size)))
            else:
                segs.append(Segment("work", o.offs, o.size, 0, "work buffer", new))
            end = o.offs + o.size
        if ctx.mem_size > end:
            segs.append(Segment("free", end, ctx.mem_size - end, 0, "unused", False))
        total = sum(_scaled(s.size) for s in segs) or 1
        for s in segs:
            s.width = 100 * _scaled(s.size) / total
        views.append(PoolView(cid, ctx.base, ctx.mem_size, end, segs, len(objs)))
    return views


# --- hex view -------------------------------------------------------------------------------

@dataclass
class HexCell:
    byte: str
    field: str | None
    changed: bool
    first: bool  # the first byte of its field


@dataclass
class HexRow:
    offset: int
    cells: list[HexCell]


@dataclass
class HexView:
    title: str
    rows: list[HexRow]
    legend: list[tuple[str, int, int, str]]  # field, offset, size, value


def hexview(state: State, step: Step, t: Tensor | None, what: str = "struct") -> HexView | None:
    """Bytes of the selected tensor, each byte named: its object header and struct (fields), or
    the first 512 bytes at its data pointer (elements, or blocks of a quantized type)."""
    if t is None:
        return None
    names: dict[int, str] = {}
    legend = []
    if what == "data" and t.data is not None:
        ctx, start = t.ctx.space.resolve(t.data)
        tr = TYPE_TRAITS[t.type]
        raw = ctx.pool[start:start + min(ggml_nbytes(t), 512)]
        unit = "block" if tr.blck_size > 1 else "element"
        for i in range(raw.size):
            names[i] = f"{unit} {i // tr.type_size}"  # in memory order, from the data pointer
        title = (f"'{t.name}' data at pool offset {start:#x} in context {ctx.id}: "
                 f"{tr.type_size}-byte {unit}s in memory order"
                 + (" (first 512 bytes)" if ggml_nbytes(t) > 512 else ""))
    else:
        ctx, start = t.ctx, t.offs - GGML_OBJECT_SIZE
        raw = ctx.pool[start:t.offs + GGML_TENSOR_SIZE]
        rec_obj = raw[:GGML_OBJECT_SIZE].view(OBJECT)[0]
        rec = raw[GGML_OBJECT_SIZE:].view(TENSOR)[0]
        for base, dtype, r, prefix in ((0, OBJECT, rec_obj, "object."),
                                       (GGML_OBJECT_SIZE, TENSOR, rec, "")):
            for span in field_spans(dtype):
                for i in range(span.size):
                    names[base + span.offset + i] = prefix + span.name
                legend.append((prefix + span.name, start + base + span.offset, span.size,
                               _field_value(r[span.name], span.pointer)))
        title = (f"'{t.name}' at pool offset {start:#x}: 32-byte ggml_object, then the "
                 "336-byte ggml_tensor")
    changed = set()
    for p in step.patches:
        if p.ctx == ctx.id:
            changed.update(range(max(p.offset, start), min(p.end, start + raw.size)))
    rows = []
    for r0 in range(0, raw.size, 16):
        cells = []
        for i in range(r0, min(r0 + 16, raw.size)):
            f = names.get(i)
            cells.append(HexCell(f"{raw[i]:02x}", f, start + i in changed,
                                 f is not None and names.get(i - 1) != f))
        rows.append(HexRow(start + r0, cells))
    return HexView(title, rows, legend)


def _field_value(v, pointer: bool) -> str:
    if isinstance(v, bytes):
        return repr(v.split(b"\0", 1)[0].decode("utf-8", "replace"))
    if isinstance(v, np.ndarray):
        vals = [int(x) for x in v.ravel()]
        if pointer:
            return "{" + ", ".join(f"{x:#x}" if x else "NULL" for x in vals) + "}"
        return "{" + ", ".join(str(x) for x in vals) + "}"
    x = int(v)
    return (f"{x:#x}" if x else "NULL") if pointer else str(x)


# --- tensors --------------------------------------------------------------------------------

@dataclass
class TensorRow:
    key: str
    name: str
    type: str
    ne: str
    op: str
    url: str
    selected: bool
    is_view: bool


def tensor_list(state: State, where: Where, selected: Tensor | None) -> list[TensorRow]:
    rows = []
    sel = None if selected is None else tensor_key(selected)
    for ctx in state.contexts.values():
        for t in tensor_infos(ctx, [o.offs for o in ctx.objects() if o.type == 0]):
            rows.append(TensorRow(t.key, t.name or "(unnamed)", TYPE_TRAITS[t.type].type_name,
                                  "[" + ", ".join(str(x) for x in t.ne) + "]", GGMLOp(t.op).name,
                                  where.url(tensor=t.key), t.key == sel, t.is_view))
    return rows


@dataclass
class StructView:
    title: str
    gdb: str
    links: list[tuple[str, str, str]]  # (field, tensor name, url)


def struct(t: Tensor | None, where: Where) -> StructView | None:
    if t is None:
        return None
    links = []
    for i, s in enumerate(t.src):
        if s is not None:
            links.append((f"src[{i}]", s.name or "(unnamed)", where.url(tensor=tensor_key(s))))
    if t.view_src is not None:
        links.append(("view_src", t.view_src.name or "(unnamed)",
                      where.url(tensor=tensor_key(t.view_src))))
    return StructView(f"p *{t.name or 'tensor'}", "$1 = " + format_tensor(t), links)


# --- strides --------------------------------------------------------------------------------

@dataclass
class StrideCell:
    index: str  # "[i1, i0]"
    offset: int  # byte offset from the view's data pointer
    value: str


@dataclass
class StridesView:
    name: str
    type: str
    ne: list[int]
    nb: list[int]
    explain: list[str]
    grid: list[list[StrideCell]]  # one 2-d slice: rows i1, columns i0
    grid_note: str
    parent: dict | None  # the view's window inside its parent's bytes
    blocks: list[dict] | None  # quantized: one row as its blocks


def strides(t: Tensor | None, where: Where) -> StridesView | None:
    if t is None:
        return None
    tr = TYPE_TRAITS[t.type]
    ne, nb = [int(x) for x in t.ne], [int(x) for x in t.nb]
    explain = [f"nb[0] = {nb[0]}: " + (f"bytes per element of {tr.type_name}" if tr.blck_size == 1
                                        else f"bytes per block of {tr.blck_size} elements")]
    for i in range(1, 4):
        if ne[i] > 1 or i == 1:
            explain.append(f"nb[{i}] = {nb[i]}: step {i} in dimension {i} "
                           f"(= {nb[i] // max(nb[i - 1], 1) if nb[i - 1] else 0} x nb[{i - 1}])"
                           if nb[i - 1] and nb[i] % nb[i - 1] == 0 else
                           f"nb[{i}] = {nb[i]}: bytes from one index of dimension {i} to the next")
    if not ggml_is_contiguous(t):
        explain.append("not contiguous: the strides are not in packed order, so elements that are "
                       "neighbours here are not neighbours in memory")
    grid, note, blocks = [], "", None
    if tr.blck_size == 1:
        rows, cols = min(ne[1], 8), min(ne[0], 12)
        vals = _elements(t)
        for i1 in range(rows):
            row = []
            for i0 in range(cols):
                v = "" if vals is None else _fmt(vals[0, 0, i1, i0])
                row.append(StrideCell(f"[{i1}, {i0}]", i0 * nb[0] + i1 * nb[1], v))
            grid.append(row)
        note = (f"element [i1, i0] sits at data + i0*{nb[0]} + i1*{nb[1]} bytes"
                + (" (first 8 rows, 12 columns)" if ne[1] > rows or ne[0] > cols else "")
                + (" for i2 = i3 = 0" if ne[2] * ne[3] > 1 else ""))
    else:
        nblocks = ne[0] // tr.blck_size
        blocks = [{"index": b, "offset": b * nb[0], "size": tr.type_size,
                   "elements": f"{b * tr.blck_size}..{(b + 1) * tr.blck_size - 1}"}
                  for b in range(min(nblocks, 16))]
        note = (f"row 0 holds {nblocks} block(s) of {tr.blck_size} elements, {tr.type_size} bytes "
                f"each; rows are nb[1] = {nb[1]} bytes apart")
    parent = None
    if t.view_src is not None and t.data is not None:
        base = t.view_src
        span = ggml_nbytes(base)
        start = t.view_offs
        touched = _touched_bytes(t)
        parent = {"name": base.name or "(unnamed)", "nbytes": span, "offset": start,
                  "cells": [{"i": i, "in": i in touched} for i in range(0, min(span, 512),
                                                                         max(1, nb[0] if tr.blck_size == 1 else 1))],
                  "step": max(1, nb[0] if tr.blck_size == 1 else 1),
                  "note": f"view_offs = {start}: this view's bytes inside '{base.name}' "
                          f"({span} bytes) are highlighted" + (" (first 512 bytes)" if span > 512 else "")}
    return StridesView(t.name or "(unnamed)", tr.type_name, ne, nb, explain, grid, note, parent,
                       blocks)


def _touched_bytes(t: Tensor) -> set[int]:
    """Byte offsets (relative to view_src's data) of the first byte of each element of view t."""
    ne, nb = [int(x) for x in t.ne], [int(x) for x in t.nb]
    tr = TYPE_TRAITS[t.type]
    if ggml_nelements(t) > 4096:
        return set()
    out = set()
    n0 = ne[0] // tr.blck_size
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                for i0 in range(n0):
                    o = t.view_offs + i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
                    out.update(range(o, o + (tr.type_size if tr.blck_size == 1 else tr.type_size)))
    return out


def _elements(t: Tensor) -> np.ndarray | None:
    """t's elements as float64 (4-d, numpy order), or None without data."""
    from engine.compute.kernels.common import to_f32, view4

    if t.data is None or TYPE_TRAITS[t.type].is_quantized:
        return None
    try:
        return to_f32(view4(t), t.type).astype(np.float64)
    except ValueError:
        return None


def _fmt(v: float) -> str:
    if v != v:
        return "nan"
    if abs(v) >= 1e5 or (abs(v) < 1e-3 and v != 0):
        return f"{v:.2e}"
    return f"{v:.4g}"


# --- values ---------------------------------------------------------------------------------

@dataclass
class ValuesView:
    name: str
    kind: str  # table, heatmap, blocks, none
    table: list[list[str]] = field(default_factory=list)
    heat: list[list[str]] = field(default_factory=list)  # css colours
    heat_note: str = ""
    vmin: str = ""
    vmax: str = ""
    explain: dict | None = None
    row: int = 0
    block: int = 0
    nrows: int = 0
    nblocks: int = 0
    note: str = ""


def values(t: Tensor | None, where: Where) -> ValuesView | None:
    if t is None:
        return None
    name = t.name or "(unnamed)"
    if t.data is None:
        return ValuesView(name, "none", note="this tensor has no data (no_alloc, or a view of one)")
    tr = TYPE_TRAITS[t.type]
    if tr.is_quantized:
        return _blocks(t, where)
    vals = _elements(t)
    if vals is None:
        return ValuesView(name, "none", note=f"{tr.type_name} values are not shown")
    ne = [int(x) for x in t.ne]
    m = vals.reshape(-1, ne[0])  # rows of dimension 0
    if m.size <= 96:
        return ValuesView(name, "table", table=[[_fmt(x) for x in r] for r in m],
                          note=f"{m.shape[0]} row(s) of {ne[0]}: row r is element [r, :] over "
                               "dims 1..3 flattened")
    # heatmap: downsample to at most 48 x 48 cells by taking block means
    rows, cols = m.shape
    sr, sc = max(1, math.ceil(rows / 48)), max(1, math.ceil(cols / 48))
    pad_r, pad_c = (-rows) % sr, (-cols) % sc
    padded = np.pad(m, ((0, pad_r), (0, pad_c)), constant_values=np.nan)
    cells = np.nanmean(padded.reshape(-1, sr, padded.shape[1] // sc, sc), axis=(1, 3))
    finite = cells[np.isfinite(cells)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    heat = [[_colour(v, lo, hi) for v in r] for r in cells]
    note = f"{rows} x {cols} values" + (f", each cell the mean of {sr} x {sc}" if sr * sc > 1 else "")
    return ValuesView(name, "heatmap", heat=heat, heat_note=note, vmin=_fmt(lo), vmax=_fmt(hi))


def _colour(v: float, lo: float, hi: float) -> str:
    if not np.isfinite(v):
        return "#000"
    x = 0.5 if hi == lo else (v - lo) / (hi - lo)
    # blue (low) -> white -> red (high)
    if x < 0.5:
        k = int(255 * x * 2)
        return f"rgb({k},{k},255)"
    k = int(255 * (1 - x) * 2)
    return f"rgb(255,{k},{k})"


def _blocks(t: Tensor, where: Where) -> ValuesView:
    from engine.quants.explain import explain_block

    tr = TYPE_TRAITS[t.type]
    nrows = int(t.ne[1]) * int(t.ne[2]) * int(t.ne[3])
    nblocks = int(t.ne[0]) // tr.blck_size
    row = min(max(where.row, 0), nrows - 1)
    block = min(max(where.block, 0), nblocks - 1)
    ctx, off = t.ctx.space.resolve(t.data)
    i3, rest = divmod(row, int(t.ne[2]) * int(t.ne[1]))
    i2, i1 = divmod(rest, int(t.ne[1]))
    start = off + i1 * int(t.nb[1]) + i2 * int(t.nb[2]) + i3 * int(t.nb[3])
    row_bytes = ctx.pool[start:start + nblocks * tr.type_size]
    info = explain_block(t.type, row_bytes, block)
    return ValuesView(t.name or "(unnamed)", "blocks", explain=info, row=row, block=block,
                      nrows=nrows, nblocks=nblocks,
                      note=f"row {row}, block {block} of {nblocks}: {tr.type_size} bytes holding "
                           f"{tr.blck_size} values")


# --- threads --------------------------------------------------------------------------------

@dataclass
class ThreadsView:
    plan: dict | None
    node: str | None
    shares: list[dict]
    total: float


def threads(trace: Trace, step: Step) -> ThreadsView:
    plan_step = step if step.plan else (trace.steps[step.parent] if step.parent is not None
                                        and trace.steps[step.parent].plan else None)
    plan = None
    if plan_step is not None:
        n_threads, work, n_tasks = plan_step.plan
        plan = {"n_threads": n_threads, "work_size": work, "n_tasks": list(n_tasks)}
    longest = max((t.seconds for t in step.threads), default=0) or 1
    shares = [{"ith": t.ith, "kind": t.kind, "ranges": _ranges(t.kind, t.ranges),
               "us": t.seconds * 1e6, "width": 100 * t.seconds / longest, "note": t.note}
              for t in step.threads]
    return ThreadsView(plan, step.call if step.kind == "node" else None, shares, longest)


def _ranges(kind: str, ranges: tuple) -> str:
    if kind == "chunks":
        return "; ".join(f"chunk {c}: rows {a[0]}-{a[1] - 1} x cols {b[0]}-{b[1] - 1}"
                         for c, a, b in ranges) or "no chunk left"
    if not ranges:
        return "nothing"
    return ", ".join(f"[{r[0]}, {r[1]})" if isinstance(r, (tuple, list)) and len(r) == 2 else str(r)
                     for r in ranges)


# --- the DAG --------------------------------------------------------------------------------

@dataclass
class GraphView:
    dot: str  # independent of the step: the same graph shape renders (and caches) once
    highlight: list[tuple[str, str]]  # (svg node id, css class): the current and selected nodes
    layers: list[tuple[str, str, bool]]  # (layer, url to toggle it, expanded?)
    n_nodes: int
    n_leafs: int


def graph_view(state: State, where: Where, current: Tensor | None, selected: Tensor | None,
               expand: str | None = None) -> GraphView | None:
    """The graph in DOT, in ggml's colours, every tensor a link that selects it.

    Graphs of more than 60 nodes show each layer as one box: a tensor belongs to layer N when it
    is a "blk.N." weight or consumes one (the highest N among its sources). The layer holding the
    current or selected tensor is drawn in full, as is the one named by `expand`.
    """
    graphs = state.graphs()
    if not graphs:
        return None
    g = graphs[-1]
    nodes, leafs = g.nodes, g.leafs
    layer_of = _layers(nodes, leafs) if len(nodes) > 60 else {}
    open_layers = {expand} | {layer_of.get(t.address) for t in (current, selected) if t is not None}
    lines = ["digraph G {", "  newrank = true; rankdir = TB; bgcolor = transparent;",
             '  node [fontname = "DejaVu Sans Mono", fontsize = 10];',
             '  edge [fontname = "DejaVu Sans", fontsize = 8, color = "#666677"];']
    drawn: dict[int, str] = {}
    groups: dict[str, list[Tensor]] = {}
    for t in nodes + leafs:
        layer = layer_of.get(t.address)
        if layer is not None and layer not in open_layers:
            groups.setdefault(layer, []).append(t)
            drawn[t.address] = f"layer_{layer}"
        else:
            drawn[t.address] = f"t{t.address:x}"
    for i, t in enumerate(nodes):
        if drawn[t.address].startswith("t"):
            lines.append(_dot_node(t, f"{i} ", False, where))
    for i, t in enumerate(leafs):
        if drawn[t.address].startswith("t"):
            lines.append(_dot_node(t, f"CONST {i} ", True, where))
    for layer, members in groups.items():
        url = where.query(expand=layer, tensor=None)  # no step or selection: the SVG is reused
        lines.append(f'  "layer_{layer}" [id = "layer_{layer}"; shape = box3d; style = filled; '
                     f'fillcolor = "#e8eefc"; label = "layer {layer}\\n{len(members)} tensors'
                     f'\\n(click to open)"; URL = "{url}"; target = "_top"];')
    edges = set()
    for t in nodes:
        for j, src in enumerate(int(x) for x in t._r["src"][0]):  # addresses: no handles needed
            if src == 0 or src not in drawn:
                continue
            a, b = drawn[src], drawn[t.address]
            if a == b or (a, b, j) in edges:
                continue
            edges.add((a, b, j))
            lines.append(f'  "{a}" -> "{b}" [label = "src {j}"];')
    lines.append("}")
    highlight = [(f"t{t.address:x}", cls) for t, cls in ((current, "current"), (selected, "selected"))
                 if t is not None]
    layers = [(name, where.query(expand=name), name in open_layers)
              for name in sorted(set(layer_of.values()), key=int)]
    return GraphView("\n".join(lines), highlight, layers, len(nodes), len(leafs))


def _dot_node(t: Tensor, prefix: str, leaf: bool, where: Where) -> str:
    tr = TYPE_TRAITS[t.type]
    ne = [int(x) for x in t.ne]
    shape = f"[{ne[0]}, {ne[1]}]" if ne[2] == 1 and ne[3] == 1 else f"[{ne[0]}, {ne[1]}, {ne[2]}]"
    name = _dot_escape(t.name or "")
    if leaf:
        fill = "pink"
        label = f"{name} ({tr.type_name})|{prefix}{shape}"
    else:
        fill = "yellow" if t.flags & 4 else "white"
        label = f"{name} ({tr.type_name})|{prefix}{shape} | {_dot_escape(ggml_op_symbol(t.op))}"
    url = where.query(tensor=tensor_key(t))
    return (f'  "t{t.address:x}" [id = "t{t.address:x}"; shape = record; style = filled; '
            f'fillcolor = "{fill}"; label = "{label}"; URL = "{url}"; target = "_top"; '
            f'tooltip = "{name}"];')


def _dot_escape(s: str) -> str:
    out = s
    for ch in '\\"{}<>|':
        out = out.replace(ch, "\\" + ch)
    return out


def _layers(nodes: list[Tensor], leafs: list[Tensor]) -> dict[int, str]:
    """Layer of each tensor: "blk.N." weights are in layer N; a node is in the highest layer
    among its sources (nodes come in dependency order, so sources are known first)."""
    import re

    pat = re.compile(r"^blk\.(\d+)\.")
    out: dict[int, str] = {}
    for t in leafs + nodes:
        m = pat.match(t.name)
        if m:
            out[t.address] = m.group(1)
    for t in nodes:
        found = [int(out[a]) for a in (int(x) for x in t._r["src"][0]) if a in out]
        if found and t.address not in out:
            out[t.address] = str(max(found))
    return out


def render_svg(dot: str) -> str:
    """DOT -> SVG with graphviz's dot (the svg element only)."""
    import graphviz

    svg = graphviz.Source(dot).pipe(format="svg").decode()
    return svg[svg.index("<svg"):]


def selected_tensor(state: State, where: Where, step: Step) -> Tensor | None:
    """The tensor the view is about: the one in the URL, else the step's own, else the newest."""
    ref = parse_key(where.tensor) or step.tensor
    if ref is not None and ref[0] in state.contexts:
        ctx = state.contexts[ref[0]]
        if any(o.offs == ref[1] and o.type == 0 for o in ctx.objects()):
            return Tensor(ctx, ref[1])
    ts = state.tensors()
    return ts[-1] if ts else None


def current_node(state: State, step: Step) -> Tensor | None:
    if step.kind in ("node", "visit") and step.tensor is not None:
        ctx = state.contexts.get(step.tensor[0])
        if ctx is not None:
            return Tensor(ctx, step.tensor[1])
    return None

