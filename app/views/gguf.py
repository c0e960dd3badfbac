"""View-models of the GGUF inspector: what each panel shows, computed from an engine GGUFReader.

Mirrors nothing in ggml itself: it arranges what `gguf_init_from_file` reads (header, key-value
pairs, tensor infos, where every item lies in the file) for the pages, and explains quantized
blocks with `engine.quants.explain`. Tensor values are only read for a bounded sample (evenly
spaced rows, at most SAMPLE_VALUES values) and the pages say so; the overview reads no values.
Leaves out: editing files, and values of types the engine cannot convert to float.
"""

from __future__ import annotations

import base64
import math
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, urlencode

import numpy as np

from app.store import UploadStore
from engine.gguf import KV, GGUFReader, Span, StringArray, TensorInfo
from engine.gguf.format import TYPE_NAME, GGUFValueType
from engine.quants import QUANT_KINDS, dequantize
from engine.quants.explain import explain_block
from engine.types import NUMPY_DTYPE, GGMLType, bf16_bits_to_fp32, traits

SAMPLE_VALUES = 1 << 18  # values read from a tensor for its statistics and pictures
HEAT_ROWS, HEAT_COLS = 64, 128  # the heatmap's size in cells, at most
HIST_BINS = 48
ARRAY_PAGE = 100  # elements of a long array per page
KV_ROWS_MAX = 500  # key-value pairs listed at once (a hostile file may hold many)
TENSOR_ROWS_MAX = 2000
ZOOM_ITEMS_MAX = 400  # items drawn in the byte map's zoomed bar
SHOW_ITEMS = 6  # elements of an array shown inline in the metadata table
SHOW_CHARS = 160
PLAIN_CHUNK = 16  # elements per "block" of an unquantized tensor in the explainer
_LAYER = re.compile(r"^blk\.(\d+)\.")

# llama.cpp's enum llama_token_type, for tokenizer.ggml.token_type
TOKEN_TYPES = {0: "undefined", 1: "normal", 2: "unknown", 3: "control", 4: "user-defined",
               5: "unused", 6: "byte"}

FIXTURE_NOTES = {
    "minilm-q8_0.gguf": "all-MiniLM-L6-v2, a small BERT sentence encoder: 6 layers, 101 tensors "
                        "(64 F32 + 37 Q8_0) and its WordPiece vocabulary.",
    "ggml-vocab-llama-spm.gguf": "A vocabulary-only file: LLaMA's SentencePiece tokenizer "
                                 "(32,000 tokens with scores and types) and no tensors.",
}

# --- formatting ---------------------------------------------------------------------------------


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; exact counts stay available beside it on the page."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def fmt_float(v: float) -> str:
    """A value as the pages print it: 6 significant digits."""
    return f"{v:.6g}"


def visible_text(s: str, limit: int = SHOW_CHARS) -> str:
    """A string value made visible: control characters escaped, long ones cut."""
    if not s.isprintable():
        s = s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        s = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                    for c in s)
    return s if len(s) <= limit else s[:limit] + "…"


def _scalar(v: Any, vtype: GGUFValueType, limit: int = SHOW_CHARS) -> str:
    if vtype == GGUFValueType.STRING:
        return visible_text(str(v), limit)
    if vtype == GGUFValueType.BOOL:
        return "true" if v else "false"
    if vtype == GGUFValueType.FLOAT32:
        return str(np.float32(v))  # 1e-12, as the float32 prints, not 9.99999996e-13
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return str(int(v)) if isinstance(v, (int, np.integer, bool, np.bool_)) else str(v)


def _shape(ne: tuple[int, ...]) -> str:
    return "[" + ", ".join(f"{x:,}" for x in ne) + "]"


def _bpw(nbytes: int, n: int) -> float | None:
    return nbytes * 8 / n if n else None


def _layer(name: str) -> str:
    m = _LAYER.match(name)
    return f"blk.{m.group(1)}" if m else ""


def file_url(digest: str) -> str:
    return f"/gguf/{digest}"


def tensor_url(digest: str, name: str, **params: Any) -> str:
    url = f"/gguf/{digest}/tensors/{quote(name, safe='')}"
    return url + ("?" + urlencode(params) if params else "")


def kv_url(digest: str, key: str, page: int = 1, q: str = "") -> str:
    url = f"/gguf/{digest}/kv/{quote(key, safe='')}"
    params = {k: v for k, v in (("page", page), ("q", q)) if v not in (1, "")}
    return url + ("?" + urlencode(params) if params else "")


# --- the home page ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FixtureRow:
    name: str
    size: str
    note: str
    href: str


