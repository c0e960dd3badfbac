"""The block explainer: what each byte of one quantized block means, for the UI's block panel.

Also keeps readable scalar dequantizers (`dequantize_block_ref`) beside the vectorised ones, one
plain loop per type, written to be read next to `dequantize_row_<t>` in ggml-quants.c.
Leaves out: explaining the IQ grid indices beyond their raw integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.quants.common import KVALUES_IQ4NL, KVALUES_MXFP4, SubScales, h2f
from engine.core.types import GGMLType as T, traits

_FP16_FIELDS = {"d", "dmin", "m", "s"}


def _fp16(v: int) -> float:
    return float(h2f(np.array([v], np.uint16))[0])


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
    for name in kind.dtype.names:
        sub, off = kind.dtype.fields[name][:2]
        val = b[0][name]
        if name in _FP16_FIELDS and sub.base == np.dtype("<u2"):
            value = _fp16(int(val))
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

def _nib(b: np.void, j: int) -> int:
    """Element j of a 32-element nibble block: low nibble of qs[j] for j < 16, else high of qs[j-16]."""
    return (int(b["qs"][j % 16]) >> (4 * (j // 16))) & 0xF


def dequantize_block_ref(type_: int, block_bytes: bytes) -> list[float]:
    """One block, one element at a time, as dequantize_row_<type> writes it (float32 math)."""
    from engine.quants import QUANT_KINDS

    t = T(type_)
    b = np.frombuffer(bytes(block_bytes), QUANT_KINDS[t].dtype)[0]
    f = np.float32
    y: list[np.float32] = []
    if t == T.Q4_0:
        d = f(_fp16(b["d"]))
        y = [f(_nib(b, j) - 8) * d for j in range(32)]
    elif t == T.Q4_1:
        d, m = f(_fp16(b["d"])), f(_fp16(b["m"]))
        y = [f(_nib(b, j)) * d + m for j in range(32)]
    elif t == T.Q5_0:
        d = f(_fp16(b["d"]))
        qh = int.from_bytes(bytes(b["qh"]), "little")
        for j in range(32):
            q = _nib(b, j) | (((qh >> j) & 1) << 4)
            y.append(f(q - 16) * d)
    elif t == T.Q8_0:
        d = f(_fp16(b["d"]))
        y = [f(q) * d for q in b["qs"]]
    elif t == T.IQ4_NL:
        d = f(_fp16(b["d"]))
        y = [d * f(KVALUES_IQ4NL[_nib(b, j)]) for j in range(32)]
    elif t == T.MXFP4:
        e = int(b["e"])
        d = np.array([0x00200000 << e if e < 2 else (e - 1) << 23], np.uint32).view(f)[0]
        y = [f(KVALUES_MXFP4[_nib(b, j)]) * d for j in range(32)]
    elif t == T.TQ2_0:
        d = f(_fp16(b["d"]))
        for j in (0, 32):  # two groups of 32 bytes, each holding 4 x 32 elements
            for n in range(4):
                y += [f(int((b["qs"][j + m] >> (2 * n)) & 3) - 1) * d for m in range(32)]
    elif t == T.Q2_K:
        d, dmin = f(_fp16(b["d"])), f(_fp16(b["dmin"]))
        for e in range(256):
            c, r = divmod(e, 128)  # 128-chunk, then 4 shifts of 32 = 2 sub-blocks of 16
            shift, l = divmod(r, 32)
            sc = int(b["scales"][e // 16])
            q = (int(b["qs"][32 * c + l]) >> (2 * shift)) & 3
            y.append(d * f(sc & 0xF) * f(q) - dmin * f(sc >> 4))
    elif t == T.Q4_K:
        d, dmin = f(_fp16(b["d"])), f(_fp16(b["dmin"]))
        s = [int(v) for v in b["scales"]]
        for e in range(256):
            j = e // 32  # sub-block; get_scale_min_k4(j)
            sc = s[j] & 63 if j < 4 else (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)
            m = s[j + 4] & 63 if j < 4 else (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
            byte = int(b["qs"][32 * (e // 64) + e % 32])
            q = byte & 0xF if (e // 32) % 2 == 0 else byte >> 4
            y.append(d * f(sc) * f(q) - dmin * f(m))
    elif t == T.Q6_K:
        d = f(_fp16(b["d"]))
        for e in range(256):
            c, r = divmod(e, 128)
            k, l = divmod(r, 32)  # quarter k of the chunk: ql low/high nibble, qh bits 2k
            ql = int(b["ql"][64 * c + l + 32 * (k % 2)])
            low = ql & 0xF if k < 2 else ql >> 4
            high = (int(b["qh"][32 * c + l]) >> (2 * k)) & 3
            y.append(d * f(int(b["scales"][e // 16])) * f((low | high << 4) - 32))
    else:
        raise ValueError(f"dequantize_block_ref: no scalar reference for {traits(t).type_name}")
    return [float(v) for v in y]
