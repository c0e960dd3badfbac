"""The state-space and linear-attention ops (engine/ops/ssm.py, kernels/ssm.py) against real ggml:
SSM_CONV, SSM_SCAN (Mamba-1 and Mamba-2), RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 and
GATED_DELTA_NET, bit for bit at 1 and several threads, each thread's share as ggml splits the work,
and ggml's asserts."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ggml as eng
from engine.ops import ssm as ops_ssm
from engine.core.errors import GGMLAssertionError, GGMLNotSupportedError
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType
from tests.support.graphs import Leaf, check_op, engine_shares

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


def ssm_conv(g, ctx, sx, c):
    return g.ggml_ssm_conv(ctx, sx, c)


@pytest.mark.parametrize("n_threads", [1, 3, 4])
@pytest.mark.parametrize("d_conv,d_inner,n_t,n_s", [(4, 16, 5, 2), (3, 7, 1, 3), (4, 33, 9, 1), (2, 9, 3, 1),
                                                    (5, 9, 3, 1), (6, 11, 2, 2), (7, 9, 3, 1), (13, 20, 3, 2)])
def test_ssm_conv(d_conv, d_inner, n_t, n_s, n_threads):
    leaves = [Leaf(F32, (d_conv - 1 + n_t, d_inner, n_s)), Leaf(F32, (d_conv, d_inner))]
    check_op(ssm_conv, leaves, n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [2, 3])
def test_ssm_conv_threads_take_channels(n_threads):
    (shares,) = engine_shares(ssm_conv, [Leaf(F32, (7, 10, 2)), Leaf(F32, (4, 10))], n_threads, GGMLOp.SSM_CONV)
    dr = -(-10 // n_threads)
    assert [tuple(s.ranges[0]) for s in shares] == [(min(dr * i, 10), min(dr * i + dr, 10)) for i in range(n_threads)]


def test_ssm_conv_asserts():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    c = eng.ggml_new_tensor_2d(ctx, F32, 4, 8)
    with pytest.raises(GGMLAssertionError, match=r"sx->ne\[1\] == d_inner"):
        eng.ggml_ssm_conv(ctx, eng.ggml_new_tensor_3d(ctx, F32, 6, 7, 1), c)
    with pytest.raises(GGMLAssertionError, match=r"ggml_is_matrix\(c\)"):
        eng.ggml_ssm_conv(ctx, eng.ggml_new_tensor_3d(ctx, F32, 6, 8, 1), eng.ggml_new_tensor_3d(ctx, F32, 4, 8, 2))


# --- the ops after SSM_CONV: the engine side calls engine.ops.ssm, real ggml its own binding ---

def api(g):
    return ops_ssm if g is eng else g


def new_ctx():
    return eng.ggml_init(eng.ggml_init_params(1 << 22))


def nb(g, t) -> list[int]:
    return [int(x) for x in t.nb] if g is eng else list(t.contents.nb)


# --- SSM_SCAN ---------------------------------------------------------------------------------

def scan_leaves(d_state, head_dim, n_head, n_group, n_t, n_s, mamba1, extra_states=0):
    """s (with extra_states more sequences than the batch), x, dt, A, B, C, ids (batch sequence i
    reads state n_s - 1 - i + extra_states)."""
    ids = np.arange(n_s)[::-1] + extra_states
    return [Leaf(F32, (d_state, head_dim, n_head, n_s + extra_states)),
            Leaf(F32, (head_dim, n_head, n_t, n_s)),
            Leaf(F32, (n_head, n_t, n_s), low=-4, high=24),  # softplus: both of its branches
            Leaf(F32, (d_state if mamba1 else 1, n_head), low=-2, high=-0.1),
            Leaf(F32, (d_state, n_group, n_t, n_s)), Leaf(F32, (d_state, n_group, n_t, n_s)),
            Leaf(I32, (n_s,), values=ids.copy())]


def ssm_scan(g, ctx, s, x, dt, A, B, C, ids):
    return api(g).ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids)


@pytest.mark.parametrize("n_threads", [1, 3, 4])
@pytest.mark.parametrize("d_state", [1, 5, 16, 17, 32, 48, 77, 128])
def test_ssm_scan_mamba2(d_state, n_threads):
    """Mamba-2 (A [1, n_head]): the states past the last whole 32 take the scalar loop."""
    check_op(ssm_scan, scan_leaves(d_state, 5, 4, 2, 3, 2, False), n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [1, 3, 4])
@pytest.mark.parametrize("d_state", [1, 4, 16, 23])
def test_ssm_scan_mamba1(d_state, n_threads):
    """Mamba-1 (A [d_state, n_head]): a decay per state, one group per head."""
    check_op(ssm_scan, scan_leaves(d_state, 6, 3, 3, 4, 2, True), n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [1, 2, 5])
def test_ssm_scan_states_by_ids_and_one_group(n_threads):
    check_op(ssm_scan, scan_leaves(16, 4, 6, 1, 2, 3, False, extra_states=2), n_threads, exact=True)


def ssm_scan_packed(d_state, head_dim, n_head, n_group):
    """x, B and C as llama.cpp takes them: views into one packed row per token (strided tokens)."""
    def build(g, ctx, s, xbc, dt, A, ids):
        n_t, n_s = (xbc.ne[1], xbc.ne[2]) if g is eng else (xbc.contents.ne[1], xbc.contents.ne[2])
        _, nb1, nb2, _ = nb(g, xbc)
        x = g.ggml_view_4d(ctx, xbc, head_dim, n_head, n_t, n_s, head_dim * 4, nb1, nb2, 0)
        b_off, c_off = head_dim * n_head * 4, (head_dim * n_head + d_state * n_group) * 4
        B = g.ggml_view_4d(ctx, xbc, d_state, n_group, n_t, n_s, d_state * 4, nb1, nb2, b_off)
        C = g.ggml_view_4d(ctx, xbc, d_state, n_group, n_t, n_s, d_state * 4, nb1, nb2, c_off)
        return api(g).ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids)
    return build


@pytest.mark.parametrize("mamba1", [False, True])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_ssm_scan_strided_sources(mamba1, n_threads):
    d_state, head_dim, n_head, n_group, n_t, n_s = 16, 4, 4, (4 if mamba1 else 2), 3, 2
    leaves = [Leaf(F32, (d_state, head_dim, n_head, n_s)),
              Leaf(F32, (head_dim * n_head + 2 * d_state * n_group + 3, n_t, n_s)),
              Leaf(F32, (n_head, n_t, n_s), low=-3, high=3),
              Leaf(F32, (d_state if mamba1 else 1, n_head), low=-2),
              Leaf(I32, (n_s,), values=np.arange(n_s))]
    check_op(ssm_scan_packed(d_state, head_dim, n_head, n_group), leaves, n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [2, 3, 4])
def test_ssm_scan_threads_take_heads(n_threads):
    n_head = 5
    (shares,) = engine_shares(ssm_scan, scan_leaves(8, 3, n_head, 1, 2, 1, False), n_threads, GGMLOp.SSM_SCAN)
    dh = -(-n_head // n_threads)
    assert [tuple(s.ranges[0]) for s in shares] == \
        [(min(dh * i, n_head), min(dh * i + dh, n_head)) for i in range(n_threads)]


def test_ssm_scan_asserts():
    ctx = new_ctx()
    t = lambda *ne, type_=F32: getattr(eng, f"ggml_new_tensor_{len(ne)}d")(ctx, type_, *ne)  # noqa: E731
    s, x, dt = t(16, 4, 2, 1), t(4, 2, 3, 1), t(2, 3, 1)
    A, B, C, ids = t(1, 2), t(16, 1, 3, 1), t(16, 1, 3, 1), t(1, type_=I32)
    ops_ssm.ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids)  # well formed
    cases = [
        ((s, x, dt, A, B, t(16, 2, 3, 1), ids), r"ggml_are_same_shape\(B, C\)"),
        ((s, x, dt, A, B, C, t(1)), r"ids->type == GGML_TYPE_I32"),
        ((s, x, dt, t(8, 2), B, C, ids), r"A->ne\[0\] == d_state"),
        ((s, x, t(3, 3, 1), A, B, C, ids), r"dt->ne\[0\] == n_head"),
        ((t(16, 5, 2, 1), x, dt, A, B, C, ids), r"s->ne\[1\] == head_dim"),
        ((s, x, dt, A, t(8, 1, 3, 1), t(8, 1, 3, 1), ids), r"B->ne\[0\] == d_state"),
        ((s, x, dt, A, B, C, t(2, type_=I32)), r"ids->ne\[0\] == n_seqs"),
        ((s, x, dt, t(1, 2, 2), B, C, ids), r"ggml_is_matrix\(A\)"),
        ((s, eng.ggml_permute(ctx, x, 1, 0, 2, 3), dt, A, B, C, ids), r"x->nb\[0\] == ggml_type_size"),
    ]
    for args, msg in cases:
        with pytest.raises(GGMLAssertionError, match=msg):
            ops_ssm.ggml_ssm_scan(ctx, *args)


# --- RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 ---------------------------------------------------

def rwkv_wkv6(g, ctx, k, v, r, tf, td, state):
    return api(g).ggml_rwkv_wkv6(ctx, k, v, r, tf, td, state)


def gla(scale):
    def build(g, ctx, k, v, q, gate, state):
        return api(g).ggml_gated_linear_attn(ctx, k, v, q, gate, state, scale)
    return build


def rwkv_wkv7(g, ctx, r, w, k, v, a, b, state):
    return api(g).ggml_rwkv_wkv7(ctx, r, w, k, v, a, b, state)


def wkv6_leaves(S, H, T, n_seqs):
    x = lambda: Leaf(F32, (S, H, T))  # noqa: E731
    return [x(), x(), x(), Leaf(F32, (S, H)), Leaf(F32, (S, H, T), low=0.5), Leaf(F32, (S * S * H, n_seqs))]


def gla_leaves(S, H, T, n_seqs):
    x = lambda: Leaf(F32, (S, H, T))  # noqa: E731
    return [x(), x(), x(), Leaf(F32, (S, H, T), low=0.5), Leaf(F32, (S * S * H, n_seqs))]


def wkv7_leaves(S, H, T, n_seqs):
    x = lambda: Leaf(F32, (S, H, T), low=-0.5, high=0.5)  # noqa: E731
    return [x(), Leaf(F32, (S, H, T), low=0.5), x(), x(), x(), x(), Leaf(F32, (S * S * H, n_seqs))]


WKV_SHAPES = [(8, 2, 3, 1), (16, 3, 4, 2), (12, 2, 2, 1), (4, 3, 3, 3), (64, 2, 4, 2)]


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("S,H,T,n_seqs", WKV_SHAPES)
def test_rwkv_wkv6(S, H, T, n_seqs, n_threads):
    """Head sizes in whole 8-lane vectors, with a scalar tail (12) and all tail (4)."""
    check_op(rwkv_wkv6, wkv6_leaves(S, H, T, n_seqs), n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("S,H,T,n_seqs", WKV_SHAPES + [(13, 2, 2, 2)])
def test_gated_linear_attn(S, H, T, n_seqs, n_threads):
    check_op(gla(0.37), gla_leaves(S, H, T, n_seqs), n_threads, exact=True)


def test_gated_linear_attn_scale_one():
    check_op(gla(1.0), gla_leaves(16, 2, 3, 1), 2, exact=True)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("S,H,T,n_seqs", [(32, 2, 3, 1), (64, 3, 4, 2), (32, 4, 2, 2)])
def test_rwkv_wkv7(S, H, T, n_seqs, n_threads):
    check_op(rwkv_wkv7, wkv7_leaves(S, H, T, n_seqs), n_threads, exact=True)


def test_rwkv_wkv7_refuses_head_sizes_ggml_overruns():
    """ggml's AVX2 loop steps by 32 floats: a head size of 16 reads past each row, so the engine
    refuses rather than guess what lies there."""
    with pytest.raises(GGMLNotSupportedError, match="multiple of 32"):
        check_op(rwkv_wkv7, wkv7_leaves(16, 2, 2, 1), 1)


@pytest.mark.parametrize("op,build,leaves", [
    (GGMLOp.RWKV_WKV6, rwkv_wkv6, wkv6_leaves(8, 5, 2, 1)),
    (GGMLOp.GATED_LINEAR_ATTN, gla(0.5), gla_leaves(8, 5, 2, 1)),
    (GGMLOp.RWKV_WKV7, rwkv_wkv7, wkv7_leaves(32, 5, 2, 1)),
])
@pytest.mark.parametrize("n_threads", [2, 3, 4])
def test_wkv_threads_take_heads(op, build, leaves, n_threads):
    """Heads [H·ith/nth, min(H·(ith+1)/nth, H)) (n_tasks = min(n_threads, H))."""
    H = 5
    (shares,) = engine_shares(build, leaves, n_threads, op)
    assert [tuple(s.ranges[0]) for s in shares] == \
        [(H * i // n_threads, min(H * (i + 1) // n_threads, H)) for i in range(n_threads)]


def test_wkv_asserts():
    ctx = new_ctx()
    t = lambda *ne: getattr(eng, f"ggml_new_tensor_{len(ne)}d")(ctx, F32, *ne)  # noqa: E731
    x, tf, state = t(8, 2, 3), t(8, 2), t(8 * 8 * 2, 1)
    with pytest.raises(GGMLAssertionError,
                       match=r"v->ne\[0\] == S && v->ne\[1\] == H && v->ne\[2\] == n_tokens"):
        ops_ssm.ggml_rwkv_wkv6(ctx, x, t(8, 2, 2), x, tf, x, state)
    with pytest.raises(GGMLAssertionError, match=r"td->ne\[0\] == S"):
        ops_ssm.ggml_rwkv_wkv6(ctx, x, x, x, tf, t(8, 1, 3), state)
    with pytest.raises(GGMLAssertionError, match=r"ggml_nelements\(state\) == S \* S \* H \* n_seqs"):
        ops_ssm.ggml_rwkv_wkv6(ctx, x, x, x, tf, x, t(8 * 8, 1))
    with pytest.raises(GGMLAssertionError, match=r"ggml_is_contiguous\(r\)"):
        ops_ssm.ggml_rwkv_wkv6(ctx, x, x, eng.ggml_permute(ctx, t(2, 8, 3), 1, 0, 2, 3), tf, x, state)
    with pytest.raises(GGMLAssertionError, match=r"g->ne\[0\] == S && g->ne\[1\] == H"):
        ops_ssm.ggml_gated_linear_attn(ctx, x, x, x, t(8, 2, 1), state, 1.0)
    with pytest.raises(GGMLAssertionError, match=r"ggml_is_contiguous\(q\)"):
        ops_ssm.ggml_gated_linear_attn(ctx, x, x, eng.ggml_transpose(ctx, t(2, 8)), x, state, 1.0)
    with pytest.raises(GGMLAssertionError, match=r"a->ne\[0\] == S && a->ne\[1\] == H"):
        ops_ssm.ggml_rwkv_wkv7(ctx, x, x, x, x, t(8, 2, 4), x, state)
    with pytest.raises(GGMLAssertionError, match=r"ggml_nelements\(state\)"):
        ops_ssm.ggml_rwkv_wkv7(ctx, x, x, x, x, x, x, t(8 * 8, 3))


# --- GATED_DELTA_NET ---------------------------------------------------------------------------

def gated_delta_net(K):
    def build(g, ctx, q, k, v, gate, beta, state):
        return api(g).ggml_gated_delta_net(ctx, q, k, v, gate, beta, state, K)
    return build


def gdn_leaves(S, H, T, n_seqs, kda=False, h_qk=None, seqs_qk=None, permuted=False):
    """q, k ([S, h_qk, T, seqs_qk], heads and sequences broadcast to v's; permuted: made from
    [S, T, h_qk, seqs_qk] leaves, rows contiguous but not the whole), v, g, beta, state."""
    h_qk, seqs_qk = h_qk or H, seqs_qk or n_seqs
    if permuted:
        qk = lambda lo: Leaf(F32, (S, T, h_qk, seqs_qk), low=lo, high=-lo, permute=(0, 2, 1, 3))  # noqa: E731
    else:
        qk = lambda lo: Leaf(F32, (S, h_qk, T, seqs_qk), low=lo, high=-lo)  # noqa: E731
    return [qk(-1.0), qk(-0.3), Leaf(F32, (S, H, T, n_seqs)),
            Leaf(F32, (S if kda else 1, H, T, n_seqs), low=-1, high=0),
            Leaf(F32, (1, H, T, n_seqs), low=0, high=1),
            Leaf(F32, (S, S, H, n_seqs))]


@pytest.mark.parametrize("n_threads", [1, 3, 4])
@pytest.mark.parametrize("S,H,T,n_seqs,kda", [(8, 2, 3, 1, False), (16, 3, 4, 2, True), (37, 2, 3, 1, False),
                                              (64, 2, 3, 2, True), (128, 2, 2, 1, False)])
def test_gated_delta_net(S, H, T, n_seqs, kda, n_threads):
    """Scalar and per-channel (KDA) gates; head sizes with and without vec_dot's leftovers."""
    check_op(gated_delta_net(1), gdn_leaves(S, H, T, n_seqs, kda), n_threads, exact=True)


