"""The memory pool panel: each context's pool as a bar of its objects, what the step changed
outlined."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from threading import Lock

from cachetools import LRUCache, cached
from markupsafe import Markup, escape

from app import i18n
from app.i18n import _
from app.views.debugger.layouts import layout_key
from app.views.debugger.where import Where, ref_key
from engine.core.context import GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR
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


def _scaled(size: int) -> float:
    """Bar width for a byte count: sqrt scaling keeps 32-byte headers and megabytes both visible."""
    return max(math.sqrt(max(size, 1)), 3.0)


@dataclass(frozen=True, slots=True)
class _Piece:
    """One segment of a pool's bar, the unchanging parts of its element escaped."""

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
    starts: list[int]  # each piece's start, for finding the ones a patch overlaps
    of_object: dict[int, list[int]]  # header offset -> its header, struct, graph or work piece
    of_tensor: dict[str, list[int]]  # tensor key -> its struct, data and padding pieces
    end: int
    n_objects: int


_HIT_KINDS = frozenset({"header", "struct", "data", "graph"})  # outlined when a patch writes them


def pools(state: State, step: Step, where: Where) -> list[PoolView]:
    """Each context's bar at this step: its elements as no step outlines them are made once per
    layout and link query (`_plain`, each link's step-dependent start a placeholder); a step
    makes again only the elements it outlines (changed, selected)."""
    parts = {kind: [escape(x) for x in where.tensor_url_parts(**change)]
             for kind, change in (("struct", {}), ("data", {"hex": "data"}))}
    suffixes = (parts["struct"][1], parts["data"][1])
    placed = {kind: [_PLACE[kind], suffix] for kind, (_prefix, suffix) in parts.items()}
    views = []
    for cid, ctx in state.contexts.items():
        bar = _bar(state, cid)
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
        selected = set(bar.of_tensor.get(where.tensor, ()))
        html = list(_plain(state, cid, bar, suffixes))
        for i in marks | selected:
            html[i] = _element(bar.pieces[i], placed, i in marks, i in selected)
        text = "".join(html)
        for kind, (prefix, _suffix) in parts.items():
            text = text.replace(_PLACE[kind], prefix)
        views.append(PoolView(cid, ctx.base, ctx.mem_size, bar.end, Markup(text), bar.n_objects))
    return views


# where a link's step-dependent start goes in elements made for every step: NUL is in no label
# (a tensor's name ends at its first NUL) and in no query (a prompt is %-escaped)
_PLACE = {"struct": "\0s", "data": "\0d"}


def _layout_key(state: State, cid: int) -> tuple:
    """What a bar is made from: the object headers and tensor structs (not the data), and the
    labels' language."""
    return (layout_key(state, cid), i18n.current())


@cached(LRUCache(64), key=lambda state, cid, bar, suffixes: (_layout_key(state, cid), suffixes), lock=Lock())
def _plain(state: State, cid: int, bar: _Bar, suffixes: tuple[str, str]) -> tuple[str, ...]:
    """The bar's elements, none outlined, each link's start a placeholder."""
    links = {"struct": [_PLACE["struct"], suffixes[0]], "data": [_PLACE["data"], suffixes[1]]}
    return tuple(_element(piece, links, False, False) for piece in bar.pieces)


@cached(LRUCache(64), key=_layout_key, lock=Lock())  # a pool's bar is made once per layout
def _bar(state: State, cid: int) -> _Bar:
    ctx = state.contexts[cid]
    header_label = _("ggml_object header ({type})")
    infos = {t.offs: t for t in state.tensor_infos(cid)}
    segs: list[tuple[str, int, int, str, str | None, str | None]] = []  # kind start size label key link
    of_object: dict[int, list[int]] = {}
    of_tensor: dict[str, list[int]] = {}
    end = n_objects = 0
    for o in ctx.objects():
        n_objects += 1
        mine = of_object.setdefault(o.header, [len(segs)])
        segs.append(("header", o.header, GGML_OBJECT_SIZE, header_label.format(type=o.type_name), None, None))
        if o.type == GGML_OBJECT_TYPE_TENSOR:
            t = infos[o.offs]
            key = ref_key(cid, t.offs)
            label = _("tensor '{name}' struct").format(name=t.name) if t.name else _("tensor struct")
            mine.append(len(segs))
            of_tensor[key] = [len(segs)]
            segs.append(("struct", o.offs, GGML_TENSOR_SIZE, label, key, "struct"))
            inline = o.size - GGML_TENSOR_SIZE
            if inline > 0:
                nbytes = t.nbytes if not t.is_view and t.data else 0
                start = o.offs + GGML_TENSOR_SIZE
                if nbytes:
                    of_tensor[key].append(len(segs))
                    segs.append(("data", start, nbytes, _("data of '{name}'").format(name=t.name), key, "data"))
                if inline - nbytes > 0:
                    of_tensor[key].append(len(segs))
                    segs.append(("padding", start + nbytes, inline - nbytes, _("padding to 16 bytes"), key,
                                 "struct"))
        elif o.type == GGML_OBJECT_TYPE_GRAPH:
            mine.append(len(segs))
            segs.append(("graph", o.offs, o.size, _("ggml_cgraph: struct, nodes, leafs, use counts, hash keys, "
                                                    "bitset"), None, None))
        else:
            mine.append(len(segs))
            segs.append(("work", o.offs, o.size, _("work buffer"), None, None))
        end = o.offs + o.size
    if ctx.mem_size > end:
        segs.append(("free", end, ctx.mem_size - end, _("unused"), None, None))
    widths = [_scaled(size) for _k, _s, size, *_r in segs]
    scale = 100 / (sum(widths) or 1)
    tip = _("%(label)s: offset %(start)s, %(size)s bytes")  # translated once, not per segment
    pieces = tuple(_Piece(kind, start, start + size, key, link, *_texts(label, start, size, tip, w * scale))
                   for (kind, start, size, label, key, link), w in zip(segs, widths))
    return _Bar(pieces, [p.start for p in pieces], of_object, of_tensor, end, n_objects)


_TEXTS: dict[tuple, tuple[str, str]] = {}  # a segment's texts, the same in every layout that holds it
_TEXTS_MOST = 1 << 17  # then it starts again


def _texts(label: str, start: int, size: int, tip: str, width: float) -> tuple[str, str]:
    """A piece's head and tail (see _Piece), its escaped label and title made once per segment."""
    said = _TEXTS.get((label, start, size, tip))
    if said is None:
        if len(_TEXTS) >= _TEXTS_MOST:
            _TEXTS.clear()
        said = _TEXTS[(label, start, size, tip)] = (
            f'data-start="{start}" data-size="{size}" data-label="{escape(label)}"',
            f'{escape(tip % {"label": label, "start": f"{start:#x}", "size": size})}"')
    return said[0], f'" style="width:{width:.3f}%" title="' + said[1]


def _element(p: _Piece, links: dict[str, list[str]], changed: bool, selected: bool) -> str:
    """A piece's element: a link to its tensor (its struct, or its data in the Bytes panel), or
    a plain span."""
    cls = f"seg seg-{p.kind}" + (" changed" if changed else "") + (" selected" if selected else "")
    if p.link is None:
        return f'<span role="listitem" {p.head} class="{cls}{p.tail}></span>'
    prefix, suffix = links[p.link]
    return f'<a role="listitem" href="{prefix}{p.tensor}{suffix}" {p.head} class="{cls}{p.tail}></a>'
