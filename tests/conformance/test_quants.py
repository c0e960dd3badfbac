"""engine.quants against real ggml (ggml-python): quantize bytes, dequantize bits, from_float.

Every comparison is exact: the same bytes from ggml_quantize_chunk / from_float, and the same float32
bit patterns from to_float.
"""

from __future__ import annotations

import ctypes

import ggml
import numpy as np
import pytest

from engine.quants import (QUANT_KINDS, dequantize, from_float, ggml_get_type_traits,
                           ggml_quantize_chunk, ggml_quantize_requires_imatrix, quantize)
from engine.core.types import GGMLType as T, traits

FLOAT_P = ctypes.POINTER(ctypes.c_float)

# the types ggml_quantize_chunk quantizes without an importance matrix, and that we match
CHUNK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q1_0, T.MXFP4, T.NVFP4, T.TQ1_0,
               T.TQ2_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]
# the lattice-search types ggml quantizes without an imatrix (slow in Python: fewer, smaller rows)
SEARCH_TYPES = [T.IQ3_XXS, T.IQ3_S, T.IQ2_S, T.IQ1_M]
IMATRIX_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ1_S]  # ggml needs an importance matrix for these


# --- the oracle --------------------------------------------------------------------------------

def o_quantize(t: int, x2d: np.ndarray) -> np.ndarray:
    x2d = np.ascontiguousarray(x2d, np.float32)
    nrows, n = x2d.shape
    dst = np.zeros((nrows, ggml.ggml_row_size(t, n)), np.uint8)
    ggml.ggml_quantize_chunk(t, x2d.ctypes.data_as(FLOAT_P), dst.ctypes.data, 0, nrows, n, None)
    return dst


def o_to_float(t: int, raw: np.ndarray, n: int) -> np.ndarray:
    raw = np.ascontiguousarray(raw, np.uint8)
    out = np.zeros(n, np.float32)
    ggml.ggml_get_type_traits(t).contents.to_float(raw.ctypes.data, out.ctypes.data_as(FLOAT_P), n)
    return out


def o_from_float(t: int, x: np.ndarray, ref: bool = False) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    dst = np.zeros(ggml.ggml_row_size(t, x.size), np.uint8)
    fn = (ggml.ggml_get_type_traits(t).contents.from_float_ref if ref
          else ggml.ggml_get_type_traits_cpu(t).contents.from_float)
    fn(x.ctypes.data_as(FLOAT_P), dst.ctypes.data, x.size)
    return dst


# --- inputs ------------------------------------------------------------------------------------

def _inputs(n: int = 1024) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    mixed = np.zeros((2, n), np.float32)
    mixed[0, ::3] = -0.0
    mixed[1, 5] = 1.0
    sparse = rng.standard_normal((2, n)).astype(np.float32)
    sparse[:, ::7] = 0
    sparse[1, :300] = 0  # whole blocks and sub-blocks of zeros next to non-zero ones
    p2 = np.float32(2.0) ** rng.integers(-10, 10, (2, n)).astype(np.float32)
    return {
        "normal": rng.standard_normal((4, n)).astype(np.float32),
        "skewed": rng.uniform(-3, 5, (4, n)).astype(np.float32),
        "tiny": (rng.standard_normal((2, n)) * 1e-30).astype(np.float32),
        "large": (rng.standard_normal((2, n)) * 1e30).astype(np.float32),
        "fp16_edge": (rng.uniform(-1, 1, (2, n)) * 65504 * 8).astype(np.float32),
        "zeros": np.zeros((2, n), np.float32),
        "signed_zeros": mixed,
        "ties": (rng.integers(-8, 9, (4, n)) * 0.5).astype(np.float32),
        "integers": rng.integers(-127, 128, (4, n)).astype(np.float32),
        "sparse": sparse,
        "below_pow2": (p2 * np.float32(1 - 2**-24) * np.sign(rng.standard_normal((2, n)))
                       ).astype(np.float32),
    }


INPUTS = _inputs()


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# --- quantize and dequantize -------------------------------------------------------------------

