"""The products of the repacked 4-bit layouts (engine/c/repack_q8_0.c: gemv_q4_b32_8x8 and
gemm_q4_b32_8x8) against their numpy twins (engine/compute/kernels/repack_q8_0.py): the same bits
on random values and on random bit patterns, for q4_0_8x8, iq4_nl_8x8 and mxfp4_8x8, by the AVX2
loop and the portable one, on 1 to 3 threads; and the one place gemv's products differ from
gemm's (an activation quant of -128 against a negative weight)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.compute.kernels.repack_q8_0 import (NIBBLE_VALUES, Q8_0_BYTES, Q8_0X4_BYTES,
                                                quantize_mat_q8_0_4x8, quantize_rows_q8_0)
from engine.core.types import GGMLType
from engine.lanes import TWINS
from tests.unit.engine.test_twins import (C, OUT, assert_same_bits, pool_workers, quant_blocks,
                                          run_both, run_c)

TYPES = list(NIBBLE_VALUES)
SCALE_BYTES = {GGMLType.Q4_0: 2, GGMLType.IQ4_NL: 2, GGMLType.MXFP4: 1}


def packed_weights(rng: np.random.Generator, type_: GGMLType, nc: int, nb: int,
                   wild: bool) -> np.ndarray:
    """nc / 8 groups of nb interleaved blocks (8 scales, 128 quant bytes) of random bytes; unless
    wild, the scales ordinary halves (MXFP4: exponents of 2^-10 .. 2^10)."""
    sb = SCALE_BYTES[type_]
    size = 8 * sb + 128
    scales = tuple(range(0, 8 * sb, sb))
    if type_ == GGMLType.MXFP4:
        return quant_blocks(rng, nc // 8 * nb, size, (), wild, e_at=scales).reshape(-1)
    return quant_blocks(rng, nc // 8 * nb, size, scales, wild).reshape(-1)


def activations(rng: np.random.Generator, nr: int, nb: int, gemm: bool, wild: bool) -> np.ndarray:
    """nr rows of nb Q8_0 blocks (gemv) or nr / 4 groups of nb block_q8_0x4 (gemm): random quants
    (-128 among them), their halves ordinary unless wild."""
    if gemm:
        return quant_blocks(rng, nr // 4 * nb, Q8_0X4_BYTES, (0, 2, 4, 6), wild).reshape(-1)
    return quant_blocks(rng, nr * nb, Q8_0_BYTES, (0,), wild).reshape(-1)


CASES = ((8, 1, 1), (8, 3, 3), (24, 2, 5), (64, 1, 8), (16, 3, 40))  # (nc, nr or groups, nb)


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_repack_product(type_: GGMLType, gemm: bool, wild: bool):
    """Every (activation row, weight row) of random weights and activations, more rows than the
    C loop's tile of 16 among them; C's AVX2 loop and its portable one alike."""
    name = "gemm_q4_b32_8x8" if gemm else "gemv_q4_b32_8x8"
    rng = np.random.default_rng([int(type_), gemm, wild])
    for nc, rows, nb in CASES:
        nr = 4 * (rows + 4 * (nb == 40)) if gemm else rows + 16 * (nb == 40)  # 32 rows: 2 tiles
        w = packed_weights(rng, type_, nc, nb, wild)
        x = activations(rng, nr, nb, gemm, wild)
        for portable in (0, 1):
            c, t = run_both(name, (int(type_), w, x, OUT, 32 * nb, nr, nc, portable), nr * nc)
            assert_same_bits(c, t, f"{name} {type_.name} {nr}x{nc}x{nb} portable={portable}")


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_largest_products(type_: GGMLType):
    """Every weight nibble the one of the largest |value| and every activation quant 127 or -127:
    the largest block sums the loops can meet, each fma rounding its last bits."""
    nc, nb, nr = 16, 6, 8
    rng = np.random.default_rng(int(type_))
    big = int(np.argmax(np.abs(NIBBLE_VALUES[type_].astype(int))))
    for gemm in (False, True):
        name = "gemm_q4_b32_8x8" if gemm else "gemv_q4_b32_8x8"
        w = packed_weights(rng, type_, nc, nb, False).reshape(nc // 8 * nb, -1)
        w[:, 8 * SCALE_BYTES[type_]:] = big * 0x11
        x = activations(rng, nr, nb, gemm, False).reshape(-1, Q8_0X4_BYTES if gemm else Q8_0_BYTES)
        at = 8 if gemm else 2
        x[:, at:] = rng.choice(np.array([127, -127], np.int8), x[:, at:].shape).view(np.uint8)
        for portable in (0, 1):
            c, t = run_both(name, (int(type_), w.reshape(-1), x.reshape(-1), OUT, 32 * nb, nr, nc,
                                   portable), nr * nc)
            assert_same_bits(c, t, f"{name} {type_.name} largest portable={portable}")


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_gemv_wraps_minus_128(type_: GGMLType):
    """An activation quant of -128 against a negative weight: gemv's sign(a, w) wraps, so the
    product is -128 * |w|; gemm's is the true a * w. The same rows through both (the gemm's
    interleaved) differ there, in C and in the twins alike."""
    nc, nb, nr = 8, 1, 4
    rng = np.random.default_rng(5)
    w = packed_weights(rng, type_, nc, nb, False).reshape(1, -1)
    negative = int(np.flatnonzero(NIBBLE_VALUES[type_] < 0)[0])
    w[0, 8 * SCALE_BYTES[type_]:] = negative * 0x11  # every weight the same negative value
    plain = activations(rng, nr, nb, False, False).reshape(nr, Q8_0_BYTES)
    plain[:, 2:] = 1
    plain[0, 2] = 0x80  # row 0's element 0: -128
    x4 = np.concatenate([plain[:, :2].reshape(-1), plain[:, 2:].reshape(4, 4, 8)
                         .transpose(1, 0, 2).reshape(-1)])  # block_q8_0x4 of the same rows
    for impl in (lambda name: getattr(C, name), TWINS.get):  # C, then the twins
        gemv, gemm = impl("gemv_q4_b32_8x8"), impl("gemm_q4_b32_8x8")
        ov, om = np.zeros((nr, nc), np.float32), np.zeros((nr, nc), np.float32)
        gemv(int(type_), w.reshape(-1), plain.reshape(-1), ov.reshape(-1), 32, nr, nc)
        gemm(int(type_), w.reshape(-1), x4, om.reshape(-1), 32, nr, nc)
        np.testing.assert_array_equal(ov[1:], om[1:])
        assert np.all(np.sign(ov[0]) == -np.sign(om[0])) and np.all(om[0] != 0), (ov[0], om[0])


@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_repack_product_threads(type_: GGMLType, gemm: bool):
    """The column groups shared out between 2 and 3 threads (the pool's workers do start): the
    bytes of one thread, by both loops."""
    name = "gemm_q4_b32_8x8" if gemm else "gemv_q4_b32_8x8"
    rng = np.random.default_rng([int(type_), gemm, 3])
    nc, nr, nb = 512, 4, 16
    w, x = packed_weights(rng, type_, nc, nb, False), activations(rng, nr, nb, gemm, False)
    for portable in (0, 1):
        args = (int(type_), w, x, OUT, 32 * nb, nr, nc, portable)
        one = run_c(name, args + (1,), nr * nc)
        for threads in (2, 3):
            assert one.tobytes() == run_c(name, args + (threads,), nr * nc).tobytes(), threads
    assert pool_workers() >= 2


def test_quantize_mat_interleaves_plain_blocks():
    """quantize_mat_q8_0_4x8's block_q8_0x4: each row's quantize_row_q8_0 block (its half d, and
    its quants 8 at a time, the 4 rows in turn)."""
    x = (np.random.default_rng(7).standard_normal((8, 96)) * 10).astype(np.float32)
    mat = quantize_mat_q8_0_4x8(x)  # (2 groups, 3 blocks, 136)
    plain = quantize_rows_q8_0(x).reshape(2, 4, 3, Q8_0_BYTES)
    for g, r, b, j in np.ndindex(2, 4, 3, 4):
        assert mat[g, b, 2 * r:2 * r + 2].tobytes() == plain[g, r, b, :2].tobytes()
        assert mat[g, b, 8 + 32 * j + 8 * r:16 + 32 * j + 8 * r].tobytes() == \
            plain[g, r, b, 2 + 8 * j:10 + 8 * j].tobytes()
