"""The bytes panel: the selected tensor's object header and struct with each field named, or the
first bytes at its data pointer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from markupsafe import Markup, escape

from app.i18n import _
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, OBJECT, TENSOR, field_spans
from app.views.debugger.repacked import layout_in_buffer
from app.views.debugger.values import unreadable
from engine.core.tensor import Tensor, ggml_nbytes
from engine.core.tensor_data import to_numpy
from engine.trace import Step
from engine.core.types import TYPE_TRAITS

DATA_BYTES = 512  # bytes of data shown at most


@dataclass(frozen=True, slots=True)
class HexRow:
    offset: int
    cells: Markup  # a span per byte, titled with its field (hundreds a page: made here, not in Jinja)


@dataclass(frozen=True, slots=True)
class FieldValue:
    name: str
    offset: int  # in the pool
    size: int
    value: str


@dataclass(frozen=True, slots=True)
class HexView:
    title: str
    rows: list[HexRow]
    legend: list[FieldValue]
    error: str = ""  # the data's ne and nb reach outside its memory: what the engine refused


def hexview(step: Step, t: Tensor | None, what: str = "struct") -> HexView | None:
    """Bytes of the selected tensor, each byte named: its object header and struct (fields), or
    the first DATA_BYTES bytes at its data pointer (elements, or blocks of a quantized type)."""
    if t is None:
        return None
    names: dict[int, str] = {}
    legend, error = [], ""
    if what == "data" and t.data is not None:
        try:
            to_numpy(t)  # (a view, no copy: are all the tensor's bytes in its memory?)
        except ValueError as e:
            error = unreadable(e)
        try:
            ctx, start = t.ctx.space.resolve(t.data)
        except ValueError:
            return HexView(_("'{name}' data").format(name=t.name), [], [], error)
        tr = TYPE_TRAITS[t.type]
        raw = ctx.pool[start:start + min(ggml_nbytes(t), DATA_BYTES)]  # (those that are there)
        unit = _("block") if tr.blck_size > 1 else _("element")
        size = tr.type_size
        layout = layout_in_buffer(t)
        if layout is not None:  # CPU_REPACK: blocks of `rows` rows interleaved
            unit, size = _("interleaved block"), layout.rows * tr.type_size
        for i in range(raw.size):
            names[i] = f"{unit} {i // size}"  # in memory order, from the data pointer
        title = ((_("'{name}' data at pool offset {offset} in context {ctx}: {size}-byte blocks in memory order")
                  if tr.blck_size > 1 else
                  _("'{name}' data at pool offset {offset} in context {ctx}: {size}-byte elements in memory order"))
                 .format(name=t.name, offset=f"{start:#x}", ctx=ctx.id, size=size)
                 + (_(" (first {n} bytes)").format(n=DATA_BYTES) if ggml_nbytes(t) > DATA_BYTES else ""))
    else:
        ctx, start = t.ctx, t.offs - GGML_OBJECT_SIZE
        raw = ctx.pool[start:t.offs + GGML_TENSOR_SIZE]
        rec_obj = raw[:GGML_OBJECT_SIZE].view(OBJECT)[0]
        rec = raw[GGML_OBJECT_SIZE:].view(TENSOR)[0]
        for base, dtype, r, prefix in ((0, OBJECT, rec_obj, "object."),
                                       (GGML_OBJECT_SIZE, TENSOR, rec, "")):
            for span in field_spans(dtype):
                for i in range(span.size):
                    names[base + span.offset + i] = prefix + span.name
                legend.append(FieldValue(prefix + span.name, start + base + span.offset,
                                         span.size, _field_value(r[span.name], span.pointer)))
        title = _("'{name}' at pool offset {offset}: {object}-byte ggml_object, then the {tensor}-byte "
                  "ggml_tensor").format(name=t.name, offset=f"{start:#x}", object=GGML_OBJECT_SIZE,
                                        tensor=GGML_TENSOR_SIZE)
    changed: set[int] = set()
    for p in step.patches:
        if p.ctx == ctx.id:
            changed.update(range(max(p.offset, start), min(p.end, start + raw.size)))
    padding = escape(_("padding"))
    cells = []
    for i, byte in enumerate(raw.tolist()):
        f = names.get(i)
        cls = "hb" + (" ff" if f is not None and names.get(i - 1) != f else "") + (
            " changed" if start + i in changed else "")
        field = escape(f or "")
        cells.append(f'<span class="{cls}" title="{field or padding}" data-field="{field}">{byte:02x}</span>')
    rows = [HexRow(start + r0, Markup("".join(cells[r0:r0 + 16]))) for r0 in range(0, raw.size, 16)]
    return HexView(title, rows, legend, error)


def _field_value(v, pointer: bool) -> str:
    if isinstance(v, bytes):
        return repr(v.split(b"\0", 1)[0].decode("utf-8", "replace"))
    if isinstance(v, np.ndarray):
        vals = [int(x) for x in v.ravel()]
        if pointer:
            return "{" + ", ".join(f"{x:#x}" if x else "NULL" for x in vals) + "}"
        return "{" + ", ".join(str(x) for x in vals) + "}"
    x = int(v)
    return (f"{x:#x}" if x else "NULL") if pointer else str(x)
