"""FLASH_ATTN_EXT against real ggml: the one-chunk, tiled and split-KV paths, masks, ALiBi,
softcap, sinks and GQA, with each thread's chunks compared with ggml's split.

As in test_ops_nn.py: the result's struct and used memory identical, values within
test-backend-ops' NMSE bound; thread shares read through the compute observer.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.optable import GGMLOp
from engine.core.types import GGMLType
from tests.support.graphs import Leaf, check_op, engine_result, engine_shares

F32, F16 = GGMLType.F32, GGMLType.F16
THREADS = [1, 2, 3, 4]


# --- flash_attn_ext --------------------------------------------------------------------------
# test-backend-ops bounds test_flash_attn_ext by NMSE 5e-4 for every type; F32 K/V here are held
# to 1e-7, F16 K/V (fp16 q and an fp16 V accumulator on the one_chunk path) to 5e-4.

def causal_mask(n_kv, n_q, n_q_pad, extra=0):
    m = np.zeros((n_q_pad, n_kv), np.float32)
    for i in range(n_q):
        m[i, n_kv - n_q + i + 1:] = -np.inf
    m[n_q:] = -np.inf
    if extra:
        m[:, :extra] = -np.inf  # some positions masked for every row
    return m


def fa_leaves(kv_type, dk, dv, n_q, n_kv, n_head, n_head_kv, n_batch=1, mask_heads=1,
              mask_batch=1, n_q_pad=None):
    n_q_pad = n_q_pad or n_q
    mask = np.broadcast_to(causal_mask(n_kv, n_q, n_q_pad),
                           (mask_batch, mask_heads, n_q_pad, n_kv))
    return [Leaf(F32, (dk, n_q, n_head, n_batch)), Leaf(kv_type, (dk, n_kv, n_head_kv, n_batch)),
            Leaf(kv_type, (dv, n_kv, n_head_kv, n_batch)),
            Leaf(F16, (n_kv, n_q_pad, mask_heads, mask_batch), values=mask)]


def fa(scale, max_bias=0.0, softcap=0.0, prec=None, sinks=False):
    def build(g, ctx, q, k, v, m, *rest):
        r = g.ggml_flash_attn_ext(ctx, q, k, v, m, scale, max_bias, softcap)
        if prec is not None:
            g.ggml_flash_attn_ext_set_prec(r, prec)
        if sinks:
            g.ggml_flash_attn_ext_add_sinks(r, rest[0])
        return r
    return build


def check_fa_chunks(shares, nr, nth):
    chunk_size = (nr + nth * 4 - 1) // (nth * 4)
    nchunk = (nr + chunk_size - 1) // chunk_size
    if nth == 1 or nchunk < nth:
        nchunk = nth
    dr = (nr + nchunk - 1) // nchunk
    taken = [c for s in shares for c in s.ranges]
    assert sorted(c for c, _ in taken) == list(range(nchunk))
    assert all(rng == (dr * c, min(dr * c + dr, nr)) for c, rng in taken)
    for s in shares:  # each thread starts with chunk ith
        assert s.ith >= nchunk or s.ranges[0][0] == s.ith


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("kv_type", [F32, F16])
def test_flash_attn_one_chunk_gqa(kv_type, n_threads):
    # 4 query heads on 2 KV heads, 7 queries (mask rows padded to 8), 33 KV positions
    leaves = fa_leaves(kv_type, 64, 64, 7, 33, 4, 2, n_q_pad=8)
    bound = 1e-7 if kv_type == F32 else 5e-4
    check_op(fa(0.125), leaves, n_threads, max_nmse=bound)
    shares = engine_shares(fa(0.125), leaves, n_threads, GGMLOp.FLASH_ATTN_EXT)[0]
    check_fa_chunks(shares, 7 * 4, n_threads)


@pytest.mark.parametrize("kv_type", [F32, F16])
def test_flash_attn_alibi_softcap_sinks_batch(kv_type):
    # 2 batches, mask per batch broadcast over heads, ALiBi over 6 heads (not a power of 2)
    leaves = fa_leaves(kv_type, 32, 48, 5, 20, 6, 3, n_batch=2, mask_batch=2) + \
        [Leaf(F32, (6,), low=-1, high=1)]
    bound = 1e-7 if kv_type == F32 else 5e-4
    check_op(fa(0.3, max_bias=4.0, softcap=2.5, prec=10, sinks=True), leaves, 3, max_nmse=bound)
    check_op(fa(0.2, sinks=True), leaves, 2, max_nmse=bound)


@pytest.mark.parametrize("kv_type", [F32, F16])
def test_flash_attn_tiled(kv_type):
    # >= 64 query rows and DV % 8 == 0: ggml's tiled path (q stays f32, V accumulates in f32)
    leaves = fa_leaves(kv_type, 32, 40, 70, 80, 2, 1)
    check_op(fa(0.17), leaves, 2, max_nmse=1e-7)
    shares = engine_shares(fa(0.17), leaves, 3, GGMLOp.FLASH_ATTN_EXT)[0]
    check_fa_chunks(shares, 70 * 2, 3)
    assert [n.key for n in shares[0].notes] == ["fa_tiled"]


@pytest.mark.parametrize("n_threads", [1, 2, 4])
@pytest.mark.parametrize("kv_type", [F32, F16])
def test_flash_attn_split_kv(kv_type, n_threads):
    # one query, one batch, >= 512 KV: KV chunks per thread, then heads merged in turn
    leaves = fa_leaves(kv_type, 32, 32, 1, 530, 4, 4, n_q_pad=1)
    bound = 1e-7 if kv_type == F32 else 5e-4
    check_op(fa(0.2), leaves, n_threads, max_nmse=bound)
    shares = engine_shares(fa(0.2), leaves, n_threads, GGMLOp.FLASH_ATTN_EXT)[0]
    cs = (530 + n_threads - 1) // n_threads
    assert [s.ranges for s in shares] == [((i * cs, min(i * cs + cs, 530)),)
                                          for i in range(n_threads)]


def test_flash_attn_permuted_views_no_mask():
    # q given as [DK, n_head, n_q] permuted to [DK, n_q, n_head]; K/V as views of a larger cache
    def build(g, ctx, q, kc, vc):
        qp = g.ggml_permute(ctx, q, 0, 2, 1, 3)
        k = g.ggml_view_3d(ctx, kc, 16, 9, 2, 16 * 4, 16 * 4 * 12, 0)
        v = g.ggml_view_3d(ctx, vc, 24, 9, 2, 24 * 4, 24 * 4 * 12, 0)
        return g.ggml_flash_attn_ext(ctx, qp, k, v, None, 0.25, 0.0, 0.0)
    check_op(build, [Leaf(F32, (16, 4, 3)), Leaf(F32, (16, 12, 2)), Leaf(F32, (24, 12, 2))], 2)


@pytest.mark.parametrize("case", ["one_chunk_f16", "tiled"])
def test_results_identical_for_1_to_4_threads(case):
    # (split-KV is left out: its result depends on nth in ggml as well)
    build, leaves = {
        "one_chunk_f16": (fa(0.125), fa_leaves(F16, 64, 64, 7, 33, 4, 2, n_q_pad=8)),
        "tiled": (fa(0.17), fa_leaves(F32, 32, 40, 70, 80, 2, 1)),
    }[case]
    first = engine_result(build, leaves, 1)
    for n in (2, 3, 4):
        assert engine_result(build, leaves, n) == first, f"{n} threads differ from 1"
