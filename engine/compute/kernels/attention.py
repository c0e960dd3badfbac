"""FLASH_ATTN_EXT: attention in one op, with ggml's three CPU paths (ggml-cpu/ops.cpp).

For every query row (iq1, head iq2, batch iq3), with K/V head iq2 / (n_head / n_head_kv) (GQA):

    s_ic = scale·(K[ic]·q) + slope·mask[iq1, ic]
           (softcap != 0: softcap·tanh(scale·(K[ic]·q)/softcap) + slope·mask[iq1, ic])
    out  = Σ_ic exp(s_ic - M)·V[ic] / (Σ_ic exp(s_ic - M) (+ exp(sink - M)))

written to dst[:, iq2, iq1, iq3] (heads and tokens swapped). Masked (-inf) positions are skipped.

* one_chunk (the reference path): q is converted to K's vec_dot type (fp16 for F16 K) and the
  softmax runs online over ic. With F16 V the accumulator itself is fp16: every rescale and every
  V·weight multiply-add is rounded to fp16, which this kernel reproduces step by step.
* tiled (F32 q, F32/F16 K = V type, >= 64 query rows, DV a multiple of 8): K and V widened to f32,
  q kept f32, softmax per 64-wide KV tile; here computed as one f32 softmax (same values up to
  the order of float additions).
* split-KV (one query row, one batch, >= 512 KV, F32/F16 K = V type): thread ith takes KV chunk
  ith for every head and leaves (M, S, VKQ) partials; after a barrier the threads take heads in
  turn and merge the chunks.

Rows are handed out in chunks from a shared counter, 4 per thread (none with 1 thread), as ggml
does; `params.use_ref` forces one_chunk. Leaves out: quantized K/V.

Numerics: expf and tanhf are the C library's (engine.libm), the fp16 roundings and the online
softmax ggml's own, emulated with IEEE operations; but KQ and VKQ are float64 BLAS products
rounded to float, so results agree with ggml to rounding and their last bits depend on the CPU's
BLAS kernel (registered with blas=True).
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.compute.kernels import all_threads, kernel, not_supported
from engine.compute.kernels.common import row_blocks, to_f32, view4
from engine.compute.kernels.nn_util import alibi_slopes, expf, fmaf, fp16_round, tanhf
from engine.compute.shares import Chunk, Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.ops.matmul import GGML_PREC_DEFAULT, GGML_PREC_F32
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor
from engine.core.types import GGMLType, TYPE_TRAITS

F32, F64 = np.float32, np.float64
Q_TILE, KV_TILE = 64, 64
F32_EPR = 8  # AVX2 lanes: the tiled path needs DV % 8 == 0
SPLIT_KV_MIN = 512
FN = "ggml_compute_forward_flash_attn_ext_f16"


class _Setup:
    """What every row needs: views, broadcast factors, scale, softcap and per-head slopes."""

    def __init__(self, dst: Tensor) -> None:
        q, k, v, mask, sinks = (dst.src[i] for i in range(5))
        self.q4, self.k4, self.v4 = view4(q), view4(k), view4(v)
        self.k_type, self.v_type = k.type, v.type
        self.neq1, self.neq2 = int(q.ne[1]), int(q.ne[2])
        self.rk2, self.rk3 = int(q.ne[2]) // int(k.ne[2]), int(q.ne[3]) // int(k.ne[3])
        self.rv2, self.rv3 = int(q.ne[2]) // int(v.ne[2]), int(q.ne[3]) // int(v.ne[3])
        scale, max_bias, softcap = (F32(x) for x in dst.op_params.view(np.float32)[:3])
        if softcap != 0:
            scale = scale / softcap
        self.scale, self.softcap = scale, softcap
        self.slopes = alibi_slopes(self.neq2, max_bias)
        self.mask4 = view4(mask) if mask is not None else None
        self.sinks = view4(sinks)[0, 0, 0].astype(F32) if sinks is not None else None
        self.d4 = view4(dst)

    def scores(self, iq3: int, iq2: int, a: int, b: int, ic0: int, ic1: int,
               vec_dot: bool) -> tuple[np.ndarray, np.ndarray]:
        """KQ values s (rows [a, b) x KV [ic0, ic1)) with mask and softcap, and the skip mask."""
        q = self.q4[iq3, iq2, a:b].astype(F32)
        k = to_f32(self.k4[iq3 // self.rk3, iq2 // self.rk2, ic0:ic1], self.k_type)
        if vec_dot and self.k_type == GGMLType.F16:
            q = fp16_round(q)  # one_chunk converts q to K's vec_dot type
        s = (q.astype(F64) @ k.astype(F64).T).astype(F32) * self.scale
        if self.softcap != 0:
            s = self.softcap * tanhf(s)
        skip = np.zeros(s.shape, bool)
        if self.mask4 is not None:
            m4 = self.mask4
            m = to_f32(m4[iq3 % m4.shape[0], iq2 % m4.shape[1], a:b, ic0:ic1], GGMLType.F16)
            mv = self.slopes[iq2] * m
            skip = mv == -np.inf
            with np.errstate(invalid="ignore"):
                s = np.where(skip, F32(-np.inf), s + mv)
        return s, skip

    def v_rows(self, iq3: int, iq2: int, ic0: int, ic1: int) -> np.ndarray:
        return to_f32(self.v4[iq3 // self.rv3, iq2 // self.rv2, ic0:ic1], self.v_type)


def _online_f16(s: np.ndarray, skip: np.ndarray, v: np.ndarray):
    """one_chunk with an F16 V: the online softmax with an fp16 accumulator, step by step over ic.

    Returns M, S (float, per row) and VKQ (rows, DV) as float32 holding fp16 values.
    """
    rows = s.shape[0]
    M = np.full(rows, -np.inf, F32)
    S = np.zeros(rows, F32)
    acc = np.zeros((rows, v.shape[1]), F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in range(s.shape[1]):
            live = ~skip[:, ic]
            if not live.any():
                continue
            sj = s[:, ic]
            new = live & (sj > M)
            ms = np.where(new, expf(M - sj), F32(1))
            vs = np.where(live & ~new, expf(sj - M), F32(1))
            if new.any():  # ggml_vec_scale_f16: y = fp16(y·ms)
                acc = np.where(new[:, None], fp16_round(acc * ms[:, None]), acc)
            M = np.where(new, sj, M)
            # ggml_vec_mad_f16: y = fp16(fma(x, vs, y)) in f32 lanes
            acc = np.where(live[:, None], fp16_round(fmaf(v[ic][None, :], vs[:, None], acc)), acc)
            S = np.where(live, fmaf(S, ms, vs), S)
    return M, S, acc


def _softmax_v(s: np.ndarray, skip: np.ndarray, v: np.ndarray):
    """The same (M, S, VKQ) in one vectorised f32 softmax (F32 V, or the tiled path)."""
    with np.errstate(invalid="ignore"):
        M = np.max(s, axis=1) if s.shape[1] else np.full(s.shape[0], -np.inf, F32)
        p = np.where(skip, F32(0), expf(s - M[:, None]))
    p = np.where(np.isneginf(M)[:, None], F32(0), p)
    S = p.sum(axis=1, dtype=F64).astype(F32)
    vkq = (p.astype(F64) @ v.astype(F64)).astype(F32)
    return M.astype(F32), S, vkq


def _attend(st: _Setup, iq3: int, iq2: int, a: int, b: int, ic0: int, ic1: int, tiled: bool):
    """(M, S, VKQ) for query rows [a, b) of head iq2 over KV [ic0, ic1), sinks applied."""
    s, skip = st.scores(iq3, iq2, a, b, ic0, ic1, vec_dot=not tiled)
    v = st.v_rows(iq3, iq2, ic0, ic1)
    if not tiled and st.v_type == GGMLType.F16:
        M, S, vkq = _online_f16(s, skip, v)
    else:
        M, S, vkq = _softmax_v(s, skip, v)
    if st.sinks is not None and ic0 == 0:
        sk = st.sinks[iq2]
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.where(sk > M, expf(M - sk), F32(1))
            vs = np.where(sk > M, F32(1), expf(sk - M))
        vkq = vkq * ms[:, None]
        S = fmaf(S, ms, vs)  # M is left as it was, as in ggml
    return M, S, vkq


def _finish(S: np.ndarray, vkq: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        inv = np.where(S == 0, F32(0), F32(1) / S)
    return vkq * inv[:, None]


def _flash_attn_ext_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's FLASH_ATTN_EXT: the larger of the tiled path's tiles (Q_TILE query rows
    by KV_TILE keys: q, scores twice, output, V and K) per task and the split-KV path's partials
    (per task: one row of V and two sums per head, and a row of K and two of V), as floats."""
    neq2, dk, dv = int(node.src[0].ne[2]), int(node.src[1].ne[0]), int(node.src[2].ne[0])
    q, kv = Q_TILE, KV_TILE
    tiled = 4 * (q * dk + 2 * q * kv + q * dv + kv * dv + kv * dk) * n_tasks
    split_kv = 4 * (neq2 * n_tasks * (2 + dv) + n_tasks * (dk + 2 * dv))
    return max(tiled, split_kv)


