"""ggml's state-space and linear-attention kernels (ggml-cpu/ops.cpp, oracle version 0.15.3):
SSM_CONV, SSM_SCAN, RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 and GATED_DELTA_NET, F32 only.

SSM_CONV: the threads split the channels (rows of sx) as get_thread_range does; for every sequence
and token, each channel's window is multiplied by its kernel and summed in order in float32, as
the oracle's build compiles such a loop (floatmath.mac_in_order).

SSM_SCAN: heads split in blocks of ceil(n_head/nth). Per token, state = fma(s, dA, B·(x·dt)) (the
oracle's build fuses the multiply-add, in its vector loop as in the scalar one) and y = Σ state·C
over d_state. Mamba-2 (A [1, n_head]): dA = expf(softplus(dt)·A) per head; y sums the first
d_state & ~31 states in 4×8 fma lanes (then ggml's horizontal sum), the rest by an fma each, in
order. Mamba-1 (A [d_state, n_head]): expf per state, y by an fma per state, in order.

RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7: heads split as [H·ith/nth, H·(ith+1)/nth). Per token and
head, with kv[i, j] = k[i]·v[j] (WKV7: v[i]·k[j]):
  WKV6  out[j] = Σ_i r[i]·(tf[i]·kv + s)[i, j] (fma chain over i), s = s·td[i] + kv
  GLA   s = s·g[i] + kv, out[j] = Σ_i (scale·q[i])·s[i, j] (in the scalar tail of a row, past
        its whole 8-lane vectors, the compiler fuses k·v into the add instead: fma(k, v, s·g))
  WKV7  sa[i] = a·s[i, :], s = s·w[j] + kv + sa[i]·b[j], out[i] = s[i, :]·r (8-lane sums)
Each product-plus-add is one fma, as the AVX2 intrinsics (and the contracted scalar tails) do it.

GATED_DELTA_NET: (head, sequence) pairs in about 4·nth chunks taken from a shared counter (first
chunk ith). Per token: S ← S·exp(g), δ = (v − Sᵀk)·β, S ← S + k δᵀ, out = (Sᵀq)/√S_v, with
ggml_vec_dot_f32 (vecdot_float.py) for the products and an fma per element for ggml_vec_mad_f32.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported
from engine.compute.kernels.common import thread_range, view4
from engine.compute.kernels.floatmath import expf, fmaf, ggml_compute_softplus_f32, mac_in_order
from engine.compute.kernels.vecdot_float import EPR, STEP, lanes32, vec_dot_f32_rows
from engine.compute.shares import Chunk, Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_is_contiguous_rows
from engine.core.types import GGMLType

F32 = np.float32


@kernel(GGMLOp.SSM_CONV, n_tasks=all_threads, work=no_work)
def compute_forward_ssm_conv(params, dst: Tensor) -> None:
    """ggml_compute_forward_ssm_conv_f32: x[i, t, s] = Σ_k sx[t + k, i, s]·c[k, i], k in order."""
    sx, c = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_ssm_conv_f32"
    if sx.type != GGMLType.F32 or c.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(int(sx.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    ggml_assert(int(c.nb[0]) == 4, "src1->nb[0] == sizeof(float)", fn)
    ggml_assert(int(sx.nb[1]) == int(sx.ne[0]) * 4, "src0->nb[1] == src0->ne[0]*sizeof(float)", fn)
    nc, nr = int(c.ne[0]), int(sx.ne[1])
    n_t = int(dst.ne[1])
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    s3 = view4(sx)[0]  # (n_s, d_inner, ncs)
    w = view4(c)[0, 0][ir0:ir1]  # (rows, d_conv)
    out = view4(dst)[0]  # (n_s, n_t, d_inner)
    for t in range(n_t):
        win = s3[:, ir0:ir1, t:t + nc]  # (n_s, rows, d_conv)
        acc = np.zeros(win.shape[:2], np.float32)
        for k in range(nc):
            acc = mac_in_order(acc, win[:, :, k], w[:, k], k, nc)
        out[:, t, ir0:ir1] = acc
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


# --- shared pieces -----------------------------------------------------------------------------

def _flat(t: Tensor) -> np.ndarray:
    """A contiguous tensor's elements as one float32 row."""
    return view4(t).reshape(-1)


