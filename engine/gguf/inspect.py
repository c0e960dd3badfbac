"""The `ggml-lens inspect FILE` report: header, keys, tensors, per-layer totals, byte map.

Mirrors nothing in ggml itself; it shows what gguf_init_from_file reads (the same numbers the
gguf.h getters return) plus where each item lies in the file, in the spirit of gguf-py's
`gguf-dump`. Long arrays are shortened to their first elements and their length.
Leaves out: tensor values (the web UI shows blocks and values on demand).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from engine.core.infos import layer_of

from .format import TYPE_NAME, GGUFValueType
from .reader import KV, GGUFReader, Span, StringArray, TensorInfo

SHOW_ITEMS = 8  # elements of a long array kept in a report
SHOW_CHARS = 80  # characters of a long string kept in the text report


def inspect_json(reader: GGUFReader) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-ready data."""
    r = reader
    tensors = [_tensor_json(t) for t in r.tensors]
    return {
        "file": r.path,
        "size": r.size,
        "header": {"magic": "GGUF", "version": r.version, "byte_order": r.byte_order,
                   "n_tensors": r.n_tensors, "n_kv": r.n_kv, "alignment": r.alignment,
                   "data_offset": r.data_offset, "data_size": r.data_size},
        "kv": [_kv_json(kv) for kv in r.kvs],
        "tensors": tensors,
        "layers": layer_totals(r.tensors),
        "totals": _totals("all tensors", r.tensors),
        "byte_map": [{"kind": s.kind, "label": s.label, "offset": s.offset, "size": s.size}
                     for s in r.byte_map()],
    }


def inspect_text(reader: GGUFReader, show_kv: bool = True, show_tensors: bool = True) -> str:
    """The report as aligned text for a terminal."""
    r = reader
    out = [f"{r.path or '<bytes>'}: GGUF v{r.version} ({r.byte_order}-endian), {r.size:,} bytes",
           f"  {r.n_kv} keys, {r.n_tensors} tensors, alignment {r.alignment}, data section at "
           f"byte {r.data_offset:,} ({r.data_size:,} bytes)", "", "byte map:"]
    out += _table(("offset", "size", "region"),
                  [(f"{s.offset:,}", f"{s.size:,}", s.label) for s in _grouped(r.byte_map())],
                  right=(0, 1))
    if show_kv:
        out += ["", f"key-value pairs ({r.n_kv}):"]
        out += _table(("#", "offset", "key", "type", "value"),
                      [(str(kv.index), f"{kv.span.offset:,}", kv.key, _type_text(kv),
                        _value_text(kv)) for kv in r.kvs], right=(0, 1))
    if show_tensors:
        out += ["", f"tensors ({r.n_tensors}):"]
        out += _table(("#", "name", "type", "shape", "data at", "bytes", "bpw"),
                      [(str(t.index), t.name, t.type.name, _shape(t.shape),
                        f"{t.data_offset:,}", f"{t.nbytes:,}", _bpw(t.nbytes, t.n_elements))
                       for t in r.tensors], right=(0, 4, 5, 6))
        out += ["", "by layer:"]
        rows = layer_totals(r.tensors) + [_totals("total", r.tensors)]
        out += _table(("layer", "tensors", "elements", "bytes", "bpw"),
                      [(g["layer"], str(g["n_tensors"]), f"{g['n_elements']:,}",
                        f"{g['nbytes']:,}", _bpw(g["nbytes"], g["n_elements"])) for g in rows],
                      right=(1, 2, 3, 4))
    return "\n".join(out) + "\n"


def layer_totals(tensors: Iterable[TensorInfo]) -> list[dict[str, Any]]:
    """Tensor counts, elements and bytes per `blk.N` layer (in N order), then the rest."""
    groups: dict[int | None, list[TensorInfo]] = {}
    for t in tensors:
        groups.setdefault(layer_of(t.name), []).append(t)
    rows = [_totals(f"blk.{n}", groups[n]) for n in sorted(n for n in groups if n is not None)]
    if None in groups:
        rows.append(_totals("(not in a layer)", groups[None]))
    return rows


