"""float32 math the way the oracle's CPU build computes it, over whole arrays.

ggml's kernels get their float math from two places, and so does the engine:

* **The C library** (expf, expm1f, logf, sinf, cosf, tanhf, erff, powf): re-exported from
  `engine.libm`, which calls the same C functions once per element. Never numpy's float ufuncs,
  whose last bit depends on the SIMD path numpy picks for the CPU.
* **ggml's own arithmetic**, emulated with IEEE operations only (+, -, ×, ÷, comparisons and bit
  manipulation, whose results numpy cannot vary):
  - fmaf: a fused multiply-add (one rounding), computed in float64 and rounded once, exactly.
  - mac_in_order: one step of a plain C loop `sum += a[k]*b[k]` as the oracle's build compiles
    it (see there).
  - v_expf / v_silu: ggml's AVX2 polynomial (`ggml_v_expf`, `ggml_v_silu`) for the part of a
    row that fills whole 8-lane vectors: each vector instruction is one IEEE operation per lane,
    so a lane alone gives the vector's bits. In C (`engine._lanes`), or their numpy twins here.
  - The fp16 GELU and GELU-quick tables that ggml_cpu_init builds (GGML_GELU_FP16), from libm's
    tanhf and expf.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from engine.core.api import query
from engine.lanes import lanes, pure_numpy, twin
from engine.libm import cosf, erff, expf, expm1f, logf, powf, sinf, \
    tanhf  # noqa: F401 (re-exported)
from engine.core.types import fp16_bits_to_fp32, fp32_to_fp16_bits

F32, F64 = np.float32, np.float64
SIMD_LANES = 8  # AVX2: ggml_vec_silu_f32 and friends take 8 floats at a time

GELU_COEF_A = F32(0.044715)
GELU_QUICK_COEF = F32(-1.702)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
SQRT_2_INV = F32(0.70710678118654752440084436210484)


U64 = np.uint64
MIDPOINT_MASK, MIDPOINT = U64((1 << 29) - 1), U64(1 << 28)  # a double's bits below a float's
# last bit, and those of a double halfway between two floats
MAGNITUDE = U64((1 << 63) - 1)
FLT_MIN_BITS = U64(897 << 52)  # the double 2^-126: below it floats are subnormal, with fewer bits
INF_BITS = U64(0x7FF << 52)  # above it, a double's magnitude bits are a NaN's


def _flat_at(v, shape: tuple, i: np.ndarray) -> np.ndarray:
    """Elements i (flat indices into `shape`) of v broadcast to shape, as doubles."""
    v = np.asarray(v)
    if v.shape != shape:
        v = np.broadcast_to(v, shape)
        return v[np.unravel_index(i, shape)].astype(F64)
    return v.reshape(-1)[i].astype(F64)


def fmaf(a, b, c) -> np.ndarray:
    """fmaf(a, b, c) of float32 operands (broadcast together): a*b + c with a single rounding to
    float32, correctly rounded, as the -mfma build's fused multiply-adds compute it, element by
    element."""
    if pure_numpy():  # (the twin's arithmetic on the operands as they are: no flat copies)
        return fmaf_exact(*(np.asarray(v, F32) for v in (a, b, c)))
    return fmaf_steps(np.asarray(a, F32)[None], np.asarray(b, F32)[None], c)


def fmaf_steps(a, b, acc) -> np.ndarray:
    """acc = fmaf(a[k], b[k], acc) for k = 0, 1, ... in order (ggml_vec_mad_f32 called step
    after step): a and b have the steps first, then broadcast with acc. The C loop `lanes.fmaf`,
    or its twin `fmaf_into`."""
    a, b, acc = (np.asarray(v, F32) for v in (a, b, acc))
    shape = np.broadcast_shapes(a.shape[1:], b.shape[1:], acc.shape)
    steps = (max(a.shape[0], b.shape[0]), *shape)
    if pure_numpy():
        out = np.broadcast_to(acc, shape).astype(F32)
        for k in range(steps[0]):
            out = fmaf_exact(a[k if len(a) > 1 else 0], b[k if len(b) > 1 else 0], out)
        return out
    out = np.empty(shape, F32)
    if out.size:
        lanes.fmaf(*(_flat(v, s) for v, s in ((a, steps), (b, steps), (acc, shape))),
                   out.reshape(-1))
    return out


def _flat(v: np.ndarray, shape: tuple) -> np.ndarray:
    """v broadcast to shape, as one flat float32 buffer (no broadcast_to when it has the shape)."""
    if v.shape != shape:
        v = np.broadcast_to(v, shape)
    return np.ascontiguousarray(v).reshape(-1)


@twin("fmaf")
def fmaf_into(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """out = c, then out = fmaf(a[k], b[k], out) for each step k of the flat float32 buffers a
    and b (whole steps of out's size)."""
    n = out.size
    out[:] = c
    for k in range(a.size // n if n else 0):
        out[:] = fmaf_exact(a[k * n:(k + 1) * n], b[k * n:(k + 1) * n], out)


def fmaf_exact(a, b, c) -> np.ndarray:
    """fmaf(a, b, c) in numpy, with a single rounding, correctly rounded.

    The product of two floats is exact in a double, and the double sum s rounded to float is
    the exact value rounded to float unless s landed on a midpoint between two floats (or in
    the subnormal floats' range) without being exact. Where some lane did, the sum's rounding
    error is found by Knuth's two-sum and those lanes are rounded to odd (an inexact sum whose
    last bit is even moves one unit towards the exact value), which a float rounding cannot get
    wrong. A NaN operand gives its own NaN (quiet), b's first, then a's, then c's, as the C
    library's fmaf does: not whichever operand numpy's SIMD loop happens to keep."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.multiply(a, b, dtype=F64)
        total = np.add(p, c, dtype=F64, order="C")
        s = np.atleast_1d(total)
        bits = s.view(U64)
        mag = bits & MAGNITUDE
        hazard = (bits & MIDPOINT_MASK) == MIDPOINT
        hazard |= (mag - U64(1)) < (FLT_MIN_BITS - U64(1))  # (0 wraps around: no hazard)
        if hazard.any():  # (few lanes, but not always: an exact sum may well sit there)
            i = np.flatnonzero(hazard)
            pi, ci, si = _flat_at(p, s.shape, i), _flat_at(c, s.shape, i), s.reshape(-1)[i]
            pv = si - ci  # two-sum: si + e == pi + ci exactly
            e = (pi - pv) + (ci - (si - pv))
            sb = si.view(U64)
            odd = (e != 0) & np.isfinite(e) & ((sb & U64(1)) == 0)
            away = (e > 0) == (si > 0)  # towards the exact value: away from zero, or towards it
            bits.reshape(-1)[i] = np.where(odd, np.where(away, sb + U64(1), sb - U64(1)), sb)
        nan = mag > INF_BITS
        if nan.any():  # (a NaN made here, as inf - inf, stays the one the sum made)
            a1, b1, c1 = (np.broadcast_to(np.asarray(v, F64), s.shape)[nan] for v in (a, b, c))
            s[nan] = np.where(np.isnan(b1), b1, np.where(np.isnan(a1), a1,
                                                         np.where(np.isnan(c1), c1, s[nan])))
        return s.astype(F32).reshape(np.shape(total))


DOT_LANES = 4  # products per vector block in a compiled `sum += a*b` loop


def mac_in_order(acc, a, b, k: int, n: int) -> np.ndarray:
    """Step k of n of a plain float loop `sum += a[k]*b[k]` (ggml's scalar kernels: ssm_conv,
    solve_tri) as the oracle's build (-O3 -mfma) compiles it: the first n//4*4 steps are products
    rounded on their own (a 4-lane vector multiply) added one by one in order, the remaining
    steps fused multiply-adds (the scalar tail, which the compiler contracts). Found by comparing
    every loop length from 2 to 16 with the oracle."""
    return acc + a * b if k < n // DOT_LANES * DOT_LANES else fmaf(a, b, acc)


CHUNK = 1 << 14  # elements per block: numpy temporaries of a block stay in the CPU cache


def by_rows(fn, *arrays: np.ndarray) -> np.ndarray:
    """fn(*arrays) computed a block of rows (first axis of 2-d arrays) at a time."""
    n = arrays[0].shape[0]
    step = max(1, CHUNK // max(1, arrays[0].shape[-1]))
    if n <= step:
        return fn(*arrays)
    out = np.empty(arrays[0].shape, F32)
    for i in range(0, n, step):
        out[i:i + step] = fn(*(a[i:i + step] for a in arrays))
    return out


# --- ggml_v_expf / ggml_v_silu (AVX2 + FMA) -----------------------------------------------------

_HEX = float.fromhex
EXP_SHIFT = F32(_HEX("0x1.8p23"))  # 1.5 * 2^23: adding it rounds to an integer
LOG2E = F32(_HEX("0x1.715476p+0"))
LN2_HI, LN2_LO = F32(_HEX("-0x1.62e4p-1")), F32(_HEX("-0x1.7f7d1cp-20"))  # -ln 2 in two parts
EXP_POLY = tuple(F32(_HEX(c)) for c in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3",
                                        "0x1.573e2ep-5", "0x1.0e4020p-7"))  # c1 .. c5
U32 = np.uint32


def v_expf_lanes(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf, every lane at once: exp(x) = 2^n * p(b). Each AVX2 instruction is one IEEE
    operation on each lane, so these array operations give the vector code's bits."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        z = fmaf(x, LOG2E, EXP_SHIFT)  # _mm256_fmadd_ps(x, log2e, 0x1.8p23)
        n = z - EXP_SHIFT  # round(x * log2 e)
        b = fmaf(n, LN2_LO, fmaf(n, LN2_HI, x))  # x - n ln 2, in two steps
        e = z.view(U32) << U32(23)  # n's integer bits moved into the exponent field
        k = (e + U32(0x3F800000)).view(F32)  # 2^n
        c1, c2, c3, c4, c5 = EXP_POLY
        u = b * b
        j = fmaf(fmaf(fmaf(c5, b, c4), u, fmaf(c3, b, c2)), u, c1 * b)  # p(b) - 1
        # |n| > 126: 2^n as two factors s1 * s2, so that neither overflows or underflows early
        g = np.where(n <= 0, U32(0x82000000), U32(0))
        s1 = (g + U32(0x7F000000)).view(F32)
        s2 = (e - g).view(F32)
        an = np.abs(n)
        return np.where(an > 192, s1 * s1,  # 0 or infinity
                        np.where(an > 126, fmaf(s2, j, s2) * s1, fmaf(k, j, k))).astype(F32)


@twin("v_expf")
def v_expf_into(x, out) -> None:
    """engine._lanes.v_expf: out[i] = ggml_v_expf's lane of x[i] (a block at a time, so that
    numpy's temporaries stay in the CPU's cache)."""
    x, out = np.frombuffer(x, F32), np.frombuffer(out, F32)
    for i in range(0, len(x), CHUNK):
        out[i:i + CHUNK] = v_expf_lanes(x[i:i + CHUNK])


@twin("v_silu")
def v_silu_into(x, out, g=None, threads: int = 1) -> None:
    """engine._lanes.v_silu: out[i] = ggml_v_silu's lane of x[i], x / (1 + v_expf(0 - x)); with
    g, times g[i] (ggml_vec_swiglu_f32). (`threads`: how many threads the C loop shares the
    elements out to; here one does them all, the same bits.)"""
    x, out = np.frombuffer(x, F32), np.frombuffer(out, F32)
    gs = None if g is None else np.frombuffer(g, F32)
    with np.errstate(all="ignore"):
        for i in range(0, len(x), CHUNK):
            xi = x[i:i + CHUNK]
            out[i:i + CHUNK] = xi / (F32(1) + v_expf_lanes(F32(0) - xi))
            if gs is not None:
                out[i:i + CHUNK] *= gs[i:i + CHUNK]


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (AVX2): exp by a degree-5 polynomial on x - n·ln2, scaled by 2^n built from
    exponent bits; |n| > 126 and > 192 take the overflow/underflow lanes (in C, or its twin)."""
    x = np.ascontiguousarray(x, F32)
    out = np.empty_like(x)
    lanes.v_expf(x, out)
    return out


def v_silu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """ggml_v_silu: x / (1 + v_expf(0 - x)), lane by lane (into `out` when it is a contiguous
    float32 array of x's shape: it may be x itself)."""
    x = np.ascontiguousarray(x, F32)
    if out is not None and out.flags.c_contiguous and out.dtype == F32 and out.shape == x.shape:
        lanes.v_silu(x, out)
        return out
    y = np.empty_like(x)
    lanes.v_silu(x, y)
    if out is None:
        return y
    out[...] = y
    return out


def silu_scalar(x: np.ndarray) -> np.ndarray:
    """ggml_silu_f32: x / (1 + expf(-x)) (the tail of a row, and f16 data)."""
    with np.errstate(all="ignore"):
        return x / (F32(1) + expf(-x))


def silu_rows(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """ggml_vec_silu_f32 on every row of x (last axis): whole 8-lane groups by v_silu, the rest by
    the scalar formula, as the AVX2 build splits each row (into `out` if given)."""
    n = x.shape[-1]
    np_ = n - n % SIMD_LANES
    if np_ == n:
        return v_silu(x, out)
    out = np.empty(x.shape, F32) if out is None else out
    out[..., :np_] = v_silu(x[..., :np_])
    out[..., np_:] = silu_scalar(x[..., np_:])
    return out



@query
def ggml_compute_softplus_f32(x) -> np.ndarray:
    """ggml_compute_softplus_f32 (ggml-impl.h) of each element: x above 20, else
    logf(1 + expf(x)) with the C library's functions. SOFTPLUS, Mamba-2's scan and the op_params
    ggml_xielu stores all use it."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        return np.where(x > F32(20), x, logf(F32(1) + expf(x))).astype(F32)

# --- the fp16 tables of ggml_cpu_init -------------------------------------------------------

def gelu_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32: 0.5x(1 + tanh(√(2/π)·x·(1 + 0.044715x²))), evaluated in float32.

    The CPU library is built with -mfma, and the compiler fuses `1 + (a·x)·x` into one fmaf; the
    table shows it (fp16 entry 0xBFFF differs without the fusion)."""
    with np.errstate(all="ignore"):
        inner = fmaf(GELU_COEF_A * x, x, F32(1))
        return F32(0.5) * x * (F32(1) + tanhf(SQRT_2_OVER_PI * x * inner))


def gelu_quick_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_quick_f32: x · 1/(1 + expf(-1.702x))."""
    with np.errstate(all="ignore"):
        return x * (F32(1) / (F32(1) + expf(GELU_QUICK_COEF * x)))


@cache
def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: fp16 bits of gelu(v) for every fp16 bit pattern v."""
    v = fp16_bits_to_fp32(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    return fp32_to_fp16_bits(gelu_f32(v))


@cache
def gelu_quick_table() -> np.ndarray:
    """ggml_table_gelu_quick_f16."""
    v = fp16_bits_to_fp32(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    return fp32_to_fp16_bits(gelu_quick_f32(v))


def fp16_bits(x: np.ndarray) -> np.ndarray:
    """fp32_to_fp16_bits (round to nearest even), fast for fp16's normal range: the rounding is
    done on the float's bits; zeros, subnormals, overflow, inf and NaN take the exact converter."""
    a = x.view(np.uint32) & np.uint32(0x7FFFFFFF)
    h = (a - np.uint32(0x38000000) + np.uint32(0x0FFF) + ((a >> 13) & np.uint32(1))) >> 13
    h |= (x.view(np.uint32) >> 16) & np.uint32(0x8000)
    h = h.astype(np.uint16)
    odd = (a < np.uint32(0x38800000)) | (a >= np.uint32(0x477FF000))
    if odd.any():
        h[odd] = fp32_to_fp16_bits(x[odd])
    return h


@cache
def widened_table(table: str) -> np.ndarray:
    """A table's entries as float32 (GGML_CPU_FP16_TO_FP32 of each), so a lookup is one gather."""
    return fp16_bits_to_fp32({"gelu": gelu_table, "gelu_quick": gelu_quick_table}[table]())


def _gelu_via_table(x: np.ndarray) -> np.ndarray:
    y = widened_table("gelu")[fp16_bits(x)]
    np.copyto(y, x, where=x >= F32(10))
    np.copyto(y, F32(0), where=x <= F32(-10))
    return y


@twin("gelu_lookup")
def gelu_lookup(x, table, out, clamp: bool = True, g=None, threads: int = 1) -> None:
    """engine._lanes.gelu_lookup: out = the entries of table (a widened fp16 table, 65536
    float32) at fp16_bits(x); with clamp (ggml_vec_gelu_f32's) 0 where x <= -10 and x where
    x >= 10. With g (ggml_vec_geglu_f32): those times g, then +0 where x <= -10 (not 0·g: -0,
    or NaN for an infinite g). (`threads`: how many threads the C loop shares them out to; the
    same bits.)"""
    xs = np.frombuffer(x, F32)
    y = np.frombuffer(table, F32)[fp16_bits(xs)]
    if clamp:
        np.copyto(y, xs, where=xs >= F32(10))
        np.copyto(y, F32(0), where=xs <= F32(-10))
    if g is not None:
        np.multiply(y, np.frombuffer(g, F32), out=y)
        np.copyto(y, F32(0), where=xs <= F32(-10))
    np.frombuffer(out, F32)[:] = y


def gelu_via_table(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: 0 below -10, x above 10, else the table entry of
    fp16(x) widened back to float."""
    return by_rows(_gelu_via_table, x.reshape(-1, x.shape[-1])).reshape(x.shape)


def gelu_quick_via_table(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_quick_f32 with GGML_GELU_QUICK_FP16: the table entry of fp16(x), no clamp."""
    return widened_table("gelu_quick")[fp16_bits(x)]
