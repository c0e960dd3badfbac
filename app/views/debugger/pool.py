"""The memory pool panel: each context's pool as a bar of its objects, what the step changed
outlined."""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import accumulate
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple
from threading import Lock

from cachetools import LRUCache, cached
from markupsafe import Markup, escape

from app import i18n
from app.i18n import _
from app.views.debugger.layouts import layout, layout_key
from app.views.debugger.where import Where, ref_key
from engine.core.context import GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR, OBJECT_TYPE_NAMES
from engine.core.infos import PoolTensor
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.trace import State, Step


@dataclass(frozen=True, slots=True)
class PoolView:
    ctx: int
    base: int
    mem_size: int
    used: int
    bar: Markup  # the bar's elements, one per segment (a model's pool has thousands)
    n_objects: int


def bar_weight(size: int) -> float:
    """Bar width for a byte count: sqrt scaling keeps 32-byte headers and megabytes both visible."""
    return max(math.sqrt(max(size, 1)), 3.0)


class _Piece(NamedTuple):
    """One segment of a pool's bar, the unchanging parts of its element escaped (named tuples:
    a new region of a model's pool makes thousands at once)."""

    kind: str  # header, struct, graph, data, padding, work, free
    start: int
    end: int
    tensor: str | None  # key of the tensor it belongs to
    link: str | None  # what its link opens: "struct" (the tensor) or "data" (its bytes); None: a span
    head: str  # data-start, data-size, data-label
    tail: str  # after the class: the style and title


@dataclass(frozen=True, slots=True)
class _Bar:
    """A context's bar as no step changed it: what every step with the same objects and tensor
    structs shares (its thousands of pieces made once, not once per step)."""

    pieces: tuple[_Piece, ...]
    text: str  # the pieces' elements, none outlined
    bounds: list[int]  # where each piece's element starts in text (and the last one ends)
    starts: list[int]  # each piece's start, for finding the ones a patch overlaps
    of_object: dict[int, list[int]]  # header offset -> its header, struct, graph or work piece
    of_tensor: dict[str, list[int]]  # tensor key -> its struct, data and padding pieces
    end: int
    n_objects: int


_HIT_KINDS = frozenset({"header", "struct", "data", "graph"})  # outlined when a patch writes them


def pools(state: State, step: Step, where: Where) -> list[PoolView]:
    """Each context's bar at this step: its text as no step outlines it is made once per layout
    and link query (`_bar`: its links are relative to the step's URL, so the same at every step);
    a step makes again only the elements it outlines (changed, selected)."""
    links = tuple(tuple(str(escape(x)) for x in where.tensor_link_parts(**change))
                  for change in ({}, {"hex": "data"}))
    views = []
    for cid, ctx in state.contexts.items():
        bar = _bar(state, cid, links)
        marks: set[int] = set()
        for p in step.patches:
            if p.ctx == cid:
                i = max(0, bisect_right(bar.starts, p.offset) - 1)
                while i < len(bar.starts) and bar.starts[i] < p.end:
                    piece = bar.pieces[i]
                    if piece.kind in _HIT_KINDS and piece.end > p.offset:
                        marks.add(i)
                    i += 1
        marks.update(i for o in step.objects if o.ctx == cid for i in bar.of_object.get(o.header, ()))
        selected = set(bar.of_tensor.get(where.tensor, ())) if where.tensor is not None else set()
        html, done = [], 0  # the bar's text, the outlined elements made again in their places
        for i in sorted(marks | selected):
            html += [bar.text[done:bar.bounds[i]], _element(bar.pieces[i], links, i in marks, i in selected)]
            done = bar.bounds[i + 1]
        html.append(bar.text[done:])
        views.append(PoolView(cid, ctx.base, ctx.mem_size, bar.end, Markup("".join(html)), bar.n_objects))
    return views


@cached(LRUCache(64), key=lambda state, cid, links: (layout_key(state, cid), i18n.current(), links),
        lock=Lock())  # a pool's bar is made once per layout, language and link query
def _bar(state: State, cid: int, links: tuple[tuple[str, ...], ...]) -> _Bar:
    """Context cid's bar: each object's pieces as the last layout that held the same object made
    them (`_OBJECTS`, by its header and struct bytes), so a step that adds a tensor makes the
    pieces of that tensor alone."""
    ctx, lay = state.contexts[cid], layout(state, cid)
    made_of = (cid, i18n.current(), links)
    with _OBJECTS_LOCK:
        if len(_OBJECTS) > _OBJECTS_MOST:
            _OBJECTS.clear()
    infos: dict[int, PoolTensor] = {}
    pieces: list[_Piece] = []
    plain: list[str] = []
    of_object: dict[int, list[int]] = {}
    of_tensor: dict[str, list[int]] = {}
    end = 0
    for (header, offs, size, type_, _next), row in zip(lay.objects, lay.rows):
        made = _OBJECTS.get((made_of, header, row))
        if made is None:
            if type_ == GGML_OBJECT_TYPE_TENSOR and not infos:
                infos = {t.offs: t for t in state.tensor_infos(cid)}
            made = _OBJECTS[(made_of, header, row)] = _of_object(
                cid, header, offs, size, type_, infos[offs] if type_ == GGML_OBJECT_TYPE_TENSOR else None, links)
        n = len(pieces)
        of_object[header] = [n, n + 1]  # its header and its struct, graph or work buffer
        if made.tensor is not None:
            of_tensor[made.tensor] = list(range(n + 1, n + len(made.pieces)))
        pieces += made.pieces
        plain += made.plain
        end = offs + size
    if ctx.mem_size > end:
        said = _said(i18n.current())
        free = _piece("free", end, ctx.mem_size - end, said.free, None, None, said.tip)
        pieces.append(free)
        plain.append(_element(free, links, False, False))
    return _Bar(tuple(pieces), "".join(plain), list(accumulate(map(len, plain), initial=0)),
                [p.start for p in pieces], of_object, of_tensor, end, len(lay.objects))


