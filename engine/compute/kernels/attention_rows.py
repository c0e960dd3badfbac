"""FLASH_ATTN_EXT's one_chunk path row by row: the online softmax over a row's keys, the sink,
the division by the sum, and the whole path of F16 K and V in one C loop (lanes.fa_rows).

Every query row is its own softmax (engine/compute/kernels/attention.py says what one_chunk
computes): so the rows of a node, whatever heads and chunks they belong to, can be handed to one
loop with each row's places in bytes, and the bits are those of running them one at a time.
`HalfRows` works those places out once (a prepared node keeps it: decoding computes the same
graph token after token) and calls lanes.fa_rows; its twin below runs the same steps in numpy.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels.common import span_of, spans
from engine.compute.kernels.nn_util import expf, fmaf, fp16_round, tanhf
from engine.compute.kernels.vecdot_float import vec_dot_f16
from engine.core.types import GGMLType, fp16_bits_to_fp32
from engine.lanes import lanes, twin

F32 = np.float32


def online_softmax(s: np.ndarray, skip: np.ndarray, v: np.ndarray, fp16: bool):
    """The online softmax over the keys of every row: lanes.fa_online (in C, or its twin
    fa_online). v: (n, dv) halves (uint16) when fp16, else float32. Returns M, S, VKQ."""
    rows, n = s.shape
    dv = v.shape[1]
    acc, M, S = np.empty((rows, dv), F32), np.empty(rows, F32), np.empty(rows, F32)
    lanes.fa_online(np.ascontiguousarray(s, F32), np.ascontiguousarray(skip, np.uint8),
                    np.ascontiguousarray(v), fp16, acc, M, S, rows, n, dv)
    return M, S, acc


@twin("fa_online")
def fa_online(s, skip, v, fp16: bool, acc, M, S, rows: int, n: int, dv: int) -> None:
    """engine._lanes.fa_online: ggml's online softmax over keys, step by step, every row at once.
    A live key (not skipped) with a new maximum rescales the accumulator by ms = expf(Mold - M)
    (ggml_vec_scale_f16/_f32), an older maximum weighs the key by vs = expf(s - M); the key's V
    row is added times vs (ggml_vec_mad_f16/_f32: one fma per element, rounded to fp16 for an F16
    V); S = fmaf(S, ms, vs), as the compiler contracts `S = S*ms + vs`."""
    s2 = np.frombuffer(s, F32).reshape(rows, n)
    skip2 = np.frombuffer(skip, np.uint8).reshape(rows, n) != 0
    vf = np.frombuffer(v, np.uint16 if fp16 else F32).reshape(n, dv)
    if fp16:
        vf = fp16_bits_to_fp32(vf)
    m, sm = np.full(rows, -np.inf, F32), np.zeros(rows, F32)
    out = np.zeros((rows, dv), F32)
    one = F32(1)
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in range(n):
            live = ~skip2[:, ic]
            if not live.any():
                continue
            sj = s2[:, ic]
            new = live & (sj > m)
            ms = np.where(new, expf(m - sj), one)
            vs = np.where(live & ~new, expf(sj - m), one)
            if new.any():
                scaled = out[new] * ms[new, None]
                out[new] = fp16_round(scaled) if fp16 else scaled
            m = np.where(new, sj, m)
            mad = fmaf(vf[ic][None, :], vs[live, None], out[live])
            out[live] = fp16_round(mad) if fp16 else mad
            sm = np.where(live, fmaf(sm, ms, vs), sm)
    np.frombuffer(acc, F32)[:] = out.reshape(-1)
    np.frombuffer(M, F32)[:] = m
    np.frombuffer(S, F32)[:] = sm


def add_sink(sink: np.ndarray, M: np.ndarray, S: np.ndarray, acc: np.ndarray):
    """Each row's sink logit joins its softmax after the keys (no value of its own)."""
    with np.errstate(invalid="ignore", over="ignore"):
        new = sink > M
        ms = np.where(new, expf(M - sink), F32(1))
        vs = np.where(new, F32(1), expf(sink - M))
    acc = np.where(new[:, None], acc * ms[:, None], acc)
    return np.where(new, sink, M).astype(F32), S * ms + vs, acc


