"""The tensors panel: every tensor info, sortable, filterable, grouped by layer."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import N_, _
from app.views.format import human_bytes, shape_text
from app.views.gguf.state import FileState, file_url, tensor_url
from engine.core.infos import layer_of
from engine.gguf import GGUFReader, TensorInfo

TENSOR_ROWS_MAX = 2000


def bpw(nbytes: int, n: int) -> float | None:
    """Bits per weight."""
    return nbytes * 8 / n if n else None


def fmt_bpw(nbytes: int, n: int) -> str:
    v = bpw(nbytes, n)
    return "—" if v is None else f"{v:.2f}"


def layer_name(name: str) -> str:
    """"blk.N" for a layer's tensor, "" for the others."""
    n = layer_of(name)
    return "" if n is None else f"blk.{n}"

@dataclass(frozen=True, slots=True)
class GGUFTensorRow:
    index: int
    name: str
    type: str
    shape: str
    n_elements: int
    data_offset: int
    nbytes: int
    size_text: str
    bpw: str
    href: str


@dataclass(frozen=True, slots=True)
class TensorGroup:
    label: str  # "blk.0", "(not in a layer)", or "" when not grouped
    rows: list[GGUFTensorRow]
    n_elements: int
    nbytes: int
    size_text: str
    bpw: str


@dataclass(frozen=True, slots=True)
class SortLink:
    key: str
    label: str
    href: str
    arrow: str  # "▲", "▼" or ""
    aria_sort: str  # "ascending", "descending" or "none"
    numeric: bool


@dataclass(frozen=True, slots=True)
class TensorTableView:
    filter: str
    group: str
    columns: list[SortLink]
    groups: list[TensorGroup]
    n_match: int
    n_total: int
    n_shown: int
    type_counts: str  # "64 × F32, 37 × Q8_0"
    hidden: list[tuple[str, str]]
    action: str
    clear_href: str


_SORT_KEY = {
    "index": lambda t: t.index, "name": lambda t: t.name, "type": lambda t: t.type.name,
    "shape": lambda t: t.ne[::-1], "elements": lambda t: t.n_elements,
    "offset": lambda t: t.data_offset, "size": lambda t: t.nbytes,
    "bpw": lambda t: bpw(t.nbytes, t.n_elements) or 0.0,
}
_COLUMNS = [("index", "#", True), ("name", N_("name"), False), ("type", N_("type"), False),
            ("shape", N_("shape (ne)"), False), ("elements", N_("elements"), True),
            ("offset", N_("data at byte"), True), ("size", N_("size"), True), ("bpw", N_("bits/weight"), True)]

def tensor_table_view(digest: str, r: GGUFReader, state: FileState) -> TensorTableView:
    f = state.filter.lower()
    match = [t for t in r.tensors if not f or f in t.name.lower() or f in t.type.name.lower()]
    match.sort(key=_SORT_KEY[state.sort], reverse=state.order == "desc")
    shown = match[:TENSOR_ROWS_MAX]
    groups: dict[str, list[TensorInfo]] = {}
    for t in shown:
        groups.setdefault(layer_name(t.name) if state.group == "layer" else "", []).append(t)
    order = sorted(groups, key=lambda k: (k == "", int(k[4:]) if k else 0))
    out = []
    for label in order:
        ts = groups[label]
        rows = [GGUFTensorRow(t.index, t.name, t.type.name, shape_text(t.shape), t.n_elements,
                              t.data_offset, t.nbytes, human_bytes(t.nbytes),
                              fmt_bpw(t.nbytes, t.n_elements), tensor_url(digest, t.name))
                for t in ts]
        n_el, nbytes = sum(t.n_elements for t in ts), sum(t.nbytes for t in ts)
        shown_label = label or (_("(not in a layer)") if state.group == "layer" else "")
        out.append(TensorGroup(shown_label, rows, n_el, nbytes, human_bytes(nbytes),
                               fmt_bpw(nbytes, n_el)))
    columns = []
    for key, label, numeric in _COLUMNS:
        active = state.sort == key
        flip = "desc" if active and state.order == "asc" else "asc"
        columns.append(SortLink(key, _(label) if label != "#" else label, state.url(digest, sort=key, order=flip),
                                ("▲" if state.order == "asc" else "▼") if active else "",
                                ("ascending" if state.order == "asc" else "descending")
                                if active else "none", numeric))
    counts: dict[str, int] = {}
    for t in r.tensors:
        counts[t.type.name] = counts.get(t.type.name, 0) + 1
    return TensorTableView(state.filter, state.group, columns,
                           out, len(match), r.n_tensors, len(shown),
                           ", ".join(f"{n} × {k}" for k, n in sorted(counts.items())),
                           state.hidden("filter", "group"), file_url(digest),
                           state.url(digest, filter=""))