@pytest.mark.parametrize("K,T", [(2, 3), (3, 3), (4, 4)])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_gated_delta_net_snapshots(K, T, n_threads):
    """K > 1: the state after each of the last K tokens, newest in slot 0 (the work buffer grows
    by a scratch state per thread: used_mem is compared)."""
    check_op(gated_delta_net(K), gdn_leaves(12, 4, T, 2, kda=True), n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_gated_delta_net_broadcast_and_strided_rows(n_threads):
    """q and k with fewer heads (taken modulo) and one sequence for two, rows strided."""
    leaves = gdn_leaves(16, 4, 3, 2, h_qk=2, seqs_qk=1, permuted=True)
    check_op(gated_delta_net(1), leaves, n_threads, exact=True)


@pytest.mark.parametrize("n_threads,nr", [(1, 6), (2, 6), (3, 6), (4, 3), (3, 40)])
def test_gated_delta_net_threads_take_chunks(n_threads, nr):
    """(head, sequence) pairs in ~4·nth chunks (one per thread when fewer than nth): thread ith
    starts with chunk ith, then takes free ones; every chunk once."""
    H, n_seqs = (nr, 1) if nr < 40 else (20, 2)
    (shares,) = engine_shares(gated_delta_net(1), gdn_leaves(4, H, 2, n_seqs), n_threads,
                              GGMLOp.GATED_DELTA_NET, all_threads=True)
    size = -(-nr // (4 * n_threads))
    nchunk = -(-nr // size)
    if n_threads == 1 or nchunk < n_threads:
        nchunk = n_threads
    dr = -(-nr // nchunk)
    chunks = {c: r for s in shares for c, r in s.ranges}
    assert sorted(chunks) == list(range(nchunk))
    assert all(tuple(r) == (min(dr * c, nr), min(dr * c + dr, nr)) for c, r in chunks.items())
    assert all(s.ranges[0][0] == s.ith for s in shares)


def test_gated_delta_net_asserts():
    ctx = new_ctx()
    t = lambda *ne, type_=F32: getattr(eng, f"ggml_new_tensor_{len(ne)}d")(ctx, type_, *ne)  # noqa: E731
    x, g1, beta, state = t(8, 2, 3, 1), t(1, 2, 3, 1), t(1, 2, 3, 1), t(8, 8, 2, 1)
    ops_ssm.ggml_gated_delta_net(ctx, x, x, x, g1, beta, state, 1)  # well formed
    cases = [
        ((x, x, x, t(4, 2, 3, 1), beta, state, 1), r"g->ne\[0\] == 1 \|\| g->ne\[0\] == S_v"),
        ((x, x, x, g1, t(2, 2, 3, 1), state, 1), r"beta->ne\[0\] == 1"),
        ((x, x, x, g1, beta, t(8, 8, 3, 1), 1), r"state->ne\[2\] == H"),
        ((x, x, x, g1, beta, t(8, 4, 2, 1), 1), r"state->ne\[1\] == S_v"),
        ((x, x, x, g1, beta, state, 0), r"K >= 1"),
        ((t(8, 2, 3, 1, type_=F16), x, x, g1, beta, state, 1), r"q->type == GGML_TYPE_F32"),
        ((x, eng.ggml_transpose(ctx, t(2, 8)), x, g1, beta, state, 1), r"ggml_is_contiguous_rows\(k\)"),
        ((x, x, x, g1, eng.ggml_view_4d(ctx, t(2, 2, 3, 1), 1, 2, 3, 1, 8, 16, 48, 0), state, 1),
         r"ggml_is_contiguous\(beta\)"),
    ]
    for args, msg in cases:
        with pytest.raises(GGMLAssertionError, match=msg):
            ops_ssm.ggml_gated_delta_net(ctx, *args)
