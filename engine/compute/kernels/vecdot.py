"""ggml's CPU dot products, reproduced operation by operation (AVX2 build): F32, F16, and the
quantized Q4_0, Q5_0, Q8_0 (with Q8_0 activations), Q4_K and Q6_K (with Q8_K activations).

Each output of mul_mat is one `ggml_vec_dot_*` call, and these emulate that call's arithmetic for
whole tiles at once: the same lanes, the same fused multiply-adds, the same horizontal sums. Their
results equal real ggml's bit for bit (tested), where a BLAS product only agrees to rounding.
They cost more than BLAS, so mul_mat uses them for products up to EXACT_MACS multiply-adds with
rows of at most 1024 (F32, F16) or 4096 (quantized) elements; larger products use BLAS, within
rounding.

- ggml_vec_dot_f32: 4 accumulators of 8 lanes over steps of 32, fma per lane, reduced pairwise,
  then the leftover elements as gcc's code does them (vector products summed in order, the last
  few by fma).
- ggml_vec_dot_f16: the same lanes over halves widened to float (F16C); the leftovers each
  rounded to float and summed in double.
- ggml_vec_dot_q{4,5,8}_0_q8_0: per block, 8 lanes each summing 4 int8 products (exact
  integers), times d = d_x*d_y by fma into 8 lane accumulators; hsum_float_8 at the end.
- ggml_vec_dot_q4_K_q8_K, ggml_vec_dot_q6_K_q8_K: per super-block, 8 integer lanes of scaled
  products (and 4 lanes of mins for Q4_K), then the same fma and horizontal sums.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine import _lanes as _lanes_c
from engine.quants import QUANT_KINDS
from engine.quants.common import h2f
from engine.quants.kquants import get_scale_min_k4
from engine.types import GGMLType

F32, F64 = np.float32, np.float64
EXACT_MACS = 1 << 25  # mul_mats up to this many multiply-adds follow ggml's vec_dot exactly


def _hsum8(acc: np.ndarray) -> np.ndarray:
    """hsum_float_8: (hi + lo), then (r0 + r2) + (r1 + r3)."""
    r = acc[..., 4:] + acc[..., :4]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def vec_dot_f16(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16(K, w row, x row) for every pair: w (n0, K), x (n1, K) fp16 values
    (given as float32 or float16) -> (n1, n0).

    The F16C build widens each 8 halves to floats and runs the F32 loop (GGML_F32Cx8 = the F32
    lanes, fmas and reduction); the leftovers are added in double, each product rounded to float
    first: sumf += (ggml_float)(x[i]*y[i])."""
    return _float_dot(w, x, False)


def _float_dot(w: np.ndarray, x: np.ndarray, tiny: bool) -> np.ndarray:
    """engine._lanes.float_dot: every pair's product in C, (n1, n0) float32. Half weights whose
    rows are contiguous (a KV cache's view) go as they lie: C widens them, row stride and all."""
    x = np.ascontiguousarray(x, F32)
    n0, k = w.shape
    out = np.empty((x.shape[0], n0), F32)
    if w.dtype == np.float16 and n0 and w.strides[1] == 2 and w.strides[0] % 2 == 0 \
            and w.strides[0] >= 2 * k:
        ld = w.strides[0] // 2
        span = np.lib.stride_tricks.as_strided(w.view(np.uint16)[0], shape=((n0 - 1) * ld + k,),
                                               strides=(2,))
        _lanes_c.float_dot(span, x, out, n0, x.shape[0], k, tiny, ld)
        return out
    w = np.ascontiguousarray(w, F32)
    _lanes_c.float_dot(w, x, out, n0, x.shape[0], k, tiny)
    return out


