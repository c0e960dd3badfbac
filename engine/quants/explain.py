"""The block explainer: what each byte of one quantized block means, for the UI's block panel.

Also keeps readable scalar dequantizers (`dequantize_block_ref`) beside the vectorised ones, one
plain loop per type, written to be read next to `dequantize_row_<t>` in ggml-quants.c.
Leaves out: explaining the IQ grid indices beyond their raw integers.
"""

from __future__ import annotations

import numpy as np

from engine.quants.common import KVALUES_IQ4NL, KVALUES_MXFP4, h2f
from engine.types import GGMLType as T, traits

_FP16_FIELDS = {"d", "dmin", "m", "s"}


def _fp16(v: int) -> float:
    return float(h2f(np.array([v], np.uint16))[0])


def _quants(t: T, b: np.ndarray) -> list[int] | None:
    """Each element's integer quant, in element order, as the dequantizer reads it."""
    from engine.quants import kquants, legacy, ternary
    from engine.quants.common import unpack_2bit, unpack_nibbles

    b1 = b[None]
    if t in (T.Q4_0, T.Q4_1, T.IQ4_NL, T.MXFP4):
        q = unpack_nibbles(b1["qs"])
    elif t in (T.Q5_0, T.Q5_1):
        q = unpack_nibbles(b1["qs"]) | (legacy._qh_unpack(b1["qh"]) << 4)
    elif t in (T.Q8_0, T.Q8_1, T.Q8_K):
        q = b1["qs"]
    elif t == T.Q1_0:
        q = np.unpackbits(b1["qs"], axis=-1, bitorder="little")
    elif t == T.Q2_K:
        q = unpack_2bit(b1["qs"])
    elif t == T.Q3_K:
        hbit = (b1["hmask"][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
        q = unpack_2bit(b1["qs"]).astype(int) - np.where(hbit.reshape(1, 256), 0, 4)
    elif t == T.Q4_K:
        q = kquants._q4_nibbles(b1["qs"])
    elif t == T.Q5_K:
        q = kquants._q4_nibbles(b1["qs"]) + 16 * kquants._hbits(b1["qh"])
    elif t == T.Q6_K:
        ql = b1["ql"].reshape(-1, 2, 2, 32)
        lo = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)
        hi = (b1["qh"].reshape(-1, 2, 1, 32) >> kquants._SHIFT4) & 3
        q = (lo | (hi << 4)).astype(int) - 32
    elif t == T.IQ4_XS:
        q = unpack_nibbles(b1["qs"].reshape(-1, 8, 16))
    elif t == T.NVFP4:
        q = unpack_nibbles(b1["qs"].reshape(-1, 4, 8))
    elif t in (T.TQ1_0, T.TQ2_0):
        one = b1.copy()
        one["d"] = 0x3C00  # with d = 1.0 the dequantized values are the trits - 1
        deq = ternary.dequantize_tq1_0 if t == T.TQ1_0 else ternary.dequantize_tq2_0
        q = deq(one).astype(int)
    else:
        return None
    return [int(v) for v in np.asarray(q).reshape(-1)]


def _sub_scales(t: T, b: np.ndarray) -> dict[str, list]:
    """Per-sub-block scales (and mins) as the dequantizer decodes them."""
    from engine.quants import iq4, kquants

    b1 = b[None]
    if t == T.Q2_K:
        return {"sub_scales": [int(v & 0xF) for v in b["scales"]],
                "sub_mins": [int(v >> 4) for v in b["scales"]]}
    if t == T.Q3_K:
        return {"sub_scales": [int(v) for v in kquants.q3_k_scales(b1["scales"])[0]]}
    if t in (T.Q4_K, T.Q5_K):
        sc, m = kquants.get_scale_min_k4(b1["scales"])
        return {"sub_scales": sc[0].tolist(), "sub_mins": m[0].tolist()}
    if t == T.Q6_K:
        return {"sub_scales": b["scales"].tolist()}
    if t == T.IQ4_XS:
        return {"sub_scales": iq4.iq4_xs_scales(b1)[0].tolist()}
    if t == T.NVFP4:
        from engine.quants.fp4 import UE4M3_HALF
        return {"sub_scales": [float(UE4M3_HALF[v]) for v in b["d"]]}
    return {}


def explain_block(type_: int, row_bytes: bytes | np.ndarray, block_index: int) -> dict:
    """Describe block `block_index` of a row: byte range, each field's bytes, meaning and value,
    the decoded sub-block scales and quants, and the dequantized values."""
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
    b = block_raw.view(kind.dtype)[0]
    meaning = dict(kind.fields)
    fields = []
    for name in kind.dtype.names:
        sub, off = kind.dtype.fields[name][:2]
        val = b[name]
        if name in _FP16_FIELDS and sub.base == np.dtype("<u2"):
            value = _fp16(int(val))
        elif np.ndim(val):
            value = np.asarray(val).tolist()
        else:
            value = val.item()
        fields.append({"name": name, "offset": off, "size": sub.itemsize,
                       "hex": block_raw[off: off + sub.itemsize].tobytes().hex(" "),
                       "meaning": meaning.get(name, ""), "value": value})
    out = {"type": tr.type_name, "block_index": block_index,
           "byte_range": (start, start + tr.type_size),
           "element_range": (block_index * tr.blck_size, (block_index + 1) * tr.blck_size),
           "fields": fields, **_sub_scales(t, b)}
    q = _quants(t, b)
    if q is not None:
        out["quants"] = q
    if kind.dequantize is not None:
        with np.errstate(all="ignore"):
            out["values"] = kind.dequantize(block_raw.view(kind.dtype)).reshape(-1).tolist()
    return out


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
