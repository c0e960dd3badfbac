"""The strides panel: ne and nb explained, each element's byte offset, a view's window in its
parent, a quantized row as its blocks."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape

from app.i18n import _
from app.views.debugger.values import element_view, unreadable
from app.views.format import fmt_short
from engine.compute.kernels.common import to_f32
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nelements
from engine.core.types import TYPE_TRAITS

GRID_ROWS, GRID_COLS = 8, 12  # elements shown of a 2-d slice
WINDOW_BYTES = 512  # bytes of a view's parent drawn at most
TOUCHED_MAX = 4096  # elements of a view whose bytes are marked in the window, at most


@dataclass(frozen=True, slots=True)
class BlockSpan:
    index: int
    offset: int  # from the row's start
    size: int
    elements: str  # "32..63"


@dataclass(frozen=True, slots=True)
class ParentWindow:
    """A view's bytes inside its parent's data."""

    cells: Markup  # a span per byte of the parent's data, "in" where the view reads it
    note: str


@dataclass(frozen=True, slots=True)
class StridesView:
    name: str
    type: str
    ne: list[int]
    nb: list[int]
    explain: list[str]
    grid: list[Markup]  # one 2-d slice: rows i1 (each its cells), columns i0
    grid_note: str
    parent: ParentWindow | None
    blocks: list[BlockSpan] | None  # quantized: one row as its blocks
    error: str = ""  # why the elements' values are not shown: bytes outside the tensor's memory


def strides(t: Tensor | None) -> StridesView | None:
    if t is None:
        return None
    tr = TYPE_TRAITS[t.type]
    ne, nb = [int(x) for x in t.ne], [int(x) for x in t.nb]
    explain = [f"nb[0] = {nb[0]}: " + (_("bytes per element of {type}").format(type=tr.type_name)
                                        if tr.blck_size == 1 else
                                        _("bytes per block of {n} elements").format(n=tr.blck_size))]
    for i in range(1, 4):
        if ne[i] > 1 or i == 1:
            explain.append(f"nb[{i}] = {nb[i]}: " + (
                _("step {i} in dimension {i} (= {k} x nb[{j}])").format(i=i, k=nb[i] // nb[i - 1], j=i - 1)
                if nb[i - 1] and nb[i] % nb[i - 1] == 0 else
                _("bytes from one index of dimension {i} to the next").format(i=i)))
    if not ggml_is_contiguous(t):
        explain.append(_("not contiguous: the strides are not in packed order, so elements that are "
                         "neighbours here are not neighbours in memory"))
    grid, note, blocks, error = [], "", None, ""
    if tr.blck_size == 1:
        rows, cols = max(0, min(ne[1], GRID_ROWS)), max(0, min(ne[0], GRID_COLS))
        vals = None
        try:
            view = element_view(t)
            if view is not None and view.size:  # the grid's corner only: i3 = i2 = 0
                vals = to_f32(view[0, 0, :rows, :cols], t.type)
        except ValueError as e:
            error = unreadable(e)
        title = _("element %(index)s at data + %(offset)s")
        for i1 in range(rows):
            cells = []
            for i0 in range(cols):
                offset = i0 * nb[0] + i1 * nb[1]
                value = "" if vals is None else fmt_short(float(vals[i1, i0]))
                cells.append(f'<td title="{escape(title % {"index": f"[{i1}, {i0}]", "offset": offset})}">'
                             f'<span class="off">+{offset}</span>'
                             + (f'<span class="val">{escape(value)}</span>' if value else "") + "</td>")
            grid.append(Markup("".join(cells)))
        note = (_("element [i1, i0] sits at data + i0*{nb0} + i1*{nb1} bytes").format(nb0=nb[0], nb1=nb[1])
                + (_(" (first {rows} rows, {cols} columns)").format(rows=GRID_ROWS, cols=GRID_COLS)
                   if ne[1] > rows or ne[0] > cols else "")
                + (_(" for i2 = i3 = 0") if ne[2] * ne[3] > 1 else ""))
    else:
        nblocks = ne[0] // tr.blck_size
        blocks = [BlockSpan(b, b * nb[0], tr.type_size,
                            f"{b * tr.blck_size}..{(b + 1) * tr.blck_size - 1}")
                  for b in range(min(nblocks, 16))]
        note = _("row 0 holds {n} block(s) of {size} elements, {bytes} bytes each; rows are nb[1] = {nb1} "
                 "bytes apart").format(n=nblocks, size=tr.blck_size, bytes=tr.type_size, nb1=nb[1])
    parent = None
    if t.view_src is not None and t.data is not None:
        base = t.view_src
        span = ggml_nbytes(base)
        touched = _touched_bytes(t)
        every = max(1, nb[0] if tr.blck_size == 1 else 1)
        title = _("byte %(i)s")
        parent = ParentWindow(
            Markup("".join(f'<span class="wcell{" in" if i in touched else ""}" title="{escape(title % {"i": i})}">'
                           "</span>" for i in range(0, min(span, WINDOW_BYTES), every))),
            f"view_offs = {t.view_offs}: "
            + _("this view's bytes inside '{name}' ({n} bytes) are highlighted").format(name=base.name, n=span)
            + (_(" (first {n} bytes)").format(n=WINDOW_BYTES) if span > WINDOW_BYTES else ""))
    return StridesView(t.name or _("(unnamed)"), tr.type_name, ne, nb, explain, grid, note, parent,
                       blocks, error)


def _touched_bytes(t: Tensor) -> set[int]:
    """Byte offsets (relative to view_src's data) of the bytes of each element (or block) of
    view t; empty for a view of more than TOUCHED_MAX elements."""
    ne, nb = [int(x) for x in t.ne], [int(x) for x in t.nb]
    tr = TYPE_TRAITS[t.type]
    if any(n <= 0 for n in ne) or ggml_nelements(t) > TOUCHED_MAX:
        return set()
    out: set[int] = set()
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                for i0 in range(ne[0] // tr.blck_size):
                    o = t.view_offs + i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
                    out.update(range(o, o + tr.type_size))
    return out