def _head_range(n_head: int, ith: int, nth: int) -> tuple[int, int]:
    """The WKV kernels' split: heads [H·ith/nth, min(H·(ith+1)/nth, H))."""
    return n_head * ith // nth, min(n_head * (ith + 1) // nth, n_head)


def _f32_only(dst: Tensor, *srcs: Tensor) -> None:
    if any(t.type != GGMLType.F32 for t in srcs):
        raise not_supported(dst)


# --- SSM_SCAN ---------------------------------------------------------------------------------

@kernel(GGMLOp.SSM_SCAN, n_tasks=all_threads, work=no_work)
def compute_forward_ssm_scan(params, dst: Tensor) -> None:
    """ggml_compute_forward_ssm_scan_f32: Mamba's selective scan, heads split in blocks."""
    s_in, x, dt, A, B, C, ids = (dst.source(i) for i in range(7))
    fn = "ggml_compute_forward_ssm_scan_f32"
    if s_in.type != GGMLType.F32:
        raise not_supported(dst)
    nc, nr, nh = int(s_in.ne[0]), int(s_in.ne[1]), int(x.ne[1])
    ng, nt, ns = int(B.ne[1]), int(x.ne[2]), int(x.ne[3])
    n_x = int(np.prod([int(n) for n in x.ne]))
    ggml_assert(n_x + nc * nr * nh * ns == int(dst.ne[0]),
                "ggml_nelements(src1) + nc*nr*nh*ns == ggml_nelements(dst)", fn)
    for i, t in enumerate((s_in, x, dt, A, B, C)):
        ggml_assert(int(t.nb[0]) == 4, f"src{i}->nb[0] == sizeof(float)", fn)
    ggml_assert(int(ids.nb[0]) == 4, "src6->nb[0] == sizeof(int32_t)", fn)
    ggml_assert(nh % ng == 0, "nh % ng == 0", fn)
    dh = (nh + params.nth - 1) // params.nth
    h0, h1 = min(dh * params.ith, nh), min(dh * params.ith + dh, nh)
    params.took(ShareKind.ROWS, Interval(h0, h1))
    if h0 >= h1:
        return
    out = _flat(dst)
    y = out[:n_x].reshape(ns, nt, nh, nr)
    s_out = out[n_x:].reshape(ns, nh, nr, nc)
    s4, x4, dt4, B4, C4 = view4(s_in), view4(x), view4(dt)[0], view4(B), view4(C)
    a2 = view4(A)[0, 0][h0:h1]  # (heads, 1 or d_state)
    seq = view4(ids).reshape(-1)
    g = np.arange(h0, h1) // (nh // ng)
    mamba2 = int(A.ne[0]) == 1
    npv = nc & ~(STEP - 1) if mamba2 else 0
    with np.errstate(over="ignore", invalid="ignore"):
        for i3 in range(ns):
            state = s4[int(seq[i3]), h0:h1]  # (heads, dim, d_state)
            for i2 in range(nt):
                dt_sp = ggml_compute_softplus_f32(dt4[i3, i2, h0:h1])
                x_dt = x4[i3, i2, h0:h1] * dt_sp[:, None]  # (heads, dim)
                bg, cg = B4[i3, i2][g][:, None, :], C4[i3, i2][g][:, None, :]  # (heads, 1, d_state)
                if mamba2:
                    dA = expf(dt_sp * a2[:, 0])[:, None, None]
                else:
                    dA = expf(dt_sp[:, None] * a2)[:, None, :]
                # state = s·dA + B·x_dt as one fma on the rounded B·x_dt (the compiler fuses the
                # vector multiply and add too)
                new = fmaf(state, dA, bg * x_dt[..., None])
                sumf = lanes32(new[..., :npv], cg[..., :npv]) if npv else np.zeros(x_dt.shape, F32)
                for i0 in range(npv, nc):  # the scalar loop: an fma per state, in order
                    sumf = fmaf(new[..., i0], cg[..., i0], sumf)
                y[i3, i2, h0:h1] = sumf
                s_out[i3, h0:h1] = new
                state = new


