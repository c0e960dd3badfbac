"""ggml_backend_graph_copy and ggml_backend_compare_graph_backend on the engine and on real ggml.

A small allocated graph (weights and a view chain in a CPU buffer, computed through a gallocr) is
copied onto a second CPU backend: the copy's buffer size, each copied tensor's offset, name and
layout equal real ggml's, and the comparison calls back for the same nodes (view ops skipped) with
results equal byte for byte on both sides.
"""

from __future__ import annotations

import ctypes

import ggml as real
import numpy as np

from engine import ggml_alloc as alloc  # (ggml-alloc.h, as a C program includes it)
from engine import ggml as eng
from engine.backend import accel, buffer as ebuf, device as edev, graph_copy as gc
import tests.support.real_facade  # noqa: F401  (fixes ggml-python's pointer results)

F32 = 0


def _build(G, ctx, W, x):
    h = G.ggml_mul_mat(ctx, W, x)
    h = G.ggml_silu(ctx, h)
    t = G.ggml_transpose(ctx, h)
    c = G.ggml_cont(ctx, t)
    r = G.ggml_reshape_1d(ctx, c, 6 * 4)
    return G.ggml_scale(ctx, r, 0.5)


def _engine(backend2=None):
    cpu = edev.ggml_backend_cpu_init()
    ctx_w = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead() * 4, None, True))
    W = eng.ggml_new_tensor_2d(ctx_w, F32, 5, 6)
    x = eng.ggml_new_tensor_2d(ctx_w, F32, 5, 4)
    wbuf = alloc.ggml_backend_alloc_ctx_tensors(ctx_w, cpu)
    rng = np.random.default_rng(3)
    ebuf.ggml_backend_tensor_set(W, rng.uniform(-1, 1, 30).astype(np.float32), 0, 120)
    ebuf.ggml_backend_tensor_set(x, rng.uniform(-1, 1, 20).astype(np.float32), 0, 80)
    ctx = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead() * 16 + eng.ggml_graph_overhead(), None, True))
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, _build(eng, ctx, W, x))
    galloc = alloc.ggml_gallocr_new(edev.ggml_backend_get_default_buffer_type(cpu))
    assert alloc.ggml_gallocr_alloc_graph(galloc, gf)
    copy = gc.ggml_backend_graph_copy(backend2 or edev.ggml_backend_cpu_init(), gf)
    placed = [(t.name, t.data - ebuf.tensor_buffer(t).base, list(t.ne), list(t.nb), t.op, t.view_src is not None)
              for t in copy.graph.nodes]
    size = ebuf.ggml_backend_buffer_get_size(copy.buffer)
    gc.ggml_backend_graph_copy_free(copy)
    calls = []

    def cb(i, t1, t2):
        n = eng.ggml_nbytes(t1)
        calls.append((i, t1.name, t2.name, ebuf.ggml_backend_tensor_get(t1, 0, n),
                      ebuf.ggml_backend_tensor_get(t2, 0, n)))
        return True
    assert gc.ggml_backend_compare_graph_backend(cpu, backend2 or edev.ggml_backend_cpu_init(), gf, cb)
    return dict(size=size, placed=placed, calls=calls, wbuf=wbuf)


def _real():
    cpu, cpu2 = real.ggml_backend_cpu_init(), real.ggml_backend_cpu_init()
    ctx_w = real.ggml_init(real.ggml_init_params(mem_size=real.ggml_tensor_overhead() * 4, mem_buffer=None,
                                                 no_alloc=True))
    W = real.ggml_new_tensor_2d(ctx_w, F32, 5, 6)
    x = real.ggml_new_tensor_2d(ctx_w, F32, 5, 4)
    wbuf = real.ggml_backend_alloc_ctx_tensors(ctx_w, cpu)
    rng = np.random.default_rng(3)
    keep = [rng.uniform(-1, 1, 30).astype(np.float32), rng.uniform(-1, 1, 20).astype(np.float32)]
    real.ggml_backend_tensor_set(W, keep[0].ctypes.data_as(ctypes.c_void_p), 0, 120)
    real.ggml_backend_tensor_set(x, keep[1].ctypes.data_as(ctypes.c_void_p), 0, 80)
    ctx = real.ggml_init(real.ggml_init_params(
        mem_size=real.ggml_tensor_overhead() * 16 + real.ggml_graph_overhead(), mem_buffer=None, no_alloc=True))
    gf = real.ggml_new_graph(ctx)

    class R:  # the ops by the engine's names
        def __getattr__(self, name):
            return getattr(real, name)
    real.ggml_build_forward_expand(gf, _build(R(), ctx, W, x))
    galloc = real.ggml_gallocr_new(real.ggml_backend_get_default_buffer_type(cpu))
    assert real.ggml_gallocr_alloc_graph(galloc, gf)
    copy = real.ggml_backend_graph_copy_(cpu2, gf)  # ggml-python: the struct took the C name
    g = copy.graph.contents
    placed = []
    for i in range(g.n_nodes):
        c = g.nodes[i].contents
        placed.append((c.name.decode(), c.data - real.ggml_backend_buffer_get_base(c.buffer), list(c.ne), list(c.nb),
                       c.op, bool(c.view_src)))
    size = real.ggml_backend_buffer_get_size(copy.buffer)
    real.ggml_backend_graph_copy_free(copy)
    calls = []

    @real.ggml_backend_eval_callback
    def cb(i, t1, t2, user_data):
        n = real.ggml_nbytes(t1)
        calls.append((i, t1.contents.name.decode(), t2.contents.name.decode(),
                      ctypes.string_at(t1.contents.data, n), ctypes.string_at(t2.contents.data, n)))
        return True
    assert real.ggml_backend_compare_graph_backend(cpu, cpu2, gf, cb, None, None, 0)
    return dict(size=size, placed=placed, calls=calls, wbuf=wbuf)


def test_graph_copy_and_compare_equal_real_ggml():
    e, r = _engine(), _real()
    assert e["size"] == r["size"]
    assert e["placed"] == r["placed"]
    assert [c[:3] for c in e["calls"]] == [c[:3] for c in r["calls"]]
    assert [c[3:] for c in e["calls"]] == [c[3:] for c in r["calls"]]
    assert all(c[3] == c[4] for c in e["calls"]) and len(e["calls"]) == 4  # the transpose is skipped


def test_compare_against_an_accelerator():
    """The same comparison between the CPU and a simulated accelerator: its copy lives in the
    device's own (non-host) buffer and every node agrees byte for byte."""
    e = _engine(accel.ggml_backend_accel_init("GPU0"))
    assert all(c[3] == c[4] for c in e["calls"]) and len(e["calls"]) == 4
