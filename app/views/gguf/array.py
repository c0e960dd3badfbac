"""One key's value, paged: long arrays (a vocabulary's parallel arrays side by side)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.i18n import _
from app.views.format import visible_text
from app.views.gguf.kv_table import scalar_text, type_text
from app.views.gguf.state import kv_url
from engine.gguf import KV, GGUFReader, StringArray
from engine.gguf.format import TokenType

ARRAY_PAGE = 100  # elements of a long array per page

@dataclass(frozen=True, slots=True)
class ArrayRow:
    index: int
    cells: list[str]  # one per column


@dataclass(frozen=True, slots=True)
class ArrayColumn:
    label: str  # "token", "score", "type", or "value"
    key: str  # the key it comes from
    own: bool  # the key this page is about
    href: str  # that key's own page


@dataclass(frozen=True, slots=True)
class PageLink:
    label: str
    href: str | None  # None: the current page or a gap


@dataclass(frozen=True, slots=True)
class ArrayView:
    digest: str
    file_title: str
    key: str
    type: str
    n: int
    is_array: bool
    offset: int
    size: int
    q: str
    columns: list[ArrayColumn]
    rows: list[ArrayRow]
    n_match: int
    page: int
    pages: int
    first: int  # ordinal of the first shown match (1-based), 0 if none
    links: list[PageLink]
    prev_href: str | None
    next_href: str | None
    index_label: str  # "token id" or "index"
    action: str
    note: str


def _page_links(page: int, pages: int, href) -> list[PageLink]:
    want = sorted({1, 2, pages - 1, pages, page - 2, page - 1, page, page + 1, page + 2})
    out, last = [], 0
    for p in want:
        if not 1 <= p <= pages:
            continue
        if p > last + 1:
            out.append(PageLink("…", None))
        out.append(PageLink(str(p), None if p == page else href(p)))
        last = p
    return out


# a vocabulary is three parallel arrays: shown side by side, whichever one is opened
TOKEN_ARRAYS = (("tokenizer.ggml.tokens", "token"), ("tokenizer.ggml.scores", "score"),
                ("tokenizer.ggml.token_type", "type"))


def _array_texts(kv: KV) -> list[str]:
    values = kv.value if kv.arr_type is not None else [kv.value]
    if isinstance(values, StringArray):
        texts = [visible_text(s, 200) for s in values.tolist()]
    elif isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        texts = [str(v) for v in values.tolist()]
    else:
        texts = [scalar_text(v, kv.value_type, 4000) for v in values]
    if kv.key == "tokenizer.ggml.token_type":
        texts = [f"{t} ({TokenType.label(int(t))})" for t in texts]
    return texts


def array_view(digest: str, r: GGUFReader, kv: KV, page: int, q: str) -> ArrayView:
    q = q.strip()[:200]
    keys = [k for k, _ in TOKEN_ARRAYS]
    if kv.key in keys:
        sibs = [(r.kvs[i], label) for k, label in TOKEN_ARRAYS if (i := r.find_key(k)) >= 0]
        sibs = [(s, label) for s, label in sibs if s.arr_type is not None and s.n == kv.n]
    else:
        sibs = [(kv, "value")]
    columns = [ArrayColumn(label, s.key, s.key == kv.key, kv_url(digest, s.key, page, q))
               for s, label in sibs]
    texts = [_array_texts(s) for s, _ in sibs]
    n = len(texts[0])
    if q:
        ql = q.lower()
        match = [i for i in range(n) if any(ql in t[i].lower() for t in texts)]
    else:
        match = range(n)
    pages = max(1, math.ceil(len(match) / ARRAY_PAGE))
    page = min(max(page, 1), pages)
    shown = match[(page - 1) * ARRAY_PAGE: page * ARRAY_PAGE]
    rows = [ArrayRow(i, [t[i] for t in texts]) for i in shown]

    def href(p: int) -> str:
        return kv_url(digest, kv.key, page=p, q=q)

    note = ""
    if kv.key in keys:
        note = _("A vocabulary is stored as parallel arrays: entry i of each belongs to token id i, the number "
                 "the model sees. They are shown side by side; '▁' marks a leading space in SentencePiece "
                 "vocabularies.")
    return ArrayView(digest, visible_text(str(r.get("general.name") or _("GGUF file")), 80), kv.key,
                     type_text(kv), kv.n, kv.arr_type is not None, kv.span.offset,
                     kv.span.size, q, columns, rows, len(match), page, pages,
                     (page - 1) * ARRAY_PAGE + 1 if rows else 0, _page_links(page, pages, href),
                     href(page - 1) if page > 1 else None,
                     href(page + 1) if page < pages else None,
                     _("token id") if kv.key in keys else _("index"), kv_url(digest, kv.key), note)
