"""The memory pool panel: each context's pool as a bar of its objects, what the step changed
outlined."""

from __future__ import annotations

import math
from dataclasses import dataclass

from markupsafe import Markup, escape

from app.i18n import _
from app.views.debugger.where import Where, ref_key
from engine.context import GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR
from engine.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.trace import State, Step


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
    tip: str = ""  # the label with offset and size, as its title shows it
    attrs: Markup = Markup()  # the memory pool's element attributes, escaped (it has thousands)


@dataclass(frozen=True, slots=True)
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


def pools(state: State, step: Step, where: Where) -> list[PoolView]:
    changed = [(p.ctx, p.offset, p.end) for p in step.patches]
    added = {(o.ctx, o.header) for o in step.objects}
    struct_url, data_url = where.tensor_url(), where.tensor_url(hex="data")
    header_label = _("ggml_object header ({type})")
    views = []
    for cid, ctx in state.contexts.items():
        segs: list[Segment] = []
        mine = [(s_, e_) for c, s_, e_ in changed if c == cid]

        def hit(a: int, b: int) -> bool:
            return any(s_ < b and e_ > a for s_, e_ in mine)

        objs = list(ctx.objects())
        infos = {t.offs: t for t in state.tensor_infos(cid)}
        end = 0
        for o in objs:
            new = (cid, o.header) in added
            segs.append(Segment("header", o.header, GGML_OBJECT_SIZE, 0,
                                header_label.format(type=o.type_name),
                                new or (bool(mine) and hit(o.header, o.offs))))
            if o.type == GGML_OBJECT_TYPE_TENSOR:
                t = infos[o.offs]
                key = ref_key(cid, t.offs)
                url = struct_url(key)
                label = _("tensor '{name}' struct").format(name=t.name) if t.name else _("tensor struct")
                segs.append(Segment("struct", o.offs, GGML_TENSOR_SIZE, 0, label,
                                    new or (bool(mine) and hit(o.offs, o.offs + GGML_TENSOR_SIZE)), key, url))
                inline = o.size - GGML_TENSOR_SIZE
                if inline > 0:
                    nbytes = t.nbytes if not t.is_view and t.data else 0
                    start = o.offs + GGML_TENSOR_SIZE
                    if nbytes:
                        segs.append(Segment("data", start, nbytes, 0,
                                            _("data of '{name}'").format(name=t.name),
                                            bool(mine) and hit(start, start + nbytes), key, data_url(key)))
                    if inline - nbytes > 0:
                        segs.append(Segment("padding", start + nbytes, inline - nbytes, 0,
                                            _("padding to 16 bytes"), False, key, url))
            elif o.type == GGML_OBJECT_TYPE_GRAPH:
                segs.append(Segment("graph", o.offs, o.size, 0, _("ggml_cgraph: struct, nodes, "
                                                               "leafs, use counts, hash keys, bitset"),
                                    new or hit(o.offs, o.offs + o.size)))
            else:
                segs.append(Segment("work", o.offs, o.size, 0, _("work buffer"), new))
            end = o.offs + o.size
        if ctx.mem_size > end:
            segs.append(Segment("free", end, ctx.mem_size - end, 0, _("unused"), False))
        total = sum(_scaled(s.size) for s in segs) or 1
        tip = _("%(label)s: offset %(start)s, %(size)s bytes")  # translated once, not per segment
        for s in segs:
            label = escape(s.label)
            cls = f"seg seg-{s.kind}" + (" changed" if s.changed else "") + \
                (" selected" if s.url and s.tensor == where.tensor else "")
            s.width = 100 * _scaled(s.size) / total
            s.tip = tip % {"label": s.label, "start": f"{s.start:#x}", "size": s.size}
            href = f'href="{escape(s.url)}" ' if s.url else ""
            s.attrs = Markup(f'{href}data-start="{s.start}" data-size="{s.size}" data-label="{label}" '
                             f'class="{cls}" style="width:{s.width:.3f}%" title="{escape(s.tip)}"')
        views.append(PoolView(cid, ctx.base, ctx.mem_size, end, segs, len(objs)))
    return views
