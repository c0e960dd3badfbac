"""Flash attention's C loops (engine/c/attn.c: fa_online and fa_gemm) against their numpy
twins (engine/compute/kernels/attention.py): the same bits on random values and on random bit
patterns (NaN, infinities, subnormals, huge values), with V in halves (an fp16 accumulator) and in
floats, sizes with and without a vector's leftovers."""

from __future__ import annotations

import numpy as np
import pytest

from engine.lanes import TWINS
from tests.unit.engine.test_twins import C, assert_same_bits, halves, ordinary_floats, wild_floats

F32 = np.float32


def fresh(n: int) -> np.ndarray:
    """A float32 output buffer prefilled with a pattern, so an element left unwritten shows."""
    return np.full(n, 0xA5A5A5A5, np.uint32).view(F32)


def online_case(rng: np.random.Generator, rows: int, n: int, dv: int, fp16: bool, wild: bool):
    """fa_online's inputs: scores (rows, n) of softmax-like spread, some keys skipped (a row
    with every key skipped among them), V rows as halves or floats."""
    s = (wild_floats(rng, rows, n) if wild else ordinary_floats(rng, rows * n).reshape(rows, n))
    skip = (rng.random((rows, n)) < rng.choice([0.0, 0.3, 0.9], (rows, 1))).astype(np.uint8)
    skip[0] = 1
    if fp16:
        v = halves(rng, (n, dv), wild)
    else:
        v = wild_floats(rng, n, dv) if wild else ordinary_floats(rng, n * dv).reshape(n, dv)
    return s.astype(F32), skip, np.ascontiguousarray(v)


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("fp16", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("dv", [1, 8, 33, 64, 256])
def test_fa_online(dv: int, fp16: bool, wild: bool):
    """Each row's M, S and accumulator: C's (its vector loop where the CPU has one) and the
    twin's bits."""
    rng = np.random.default_rng([dv, fp16, wild])
    for rows, n in ((1, 1), (5, 37), (9, 300)):
        s, skip, v = online_case(rng, rows, n, dv, fp16, wild)
        got = []
        for fn in (C.fa_online, TWINS["fa_online"]):
            acc, m, sm = fresh(rows * dv), fresh(rows), fresh(rows)
            with np.errstate(all="ignore"):
                fn(s, skip, v, fp16, acc, m, sm, rows, n, dv)
            got.append((acc, m, sm))
        for name, c, t in zip(("acc", "M", "S"), *got):
            assert_same_bits(c, t, f"fa_online {name} rows={rows} n={n} dv={dv}")


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 7, 9), (64, 64, 64), (13, 256, 40)])
def test_fa_gemm(m: int, k: int, n: int, wild: bool):
    """C += A·B from a random C: every output's chain of fmas."""
    rng = np.random.default_rng([m, k, n, wild])
    make = (lambda r, c: wild_floats(rng, r, c)) if wild else \
        (lambda r, c: ordinary_floats(rng, r * c).reshape(r, c))
    a, b, c0 = make(m, k), make(k, n), make(m, n)
    got = []
    for fn in (C.fa_gemm, TWINS["fa_gemm"]):
        c = np.ascontiguousarray(c0, F32).reshape(-1).copy()
        with np.errstate(all="ignore"):
            fn(c, np.ascontiguousarray(a), np.ascontiguousarray(b), m, k, n)
        got.append(c)
    assert_same_bits(got[0], got[1], f"fa_gemm {m}x{k}x{n}")


def test_fa_sizes_are_checked():
    with pytest.raises(ValueError, match="b has 8 bytes, not 4"):
        C.fa_gemm(fresh(1), fresh(1), fresh(2), 1, 1, 1)
    with pytest.raises(ValueError, match="skip"):
        C.fa_online(fresh(2), np.zeros(1, np.uint8), fresh(2), False, fresh(2), fresh(1),
                    fresh(1), 1, 2, 1)
