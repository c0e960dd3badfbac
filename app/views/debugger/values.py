"""The values panel: a small tensor as a table, a large one as a heatmap, a quantized one block
by block (engine.quants.explain)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from app.i18n import _
from app.views.debugger.where import Where
from app.views.format import fmt_short
from engine.compute.kernels.common import to_f32, view4
from engine.quants.explain import BlockExplanation, explain_block
from engine.core.infos import record_names
from engine.core.tensor import Tensor
from engine.core.types import TYPE_TRAITS

TABLE_MAX = 96  # values shown as a table at most; more become a heatmap
HEAT_CELLS = 48  # the heatmap's cells per side, at most


@dataclass(frozen=True, slots=True)
class ValuesView:
    name: str
    kind: str  # table, heatmap, blocks, none
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


def elements(t: Tensor) -> np.ndarray | None:
    """t's elements as float64 (4-d, numpy order), or None without data or for a quantized type."""
    if t.data is None or TYPE_TRAITS[t.type].is_quantized:
        return None
    try:
        return to_f32(view4(t), t.type).astype(np.float64)
    except ValueError:
        return None


def values(t: Tensor | None, where: Where) -> ValuesView | None:
    if t is None:
        return None
    name = t.name or _("(unnamed)")
    if t.data is None:
        return ValuesView(name, "none", note=_("this tensor has no data (no_alloc, or a view of one)"))
    tr = TYPE_TRAITS[t.type]
    if tr.is_quantized:
        return _blocks(t, where)
    vals = elements(t)
    if vals is None:
        return ValuesView(name, "none", note=_("{type} values are not shown").format(type=tr.type_name))
    ne = [int(x) for x in t.ne]
    m = vals.reshape(-1, ne[0])  # rows of dimension 0
    if m.size <= TABLE_MAX:
        return ValuesView(name, "table", table=[[fmt_short(x) for x in r] for r in m],
                          note=_("{rows} row(s) of {n}: row r is element [r, :] over dims 1..3 flattened").format(
                              rows=m.shape[0], n=ne[0]))
    # heatmap: downsample to at most HEAT_CELLS x HEAT_CELLS cells by taking block means
    rows, cols = m.shape
    sr, sc = max(1, math.ceil(rows / HEAT_CELLS)), max(1, math.ceil(cols / HEAT_CELLS))
    pad_r, pad_c = (-rows) % sr, (-cols) % sc
    padded = np.pad(m, ((0, pad_r), (0, pad_c)), constant_values=np.nan)
    cells = np.nanmean(padded.reshape(-1, sr, padded.shape[1] // sc, sc), axis=(1, 3))
    finite = cells[np.isfinite(cells)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    heat = [[_colour(v, lo, hi) for v in r] for r in cells]
    note = (_("{rows} x {cols} values").format(rows=rows, cols=cols)
            + (_(", each cell the mean of {r} x {c}").format(r=sr, c=sc) if sr * sc > 1 else ""))
    return ValuesView(name, "heatmap", heat=heat, heat_note=note, vmin=fmt_short(lo),
                      vmax=fmt_short(hi))


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
    nrows = int(t.ne[1]) * int(t.ne[2]) * int(t.ne[3])
    nblocks = int(t.ne[0]) // tr.blck_size
    row = min(max(where.row, 0), nrows - 1)
    block = min(max(where.block, 0), nblocks - 1)
    ctx, off = t.ctx.space.resolve(t.data)
    i3, rest = divmod(row, int(t.ne[2]) * int(t.ne[1]))
    i2, i1 = divmod(rest, int(t.ne[1]))
    start = off + i1 * int(t.nb[1]) + i2 * int(t.nb[2]) + i3 * int(t.nb[3])
    row_bytes = ctx.pool[start:start + nblocks * tr.type_size]
    return ValuesView(t.name or _("(unnamed)"), "blocks", explain=explain_block(t.type, row_bytes, block),
                      row=row, block=block, nrows=nrows, nblocks=nblocks,
                      note=_("row {row}, block {block} of {n}: {bytes} bytes holding {size} values").format(
                          row=row, block=block, n=nblocks, bytes=tr.type_size, size=tr.blck_size))


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