@pytest.mark.parametrize("t", CHUNK_TYPES, ids=lambda t: t.name)
def test_quantize_and_dequantize_match_ggml(t):
    for name, x in INPUTS.items():
        ours, theirs = quantize(t, x), o_quantize(t, x)
        assert np.array_equal(ours, theirs), f"{t.name} {name}: quantized bytes differ"
        y = dequantize(t, ours, x.size)
        assert np.array_equal(_bits(y), _bits(o_to_float(t, theirs, x.size))), f"{t.name} {name}"


def _search_inputs() -> dict[str, np.ndarray]:
    """The first 512 elements of two rows of each input, plus harder cases for the searches:
    heavy tails, rows mixing scales, coarse values that often tie, and zero sub-blocks between
    non-zero ones (IQ3_S then packs the following sub-blocks into earlier slots, as ggml does)."""
    rng = np.random.default_rng(99)
    out = {name: x[:2, :512] for name, x in INPUTS.items() if name != "large"}
    holes = rng.standard_normal((2, 512)).astype(np.float32)
    holes[0, 96:128] = 0
    holes[1, 256 + 32: 256 + 80] = 0
    out["holes"] = holes
    out["heavy_tails"] = rng.standard_t(2, (2, 512)).astype(np.float32)
    out["mixed_scales"] = (rng.standard_normal((2, 512)) *
                           np.repeat(10.0 ** rng.integers(-4, 3, (2, 32)), 16, 1)).astype(np.float32)
    out["coarse"] = (rng.integers(-3, 4, (2, 512)) * 0.25).astype(np.float32)
    return out


SEARCH_INPUTS = _search_inputs()


@pytest.mark.parametrize("t", SEARCH_TYPES, ids=lambda t: t.name)
def test_grid_search_quantizers_match_ggml(t):
    for name, x in SEARCH_INPUTS.items():
        ours, theirs = quantize(t, x), o_quantize(t, x)
        assert np.array_equal(ours, theirs), f"{t.name} {name}: quantized bytes differ"
    dst = np.zeros(ours.size, np.uint8)
    assert ggml_quantize_chunk(t, x, dst, 0, 2, 512) == ours.size
    assert np.array_equal(dst, theirs.reshape(-1))
    if t != T.IQ1_M:  # ggml has no from_float_ref for IQ1_M
        row = SEARCH_INPUTS["normal"][0]
        assert np.array_equal(ggml_get_type_traits(t).from_float_ref(row),
                              o_from_float(t, row, ref=True))


@pytest.mark.parametrize("t", SEARCH_TYPES, ids=lambda t: t.name)
def test_grid_search_quantizers_assert_on_overflow_like_ggml(t):
    """1e30 squares to inf, so no grid neighbour has a finite error: ggml aborts on
    GGML_ASSERT(grid_index >= 0) (which the oracle cannot show without dying); we raise."""
    from engine.core.errors import GGMLAssertionError
    with pytest.raises(GGMLAssertionError, match="grid_index"):
        quantize(t, INPUTS["large"][:1, :256])


@pytest.mark.parametrize("t", [k for k in QUANT_KINDS if QUANT_KINDS[k].dequantize is not None
                               and ggml.ggml_get_type_traits(k).contents.to_float],
                         ids=lambda t: t.name)
def test_dequantize_random_bytes_match_ggml(t):
    """Arbitrary block bytes (random scales and quants, incl. inf/nan fp16) decode identically."""
    rng = np.random.default_rng(int(t))
    tr = traits(t)
    raw = rng.integers(0, 256, 64 * tr.type_size, dtype=np.uint8)
    n = 64 * tr.blck_size
    assert np.array_equal(_bits(dequantize(t, raw, n)), _bits(o_to_float(t, raw, n)))


@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=lambda t: t.name)
def test_plain_float_types(t):
    x = INPUTS["normal"]
    ours = quantize(t, x)
    assert np.array_equal(ours, o_quantize(t, x))
    assert np.array_equal(_bits(dequantize(t, ours, x.size)), _bits(o_to_float(t, ours, x.size)))


def test_quantize_chunk_start_offset():
    x = INPUTS["normal"]
    dst = np.zeros(x.shape[0] * traits(T.Q4_K).type_size * 4, np.uint8)
    n = ggml_quantize_chunk(T.Q4_K, x, dst, 2 * 1024, 2, 1024)
    assert n == 2 * 576
    assert np.array_equal(dst[2 * 576: 4 * 576], o_quantize(T.Q4_K, x[2:]).reshape(-1))
    assert not dst[: 2 * 576].any()