@dataclass(frozen=True, slots=True)
class UploadError:
    """What to tell the user about a refused upload."""

    title: str  # "This is not a valid GGUF file"
    message: str  # the GGUFError message (field, offset, rule) or the limit broken
    field: str | None = None
    offset: int | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class HomeView:
    fixtures: list[FixtureRow]
    upload_limit: str
    error: UploadError | None = None


def home_view(store: UploadStore, error: UploadError | None = None) -> HomeView:
    rows = [FixtureRow(f.name, human_bytes(f.size), FIXTURE_NOTES.get(f.name, ""),
                       file_url(f.digest)) for f in store.fixtures()]
    return HomeView(rows, human_bytes(store.upload_limit), error)


# --- the file page's state: one URL holds every panel's choices ---------------------------------

SORTS = ("index", "name", "type", "shape", "elements", "offset", "size", "bpw")
# which query parameters each swappable panel owns
PANEL_PARAMS = {"gguf-bytemap": ("seg",), "gguf-kv-table": ("q",),
                "gguf-tensors-table": ("filter", "sort", "order", "group")}


@dataclass(frozen=True, slots=True)
class FileState:
    """The file page's query parameters, read leniently (anything odd falls back)."""

    seg: int = 0  # selected byte-map item: an index into reader.byte_map()
    q: str = ""  # metadata search
    filter: str = ""  # tensor filter
    sort: str = "index"
    order: str = "asc"
    group: str = "layer"  # "layer" or "none"

    @classmethod
    def from_params(cls, p: Mapping[str, str]) -> FileState:
        seg = p.get("seg", "0")
        return cls(seg=int(seg) if seg.isdigit() and len(seg) < 10 else 0,
                   q=p.get("q", "")[:200].strip(), filter=p.get("filter", "")[:200].strip(),
                   sort=p.get("sort") if p.get("sort") in SORTS else "index",
                   order="desc" if p.get("order") == "desc" else "asc",
                   group="none" if p.get("group") == "none" else "layer")

    def params(self, **changes: Any) -> dict[str, str]:
        """Non-default parameters, after `changes`."""
        values = {k: getattr(self, k) for k in self.__slots__} | changes
        default = FileState()
        return {k: str(v) for k, v in values.items() if v != getattr(default, k)}

    def url(self, digest: str, **changes: Any) -> str:
        p = self.params(**changes)
        return file_url(digest) + ("?" + urlencode(p) if p else "")

    def hidden(self, *shown: str) -> list[tuple[str, str]]:
        """Every parameter but a form's visible fields, as hidden fields (a plain GET keeps
        the rest of the page as it is)."""
        return [(k, v) for k, v in self.params().items() if k not in shown]


def merge_params(current: Mapping[str, str], request: Mapping[str, str],
                 owned: tuple[str, ...]) -> dict[str, str]:
    """A panel's request changes only the parameters it owns; the rest come from the URL the
    browser shows (htmx's HX-Current-URL), so one panel's swap keeps the others' state."""
    merged = {k: v for k, v in current.items() if k not in owned}
    merged.update({k: v for k, v in request.items() if k in owned})
    return merged


# --- the file page ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fact:
    label: str
    value: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class HeaderField:
    name: str
    ctype: str  # its C type in the file
    value: str
    offset: int
    size: int
    meaning: str


@dataclass(frozen=True, slots=True)
class FileView:
    digest: str
    title: str  # general.name, or the fixture's file name
    source: str  # "fixture minilm-q8_0.gguf" or "upload"
    size: int
    size_text: str
    facts: list[Fact]
    header: list[HeaderField]
    n_kv: int
    n_tensors: int
    load_href: str


def file_view(store: UploadStore, digest: str, r: GGUFReader) -> FileView:
    fixture = store.fixture_name(digest)
    name = r.get("general.name")
    title = name if isinstance(name, str) and name else (fixture or "GGUF file")
    arch = r.get("general.architecture")
    facts = [Fact("file size", f"{r.size:,} bytes", human_bytes(r.size)),
             Fact("GGUF version", str(r.version), f"{r.byte_order}-endian"),
             Fact("architecture", visible_text(arch, 40) if isinstance(arch, str) else "—"),
             Fact("key-value pairs", f"{r.n_kv:,}"), Fact("tensors", f"{r.n_tensors:,}"),
             Fact("alignment", f"{r.alignment} bytes",
                  "general.alignment" if r.find_key("general.alignment") >= 0 else "default"),
             Fact("data section", f"at byte {r.data_offset:,}", f"{human_bytes(r.data_size)}")]
    header = [
        HeaderField("magic", "char[4]", "'GGUF'", 0, 4, "identifies the file as GGUF"),
        HeaderField("version", "uint32", str(r.version), 4, 4, "format version (ggml reads 2, 3)"),
        HeaderField("n_tensors", "int64", f"{r.n_tensors:,}", 8, 8,
                    "tensor infos after the key-value pairs"),
        HeaderField("n_kv", "int64", f"{r.n_kv:,}", 16, 8, "key-value pairs after the header"),
    ]
    return FileView(digest, visible_text(title, 80), f"fixture {fixture}" if fixture else "upload",
                    r.size, human_bytes(r.size), facts, header, r.n_kv, r.n_tensors,
                    f"/walkthroughs/gguf-load?file={digest}")


