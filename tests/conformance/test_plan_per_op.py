"""Each op's plan against real ggml: a graph of one node of the op (CONT's reads a transposed
view, a node of one task with nothing to compute), planned for 1, 3 and 8 threads, has ggml's
thread count (min(n_tasks, n_threads): the op's n_tasks rule) and ggml's work size (the op's
work-size rule). The rules are declared where each kernel is registered (`@kernel(...,
n_tasks=, work=)`, engine.compute.kernels); this holds every rule but all_threads, one_thread
and no_work to the oracle, and a sample of the ops of those."""

from __future__ import annotations

import ggml as real
import pytest

from engine import ggml as eng
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType

F32, F16, BF16, I32 = (int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.BF16),
                       int(GGMLType.I32))
Q4_0, Q8_0 = int(GGMLType.Q4_0), int(GGMLType.Q8_0)
MB = 1 << 20


def t(g, ctx, type_: int, *ne: int):
    return getattr(g, f"ggml_new_tensor_{len(ne)}d")(ctx, type_, *ne)


# op -> (what the graph's node is, built with either API: g is `eng` or `real`)
BUILDS = {
    # the ops of one thread (SUB: ADD, MUL and DIV's kernel, planned apart), and of every thread
    "sub": lambda g, c: g.ggml_sub(c, t(g, c, F32, 64, 12), t(g, c, F32, 64, 12)),
    "sqr": lambda g, c: g.ggml_sqr(c, t(g, c, F32, 64, 12)),
    "sum_rows": lambda g, c: g.ggml_sum_rows(c, t(g, c, F32, 64, 12)),
    "get_rows": lambda g, c: g.ggml_get_rows(c, t(g, c, F32, 64, 12), t(g, c, I32, 5)),
    "scale": lambda g, c: g.ggml_scale(c, t(g, c, F32, 64, 12), 2.0),
    "mul": lambda g, c: g.ggml_mul(c, t(g, c, F32, 64, 12), t(g, c, F32, 64, 12)),
    "rms_norm": lambda g, c: g.ggml_rms_norm(c, t(g, c, F32, 64, 12), 1e-6),
    "cont": lambda g, c: g.ggml_cont(c, g.ggml_transpose(c, t(g, c, F32, 64, 12))),
    # UNARY by its sub-op; SOFT_MAX and the WKV ops at most a thread per row or per head
    "gelu": lambda g, c: g.ggml_gelu(c, t(g, c, F32, 64, 12)),
    "relu": lambda g, c: g.ggml_relu(c, t(g, c, F32, 64, 12)),
    "soft_max_3_rows": lambda g, c: g.ggml_soft_max(c, t(g, c, F32, 64, 3)),
    "soft_max": lambda g, c: g.ggml_soft_max(c, t(g, c, F32, 64, 12)),
    "rwkv_wkv6_2_heads": lambda g, c: g.ggml_rwkv_wkv6(
        c, *(t(g, c, F32, 8, 2, 5) for _ in range(3)), t(g, c, F32, 8, 2), t(g, c, F32, 8, 2, 5),
        t(g, c, F32, 8 * 8 * 2, 1)),
    # the work sizes
    "add_q4_0": lambda g, c: g.ggml_add(c, t(g, c, Q4_0, 64, 12), t(g, c, F32, 64, 12)),
    "add1_q4_0": lambda g, c: g.ggml_add1(c, t(g, c, Q4_0, 64, 12), t(g, c, F32, 1)),
    "acc": lambda g, c: g.ggml_acc(c, t(g, c, F32, 64, 12), t(g, c, F32, 8, 2), 256, 3072, 3072, 0),
    "cpy_q8_0": lambda g, c: g.ggml_cpy(c, t(g, c, F32, 64, 12), t(g, c, Q8_0, 64, 12)),
    "cpy_f16_bf16": lambda g, c: g.ggml_cpy(c, t(g, c, F16, 64, 12), t(g, c, BF16, 64, 12)),
    "cpy_f32_i32": lambda g, c: g.ggml_cpy(c, t(g, c, F32, 64, 12), t(g, c, I32, 64, 12)),
    "cpy_f32_f16": lambda g, c: g.ggml_cpy(c, t(g, c, F32, 64, 12), t(g, c, F16, 64, 12)),
    "count_equal": lambda g, c: g.ggml_count_equal(c, t(g, c, I32, 64, 12), t(g, c, I32, 64, 12)),
    "mul_mat_f32": lambda g, c: g.ggml_mul_mat(c, t(g, c, F32, 64, 12), t(g, c, F32, 64, 5)),
    "mul_mat_q4_0": lambda g, c: g.ggml_mul_mat(c, t(g, c, Q4_0, 64, 12), t(g, c, F32, 64, 5)),
    "mul_mat_id_q4_0": lambda g, c: g.ggml_mul_mat_id(
        c, t(g, c, Q4_0, 64, 12, 4), t(g, c, F32, 64, 2, 5), t(g, c, I32, 2, 5)),
    "out_prod_q4_0": lambda g, c: g.ggml_out_prod(c, t(g, c, Q4_0, 64, 12), t(g, c, F32, 7, 12)),
    "conv_transpose_1d_f16": lambda g, c: g.ggml_conv_transpose_1d(
        c, t(g, c, F16, 3, 4, 5), t(g, c, F32, 10, 5), 1, 0, 1),
    "conv_transpose_1d_f32": lambda g, c: g.ggml_conv_transpose_1d(
        c, t(g, c, F32, 3, 4, 5), t(g, c, F32, 10, 5), 2, 0, 1),
    "conv_transpose_2d": lambda g, c: g.ggml_conv_transpose_2d_p0(
        c, t(g, c, F16, 3, 3, 4, 5), t(g, c, F32, 6, 7, 5), 2),
    "conv_2d": lambda g, c: g.ggml_conv_2d_direct(
        c, t(g, c, F32, 3, 3, 4, 5), t(g, c, F32, 9, 9, 4, 1), 1, 1, 0, 0, 1, 1),
    "rope": lambda g, c: g.ggml_rope(c, t(g, c, F32, 64, 4, 6), t(g, c, I32, 6), 64, 0),
    "top_k": lambda g, c: g.ggml_top_k(c, t(g, c, F32, 64, 12), 4),
    "flash_attn_ext": lambda g, c: g.ggml_flash_attn_ext(
        c, t(g, c, F32, 64, 5, 4), t(g, c, F16, 64, 32, 2), t(g, c, F16, 48, 32, 2), None,
        0.125, 0.0, 0.0),
    "gated_delta_net_k2": lambda g, c: g.ggml_gated_delta_net(
        c, *(t(g, c, F32, 16, 2, 3, 1) for _ in range(3)), t(g, c, F32, 1, 2, 3, 1),
        t(g, c, F32, 1, 2, 3, 1), t(g, c, F32, 16, 16, 2, 1), 2),
    "cross_entropy_loss": lambda g, c: g.ggml_cross_entropy_loss(
        c, t(g, c, F32, 64, 12), t(g, c, F32, 64, 12)),
}