class _Made(NamedTuple):
    """One object's pieces and their plain elements."""

    pieces: tuple[_Piece, ...]
    plain: tuple[str, ...]
    tensor: str | None  # the key of the tensor it holds


# the objects of every layout seen, by (context, language, link query), header offset and bytes
# (object_rows): a layout that adds a tensor to one seen before makes that tensor's alone
_OBJECTS: dict[tuple[tuple, int, bytes], _Made] = {}
_OBJECTS_MOST = 1 << 15  # then it starts again
_OBJECTS_LOCK = Lock()


def _of_object(cid: int, header: int, offs: int, size: int, type_: int, info: PoolTensor | None,
               links: tuple[tuple[str, ...], ...]) -> _Made:
    """The pieces of the object whose header is at `header`: its header, then its tensor struct
    (with the tensor's data and padding when they follow it), graph or work buffer."""
    said = _said(i18n.current())
    # (kind, offset, size, title, tensor key, what its link shows)
    segs: list[tuple[str, int, int, str, str | None, str | None]] = [
        ("header", header, GGML_OBJECT_SIZE, said.header[type_] if type_ in said.header else
         said.header_of.format(type=type_), None, None)]
    key = None
    if info is not None:
        key = ref_key(cid, offs)
        segs.append(("struct", offs, GGML_TENSOR_SIZE, said.struct.format(name=info.name) if info.name
                     else said.unnamed, key, "struct"))
        inline = size - GGML_TENSOR_SIZE
        if inline > 0:
            nbytes = info.nbytes if not info.is_view and info.data else 0
            start = offs + GGML_TENSOR_SIZE
            if nbytes:
                segs.append(("data", start, nbytes, said.data.format(name=info.name), key, "data"))
            if inline - nbytes > 0:
                segs.append(("padding", start + nbytes, inline - nbytes, said.padding, key, "struct"))
    elif type_ == GGML_OBJECT_TYPE_GRAPH:
        segs.append(("graph", offs, size, said.graph, None, None))
    else:
        segs.append(("work", offs, size, said.work, None, None))
    pieces = tuple(_piece(*seg, said.tip) for seg in segs)
    return _Made(pieces, tuple(_element(p, links, False, False) for p in pieces), key)


@dataclass(frozen=True, slots=True)
class _Said:
    """The bar's labels in one language."""

    header: dict[int, str]  # by object type
    header_of: str
    struct: str
    unnamed: str
    data: str
    padding: str
    graph: str
    work: str
    free: str
    tip: str


@cache
def _said(lang: str) -> _Said:
    """The bar's labels in the language `lang` (the current one)."""
    header = _("ggml_object header ({type})")
    return _Said({t: header.format(type=name) for t, name in OBJECT_TYPE_NAMES.items()}, header,
                 _("tensor '{name}' struct"), _("tensor struct"), _("data of '{name}'"), _("padding to 16 bytes"),
                 _("ggml_cgraph: struct, nodes, leafs, use counts, hash keys, bitset"), _("work buffer"),
                 _("unused"), _("%(label)s: offset %(start)s, %(size)s bytes"))


def _piece(kind: str, start: int, size: int, label: str, key: str | None, link: str | None, tip: str) -> _Piece:
    """A segment's piece: its width a flex weight of its own size, so it reads nothing of the
    rest of the bar (`tip`: its title's text, translated)."""
    title = tip % {"label": label, "start": f"{start:#x}", "size": size}
    return _Piece(kind, start, start + size, key, link,
                  f'data-start="{start}" data-size="{size}" data-label="{escape(label)}"',
                  f'" style="flex:{bar_weight(size):.2f} 1 0" title="{escape(title)}"')


def _element(p: _Piece, links: tuple[tuple[str, ...], ...], changed: bool, selected: bool) -> str:
    """A piece's element: a link to its tensor (its struct, or its data in the Bytes panel: the
    prefix and suffix of each link's URL, escaped), or a plain span."""
    cls = f"seg seg-{p.kind}" + (" changed" if changed else "") + (" selected" if selected else "")
    if p.link is None:
        return f'<span role="listitem" {p.head} class="{cls}{p.tail}></span>'
    prefix, suffix = links[p.link == "data"]
    return f'<a role="listitem" href="{prefix}{p.tensor}{suffix}" {p.head} class="{cls}{p.tail}></a>'