@kernel(GGMLOp.FLASH_ATTN_EXT, n_tasks=all_threads, work=_flash_attn_ext_work, blas=True)
def compute_forward_flash_attn_ext(params, dst: Tensor) -> None:
    """ggml_compute_forward_flash_attn_ext (F32 q; F32/F16 K and V)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    if int(dst.op_params[3]) not in (GGML_PREC_DEFAULT, GGML_PREC_F32):
        raise not_supported(dst, f"precision {int(dst.op_params[3])} (ggml aborts)")
    if q.type != GGMLType.F32:
        raise not_supported(dst, "q must be F32 (the CPU kernel reads q rows as float)")
    if k.type not in (GGMLType.F32, GGMLType.F16) or v.type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst, "K and V must be F32 or F16 here (quantized K/V not implemented)")
    neq0, neq1, neq2, neq3 = (int(x) for x in q.ne)
    dk, nek1, dv = int(k.ne[0]), int(k.ne[1]), int(v.ne[0])
    ne0, _, ne2 = (int(x) for x in dst.ne[:3])
    nb0, nb1, nb2, nb3 = (int(x) for x in dst.nb)
    for ok, cond in ((ne0 == dv, "ne0 == DV"), (ne2 == neq1, "ne2 == N"),
                     (int(q.nb[0]) == TYPE_TRAITS[q.type].type_size,
                      "nbq0 == ggml_type_size(q->type)"),
                     (int(k.nb[0]) == TYPE_TRAITS[k.type].type_size,
                      "nbk0 == ggml_type_size(k->type)"),
                     (int(v.nb[0]) == TYPE_TRAITS[v.type].type_size,
                      "nbv0 == ggml_type_size(v->type)"),
                     (neq0 == dk, "neq0 == DK"), (int(v.ne[0]) == dv, "nev0 == DV"),
                     (nb0 == 4, "nb0 == sizeof(float)"), (nb0 <= nb1, "nb0 <= nb1"),
                     (nb1 <= nb2, "nb1 <= nb2"), (nb2 <= nb3, "nb2 <= nb3")):
        ggml_assert(ok, cond, FN)

    mask = dst.src[3]
    if mask is not None and (int(mask.ne[0]) < nek1 or int(mask.ne[1]) < neq1):
        # ggml reads mask[iq1, ic] without checking: it would read past the mask's data
        raise not_supported(dst, f"mask {[int(x) for x in mask.ne]} is smaller than "
                            f"[n_kv {nek1}, n_q {neq1}]")
    st = _Setup(dst)
    ith, nth = params.ith, params.nth
    kv_ok = k.type == v.type
    if not params.use_ref and neq1 == 1 and neq3 == 1 and kv_ok and nek1 >= SPLIT_KV_MIN:
        return _split_kv(params, st, neq2, nek1)

    nr = neq1 * neq2 * neq3
    chunk_size = (nr + nth * 4 - 1) // (nth * 4)
    nchunk = (nr + chunk_size - 1) // chunk_size
    if nth == 1 or nchunk < nth:
        nchunk = nth
    if ith == 0:
        params.shared["chunk"] = itertools.count(nth)  # ggml_threadpool_chunk_set(nth)
    params.barrier()
    dr = (nr + nchunk - 1) // nchunk
    tiled = not params.use_ref and kv_ok and neq1 >= Q_TILE and dv % F32_EPR == 0
    done = []
    chunk = ith
    while chunk < nchunk:
        ir0, ir1 = dr * chunk, min(dr * chunk + dr, nr)
        for iq3, iq2, a, b in row_blocks(neq1, neq2, ir0, ir1):
            M, S, vkq = _attend(st, iq3, iq2, a, b, 0, nek1, tiled)
            st.d4[iq3, a:b, iq2] = _finish(S, vkq)  # permute(0, 2, 1, 3)
        done.append(Chunk(chunk, Interval(ir0, ir1)))
        chunk = next(params.shared["chunk"])
    params.took(ShareKind.CHUNKS, *done,
                note=Note.of("fa_tiled" if tiled else "fa_one_chunk", nchunk=nchunk, dr=dr))


def _split_kv(params, st: _Setup, n_head: int, nek1: int) -> None:
    """One query row: KV chunk per thread for all heads, barrier, then heads merged in turn."""
    ith, nth = params.ith, params.nth
    chunk_size = (nek1 + nth - 1) // nth
    ic0, ic1 = ith * chunk_size, min(ith * chunk_size + chunk_size, nek1)
    parts = []
    for h in range(n_head):
        if ic0 < nek1:
            M, S, vkq = _attend(st, 0, h, 0, 1, ic0, ic1, tiled=False)
            parts.append((M[0], S[0], vkq[0]))
        else:
            parts.append((F32(-np.inf), F32(0), None))
    params.shared[ith] = parts
    params.barrier()
    heads = list(range(ith, n_head, nth))
    with np.errstate(invalid="ignore", over="ignore"):
        for h in heads:
            m_fin, s_fin = F32(-np.inf), F32(0)
            acc = np.zeros(st.d4.shape[-1], F32)
            for c in range(nth):
                if c * chunk_size >= nek1:
                    continue
                m_c, s_c, vkq_c = params.shared[c][h]
                if s_c == 0:
                    continue
                m_new = max(m_fin, m_c)
                so, sn = expf(m_fin - m_new), expf(m_c - m_new)
                acc = fmaf(acc, so, vkq_c * sn)
                s_fin = fmaf(s_fin, so, s_c * sn)
                m_fin = m_new
            if s_fin != 0:
                acc = acc * (F32(1) / s_fin)
            st.d4[0, 0, h] = acc
    params.took(ShareKind.KV, Interval(ic0, ic1), note=Note.of("fa_kv", heads=str(heads)))
