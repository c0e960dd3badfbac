"""The repacked 4-bit layouts q4_0_8x8, iq4_nl_8x8 and mxfp4_8x8 and their products against
llama.cpp's own ggml (tests/support/llamacpp_ggml.py, repack=True: w in its CPU_REPACK buffer).

(a) The layout's pack gives the bytes llama.cpp's set_tensor leaves in the buffer, and unpack
gives back the plain rows. (b) engine.compute.kernels.repack_q8_0.product, fed those bytes and
the float32 activations, gives llama.cpp's dst bit for bit: 1 to 13 activation rows (gemv alone,
gemm alone, both), rows of 1 to 128 blocks, 8 to 64 weight rows, weights quantized by the
engine, activations of every magnitude from 1e-4 to 1e6 (and a row whose half scale overflows),
llama.cpp on 1, 2 and 3 threads (its result does not depend on them: each output is one chain of
fused multiply-adds computed by one thread) against the engine's one call; once in pure-numpy
mode.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.compute.kernels.repack_q8_0 import NIBBLE_VALUES, product
from engine.core.types import GGMLType
from engine.lanes import use_numpy
from engine.quants import quantize
from engine.quants.repack import LAYOUTS
from tests.support.llamacpp_ggml import MulMat, mul_mat_many

TYPES = list(NIBBLE_VALUES)
ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 13)  # activation rows: gemv, gemm and both
SHAPES = ((256, 8), (256, 16), (4096, 64), (32, 16), (96, 64), (4096, 8))  # (k, weight rows)
THREADS = (1, 2, 3)


def weights(rng: np.random.Generator, type_: GGMLType, k: int, rows: int) -> np.ndarray:
    """rows of random floats (each row its own magnitude) quantized by the engine."""
    x = rng.standard_normal((rows, k)) * 10.0 ** rng.integers(-2, 3, (rows, 1))
    return quantize(type_, x.astype(np.float32))


def activations(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n float32 rows, each of a magnitude of its own from 1e-4 to 1e6; with 13 rows, one whose
    blocks' half scale d = amax / 127 overflows to infinity."""
    x = rng.standard_normal((n, k)) * 10.0 ** rng.integers(-4, 7, (n, 1))
    if n == 13:
        x[6] *= 1e9 / np.abs(x[6]).max()
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Every (type, rows, shape), each computed by llama.cpp on one thread count (1, 2, 3 in
    turn), and the (type, 13 rows, 4096 x 64) cases and the (type, 5 rows, 256 x 16) ones on all
    three: [(type, w, x, shape, threads, llama.cpp's dst, its repacked bytes)]."""
    rng = np.random.default_rng(2024)
    todo, turn = [], itertools.cycle(THREADS)
    for type_, (k, rows) in itertools.product(TYPES, SHAPES):
        w = weights(rng, type_, k, rows)
        for n in ROWS:
            x = activations(rng, n, k)
            every = (n, k, rows) in ((13, 4096, 64), (5, 256, 16))
            for threads in THREADS if every else (next(turn),):
                todo.append((type_, w, x, (k, rows), threads))
    got = mul_mat_many([MulMat(int(t), w, shape, x, th, repack=True)
                        for t, w, x, shape, th in todo], tmp_path_factory.mktemp("repack_q8_0"))
    return [c + g for c, g in zip(todo, got)]


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_pack_is_llamacpps_bytes(cases, type_: GGMLType):
    layout = LAYOUTS[type_]
    seen = 0
    for t, w, _, _, _, _, packed in cases:
        if t != type_:
            continue
        assert layout.pack(w).tobytes() == packed.tobytes()
        np.testing.assert_array_equal(layout.unpack(packed.reshape(w.shape)), w)
        seen += 1
    assert seen == len(ROWS) * len(SHAPES) + 2 * (len(THREADS) - 1)


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_product_is_llamacpps_dst(cases, type_: GGMLType):
    layout = LAYOUTS[type_]
    threads_seen = set()
    for t, w, x, (k, rows), threads, dst, packed in cases:
        if t != type_:
            continue
        out = np.full((len(x), rows), np.nan, np.float32)
        product(layout, packed, k, rows, x, out)
        want = dst.reshape(len(x), rows)
        np.testing.assert_array_equal(out, want, err_msg=f"{type_.name} n={len(x)} {k}x{rows} "
                                                         f"threads={threads}")
        assert out.tobytes() == want.tobytes(), "the same bits, NaNs too"
        threads_seen.add(threads)
    assert threads_seen == set(THREADS)


def test_product_in_pure_numpy(cases):
    """The numpy twins, on a small case of each type with gemm and gemv rows."""
    done = 0
    try:
        use_numpy(True)
        for t, w, x, (k, rows), threads, dst, packed in cases:
            if (len(x), k, rows) == (7, 256, 16):
                out = np.full((len(x), rows), np.nan, np.float32)
                product(LAYOUTS[t], packed, k, rows, x, out)
                assert out.tobytes() == dst.reshape(len(x), rows).tobytes(), t.name
                done += 1
    finally:
        use_numpy(False)
    assert done == len(TYPES)
