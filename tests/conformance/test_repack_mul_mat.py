"""MUL_MAT of a weight in the CPU_REPACK buffer type, as a ggml program makes it, against
llama.cpp's ggml doing the same (tests/support/llamacpp_ggml.py, repack=True).

The program asks the CPU device for its extra buffer types through the registry's proc address
(as llama.cpp does), allocates the weight's context in CPU_REPACK, sets the weight's bytes (the
buffer repacks them) and computes dst = w · x on the CPU backend. The repacked bytes and dst must
be real ggml's, bit for bit, for every layout the build has, at 1 to 9 activation rows (gemv,
gemm and both), 1 to 3 threads, and 3-D activations (planes).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.types import GGMLType
from engine.ggml import (ggml_build_forward_expand, ggml_free, ggml_init, ggml_init_params, ggml_mul_mat,
                         ggml_nbytes, ggml_new_graph, ggml_new_tensor, ggml_get_data_f32)
from engine.ggml_alloc import ggml_backend_alloc_ctx_tensors_from_buft
from engine.ggml_backend import (ggml_backend_buffer_free, ggml_backend_cpu_buffer_type, ggml_backend_cpu_init,
                                 ggml_backend_cpu_reg, ggml_backend_cpu_set_n_threads, ggml_backend_free,
                                 ggml_backend_graph_compute, ggml_backend_reg_dev_get,
                                 ggml_backend_reg_get_proc_address, ggml_backend_tensor_set)
from engine.quants import quantize
from engine.quants.repack import LAYOUTS
from tests.support.llamacpp_ggml import MulMat, mul_mat_many

TYPES = sorted(LAYOUTS, key=int)


def repack_buft():
    reg = ggml_backend_cpu_reg()
    extra = ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
    [buft] = [b for b in extra(ggml_backend_reg_dev_get(reg, 0)) if b.name == "CPU_REPACK"]
    return buft


def engine_mul_mat(type_: GGMLType, w: np.ndarray, ne_w: tuple[int, int], x: np.ndarray,
                   n_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(dst, the weight's bytes as they lie in the CPU_REPACK buffer), computed by the engine."""
    wctx = ggml_init(ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=True))
    ctx = ggml_init(ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    wt = ggml_new_tensor(wctx, type_, 2, list(ne_w))
    xt = ggml_new_tensor(ctx, GGMLType.F32, x.ndim, list(reversed(x.shape)))
    dst = ggml_mul_mat(ctx, wt, xt)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, dst)
    wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buft())
    buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type())
    ggml_backend_tensor_set(wt, w, 0, ggml_nbytes(wt))
    ggml_backend_tensor_set(xt, x, 0, ggml_nbytes(xt))
    lo = wt.data - wbuf.base
    packed = wbuf.pool[lo:lo + ggml_nbytes(wt)].copy()
    backend = ggml_backend_cpu_init()
    ggml_backend_cpu_set_n_threads(backend, n_threads)
    assert ggml_backend_graph_compute(backend, gf) == 0
    out = ggml_get_data_f32(dst).copy().reshape(*x.shape[:-1], ne_w[1])
    ggml_backend_free(backend)
    ggml_backend_buffer_free(buf)
    ggml_backend_buffer_free(wbuf)
    ggml_free(ctx)
    ggml_free(wctx)
    return out, packed


CASES = [(256, 16, (1,)), (256, 16, (4,)), (512, 64, (5,)), (512, 24, (9,)), (256, 8, (2, 3)),
         (1024, 32, (7,))]


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_repacked_mul_mat_is_llama_cpps(type_, tmp_path):
    rng = np.random.default_rng(int(type_))
    jobs, mine = [], []
    for n_threads, (k, rows, lead) in zip([1, 2, 3, 2, 3, 1], CASES):
        w = quantize(type_, rng.standard_normal((rows, k)).astype(np.float32)).reshape(-1).view(np.uint8)
        x = (rng.standard_normal((*lead, k)) * rng.choice([0.01, 1, 300], (*lead, k))).astype(np.float32)
        jobs.append(MulMat(type_, w, (k, rows), x, n_threads, repack=True))
        mine.append(engine_mul_mat(type_, w, (k, rows), x, n_threads))
    for job, (theirs, packed), (ours, our_packed) in zip(jobs, mul_mat_many(jobs, tmp_path), mine):
        np.testing.assert_array_equal(our_packed, packed)
        np.testing.assert_array_equal(ours.reshape(-1), theirs.reshape(-1))
