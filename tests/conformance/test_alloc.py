"""The graph allocator's plan equals real ggml's: every offset and every compute buffer size.

Each graph is built twice with the same code — on the engine in a no_alloc context, and on real
ggml (ggml-python) in a no_alloc context — then real ggml's `ggml_gallocr_alloc_graph` on the CPU
buffer type writes each tensor's `data`; the offset `data - base of the compute buffer` of every
leaf, node and source must equal the engine's planned offset, tensors real ggml leaves without
data (views, pre-allocated) must be absent from the engine's plan, and
`ggml_gallocr_get_buffer_size` must agree.
"""

from __future__ import annotations

import ctypes
import random

import ggml as real
import pytest

from engine.backend import alloc
from engine import backend as be
from engine import ggml as eng
from engine.core.errors import GGMLAssertionError

MEM = 64 * 1024 * 1024
F32 = 0


def _engine(build):
    ctx = eng.ggml_init(eng.ggml_init_params(MEM, None, True))
    outs = build(eng, ctx)
    gf = eng.ggml_new_graph_custom(ctx, 2048, False)
    for o in outs:
        eng.ggml_build_forward_expand(gf, o)
    galloc = alloc.ggml_gallocr_new(alloc.CPU_BUFT)
    plan = galloc.reserve(gf)
    return gf, plan, galloc


_BACKEND = []


def _real_backend():
    # ggml-python's binding of ggml_backend_cpu_buffer_type returns a bad pointer (calling it
    # crashes gallocr), so the CPU buffer type comes from a CPU backend as in ggml's examples
    if not _BACKEND:
        _BACKEND.append(real.ggml_backend_cpu_init())
    return _BACKEND[0]


def _real(build):
    ctx = real.ggml_init(real.ggml_init_params(mem_size=MEM, mem_buffer=None, no_alloc=True))
    outs = build(real, ctx)
    gf = real.ggml_new_graph_custom(ctx, 2048, False)
    for o in outs:
        real.ggml_build_forward_expand(gf, o)
    galloc = real.ggml_gallocr_new(real.ggml_backend_get_default_buffer_type(_real_backend()))
    assert real.ggml_gallocr_alloc_graph(galloc, gf)
    size = real.ggml_gallocr_get_buffer_size(galloc, 0)
    return ctx, gf, galloc, size


def _tensors(api, gf):
    n_nodes, n_leafs = api.ggml_graph_n_nodes(gf), (gf.contents.n_leafs if api is real else gf.n_leafs)
    nodes = [api.ggml_graph_node(gf, i) for i in range(n_nodes)]
    leafs = [gf.contents.leafs[i] for i in range(n_leafs)] if api is real else list(gf.leafs)
    return leafs + nodes


def check_plan(build):
    gf_e, plan, galloc_e = _engine(build)
    ctx_r, gf_r, galloc_r, size_r = _real(build)
    try:
        te, tr = _tensors(eng, gf_e), _tensors(real, gf_r)
        assert len(te) == len(tr)
        n_placed = 0
        for e, r in zip(te, tr):
            rc = r.contents
            assert eng.ggml_get_name(e) == rc.name.decode()
            if rc.view_src:  # views get data from their view_src (ggml_backend_view_init)
                assert e not in plan.addresses
                continue
            base = real.ggml_backend_buffer_get_base(rc.buffer)
            got = plan.addresses.get(e)
            assert got is not None, f"{rc.name.decode()}: real ggml allocated it, the plan did not"
            assert got[1] == 0  # one chunk: the CPU buffer type has no max size
            assert got[2] == rc.data - base, rc.name.decode()
            n_placed += 1
        assert n_placed > 0
        assert alloc.ggml_gallocr_get_buffer_size(galloc_e, 0) == size_r
        # ggml_gallocr_alloc_graph writes buffer and data as real ggml does, views included
        assert alloc.ggml_gallocr_alloc_graph(galloc_e, gf_e)
        for e, r in zip(te, tr):
            rc = r.contents
            if not rc.data:
                assert e.data is None
                continue
            real_off = rc.data - real.ggml_backend_buffer_get_base(rc.buffer)
            buf = be.tensor_buffer(e)
            assert buf is not None and e.data - buf.base == real_off, rc.name.decode()
        alloc.ggml_gallocr_free(galloc_e)
    finally:
        real.ggml_gallocr_free(galloc_r)
        real.ggml_free(ctx_r)
    return plan