def vec_dot_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32(K, w row, x row) for every pair: w (n0, K), x (n1, K) -> (n1, n0), in C
    (engine._lanes.dot_f32, without the GIL)."""
    w = np.ascontiguousarray(w, F32)
    x = np.ascontiguousarray(x, F32)
    (n0, k), n1 = w.shape, x.shape[0]
    out = np.empty((n1, n0), F32)
    _lanes_c.dot_f32(w, x, out, n0, n1, k)
    return out


def vec_dot_tinyblas(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """llamafile's tinyBLAS (AVX2, FMA) for every pair: w (n0, K), x (n1, K) float values (F32,
    or F16 widened), K a multiple of 8 -> (n1, n0). One 8-lane accumulator per output, an fma
    per 8 elements along K, then the same horizontal sum as hsum_float_8."""
    return _float_dot(w, x, True)


def vec_dot_f32_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 of each row of a with the same row of b (broadcast against each other,
    elements on the last axis): (..., K), (..., K) -> (...), in C."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    shape, k = a.shape[:-1], a.shape[-1]
    a2, b2 = (np.ascontiguousarray(v).reshape(-1, k) for v in (a, b))
    out = np.empty(a2.shape[0], F32)
    _lanes_c.dot_f32(a2, b2, out, a2.shape[0], a2.shape[0], k, True)
    return out.reshape(shape)


def _blocks(w: np.ndarray, type_, nb: int) -> np.ndarray:
    """Raw rows (n, row_bytes) as structured blocks (n, nb)."""
    return np.ascontiguousarray(w).reshape(-1).view(QUANT_KINDS[type_].dtype).reshape(-1, nb)


# --- quantized weights, prepared once per matrix ---------------------------------------------

@dataclass(frozen=True, slots=True)
class Prepared:
    """A quantized weight matrix in the form its exact dot product reads: for every block, the
    integer weights each of the kernel's 8 lanes multiplies, and the scales. Built once per
    matrix and kept in WEIGHTS, so decoding a token touches each weight once."""

    type: GGMLType
    values: np.ndarray  # (nb, 8, G, n0) int8 or int16: lane L of block b of row i0, G integers
    d: np.ndarray  # (nb, n0) float32: fp16(x.d) of each block, the rows last
    mins: np.ndarray | None = None  # Q4_K (nb, 4, 2, n0) six-bit mins; Q6_K (nb, 8, 2, n0) scales
    dmin: np.ndarray | None = None  # Q4_K (nb, n0) fp16(x.dmin)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.values, self.d, self.mins, self.dmin) if a is not None)


def _lanes(q: np.ndarray, dtype=np.int8) -> np.ndarray:
    """Signed or scaled integer weights (n0, nb, R, 8, 4) -- R runs of 32 bytes, lane L holding
    bytes 4L..4L+3 of each run -> (nb, 8, R·4, n0) integers, contiguous, the rows last."""
    n0, nb, r = q.shape[:3]
    return np.ascontiguousarray(q.transpose(1, 3, 2, 4, 0), dtype).reshape(nb, 8, r * 4, n0)


def _prepare_q8_0(w: np.ndarray, nb: int) -> Prepared:
    bw = _blocks(w, GGMLType.Q8_0, nb)
    return Prepared(GGMLType.Q8_0, _lanes(bw["qs"].reshape(len(bw), nb, 1, 8, 4)), _rows_last(h2f(bw["d"])))


def _prepare_q4_0(w: np.ndarray, nb: int) -> Prepared:
    """The nibbles (low ones are elements 0-15, high ones 16-31) minus 8 (bytes_from_nibbles_32,
    then _mm256_sub_epi8)."""
    bw = _blocks(w, GGMLType.Q4_0, nb)
    qs = bw["qs"]  # (n0, nb, 16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return Prepared(GGMLType.Q4_0, _lanes(q.reshape(len(bw), nb, 1, 8, 4)), _rows_last(h2f(bw["d"])))


def _prepare_q5_0(w: np.ndarray, nb: int) -> Prepared:
    """Each nibble or'ed with 0xF0 where its bit in qh is clear (bytes_from_bits_32, andnot):
    nibble + 16·bit - 16 as a signed byte."""
    bw = _blocks(w, GGMLType.Q5_0, nb)
    qs = bw["qs"]  # (n0, nb, 16)
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int16)
    qh = bw["qh"].view("<u4").reshape(qs.shape[:-1])  # (n0, nb)
    bits = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    q = nib + 16 * bits.astype(np.int16) - 16
    return Prepared(GGMLType.Q5_0, _lanes(q.reshape(len(bw), nb, 1, 8, 4)), _rows_last(h2f(bw["d"])))


def _prepare_q4_k(w: np.ndarray, nb: int) -> Prepared:
    """Sub-block 2j of each 64 in the low nibbles, 2j+1 in the high ones, each times its six-bit
    scale (get_scale_min_k4); the mins apart."""
    bw = _blocks(w, GGMLType.Q4_K, nb)
    n0 = len(bw)
    sc, mins = (a.reshape(n0, nb, 8) for a in get_scale_min_k4(bw["scales"].reshape(-1, 12)))
    qs = bw["qs"].reshape(n0, nb, 4, 32)
    q4 = np.stack([qs & 0x0F, qs >> 4], axis=3).astype(np.int16)  # (n0, nb, j, half, 32)
    q4 *= sc.reshape(n0, nb, 4, 2, 1).astype(np.int16)
    m = np.ascontiguousarray(mins.reshape(n0, nb, 4, 2).transpose(1, 2, 3, 0), np.int16)
    return Prepared(GGMLType.Q4_K, _lanes(q4.reshape(n0, nb, 8, 8, 4), np.int16), _rows_last(h2f(bw["d"])),
                    m, _rows_last(h2f(bw["dmin"])))


def _prepare_q6_k(w: np.ndarray, nb: int) -> Prepared:
    """The unsigned 6-bit values (0..63) times the int8 scale of their 16; the offset of 32
    is taken off afterwards through the scales and the activations' block sums."""
    bw = _blocks(w, GGMLType.Q6_K, nb)
    n0 = len(bw)
    ql = bw["ql"].reshape(n0, nb, 2, 2, 32)  # (half j, run of 32 bytes, byte)
    qh = bw["qh"].reshape(n0, nb, 2, 32)
    q = np.empty((n0, nb, 2, 4, 32), np.int16)  # elements 128j + 32r + t
    q[:, :, :, 0] = (ql[:, :, :, 0] & 0x0F) | ((qh & 0x03) << 4)
    q[:, :, :, 1] = (ql[:, :, :, 1] & 0x0F) | ((qh & 0x0C) << 2)
    q[:, :, :, 2] = (ql[:, :, :, 0] >> 4) | (qh & 0x30)
    q[:, :, :, 3] = (ql[:, :, :, 1] >> 4) | ((qh & 0xC0) >> 2)
    sc = bw["scales"].astype(np.int16).reshape(n0, nb, 16)
    q = q.reshape(n0, nb, 16, 16) * sc[..., None]
    scp = np.ascontiguousarray(bw["scales"].reshape(n0, nb, 8, 2).transpose(1, 2, 3, 0), np.int16)
    return Prepared(GGMLType.Q6_K, _lanes(q.reshape(n0, nb, 8, 8, 4), np.int16), _rows_last(h2f(bw["d"])),
                    scp)  # scales (nb, 8, 2, n0)


