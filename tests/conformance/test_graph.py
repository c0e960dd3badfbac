"""Graphs and plans against real ggml: layout in the pool, visit order, names, hash set, plan."""

from __future__ import annotations

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.core.graph import ggml_graph_nbytes, ggml_hash_size
from engine.core.types import GGMLType
from tests.conformance.test_arena import assert_same_run
from tests.support.pools import run_both

F32, F16, Q4_0 = int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.Q4_0)
MB = 1 << 20


@pytest.mark.parametrize("size", [1, 2, 8, 16, 64, 100, 1024, 2048, 4096, 65536])
@pytest.mark.parametrize("grads", [False, True])
def test_graph_overhead(size, grads):
    assert eng.ggml_graph_overhead_custom(size, grads) == real.ggml_graph_overhead_custom(size, grads)


def test_hash_size_table():
    # ggml-python does not bind ggml_hash_size (an internal function): call it in the library
    import ctypes
    import pathlib

    lib = ctypes.CDLL(str(pathlib.Path(real.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_hash_size.restype = ctypes.c_size_t
    lib.ggml_hash_size.argtypes = [ctypes.c_size_t]
    for n in [0, 1, 2, 3, 4, 6, 12, 100, 4097, 2**31 + 12, 2147483660, 5_000_000_000]:
        assert ggml_hash_size(n) == lib.ggml_hash_size(n)


def test_graph_nbytes_matches_the_object_ggml_allocates():
    def program(g):
        ctx = g.init(4 * MB)
        g.ggml_new_graph_custom(ctx, 100, True)
        g.ggml_new_graph(ctx)
    ours, theirs = run_both(program)
    sizes = [o["size"] for o in theirs.snapshots[-1]["pools"][0]["objects"]]
    assert [o["size"] for o in ours.snapshots[-1]["pools"][0]["objects"]] == sizes
    assert sizes[0] == -(-ggml_graph_nbytes(100, True) // 16) * 16


def sc_simple_ctx_graph(g):
    ctx = g.init(4 * 2 * 4 + 3 * 2 * 4 + 2 * 368 + 82608 + 1024)
    a = g.ggml_new_tensor_2d(ctx, F32, 2, 4)
    b = g.ggml_new_tensor_2d(ctx, F32, 2, 3)
    gf = g.ggml_new_graph(ctx)
    result = g.ggml_mul_mat(ctx, a, b)
    g.ggml_build_forward_expand(gf, result)
    g.ggml_graph_compute_with_ctx(ctx, gf, 1)  # adds the (empty) work buffer object


def sc_diamond(g):
    # x is used by two branches; names are given only to some tensors
    ctx = g.init(4 * MB)
    x = g.ggml_new_tensor_2d(ctx, F32, 8, 4)
    g.ggml_set_name(x, "x")
    w = g.ggml_new_tensor_2d(ctx, F32, 8, 6)
    b = g.ggml_new_tensor_1d(ctx, F32, 6)
    h = g.ggml_mul_mat(ctx, w, x)
    h2 = g.ggml_add(ctx, h, b)
    g.ggml_set_name(h2, "h2")
    sq = g.ggml_mul(ctx, x, x)
    t = g.ggml_transpose(ctx, h2)
    c = g.ggml_cont(ctx, t)
    out = g.ggml_add(ctx, g.ggml_reshape_2d(ctx, c, 6, 4), g.ggml_view_2d(ctx, h, 6, 1, 24, 0))
    gf = g.ggml_new_graph_custom(ctx, 64, False)
    g.ggml_build_forward_expand(gf, sq)
    g.ggml_build_forward_expand(gf, out)
    g.ggml_build_forward_expand(gf, out)  # a second expand adds nothing
    g.ggml_graph_compute_with_ctx(ctx, gf, 3)


def sc_two_graphs_and_cpy(g):
    ctx = g.init(8 * MB)
    a = g.ggml_new_tensor_1d(ctx, F32, 16)
    k = g.ggml_new_tensor_1d(ctx, F16, 64)
    g.ggml_set_name(k, "cache_k")
    v = g.ggml_view_1d(ctx, k, 16, 32)
    cp = g.ggml_cpy(ctx, a, v)
    gf = g.ggml_new_graph(ctx)
    g.ggml_build_forward_expand(gf, cp)
    g2 = g.ggml_new_graph_custom(ctx, 4096, False)
    g.ggml_graph_cpy(gf, g2)
    g.ggml_graph_clear(gf)
    g.ggml_build_forward_expand(gf, g.ggml_add(ctx, a, a))
    g.ggml_graph_compute_with_ctx(ctx, g2, 2)


def sc_quantized_plan(g):
    # the reference's work-size example: mul_mat(Q4_0 [64x8], F32 [64x5])
    ctx = g.init(4 * MB)
    w = g.ggml_new_tensor_2d(ctx, Q4_0, 64, 8)
    x = g.ggml_new_tensor_2d(ctx, F32, 64, 5)
    gf = g.ggml_new_graph(ctx)
    g.ggml_build_forward_expand(gf, g.ggml_mul_mat(ctx, w, x))
    g.ggml_graph_compute_with_ctx(ctx, gf, 4)


@pytest.mark.parametrize("program", [sc_simple_ctx_graph, sc_diamond, sc_two_graphs_and_cpy,
                                     sc_quantized_plan], ids=lambda f: f.__name__[3:])
def test_graph_programs(program):
    """Pools equal after every call: graph struct, node/leaf order, names, use counts, work buffer."""
    assert_same_run(program)


# --- plans -----------------------------------------------------------------------------------

def _plan_both(build, n_threads):
    ectx = eng.ggml_init(eng.ggml_init_params(16 * MB, no_alloc=True))
    rctx = real.ggml_init(real.ggml_init_params(mem_size=16 * MB, mem_buffer=None, no_alloc=True))
    try:
        plans = []
        for g, ctx in ((eng, ectx), (real, rctx)):
            gf = g.ggml_new_graph(ctx)
            g.ggml_build_forward_expand(gf, build(g, ctx))
            p = g.ggml_graph_plan(gf, n_threads, None)
            plans.append((p.n_threads, p.work_size))
        return plans
    finally:
        real.ggml_free(rctx)


@pytest.mark.parametrize("n_threads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("case", ["f32", "q4_0", "f16", "q4_k_batch", "sub_only", "cpy_q"])
def test_plan(case, n_threads):
    def build(g, ctx):
        if case == "sub_only":  # SUB plans a single task
            a = g.ggml_new_tensor_2d(ctx, F32, 64, 8)
            return g.ggml_sub(ctx, a, a)
        if case == "cpy_q":
            a = g.ggml_new_tensor_2d(ctx, F32, 64, 8)
            return g.ggml_cpy(ctx, a, g.ggml_new_tensor_2d(ctx, Q4_0, 64, 8))
        wt = {"f32": F32, "q4_0": Q4_0, "f16": F16, "q4_k_batch": int(GGMLType.Q4_K)}[case]
        w = g.ggml_new_tensor_2d(ctx, wt, 256, 8)
        x = g.ggml_new_tensor_2d(ctx, F32, 256, 5 if case != "q4_k_batch" else 32)
        return g.ggml_add(ctx, g.ggml_mul_mat(ctx, w, x), g.ggml_new_tensor_1d(ctx, F32, 8))
    ours, theirs = _plan_both(build, n_threads)
    assert ours == theirs


# --- names and queries -----------------------------------------------------------------------

def test_graph_queries_and_print(capsys):
    ctx = eng.ggml_init(eng.ggml_init_params(4 * MB))
    a = eng.ggml_new_tensor_2d(ctx, F32, 3, 2)
    b = eng.ggml_new_tensor_2d(ctx, F32, 3, 2)
    eng.ggml_set_name(b, "b")
    s = eng.ggml_add(ctx, a, b)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, s)
    assert eng.ggml_graph_n_nodes(gf) == 1 and eng.ggml_graph_size(gf) == 2048
    assert eng.ggml_graph_node(gf, -1) == s == eng.ggml_graph_node(gf, 0)
    assert eng.ggml_graph_get_tensor(gf, "b") == b
    assert eng.ggml_graph_get_tensor(gf, "leaf_0") == a
    assert gf.use_count(a) == 1 and gf.use_count(s) == 0
    with pytest.raises(eng.GGMLAssertionError, match="cgraph->n_nodes"):
        eng.ggml_graph_node(gf, 1)
    view = eng.ggml_graph_view(gf, 0, 1)
    assert view.nodes == [s] and view.n_leafs == 0
    text = eng.ggml_graph_print(gf)
    assert "n_nodes = 1" in text and "ADD" in text and " b" in capsys.readouterr().out


def test_graph_too_small_is_a_clear_error():
    ctx = eng.ggml_init(eng.ggml_init_params(4 * MB))
    x = eng.ggml_new_tensor_1d(ctx, F32, 4)
    y = x
    for _ in range(5):
        y = eng.ggml_add(ctx, y, x)
    gf = eng.ggml_new_graph_custom(ctx, 4, False)
    with pytest.raises(eng.GGMLAssertionError, match="cgraph->n_nodes < cgraph->size"):
        eng.ggml_build_forward_expand(gf, y)


def _real_dot(build) -> tuple[str, str]:
    """dump_dot of the same graph from both; addresses replaced by first-appearance ids."""
    import ctypes
    import re
    import tempfile

    texts = []
    ectx = eng.ggml_init(eng.ggml_init_params(4 * MB))
    rctx = real.ggml_init(real.ggml_init_params(mem_size=4 * MB, mem_buffer=None, no_alloc=False))
    try:
        for g, ctx in ((eng, ectx), (real, rctx)):
            gf = g.ggml_new_graph(ctx)
            g.ggml_build_forward_expand(gf, build(g, ctx))
            with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
                if g is eng:
                    g.ggml_graph_dump_dot(gf, None, f.name)
                else:  # ggml-python declares the graph arguments as pointers to its cgraph struct
                    p = ctypes.cast(gf, ctypes.POINTER(real.ggml_cgraph))
                    g.ggml_graph_dump_dot(p, p, f.name.encode())
                text = open(f.name).read()
            ids: dict[str, str] = {}
            texts.append(re.sub(r"0x[0-9a-f]+", lambda m: ids.setdefault(m[0], f"T{len(ids)}"), text))
    finally:
        real.ggml_free(rctx)
    return texts[0], texts[1]


def test_dump_dot_matches_ggml():
    def build(g, ctx):
        a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)
        g.ggml_set_name(a, "a" if g is eng else b"a")
        s = g.ggml_new_tensor_1d(ctx, F32, 1)  # < 5 elements with data: drawn with (#)
        m = g.ggml_mul(ctx, g.ggml_new_tensor_3d(ctx, F32, 4, 3, 2), a)
        return g.ggml_add(ctx, g.ggml_cont(ctx, g.ggml_permute(ctx, m, 1, 0, 2, 3)),
                          g.ggml_view_3d(ctx, g.ggml_add(ctx, s, s), 1, 1, 1, 4, 4, 0))
    ours, theirs = _real_dot(build)
    assert ours == theirs


def test_results_do_not_depend_on_thread_count():
    outs = []
    for n in (1, 2, 3, 4, 8):
        ctx = eng.ggml_init(eng.ggml_init_params(16 * MB))
        w = eng.ggml_new_tensor_2d(ctx, F32, 96, 70)
        x = eng.ggml_new_tensor_2d(ctx, F32, 96, 33)
        rng = np.random.default_rng(7)
        eng.set_data(w, rng.standard_normal((70, 96)).astype(np.float32))
        eng.set_data(x, rng.standard_normal((33, 96)).astype(np.float32))
        out = eng.ggml_add(ctx, eng.ggml_mul_mat(ctx, w, x), eng.ggml_new_f32(ctx, 0.5))
        gf = eng.ggml_new_graph(ctx)
        eng.ggml_build_forward_expand(gf, out)
        eng.ggml_graph_compute_with_ctx(ctx, gf, n)
        outs.append(eng.to_numpy(out).copy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("n_threads", [1, 2, 3, 4, 8])
def test_reported_shares_are_ggml_splits(n_threads):
    """The observer sees each thread's share; they follow ggml's split formulas for the op."""
    from engine.compute.kernels.matmul import chunking

    ctx = eng.ggml_init(eng.ggml_init_params(16 * MB))
    w = eng.ggml_new_tensor_2d(ctx, F32, 32, 70)
    x = eng.ggml_new_tensor_2d(ctx, F32, 32, 33)
    mm = eng.ggml_mul_mat(ctx, w, x)
    out = eng.ggml_add(ctx, mm, mm)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    seen = {}

    def observer(node, ask, shares):
        if not ask:
            seen[node.name] = shares
        return True
    assert eng.ggml_graph_compute_with_ctx(ctx, gf, n_threads, observer) == 0
    nth = n_threads
    # mul_mat: chunks of ggml's grid, each exactly once, thread ith starting with chunk ith
    nchunk0, nchunk1, dr0, dr1 = chunking(70, 33, nth)
    chunks = sorted(c[0] for s in seen[mm.name] for c in s.ranges)
    assert chunks == list(range(nchunk0 * nchunk1))
    for s in seen[mm.name]:
        if s.ranges:
            assert s.ranges[0][0] == s.ith
    # add: rows [dr*ith, min(dr*ith + dr, nr)) with dr = ceil(nr/nth)
    dr = -(-33 // nth)
    assert [s.ranges[0] for s in seen[out.name]] == \
        [(min(dr * i, 33), min(dr * i + dr, 33)) for i in range(nth)]


def _two_adds():
    """y = x + x, z = y + x (x all ones), built into a graph: (ctx, gf, y, z)."""
    ctx = eng.ggml_init(eng.ggml_init_params(4 * MB))
    x = eng.ggml_new_tensor_1d(ctx, F32, 4)
    eng.ggml_set_f32(x, 1.0)
    y = eng.ggml_add(ctx, x, x)
    z = eng.ggml_add(ctx, y, x)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, z)
    return ctx, gf, y, z


def test_abort_callback_and_observer_stop():
    ctx, gf, y, z = _two_adds()
    eng.ggml_set_f32(z, -7.0)
    stopped = eng.ggml_graph_compute_with_ctx(ctx, gf, 2, lambda node, ask, shares: ask)
    assert stopped == eng.GGML_STATUS_ABORTED
    assert eng.ggml_get_f32_1d(y, 0) == 2.0 and eng.ggml_get_f32_1d(z, 0) == -7.0
    plan = eng.ggml_graph_plan(gf, 2)
    plan.abort_callback = lambda data: True
    assert eng.ggml_graph_compute(gf, plan) == eng.GGML_STATUS_ABORTED


def test_abort_callback_heard_after_a_compute_without_one():
    """A graph computed unwatched runs its prepared calls in a row; computed again with an
    abort callback, it is polled after each node again: the compute stops after the first."""
    _ctx, gf, _y, z = _two_adds()
    for n_threads in (1, 2):
        plan = eng.ggml_graph_plan(gf, n_threads)
        assert eng.ggml_graph_compute(gf, plan) == eng.GGML_STATUS_SUCCESS
        assert eng.ggml_get_f32_1d(z, 0) == 3.0
        eng.ggml_set_f32(z, -7.0)
        plan.abort_callback = lambda data: True  # the same plan, the same work buffer
        assert eng.ggml_graph_compute(gf, plan) == eng.GGML_STATUS_ABORTED
        assert eng.ggml_get_f32_1d(z, 0) == -7.0


def test_unsupported_op_is_named():
    ctx = eng.ggml_init(eng.ggml_init_params(4 * MB))
    a = eng.ggml_new_tensor_1d(ctx, int(GGMLType.I16), 4)
    y = eng.ggml_add(ctx, a, a)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, y)
    with pytest.raises(eng.GGMLNotSupportedError, match="ADD is not supported on this backend"):
        eng.ggml_graph_compute_with_ctx(ctx, gf, 2)
