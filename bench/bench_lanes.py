"""Both forms of every C loop (engine/lanes.py): the numpy twin's time against engine._lanes'
on the same inputs (the ratio is what pure-numpy mode costs there), and silu, soft_max and a
Q4_K matvec computed by the engine in each mode against real ggml."""

from __future__ import annotations

import numpy as np

import engine.compute.kernels  # noqa: F401 (registers the kernels' twins)
import engine.quants  # noqa: F401
from bench.bench_compute import Graphs
from bench.common import best_time
from engine.lanes import TWINS, compiled, use_numpy
from engine.core.types import GGMLType

ROWS, K = 1024, 4096  # weight rows and row length of the products


def _inputs(rng: np.random.Generator) -> dict[str, tuple]:
    """Each C function's arguments, at a size where the loop's cost shows."""
    x = rng.standard_normal(1 << 20).astype(np.float32)
    q4k = rng.integers(0, 256, (ROWS, K // 256 * 144), dtype=np.uint8)
    q4k[:, :4] = np.frombuffer(np.float16([0.01, 0.001]).tobytes(), np.uint8)
    q8k = rng.integers(-100, 100, (1, K // 256, 292), dtype=np.int8).view(np.uint8)
    q8k[..., :4] = np.frombuffer(np.float32(0.02).tobytes(), np.uint8)
    w = rng.standard_normal((ROWS, K)).astype(np.float32)
    a = rng.standard_normal((1, K)).astype(np.float32)
    rows = rng.standard_normal((256, 4096)).astype(np.float32)
    mx = rows.max(axis=1)
    return {
        "v_expf": (x, np.empty_like(x)),
        "v_silu": (x, np.empty_like(x)),
        "soft_max": (rows, mx, np.empty_like(rows), np.empty(256), 256, 4096),
        "quant_dot": (int(GGMLType.Q4_K), q4k.reshape(-1), q4k.shape[1], q8k.reshape(-1), q8k.shape[-1] * q8k.shape[1],
                      np.empty((1, ROWS), np.float32), ROWS, 1, K // 256),
        "quantize_q8_0": (x, np.empty(len(x) // 32 * 34, np.uint8)),
        "dequantize": (int(GGMLType.Q4_K), q4k.reshape(-1), np.empty(ROWS * K, np.float32)),
        "float_dot": (w, a, np.empty((1, ROWS), np.float32), ROWS, 1, K, False),
        "dot_f32": (w, a, np.empty((1, ROWS), np.float32), ROWS, 1, K),
    }


def run(report) -> None:
    c = compiled()
    for name, args in _inputs(np.random.default_rng(0)).items():
        if c is None:
            report(f"twin {name}: engine._lanes not built", float("nan"), None)
            continue
        twin = best_time(lambda: TWINS[name](*args), repeat=3, min_time=0.0)
        ours = best_time(lambda: getattr(c, name)(*args), repeat=3, min_time=0.0)
        report(f"lanes.{name}: numpy twin / C", twin, ours, "C")

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1024, 4096), dtype=np.float32)
    w = _inputs(rng)["quant_dot"][1]
    matvec = [(int(GGMLType.Q4_K), (K, ROWS), w), rng.standard_normal((1, K), dtype=np.float32)]
    for op, build, inputs in (("silu f32 1024x4096", lambda g, ctx, a: g.ggml_silu(ctx, a), [x]),
                              ("soft_max f32 1024x4096", lambda g, ctx, a: g.ggml_soft_max(ctx, a), [x]),
                              (f"mul_mat q4_K {ROWS}x{K} by 1 row", lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
                               matvec)):
        graphs = Graphs(build, 64 << 20, inputs)
        try:
            theirs = best_time(lambda: graphs.theirs(1), repeat=3, min_time=0.0)
            for mode in (False, True):
                use_numpy(mode)
                ours = best_time(lambda: graphs.ours(1), repeat=3, min_time=0.0)
                report(f"{op}, 1 thr, {'numpy twins' if mode else 'C loops'}", ours, theirs)
        finally:
            use_numpy(False)
            graphs.close()
