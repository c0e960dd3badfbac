"""Autodiff against real ggml: the same backward graph (every node's op, name, shape, strides and
op_params, in order), the same gradients, the same optimizer steps.

Each case builds a forward graph on both engines from the same leaves, marks some leaves as
parameters, sums the output into a scalar loss (as test-backend-ops does), then calls
ggml_build_backward_expand, ggml_graph_reset and computes the whole graph.
"""

from __future__ import annotations

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.core.errors import GGMLAssertionError
from engine.core.types import GGMLType
from tests.support.graphs import MEM, Leaf, _new_leaf, _result, _write, leaf_bytes, nmse, values

F32, I32 = GGMLType.F32, GGMLType.I32


def _run(api, build, leaves, params, datas, n_threads, step=None):
    """Forward + backward on one engine; returns (node results, leaf names, param grads,
    param values after the step, used_mem)."""
    if api is eng:
        ctx = eng.ggml_init(eng.ggml_init_params(MEM))
    else:
        ctx = real.ggml_init(real.ggml_init_params(mem_size=MEM, mem_buffer=None, no_alloc=False))
    ts = []
    for i, (leaf, data) in enumerate(zip(leaves, datas)):
        t = _new_leaf(api, ctx, leaf)
        _write(api, t, data)
        if i in params:
            api.ggml_set_param(t)
        ts.append(t)
    out = build(api, ctx, *ts)
    loss = out if _is_scalar(api, out) else api.ggml_sum(ctx, out)
    api.ggml_set_loss(loss)
    gf = api.ggml_new_graph_custom(ctx, 1024, True)
    api.ggml_build_forward_expand(gf, loss)
    api.ggml_build_backward_expand(ctx, gf, None)
    grads = [api.ggml_graph_get_grad(gf, ts[i]) for i in sorted(params)]
    if step is not None:
        for i, g in zip(sorted(params), grads):
            api.ggml_build_forward_expand(gf, step(api, ctx, ts[i], g))
    api.ggml_graph_reset(gf)
    assert api.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
    n = api.ggml_graph_n_nodes(gf)
    nodes = [_result(api, api.ggml_graph_node(gf, k)) for k in range(n)]
    grad_values = [values(_result(api, g)) if g else None for g in grads]
    after = [values(_result(api, ts[i])) for i in sorted(params)]
    used = api.ggml_used_mem(ctx)
    if api is not eng:
        real.ggml_free(ctx)
    return nodes, grad_values, after, used


def _is_scalar(api, t) -> bool:
    ne = list(t.ne) if api is eng else list(t.contents.ne)
    return all(int(x) == 1 for x in ne)


def check_grad(build, leaves, params, n_threads=1, exact=True, max_nmse=1e-10, seed=0,
               step=None):
    rng = np.random.default_rng(seed)
    datas = [leaf_bytes(leaf, rng) for leaf in leaves]
    ours = _run(eng, build, leaves, set(params), datas, n_threads, step)
    theirs = _run(real, build, leaves, set(params), datas, n_threads, step)
    (o_nodes, o_grads, o_after, o_used), (r_nodes, r_grads, r_after, r_used) = ours, theirs
    assert [n["name"] for n in o_nodes] == [n["name"] for n in r_nodes]
    for a, b in zip(o_nodes, r_nodes):
        for key in ("type", "ne", "nb", "op", "op_params", "name"):
            assert a[key] == b[key], f"node '{b['name']}' {key}: ours {a[key]} vs ggml {b[key]}"
    assert o_used == r_used
    for k, (a, b) in enumerate(zip(o_grads + o_after, r_grads + r_after)):
        assert (a is None) == (b is None)
        if a is None:
            continue
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=f"value {k}")
        else:
            assert nmse(a, b) <= max_nmse, f"value {k}: NMSE {nmse(a, b):.3g}"
    for a, b in zip(o_nodes, r_nodes):  # every node's data, the backward ones included
        va, vb = values(a), values(b)
        if exact:
            np.testing.assert_array_equal(va, vb, err_msg=f"node '{b['name']}'")
        else:
            finite = np.isfinite(vb)
            assert nmse(va[finite], vb[finite]) <= max_nmse, f"node '{b['name']}'"


M = (8, 5)  # a small matrix


