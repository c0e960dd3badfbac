"""The block explainer panel: one quantized block's bytes, fields and values
(engine.quants.explain), or a chunk of a plain tensor's elements."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.i18n import _
from app.views.format import fmt_float
from app.views.gguf.sample import can_read, nrows, rows_float
from app.views.gguf.state import tensor_url
from engine.gguf import GGUFReader, TensorInfo
from engine.quants import QUANT_KINDS
from engine.quants.explain import explain_block
from engine.core.types import traits

PLAIN_CHUNK = 16  # elements per "block" of an unquantized tensor in the explainer

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
class BlockLinks:
    """The neighbouring blocks and rows (None at an edge)."""

    prev_block: str | None
    next_block: str | None
    prev_row: str | None
    next_row: str | None


@dataclass(frozen=True, slots=True)
class BlockView:
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
    links: BlockLinks

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
    n_rows = nrows(t)
    quant = t.type in QUANT_KINDS
    per = tr.blck_size if quant else PLAIN_CHUNK
    nblocks = max(1, math.ceil(t.ne[0] / per)) if t.ne[0] else 0
    row = min(max(row, 0), max(n_rows - 1, 0))
    block = min(max(block, 0), max(nblocks - 1, 0))

    def href(rw: int, bl: int) -> str:
        return tensor_url(digest, t.name, row=rw, block=bl)

    links = BlockLinks(href(row, block - 1) if block > 0 else None,
                       href(row, block + 1) if block + 1 < nblocks else None,
                       href(row - 1, block) if row > 0 else None,
                       href(row + 1, block) if row + 1 < n_rows else None)
    base: dict[str, Any] = dict(type=t.type.name, row=row, block=block,
                                nrows=n_rows, nblocks=nblocks, blck_size=tr.blck_size, type_size=tr.type_size,
                                action=tensor_url(digest, t.name), links=links)
    if t.n_elements == 0:
        return BlockView(kind="none", file_offset=t.data_offset, row_offset=0,
                         element_range=(0, 0), bytes=[], fields=[], sub_scales=[], cells=[],
                         formula="", note=_("This tensor has no elements."), **base)
    row_bytes = r.tensor_bytes(t)[row * t.nb[1]:(row + 1) * t.nb[1]]
    if quant:
        e = explain_block(t.type, row_bytes, block)
        start, end = e.byte_range
        raw = bytes(row_bytes[start:end])
        fields, owner = [], [0] * len(raw)
        for n, f in enumerate(e.fields):
            fields.append(BlockFieldView(n, f.name, f.offset, f.size, _(f.meaning) if f.meaning else "",
                                         _field_value(f.value)))
            for k in range(f.offset, f.offset + f.size):
                owner[k] = n
        names = [f.name for f in fields]
        byts = [BlockByte(f"{b:02x}", owner[k], _("byte {k}: {field}").format(k=k, field=names[owner[k]]))
                for k, b in enumerate(raw)]
        values = e.values or ()
        e0 = e.element_range[0]
        cells = [BlockCell(e0 + k, None if e.quants is None else str(e.quants[k]), fmt_float(v))
                 for k, v in enumerate(values)]
        subs = []
        if e.sub_scales is not None:
            subs.append(("scales", _field_value(list(e.sub_scales.scales))))
            if e.sub_scales.mins is not None:
                subs.append(("mins", _field_value(list(e.sub_scales.mins))))
        note = "" if values else _("The engine has no dequantizer for {type}.").format(type=t.type.name)
        return BlockView(kind="quant", file_offset=t.data_offset + row * t.nb[1] + start,
                         row_offset=start, element_range=e.element_range, bytes=byts,
                         fields=fields, sub_scales=subs, cells=cells, formula=e.formula,
                         note=note, **base)
    # not quantized: a chunk of PLAIN_CHUNK elements, each its own bytes
    e0, e1 = block * per, min((block + 1) * per, t.ne[0])
    start, end = e0 * tr.type_size, e1 * tr.type_size
    raw = bytes(row_bytes[start:end])
    vals: np.ndarray | list[float] = rows_float(r, t, np.array([row]), t.ne[0])[0, e0:e1] if can_read(t) else []
    byts = [BlockByte(f"{b:02x}", (k // tr.type_size) % 2, _("element {i}").format(i=e0 + k // tr.type_size))
            for k, b in enumerate(raw)]
    cells = [BlockCell(e0 + k, raw[k * tr.type_size:(k + 1) * tr.type_size].hex(" "),
                       fmt_float(v)) for k, v in enumerate(vals)]
    order = "little" if r.byte_order == "little" else "big"
    return BlockView(kind="plain", file_offset=t.data_offset + row * t.nb[1] + start,
                     row_offset=start, element_range=(e0, e1), bytes=byts, fields=[],
                     sub_scales=[], cells=cells, formula="",
                     note=_("{type} has no blocks: here are {n} elements at a time, each {bytes} bytes "
                            "({order}-endian).").format(type=t.type.name, n=per, bytes=tr.type_size, order=order),
                     **base)
