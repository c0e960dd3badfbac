"""The dequantizers' fast helpers against plain numpy formulas (no oracle needed: each reference
is the obvious one-liner the helper replaces)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.quants import iqgrid, kquants
from engine.quants.common import (F32, KVALUES_IQ4NL, byte_table, copy_runs, flip_nan_signs, h2f,
                                  nibbles, scaled, unpack_2bit, unpack_nibbles)
from engine.core.types import fp16_bits_to_fp32

RNG = np.random.default_rng(7)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, F32).view(np.uint32)


def test_h2f_table_is_the_fp16_conversion_for_every_pattern():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(_bits(h2f(h)), _bits(fp16_bits_to_fp32(h)))
    assert h2f(np.uint16(0x3C00)).shape == () and float(h2f(np.uint16(0x3C00))) == 1.0


def test_copy_runs_and_byte_table():
    raw = RNG.integers(0, 256, (50, 18), dtype=np.uint8)
    dst = np.zeros((50, 2, 16), np.uint8)
    copy_runs(dst[:, 1], raw[:, 2:])
    assert np.array_equal(dst[:, 1], raw[:, 2:]) and not dst[:, 0].any()
    table = RNG.integers(-128, 128, 256).astype(np.int8)
    assert np.array_equal(byte_table(table, raw), table[raw])


@pytest.mark.parametrize("start, stop, run", [(2, 18, 16), (4, 36, 8), (16, 144, 32)])
def test_nibbles_low_then_high_per_run(start, stop, run):
    raw = RNG.integers(0, 256, (40, stop + 3), dtype=np.uint8)
    qs = raw[:, start:stop].reshape(40, -1, run)
    ref = unpack_nibbles(qs).reshape(40, -1)  # per run: low nibbles, then high nibbles
    assert np.array_equal(nibbles(raw, start, stop, run), ref)
    assert np.array_equal(nibbles(raw, start, stop, run, KVALUES_IQ4NL), KVALUES_IQ4NL[ref])


def test_unpack_2bit_element_order():
    qs = RNG.integers(0, 256, (30, 64), dtype=np.uint8)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    ref = ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 256)
    assert np.array_equal(unpack_2bit(qs), ref)


def test_scaled_is_one_rounding_of_q_times_d():
    q = RNG.integers(-128, 128, (20, 8, 32)).astype(np.int8)
    d = RNG.standard_normal((20, 8)).astype(F32)
    d[0, :3] = [np.inf, np.nan, -0.0]
    with np.errstate(invalid="ignore"):
        ref = q.astype(F32) * d[..., None]
        assert np.array_equal(_bits(scaled(q, d)), _bits(ref))


def test_flip_nan_signs_negates_like_a_sign_bit_flip():
    q = np.array([[3, -3, 0, -1]], np.int8)
    d = np.array([np.float32(np.nan)])
    with np.errstate(invalid="ignore"):
        y = scaled(q, d)
    flip_nan_signs(y, q, d)
    sign = _bits(y) >> 31
    assert np.isnan(y).all() and sign.tolist() == [[0, 1, 0, 1]]


def test_k4_scale_unpacking_matches_the_bytewise_formula():
    s = RNG.integers(0, 256, (64, 12), dtype=np.uint8)
    sc, m = kquants.get_scale_min_k4(s)
    ref_sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], 1)
    ref_m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], 1)
    assert np.array_equal(sc, ref_sc) and np.array_equal(m, ref_m)
    j = np.arange(16)
    lo = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1).astype(int)
    hi = (s[:, 8 + j % 4].astype(int) >> (2 * (j // 4))) & 3
    assert np.array_equal(kquants.q3_k_scales(s), (lo | (hi << 4)) - 32)


def test_iq_signed_rows_are_grid_times_signs():
    rows = iqgrid._IQ2XXS_ROWS.view(np.int8).reshape(128, 256, 8)
    grid = iqgrid.grids_iq2.IQ2XXS_GRID.view(np.uint8).reshape(256, 8).astype(int)
    signs = np.where(iqgrid._KSIGN_BITS, -1, 1)  # (128, 8)
    assert np.array_equal(rows, signs[:, None, :] * grid[None])
    g1 = iqgrid._IQ1_ROWS.view(np.int8).reshape(2, -1, 8)
    delta = np.where(np.arange(2) == 0, 1, -1)[:, None, None]  # grid + delta = q / 8
    assert np.array_equal(g1, 8 * iqgrid._G1S[None].astype(int) + delta)