PREPARE = {GGMLType.Q4_0: (32, _prepare_q4_0), GGMLType.Q5_0: (32, _prepare_q5_0),
           GGMLType.Q8_0: (32, _prepare_q8_0), GGMLType.Q4_K: (256, _prepare_q4_k),
           GGMLType.Q6_K: (256, _prepare_q6_k)}


class WeightCache:
    """Prepared weight matrices by where their bytes are, each checked against a copy of the
    bytes it was built from on every use (a changed weight is prepared again), least recently
    used first out past `budget` bytes. Shared by the compute threads (one builds, the others
    wait for it)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[tuple, tuple[np.ndarray, Prepared]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, type_: GGMLType, raw: np.ndarray, k: int) -> Prepared:
        """The prepared form of raw weight rows (n0, row_bytes) of type_ (rows of k elements)."""
        key = (int(type_), raw.__array_interface__["data"][0], raw.shape, raw.strides, k)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and _same_bytes(hit[0], raw):
                self._entries.move_to_end(key)
                return hit[1]
            block, prepare = PREPARE[type_]
            prepared = prepare(raw, k // block)
            self._entries[key] = (np.ascontiguousarray(raw).copy(), prepared)
            used = sum(r.nbytes + p.nbytes for r, p in self._entries.values())
            while used > self.budget and len(self._entries) > 1:
                _, (r, p) = self._entries.popitem(last=False)
                used -= r.nbytes + p.nbytes
            return prepared


WEIGHTS = WeightCache(budget=4 << 30)


def _rows_last(a: np.ndarray) -> np.ndarray:
    """(n0, nb) per-block values as (nb, n0): a block's scales of all rows side by side."""
    return np.ascontiguousarray(a.T)


