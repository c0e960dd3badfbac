"""The C library's float functions, as ggml's CPU kernels call them.

Where ggml calls libm (expf, expm1f, logf, log1pf, log2f, sinf, cosf, tanhf, erff, powf) the
engine calls the same function of the same C library, once per element, through the small C
module `engine._libm`. numpy's own float ufuncs are never used for these: numpy picks a SIMD
implementation at run time (AVX-512, AVX2 or baseline), each with its own last-bit rounding, so
their results would depend on the learner's CPU. The C library's do not: glibc chooses one
implementation for every CPU that runs ggml's AVX2+FMA build, so the bits are ggml's bits.

Each function takes any array (or scalar) and returns float32 of the same shape.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


class _EachByCtypes:
    """The C library's functions called through ctypes, one element at a time: the same calls as
    engine._libm makes (so the same bits), for an install without a C compiler, and slower."""

    NAMES = ("expf", "expm1f", "logf", "log1pf", "log2f", "sinf", "cosf", "tanhf", "erff", "powf")

    def __init__(self) -> None:
        import ctypes
        import ctypes.util

        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name in self.NAMES:
            fn = getattr(libm, name)
            fn.restype = ctypes.c_float
            fn.argtypes = [ctypes.c_float] * (2 if name == "powf" else 1)
            setattr(self, name, self._over_buffers(fn))

    @staticmethod
    def _over_buffers(fn):
        def each(*bufs) -> None:  # (src..., dst): dst[i] = fn(src[i]...)
            *src, dst = bufs
            dst[:] = np.array([fn(*v) for v in zip(*(s.tolist() for s in src))], F32)
        return each


try:
    from engine import _libm  # type: ignore[attr-defined]  # (a C extension: mypy reads no .so)
except ImportError:  # installed without a C compiler (engine.lanes says so once)
    _libm = _EachByCtypes()



def _unary(fn, x) -> np.ndarray:
    src = np.asarray(x, F32)
    if not src.flags.c_contiguous:
        src = src.copy()
    out = np.empty(src.shape, F32)
    if src.size:
        fn(src.reshape(-1), out.reshape(-1))
    return out


def expf(x) -> np.ndarray:
    """expf of each element."""
    return _unary(_libm.expf, x)


def expm1f(x) -> np.ndarray:
    """expm1f of each element."""
    return _unary(_libm.expm1f, x)


def logf(x) -> np.ndarray:
    """logf of each element."""
    return _unary(_libm.logf, x)


def log1pf(x) -> np.ndarray:
    """log1pf of each element."""
    return _unary(_libm.log1pf, x)


def log2f(x) -> np.ndarray:
    """log2f of each element."""
    return _unary(_libm.log2f, x)


def sinf(x) -> np.ndarray:
    """sinf of each element."""
    return _unary(_libm.sinf, x)


def cosf(x) -> np.ndarray:
    """cosf of each element."""
    return _unary(_libm.cosf, x)


def tanhf(x) -> np.ndarray:
    """tanhf of each element."""
    return _unary(_libm.tanhf, x)


def erff(x) -> np.ndarray:
    """erff of each element."""
    return _unary(_libm.erff, x)


def powf(x, y) -> np.ndarray:
    """powf(x, y) element by element (numpy broadcasting)."""
    a, b = (np.array(v, F32) for v in np.broadcast_arrays(np.asarray(x, F32), np.asarray(y, F32)))
    out = np.empty(a.shape, F32)
    if out.size:
        _libm.powf(a.reshape(-1), b.reshape(-1), out.reshape(-1))
    return out


def scalar(fn, *args) -> np.float32:
    """One call of a libm function on scalars: scalar(logf, x) is C's logf(x) as np.float32."""
    return F32(fn(*(F32(a) for a in args)))