UNARY = ["abs", "neg", "relu", "silu", "exp", "expm1", "softplus", "sgn", "step"]


@pytest.mark.parametrize("name", UNARY)
def test_unary(name):
    check_grad(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a), [Leaf(F32, M)], [0])


@pytest.mark.parametrize("name", ["sqr", "sqrt", "log", "sin", "cos", "sum", "sum_rows",
                                  "mean", "cont", "transpose"])
def test_simple(name):
    leaf = Leaf(F32, M, low=0.1, high=2.0)
    check_grad(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a), [leaf], [0])


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("shape_b", [M, (8, 1), (1, 5)])
def test_binary(name, shape_b):
    leaves = [Leaf(F32, M, low=0.5, high=2.0), Leaf(F32, shape_b, low=0.5, high=2.0)]
    build = lambda g, ctx, a, b: getattr(g, f"ggml_{name}")(ctx, a, b)  # noqa: E731
    if name in ("sub", "div") and shape_b != M:
        # ggml has no repeat_back in SUB's and DIV's rules: a broadcast src1 gets a gradient of
        # src0's shape, and ggml aborts on its own shape check (so the oracle is not called)
        with pytest.raises(GGMLAssertionError, match="ggml_are_same_shape\\(src1"):
            _run(eng, build, leaves, {0, 1}, [leaf_bytes(x, np.random.default_rng(0))
                                              for x in leaves], 1)
        return
    check_grad(build, leaves, [0, 1])


def test_only_some_leaves_are_parameters():
    leaves = [Leaf(F32, M), Leaf(F32, M)]
    check_grad(lambda g, ctx, a, b: g.ggml_mul(ctx, a, b), leaves, [1])


@pytest.mark.parametrize("ne_a, ne_b", [((16, 4), (16, 3)), ((32, 6, 2), (32, 5, 2)),
                                        ((8, 3, 1), (8, 2, 4)), ((40, 7), (40, 9))])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_mul_mat(ne_a, ne_b, n_threads):
    check_grad(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
               [Leaf(F32, ne_a), Leaf(F32, ne_b)], [0, 1], n_threads)


def test_scale_add1_repeat_and_views():
    def build(g, ctx, a, b, c):
        x = g.ggml_scale(ctx, a, 0.75)
        x = g.ggml_add1(ctx, x, c)
        y = g.ggml_repeat(ctx, b, x)
        z = g.ggml_mul(ctx, x, y)
        v = g.ggml_view_2d(ctx, z, 4, 3, z.nb[1] if g is eng else z.contents.nb[1], 8)
        r = g.ggml_reshape_2d(ctx, g.ggml_cont(ctx, v), 6, 2)
        p = g.ggml_cont(ctx, g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, x, 4, 2, 5), 2, 0, 1, 3))
        return g.ggml_add(ctx, g.ggml_sum(ctx, g.ggml_sqr(ctx, r)),
                          g.ggml_sum(ctx, g.ggml_sin(ctx, p)))
    # c is no parameter: ggml's ADD1 rule gives src1 a per-row mean, not src1's shape
    check_grad(build, [Leaf(F32, M), Leaf(F32, (8, 1)), Leaf(F32, (1,))], [0, 1])


def test_rms_norm_silu_swiglu_chain():
    def build(g, ctx, x, w, u):
        h = g.ggml_mul(ctx, g.ggml_rms_norm(ctx, x, 1e-5), w)
        a = g.ggml_mul_mat(ctx, u, h)
        return g.ggml_swiglu_split(ctx, g.ggml_silu(ctx, a), a)
    check_grad(build, [Leaf(F32, (16, 4)), Leaf(F32, (16, 1)), Leaf(F32, (16, 8))], [0, 1, 2],
               n_threads=2)


def test_soft_max_and_diag_mask():
    def build(g, ctx, a, b):
        kq = g.ggml_mul_mat(ctx, a, b)
        return g.ggml_soft_max(ctx, g.ggml_diag_mask_inf(ctx, kq, 0))
    check_grad(build, [Leaf(F32, (8, 6)), Leaf(F32, (8, 6))], [0, 1], n_threads=3)


