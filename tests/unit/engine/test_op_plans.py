"""One record per op: what ggml's planner asks of an op (ggml_get_n_tasks's case and the work-size
case of ggml_graph_plan) is declared where its kernel is registered, and plan.py only looks it up
(tests/conformance/test_plan_per_op.py holds the rules to real ggml)."""

from __future__ import annotations

import pytest

from engine import ggml as g
from engine.compute.kernels import KERNELS, NOT_SUPPORTED, kernel
from engine.compute.plan import ggml_get_n_tasks, node_work_size
from engine.core.optable import VIEW_OPS, GGMLOp


def test_every_op_with_a_kernel_declares_its_n_tasks_and_its_work_size():
    """The Python form of ggml's static_assert over its op table: every op computed here has
    both rules (so no op is left out of the planner), and every other op is a view or refused."""
    for op in GGMLOp:
        if op.name == "COUNT":
            continue
        info = KERNELS.get(op)
        if info is None:
            assert op in VIEW_OPS or op in NOT_SUPPORTED, op.name
            continue
        assert callable(info.n_tasks) and callable(info.work), op.name


def test_a_registration_without_its_plan_is_refused():
    with pytest.raises(TypeError, match="n_tasks"):
        kernel(GGMLOp.ADD, work=lambda node, n_tasks: 0)
    with pytest.raises(TypeError, match="work"):
        kernel(GGMLOp.ADD, n_tasks=lambda node, n_threads: 1)


def test_the_planner_reads_the_kernels_rules():
    """SUB shares ADD's kernel and is planned apart; a view and an op without a kernel take one
    task and no work."""
    ctx = g.ggml_init(g.ggml_init_params(1 << 20, no_alloc=True))
    a = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 12)
    q = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_Q4_0, 64, 12)
    assert ggml_get_n_tasks(g.ggml_add(ctx, a, a), 6) == 6
    assert ggml_get_n_tasks(g.ggml_sub(ctx, a, a), 6) == 1
    assert ggml_get_n_tasks(g.ggml_soft_max(ctx, g.ggml_view_2d(ctx, a, 64, 3, 256, 0)), 6) == 3
    add_q = g.ggml_add(ctx, q, a)
    assert node_work_size(add_q, 6) == 4 * 64 * 6  # a row of floats per task
    view = g.ggml_transpose(ctx, a)
    assert (ggml_get_n_tasks(view, 6), node_work_size(view, 6)) == (1, 0)
    forged = g.ggml_add(ctx, a, a)
    forged.op = GGMLOp.FLASH_ATTN_BACK  # (no graph can hold one: its constructor aborts)
    assert (ggml_get_n_tasks(forged, 6), node_work_size(forged, 6)) == (1, 0)
