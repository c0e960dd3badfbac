"""The byte map panel: the file as a bar of its regions, the selected region item by item, and
the selected item's bytes decoded field by field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from app.i18n import N_, _
from app.views.format import human_bytes, visible_text
from app.views.gguf.kv_table import kv_value_text
from app.views.gguf.state import FileState, kv_url, tensor_url
from engine.gguf import GGUFReader, Span
from engine.gguf.format import TYPE_NAME, GGUFValueType

ZOOM_ITEMS_MAX = 400  # items drawn in the byte map's zoomed bar

_REGION_OF = {"magic": "header", "version": "header", "n_tensors": "header", "n_kv": "header",
              "kv": "kv", "tensor_info": "tensor_info", "padding": "padding",
              "tensor_data": "tensor_data", "tensor_padding": "tensor_data",
              "trailing": "trailing"}
_REGION_LABEL = {"header": N_("header"), "kv": N_("metadata"), "tensor_info": N_("tensor infos"),
                 "padding": N_("padding"), "tensor_data": N_("tensor data"), "trailing": N_("trailing bytes")}

EXPLAIN = {
    "magic": N_("The four bytes 'GGUF' (47 47 55 46) that mark a GGUF file."),
    "version": N_("The format version, a uint32. ggml reads versions 2 and 3 and writes 3."),
    "n_tensors": N_("How many tensor infos follow the key-value pairs (int64)."),
    "n_kv": N_("How many key-value pairs follow the header (int64)."),
    "kv": N_("One metadata pair: the key (a uint64 length, then UTF-8 bytes), its gguf_type (int32); "
          "for an array the element type (int32) and count (uint64); then the value itself."),
    "tensor_info": N_("One tensor's description: its name, n_dims, ne[0..n_dims) (int64 each, "
                   "fastest dimension first), its ggml_type (int32) and the offset of its data "
                   "from the start of the data section (uint64). No values are stored here."),
    "padding": N_("Zero bytes up to the next multiple of the alignment, so the data section starts "
               "aligned (ggml can then map tensor data straight from the file)."),
    "tensor_data": N_("A tensor's values, exactly as ggml holds them in memory: rows of ne[0] "
                   "elements; for a quantized type, rows of blocks (scale(s) then packed quants)."),
    "tensor_padding": N_("Padding after a tensor's data so that the next tensor starts aligned."),
    "trailing": N_("Bytes after the end of the data section; ggml ignores them."),
}


def _decoded_fields(r: GGUFReader, s: Span) -> list[tuple[str, str]]:
    """(what the part is, what it decodes to) for each child of a kv pair or tensor info."""
    out = []
    if s.kind == "kv":
        kv = r.kvs[r.find_key(s.label)]
        for c in s.children:
            out.append({
                "key": (_("uint64 length, then the key's UTF-8 bytes"), repr(visible_text(kv.key))),
                "type": (_("int32 gguf_type"), f"{int(kv.type)} = {TYPE_NAME[kv.type]}"),
                "arr_type": (_("int32 gguf_type of each element"),
                             f"{int(kv.value_type)} = {TYPE_NAME[kv.value_type]}"),
                "arr_n": (_("uint64 element count"), f"{kv.n:,}"),
                "value": (_("the value (strings: uint64 length + bytes each)")
                          if kv.value_type == GGUFValueType.STRING else _("the value"),
                          visible_text(kv_value_text(kv), 60)),
            }.get(c.kind, ("", "")))
    elif s.kind == "tensor_info":
        t = r.tensors[r.find_tensor(s.label)]
        for c in s.children:
            if c.kind == "ne":
                j = int(c.label[3:-1])
                out.append((_("int64 elements in dimension {j}").format(j=j), f"{t.ne[j]:,}"))
                continue
            out.append({
                "name": (_("uint64 length, then the name's UTF-8 bytes"), repr(t.name)),
                "n_dims": (_("uint32 number of dimensions"), str(t.n_dims)),
                "type": (_("int32 ggml_type"), f"{int(t.type)} = {t.type.name}"),
                "offset": (_("uint64 offset from the start of the data section"),
                           _("{offset} (so byte {byte} of the file)").format(offset=f"{t.offset:,}",
                                                                          byte=f"{t.data_offset:,}")),
            }.get(c.kind, ("", "")))
    return out + [("", "")] * (len(s.children) - len(out))


@dataclass(frozen=True, slots=True)
class MapSegment:
    index: int  # first byte-map item of the segment
    kind: str  # css class: the region or item kind
    label: str
    offset: int
    size: int
    weight: float  # flex-grow: share of the bar
    selected: bool
    href: str
    size_text: str


@dataclass(frozen=True, slots=True)
class ByteField:
    name: str
    offset: int
    size: int
    hex: str
    meaning: str
    value: str  # what the bytes decode to


@dataclass(frozen=True, slots=True)
class MapDetail:
    index: int
    kind: str
    label: str
    offset: int
    size: int
    explain: str
    fields: list[ByteField]
    dump: list[tuple[str, str, str]]  # (offset, hex, ascii) lines of the first bytes
    dump_note: str
    link: tuple[str, str] | None  # (href, text)


@dataclass(frozen=True, slots=True)
class ByteMapView:
    regions: list[MapSegment]
    region_label: str
    items: list[MapSegment]
    items_note: str
    detail: MapDetail
    prev_href: str | None
    next_href: str | None


def _read(path: str | None, offset: int, n: int) -> bytes:
    if path is None or n <= 0:
        return b""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _hexdump(data: bytes, base: int) -> list[tuple[str, str, str]]:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        lines.append((f"{base + i:>11,}", chunk.hex(" "),
                      "".join(chr(c) if 32 <= c < 127 else "·" for c in chunk)))
    return lines


def _weights(sizes: list[int], floor: float) -> list[float]:
    total = sum(sizes) or 1
    return [round(max(s / total, floor), 5) for s in sizes]


def byte_map_view(digest: str, r: GGUFReader, state: FileState,
                  sent: Callable[[int, int], bool] | None = None) -> ByteMapView:
    """`sent(start, n)`: whether a header-only file holds those bytes (None: a whole file)."""
    spans = r.byte_map()
    sel = min(state.seg, len(spans) - 1)
    # regions: runs of items of one kind (the header's four fields are one region)
    runs: list[list[int]] = []
    for i, s in enumerate(spans):
        if runs and _REGION_OF[spans[runs[-1][0]].kind] == _REGION_OF[s.kind]:
            runs[-1].append(i)
        else:
            runs.append([i])
    sizes = [sum(spans[i].size for i in run) for run in runs]
    regions, current = [], runs[0]
    for run, size, w in zip(runs, sizes, _weights(sizes, 0.0)):
        kind = _REGION_OF[spans[run[0]].kind]
        n_items = sum(spans[i].kind != "tensor_padding" for i in run)
        label = _(_REGION_LABEL[kind]) + (f" ({n_items})" if kind in ("kv", "tensor_info",
                                                                  "tensor_data") else "")
        if sel in run:
            current = run
        regions.append(MapSegment(run[0], kind, label, spans[run[0]].offset, size, w, sel in run,
                                  state.url(digest, seg=run[0]), human_bytes(size)))
    # the selected region, item by item (a window around the selection if it is long)
    lo = 0
    if len(current) > ZOOM_ITEMS_MAX:
        lo = max(0, min(current.index(sel) - ZOOM_ITEMS_MAX // 2, len(current) - ZOOM_ITEMS_MAX))
    shown = current[lo:lo + ZOOM_ITEMS_MAX]
    note = (_("items {first}–{last} of {n}, around the selected one").format(first=lo + 1, last=lo + len(shown),
                                                                              n=len(current))
            if len(shown) < len(current) else "")
    items = [MapSegment(i, spans[i].kind, spans[i].label, spans[i].offset, spans[i].size, w,
                        i == sel, state.url(digest, seg=i), human_bytes(spans[i].size))
             for i, w in zip(shown, _weights([spans[i].size for i in shown], 0.0))]
    region = _REGION_OF[spans[current[0]].kind]
    region_label = next(s.label for s in regions if s.index == current[0])
    return ByteMapView(regions, region_label if region != "header" else _("header"), items, note,
                       _detail(digest, r, spans, sel, sent),
                       state.url(digest, seg=sel - 1) if sel > 0 else None,
                       state.url(digest, seg=sel + 1) if sel + 1 < len(spans) else None)


def _detail(digest: str, r: GGUFReader, spans: list[Span], i: int,
            sent: Callable[[int, int], bool] | None) -> MapDetail:
    s = spans[i]
    head = _read(r.path, s.offset, min(s.size, 64))
    dump_note = _("first {n} of {size} bytes").format(n=len(head), size=f"{s.size:,}") if s.size > len(head) else ""
    if sent is not None and not sent(s.offset, len(head)):  # a hole reads as zeros: show none
        head, dump_note = b"", _("These bytes were not sent: the file was inspected by its header only.")
    fields = []
    decoded = _decoded_fields(r, s)
    for c, (meaning, value) in zip(s.children, decoded):
        raw = _read(r.path, c.offset, min(c.size, 24))
        fields.append(ByteField(c.label, c.offset, c.size,
                                raw.hex(" ") + (" …" if c.size > 24 else ""), meaning, value))
    link = None
    if s.kind in ("tensor_data", "tensor_info"):
        name = s.label
        link = (tensor_url(digest, name), _("Open tensor {name}").format(name=name))
    elif s.kind == "kv":
        kv = r.kvs[r.find_key(s.label)]
        link = (kv_url(digest, kv.key), _("See all {n} values").format(n=f"{kv.n:,}") if kv.arr_type is not None
                else _("See this value"))
    explain = _(EXPLAIN[s.kind]) if s.kind in EXPLAIN else ""
    if s.kind == "padding":
        explain += _(" Here the alignment is {n} bytes.").format(n=r.alignment)
    return MapDetail(i, s.kind, visible_text(s.label, 80), s.offset, s.size, explain, fields,
                     _hexdump(head, s.offset), dump_note, link)
