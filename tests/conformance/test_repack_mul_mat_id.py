"""MUL_MAT_ID of experts in the CPU_REPACK buffer type (a MoE layer's 3-D weights on llama.cpp's
default path), as a ggml program makes it, against llama.cpp's ggml doing the same
(tests/support/llamacpp_ggml.py, a job with ids and repack=True).

The program allocates the experts' context in CPU_REPACK (the buffer's set_tensor repacks every
expert's matrix), sets their bytes, and computes dst = ggml_mul_mat_id(experts, x, ids) on the
CPU backend (tensor_traits::forward_mul_mat_id: every activation row by gemv, each thread a fixed
range of every expert's weight rows). For every layout the build has, several experts, 2 used a
token, 1, 3, 4 and 9 tokens, src1 with one row a token (broadcast to the slots, as the gate and up
projections read it) or one a slot (as the down projection), 1 to 3 threads: the repacked bytes,
dst and the plan's work size must be real ggml's, bit for bit, computed unwatched and watched
(the thread shares then cover every expert's weight rows once).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.compute.shares import ShareKind
from engine.compute.threadpool import COMPUTE_OBSERVER
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType
from engine.ggml import (ggml_build_forward_expand, ggml_free, ggml_get_data_f32, ggml_graph_plan, ggml_init,
                         ggml_init_params, ggml_mul_mat_id, ggml_nbytes, ggml_new_graph, ggml_new_tensor)
from engine.ggml_alloc import ggml_backend_alloc_ctx_tensors_from_buft
from engine.ggml_backend import (ggml_backend_buffer_free, ggml_backend_cpu_buffer_type, ggml_backend_cpu_init,
                                 ggml_backend_cpu_set_n_threads, ggml_backend_free, ggml_backend_graph_compute,
                                 ggml_backend_tensor_set)
from engine.quants import quantize
from engine.quants.repack import LAYOUTS
from tests.conformance.test_repack_mul_mat import repack_buft
from tests.support.llamacpp_ggml import MulMat, mul_mat_many, work_sizes

TYPES = sorted(LAYOUTS, key=int)
N_USED = 2
# (K, weight rows, experts, tokens, src1 rows a token (1: broadcast to the slots), threads)
CASES = [(256, 16, 4, 1, 1, 1), (256, 16, 4, 3, 2, 3), (512, 40, 8, 4, 1, 2), (256, 24, 6, 9, 2, 3),
         (512, 64, 4, 9, 1, 1), (256, 8, 8, 4, 2, 2), (256, 48, 3, 3, 1, 2)]


def case_inputs(type_: GGMLType, rng, k: int, rows: int, n_as: int, n_tok: int, n_b: int):
    """The experts' blocks (as the file holds them), the activations (magnitudes from 0.01 to
    300) and each token's N_USED distinct experts."""
    w = quantize(type_, rng.standard_normal((n_as * rows, k)).astype(np.float32)).reshape(-1).view(np.uint8)
    x = (rng.standard_normal((n_tok, n_b, k)) * rng.choice([0.01, 1, 300], (n_tok, n_b, k))).astype(np.float32)
    ids = np.array([rng.permutation(n_as)[:N_USED] for _ in range(n_tok)], np.int32)
    return w, x, ids


def engine_mul_mat_id(type_: GGMLType, w: np.ndarray, ne_w: tuple[int, int, int], x: np.ndarray,
                      ids: np.ndarray, n_threads: int, watched: bool):
    """(dst, the experts' bytes in the CPU_REPACK buffer, the plan's work size, the MUL_MAT_ID
    node's thread shares when watched), computed by the engine on its CPU backend."""
    wctx = ggml_init(ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=True))
    ctx = ggml_init(ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    wt = ggml_new_tensor(wctx, type_, 3, list(ne_w))
    xt = ggml_new_tensor(ctx, GGMLType.F32, 3, list(reversed(x.shape)))
    it = ggml_new_tensor(ctx, GGMLType.I32, 2, list(reversed(ids.shape)))
    dst = ggml_mul_mat_id(ctx, wt, xt, it)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, dst)
    wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buft())
    buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type())
    ggml_backend_tensor_set(wt, w, 0, ggml_nbytes(wt))
    ggml_backend_tensor_set(xt, x, 0, ggml_nbytes(xt))
    ggml_backend_tensor_set(it, ids, 0, ggml_nbytes(it))
    lo = wt.data - wbuf.base
    packed = wbuf.pool[lo:lo + ggml_nbytes(wt)].copy()
    size = ggml_graph_plan(gf, n_threads).work_size
    backend = ggml_backend_cpu_init()
    ggml_backend_cpu_set_n_threads(backend, n_threads)
    shares = []

    def observer(node, ask, done):
        if not ask and node.op == GGMLOp.MUL_MAT_ID:
            shares.extend(done)
        return True

    token = COMPUTE_OBSERVER.set(observer if watched else None)
    try:
        assert ggml_backend_graph_compute(backend, gf) == 0
    finally:
        COMPUTE_OBSERVER.reset(token)
    out = ggml_get_data_f32(dst).copy().reshape(*ids.shape, ne_w[1])
    ggml_backend_free(backend)
    ggml_backend_buffer_free(buf)
    ggml_backend_buffer_free(wbuf)
    ggml_free(ctx)
    ggml_free(wctx)
    return out, packed, size, shares


def assert_shares_cover(shares, ids: np.ndarray, rows: int, n_threads: int) -> None:
    """Every expert a token chose: its weight rows split between the threads without overlap,
    each thread's range [ith * rows / nth, (ith + 1) * rows / nth) with its ends rounded up to 8,
    against all the expert's rows."""
    assert len(shares) == n_threads and all(s.kind == ShareKind.CHUNKS for s in shares)
    counts = np.bincount(ids.reshape(-1))
    for e in np.flatnonzero(counts):
        got = sorted((s.ith, tuple(r.rows), tuple(r.cols)) for s in shares for r in s.ranges if r.chunk == f"e{e}")
        want = []
        for ith in range(n_threads):
            a, b = -(-(ith * rows // n_threads) // 8) * 8, min(-(-((ith + 1) * rows // n_threads) // 8) * 8, rows)
            if a < b:
                want.append((ith, (a, b), (0, int(counts[e]))))
        assert got == want, f"expert {e}"


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_repacked_mul_mat_id_is_llama_cpps(type_, tmp_path):
    rng = np.random.default_rng(100 + int(type_))
    jobs, mine = [], []
    for k, rows, n_as, n_tok, n_b, n_threads in CASES:
        w, x, ids = case_inputs(type_, rng, k, rows, n_as, n_tok, n_b)
        jobs.append(MulMat(type_, w, (k, rows, n_as), x, n_threads, repack=True, ids=ids))
        mine.append([engine_mul_mat_id(type_, w, (k, rows, n_as), x, ids, n_threads, watched)
                     for watched in (False, True)])
    theirs = mul_mat_many(jobs, tmp_path)
    sizes = work_sizes(jobs, tmp_path)
    for job, (dst, packed), size, runs in zip(jobs, theirs, sizes, mine):
        what = f"{type_.name} {job.ne_w} tokens {len(job.ids)} threads {job.n_threads}"
        for (ours, our_packed, our_size, shares), watched in zip(runs, (False, True)):
            np.testing.assert_array_equal(our_packed, packed, err_msg=what)
            np.testing.assert_array_equal(ours.view(np.uint32), dst.view(np.uint32),
                                          err_msg=f"{what} watched={watched}")
            assert our_size == size, what
        assert_shares_cover(runs[1][3], job.ids, job.ne_w[1], job.n_threads)
