"""The struct panel: the selected tensor as gdb prints `p *t`, its pointers as links."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _
from app.views.debugger.where import Where, tensor_key
from engine.ggml import format_tensor
from engine.core.tensor import Tensor


@dataclass(frozen=True, slots=True)
class Link:
    field: str  # "src[0]", "view_src"
    name: str  # the tensor it points to
    url: str


@dataclass(frozen=True, slots=True)
class StructView:
    title: str
    gdb: str
    links: list[Link]


def struct(t: Tensor | None, where: Where) -> StructView | None:
    if t is None:
        return None
    links = [Link(f"src[{i}]", s.name or _("(unnamed)"), where.url(tensor=tensor_key(s)))
             for i, s in enumerate(t.src) if s is not None]
    if t.view_src is not None:
        links.append(Link("view_src", t.view_src.name or _("(unnamed)"),
                          where.url(tensor=tensor_key(t.view_src))))
    return StructView(f"p *{t.name or 'tensor'}", "$1 = " + format_tensor(t), links)
