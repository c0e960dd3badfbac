"""Flash attention's C loops (engine/c/attn.c: fa_online, fa_rows and fa_gemm) against their numpy
twins (engine/compute/kernels/attention_rows.py and attention.py): the same bits on random values and on random bit
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


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("mask", [None, "f16", "f32"])
@pytest.mark.parametrize("dk,dv,n", [(64, 64, 37), (33, 8, 300), (128, 128, 1), (40, 24, 0)])
def test_fa_rows(dk: int, dv: int, n: int, mask: str | None, wild: bool):
    """Rows of query heads reading K and V heads in a cache whose rows are wider than a head
    (nbk1, nbv1 past dk, dv), with and without a mask, soft cap and sinks, finished or left as
    partials: C's out, M and S and the twin's bits."""
    rng = np.random.default_rng([dk, dv, n, wild, 0 if mask is None else len(mask)])
    heads, kv_heads, q_rows = 4, 2, 3
    k = halves(rng, (max(n, 1), kv_heads * dk + 5), wild)  # a cache row holds every head, and more
    v = halves(rng, (max(n, 1), kv_heads * dv + 3), wild)
    q = (wild_floats(rng, heads * q_rows, dk) if wild else
         ordinary_floats(rng, heads * q_rows * dk).reshape(-1, dk))
    m = None
    if mask is not None:
        mv = ordinary_floats(rng, q_rows * max(n, 1)).reshape(q_rows, -1)
        mv[rng.random(mv.shape) < 0.3] = -np.inf
        m = mv.astype(np.float16 if mask == "f16" else F32)
    rows = heads * q_rows
    offs = np.zeros((rows, 5), np.int64)
    for r in range(rows):
        h, i1 = divmod(r, q_rows)
        offs[r] = (r * dk * 4, (h // 2) * dk * 2, (h // 2) * dv * 2,
                   0 if m is None else i1 * m.strides[0], (rows - 1 - r) * dv * 4)
    slopes = rng.choice(np.array([1, 0.5, 0.25], F32), rows)
    for softcap, sinks, finish in ((0.0, None, True), (30.0, None, False),
                                   (0.0, (ordinary_floats(rng, rows) * F32(4)), True)):
        got = []
        for fn in (C.fa_rows, TWINS["fa_rows"]):
            out, M, S = fresh(rows * dv), fresh(rows), fresh(rows)
            with np.errstate(all="ignore"):
                fn(q, k, v, m, out, offs, slopes, sinks, M, S, rows, n, dk, dv, k.strides[0],
                   v.strides[0], F32(0.125), F32(softcap), mask == "f16", finish)
            got.append((out, M, S))
        for name, c, t in zip(("out", "M", "S"), *got):
            assert_same_bits(c, t, f"fa_rows {name} softcap={softcap} sinks={sinks is not None}")


def test_fa_sizes_are_checked():
    with pytest.raises(ValueError, match="b has 8 bytes, not 4"):
        C.fa_gemm(fresh(1), fresh(1), fresh(2), 1, 1, 1)
    with pytest.raises(ValueError, match="skip"):
        C.fa_online(fresh(2), np.zeros(1, np.uint8), fresh(2), False, fresh(2), fresh(1),
                    fresh(1), 1, 2, 1)
    offs = np.zeros((1, 5), np.int64)
    offs[0, 1] = 2  # K's row 1 would end past its buffer
    with pytest.raises(ValueError, match="outside its buffer"):
        C.fa_rows(fresh(4), np.zeros(8, np.uint16), np.zeros(16, np.uint16), None, fresh(4), offs,
                  fresh(1), None, fresh(1), fresh(1), 1, 2, 4, 4, 8, 8, F32(1), F32(0), False, True)
