"""The repacked Q4_K C loops (engine/c/repack_q8_k.c: pack_q4_k_8x8, quantize_mat_q8_k_4x8,
gemv_q4_k_8x8, gemm_q4_k_8x8) against their numpy twins (engine/compute/kernels/repack_q8_k.py):
the same bits on random values and on random bit patterns, by the AVX2 loop and the portable
one, on 1 to 3 threads; the largest integer sums the types allow; and the pipeline `product` in C
against pure-numpy mode."""

from __future__ import annotations

import numpy as np
import pytest

from engine.compute.kernels.repack_q8_k import product
from engine.core.types import GGMLType
from engine.lanes import TWINS, use_numpy
from engine.quants import quantize
from engine.quants.kquants import BLOCK_Q8_K
from engine.quants.repack_kquant import BLOCK_Q4_KX8, BLOCK_Q8_KX4, Q4_K_8X8
from tests.unit.engine.test_twins import (C, OUT, assert_same_bits, halves, ordinary_floats,
                                          pool_workers, q8_k_blocks, run_both, run_c, wild_floats)

F32 = np.float32
XB, Y4B = BLOCK_Q4_KX8.itemsize, BLOCK_Q8_KX4.itemsize


def packed_weights(rng: np.random.Generator, nc: int, nb: int, wild: bool) -> np.ndarray:
    """nc / 8 groups of nb block_q4_Kx8 of random bytes; unless wild, d and dmin ordinary halves."""
    w = rng.integers(0, 256, (nc // 8 * nb, XB), dtype=np.uint8)
    if not wild:
        w[:, :32] = halves(rng, (len(w), 16), False).view(np.uint8).reshape(-1, 32)
    return w.reshape(-1)


def x4_blocks(rng: np.random.Generator, n: int, wild: bool) -> np.ndarray:
    """n block_q8_Kx4 (n, 1168) of random bytes; unless wild, ordinary d[4] and each bsum the sum
    of its 16 quants (as ggml_quantize_mat_q8_K_4x8 lays them out)."""
    b = rng.integers(0, 256, (n, Y4B), dtype=np.uint8)
    if not wild:
        y = b.view(BLOCK_Q8_KX4).reshape(n)
        y["d"] = ordinary_floats(rng, 4 * n).reshape(n, 4)
        q = y["qs"].reshape(n, 32, 4, 8).transpose(0, 2, 1, 3).reshape(n, 4, 4, 4, 16)
        y["bsums"] = q.sum(-1, dtype=np.int16).transpose(0, 2, 1, 3).reshape(n, 64)
    return b


def activations(rng: np.random.Generator, nr: int, nb: int, gemm: bool, wild: bool) -> np.ndarray:
    """nr rows of nb Q8_K blocks (gemv) or nr / 4 groups of nb block_q8_Kx4 (gemm)."""
    if gemm:
        return x4_blocks(rng, nr // 4 * nb, wild).reshape(-1)
    return q8_k_blocks(rng, nr * nb, wild).reshape(-1)


CASES = ((8, 1, 1), (8, 3, 2), (24, 2, 3), (64, 1, 8), (16, 5, 1))  # (nc, rows or groups, nb)


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
def test_repack_q4_k_product(gemm: bool, wild: bool):
    """Every (activation row, weight row) of random weights and activations, more rows than the
    C loop's tile of 16 among them; C's AVX2 loop and its portable one alike."""
    name = "gemm_q4_k_8x8" if gemm else "gemv_q4_k_8x8"
    rng = np.random.default_rng([gemm, wild, 4])
    for nc, rows, nb in CASES:
        nr = 4 * (rows + 4 * (nc == 16)) if gemm else rows + 16 * (nc == 16)  # 36 / 21: 2 tiles
        w = packed_weights(rng, nc, nb, wild)
        x = activations(rng, nr, nb, gemm, wild)
        for portable in (0, 1):
            c, t = run_both(name, (w, x, OUT, 256 * nb, nr, nc, portable), nr * nc)
            assert_same_bits(c, t, f"{name} {nr}x{nc}x{nb} portable={portable}")


@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
def test_largest_products(gemm: bool):
    """The largest integer sums: every nibble 15, every scale and min 63, activations all -128 or
    all 127 (bsums to match), so the 16-bit lane sums of the AVX2 loop are at their largest."""
    name = "gemm_q4_k_8x8" if gemm else "gemv_q4_k_8x8"
    nc, nr, nb = 16, 4, 2
    w = np.full((nc // 8 * nb, XB), 0xFF, np.uint8)
    w[:, :32] = np.array([0x3C00] * 16, np.uint16).view(np.uint8)  # d = dmin = 1
    for q in (-128, 127):
        if gemm:
            x = np.zeros(nr // 4 * nb, BLOCK_Q8_KX4)
            x["d"], x["qs"], x["bsums"] = 1.0, q, 16 * q
        else:
            x = np.zeros(nr * nb, BLOCK_Q8_K)
            x["d"], x["qs"], x["bsums"] = 1.0, q, 16 * q
        x = x.view(np.uint8)
        for portable in (0, 1):
            c, t = run_both(name, (w.reshape(-1), x, OUT, 256 * nb, nr, nc, portable), nr * nc)
            assert_same_bits(c, t, f"{name} q={q} portable={portable}")
        # each output: 8 sub-blocks of 63 * 32 * 15 * q, less 8 of 63 * 32 * q, per block
        assert np.all(c == F32(nb * 8 * 63 * 32 * q * (15 - 1)))


@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
def test_repack_q4_k_threads(gemm: bool):
    """The column groups shared out between 2 and 3 threads (the pool's workers do start): the
    bytes of one thread."""
    name = "gemm_q4_k_8x8" if gemm else "gemv_q4_k_8x8"
    rng = np.random.default_rng([gemm, 7])
    nc, nr, nb = 256, 8, 4
    w = packed_weights(rng, nc, nb, False)
    x = activations(rng, nr, nb, gemm, False)
    for portable in (0, 1):
        one = run_c(name, (w, x, OUT, 256 * nb, nr, nc, portable, 1), nr * nc)
        for threads in (2, 3):
            many = run_c(name, (w, x, OUT, 256 * nb, nr, nc, portable, threads), nr * nc)
            assert one.tobytes() == many.tobytes(), f"{name} threads={threads}"
    assert pool_workers() >= 2


def activation_rows(rng: np.random.Generator, groups: int, k: int) -> np.ndarray:
    """groups * 4 rows of k floats: ordinary ones, random bit patterns, and the cases the AVX2
    loop's maximum treats apart: a tie of +max and -max in a block (either first), a row of zeros, a
    largest value at the end, -0.0 among zeros."""
    x = wild_floats(rng, 4 * groups, k)
    x[0] = ordinary_floats(rng, k)
    x[1] = 0.0
    x[1, 7] = -0.0
    x[2] = ordinary_floats(rng, k) * F32(0.01)
    x[2, 3], x[2, 247] = F32(-7.5), F32(7.5)
    x[3] = x[2]
    x[3, 3], x[3, 247] = F32(7.5), F32(-7.5)
    if groups > 1:
        x[4] = ordinary_floats(rng, k)
        x[4, -1] = F32(1e6)
    return x


@pytest.mark.parametrize("k", [256, 512, 1024])
def test_quantize_mat_q8_k_4x8(k: int):
    """Groups of 4 rows: the block_q8_Kx4 bytes of C and twin (d's bits, NaNs alike; the quants and
    sums byte for byte)."""
    rng = np.random.default_rng(k)
    x = activation_rows(rng, 5, k)
    blocks = 5 * k // 256
    got = []
    for fn in (C.quantize_mat_q8_k_4x8, TWINS["quantize_mat_q8_k_4x8"]):
        out = np.full(blocks * Y4B, 0xA5, np.uint8)
        with np.errstate(all="ignore"):
            fn(x, out, k)
        got.append(out.view(BLOCK_Q8_KX4))
    c, t = got
    assert_same_bits(c["d"].reshape(-1), t["d"].reshape(-1), f"d k={k}")
    assert c["qs"].tobytes() == t["qs"].tobytes() and c["bsums"].tobytes() == t["bsums"].tobytes()
    assert c["d"][0, 1] == 0 and np.all(c["qs"][0].reshape(32, 4, 8)[:, 1] == 0)  # zeros
    # the ties: +7.5 wins wherever it lies (d negative: x / d of +7.5 is -127)
    assert c["d"][0, 2] < 0 and c["d"][0, 3] < 0


def test_product_c_and_numpy():
    """`product` (quantization, gemm for the groups of 4, gemv for the rest) in C and in pure-numpy
    mode: the same bits."""
    rng = np.random.default_rng(3)
    k, ne01 = 512, 16
    w = quantize(GGMLType.Q4_K, rng.standard_normal((ne01, k)).astype(F32))
    packed = Q4_K_8X8.pack(w)
    x = (rng.standard_normal((7, k)) * 10.0 ** rng.integers(-3, 4, (7, 1))).astype(F32)
    got = []
    for pure in (False, True):
        use_numpy(pure)
        try:
            out = np.full((7, ne01), np.nan, F32)
            product(Q4_K_8X8, packed, k, ne01, x, out)
        finally:
            use_numpy(False)
        got.append(out)
    assert got[0].tobytes() == got[1].tobytes()


@pytest.mark.parametrize("nrows,nb,threads", [(8, 1, 1), (16, 3, 2), (64, 12, 1), (1024, 8, 3)])
def test_pack_q4_k_8x8(nrows: int, nb: int, threads: int):
    """The C repack of plain Q4_K rows writes its twin's bytes, for any bytes (every scale and
    min bit pattern), on any number of threads (1.2 MB: shared out), and unpacks to the rows it
    came from."""
    from engine.quants.repack_kquant import unpack_q4_k_8x8

    rows = np.random.default_rng(nrows + nb).integers(0, 256, (nrows, 144 * nb), dtype=np.uint8)
    got, want = np.empty_like(rows), np.empty_like(rows)
    C.pack_q4_k_8x8(rows.reshape(-1), got.reshape(-1), nrows, 144 * nb, threads)
    TWINS["pack_q4_k_8x8"](rows.reshape(-1), want.reshape(-1), nrows, 144 * nb)
    assert got.tobytes() == want.tobytes()
    assert unpack_q4_k_8x8(got).tobytes() == rows.tobytes()
