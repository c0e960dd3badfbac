"""engine._lanes.tiled_mul_mat (llama.cpp's tiled K-quant products, engine/c/tiled.c) against
its numpy twin (engine/compute/kernels/tiled.py): the same bits for every type the AVX2 build
tiles, on random blocks with ordinary scales and on random bit patterns (any fp16 scale, Q8_K
blocks whose d and block sums are any bits), with C's vector loop and its portable one, on one
thread and shared out between several."""

from __future__ import annotations

import numpy as np
import pytest

from engine.compute.kernels.tiled import FORMATS
from engine.core.types import GGMLType
from engine.quants import QUANT_KINDS
from tests.unit.engine.test_twins import NIBBLE_D_AT, OUT, assert_same_bits, d_at, padded_rows, \
    q8_k_blocks, quant_blocks, run_both, run_c

TYPES = list(FORMATS)


def case(rng: np.random.Generator, type_: GGMLType, n0: int, n1: int, nb: int, wild: bool,
         pad: int = 0, quants: int | None = None) -> tuple[tuple, int]:
    """tiled_mul_mat's arguments (OUT for the output; rows of the output pad floats apart more
    than a row) and the output's size in floats. quants: every activation byte this value."""
    w = padded_rows(quant_blocks(rng, n0 * nb, QUANT_KINDS[type_].type_size, d_at(type_), wild,
                                 nibble_d_at=NIBBLE_D_AT.get(type_)), n0, nb, 5)
    y = q8_k_blocks(rng, n1 * nb, wild)
    if quants is not None:
        y[:, 4:260] = np.uint8(quants & 0xFF)
    x = padded_rows(y, n1, nb, 3)
    ldo = n0 + pad
    args = (int(type_), w.reshape(-1), w.shape[1], x.reshape(-1), x.shape[1], OUT, ldo, n0, n1, nb,
            FORMATS[type_].grid)
    return args, (n1 - 1) * ldo + n0 if n0 and n1 else 0


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_tiled_mul_mat(type_: GGMLType, wild: bool):
    """Every pair of weight rows (nb blocks, rows more than a row apart) and Q8_K rows; output
    rows further apart than a row (the floats between left alone); panels of 16 weight rows and
    ragged ones; the vector loop and the portable one. The last two cases' activation bytes are
    all 127 (the largest products) and all -128 (IQ4_XS's sign trick wraps on every byte)."""
    rng = np.random.default_rng([int(type_), wild])
    for n0, n1, nb, pad, quants in ((1, 1, 1, 0, None), (37, 3, 4, 2, None), (16, 17, 2, 0, None),
                                    (5, 9, 2, 7, None), (0, 2, 1, 0, None), (3, 0, 1, 0, None),
                                    (20, 2, 3, 1, 127), (20, 2, 3, 0, -128)):
        args, n_out = case(rng, type_, n0, n1, nb, wild, pad, quants)
        for portable in (False, True):
            c, t = run_both("tiled_mul_mat", args + (portable, 2), n_out)
            assert_same_bits(c, t, f"tiled_mul_mat {type_.name} {n0}x{n1}x{nb} portable={portable}")


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_tiled_mul_mat_threads(type_: GGMLType):
    """The weight rows shared out between 2, 3 and 7 threads, and the portable loop: the bytes of
    one thread with the vector loop."""
    rng = np.random.default_rng([int(type_), 11])
    for n0, n1, nb in ((301, 9, 8), (3, 40, 2)):
        args, n_out = case(rng, type_, n0, n1, nb, False)
        one = run_c("tiled_mul_mat", args + (False, 1), n_out)
        for portable, threads in ((False, 2), (False, 3), (False, 7), (True, 1), (True, 3)):
            many = run_c("tiled_mul_mat", args + (portable, threads), n_out)
            assert one.tobytes() == many.tobytes(), f"{type_.name} {n0}x{n1}x{nb} {portable} {threads}"


def test_tiled_mul_mat_refuses_bad_arguments():
    """A type it does not tile, a grid type without its grid, an output too small: ValueError."""
    rng = np.random.default_rng(5)
    args, n_out = case(rng, GGMLType.IQ2_XXS, 4, 2, 1, False)
    out = np.zeros(n_out, np.float32)
    from engine.lanes import compiled
    with pytest.raises(ValueError):
        compiled().tiled_mul_mat(*(out if a is OUT else a for a in args[:-1]), None)
    with pytest.raises(ValueError):
        compiled().tiled_mul_mat(int(GGMLType.Q8_0), *(out if a is OUT else a for a in args[1:]))
    with pytest.raises(ValueError):
        compiled().tiled_mul_mat(*(out[:-1] if a is OUT else a for a in args))
