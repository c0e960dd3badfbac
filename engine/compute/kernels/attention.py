"""FLASH_ATTN_EXT: attention in one op, with ggml's three CPU paths (ggml-cpu/ops.cpp), bit for bit.

For every query row (iq1, head iq2, batch iq3), with K/V head iq2 / (n_head / n_head_kv) (GQA):

    s_ic = scale·(K[ic]·q) + slope·mask[iq1, ic]
           (softcap != 0: softcap·tanh(scale·(K[ic]·q)/softcap) + slope·mask[iq1, ic])
    out  = Σ_ic exp(s_ic - M)·V[ic] / (Σ_ic exp(s_ic - M) (+ exp(sink - M)))

written to dst[:, iq2, iq1, iq3] (heads and tokens swapped). Masked (-inf) positions are skipped.

* one_chunk (the reference path, any K/V types): q is converted to K's vec_dot type (fp16 for F16
  K, Q8_0 blocks for Q8_0, Q4_0, Q5_0 and IQ4_NL K, Q8_1 for Q4_1 and Q5_1) and each K·q is K's
  own vec_dot; the softmax runs online over ic. With F16 V the accumulator itself is fp16: every
  rescale and every V·weight multiply-add is rounded to fp16. Any other V is widened to floats a
  row at a time (its to_float) into an f32 accumulator.
* tiled (F32 q, F32/F16 K = V type, >= 64 query rows): a tile of 64 query rows against tiles of
  64 keys, K and V widened to f32, both products as chains of fused multiply-adds (simd_gemm:
  each output adds its terms in order, one fma each), the softmax per tile (ggml_vec_soft_max_f32)
  with the running max and sum per row.
* split-KV (one query row, one batch, >= 512 KV, F32/F16 K = V type): thread ith takes KV chunk
  ith for every head and leaves (M, S, VKQ) partials; after a barrier the threads take heads in
  turn and merge the chunks.

Two builds differ here, and `params.llamafile` (engine.compute.plan.llamafile_build) says which
one runs: llama.cpp's ggml takes the tiled path for any DV on x86 and soft-caps a tile's scores
before it pads the tile's missing keys with -inf; ggml-python's ggml (the plain build) asks for
DV % 8 == 0 and pads first (so without a mask a short last tile's padding becomes -softcap).

Rows are handed out in chunks from a shared counter, 4 per thread (none with 1 thread), as ggml
does; `params.use_ref` forces one_chunk. Every row is its own softmax, so the one_chunk rows of F16
K and V go to one C loop with their places (engine/compute/kernels/attention_rows.py), and an
unwatched graph keeps the node as one ready call (its split-KV partials made chunk by chunk as
the threads would make them): decoding's attention is one call a layer.

Numerics: ggml's own arithmetic, emulated with IEEE operations: the vec_dot kernels of the K
types (engine/compute/kernels/vecdot*.py), expf and tanhf from the C library (engine.libm), the
fp16 roundings, the AVX2 exp of the tiled softmax, the fused multiply-adds the build makes (its
vector code, and the scalar `S = S*ms + vs` the compiler contracts).
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Callable

import numpy as np

from engine.compute.kernels import all_threads, kernel, not_supported
from engine.compute.kernels.attention_rows import HalfRows, add_sink, divide_by_sum, half_rows_take, \
    online_softmax
from engine.compute.kernels.common import row_blocks, to_f32, view4
from engine.compute.kernels.floatmath import fmaf_steps
from engine.compute.kernels.matmul import vec_dot_type
from engine.compute.kernels.nn_util import alibi_slopes, expf, fmaf, fp16_round, raw_rows4, tanhf
from engine.compute.kernels.vecdot import EXACT_QUANT, vec_dot_quant
from engine.compute.kernels.vecdot_float import vec_dot_bf16, vec_dot_f16, vec_dot_f32
from engine.compute.shares import Chunk, Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor
from engine.core.types import GGMLType, TYPE_TRAITS, bf16_bits_to_fp32, fp32_to_bf16_bits
from engine.lanes import lanes, twin
from engine.ops.matmul import GGML_PREC_DEFAULT, GGML_PREC_F32
from engine.quants import dequantize, from_float

F32, F64 = np.float32, np.float64
Q_TILE, KV_TILE = 64, 64  # GGML_FA_TILE_Q, GGML_FA_TILE_KV
F32_EPR = 8  # AVX2 lanes: the plain build's tiled path needs DV % 8 == 0
SPLIT_KV_MIN = 512
FN = "ggml_compute_forward_flash_attn_ext_f16"
_FLOATS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
KV_TYPES = frozenset(_FLOATS) | frozenset(t for t in EXACT_QUANT
                                          if vec_dot_type(t) in (GGMLType.Q8_0, GGMLType.Q8_1))


class _Setup:
    """What every row needs: views, broadcast factors, scale, softcap and per-head slopes."""

    def __init__(self, dst: Tensor) -> None:
        q, k, v = dst.source(0), dst.source(1), dst.source(2)
        mask, sinks = dst.src[3], dst.src[4]  # either may be NULL
        self.q4 = view4(q)
        self.k_type, self.v_type = GGMLType(k.type), GGMLType(v.type)
        self.k4 = raw_rows4(k) if TYPE_TRAITS[k.type].is_quantized else view4(k)
        self.v4 = raw_rows4(v) if TYPE_TRAITS[v.type].is_quantized else view4(v)
        self.dk, self.dv = int(k.ne[0]), int(v.ne[0])
        self.neq1, self.neq2 = int(q.ne[1]), int(q.ne[2])
        self.rk2, self.rk3 = int(q.ne[2]) // int(k.ne[2]), int(q.ne[3]) // int(k.ne[3])
        self.rv2, self.rv3 = int(q.ne[2]) // int(v.ne[2]), int(q.ne[3]) // int(v.ne[3])
        scale, max_bias, softcap = (F32(x) for x in dst.op_params.view(np.float32)[:3])
        if softcap != 0:
            scale = scale / softcap
        self.scale, self.softcap = scale, softcap
        self.slopes = alibi_slopes(self.neq2, max_bias)
        self.mask4 = view4(mask) if mask is not None else None
        self._sinks = view4(sinks)[0, 0, 0] if sinks is not None else None
        self.d4 = view4(dst)

    @property
    def sinks(self) -> np.ndarray | None:
        """The sinks' logits as they are now (the view is kept: a prepared call reads them anew)."""
        return None if self._sinks is None else self._sinks.astype(F32)

    def k_rows(self, iq3: int, iq2: int, ic0: int, ic1: int) -> np.ndarray:
        return self.k4[iq3 // self.rk3, iq2 // self.rk2, ic0:ic1]

    def v_rows(self, iq3: int, iq2: int, ic0: int, ic1: int) -> np.ndarray:
        """V rows [ic0, ic1) as floats (to_float; F16 exactly widened)."""
        v = self.v4[iq3 // self.rv3, iq2 // self.rv2, ic0:ic1]
        if TYPE_TRAITS[self.v_type].is_quantized:
            return dequantize(self.v_type, np.ascontiguousarray(v), v.shape[0] * self.dv) \
                .reshape(-1, self.dv)
        return to_f32(v, self.v_type)

    def kv_head(self, iq3: int, iq2: int) -> tuple[int, int, int, int]:
        """The K and V heads query head iq2 of batch iq3 reads (GQA: n_head / n_head_kv each)."""
        return iq3 // self.rk3, iq2 // self.rk2, iq3 // self.rv3, iq2 // self.rv2

    def kq_vec_dot(self, q: np.ndarray, iq3: int, iq2: int, ic0: int, ic1: int) -> np.ndarray:
        """one_chunk's K·q of query rows q (float32, any heads that read K head (iq3, iq2)'s)
        with keys [ic0, ic1): q converted to K's vec_dot type (q_to_vec_dot), then K's vec_dot
        (kq_vec_dot), each pair on its own. (rows, keys) float32."""
        k = self.k_rows(iq3, iq2, ic0, ic1)
        if self.k_type == GGMLType.F32:
            return vec_dot_f32(k, q)
        if self.k_type == GGMLType.F16:
            return vec_dot_f16(k, fp16_round(q))
        if self.k_type == GGMLType.BF16:
            return vec_dot_bf16(k, bf16_bits_to_fp32(fp32_to_bf16_bits(q)))
        return vec_dot_quant(self.k_type, k, from_float(vec_dot_type(self.k_type), q))

    def mask_values(self, iq3: int, iq2: int, a: int, b: int, ic0: int, ic1: int) -> np.ndarray:
        """slope·mask of rows [a, b) and keys [ic0, ic1), float32 (zeros without a mask)."""
        if self.mask4 is None:
            return np.zeros((b - a, ic1 - ic0), F32)
        m4 = self.mask4
        m = m4[iq3 % m4.shape[0], iq2 % m4.shape[1], a:b, ic0:ic1].astype(F32)
        return self.slopes[iq2] * m


# --- one_chunk: the online softmax ----------------------------------------------------------

def _one_chunk(st: _Setup, blocks: list[tuple[int, int, int, int]], ic0: int, ic1: int):
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for the query rows of blocks
    (iq3, iq2, a, b): rows [a, b) of head iq2, every block reading the same K and V head, over
    keys [ic0, ic1). Each row is its own softmax; they are stacked only to make fewer calls.
    Returns (M, S, VKQ) of the rows in the blocks' order, with the sink applied on the first
    chunk (VKQ not yet divided by S)."""
    iq3, iq2 = blocks[0][:2]
    q = np.concatenate([st.q4[i3, i2, a:b] for i3, i2, a, b in blocks]).astype(F32, copy=False)
    mv = np.concatenate([st.mask_values(i3, i2, a, b, ic0, ic1) for i3, i2, a, b in blocks])
    skip = mv == -np.inf
    s = st.kq_vec_dot(q, iq3, iq2, ic0, ic1) * st.scale
    if st.softcap != 0:
        s = st.softcap * tanhf(s)
    with np.errstate(invalid="ignore"):
        s = s + mv
    if st.v_type == GGMLType.F16:  # the halves as they are: the accumulator is halves too
        v = st.v4[iq3 // st.rv3, iq2 // st.rv2, ic0:ic1].view(np.uint16)
        M, S, acc = online_softmax(s, skip, v, fp16=True)
    else:
        M, S, acc = online_softmax(s, skip, st.v_rows(iq3, iq2, ic0, ic1), fp16=False)
    if st.sinks is not None and ic0 == 0:
        sink = np.concatenate([np.full(b - a, st.sinks[i2], F32) for _, i2, a, b in blocks])
        M, S, acc = add_sink(sink, M, S, acc)
    return M, S, acc


def _same_kv(st: _Setup, blocks) -> list[list[tuple[int, int, int, int]]]:
    """blocks (iq3, iq2, a, b) in runs that read one K and V head."""
    runs: list[list[tuple[int, int, int, int]]] = []
    for blk in blocks:
        if runs and st.kv_head(*runs[-1][0][:2]) == st.kv_head(*blk[:2]):
            runs[-1].append(blk)
        else:
            runs.append([blk])
    return runs


# --- tiled ------------------------------------------------------------------------------------

def _gemm(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """simd_gemm: C[M x N] += A[M x K]·B[K x N] (lanes.fa_gemm, or its twin)."""
    out = np.array(c, F32, order="C")
    m, k = a.shape
    lanes.fa_gemm(out, np.ascontiguousarray(a, F32), np.ascontiguousarray(b, F32), m, k,
                  b.shape[1])
    return out


@twin("fa_gemm")
def fa_gemm(c, a, b, m: int, k: int, n: int) -> None:
    """engine._lanes.fa_gemm: simd_gemm, C[m x n] += A[m x k]·B[k x n] in place, each output a
    chain of fused multiply-adds in k's order: c[i, j] = fmaf(b[kk, j], a[i, kk], c[i, j]) (the
    vector code's GGML_F32_VEC_FMA, the same for every column)."""
    c2 = np.frombuffer(c, F32).reshape(m, n)
    a2, b2 = np.frombuffer(a, F32).reshape(m, k), np.frombuffer(b, F32).reshape(k, n)
    c2[:] = fmaf_steps(b2[:, None, :], a2.T[:, :, None], c2)


def _tiled(st: _Setup, iq3: int, iq2: int, a: int, b: int, llamafile: bool) -> np.ndarray:
    """ggml_compute_forward_flash_attn_ext_tiled for query rows [a, b) of one head (at most
    Q_TILE), every KV tile in turn: returns the rows' output (divided by S). A tile every valid
    row masks is skipped; a row the tile masks entirely keeps its M and S and adds nothing."""
    rows, nek1 = b - a, st.k4.shape[2]
    q = np.zeros((rows, st.dk), F32)  # (the tile's padding rows are never written out)
    q[:] = st.q4[iq3, iq2, a:b]
    M = np.full(rows, -np.inf, F32)
    S = np.zeros(rows, F32)
    acc = np.zeros((rows, st.dv), F32)
    k32 = np.zeros((st.dk, KV_TILE), F32)  # K tile transposed; a short tile keeps older columns
    v32 = np.zeros((KV_TILE, st.dv), F32)  # V tile; a short tile keeps older rows
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in range(0, nek1, KV_TILE):
            n = min(KV_TILE, nek1 - ic)
            mask = None
            if st.mask4 is not None:
                mv = st.mask_values(iq3, iq2, a, b, ic, ic + n)
                if (mv == -np.inf).all():
                    continue
                mask = np.full((rows, KV_TILE), -np.inf, F32)  # the missing keys: -inf
                mask[:, :n] = mv
            k32[:, :n] = to_f32(st.k_rows(iq3, iq2, ic, ic + n), st.k_type).T
            kq = _gemm(np.zeros((rows, KV_TILE), F32), q, k32) * st.scale
            if st.softcap != 0 and llamafile:  # llama.cpp's ggml: soft-capped, then padded
                kq = tanhf(kq) * st.softcap
            kq[:, n:] = -np.inf
            if st.softcap != 0 and not llamafile:  # the plain build: the padding too
                kq = tanhf(kq) * st.softcap
            if mask is not None:
                kq = kq + mask
            tile_max = kq.max(axis=1)
            live = tile_max != -np.inf
            m_new = np.fmax(M, tile_max)
            up = live & (m_new > M)
            ms = expf(M - m_new)
            acc = np.where(up[:, None], acc * ms[:, None], acc)
            S = np.where(up, S * ms, S)
            M = np.where(live, m_new, M)
            p = np.zeros((rows, KV_TILE), F32)  # exp(KQ - M), 0 on the rows it skips
            sums = np.zeros(rows, F64)
            if live.any():
                p[live], sums[live] = _soft_max(kq[live], m_new[live])
            S = np.where(live, (S.astype(F64) + sums).astype(F32), S)  # S += the double sum
            v32[:n] = st.v_rows(iq3, iq2, ic, ic + n)
            acc = _gemm(acc, p, v32)
    if st.sinks is not None:
        _, S, acc = add_sink(np.full(rows, st.sinks[iq2], F32), M, S, acc)
    return divide_by_sum(S, acc)


def _soft_max(kq: np.ndarray, mx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml_vec_soft_max_f32 of each row less its max (lanes.soft_max): the values and their
    sums in double."""
    rows, n = kq.shape
    y, sums = np.empty((rows, n), F32), np.empty(rows, F64)
    lanes.soft_max(np.ascontiguousarray(kq, F32), np.ascontiguousarray(mx, F32), y, sums, rows, n)
    return y, sums


# --- the kernel -------------------------------------------------------------------------------

def _flash_attn_ext_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's FLASH_ATTN_EXT: the larger of the tiled path's tiles (Q_TILE query rows
    by KV_TILE keys: q, scores twice, output, V and K) per task and the split-KV path's partials
    (per task: one row of V and two sums per head, and a row of K and two of V), as floats."""
    neq2, dk, dv = int(node.source(0).ne[2]), int(node.source(1).ne[0]), int(node.source(2).ne[0])
    q, kv = Q_TILE, KV_TILE
    tiled = 4 * (q * dk + 2 * q * kv + q * dv + kv * dv + kv * dk) * n_tasks
    split_kv = 4 * (neq2 * n_tasks * (2 + dv) + n_tasks * (dk + 2 * dv))
    return max(tiled, split_kv)


def _checked(params, dst: Tensor) -> tuple[_Setup, str]:
    """The kernel's checks, then what every row needs and the path the node takes: "split_kv",
    "tiled" or "one_chunk"."""
    q, k, v = dst.source(0), dst.source(1), dst.source(2)
    if int(dst.op_params[3]) not in (GGML_PREC_DEFAULT, GGML_PREC_F32):
        raise not_supported(dst, f"precision {int(dst.op_params[3])} (ggml aborts)")
    if q.type != GGMLType.F32:
        raise not_supported(dst, "q must be F32 (the CPU kernel reads q rows as float)")
    for t, name in ((k, "K"), (v, "V")):
        if t.type not in KV_TYPES:
            raise not_supported(dst, f"{name} of type {TYPE_TRAITS[t.type].type_name}")
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
    f32_or_f16 = k.type in (GGMLType.F32, GGMLType.F16)
    same = k.type == v.type
    if not params.use_ref and neq1 == 1 and neq3 == 1 and f32_or_f16 and same \
            and nek1 >= SPLIT_KV_MIN:
        return _Setup(dst), "split_kv"
    tiled = not params.use_ref and f32_or_f16 and same and neq1 >= Q_TILE \
        and (params.llamafile or dv % F32_EPR == 0)  # (x86: llama.cpp's ggml drops the DV test)
    return _Setup(dst), "tiled" if tiled else "one_chunk"


def _prepare_flash_attn_ext(params, dst: Tensor):
    """The node as one ready call on the one_chunk and split-KV paths (decoding's): the rows run
    in runs that share a K and V head, each row's softmax its own; split-KV's partials are made
    chunk by chunk as the compute's threads would make them, then merged head by head. The tiled
    path (a prompt's) keeps the general one."""
    st, path = _checked(params, dst)
    nek1 = st.k4.shape[2]
    if path == "tiled":
        return None
    if path == "split_kv":
        return _split_kv_all(st, st.neq2, nek1, params.cores)
    blocks = list(row_blocks(st.neq1, st.neq2, 0, st.neq1 * st.neq2 * st.q4.shape[0]))
    if half_rows_take(st):
        return HalfRows(st, _rows_of(blocks), 0, nek1, finish=True)
    return partial(_rows_one_chunk, st, blocks, nek1)


@kernel(GGMLOp.FLASH_ATTN_EXT, n_tasks=all_threads, work=_flash_attn_ext_work,
        prepare=_prepare_flash_attn_ext)
def compute_forward_flash_attn_ext(params, dst: Tensor) -> None:
    """ggml_compute_forward_flash_attn_ext (F32 q; K and V F32, F16, BF16 or quantized)."""
    st, path = _checked(params, dst)
    neq1, neq2, nek1 = st.neq1, st.neq2, st.k4.shape[2]
    ith, nth = params.ith, params.nth
    if path == "split_kv":
        return _split_kv(params, st, neq2, nek1)

    nr = neq1 * neq2 * st.q4.shape[0]
    chunk_size = (nr + nth * 4 - 1) // (nth * 4)
    nchunk = (nr + chunk_size - 1) // chunk_size
    if nth == 1 or nchunk < nth:
        nchunk = nth
    if ith == 0:
        params.shared["chunk"] = itertools.count(nth)  # ggml_threadpool_chunk_set(nth)
    params.barrier()
    dr = (nr + nchunk - 1) // nchunk
    tiled = path == "tiled"
    done = []
    chunk = ith
    while chunk < nchunk:
        ir0, ir1 = dr * chunk, min(dr * chunk + dr, nr)
        if tiled:
            for iq3, iq2, a, b in row_blocks(neq1, neq2, ir0, ir1):
                for q0 in range(a, b, Q_TILE):
                    e = min(b, q0 + Q_TILE)
                    st.d4[iq3, q0:e, iq2] = _tiled(st, iq3, iq2, q0, e, params.llamafile)
        else:
            _rows_one_chunk(st, list(row_blocks(neq1, neq2, ir0, ir1)), nek1)
        done.append(Chunk(chunk, Interval(ir0, ir1)))
        chunk = next(params.shared["chunk"])
    params.took(ShareKind.CHUNKS, *done,
                note=Note.of("fa_tiled" if tiled else "fa_one_chunk", nchunk=nchunk, dr=dr))


def _rows_one_chunk(st: _Setup, blocks: list[tuple[int, int, int, int]], nek1: int) -> None:
    """one_chunk over every key for the rows of blocks (iq3, iq2, a, b), written to dst: F16 K
    and V in one C loop (HalfRows), others a run of blocks that read one K and V head at a time."""
    if half_rows_take(st):
        HalfRows(st, _rows_of(blocks), 0, nek1, finish=True)()
        return
    for run in _same_kv(st, blocks):
        M, S, acc = _one_chunk(st, run, 0, nek1)
        out, r = divide_by_sum(S, acc), 0
        for iq3, iq2, a, b in run:
            st.d4[iq3, a:b, iq2] = out[r:r + b - a]  # permute(0, 2, 1, 3)
            r += b - a


def _rows_of(blocks) -> list[tuple[int, int, int]]:
    return [(iq3, iq2, i1) for iq3, iq2, a, b in blocks for i1 in range(a, b)]


def _split_kv(params, st: _Setup, n_head: int, nek1: int) -> None:
    """One query row: KV chunk per thread for all heads, barrier, then heads merged in turn."""
    ith, nth = params.ith, params.nth
    chunk_size = (nek1 + nth - 1) // nth
    ic0, ic1 = ith * chunk_size, min(ith * chunk_size + chunk_size, nek1)
    params.shared[ith] = _kv_partials(st, n_head, ic0, ic1, nek1)()
    params.barrier()
    heads = list(range(ith, n_head, nth))
    _merge_heads(st, heads, [params.shared[c] for c in range(nth)], chunk_size, nek1)
    params.took(ShareKind.KV, Interval(ic0, ic1), note=Note.of("fa_kv", heads=str(heads)))


def _split_kv_all(st: _Setup, n_head: int, nek1: int, nth: int):
    """_split_kv of nth threads as one call: every chunk's partials in turn, then every head."""
    chunk_size = (nek1 + nth - 1) // nth
    chunks = [_kv_partials(st, n_head, c * chunk_size, min(c * chunk_size + chunk_size, nek1), nek1)
              for c in range(nth)]

    def run() -> None:
        _merge_heads(st, range(n_head), [chunk() for chunk in chunks], chunk_size, nek1)
    return run


def _kv_partials(st: _Setup, n_head: int, ic0: int, ic1: int, nek1: int) -> Callable[[], list]:
    """What makes one KV chunk's (M, S, VKQ) for every head (none past the keys)."""
    if ic0 >= nek1:
        return lambda: [(F32(-np.inf), F32(0), None)] * n_head
    if half_rows_take(st):
        rows = HalfRows(st, [(0, h, 0) for h in range(n_head)], ic0, ic1, finish=False)

        def halves() -> list:
            M, S = rows()
            return list(zip(M.copy(), S.copy(), rows.partials.copy()))
        return halves

    def others() -> list:
        parts: list = []
        for run in _same_kv(st, [(0, h, 0, 1) for h in range(n_head)]):
            M, S, acc = _one_chunk(st, run, ic0, ic1)
            parts += zip(M, S, acc)
        return parts
    return others


def _merge_heads(st: _Setup, heads, parts: list, chunk_size: int, nek1: int) -> None:
    """The chunks' partials of each head merged in chunk order, divided by the sum, to dst."""
    with np.errstate(invalid="ignore", over="ignore"):
        for h in heads:
            m_fin = F32(-np.inf)
            s_fin: np.float32 | np.ndarray = F32(0)  # (then fmaf's: a float32 scalar)
            acc = np.zeros(st.dv, F32)
            for c in range(len(parts)):
                if c * chunk_size >= nek1:
                    continue
                m_c, s_c, vkq_c = parts[c][h]
                if s_c == 0:
                    continue
                m_new = np.fmax(m_fin, m_c)
                so, sn = expf(m_fin - m_new), expf(m_c - m_new)
                acc = fmaf(acc, so, vkq_c * sn)
                s_fin = fmaf(s_fin, so, s_c * sn)
                m_fin = m_new
            if s_fin != 0:
                acc = acc * (F32(1) / s_fin)
            st.d4[0, 0, h] = acc
