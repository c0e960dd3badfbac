"""The values panel: a small tensor as a table, a large one as a heatmap, a quantized one block
by block (engine.quants.explain)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from app.i18n import _
from app.views.debugger.repacked import plain_row
from app.views.debugger.where import Where
from app.views.format import fmt_short
from engine.compute.kernels.common import to_f32, view4
from engine.quants.explain import BlockExplanation, explain_block
from engine.core.infos import record_names
from engine.core.tensor import Tensor
from engine.core.tensor_data import tensor_view
from engine.core.types import TYPE_TRAITS

TABLE_MAX = 96  # values shown as a table at most; more become a heatmap
HEAT_CELLS = 48  # the heatmap's cells per side, at most
HEAT_ELEMENTS = 1 << 20  # elements a heatmap reads at most; a larger tensor's are picked evenly
HEAT_COLUMNS = 1024  # columns picked at most, when picking


@dataclass(frozen=True, slots=True)
class ValuesView:
    name: str
    kind: str  # table, heatmap, blocks, none, error (its memory was not read: the note says why)
    table: list[list[str]] = field(default_factory=list)
    heat: list[list[str]] = field(default_factory=list)  # css colours
    heat_note: str = ""
    vmin: str = ""
    vmax: str = ""
    explain: BlockExplanation | None = None
    row: int = 0
    block: int = 0
    nrows: int = 0
    nblocks: int = 0
    note: str = ""


def element_view(t: Tensor) -> np.ndarray | None:
    """t's elements as the kernels see them (view4: 4-d, numpy order, no copy), or None without
    data or for a quantized type; ValueError (TensorBoundsError) when its ne and nb reach bytes
    outside its memory."""
    if t.data is None or TYPE_TRAITS[t.type].is_quantized:
        return None
    return view4(t)


def unreadable(e: ValueError) -> str:
    """The panels' words for a tensor whose memory the engine refused to read."""
    return _("Its bytes are not read: {error}").format(error=e)