def plans(build, n_threads: int) -> list[tuple[str, int, int]]:
    """(the last node's op, the plan's n_threads, its work size) in the engine and in ggml."""
    ectx = eng.ggml_init(eng.ggml_init_params(16 * MB, no_alloc=True))
    rctx = real.ggml_init(real.ggml_init_params(mem_size=16 * MB, mem_buffer=None, no_alloc=True))
    try:
        out = []
        for g, ctx in ((eng, ectx), (real, rctx)):
            node = build(g, ctx)
            gf = g.ggml_new_graph(ctx)
            g.ggml_build_forward_expand(gf, node)
            p = g.ggml_graph_plan(gf, n_threads, None)
            last = g.ggml_graph_node(gf, -1)
            op = last.op if g is eng else last.contents.op
            out.append((GGMLOp(int(op)).name, p.n_threads, p.work_size))
        return out
    finally:
        real.ggml_free(rctx)


@pytest.mark.parametrize("n_threads", [1, 3, 8])
@pytest.mark.parametrize("case", sorted(BUILDS))
def test_a_node_is_planned_as_ggml_plans_it(case, n_threads):
    ours, theirs = plans(BUILDS[case], n_threads)
    assert ours == theirs


def test_the_cases_cover_every_rule():
    """Each rule other than all_threads, one_thread and no_work is met by a case (a case that
    plans nothing new would not show a rule wrong)."""
    from engine.compute.kernels import KERNELS, all_threads, no_work, one_thread

    ops = {plans(build, 3)[0][0] for build in BUILDS.values()}
    special = {GGMLOp(op).name for op, info in KERNELS.items()
               if info.n_tasks not in (all_threads, one_thread) or info.work is not no_work}
    # (the custom ops' n_tasks is test_ops_custom's; GATED_LINEAR_ATTN and RWKV_WKV7 share
    # RWKV_WKV6's rule, CONV_3D CONV_2D's, ROPE_BACK ROPE's, ADD_ID ADD1's: one case each)
    shared = {"MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM", "GATED_LINEAR_ATTN",
              "RWKV_WKV7", "CONV_3D", "ROPE_BACK", "ADD_ID", "DUP"}
    assert special - shared <= ops, special - shared - ops