def _same_bytes(kept: np.ndarray, raw: np.ndarray) -> bool:
    """Whether raw rows hold the bytes kept (a memcmp: the weights are compared on every use)."""
    if kept.shape != raw.shape:
        return False
    return _lanes_c.same(kept, raw if raw.flags.c_contiguous else np.ascontiguousarray(raw))


def vec_dot_prepared(p: Prepared, x: np.ndarray, k: int, rows: slice | None = None) -> np.ndarray:
    """ggml's AVX2 vec_dot of prepared weight rows `rows` (all by default) with every raw
    activation row -> (n1, rows).

    Legacy types (ggml_vec_dot_q{4,5,8}_0_q8_0): lane L of each block of 32 sums the products of
    elements 4L..4L+3 (maddubs, then madd); acc = fma(x.d·y.d, lanes, acc) per block.
    Q4_K (ggml_vec_dot_q4_K_q8_K): lane L of a super-block sums bytes 4L..4L+3 of each of its 8
    runs of 32, times the runs' scales; acc = fma(y.d·x.d, lanes, acc); the mins go through 4
    lanes, acc_m = fma(-y.d·x.dmin, Σ min·(q8 sums), acc_m), added as (m0 + m2) + (m1 + m3).
    Q6_K (ggml_vec_dot_q6_K_q8_K): the same lanes of sc·q (q unsigned), minus
    32·(bsums[2L]·sc[2L] + bsums[2L+1]·sc[2L+1]).
    The result is hsum_float_8(acc) (+ the mins). The lane sums are exact 32-bit integers, each
    turned into a float and accumulated by fmaf, block after block: the loop over blocks, lanes
    and rows runs in engine._lanes (C, without the GIL), the rest here.
    """
    nb, _, g, n0 = p.values.shape
    j0, j1 = (0, n0) if rows is None else (rows.start, min(rows.stop, n0))
    m = j1 - j0
    vdt = GGMLType.Q8_K if p.type in (GGMLType.Q4_K, GGMLType.Q6_K) else GGMLType.Q8_0
    bx = _blocks(x, vdt, nb)
    n1, r = len(bx), g // 4
    qx = np.ascontiguousarray(bx["qs"].reshape(n1, nb, r, 8, 4).transpose(0, 1, 3, 2, 4), np.int16)
    qx = qx.reshape(n1, nb, 8, g)
    yd = h2f(bx["d"]) if vdt == GGMLType.Q8_0 else bx["d"].astype(F32)  # (n1, nb)
    xd = p.d[:, j0:j1]  # (nb, m)
    wsize = p.values.dtype.itemsize
    out = np.empty((n1, m), F32)
    for i in range(n1):
        scale = yd[i][:, None] * xd  # float32 products of the scales, (nb, m)
        cw = cx = None
        if p.type == GGMLType.Q6_K:  # minus 32·Σ bsums·scales per lane
            cw, cx = p.mins, np.ascontiguousarray(bx["bsums"][i].reshape(nb, 8, 2))
        acc = np.zeros((8, m), F32)
        _lanes_c.lanes_fma(p.values, qx[i], cw, cx, -32, scale, acc, nb, 8, n0, g, 2, j0, j1,
                           wsize)
        out[i] = _hsum8(acc.T)
        if p.type == GGMLType.Q4_K:
            q8s = bx["bsums"][i].reshape(nb, 4, 2, 2).sum(axis=-1, dtype=np.int16)  # hadd_epi16
            mscale = -yd[i][:, None] * p.dmin[:, j0:j1]  # -y.d * x.dmin, (nb, m)
            acc_m = np.zeros((4, m), F32)
            _lanes_c.lanes_fma(p.mins, np.ascontiguousarray(q8s), None, None, 0, mscale, acc_m,
                               nb, 4, n0, 2, 0, j0, j1, 2)
            out[i] += (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3])
    return out
