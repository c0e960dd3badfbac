"""The quantized dot product behind CPU MUL_MAT: weights of a quantized type times src1 rows
already converted to the weight type's vec_dot_type (Q8_0, Q8_1 or Q8_K).

Mirrors what `ggml_vec_dot_<wtype>_<vdt>` computes for every (weight row, activation row) pair:
per block, the integer dot product of the quants, times the fp16/f32 scales, summed over blocks.
`vec_dot_ref` spells that out for one pair of rows and the common types; `mul_mat_quant` computes
the same products for whole matrices at once. Because (dx*qx)*(dy*qy) summed over a block equals
dx*dy*sum(qx*qy), it multiplies the dequantized weights by the dequantized activations with one
float32 matmul per chunk of rows; only the float summation order differs from ggml (results agree
to about 1e-6 relative). Q8_1's `s` term is taken from its fp16 field, as ggml does.
Leaves out: the AVX2 accumulation order, the repacked (interleaved) weight layouts, llamafile sgemm.
"""

from __future__ import annotations

import numpy as np

from engine.quants.common import F32, get_scale_min_k4, h2f
from engine.core.types import GGMLType, traits

_CHUNK_BYTES = 4 << 20  # dequantize at most this many float32 bytes of weights at a time


def activation_values(vdt: int, act: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Activation rows of vdt blocks (n1, row_bytes) -> (d*q as float32 (n1, k), Q8_1's s per
    block (n1, k/32) or None)."""
    from engine.quants import QUANT_KINDS

    b = np.ascontiguousarray(act).reshape(-1).view(QUANT_KINDS[GGMLType(vdt)].dtype)
    blck = traits(vdt).blck_size
    d = b["d"].astype(F32) if vdt == GGMLType.Q8_K else h2f(b["d"])
    vals = np.multiply(b["qs"], d[:, None], dtype=F32).reshape(-1, k)
    s = h2f(b["s"]).reshape(len(vals), k // blck) if vdt == GGMLType.Q8_1 else None
    return vals, s


def mul_mat_quant(wtype: int, w: np.ndarray, act: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_<wtype>_<vec_dot_type> for all row pairs: (n1, n0) float32.

    w: uint8 (n0, row_size(wtype, k)); act: uint8 (n1, row_size(vec_dot_type, k)).
    Row i1 of the result holds the dot products of activation row i1 with every weight row.
    """
    vdt = _vec_dot_type(wtype)
    return mul_mat_values(wtype, w, *activation_values(vdt, act, k), k)


def mul_mat_values(wtype: int, w: np.ndarray, a: np.ndarray, s_y: np.ndarray | None,
                   k: int) -> np.ndarray:
    """mul_mat_quant with the activations already as `activation_values` gives them."""
    from engine.quants import QUANT_KINDS, dequantize

    wt = GGMLType(wtype)
    _vec_dot_type(wt)
    w = np.ascontiguousarray(w, np.uint8).reshape(-1, traits(wt).type_size * k
                                                   // traits(wt).blck_size)
    n0 = len(w)
    out = np.empty((len(a), n0), F32)
    rows = max(1, _CHUNK_BYTES // (4 * k))
    mins = wt in (GGMLType.Q4_1, GGMLType.Q5_1)  # the x*d + m types: sum(m_x * s_y) separately
    deq = QUANT_KINDS[wt].dequantize
    assert deq is not None  # (_vec_dot_type: a type with a vec_dot dequantizes)
    for r0 in range(0, n0, rows):
        chunk = w[r0: r0 + rows]
        if mins:
            assert s_y is not None  # their partner, Q8_1, carries s
            b = chunk.reshape(-1).view(QUANT_KINDS[wt].dtype)
            m_x = h2f(b["m"]).reshape(len(chunk), -1)  # (rows, nb)
            b = b.copy()
            b["m"] = 0
            wd = deq(b).reshape(len(chunk), k)
            out[:, r0: r0 + len(chunk)] = a @ wd.T + s_y @ m_x.T
        else:
            wd = dequantize(wt, chunk, chunk.size // traits(wt).type_size
                            * traits(wt).blck_size).reshape(len(chunk), k)
            out[:, r0: r0 + len(chunk)] = a @ wd.T
    return out


def _vec_dot_type(wtype: int) -> GGMLType:
    """The weight type's vec_dot_type, or ValueError if the CPU has no quantized vec_dot for it."""
    from engine.quants import QUANT_KINDS

    wt = GGMLType(wtype)
    vdt = traits(wt).vec_dot_type
    if vdt is None or wt not in QUANT_KINDS or QUANT_KINDS[wt].dequantize is None:
        raise ValueError(f"{traits(wt).type_name}: no quantized vec_dot on the CPU")
    return vdt


def vec_dot_ref(wtype: int, wrow: bytes | np.ndarray, arow: bytes | np.ndarray, k: int) -> float:
    """A readable scalar ggml_vec_dot_<wtype>_<vdt>_generic for Q4_0, Q8_0, Q4_K and Q6_K.

    Integer products per block (or sub-block), then the scales, summed block by block in float32.
    """
    from engine.quants import QUANT_KINDS

    wt = GGMLType(wtype)
    vdt = _vec_dot_type(wt)
    x = np.frombuffer(bytes(wrow), QUANT_KINDS[wt].dtype)
    y = np.frombuffer(bytes(arow), QUANT_KINDS[vdt].dtype)
    sumf = F32(0)
    for i in range(k // traits(wt).blck_size):
        xb, yb = x[i], y[i]
        qy = yb["qs"].astype(np.int32)
        if wt in (GGMLType.Q4_0, GGMLType.Q8_0):
            qx = (np.concatenate([xb["qs"] & 0xF, xb["qs"] >> 4]).astype(np.int32) - 8
                  if wt == GGMLType.Q4_0 else xb["qs"].astype(np.int32))
            sumi = int(np.dot(qx, qy))
            sumf += F32(sumi) * (h2f(xb["d"]) * h2f(yb["d"]))
        elif wt == GGMLType.Q4_K:
            sc, m = get_scale_min_k4(xb["scales"][None])
            q = xb["qs"].reshape(4, 1, 32)
            qx = np.concatenate([q & 0xF, q >> 4], axis=1).reshape(8, 32).astype(np.int32)
            sumi = int((sc[0].astype(np.int32) * (qx * qy.reshape(8, 32)).sum(axis=1)).sum())
            bsum = yb["bsums"].astype(np.int32).reshape(8, 2).sum(axis=1)
            summs = int((m[0].astype(np.int32) * bsum).sum())
            sumf += yb["d"] * h2f(xb["d"]) * F32(sumi) - yb["d"] * h2f(xb["dmin"]) * F32(summs)
        elif wt == GGMLType.Q6_K:
            ql = xb["ql"].reshape(2, 2, 32)
            lo = np.stack([ql[:, 0] & 0xF, ql[:, 1] & 0xF, ql[:, 0] >> 4, ql[:, 1] >> 4], 1)
            hi = (xb["qh"].reshape(2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, :, None]) & 3
            qx = ((lo | (hi << 4)).astype(np.int32) - 32).reshape(16, 16)
            sumi = int((xb["scales"].astype(np.int32) * (qx * qy.reshape(16, 16)).sum(axis=1)).sum())
            sumf += h2f(xb["d"]) * yb["d"] * F32(sumi)
        else:
            raise ValueError(f"vec_dot_ref: {traits(wt).type_name} is not spelled out here")
    return float(sumf)