# --- CPU from_float (what mul_mat feeds the dot kernels) and from_float_ref --------------------

@pytest.mark.parametrize("t", [T.Q8_0, T.Q8_1, T.Q8_K, T.IQ4_NL, T.IQ4_XS, T.Q4_0, T.Q6_K],
                         ids=lambda t: t.name)
def test_cpu_from_float_matches_ggml(t):
    for name, x in INPUTS.items():
        if t == T.IQ4_NL and name in ("tiny", "zeros", "signed_zeros", "sparse"):
            continue  # ggml reads an uninitialised buffer for all-zero blocks on this path
        assert np.array_equal(from_float(t, x.reshape(-1)).reshape(-1), o_from_float(t, x)), name


def test_q8_0_cpu_in_c_equals_its_numpy_reference_on_any_floats():
    """engine._lanes.quantize_q8_0 (mul_mat's src1 conversion) against the readable numpy form
    beside it, on random bit patterns (NaN, infinities, subnormals included), halves and scales
    from tiny to overflowing."""
    from engine.quants.legacy import from_float_q8_0, from_float_q8_0_ref

    rng = np.random.default_rng(8)
    bits = rng.integers(0, 2**32, (20000, 32), dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = (rng.integers(-300, 300, (2000, 32)) * 0.5).astype(np.float32)
    with np.errstate(all="ignore"):
        scaled = [rng.standard_normal((2000, 32)).astype(np.float32) * np.float32(s)
                  for s in (1e-30, 1e-6, 1.0, 1e4, 3e38)]
        for x in [bits, halves, *scaled]:
            assert np.array_equal(from_float_q8_0(x).view(np.uint8), from_float_q8_0_ref(x).view(np.uint8))


def test_q8_0_cpu_rounds_half_to_even_unlike_ref():
    x = np.zeros(32, np.float32)
    x[0], x[1], x[2] = 127.0, 2.5, 0.5
    cpu = np.frombuffer(from_float(T.Q8_0, x).tobytes()[2:], np.int8)
    ref = np.frombuffer(quantize(T.Q8_0, x[None]).tobytes()[2:], np.int8)
    assert (cpu[1], cpu[2], ref[1], ref[2]) == (2, 0, 3, 1)
    assert np.array_equal(from_float(T.Q8_0, x).reshape(-1), o_from_float(T.Q8_0, x))


@pytest.mark.parametrize("t", [t for t in CHUNK_TYPES if t != T.Q8_1], ids=lambda t: t.name)
def test_from_float_ref_matches_ggml(t):
    tr = ggml_get_type_traits(t)
    x = INPUTS["normal"][0]
    assert np.array_equal(tr.from_float_ref(x), o_from_float(t, x, ref=True))
    assert (tr.type_name, tr.blck_size, tr.type_size) == (traits(t).type_name,
                                                          traits(t).blck_size,
                                                          traits(t).type_size)


def test_iq4_nl_chunk_and_ref_paths_differ_like_ggml():
    x = INPUTS["normal"][:1]
    chunk, ref = quantize(T.IQ4_NL, x), quantize(T.IQ4_NL, x, ref=True)
    assert not np.array_equal(chunk, ref)
    assert np.array_equal(ref.reshape(-1), o_from_float(T.IQ4_NL, x, ref=True))


def test_traits_mirror_ggml():
    for t in T:
        o = ggml.ggml_get_type_traits(t).contents
        ours = ggml_get_type_traits(t)
        if o.blck_size == 0:
            continue
        assert (ours.to_float is not None) == bool(o.to_float), t.name
        assert (ours.from_float_ref is not None) == bool(o.from_float_ref), t.name
        assert ggml_quantize_requires_imatrix(t) == ggml.ggml_quantize_requires_imatrix(t)


@pytest.mark.parametrize("t", IMATRIX_TYPES, ids=lambda t: t.name)
def test_imatrix_only_quantizers_say_so(t):
    assert ggml_quantize_requires_imatrix(t) and ggml.ggml_quantize_requires_imatrix(t)
    with pytest.raises(ValueError, match=traits(t).type_name + ".*importance matrix"):
        quantize(t, INPUTS["normal"])