# --- RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 ---------------------------------------------------

def _wkv_layout(dst: Tensor, n_seqs: int, fn: str) -> tuple[int, int, int, int, np.ndarray, np.ndarray]:
    """(T, H, S, tokens per sequence, out (T, H, S), new states (n_seqs, H, S, S)) of a WKV dst."""
    T, H = int(dst.source(1).ne[2]), int(dst.source(1).ne[1])
    C = int(dst.ne[0])
    ggml_assert(C % H == 0, "C % HEADS == 0", fn)
    S = C // H
    flat = _flat(dst)
    return T, H, S, T // n_seqs, flat[:T * C].reshape(T, H, S), flat[T * C:].reshape(n_seqs, H, S, S)


def _zero_out(params, out: np.ndarray) -> None:
    """Thread 0 zeroes the outputs, then everyone waits (the kernel accumulates into them)."""
    if params.ith == 0:
        out[...] = 0
    params.barrier()


def _tokens(params, dst: Tensor, state_src: Tensor, step, fn: str, zeroed: bool) -> None:
    """Walk the tokens for this thread's heads: `step(t, hs, prev, out)` -> the heads' new states,
    prev being each head's state before token t (the input state at a sequence's first token).
    zeroed: thread 0 zeroed the outputs first (the kernel adds into them)."""
    n_seqs = int(state_src.ne[1])
    T, H, S, per_seq, out, states = _wkv_layout(dst, n_seqs, fn)
    h0, h1 = _head_range(H, params.ith, params.nth)
    params.took(ShareKind.ROWS, Interval(h0, h1),
                note=Note("zeroed_dst") if zeroed and params.ith == 0 else ())
    if h0 >= h1:
        return
    s_in = _flat(state_src).reshape(n_seqs, H, S, S)
    hs = slice(h0, h1)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(T):
            seq = t // per_seq
            prev = states[seq, hs] if t % per_seq else s_in[seq, hs]
            states[seq, hs] = step(t, hs, prev, out)


def _heads_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks's RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7: a thread per head (src1's
    ne[1]), at most n_threads."""
    return min(n_threads, int(node.source(1).ne[1]))


@kernel(GGMLOp.RWKV_WKV6, n_tasks=_heads_tasks, work=no_work)
def compute_forward_rwkv_wkv6(params, dst: Tensor) -> None:
    """ggml_compute_forward_rwkv_wkv6_f32: per head, out[j] += r[i]·(tf[i]·k[i]v[j] + s[i, j]) for
    i in order, s[i, j] = s[i, j]·td[i] + k[i]v[j]; heads split as ggml's WKV kernels split them."""
    k, v, r, tf, td, state = (dst.source(i) for i in range(6))
    _f32_only(dst, k)
    T, H, S = int(v.ne[2]), int(v.ne[1]), int(dst.ne[0]) // int(v.ne[1])
    _zero_out(params, _flat(dst)[:T * H * S])
    k3, v3, r3, td3 = (_flat(t).reshape(T, H, S) for t in (k, v, r, td))
    tf2 = _flat(tf).reshape(H, S)

    def step(t, hs, prev, out):
        kv = k3[t, hs, :, None] * v3[t, hs, None, :]  # (heads, i, j)
        temp = fmaf(kv, tf2[hs, :, None], prev)
        acc = out[t, hs]
        for i in range(S):
            acc = fmaf(temp[:, i], r3[t, hs, i, None], acc)
        out[t, hs] = acc
        return fmaf(prev, td3[t, hs, :, None], kv)

    _tokens(params, dst, state, step, "ggml_compute_forward_rwkv_wkv6_f32", True)


