"""One key's value, paged: long arrays (a vocabulary's parallel arrays side by side).

A page's items are decoded from the file and nothing else: an array of millions of items costs a
request its page, and a search reads the array a chunk at a time (at most SEARCH_MAX items),
keeping only the page's matches.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from app.i18n import _
from app.views.format import visible_text
from app.views.gguf.kv_table import scalar_text, type_text
from app.views.gguf.state import kv_url
from engine.gguf import KV, GGUFReader, StringArray
from engine.gguf.format import TokenType

ARRAY_PAGE = 100  # elements of a long array per page
SEARCH_MAX = 1 << 20  # items a search reads at most (a vocabulary has some 10**5)
SEARCH_CHUNK = 4096  # items decoded at once while searching

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
class ArrayPageLink:
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
    links: list[ArrayPageLink]
    prev_href: str | None
    next_href: str | None
    index_label: str  # "token id" or "index"
    action: str
    note: str
    searched: int  # items a search read: all of them, or the first SEARCH_MAX


def _page_links(page: int, pages: int, href) -> list[ArrayPageLink]:
    want = sorted({1, 2, pages - 1, pages, page - 2, page - 1, page, page + 1, page + 2})
    out, last = [], 0
    for p in want:
        if not 1 <= p <= pages:
            continue
        if p > last + 1:
            out.append(ArrayPageLink("…", None))
        out.append(ArrayPageLink(str(p), None if p == page else href(p)))
        last = p
    return out


# a vocabulary is three parallel arrays: shown side by side, whichever one is opened
TOKEN_ARRAYS = (("tokenizer.ggml.tokens", "token"), ("tokenizer.ggml.scores", "score"),
                ("tokenizer.ggml.token_type", "type"))


def _texts(kv: KV, start: int, stop: int) -> list[str]:
    """Items [start, stop) of kv's value (a scalar is item 0) as the page shows them, each
    decoded from the file."""
    if kv.arr_type is None:
        items = [kv.value][start:stop]
    else:
        items = kv.value[start:stop]  # (a view of the mapped file, or strings decoded one by one)
    if isinstance(kv.value, StringArray):
        texts = [visible_text(t, 200) for t in items]
    elif isinstance(items, np.ndarray) and items.dtype.kind in "iu":
        texts = [str(v) for v in items.tolist()]
    else:
        texts = [scalar_text(v, kv.value_type, 4000) for v in items]
    if kv.key == "tokenizer.ggml.token_type":
        texts = [f"{t} ({TokenType.label(int(t))})" for t in texts]
    return texts


@dataclass(frozen=True, slots=True)
class Found:
    """What a search found: how many items match, and the matches of the page asked for (the
    last page's when it asked past the end)."""

    n_match: int
    shown: list[int]  # indices of the page's matches
    page: int
    searched: int  # items read: all of them, or the first SEARCH_MAX


def _search(sibs: list[KV], n: int, q: str, page: int) -> Found:
    """The items of which any column contains q (any case), a chunk at a time."""
    needle = q.lower()
    first = (page - 1) * ARRAY_PAGE
    count, shown = 0, []
    last: deque[int] = deque(maxlen=ARRAY_PAGE)  # the matches ending the list
    searched = min(n, SEARCH_MAX)
    for start in range(0, searched, SEARCH_CHUNK):
        stop = min(start + SEARCH_CHUNK, searched)
        columns = [_texts(s, start, stop) for s in sibs]
        for k in range(stop - start):
            if any(needle in c[k].lower() for c in columns):
                if first <= count < first + ARRAY_PAGE:
                    shown.append(start + k)
                last.append(start + k)
                count += 1
    pages = max(1, math.ceil(count / ARRAY_PAGE))
    if page > pages:  # past the end: the last page
        shown = list(last)[len(last) - (count - (pages - 1) * ARRAY_PAGE):] if count else []
    return Found(count, shown, min(page, pages), searched)


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
    n = kv.n if kv.arr_type is not None else 1
    page = max(page, 1)
    if q:
        found = _search([s for s, _ in sibs], n, q, page)
    else:
        pages = max(1, math.ceil(n / ARRAY_PAGE))
        page = min(page, pages)
        found = Found(n, list(range((page - 1) * ARRAY_PAGE, min(page * ARRAY_PAGE, n))), page, n)
    page, pages = found.page, max(1, math.ceil(found.n_match / ARRAY_PAGE))
    cells = [[t[0] for t in (_texts(s, i, i + 1) for s, _ in sibs)] for i in found.shown]
    rows = [ArrayRow(i, c) for i, c in zip(found.shown, cells)]

    def href(p: int) -> str:
        return kv_url(digest, kv.key, page=p, q=q)

    note = ""
    if kv.key in keys:
        note = _("A vocabulary is stored as parallel arrays: entry i of each belongs to token id i, the number "
                 "the model sees. They are shown side by side; '▁' marks a leading space in SentencePiece "
                 "vocabularies.")
    return ArrayView(digest, visible_text(str(r.get("general.name") or _("GGUF file")), 80), kv.key,
                     type_text(kv), kv.n, kv.arr_type is not None, kv.span.offset,
                     kv.span.size, q, columns, rows, found.n_match, page, pages,
                     (page - 1) * ARRAY_PAGE + 1 if rows else 0, _page_links(page, pages, href),
                     href(page - 1) if page > 1 else None,
                     href(page + 1) if page < pages else None,
                     _("token id") if kv.key in keys else _("index"), kv_url(digest, kv.key), note,
                     found.searched)