def test_get_rows():
    idx = Leaf(I32, (5,), values=np.array([3, 0, 3, 1, 4]))
    check_grad(lambda g, ctx, a, i: g.ggml_get_rows(ctx, a, i), [Leaf(F32, (6, 7)), idx], [0])


def test_cross_entropy_loss():
    labels = np.eye(10, dtype=np.float32)[[3, 1, 7, 0]]
    def build(g, ctx, w, x, y):
        return g.ggml_cross_entropy_loss(ctx, g.ggml_mul_mat(ctx, w, x), y)
    check_grad(build, [Leaf(F32, (12, 10)), Leaf(F32, (12, 4)), Leaf(F32, (10, 4), values=labels)],
               [0], n_threads=2)


def test_acc_and_set():
    def build(g, ctx, a, b):
        nb1 = a.nb[1] if g is eng else a.contents.nb[1]
        x = g.ggml_acc(ctx, a, b, nb1, nb1 * 5, nb1 * 5, 4)
        return g.ggml_set_2d(ctx, x, g.ggml_scale(ctx, b, 2.0), nb1, 8)
    check_grad(build, [Leaf(F32, M), Leaf(F32, (3, 2))], [0, 1])


def test_gradient_accumulates_where_a_tensor_is_used_twice():
    def build(g, ctx, a, b):
        return g.ggml_add(ctx, g.ggml_mul(ctx, a, b), g.ggml_sqr(ctx, g.ggml_sub(ctx, a, b)))
    check_grad(build, [Leaf(F32, M), Leaf(F32, M)], [0, 1])


def _adamw(g, ctx, w, grad):
    ne = list(w.ne) if g is eng else list(w.contents.ne)
    new = getattr(g, "ggml_new_tensor_2d")
    m, v = new(ctx, int(F32), ne[0], ne[1]), new(ctx, int(F32), ne[0], ne[1])
    p = g.ggml_new_tensor_1d(ctx, int(F32), 7)
    vals = np.float32([1e-2, 0.9, 0.999, 1e-8, 0.1, 1 / (1 - 0.9), 1 / (1 - 0.999)])
    for t, x in ((m, np.full(ne[0] * ne[1], 0.05, np.float32)),
                 (v, np.full(ne[0] * ne[1], 0.02, np.float32)), (p, vals)):
        _write(g, t, x.tobytes())
    return g.ggml_opt_step_adamw(ctx, w, grad, m, v, p)


def _sgd(g, ctx, w, grad):
    p = g.ggml_new_tensor_1d(ctx, int(F32), 2)
    _write(g, p, np.float32([3e-2, 0.25]).tobytes())
    return g.ggml_opt_step_sgd(ctx, w, grad, p)


@pytest.mark.parametrize("step", [_adamw, _sgd], ids=["adamw", "sgd"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_optimizer_steps(step, n_threads):
    """The parameters after one step (ggml_graph_reset zeroes AdamW's moments first)."""
    check_grad(lambda g, ctx, w, x: g.ggml_mul_mat(ctx, w, x),
               [Leaf(F32, (16, 6)), Leaf(F32, (16, 3))], [0], n_threads, step=step)


def test_graph_dup_keeps_the_gradients():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    a = eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_F32, 4)
    eng.ggml_set_param(a)
    loss = eng.ggml_sum(ctx, eng.ggml_sqr(ctx, a))
    eng.ggml_set_loss(loss)
    gf = eng.ggml_new_graph_custom(ctx, 64, True)
    eng.ggml_build_forward_expand(gf, loss)
    eng.ggml_build_backward_expand(ctx, gf, None)
    dup = eng.ggml_graph_dup(ctx, gf, False)
    assert eng.ggml_graph_get_grad(dup, a).address == eng.ggml_graph_get_grad(gf, a).address
    assert eng.ggml_graph_get_grad_acc(dup, loss).address == \
        eng.ggml_graph_get_grad_acc(gf, loss).address
    plain = eng.ggml_new_graph_custom(ctx, 64, False)
    eng.ggml_build_forward_expand(plain, loss)
    assert eng.ggml_graph_get_grad(plain, a) is None
    assert eng.ggml_graph_get_grad(eng.ggml_graph_dup(ctx, plain, True), a) is None


def test_misuse_names_ggmls_assertion():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    a = eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_F32, 4)
    loss = eng.ggml_sum(ctx, a)
    gf = eng.ggml_new_graph_custom(ctx, 64, True)
    eng.ggml_build_forward_expand(gf, loss)
    with pytest.raises(GGMLAssertionError, match="ggml_set_param"):
        eng.ggml_build_backward_expand(ctx, gf, None)
    eng.ggml_set_param(a)  # a parameter is a node of the graphs built from now on
    gf = eng.ggml_new_graph_custom(ctx, 64, True)
    eng.ggml_build_forward_expand(gf, loss)
    with pytest.raises(GGMLAssertionError, match="ggml_set_loss"):
        eng.ggml_build_backward_expand(ctx, gf, None)
    no_grads = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(no_grads, loss)
    with pytest.raises(GGMLAssertionError, match="cgraph->grads"):
        eng.ggml_build_backward_expand(ctx, no_grads, None)
    b = eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_F32, 4)
    with pytest.raises(GGMLAssertionError, match="GGML_TENSOR_FLAG_PARAM"):
        eng.ggml_opt_step_sgd(ctx, b, b, eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_F32, 2))


