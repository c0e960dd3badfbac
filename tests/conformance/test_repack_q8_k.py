"""The repacked Q4_K layout q4_K_8x8 and its products against llama.cpp's own ggml
(tests/support/llamacpp_ggml.py, repack=True: w in its CPU_REPACK buffer).

(a) The layout's pack gives the bytes llama.cpp's set_tensor leaves in the buffer, and unpack
gives back the plain rows. (b) engine.compute.kernels.repack_q8_k.product, fed those bytes and the
float32 activations, gives llama.cpp's dst bit for bit: 1 to 13 activation rows (gemv alone, gemm
alone, both), rows of 1, 2 and 8 super-blocks, 8, 16 and 64 weight rows, weights quantized by the
engine, activations of every magnitude from 1e-4 to 1e6 (and one of 1e36, whose products
overflow), llama.cpp on 1, 2 and 3 threads (its result does not depend on them: each output is one
chain of fused multiply-adds computed by one thread) against the engine's one call. The oracle
runs with llama.cpp's tiled K-quant path on, as llama.cpp does: the repacked weight's traits
take MUL_MAT before it (ggml_compute_forward asks the extra buffer types first), so the same
cases with the tiled path off give the same dst. Once in pure-numpy mode.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.compute.kernels.repack_q8_k import product
from engine.core.types import GGMLType
from engine.lanes import use_numpy
from engine.quants import quantize
from engine.quants.repack import LAYOUTS
from tests.support.llamacpp_ggml import MulMat, mul_mat_many

ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 13)  # activation rows: gemv, gemm and both
SHAPES = ((256, 8), (512, 16), (2048, 64), (256, 64), (2048, 8), (512, 8))  # (k, weight rows)
THREADS = (1, 2, 3)
LAYOUT = LAYOUTS[GGMLType.Q4_K]


def weights(rng: np.random.Generator, k: int, rows: int) -> np.ndarray:
    """rows of random floats (each row its own magnitude) quantized by the engine."""
    x = rng.standard_normal((rows, k)) * 10.0 ** rng.integers(-2, 3, (rows, 1))
    return quantize(GGMLType.Q4_K, x.astype(np.float32))


def activations(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n float32 rows, each of a magnitude of its own from 1e-4 to 1e6; with 13 rows, one of
    1e36 (d_w * d_x and the sums overflow)."""
    x = rng.standard_normal((n, k)) * 10.0 ** rng.integers(-4, 7, (n, 1))
    if n == 13:
        x[6] *= 1e36 / np.abs(x[6]).max()
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Every (rows, shape), each computed by llama.cpp on one thread count (1, 2, 3 in turn), and
    the 13-row and 5-row cases of 2048 x 64 and 512 x 16 on all three; and the first 40 of them
    again with the tiled path off: ([(w, x, shape, threads, dst, repacked bytes)], [dst, ...])."""
    rng = np.random.default_rng(2025)
    todo, turn = [], itertools.cycle(THREADS)
    for k, rows in SHAPES:
        w = weights(rng, k, rows)
        for n in ROWS:
            x = activations(rng, n, k)
            every = n in (5, 13) and (k, rows) in ((2048, 64), (512, 16))
            for threads in THREADS if every else (next(turn),):
                todo.append((w, x, (k, rows), threads))
    jobs = [MulMat(GGMLType.Q4_K, w, shape, x, th, repack=True) for w, x, shape, th in todo]
    tmp = tmp_path_factory.mktemp("repack_q8_k")
    got = mul_mat_many(jobs, tmp)
    untiled = mul_mat_many(jobs[:40], tmp, tiled=False)
    return [c + g for c, g in zip(todo, got)], [d for d, _ in untiled]


def test_pack_is_llamacpps_bytes(cases):
    done, _ = cases
    for w, _, _, _, _, packed in done:
        assert LAYOUT.pack(w).tobytes() == packed.tobytes()
        np.testing.assert_array_equal(LAYOUT.unpack(packed.reshape(w.shape)), w)
    assert len(done) == len(ROWS) * len(SHAPES) + 4 * (len(THREADS) - 1)


def test_product_is_llamacpps_dst(cases):
    done, _ = cases
    threads_seen, overflowed = set(), 0
    for w, x, (k, rows), threads, dst, packed in done:
        out = np.full((len(x), rows), np.nan, np.float32)
        product(LAYOUT, packed, k, rows, x, out)
        want = dst.reshape(len(x), rows)
        np.testing.assert_array_equal(out, want, err_msg=f"n={len(x)} {k}x{rows} threads={threads}")
        assert out.tobytes() == want.tobytes(), "the same bits, NaNs too"
        threads_seen.add(threads)
        overflowed += not np.isfinite(want).all()
    assert threads_seen == set(THREADS)
    assert overflowed, "the 1e36 row overflows somewhere (else it tests nothing more)"


def test_tiled_path_makes_no_difference(cases):
    """The repacked traits take the MUL_MAT before the tiled K-quant path: off or on, llama.cpp's
    dst is the same."""
    done, untiled = cases
    assert len(untiled) == 40
    for (w, x, shape, threads, dst, _), plain in zip(done, untiled):
        assert plain.tobytes() == dst.tobytes(), f"n={len(x)} {shape} threads={threads}"


def test_product_in_pure_numpy(cases):
    """The numpy twins, on the small cases with gemm and gemv rows."""
    done, _ = cases
    count = 0
    try:
        use_numpy(True)
        for w, x, (k, rows), threads, dst, packed in done:
            if len(x) in (5, 7) and k <= 512 and rows <= 16:
                out = np.full((len(x), rows), np.nan, np.float32)
                product(LAYOUT, packed, k, rows, x, out)
                assert out.tobytes() == dst.reshape(len(x), rows).tobytes(), (len(x), k, rows)
                count += 1
    finally:
        use_numpy(False)
    assert count >= 4
