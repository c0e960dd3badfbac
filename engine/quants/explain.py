"""The block explainer: what each byte of one quantized block means, for the UI's block panel.

Also runs the readable scalar dequantizers (`dequantize_block_ref`: each type's
QuantKind.dequantize_ref, one plain loop written to be read next to `dequantize_row_<t>` in
ggml-quants.c, kept in its family's module beside the vectorised one).
Leaves out: explaining the IQ grid indices beyond their raw integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.layout import struct_fields
from engine.quants.common import SubScales, fp16_value
from engine.core.types import GGMLType as T, traits

_FP16_FIELDS = {"d", "dmin", "m", "s"}


@dataclass(frozen=True, slots=True)
class BlockField:
    """One field of a block struct (ggml-common.h), its bytes and what they decode to."""

    name: str  # "d", "qs"
    offset: int  # from the block's start
    size: int  # bytes
    hex: str  # its bytes, "01 02 ..."
    meaning: str
    value: Any  # a float for fp16 scales, an int, or a (nested) list for arrays


@dataclass(frozen=True, slots=True)
class BlockExplanation:
    """What each byte of one quantized block means and the values it holds."""

    type: str  # the type's name
    block_index: int
    byte_range: tuple[int, int]  # within the row
    element_range: tuple[int, int]  # within the row
    fields: tuple[BlockField, ...]
    formula: str  # how the values come from the fields, "" where the type has none written
    sub_scales: SubScales | None  # decoded sub-block scales (super-block types)
    quants: tuple[int, ...] | None  # each element's integer quant, None where not unpacked
    values: tuple[float, ...] | None  # the dequantized values, None without a dequantizer


def explain_block(type_: int, row_bytes: bytes | np.ndarray, block_index: int) -> BlockExplanation:
    """Describe block `block_index` of a row: byte range, each field's bytes, meaning and value,
    the decoded sub-block scales and quants (as the type's QuantKind unpacks them), and the
    dequantized values."""
    from engine.quants import QUANT_KINDS

    t = T(type_)
    tr = traits(t)
    kind = QUANT_KINDS[t]
    raw = np.frombuffer(bytes(row_bytes), np.uint8)
    nblocks = raw.size // tr.type_size
    if not 0 <= block_index < nblocks:
        raise ValueError(f"{tr.type_name}: block {block_index} is outside the row's {nblocks} blocks")
    start = block_index * tr.type_size
    block_raw = raw[start: start + tr.type_size]
    b = block_raw.view(kind.dtype)  # (1,)
    meaning = dict(kind.fields)
    fields = []
    for name, (sub, off) in struct_fields(kind.dtype).items():
        val = b[0][name]
        if name in _FP16_FIELDS and sub.base == np.dtype("<u2"):
            value = fp16_value(int(val))
        elif np.ndim(val):
            value = np.asarray(val).tolist()
        else:
            value = val.item()
        fields.append(BlockField(name, off, sub.itemsize,
                                 block_raw[off: off + sub.itemsize].tobytes().hex(" "),
                                 meaning.get(name, ""), value))
    values = None
    if kind.dequantize is not None:
        with np.errstate(all="ignore"):
            values = tuple(kind.dequantize(b).reshape(-1).tolist())
    return BlockExplanation(
        tr.type_name, block_index, (start, start + tr.type_size),
        (block_index * tr.blck_size, (block_index + 1) * tr.blck_size), tuple(fields),
        kind.formula, kind.sub_scales(b) if kind.sub_scales else None,
        tuple(int(v) for v in np.asarray(kind.unpack(b)).reshape(-1)) if kind.unpack else None,
        values)


# --- readable scalar dequantizers ---------------------------------------------------------------

def dequantize_block_ref(type_: int, block_bytes: bytes) -> list[float]:
    """One block, one element at a time, as dequantize_row_<type> writes it (float32 math): the
    type's QuantKind.dequantize_ref, beside its vectorised dequantizer in its family's module."""
    from engine.quants import QUANT_KINDS

    kind = QUANT_KINDS.get(T(type_))
    if kind is None or kind.dequantize_ref is None:
        raise ValueError(f"dequantize_block_ref: no scalar reference for {traits(type_).type_name}")
    b = np.frombuffer(bytes(block_bytes), kind.dtype)[0]
    return [float(v) for v in kind.dequantize_ref(b)]