@kernel(GGMLOp.GATED_LINEAR_ATTN, n_tasks=_heads_tasks, work=no_work)
def compute_forward_gla(params, dst: Tensor) -> None:
    """ggml_compute_forward_gla_f32: per head, s[i, j] = s[i, j]·g[i] + k[i]v[j], out[j] +=
    (q[i]·scale)·s[i, j] for i in order; heads split as ggml's WKV kernels split them."""
    k, v, q, g, state = (dst.source(i) for i in range(5))
    _f32_only(dst, k)
    scale = F32(dst.op_params.view(F32)[0])
    T, H, S = int(v.ne[2]), int(v.ne[1]), int(dst.ne[0]) // int(v.ne[1])
    _zero_out(params, _flat(dst)[:T * H * S])
    k3, v3, q3, g3 = (_flat(t).reshape(T, H, S) for t in (k, v, q, g))

    vec = S // EPR * EPR  # columns j in whole 8-lane vectors; the rest is the scalar tail

    def step(t, hs, prev, out):
        kv = k3[t, hs, :, None] * v3[t, hs, None, :vec]
        temp = np.empty(prev.shape, F32)
        temp[..., :vec] = fmaf(prev[..., :vec], g3[t, hs, :, None], kv)
        # the tail `kv + s·g`: the compiler fuses k·v into the add instead (kv has no other use)
        temp[..., vec:] = fmaf(v3[t, hs, None, vec:], k3[t, hs, :, None],
                               prev[..., vec:] * g3[t, hs, :, None])
        qs = q3[t, hs] * scale
        acc = out[t, hs]
        for i in range(S):
            acc = fmaf(temp[:, i], qs[:, i, None], acc)
        out[t, hs] = acc
        return temp

    _tokens(params, dst, state, step, "ggml_compute_forward_gla_f32", True)


@kernel(GGMLOp.RWKV_WKV7, n_tasks=_heads_tasks, work=no_work)
def compute_forward_rwkv_wkv7(params, dst: Tensor) -> None:
    """ggml_compute_forward_rwkv_wkv7_f32 (the AVX2 path): per head and row i, sa = a·s[i, :] in
    8-lane sums, s[i, j] = fma(sa, b[j], fma(s[i, j], w[j], v[i]k[j])), out[i] = s[i, :]·r in 8-lane
    sums. The vector loop walks whole steps of 32, so only head sizes that are multiples of 32
    stay inside their rows; for others ggml reads past them, and the engine refuses."""
    r, w, k, v, a, b, state = (dst.source(i) for i in range(7))
    _f32_only(dst, r)
    T, H, S = int(v.ne[2]), int(v.ne[1]), int(dst.ne[0]) // int(v.ne[1])
    if S % STEP:
        raise not_supported(dst, f"head size {S} is not a multiple of {STEP}: ggml's AVX2 loop "
                                 "reads past each row")
    r3, w3, k3, v3, a3, b3 = (_flat(t).reshape(T, H, S) for t in (r, w, k, v, a, b))

    def step(t, hs, prev, out):
        sa = lanes32(a3[t, hs, None, :], prev)  # (heads, i)
        kv = v3[t, hs, :, None] * k3[t, hs, None, :]
        new = fmaf(sa[..., None], b3[t, hs, None, :], fmaf(prev, w3[t, hs, None, :], kv))
        out[t, hs] = lanes32(new, r3[t, hs, None, :])
        return new

    _tokens(params, dst, state, step, "ggml_compute_forward_rwkv_wkv7_f32", False)


# --- GATED_DELTA_NET ---------------------------------------------------------------------------

def _gdn_chunks(nr: int, nth: int) -> tuple[int, int]:
    """ggml_compute_forward_gated_delta_net_f32's chunking of nr (head, sequence) pairs: about
    4 chunks per thread, one per thread when there are fewer chunks than threads -> (nchunk, dr)."""
    chunk_size = (nr + 4 * nth - 1) // (4 * nth)
    nchunk = (nr + chunk_size - 1) // chunk_size
    if nth == 1 or nchunk < nth:
        nchunk = nth
    return nchunk, (nr + nchunk - 1) // nchunk


