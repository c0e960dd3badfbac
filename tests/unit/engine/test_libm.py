"""engine.libm is the C library's float functions, and no exact path uses numpy's instead."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from pathlib import Path

import numpy as np
import pytest

from engine import libm
from tests.support.npy_dispatch import dispatched_features

C = ctypes.CDLL(ctypes.util.find_library("m"))
UNARY = ["expf", "expm1f", "logf", "log1pf", "log2f", "sinf", "cosf", "tanhf", "erff"]
for _name in UNARY + ["powf"]:
    getattr(C, _name).restype = ctypes.c_float
    getattr(C, _name).argtypes = [ctypes.c_float] * (2 if _name == "powf" else 1)


def sample(n: int = 4000) -> np.ndarray:
    """Values across the float range, with the special ones."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), rng.uniform(-30, 30, n).astype(np.float32),
                        np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 88.7, -103.9])])
    return x


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("name", UNARY)
def test_each_function_is_the_c_librarys(name):
    """Against the C library called one value at a time through ctypes (the oracle)."""
    x = sample()
    with np.errstate(all="ignore"):
        got = getattr(libm, name)(x)
    want = np.array([getattr(C, name)(float(v)) for v in x], np.float32)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert same_bits(got, want)


def test_powf_broadcasts_and_is_the_c_librarys():
    x = np.abs(sample(500))
    y = np.float32(-2.0) / np.arange(1, len(x) + 1, dtype=np.float32)
    got = libm.powf(x, y)
    want = np.array([C.powf(float(a), float(b)) for a, b in zip(x, y)], np.float32)
    assert same_bits(got, want)
    assert libm.powf(np.float32([2, 3]), 2).tolist() == [4.0, 9.0]
    assert libm.scalar(libm.powf, 10000.0, -0.25) == np.float32(C.powf(10000.0, -0.25))


def test_shapes_strides_and_empty_arrays():
    x = sample(296)[:600].reshape(20, 30)
    assert same_bits(libm.tanhf(x[:, ::3]), libm.tanhf(np.ascontiguousarray(x[:, ::3])))
    assert libm.expf(x).shape == (20, 30)
    assert libm.sinf(np.zeros((0, 4), np.float32)).shape == (0, 4)
    assert libm.logf(np.float32(1.0)).shape == ()


def test_mismatched_buffers_raise():
    from engine import _libm

    with pytest.raises(ValueError, match="equal size"):
        _libm.expf(np.zeros(4, np.float32), np.zeros(3, np.float32))


# numpy's transcendental float ufuncs: their last bit depends on the SIMD path numpy picks
NUMPY_TRANSCENDENTAL = re.compile(
    r"\bnp\.(exp|exp2|expm1|log|log2|log10|log1p|sin|cos|tan|sinh|cosh|tanh|arcsin|arccos|"
    r"arctan|arctan2|arcsinh|arccosh|arctanh|power|float_power|cbrt|hypot|logaddexp2?)\(")


def test_the_engine_never_calls_numpys_transcendental_ufuncs():
    """Where ggml calls libm the engine calls engine.libm; nowhere does it use numpy's."""
    root = Path(__file__).resolve().parents[3] / "engine"
    found = [f"{p.relative_to(root.parent)}:{i}: {line.strip()}"
             for p in sorted(root.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if NUMPY_TRANSCENDENTAL.search(line)]
    assert not found, "numpy transcendental ufuncs in the engine:\n" + "\n".join(found)


def test_lowering_the_dispatch_takes_effect():
    """`make test`'s second pass sets NPY_DISABLE_CPU_FEATURES to what this prints: numpy then
    uses no dispatched SIMD target at all (otherwise that pass would prove nothing)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "tests.support.npy_dispatch"]
    root = Path(__file__).resolve().parents[3]
    targets = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True,
                             env={**os.environ, "NPY_DISABLE_CPU_FEATURES": ""}).stdout.strip()
    lowered = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True,
                             env={**os.environ, "NPY_DISABLE_CPU_FEATURES": targets}).stdout
    assert lowered.strip() == ""
    if os.environ.get("NPY_DISABLE_CPU_FEATURES", "").strip():  # this is the lowered pass
        assert dispatched_features() == []
