"""The tensors panel: every tensor of every context, in creation order, a page of PAGE rows at a
time (a model's list has thousands): by default the page holding the selected tensor; a filter
by name finds any tensor. The rows are made once per layout; a step adds only its links."""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock
from urllib.parse import parse_qsl, quote

from cachetools import LRUCache, cached

from app import i18n
from app.i18n import _
from app.views.debugger.layouts import layout_key
from app.views.debugger.where import Where, ref_key
from engine.core.infos import PoolTensor
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor
from engine.trace import State
from engine.core.types import TYPE_TRAITS

PAGE = 100  # rows a page of the list shows


@dataclass(frozen=True, slots=True)
class TensorRow:
    key: str  # "ctx.offset", the tensor's name in URLs
    name: str
    type: str
    ne: str
    op: str
    is_view: bool


@dataclass(frozen=True, slots=True)
class PageLink:
    label: str
    page: int  # 0-based
    url: str  # the step with this page of the list (without JavaScript)
    part: str  # the list alone at this page (htmx swaps it)
    current: bool


@dataclass(frozen=True, slots=True)
class TensorList:
    rows: tuple[TensorRow, ...]  # this page's rows
    first: int  # the position of the page's first row among those listed
    listed: int  # rows listed: every tensor, or those the filter finds
    total: int  # every tensor
    q: str  # the filter: a part of a name, any case ("" lists every tensor)
    selected: str | None  # the selected tensor's key
    prefix: str  # a row's link is prefix + key + suffix
    suffix: str
    pages: tuple[PageLink, ...]  # empty when one page holds every row listed
    action: str  # where the filter's form goes without JavaScript, and its hidden fields
    hidden: tuple[tuple[str, str], ...]
    part: str  # the list alone, for the filter's htmx request (the hidden fields its query)


@cached(LRUCache(64), key=lambda state, cid: (layout_key(state, cid), i18n.current()), lock=Lock())
def _rows_of(state: State, cid: int) -> tuple[TensorRow, ...]:
    """Context cid's rows, made once per layout of its pool (a step that makes a tensor makes
    again only its context's rows, and of those only the rows of tensors it has not seen)."""
    lang = i18n.current()
    if len(_ROWS) > _ROWS_MOST:
        _ROWS.clear()
    return tuple(_ROWS.get((cid, t, lang)) or _row(cid, t, lang) for t in state.tensor_infos(cid))


_ROWS: dict[tuple[int, PoolTensor, str], TensorRow] = {}  # every layout's rows, by tensor struct
_ROWS_MOST = 1 << 16  # then it starts again


def _row(cid: int, t: PoolTensor, lang: str) -> TensorRow:
    row = _ROWS[cid, t, lang] = TensorRow(ref_key(cid, t.offs), t.name or _("(unnamed)"),
                                          TYPE_TRAITS[t.type].type_name, "[" + ", ".join(str(x) for x in t.ne) + "]",
                                          GGMLOp(t.op).name, t.is_view)
    return row


def _rows(state: State) -> tuple[TensorRow, ...]:
    """Every tensor's row, in creation order within each context."""
    return tuple(r for cid in state.contexts for r in _rows_of(state, cid))


def tensor_list(state: State, where: Where, selected: Tensor | None, page: int | None = None,
                q: str = "") -> TensorList:
    """Page `page` (None: the one holding the selected tensor) of the tensors whose name contains
    q, any case."""
    rows = _rows(state)
    total = len(rows)
    q = q.strip()
    if q:
        needle = q.lower()
        rows = tuple(r for r in rows if needle in r.name.lower())
    sel = None if selected is None else ref_key(selected.ctx.id, selected.offs)
    n_pages = max(1, -(-len(rows) // PAGE))
    if page is None:
        at = next((i for i, r in enumerate(rows) if r.key == sel), 0)
        page = at // PAGE
    page = min(max(page, 0), n_pages - 1)
    prefix, suffix = where.tensor_url_parts()
    step_url = where.url()
    path = f"{where.base}/steps/{where.step}/tensors"
    part_url = (path + where.query()).rstrip("?")
    action, _sep, query = step_url.partition("?")

    def with_list(url: str, p: int) -> str:
        extra = (f"tq={quote(q)}&" if q else "") + f"tp={p}"
        return url + ("&" if "?" in url else "?") + extra

    links = () if n_pages == 1 else tuple(
        PageLink(str(p + 1), p, with_list(step_url, p), with_list(part_url, p), p == page)
        for p in range(n_pages))
    return TensorList(rows[page * PAGE:(page + 1) * PAGE], page * PAGE, len(rows), total, q, sel,
                      prefix, suffix, links, action, tuple(parse_qsl(query)), path)
