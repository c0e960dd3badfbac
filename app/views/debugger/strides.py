"""The strides panel: ne and nb explained, each element's byte offset, a view's window in its
parent, a quantized row as its blocks."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.debugger.values import elements
from app.views.format import fmt_short
from engine.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nelements
from engine.types import TYPE_TRAITS

GRID_ROWS, GRID_COLS = 8, 12  # elements shown of a 2-d slice
WINDOW_BYTES = 512  # bytes of a view's parent drawn at most
TOUCHED_MAX = 4096  # elements of a view whose bytes are marked in the window, at most


@dataclass(frozen=True, slots=True)
class StrideCell:
    index: str  # "[i1, i0]"
    offset: int  # byte offset from the view's data pointer
    value: str


@dataclass(frozen=True, slots=True)
class BlockSpan:
    index: int
    offset: int  # from the row's start
    size: int
    elements: str  # "32..63"


@dataclass(frozen=True, slots=True)
class WindowCell:
    i: int  # byte of the parent's data
    inside: bool  # the view reads it


@dataclass(frozen=True, slots=True)
class ParentWindow:
    """A view's bytes inside its parent's data."""

    cells: list[WindowCell]
    note: str


@dataclass(frozen=True, slots=True)
class StridesView:
    name: str
    type: str
    ne: list[int]
    nb: list[int]
    explain: list[str]
    grid: list[list[StrideCell]]  # one 2-d slice: rows i1, columns i0
    grid_note: str
    parent: ParentWindow | None
    blocks: list[BlockSpan] | None  # quantized: one row as its blocks


def strides(t: Tensor | None) -> StridesView | None:
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
        rows, cols = min(ne[1], GRID_ROWS), min(ne[0], GRID_COLS)
        vals = elements(t)
        for i1 in range(rows):
            grid.append([StrideCell(f"[{i1}, {i0}]", i0 * nb[0] + i1 * nb[1],
                                    "" if vals is None else fmt_short(vals[0, 0, i1, i0]))
                         for i0 in range(cols)])
        note = (f"element [i1, i0] sits at data + i0*{nb[0]} + i1*{nb[1]} bytes"
                + (f" (first {GRID_ROWS} rows, {GRID_COLS} columns)"
                   if ne[1] > rows or ne[0] > cols else "")
                + (" for i2 = i3 = 0" if ne[2] * ne[3] > 1 else ""))
    else:
        nblocks = ne[0] // tr.blck_size
        blocks = [BlockSpan(b, b * nb[0], tr.type_size,
                            f"{b * tr.blck_size}..{(b + 1) * tr.blck_size - 1}")
                  for b in range(min(nblocks, 16))]
        note = (f"row 0 holds {nblocks} block(s) of {tr.blck_size} elements, {tr.type_size} bytes "
                f"each; rows are nb[1] = {nb[1]} bytes apart")
    parent = None
    if t.view_src is not None and t.data is not None:
        base = t.view_src
        span = ggml_nbytes(base)
        touched = _touched_bytes(t)
        every = max(1, nb[0] if tr.blck_size == 1 else 1)
        parent = ParentWindow(
            [WindowCell(i, i in touched) for i in range(0, min(span, WINDOW_BYTES), every)],
            f"view_offs = {t.view_offs}: this view's bytes inside '{base.name}' ({span} bytes) "
            "are highlighted" + (f" (first {WINDOW_BYTES} bytes)" if span > WINDOW_BYTES else ""))
    return StridesView(t.name or "(unnamed)", tr.type_name, ne, nb, explain, grid, note, parent,
                       blocks)


def _touched_bytes(t: Tensor) -> set[int]:
    """Byte offsets (relative to view_src's data) of the bytes of each element (or block) of
    view t; empty for a view of more than TOUCHED_MAX elements."""
    ne, nb = [int(x) for x in t.ne], [int(x) for x in t.nb]
    tr = TYPE_TRAITS[t.type]
    if ggml_nelements(t) > TOUCHED_MAX:
        return set()
    out = set()
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                for i0 in range(ne[0] // tr.blck_size):
                    o = t.view_offs + i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
                    out.update(range(o, o + tr.type_size))
    return out