def test_dump_dot_of_a_backward_graph_matches_ggml():
    """Gradient nodes drawn as their forward node (dashed edges), colours and <g> ports."""
    import re
    import tempfile

    texts = []
    for api in (eng, real):
        if api is eng:
            ctx = eng.ggml_init(eng.ggml_init_params(1 << 22))
        else:
            ctx = real.ggml_init(real.ggml_init_params(mem_size=1 << 22, mem_buffer=None,
                                                       no_alloc=False))
        a, b = (api.ggml_new_tensor_2d(ctx, int(F32), 4, 3) for _ in range(2))
        api.ggml_set_param(a)
        loss = api.ggml_sum(ctx, api.ggml_mul(ctx, api.ggml_silu(ctx, a), b))
        api.ggml_set_loss(loss)
        gf = api.ggml_new_graph_custom(ctx, 64, True)
        api.ggml_build_forward_expand(gf, loss)
        gb = api.ggml_graph_dup(ctx, gf, True)
        api.ggml_build_backward_expand(ctx, gb, None)
        with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
            if api is eng:
                eng.ggml_graph_dump_dot(gb, gf, f.name)
            else:
                import ctypes
                cast = lambda g: ctypes.cast(g, ctypes.POINTER(real.ggml_cgraph))  # noqa: E731
                real.ggml_graph_dump_dot(cast(gb), cast(gf), f.name.encode())
            text = open(f.name).read()
        ids: dict[str, str] = {}
        texts.append(re.sub(r"0x[0-9a-f]+", lambda m: ids.setdefault(m[0], f"T{len(ids)}"),
                            text))
        if api is real:
            real.ggml_free(ctx)
    assert "dashed" in texts[1] and "green" in texts[1] and "<g>" in texts[1]
    assert texts[0] == texts[1]


@pytest.mark.parametrize("is_2d, s, p, d", [(True, 1, 0, 1), (True, 2, 1, 1), (True, 1, 1, 2),
                                            (False, 2, 1, 1)])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_im2col(is_2d, s, p, d, n_threads):
    """IM2COL's image gets its gradient through IM2COL_BACK (the kernel only gives the shape)."""
    if is_2d:
        img, kern = Leaf(F32, (7, 6, 3, 2)), Leaf(F32, (3, 2, 3, 4))
    else:
        img, kern = Leaf(F32, (9, 3, 2)), Leaf(F32, (3, 3, 4))

    def build(g, ctx, k, x):  # sqr: a gradient that differs from element to element
        return g.ggml_sqr(ctx, g.ggml_im2col(ctx, k, x, s, s, p, p, d, d, is_2d, int(F32)))
    check_grad(build, [kern, img], [1], n_threads)


@pytest.mark.parametrize("op", [0, 1], ids=["max", "avg"])
@pytest.mark.parametrize("k, s, p", [(2, 2, 0), (3, 1, 1), (3, 2, 1)])
def test_pool_2d(op, k, s, p):
    def build(g, ctx, x):
        return g.ggml_sqr(ctx, g.ggml_pool_2d(ctx, x, op, k, k, s, s, p, p))
    check_grad(build, [Leaf(F32, (7, 6, 3, 2))], [0])
