"""The metadata panel: every key-value pair, searchable, long arrays shortened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.views.format import SHOW_CHARS, visible_text
from app.views.gguf.state import FileState, file_url, kv_url
from engine.gguf import KV, GGUFReader
from engine.gguf.format import TYPE_NAME, GGUFValueType

KV_ROWS_MAX = 500  # key-value pairs listed at once (a hostile file may hold many)
SHOW_ITEMS = 6  # elements of an array shown inline in the metadata table


def scalar_text(v: Any, vtype: GGUFValueType, limit: int = SHOW_CHARS) -> str:
    if vtype == GGUFValueType.STRING:
        return visible_text(str(v), limit)
    if vtype == GGUFValueType.BOOL:
        return "true" if v else "false"
    if vtype == GGUFValueType.FLOAT32:
        return str(np.float32(v))  # 1e-12, as the float32 prints, not 9.99999996e-13
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return str(int(v)) if isinstance(v, (int, np.integer, bool, np.bool_)) else str(v)

@dataclass(frozen=True, slots=True)
class KVRow:
    index: int
    prefix: str  # "tokenizer.ggml." (shown dimmed)
    name: str  # "tokens"
    key: str
    type: str  # "u32", "arr[str]"
    value: str
    n: int
    is_array: bool
    offset: int
    size: int
    href: str
    seg_href: str  # the pair in the byte map


@dataclass(frozen=True, slots=True)
class KVTableView:
    q: str
    rows: list[KVRow]
    n_match: int
    n_total: int
    hidden: list[tuple[str, str]]
    action: str
    clear_href: str


def type_text(kv: KV) -> str:
    return f"arr[{TYPE_NAME[kv.arr_type]}]" if kv.arr_type is not None else TYPE_NAME[kv.type]


def kv_value_text(kv: KV) -> str:
    if kv.arr_type is None:
        return scalar_text(kv.value, kv.type)
    head = kv.value[:SHOW_ITEMS]
    items = ", ".join(scalar_text(x, kv.arr_type, 24) for x in head)
    return f"[{items}{', …' if kv.n > SHOW_ITEMS else ''}]"


def kv_table_view(digest: str, r: GGUFReader, state: FileState) -> KVTableView:
    # byte-map index of each pair: the header's four items come first
    seg_of = {kv.key: 4 + kv.index for kv in r.kvs}
    q = state.q.lower()
    rows: list[KVRow] = []
    n_match = 0
    for kv in r.kvs:
        value = kv_value_text(kv)
        if q and q not in kv.key.lower() and q not in value.lower():
            continue
        n_match += 1
        if len(rows) >= KV_ROWS_MAX:
            continue
        prefix, _, name = kv.key.rpartition(".")
        rows.append(KVRow(kv.index, prefix + "." if prefix else "", name, kv.key,
                          type_text(kv), value, kv.n, kv.arr_type is not None, kv.span.offset,
                          kv.span.size, kv_url(digest, kv.key),
                          state.url(digest, seg=seg_of[kv.key])))
    return KVTableView(state.q, rows, n_match, r.n_kv,
                       state.hidden("q"), file_url(digest),
                       state.url(digest, q=""))
