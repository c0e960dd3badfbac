"""The kernel table tells the truth: every op of ggml's enum is computed, is a view (nothing to
compute), or is listed as not supported with a reason — exactly one of the three."""

from __future__ import annotations

import pytest

from engine.compute.kernels import KERNELS, NOT_SUPPORTED, compute_forward
from engine.core.errors import GGMLNotSupportedError
from engine.core.optable import VIEW_OPS, GGMLOp


def test_every_op_has_a_kernel_or_a_reason():
    for op in GGMLOp:
        if op.name == "COUNT":
            continue
        homes = [op in KERNELS, op in VIEW_OPS, op in NOT_SUPPORTED]
        assert sum(homes) == 1, f"{op.name}: kernel {homes[0]}, view {homes[1]}, not supported {homes[2]}"
    assert all(reason.strip() for reason in NOT_SUPPORTED.values())


def test_a_node_without_a_kernel_raises_its_reason():
    class Node:  # the fields compute_forward reads of a tensor
        op, type, src = GGMLOp.FLASH_ATTN_BACK, 0, [None] * 10

    with pytest.raises(GGMLNotSupportedError,
                       match="FLASH_ATTN_BACK is not supported.*ggml_flash_attn_back aborts in ggml 0.15.3"):
        compute_forward(None, Node())


def test_a_prepared_node_follows_its_inputs_and_its_structs():
    """A node computed again reuses its prepared call (engine.compute.kernels.common.prepared):
    new input values are read, a changed struct (here src1 swapped for another tensor) prepares
    it again, and every thread's share is still reported."""
    import numpy as np

    from engine import ggml as g

    ctx = g.ggml_init(g.ggml_init_params(1 << 20))
    a, b, c = (g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 8, 6) for _ in range(3))
    rng = np.random.default_rng(0)
    for t in (a, b, c):
        g.set_data(t, rng.standard_normal((6, 8), dtype=np.float32))
    y = g.ggml_add(ctx, a, b)
    gf = g.ggml_new_graph(ctx)
    g.ggml_build_forward_expand(gf, y)
    seen = []

    def observer(node, ask, shares):
        if not ask:
            seen.append(sorted(s.ranges for s in shares))
        return True

    def data(t):
        return g.ggml_get_data_f32(t).reshape(6, 8)

    for _ in range(2):
        g.set_data(a, rng.standard_normal((6, 8), dtype=np.float32))
        g.ggml_graph_compute_with_ctx(ctx, gf, 2, observer)
        np.testing.assert_array_equal(data(y), data(a) + data(b))
    y.src[1] = c  # the node now reads c: its struct changed
    g.ggml_graph_compute_with_ctx(ctx, gf, 2, observer)
    np.testing.assert_array_equal(data(y), data(a) + data(c))
    assert seen == [[((0, 3),), ((3, 6),)]] * 3


def test_a_kernel_names_its_loop_in_c_for_the_nodes_that_run_it():
    """KernelInfo.in_c (what the thread pool and the Kernel tab read): a loop of engine._lanes
    with its numpy twin, run for F32 nodes of its sub-op only (F16 SILU is numpy's)."""
    from engine import ggml as g
    from engine.lanes import TWINS

    loops = [info.in_c for info in KERNELS.values() if info.in_c is not None]
    assert loops and all(loop.lane in TWINS for loop in loops)
    ctx = g.ggml_init(g.ggml_init_params(1 << 20))
    f32, f16 = (g.ggml_new_tensor_1d(ctx, t, 8) for t in (g.GGML_TYPE_F32, g.GGML_TYPE_F16))
    unary = KERNELS[GGMLOp.UNARY]
    assert unary.loop_in_c(g.ggml_silu(ctx, f32)).lane == "v_silu"
    assert unary.loop_in_c(g.ggml_silu(ctx, f16)) is None
    assert unary.loop_in_c(g.ggml_gelu(ctx, f32)) is None
    assert KERNELS[GGMLOp.SOFT_MAX].loop_in_c(g.ggml_soft_max(ctx, f32)).lane == "soft_max"


def test_a_graph_of_ready_calls_runs_on_the_calling_thread(monkeypatch):
    """Unwatched, a graph whose every node is a ready call runs them on the thread that called
    ggml_graph_compute: no Python thread is woken for it (its C loops share their rows between
    the compute's threads themselves), at any thread count. Watched, the pool's threads run it."""
    import numpy as np

    from engine import ggml as g
    from engine.compute import threadpool

    ctx = g.ggml_init(g.ggml_init_params(1 << 20))
    a, b = (g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 8, 6) for _ in range(2))
    y = g.ggml_mul(ctx, g.ggml_add(ctx, a, b), b)
    gf = g.ggml_new_graph(ctx)
    g.ggml_build_forward_expand(gf, y)
    rng = np.random.default_rng(0)
    pool_runs = []
    run = threadpool._POOL.run
    monkeypatch.setattr(threadpool._POOL, "run", lambda fn, n: (pool_runs.append(n), run(fn, n)))
    for n_threads in (1, 2, 3):
        for t in (a, b):
            g.set_data(t, rng.standard_normal((6, 8), dtype=np.float32))
        g.ggml_graph_compute_with_ctx(ctx, gf, n_threads)
        va, vb = (g.ggml_get_data_f32(t) for t in (a, b))
        np.testing.assert_array_equal(g.ggml_get_data_f32(y), (va + vb) * vb)
    assert pool_runs == []
    g.ggml_graph_compute_with_ctx(ctx, gf, 2, lambda node, ask, shares: True)
    assert pool_runs == [2]