def _named(g, t, name):
    g.ggml_set_name(t, name.encode() if g is real else name)
    return t


def simple_backend(g, ctx):
    a = _named(g, g.ggml_new_tensor_2d(ctx, F32, 2, 4), "a")
    b = _named(g, g.ggml_new_tensor_2d(ctx, F32, 2, 3), "b")
    return [_named(g, g.ggml_mul_mat(ctx, a, b), "result")]


def chain_inplace(g, ctx):
    x = _named(g, g.ggml_new_tensor_2d(ctx, F32, 64, 8), "x")
    g.ggml_set_input(x)
    y = _named(g, g.ggml_new_tensor_2d(ctx, F32, 64, 8), "y")
    g.ggml_set_input(y)
    h = _named(g, g.ggml_add(ctx, x, y), "h")
    h = _named(g, g.ggml_scale(ctx, h, 0.5), "h2")
    h = _named(g, g.ggml_silu(ctx, h), "h3")
    s = _named(g, g.ggml_soft_max(ctx, h), "sm")
    m = _named(g, g.ggml_mul(ctx, s, h), "m")  # h has two children: not reused in place by sm
    return [_named(g, g.ggml_sum_rows(ctx, m), "out")]


def attention(g, ctx):
    d, n, h = 16, 7, 2
    x = _named(g, g.ggml_new_tensor_2d(ctx, F32, d * h, n), "x")
    g.ggml_set_input(x)
    wq = _named(g, g.ggml_new_tensor_2d(ctx, F32, d * h, d * h), "wq")
    wk = _named(g, g.ggml_new_tensor_2d(ctx, F32, d * h, d * h), "wk")
    wv = _named(g, g.ggml_new_tensor_2d(ctx, F32, d * h, d * h), "wv")
    q = g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, g.ggml_mul_mat(ctx, wq, x), d, h, n), 0, 2, 1, 3)
    k = g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, g.ggml_mul_mat(ctx, wk, x), d, h, n), 0, 2, 1, 3)
    v = g.ggml_cont(ctx, g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, g.ggml_mul_mat(ctx, wv, x), d, h, n),
                                        1, 2, 0, 3))
    kq = g.ggml_mul_mat(ctx, k, q)
    kq = g.ggml_soft_max_ext(ctx, kq, None, 0.25, 0.0)
    kqv = g.ggml_mul_mat(ctx, v, kq)
    merged = g.ggml_cont(ctx, g.ggml_permute(ctx, kqv, 0, 2, 1, 3))
    out = g.ggml_reshape_2d(ctx, merged, d * h, n)
    out = g.ggml_add(ctx, out, x)
    out = g.ggml_rms_norm(ctx, out, 1e-6)
    g.ggml_set_output(out)
    return [_named(g, out, "attn_out")]


def test_simple_backend_graph():
    plan = check_plan(simple_backend)
    assert any(d.kind == "alloc" for d in plan.decisions)


def test_chain_reuses_parents_in_place():
    plan = check_plan(chain_inplace)
    assert any(d.kind == "inplace" for d in plan.decisions)
    assert any(d.kind == "free" for d in plan.decisions)


def test_attention_block():
    check_plan(attention)


