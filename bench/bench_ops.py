"""Element-wise and row ops on 16M floats (4096 rows of 4096) against real ggml's graph compute,
on 1 and 2 threads: add, mul, silu, gelu, swiglu, scale, rms_norm, norm and soft_max. silu,
swiglu and norm at one thread carry the speed issue's goal (within 2x of ggml on every CPU), as
the median of three runs."""

from __future__ import annotations

import numpy as np

from bench.bench_compute import Graphs
from bench.common import Goal, best_time, median_of
from engine.core.errors import GGMLNotSupportedError

ROWS = COLS = 4096
MEM = 5 * ROWS * COLS * 4 + (16 << 20)

OPS = {
    "add": (2, lambda g, ctx, a, b: g.ggml_add(ctx, a, b)),
    "mul": (2, lambda g, ctx, a, b: g.ggml_mul(ctx, a, b)),
    "silu": (1, lambda g, ctx, a: g.ggml_silu(ctx, a)),
    "gelu": (1, lambda g, ctx, a: g.ggml_gelu(ctx, a)),
    "swiglu_split": (2, lambda g, ctx, a, b: g.ggml_swiglu_split(ctx, a, b)),
    "scale": (1, lambda g, ctx, a: g.ggml_scale(ctx, a, 0.5)),
    "rms_norm": (1, lambda g, ctx, a: g.ggml_rms_norm(ctx, a, 1e-6)),
    "norm": (1, lambda g, ctx, a: g.ggml_norm(ctx, a, 1e-5)),
    "soft_max": (1, lambda g, ctx, a: g.ggml_soft_max(ctx, a)),
}
GOALS = ("silu", "swiglu_split", "norm")


def run(report) -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((ROWS, COLS), dtype=np.float32) for _ in range(2)]
    for name, (n_in, build) in OPS.items():
        graphs = Graphs(build, MEM, inputs[:n_in])
        try:
            for nt in (1, 2):
                goal = Goal(ratio=2) if nt == 1 and name in GOALS else None
                if goal is None:
                    ours = best_time(lambda: graphs.ours(nt), repeat=3, min_time=0.0)
                    theirs = best_time(lambda: graphs.theirs(nt), repeat=3, min_time=0.0)
                else:
                    ours = median_of(lambda: best_time(lambda: graphs.ours(nt), 1, 0.0))
                    theirs = median_of(lambda: best_time(lambda: graphs.theirs(nt), 1, 0.0))
                report(f"{name} f32 {ROWS}x{COLS}, {nt} thr", ours, theirs, goal=goal)
        except (GGMLNotSupportedError, AttributeError) as e:  # an op this engine lacks
            report(f"{name} f32 {ROWS}x{COLS}: {type(e).__name__}", float("nan"), None)
        finally:
            graphs.close()
