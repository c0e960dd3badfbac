"""Graph compute against real ggml: f32 mul_mat, thread scaling, per-node overhead."""

from __future__ import annotations

import ctypes

import ggml as real
import numpy as np

from bench.common import best_time
from engine import ggml as eng

F32 = int(eng.GGML_TYPE_F32)


class Graphs:
    """The same graph built on both engines, ready to compute repeatedly.

    Each input is a float32 array (numpy shape = reversed ne), or a (type, ne, raw bytes) triple
    for a tensor of another type, such as a quantized weight matrix.
    """

    def __init__(self, build, mem: int, inputs: list) -> None:
        self.ectx = eng.ggml_init(eng.ggml_init_params(mem))
        self.rctx = real.ggml_init(real.ggml_init_params(mem_size=mem, mem_buffer=None,
                                                         no_alloc=False))
        inputs = [x if isinstance(x, tuple) else (F32, tuple(reversed(x.shape)), x)
                  for x in inputs]
        self.graphs = []
        for g, ctx in ((eng, self.ectx), (real, self.rctx)):
            leaves = []
            for type_, ne, x in inputs:
                if g is eng:
                    t = eng.ggml_new_tensor(ctx, type_, len(ne), list(ne))
                    eng.set_data(t, x)
                else:
                    t = real.ggml_new_tensor(ctx, type_, len(ne), (ctypes.c_int64 * len(ne))(*ne))
                    ctypes.memmove(t.contents.data, x.ctypes.data, x.nbytes)
                leaves.append(t)
            gf = g.ggml_new_graph_custom(ctx, 4096, False)
            g.ggml_build_forward_expand(gf, build(g, ctx, *leaves))
            self.graphs.append(gf)
        self._work = {}

    def ours(self, n_threads: int) -> None:
        gf = self.graphs[0]
        plan = eng.ggml_graph_plan(gf, n_threads)
        if plan.work_size:
            key = ("ours", n_threads)
            if key not in self._work:
                self._work[key] = eng.ggml_new_buffer(self.ectx, plan.work_size)
            plan.work_data = self._work[key]
        eng.ggml_graph_compute(gf, plan)

    def theirs(self, n_threads: int) -> None:
        gf = self.graphs[1]
        plan = real.ggml_graph_plan(gf, n_threads, None)
        if plan.work_size:
            key = ("theirs", n_threads)
            if key not in self._work:
                self._work[key] = (ctypes.c_uint8 * plan.work_size)()
            plan.work_data = ctypes.cast(self._work[key], ctypes.POINTER(ctypes.c_uint8))
        real.ggml_graph_compute(gf, ctypes.byref(plan))

    def close(self) -> None:
        real.ggml_free(self.rctx)


def run(report) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4096, 4096), dtype=np.float32)
    for batch in (1, 32):
        x = rng.standard_normal((batch, 4096), dtype=np.float32)
        g = Graphs(lambda api, ctx, a, b: api.ggml_mul_mat(ctx, a, b), 96 << 20, [w, x])
        base = None
        for nt in (1, 2):
            ours = best_time(lambda: g.ours(nt), repeat=3)
            theirs = best_time(lambda: g.theirs(nt), repeat=3)
            base = base or ours
            report(f"mul_mat f32 4096x4096 x 4096x{batch}, {nt} thr (x{base / ours:.2f} vs 1 thr)",
                   ours, theirs)
        g.close()

    # a product small enough for the exact path (ggml's vec_dot_f32 lane by lane, not BLAS)
    w_small = rng.standard_normal((512, 1024), dtype=np.float32)
    x_small = rng.standard_normal((4, 1024), dtype=np.float32)
    g = Graphs(lambda api, ctx, a, b: api.ggml_mul_mat(ctx, a, b), 8 << 20, [w_small, x_small])
    for nt in (1, 2):
        report(f"mul_mat f32 1024x512 x 1024x4 (exact vec_dot), {nt} thr",
               best_time(lambda: g.ours(nt), repeat=3), best_time(lambda: g.theirs(nt), repeat=3))
    g.close()

    # per-node overhead: 1000 small adds in a chain
    def chain(api, ctx, a):
        y = a
        for _ in range(1000):
            y = api.ggml_add(ctx, y, a)
        return y
    g = Graphs(chain, 8 << 20, [rng.standard_normal(64, dtype=np.float32)])
    for nt in (1, 2):
        ours = best_time(lambda: g.ours(nt), repeat=3)
        theirs = best_time(lambda: g.theirs(nt), repeat=3)
        report(f"1000-node graph of small adds, per node, {nt} thr", ours / 1000, theirs / 1000)
    g.close()