def values(t: Tensor | None, where: Where) -> ValuesView | None:
    if t is None:
        return None
    name = t.name or _("(unnamed)")
    if t.data is None:
        return ValuesView(name, "none", note=_("this tensor has no data (no_alloc, or a view of one)"))
    tr = TYPE_TRAITS[t.type]
    if tr.is_quantized:
        return _blocks(t, where)
    try:
        view = element_view(t)
    except ValueError as e:
        return ValuesView(name, "error", note=unreadable(e))
    if view is None:
        return ValuesView(name, "none", note=_("{type} values are not shown").format(type=tr.type_name))
    n3, n2, n1, n0 = view.shape
    rows, cols = n3 * n2 * n1, n0  # rows of dimension 0
    if rows * cols == 0:
        return ValuesView(name, "none", note=_("no elements: ne = [{ne}]").format(
            ne=", ".join(str(n) for n in reversed(view.shape))))
    if rows * cols <= TABLE_MAX:
        m = to_f32(view, t.type).astype(np.float64).reshape(rows, cols)
        return ValuesView(name, "table", table=[[fmt_short(x) for x in r] for r in m],
                          note=_("{rows} row(s) of {n}: row r is element [r, :] over dims 1..3 flattened").format(
                              rows=rows, n=cols))
    # heatmap: downsample to at most HEAT_CELLS x HEAT_CELLS cells by taking block means
    m = _heat_source(view, t.type)
    sr, sc = max(1, math.ceil(m.shape[0] / HEAT_CELLS)), max(1, math.ceil(m.shape[1] / HEAT_CELLS))
    pad_r, pad_c = (-m.shape[0]) % sr, (-m.shape[1]) % sc
    padded = np.pad(m, ((0, pad_r), (0, pad_c)), constant_values=np.nan)
    cells = np.nanmean(padded.reshape(-1, sr, padded.shape[1] // sc, sc), axis=(1, 3))
    finite = cells[np.isfinite(cells)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    heat = [[_colour(v, lo, hi) for v in r] for r in cells]
    note = (_("{rows} x {cols} values").format(rows=rows, cols=cols)
            + (_(", each cell the mean of {r} x {c}").format(r=sr, c=sc) if sr * sc > 1 else "")
            + (_(" of {rows} x {cols} picked evenly").format(rows=m.shape[0], cols=m.shape[1])
               if m.shape != (rows, cols) else ""))
    return ValuesView(name, "heatmap", heat=heat, heat_note=note, vmin=fmt_short(lo),
                      vmax=fmt_short(hi))


def _heat_source(view: np.ndarray, type_: int) -> np.ndarray:
    """The (rows, columns) a heatmap averages, as float64: dims 1..3 flattened by dim 0, every
    element; or, past HEAT_ELEMENTS, rows and columns picked evenly, so that a tensor of any ne
    (a view with nb = 0 may have 2**40 elements in 4 bytes) costs the page a bounded read."""
    n3, n2, n1, n0 = view.shape
    rows = n3 * n2 * n1
    if rows * n0 <= HEAT_ELEMENTS:
        return to_f32(view, type_).astype(np.float64).reshape(rows, n0)
    kc = min(n0, HEAT_COLUMNS)
    kr = min(rows, HEAT_ELEMENTS // kc)
    r = np.array([i * rows // kr for i in range(kr)], dtype=np.int64)
    c = np.array([i * n0 // kc for i in range(kc)], dtype=np.int64)
    i3, i2, i1 = np.unravel_index(r, (n3, n2, n1))
    return to_f32(view[i3[:, None], i2[:, None], i1[:, None], c[None, :]], type_).astype(np.float64)


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
    tr = TYPE_TRAITS[t.type]
    name = t.name or _("(unnamed)")
    nrows = int(t.ne[1]) * int(t.ne[2]) * int(t.ne[3])
    nblocks = int(t.ne[0]) // tr.blck_size
    if nrows <= 0 or nblocks <= 0:
        return ValuesView(name, "none", note=_("no elements: ne = [{ne}]").format(
            ne=", ".join(str(int(n)) for n in t.ne)))
    row = min(max(where.row, 0), nrows - 1)
    block = min(max(where.block, 0), nblocks - 1)
    i3, rest = divmod(row, int(t.ne[2]) * int(t.ne[1]))
    i2, i1 = divmod(rest, int(t.ne[1]))
    plain = plain_row(t, row)  # a weight in CPU_REPACK: read back through the layout's unpack
    try:
        row_bytes = plain if plain is not None else tensor_view(
            t, (nblocks * tr.type_size,), (1,), np.uint8,
            i1 * int(t.nb[1]) + i2 * int(t.nb[2]) + i3 * int(t.nb[3]), "values")
    except ValueError as e:
        return ValuesView(name, "error", note=unreadable(e))
    note = _("row {row}, block {block} of {n}: {bytes} bytes holding {size} values").format(
        row=row, block=block, n=nblocks, bytes=tr.type_size, size=tr.blck_size)
    if plain is not None:
        note += _(" (read back from the CPU_REPACK buffer's interleaved blocks)")
    return ValuesView(name, "blocks", explain=explain_block(t.type, row_bytes, block),
                      row=row, block=block, nrows=nrows, nblocks=nblocks, note=note)


def gradient_of(state, t: Tensor | None) -> Tensor | None:
    """The gradient ggml computed for t, if one has data: the node ggml names "grad for <name>"
    in the newest graph holding one (ggml-opt computes a copy of its graph, so the gradient is
    found by the name ggml_build_backward_expand gives it)."""
    if t is None or not t.name:
        return None
    wanted = f"grad for {t.name}"[:63]
    for g in reversed(state.graphs()):
        addresses, recs = state.graph_tensors(g)
        for address, name in zip(addresses[:g.n_nodes].tolist(), record_names(recs[:g.n_nodes])):
            if name == wanted and (node := g.tensor(address)).data is not None:
                return node
    return None