def _totals(label: str, tensors: Iterable[TensorInfo]) -> dict[str, Any]:
    tensors = list(tensors)
    n_el = sum(t.n_elements for t in tensors)
    nbytes = sum(t.nbytes for t in tensors)
    return {"layer": label, "n_tensors": len(tensors), "n_elements": n_el, "nbytes": nbytes,
            "bpw": _bpw_value(nbytes, n_el)}


def _tensor_json(t: TensorInfo) -> dict[str, Any]:
    return {"index": t.index, "name": t.name, "type": t.type.name, "type_id": int(t.type),
            "n_dims": t.n_dims, "shape": list(t.shape), "ne": list(t.ne),
            "n_elements": t.n_elements, "offset": t.offset, "data_offset": t.data_offset,
            "nbytes": t.nbytes, "bpw": _bpw_value(t.nbytes, t.n_elements),
            "info_offset": t.span.offset, "info_size": t.span.size}


def _kv_json(kv: KV) -> dict[str, Any]:
    value, shortened = kv.value, False
    if kv.arr_type is not None:
        shortened = kv.n > SHOW_ITEMS * 2
        value = _plain(value[:SHOW_ITEMS] if shortened else value)
    else:
        value = _plain(value)
    return {"index": kv.index, "key": kv.key, "type": TYPE_NAME[kv.type],
            "arr_type": None if kv.arr_type is None else TYPE_NAME[kv.arr_type], "n": kv.n,
            "value": value, "shortened": shortened, "offset": kv.span.offset,
            "size": kv.span.size,
            "fields": [{"kind": f.kind, "offset": f.offset, "size": f.size}
                       for f in kv.span.children]}


def _plain(v: Any) -> Any:
    """A JSON-ready copy: numpy to python, non-finite floats as strings."""
    if isinstance(v, (np.ndarray, StringArray)):
        v = list(v) if isinstance(v, StringArray) else v.tolist()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _type_text(kv: KV) -> str:
    return f"arr[{TYPE_NAME[kv.arr_type]}]" if kv.arr_type is not None else TYPE_NAME[kv.type]


def _value_text(kv: KV) -> str:
    f32 = kv.value_type == GGUFValueType.FLOAT32  # shown as float32 prints: 1e-05, not 9.99e-06
    if kv.arr_type is None:
        return _scalar_text(np.float32(kv.value) if f32 else kv.value)
    head = kv.value[:SHOW_ITEMS] if kv.n > SHOW_ITEMS else kv.value
    items = ", ".join(_scalar_text(np.float32(x) if f32 else x, 24) for x in _plain(head))
    return f"[{items}{', ...' if kv.n > SHOW_ITEMS else ''}] (n={kv.n})"


def _scalar_text(v: Any, limit: int = SHOW_CHARS) -> str:
    if isinstance(v, str):
        raw = v.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        shown = raw.encode("unicode_escape").decode("ascii") if not raw.isprintable() else raw
        return repr(shown if len(shown) <= limit else shown[:limit] + "…")
    return str(v)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(x) for x in shape) + "]"


def _bpw_value(nbytes: int, n_elements: int) -> float | None:
    return round(nbytes * 8 / n_elements, 4) if n_elements else None


def _bpw(nbytes: int, n_elements: int) -> str:
    v = _bpw_value(nbytes, n_elements)
    return "-" if v is None else f"{v:.2f}"


def _grouped(spans: list[Span]) -> list[Span]:
    """The byte map with runs of kv pairs, tensor infos and tensor data folded into one line."""
    names = {"kv": "key-value pairs", "tensor_info": "tensor infos",
             "tensor_data": "tensor data", "tensor_padding": "tensor data"}
    out: list[Span] = []
    for s in spans:
        kind = "tensor_data" if s.kind == "tensor_padding" else s.kind
        if out and kind in names and out[-1].kind == kind:
            last = out[-1]
            count = int(last.label.rsplit("(", 1)[1].rstrip(")")) + (s.kind != "tensor_padding")
            out[-1] = Span(kind, f"{names[kind]} ({count})", last.offset, s.end - last.offset)
        elif kind in names:
            out.append(Span(kind, f"{names[kind]} (1)", s.offset, s.size))
        else:
            out.append(s)
    return out


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]], right: tuple[int, ...] = ()
           ) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]

    def line(cells: tuple[str, ...]) -> str:
        return "  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(head)] + [line(r) for r in rows]