def random_dag(seed):
    """A seeded random graph of element-wise (in-place-able) ops, products, views and copies."""
    def build(g, ctx):
        rng = random.Random(seed)
        pool = []
        for i in range(rng.randint(2, 4)):
            t = _named(g, g.ggml_new_tensor_2d(ctx, F32, 8 * rng.randint(1, 4), 8), f"in{i}")
            if rng.random() < 0.5:
                g.ggml_set_input(t)
            pool.append(t)
        for i in range(rng.randint(4, 18)):
            a = rng.choice(pool)
            same = [t for t in pool if t.contents.ne[:] == a.contents.ne[:]] if g is real else \
                [t for t in pool if list(t.ne) == list(a.ne)]
            b = rng.choice(same)
            k = rng.randrange(8)
            if k == 0:
                t = g.ggml_add(ctx, a, b)
            elif k == 1:
                t = g.ggml_mul(ctx, a, b)
            elif k == 2:
                t = g.ggml_scale(ctx, a, 1.5)
            elif k == 3:
                t = g.ggml_gelu(ctx, a)
            elif k == 4:
                t = g.ggml_soft_max(ctx, a)
            elif k == 5:
                t = g.ggml_cont(ctx, g.ggml_transpose(ctx, a))
            elif k == 6:
                ne0 = (a.contents.ne[0] if g is real else int(a.ne[0]))
                t = g.ggml_view_2d(ctx, a, ne0 // 2, 8, (a.contents.nb[1] if g is real else int(a.nb[1])), 0)
                t = g.ggml_sqr(ctx, t)
            else:
                t = g.ggml_mul_mat(ctx, a, b)
            t = _named(g, t, f"n{i}")
            if rng.random() < 0.15:
                g.ggml_set_output(t)
            pool.append(t)
        return [pool[-1], rng.choice(pool)]
    return build


@pytest.mark.parametrize("seed", range(40))
def test_random_dags(seed):
    check_plan(random_dag(seed))


def test_reserve_keeps_the_larger_buffer_and_reserve_n_size_reports_the_need():
    gf_big, _, galloc = _engine(attention)
    big = alloc.ggml_gallocr_get_buffer_size(galloc, 0)
    ctx = eng.ggml_init(eng.ggml_init_params(MEM, None, True))
    small = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(small, simple_backend(eng, ctx)[0])
    assert alloc.ggml_gallocr_reserve_n_size(galloc, small, None, None)[0] < big
    galloc.reserve(small)
    assert alloc.ggml_gallocr_get_buffer_size(galloc, 0) == big
    with pytest.raises(GGMLAssertionError, match="buffer_id >= 0"):
        alloc.ggml_gallocr_get_buffer_size(galloc, 1)


def test_dyn_allocator_best_fit_merge_and_chunks():
    # a max size splits allocations into chunks as ggml's vbuffer does; frees merge neighbours
    d = alloc.DynAllocator(32, 256)
    a = d.alloc(100)
    b = d.alloc(100)
    c = d.alloc(100)
    assert a == (0, 0) and b == (0, 128) and c == (1, 0)
    d.free_bytes(a, 100)
    d.free_bytes(b, 100)
    assert d.chunks[0].free_blocks == [[0, 256]]


def test_one_gallocr_over_changing_graphs():
    """One gallocr reused for graphs of different shapes: the buffer only grows, as in ggml, and
    every tensor's offset in it equals real ggml's after each ggml_gallocr_alloc_graph."""
    builds = [simple_backend, attention, chain_inplace, random_dag(3), attention, random_dag(7)]
    galloc_e = alloc.ggml_gallocr_new(alloc.CPU_BUFT)
    galloc_r = real.ggml_gallocr_new(real.ggml_backend_get_default_buffer_type(_real_backend()))
    sizes = []
    try:
        for build in builds:
            ctx_e = eng.ggml_init(eng.ggml_init_params(MEM, None, True))
            gf_e = eng.ggml_new_graph_custom(ctx_e, 2048, False)
            for o in build(eng, ctx_e):
                eng.ggml_build_forward_expand(gf_e, o)
            ctx_r = real.ggml_init(real.ggml_init_params(mem_size=MEM, mem_buffer=None, no_alloc=True))
            gf_r = real.ggml_new_graph_custom(ctx_r, 2048, False)
            for o in build(real, ctx_r):
                real.ggml_build_forward_expand(gf_r, o)
            assert real.ggml_gallocr_alloc_graph(galloc_r, gf_r)
            assert alloc.ggml_gallocr_alloc_graph(galloc_e, gf_e)
            size = real.ggml_gallocr_get_buffer_size(galloc_r, 0)
            assert alloc.ggml_gallocr_get_buffer_size(galloc_e, 0) == size
            sizes.append(size)
            for e, r in zip(_tensors(eng, gf_e), _tensors(real, gf_r)):
                rc = r.contents
                if rc.data:
                    buf = be.tensor_buffer(e)
                    assert e.data - buf.base == rc.data - real.ggml_backend_buffer_get_base(rc.buffer)
            real.ggml_free(ctx_r)
        assert len(set(sizes)) > 1 and sizes == sorted(sizes)
    finally:
        real.ggml_gallocr_free(galloc_r)
        alloc.ggml_gallocr_free(galloc_e)


def encoder(n_layers, d=16, h=4, n=9, ff=64):
    """A BERT-like encoder (MiniLM's structure at small size): per layer fused-free attention with
    a mask, residuals, layer norms with weight and bias, a GELU feed-forward; weights are leafs."""
    def build(g, ctx):
        dm = d * h
        def w(name, *ne):
            t = g.ggml_new_tensor(ctx, F32, len(ne), (ctypes.c_int64 * 4)(*ne, *([1] * (4 - len(ne))))) \
                if g is real else g.ggml_new_tensor(ctx, F32, len(ne), list(ne))
            return _named(g, t, name)
        x = w("inp_embd", dm, n)
        g.ggml_set_input(x)
        mask = w("kq_mask", n, n)
        g.ggml_set_input(mask)
        for il in range(n_layers):
            q = g.ggml_add(ctx, g.ggml_mul_mat(ctx, w(f"q{il}", dm, dm), x), w(f"qb{il}", dm))
            k = g.ggml_add(ctx, g.ggml_mul_mat(ctx, w(f"k{il}", dm, dm), x), w(f"kb{il}", dm))
            v = g.ggml_add(ctx, g.ggml_mul_mat(ctx, w(f"v{il}", dm, dm), x), w(f"vb{il}", dm))
            q = g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, q, d, h, n), 0, 2, 1, 3)
            k = g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, k, d, h, n), 0, 2, 1, 3)
            v = g.ggml_cont(ctx, g.ggml_permute(ctx, g.ggml_reshape_3d(ctx, v, d, h, n), 1, 2, 0, 3))
            kq = g.ggml_soft_max_ext(ctx, g.ggml_mul_mat(ctx, k, q), mask, 0.25, 0.0)
            att = g.ggml_cont_2d(ctx, g.ggml_permute(ctx, g.ggml_mul_mat(ctx, v, kq), 0, 2, 1, 3), dm, n)
            att = g.ggml_add(ctx, g.ggml_mul_mat(ctx, w(f"o{il}", dm, dm), att), x)
            att = g.ggml_add(ctx, g.ggml_mul(ctx, g.ggml_norm(ctx, att, 1e-12), w(f"ln1w{il}", dm)), w(f"ln1b{il}", dm))
            f = g.ggml_gelu(ctx, g.ggml_add(ctx, g.ggml_mul_mat(ctx, w(f"up{il}", dm, ff), att), w(f"upb{il}", ff)))
            f = g.ggml_add(ctx, g.ggml_add(ctx, g.ggml_mul_mat(ctx, w(f"dn{il}", ff, dm), f), w(f"dnb{il}", dm)), att)
            x = g.ggml_add(ctx, g.ggml_mul(ctx, g.ggml_norm(ctx, f, 1e-12), w(f"ln2w{il}", dm)), w(f"ln2b{il}", dm))
        pooled = g.ggml_cont(ctx, g.ggml_transpose(ctx, g.ggml_mean(ctx, g.ggml_cont(ctx, g.ggml_transpose(ctx, x)))))
        g.ggml_set_output(pooled)
        return [_named(g, pooled, "result_embd_pooled")]
    return build


@pytest.mark.parametrize("n_layers", [1, 6])
def test_encoder_graph(n_layers):
    plan = check_plan(encoder(n_layers))
    assert sum(d.kind == "inplace" for d in plan.decisions) >= 4 * n_layers