def divide_by_sum(S: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """V /= S (0 where S is 0): ggml_vec_scale_f32 by 1/S."""
    with np.errstate(divide="ignore"):
        inv = np.where(S == 0, F32(0), F32(1) / S)
    return acc * inv[:, None]


# --- F16 K and V in one loop ---------------------------------------------------------------------

def half_rows_take(st) -> bool:
    """Does lanes.fa_rows take this node (attention._Setup): F16 K and V, every view's rows
    packed and its strides non-negative (so each row is a place in one span of bytes)."""
    views = (st.q4, st.k4, st.v4, st.d4) + (() if st.mask4 is None else (st.mask4,))
    return st.k_type == GGMLType.F16 and st.v_type == GGMLType.F16 and all(spans(a) for a in views)


class HalfRows:
    """Query rows (iq3, iq2, iq1) of a node that half_rows_take, over keys [ic0, ic1), ready for
    lanes.fa_rows: the spans of q, K, V, the mask and dst, and each row's byte offsets in them.
    Finished, the rows go to dst divided by their sums; else (split-KV's partials) to `partials`
    as they are. Calling it computes the rows and returns their M and S."""

    def __init__(self, st, rows: list[tuple[int, int, int]], ic0: int, ic1: int, finish: bool):
        self.st, self.n, self.finish = st, ic1 - ic0, finish
        self.sink_heads = np.array([i2 for _, i2, _ in rows], np.intp) \
            if st.sinks is not None and ic0 == 0 else None
        self.mask = None if st.mask4 is None else span_of(st.mask4)
        self.partials = np.empty((0 if finish else len(rows), st.dv), F32)  # (split-KV's)
        self.out = span_of(st.d4) if finish else self.partials.reshape(-1).view(np.uint8)
        self.spans = span_of(st.q4), span_of(st.k4), span_of(st.v4)
        self.M, self.S = np.empty(len(rows), F32), np.empty(len(rows), F32)
        self.slopes = st.slopes[[i2 for _, i2, _ in rows]].astype(F32)
        qs, ks, vs, ds = st.q4.strides, st.k4.strides, st.v4.strides, st.d4.strides
        m4 = st.mask4
        offs = np.zeros((len(rows), 5), np.int64)
        for r, (i3, i2, i1) in enumerate(rows):
            k3, k2, v3, v2 = st.kv_head(i3, i2)
            offs[r, :3] = (i3 * qs[0] + i2 * qs[1] + i1 * qs[2], k3 * ks[0] + k2 * ks[1] + ic0 * ks[2],
                           v3 * vs[0] + v2 * vs[1] + ic0 * vs[2])
            if m4 is not None:
                ms = m4.strides
                offs[r, 3] = (i3 % m4.shape[0]) * ms[0] + (i2 % m4.shape[1]) * ms[1] + i1 * ms[2] \
                    + ic0 * ms[3]
            offs[r, 4] = i3 * ds[0] + i1 * ds[1] + i2 * ds[2] if finish else r * st.dv * 4
        self.offs = offs

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        st = self.st
        sinks = None if self.sink_heads is None else st.sinks[self.sink_heads]
        q, k, v = self.spans
        lanes.fa_rows(q, k, v, self.mask, self.out, self.offs, self.slopes, sinks, self.M, self.S,
                      len(self.offs), self.n, st.dk, st.dv, st.k4.strides[2], st.v4.strides[2],
                      st.scale, st.softcap, st.mask4 is not None and st.mask4.dtype == np.float16,
                      self.finish)
        return self.M, self.S


@twin("fa_rows")
def fa_rows(q, k, v, mask, out, offs, slopes, sinks, M, S, rows: int, n: int, dk: int, dv: int,
            nbk1: int, nbv1: int, scale, softcap, mask_f16: bool, finish: bool) -> None:
    """engine._lanes.fa_rows: one_chunk's steps as attention.py's general path takes them, the
    rows that read the same K and V taken together (each row its own softmax): q rounded to
    halves, K·q by ggml_vec_dot_f16, times scale, the soft cap (softcap·tanhf), plus slope·mask
    (a key whose slope·mask is -inf skipped); the online softmax over the keys with the halves'
    accumulator (fa_online); the sink; the division by S (finish)."""
    places = np.frombuffer(offs, np.int64).reshape(rows, 5)
    slope = np.frombuffer(slopes, F32)
    sink = None if sinks is None else np.frombuffer(sinks, F32)
    M_out, S_out = np.frombuffer(M, F32), np.frombuffer(S, F32)
    by_kv: dict[tuple[int, int], list[int]] = {}
    for r in range(rows):
        by_kv.setdefault((int(places[r, 1]), int(places[r, 2])), []).append(r)
    for (ko, vo), rs in by_kv.items():
        kr = np.ndarray((n, dk), np.float16, buffer=k, offset=ko, strides=(nbk1, 2))
        vr = np.ndarray((n, dv), np.uint16, buffer=v, offset=vo, strides=(nbv1, 2))
        qr = np.stack([np.ndarray((dk,), F32, buffer=q, offset=int(places[r, 0])) for r in rs])
        mv = np.zeros((len(rs), n), F32)
        if mask is not None:
            m = np.stack([np.ndarray((n,), np.float16 if mask_f16 else F32, buffer=mask,
                                     offset=int(places[r, 3])) for r in rs]).astype(F32)
            mv = slope[rs][:, None] * m
        with np.errstate(invalid="ignore", over="ignore"):
            s = vec_dot_f16(kr, fp16_round(qr)) * F32(scale)
            if softcap != 0:
                s = F32(softcap) * tanhf(s)
            s = s + mv
        m_r, s_r, acc = online_softmax(s, mv == -np.inf, vr, fp16=True)
        if sink is not None:
            m_r, s_r, acc = add_sink(sink[rs], m_r, s_r, acc)
        if finish:
            acc = divide_by_sum(s_r, acc)
        for i, r in enumerate(rs):
            np.ndarray((dv,), F32, buffer=out, offset=int(places[r, 4]))[:] = acc[i]
        M_out[rs], S_out[rs] = m_r, s_r