def _gated_delta_net_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's GATED_DELTA_NET: per task, the delta (S_v floats) and, with K > 1, a
    scratch state (S_v² floats)."""
    s_v, k = int(node.source(2).ne[0]), int(node.op_params[0])
    return 4 * (s_v + (s_v * s_v if k > 1 else 0)) * n_tasks


@kernel(GGMLOp.GATED_DELTA_NET, n_tasks=all_threads, work=_gated_delta_net_work)
def compute_forward_gated_delta_net(params, dst: Tensor) -> None:
    """ggml_compute_forward_gated_delta_net_f32: thread 0 sets the chunk counter to nth, barrier;
    each thread computes chunk ith, then the next free chunk until none is left."""
    q, k, v, g, beta, state = (dst.source(i) for i in range(6))
    fn = "ggml_compute_forward_gated_delta_net_one_chunk"
    _f32_only(dst, q)
    for name, t in (("src_q", q), ("src_k", k), ("src_v", v)):
        ggml_assert(ggml_is_contiguous_rows(t), f"ggml_is_contiguous_rows({name})", fn)
    for name, t in (("src_g", g), ("src_beta", beta), ("src_state", state)):
        ggml_assert(ggml_is_contiguous(t), f"ggml_is_contiguous({name})", fn)
    S, H, T, n_seqs = (int(n) for n in v.ne)
    ggml_assert(int(g.ne[0]) in (1, S), "src_g->ne[0] == 1 || src_g->ne[0] == S_v", fn)
    ggml_assert(int(beta.ne[0]) == 1, "src_beta->ne[0] == 1", fn)
    K = int(dst.op_params[0])
    ggml_assert(K >= 1, "K >= 1", fn)
    nr = H * n_seqs
    nchunk, dr = _gdn_chunks(nr, params.nth)
    if params.ith == 0:
        params.shared["chunk"] = itertools.count(params.nth)  # atomic under the GIL
    params.barrier()
    done: list[Chunk] = []
    pairs: list[int] = []
    chunk = params.ith
    while chunk < nchunk:
        ir0, ir1 = dr * chunk, min(dr * chunk + dr, nr)
        done.append(Chunk(chunk, Interval(ir0, ir1)))
        pairs.extend(range(ir0, ir1))
        chunk = next(params.shared["chunk"])
    params.took(ShareKind.CHUNKS, *done)
    if pairs:
        _gdn_pairs(dst, np.array(pairs), K)


def _gdn_pairs(dst: Tensor, ir: np.ndarray, K: int) -> None:
    """The delta rule for the (head, sequence) pairs ir = seq·H + head, all at once."""
    q, k, v, g, beta, state = (dst.source(i) for i in range(6))
    S, H, T, n_seqs = (int(n) for n in v.ne)
    iv1, iv3 = ir % H, ir // H
    q4, k4, v4, g4, b4 = view4(q), view4(k), view4(v), view4(g), view4(beta)
    iq1, iq3 = iv1 % int(q.ne[1]), iv3 // (n_seqs // int(q.ne[3]))
    ik1, ik3 = iv1 % int(k.ne[1]), iv3 // (n_seqs // int(k.ne[3]))
    flat = _flat(dst)
    attn = flat[:S * H * T * n_seqs].reshape(n_seqs, T, H, S)
    snaps = flat[S * H * T * n_seqs:].reshape(K, n_seqs, H, S, S)
    # the state stored transposed: M[j, i] = S[i][j], so each row j is contiguous
    M = view4(state)[iv3, iv1].astype(F32, copy=True)  # (pairs, S, S)
    scale = F32(1) / np.sqrt(F32(S))
    kda = int(g.ne[0]) == S
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(T):
            qd, kd = q4[iq3, t, iq1], k4[ik3, t, ik1]  # (pairs, S)
            gd = g4[iv3, t, iv1]
            if kda:
                M *= expf(gd)[:, None, :]  # ggml_vec_mul_f32 of each row by exp(g)
            else:
                M *= expf(gd[:, 0])[:, None, None]  # ggml_vec_scale_f32
            sums = vec_dot_f32_rows(M, kd[:, None, :])  # (pairs, j)
            delta = (v4[iv3, t, iv1] - sums) * b4[iv3, t, iv1, 0][:, None]
            M = fmaf(kd[:, None, :], delta[:, :, None], M)  # ggml_vec_mad_f32: M[j] += k·delta[j]
            attn[iv3, t, iv1] = vec_dot_f32_rows(M, qd[:, None, :]) * scale
            slot = T - 1 - t
            if K > 1 and slot < K:
                snaps[slot, iv3, iv1] = M
    if K == 1:
        snaps[0, iv3, iv1] = M