# --- the byte map -------------------------------------------------------------------------------

_REGION_OF = {"magic": "header", "version": "header", "n_tensors": "header", "n_kv": "header",
              "kv": "kv", "tensor_info": "tensor_info", "padding": "padding",
              "tensor_data": "tensor_data", "tensor_padding": "tensor_data",
              "trailing": "trailing"}
_REGION_LABEL = {"header": "header", "kv": "metadata", "tensor_info": "tensor infos",
                 "padding": "padding", "tensor_data": "tensor data", "trailing": "trailing bytes"}

EXPLAIN = {
    "magic": "The four bytes 'GGUF' (47 47 55 46) that mark a GGUF file.",
    "version": "The format version, a uint32. ggml reads versions 2 and 3 and writes 3.",
    "n_tensors": "How many tensor infos follow the key-value pairs (int64).",
    "n_kv": "How many key-value pairs follow the header (int64).",
    "kv": "One metadata pair: the key (a uint64 length, then UTF-8 bytes), its gguf_type (int32); "
          "for an array the element type (int32) and count (uint64); then the value itself.",
    "tensor_info": "One tensor's description: its name, n_dims, ne[0..n_dims) (int64 each, "
                   "fastest dimension first), its ggml_type (int32) and the offset of its data "
                   "from the start of the data section (uint64). No values are stored here.",
    "padding": "Zero bytes up to the next multiple of the alignment, so the data section starts "
               "aligned (ggml can then map tensor data straight from the file).",
    "tensor_data": "A tensor's values, exactly as ggml holds them in memory: rows of ne[0] "
                   "elements; for a quantized type, rows of blocks (scale(s) then packed quants).",
    "tensor_padding": "Padding after a tensor's data so that the next tensor starts aligned.",
    "trailing": "Bytes after the end of the data section; ggml ignores them.",
}
def _decoded_fields(r: GGUFReader, s: Span) -> list[tuple[str, str]]:
    """(what the part is, what it decodes to) for each child of a kv pair or tensor info."""
    out = []
    if s.kind == "kv":
        kv = r.kvs[r.find_key(s.label)]
        for c in s.children:
            out.append({
                "key": ("uint64 length, then the key's UTF-8 bytes", repr(visible_text(kv.key))),
                "type": ("int32 gguf_type", f"{int(kv.type)} = {TYPE_NAME[kv.type]}"),
                "arr_type": ("int32 gguf_type of each element",
                             f"{int(kv.value_type)} = {TYPE_NAME[kv.value_type]}"),
                "arr_n": ("uint64 element count", f"{kv.n:,}"),
                "value": ("the value" + (" (strings: uint64 length + bytes each)"
                                         if kv.value_type == GGUFValueType.STRING else ""),
                          visible_text(_kv_value_text(kv), 60)),
            }.get(c.kind, ("", "")))
    elif s.kind == "tensor_info":
        t = r.tensors[r.find_tensor(s.label)]
        for c in s.children:
            if c.kind == "ne":
                j = int(c.label[3:-1])
                out.append((f"int64 elements in dimension {j}", f"{t.ne[j]:,}"))
                continue
            out.append({
                "name": ("uint64 length, then the name's UTF-8 bytes", repr(t.name)),
                "n_dims": ("uint32 number of dimensions", str(t.n_dims)),
                "type": ("int32 ggml_type", f"{int(t.type)} = {t.type.name}"),
                "offset": ("uint64 offset from the start of the data section",
                           f"{t.offset:,} (so byte {t.data_offset:,} of the file)"),
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


def byte_map_view(digest: str, r: GGUFReader, state: FileState) -> ByteMapView:
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
        label = _REGION_LABEL[kind] + (f" ({n_items})" if kind in ("kv", "tensor_info",
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
    note = (f"items {lo + 1}–{lo + len(shown)} of {len(current)}, around the selected one"
            if len(shown) < len(current) else "")
    items = [MapSegment(i, spans[i].kind, spans[i].label, spans[i].offset, spans[i].size, w,
                        i == sel, state.url(digest, seg=i), human_bytes(spans[i].size))
             for i, w in zip(shown, _weights([spans[i].size for i in shown], 0.0))]
    region = _REGION_OF[spans[current[0]].kind]
    region_label = next(s.label for s in regions if s.index == current[0])
    return ByteMapView(regions, region_label if region != "header" else "header", items, note,
                       _detail(digest, r, spans, sel),
                       state.url(digest, seg=sel - 1) if sel > 0 else None,
                       state.url(digest, seg=sel + 1) if sel + 1 < len(spans) else None)


def _detail(digest: str, r: GGUFReader, spans: list[Span], i: int) -> MapDetail:
    s = spans[i]
    head = _read(r.path, s.offset, min(s.size, 64))
    fields = []
    decoded = _decoded_fields(r, s)
    for c, (meaning, value) in zip(s.children, decoded):
        raw = _read(r.path, c.offset, min(c.size, 24))
        fields.append(ByteField(c.label, c.offset, c.size,
                                raw.hex(" ") + (" …" if c.size > 24 else ""), meaning, value))
    link = None
    if s.kind in ("tensor_data", "tensor_info"):
        name = s.label
        link = (tensor_url(digest, name), f"Open tensor {name}")
    elif s.kind == "kv":
        kv = r.kvs[r.find_key(s.label)]
        link = (kv_url(digest, kv.key), f"See all {kv.n:,} values" if kv.arr_type is not None
                else "See this value")
    explain = EXPLAIN.get(s.kind, "")
    if s.kind == "padding":
        explain += f" Here the alignment is {r.alignment} bytes."
    return MapDetail(i, s.kind, visible_text(s.label, 80), s.offset, s.size, explain, fields,
                     _hexdump(head, s.offset),
                     f"first {len(head)} of {s.size:,} bytes" if s.size > len(head) else "",
                     link)


# --- key-value pairs ----------------------------------------------------------------------------


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
    digest: str
    q: str
    rows: list[KVRow]
    n_match: int
    n_total: int
    hidden: list[tuple[str, str]]
    action: str
    clear_href: str


def _type_text(kv: KV) -> str:
    return f"arr[{TYPE_NAME[kv.arr_type]}]" if kv.arr_type is not None else TYPE_NAME[kv.type]


def _kv_value_text(kv: KV) -> str:
    if kv.arr_type is None:
        return _scalar(kv.value, kv.type)
    head = kv.value[:SHOW_ITEMS]
    items = ", ".join(_scalar(x, kv.arr_type, 24) for x in head)
    return f"[{items}{', …' if kv.n > SHOW_ITEMS else ''}]"


def kv_table_view(digest: str, r: GGUFReader, state: FileState) -> KVTableView:
    # byte-map index of each pair: the header's four items come first
    seg_of = {kv.key: 4 + kv.index for kv in r.kvs}
    q = state.q.lower()
    rows, n_match = [], 0
    for kv in r.kvs:
        value = _kv_value_text(kv)
        if q and q not in kv.key.lower() and q not in value.lower():
            continue
        n_match += 1
        if len(rows) >= KV_ROWS_MAX:
            continue
        prefix, _, name = kv.key.rpartition(".")
        rows.append(KVRow(kv.index, prefix + "." if prefix else "", name, kv.key,
                          _type_text(kv), value, kv.n, kv.arr_type is not None, kv.span.offset,
                          kv.span.size, kv_url(digest, kv.key),
                          state.url(digest, seg=seg_of[kv.key])))
    return KVTableView(digest, state.q, rows, n_match, r.n_kv,
                       state.hidden("q"), file_url(digest),
                       state.url(digest, q=""))


# --- one key's value, paged ---------------------------------------------------------------------


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
        texts = [_scalar(v, kv.value_type, 4000) for v in values]
    if kv.key == "tokenizer.ggml.token_type":
        texts = [f"{t} ({TOKEN_TYPES.get(int(t), '?')})" for t in texts]
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
        note = ("A vocabulary is stored as parallel arrays: entry i of each belongs to token id i, "
                "the number the model sees. They are shown side by side; '▁' marks a leading "
                "space in SentencePiece vocabularies.")
    return ArrayView(digest, visible_text(str(r.get("general.name") or "GGUF file"), 80), kv.key,
                     _type_text(kv), kv.n, kv.arr_type is not None, kv.span.offset,
                     kv.span.size, q, columns, rows, len(match), page, pages,
                     (page - 1) * ARRAY_PAGE + 1 if rows else 0, _page_links(page, pages, href),
                     href(page - 1) if page > 1 else None,
                     href(page + 1) if page < pages else None,
                     "token id" if kv.key in keys else "index", kv_url(digest, kv.key), note)


# --- the tensors table --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorRow:
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
    rows: list[TensorRow]
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
    digest: str
    filter: str
    group: str
    sort: str
    order: str
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
    "bpw": lambda t: _bpw(t.nbytes, t.n_elements) or 0.0,
}
_COLUMNS = [("index", "#", True), ("name", "name", False), ("type", "type", False),
            ("shape", "shape (ne)", False), ("elements", "elements", True),
            ("offset", "data at byte", True), ("size", "size", True), ("bpw", "bits/weight", True)]


def _fmt_bpw(nbytes: int, n: int) -> str:
    v = _bpw(nbytes, n)
    return "—" if v is None else f"{v:.2f}"


def tensor_table_view(digest: str, r: GGUFReader, state: FileState) -> TensorTableView:
    f = state.filter.lower()
    match = [t for t in r.tensors if not f or f in t.name.lower() or f in t.type.name.lower()]
    match.sort(key=_SORT_KEY[state.sort], reverse=state.order == "desc")
    shown = match[:TENSOR_ROWS_MAX]
    groups: dict[str, list[TensorInfo]] = {}
    for t in shown:
        groups.setdefault(_layer(t.name) if state.group == "layer" else "", []).append(t)
    order = sorted(groups, key=lambda k: (k == "", int(k[4:]) if k else 0))
    out = []
    for label in order:
        ts = groups[label]
        rows = [TensorRow(t.index, t.name, t.type.name, _shape(t.shape), t.n_elements,
                          t.data_offset, t.nbytes, human_bytes(t.nbytes),
                          _fmt_bpw(t.nbytes, t.n_elements), tensor_url(digest, t.name))
                for t in ts]
        n_el, nbytes = sum(t.n_elements for t in ts), sum(t.nbytes for t in ts)
        shown_label = label or ("(not in a layer)" if state.group == "layer" else "")
        out.append(TensorGroup(shown_label, rows, n_el, nbytes, human_bytes(nbytes),
                               _fmt_bpw(nbytes, n_el)))
    columns = []
    for key, label, numeric in _COLUMNS:
        active = state.sort == key
        flip = "desc" if active and state.order == "asc" else "asc"
        columns.append(SortLink(key, label, state.url(digest, sort=key, order=flip),
                                ("▲" if state.order == "asc" else "▼") if active else "",
                                ("ascending" if state.order == "asc" else "descending")
                                if active else "none", numeric))
    counts: dict[str, int] = {}
    for t in r.tensors:
        counts[t.type.name] = counts.get(t.type.name, 0) + 1
    return TensorTableView(digest, state.filter, state.group, state.sort, state.order, columns,
                           out, len(match), r.n_tensors, len(shown),
                           ", ".join(f"{n} × {k}" for k, n in sorted(counts.items())),
                           state.hidden("filter", "group"), file_url(digest),
                           state.url(digest, filter=""))


# --- one tensor: facts, a sample's statistics and pictures, the block explainer -----------------


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    title: str


@dataclass(frozen=True, slots=True)
class SampleView:
    ok: bool
    note: str  # what was sampled, or why nothing could be
    stats: list[Fact] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    hist_lo: str = ""
    hist_hi: str = ""
    zero_x: float | None = None  # where 0 falls on the histogram, if inside
    heat_png: str = ""  # data: URI
    heat_w: int = 0
    heat_h: int = 0
    heat_note: str = ""
    heat_scale: str = ""


@dataclass(frozen=True, slots=True)
class BlockByte:
    hex: str
    field: int  # index of the field it belongs to (for its colour)
    title: str


@dataclass(frozen=True, slots=True)
class BlockFieldView:
    n: int  # colour index
    name: str
    offset: int
    size: int
    meaning: str
    value: str


@dataclass(frozen=True, slots=True)
class BlockCell:
    element: int  # index in the row
    quant: str | None
    value: str


@dataclass(frozen=True, slots=True)
class BlockView:
    digest: str
    name: str
    kind: str  # "quant" (explain_block), "plain" (a chunk of elements) or "none"
    type: str
    row: int
    block: int
    nrows: int
    nblocks: int
    blck_size: int
    type_size: int
    file_offset: int  # absolute byte of the block in the file
    row_offset: int  # byte of the block within its row
    element_range: tuple[int, int]
    bytes: list[BlockByte]
    fields: list[BlockFieldView]
    sub_scales: list[tuple[str, str]]
    cells: list[BlockCell]
    formula: str
    note: str
    action: str
    links: dict[str, str | None]  # prev/next block and row


@dataclass(frozen=True, slots=True)
class TensorView:
    digest: str
    file_title: str
    name: str
    type: str
    facts: list[Fact]
    storage: str  # one sentence about how the type stores values
    sample: SampleView
    block: BlockView
    load_href: str
    file_href: str
    info_seg_href: str
    data_seg_href: str


def _nrows(t: TensorInfo) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def _storage(t: TensorInfo) -> str:
    tr = traits(t.type)
    if not tr.is_quantized:
        return (f"{t.type.name} is not quantized: each element is stored on its own in "
                f"{tr.type_size} byte{'s' if tr.type_size > 1 else ''}.")
    return (f"{t.type.name} is quantized: each row is cut into blocks of {tr.blck_size} elements, "
            f"and each block is stored in {tr.type_size} bytes "
            f"({tr.type_size * 8 / tr.blck_size:g} bits per weight): its scale(s), then the "
            "packed integer quants.")


def _can_read(t: TensorInfo) -> bool:
    if t.type in NUMPY_DTYPE:
        return True
    kind = QUANT_KINDS.get(t.type)
    return kind is not None and kind.dequantize is not None


def _rows_float(r: GGUFReader, t: TensorInfo, rows: np.ndarray, ncols: int) -> np.ndarray:
    """Rows `rows` (over ne1..ne3 flattened) of tensor t, first `ncols` elements, as float64."""
    if t.type in NUMPY_DTYPE:
        data = r.tensor_data(t).reshape(_nrows(t), t.ne[0])[rows, :ncols]
        if t.type == GGMLType.BF16:
            return bf16_bits_to_fp32(data.astype(np.uint16)).astype(np.float64)
        return data.astype(np.float64)
    tr = traits(t.type)
    nbytes = ncols // tr.blck_size * tr.type_size
    raw = r.tensor_bytes(t).reshape(_nrows(t), t.nb[1])[rows, :nbytes]
    vals = dequantize(t.type, np.ascontiguousarray(raw), len(rows) * ncols)
    return vals.reshape(len(rows), ncols).astype(np.float64)


def _png(rgb: np.ndarray) -> bytes:
    """A minimal RGB PNG (one IDAT, no filter): enough for a small heatmap."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + row.tobytes() for row in rgb.astype(np.uint8))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + \
            struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


_NEG = np.array([47, 111, 219], np.float64)  # blue for negative values
_POS = np.array([200, 68, 47], np.float64)  # red for positive values


def _diverging(v: np.ndarray, vmax: float) -> np.ndarray:
    x = np.clip(np.nan_to_num(v / vmax if vmax > 0 else v * 0), -1, 1)[..., None]
    white = np.full(3, 255.0)
    rgb = np.where(x < 0, white + (-x) * (_NEG - white), white + x * (_POS - white))
    return rgb.round().astype(np.uint8)


def sample_view(r: GGUFReader, t: TensorInfo) -> SampleView:
    nrows, ne0 = _nrows(t), t.ne[0]
    if t.n_elements == 0:
        return SampleView(False, "This tensor has no elements.")
    if not _can_read(t):
        return SampleView(False, f"The engine cannot convert {t.type.name} values to floats, so "
                                 "no statistics are shown.")
    tr = traits(t.type)
    ncols = min(ne0, max(tr.blck_size, SAMPLE_VALUES // tr.blck_size * tr.blck_size))
    n = min(nrows, max(1, SAMPLE_VALUES // ncols))
    rows = np.unique(np.linspace(0, nrows - 1, n).round().astype(np.int64))
    s = _rows_float(r, t, rows, ncols)
    if s.size == t.n_elements:
        note = f"Computed on all {t.n_elements:,} values."
    elif ncols < ne0:
        note = (f"Computed on a sample: the first {ncols:,} of row 0's {ne0:,} values "
                f"({s.size:,} of {t.n_elements:,}).")
    else:
        note = (f"Computed on a sample: {len(rows):,} evenly spaced rows of {nrows:,} "
                f"({s.size:,} of {t.n_elements:,} values, {s.size / t.n_elements:.1%}).")
    finite = s[np.isfinite(s)]
    stats = [Fact("values read", f"{s.size:,}"),
             Fact("min", fmt_float(finite.min()) if finite.size else "—"),
             Fact("max", fmt_float(finite.max()) if finite.size else "—"),
             Fact("mean", fmt_float(finite.mean()) if finite.size else "—"),
             Fact("std", fmt_float(finite.std()) if finite.size else "—"),
             Fact("mean |x|", fmt_float(np.abs(finite).mean()) if finite.size else "—"),
             Fact("exact zeros", f"{int((s == 0).sum()):,}", f"{(s == 0).mean():.2%}"),
             Fact("NaN / inf", f"{int(s.size - finite.size):,}")]
    bars, lo_t, hi_t, zero_x = [], "", "", None
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        counts, edges = np.histogram(finite, bins=HIST_BINS, range=(lo, hi))
        top = counts.max() or 1
        w = 100 / HIST_BINS
        for k, c in enumerate(counts.tolist()):
            h = 100 * c / top
            bars.append(Bar(round(k * w, 3), round(100 - h, 3), round(w, 3), round(h, 3),
                            f"[{fmt_float(edges[k])}, {fmt_float(edges[k + 1])}): {c:,} values"))
        lo_t, hi_t = fmt_float(lo), fmt_float(hi)
        if lo < 0 < hi:
            zero_x = round(100 * (0 - lo) / (hi - lo), 3)
    # heatmap: up to HEAT_ROWS of the sampled rows, columns averaged into HEAT_COLS buckets
    pick = np.unique(np.linspace(0, len(rows) - 1, min(HEAT_ROWS, len(rows))).round()
                     .astype(np.int64))
    width = min(HEAT_COLS, ncols)
    edges = np.arange(width + 1, dtype=np.int64) * ncols // width
    sub = np.nan_to_num(s[pick], nan=0.0, posinf=0.0, neginf=0.0)
    cells = np.add.reduceat(sub, edges[:-1], axis=1) / np.diff(edges)
    mag = np.abs(finite) if finite.size else np.zeros(1)
    vmax = float(np.percentile(mag, 99)) or float(mag.max())
    png = base64.b64encode(_png(_diverging(cells, vmax))).decode("ascii")
    per = ncols / width
    which = (f"row {int(rows[pick[0]]):,}" if len(pick) == 1 else
             f"{len(pick)} of the sampled rows, top to bottom (rows {int(rows[pick[0]]):,} … "
             f"{int(rows[pick[-1]]):,})")
    cell = "one value" if per == 1 else f"the mean of about {per:.3g} neighbouring values"
    heat_note = f"{which}, left to right; each cell is {cell}."
    return SampleView(True, note, stats, bars, lo_t, hi_t, zero_x,
                      f"data:image/png;base64,{png}", width, len(pick), heat_note,
                      f"blue −{fmt_float(vmax)} · white 0 · red +{fmt_float(vmax)} "
                      "(99th percentile of |x|; larger values saturate)")


FORMULAS = {
    "Q4_0": "value = d × (q − 8)", "Q4_1": "value = d × q + m", "Q5_0": "value = d × (q − 16)",
    "Q5_1": "value = d × q + m", "Q8_0": "value = d × q", "Q8_1": "value = d × q",
    "Q2_K": "value = d × scale[sub] × q − dmin × min[sub]",
    "Q3_K": "value = d × scale[sub] × q", "Q4_K": "value = d × scale[sub] × q − dmin × min[sub]",
    "Q5_K": "value = d × scale[sub] × q − dmin × min[sub]", "Q6_K": "value = d × scale[sub] × q",
    "IQ4_NL": "value = d × kvalues[q]", "IQ4_XS": "value = d × scale[sub] × kvalues[q]",
    "TQ1_0": "value = d × q (q ∈ {−1, 0, 1})", "TQ2_0": "value = d × q (q ∈ {−1, 0, 1})",
}


def _field_value(v: Any) -> str:
    if isinstance(v, list):
        flat = np.asarray(v).reshape(-1).tolist()
        shown = ", ".join(str(x) for x in flat[:16])
        return f"[{shown}{', …' if len(flat) > 16 else ''}]"
    if isinstance(v, float):
        return fmt_float(v)
    return str(v)


def block_view(digest: str, r: GGUFReader, t: TensorInfo, row: int, block: int) -> BlockView:
    tr = traits(t.type)
    nrows = _nrows(t)
    quant = t.type in QUANT_KINDS
    per = tr.blck_size if quant else PLAIN_CHUNK
    nblocks = max(1, math.ceil(t.ne[0] / per)) if t.ne[0] else 0
    row = min(max(row, 0), max(nrows - 1, 0))
    block = min(max(block, 0), max(nblocks - 1, 0))

    def href(rw: int, bl: int) -> str:
        return tensor_url(digest, t.name, row=rw, block=bl)

    links = {"prev_block": href(row, block - 1) if block > 0 else None,
             "next_block": href(row, block + 1) if block + 1 < nblocks else None,
             "prev_row": href(row - 1, block) if row > 0 else None,
             "next_row": href(row + 1, block) if row + 1 < nrows else None}
    base = dict(digest=digest, name=t.name, type=t.type.name, row=row, block=block,
                nrows=nrows, nblocks=nblocks, blck_size=tr.blck_size, type_size=tr.type_size,
                action=tensor_url(digest, t.name), links=links)
    if t.n_elements == 0:
        return BlockView(kind="none", file_offset=t.data_offset, row_offset=0,
                         element_range=(0, 0), bytes=[], fields=[], sub_scales=[], cells=[],
                         formula="", note="This tensor has no elements.", **base)
    row_bytes = r.tensor_bytes(t)[row * t.nb[1]:(row + 1) * t.nb[1]]
    if quant:
        e = explain_block(t.type, row_bytes, block)
        start, end = e["byte_range"]
        raw = bytes(row_bytes[start:end])
        fields, owner = [], [0] * len(raw)
        for n, f in enumerate(e["fields"]):
            fields.append(BlockFieldView(n, f["name"], f["offset"], f["size"], f["meaning"],
                                         _field_value(f["value"])))
            for k in range(f["offset"], f["offset"] + f["size"]):
                owner[k] = n
        names = [f.name for f in fields]
        byts = [BlockByte(f"{b:02x}", owner[k], f"byte {k}: {names[owner[k]]}")
                for k, b in enumerate(raw)]
        quants = e.get("quants")
        values = e.get("values") or []
        e0 = e["element_range"][0]
        cells = [BlockCell(e0 + k, None if quants is None else str(quants[k]), fmt_float(v))
                 for k, v in enumerate(values)]
        subs = [(k.replace("sub_", "").replace("_", " "), _field_value(list(v)))
                for k, v in e.items() if k.startswith("sub_")]
        note = "" if values else f"The engine has no dequantizer for {t.type.name}."
        return BlockView(kind="quant", file_offset=t.data_offset + row * t.nb[1] + start,
                         row_offset=start, element_range=tuple(e["element_range"]), bytes=byts,
                         fields=fields, sub_scales=subs, cells=cells,
                         formula=FORMULAS.get(t.type.name, ""), note=note, **base)
    # not quantized: a chunk of PLAIN_CHUNK elements, each its own bytes
    e0, e1 = block * per, min((block + 1) * per, t.ne[0])
    start, end = e0 * tr.type_size, e1 * tr.type_size
    raw = bytes(row_bytes[start:end])
    vals = _rows_float(r, t, np.array([row]), t.ne[0])[0, e0:e1] if _can_read(t) else []
    byts = [BlockByte(f"{b:02x}", (k // tr.type_size) % 2, f"element {e0 + k // tr.type_size}")
            for k, b in enumerate(raw)]
    cells = [BlockCell(e0 + k, raw[k * tr.type_size:(k + 1) * tr.type_size].hex(" "),
                       fmt_float(v)) for k, v in enumerate(vals)]
    order = "little" if r.byte_order == "little" else "big"
    return BlockView(kind="plain", file_offset=t.data_offset + row * t.nb[1] + start,
                     row_offset=start, element_range=(e0, e1), bytes=byts, fields=[],
                     sub_scales=[], cells=cells, formula="",
                     note=f"{t.type.name} has no blocks: here are {per} elements at a time, "
                          f"each {tr.type_size} bytes ({order}-endian).", **base)


def tensor_view(store: UploadStore, digest: str, r: GGUFReader, t: TensorInfo, row: int,
                block: int) -> TensorView:
    tr = traits(t.type)
    layer = _layer(t.name)
    facts = [Fact("type", t.type.name, f"ggml_type {int(t.type)}"),
             Fact("shape (ne)", _shape(t.shape), f"{t.n_dims} dim{'s' if t.n_dims != 1 else ''}, "
                                                   "ne[0] varies fastest"),
             Fact("elements", f"{t.n_elements:,}"),
             Fact("rows", f"{_nrows(t):,}", f"of {t.ne[0]:,} elements, {t.nb[1]:,} bytes each"),
             Fact("strides (nb)", _shape(t.nb), "bytes to step in each dimension"),
             Fact("size", f"{t.nbytes:,} bytes", human_bytes(t.nbytes)),
             Fact("bits per weight", _fmt_bpw(t.nbytes, t.n_elements)),
             Fact("block", f"{tr.blck_size} elements in {tr.type_size} bytes"
                  if tr.is_quantized else f"1 element in {tr.type_size} bytes"),
             Fact("data at byte", f"{t.data_offset:,}",
                  f"offset {t.offset:,} in the data section"),
             Fact("layer", layer or "—")]
    spans = r.byte_map()
    info_seg = next(i for i, s in enumerate(spans) if s.kind == "tensor_info"
                    and s.offset == t.span.offset)
    data_seg = next((i for i, s in enumerate(spans) if s.kind == "tensor_data"
                     and s.label == t.name), info_seg)
    state = FileState()
    return TensorView(digest, visible_text(str(r.get("general.name") or store.fixture_name(digest)
                                        or "GGUF file"), 80),
                      t.name, t.type.name, facts, _storage(t), sample_view(r, t),
                      block_view(digest, r, t, row, block),
                      f"/walkthroughs/gguf-load?file={digest}", file_url(digest),
                      state.url(digest, seg=info_seg) + "#gguf-bytemap",
                      state.url(digest, seg=data_seg) + "#gguf-bytemap")

