"""float32 math the way the oracle's CPU build computes it, over whole arrays.

ggml's kernels get their float math from two places, and so does the engine:

* **The C library** (expf, expm1f, logf, sinf, cosf, tanhf, erff, powf): re-exported from
  `engine.libm`, which calls the same C functions once per element. Never numpy's float ufuncs,
  whose last bit depends on the SIMD path numpy picks for the CPU.
* **ggml's own arithmetic**, emulated with IEEE operations only (+, -, ×, ÷, comparisons and bit
  manipulation, whose results numpy cannot vary):
  - fmaf: a fused multiply-add (one rounding), computed exactly in float64 then rounded. The
    product of two floats is exact in a double; only a sum landing on a float rounding midpoint
    after the double rounding could differ (vanishingly rare).
  - mac_in_order: one step of a plain C loop `sum += a[k]*b[k]` as the oracle's build compiles
    it (see there).
  - v_expf / v_silu: ggml's AVX2 polynomial (`ggml_v_expf`, `ggml_v_silu`), lane by lane, for the
    part of a row that fills whole 8-lane vectors.
  - The fp16 GELU and GELU-quick tables that ggml_cpu_init builds (GGML_GELU_FP16), from libm's
    tanhf and expf.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from engine.libm import cosf, erff, expf, expm1f, logf, powf, sinf, \
    tanhf  # noqa: F401 (re-exported)
from engine.types import fp16_bits_to_fp32, fp32_to_fp16_bits

F32, F64 = np.float32, np.float64
SIMD_LANES = 8  # AVX2: ggml_vec_silu_f32 and friends take 8 floats at a time

GELU_COEF_A = F32(0.044715)
GELU_QUICK_COEF = F32(-1.702)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
SQRT_2_INV = F32(0.70710678118654752440084436210484)


def fmaf(a, b, c) -> np.ndarray:
    """fmaf(a, b, c): a*b + c with a single rounding to float32."""
    r = np.multiply(a, b, dtype=F64)
    r += c
    return r.astype(F32)


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

_V_C = [F32(float.fromhex(h)) for h in (
    "0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")]
_V_SHIFT = F32(float.fromhex("0x1.8p23"))
_V_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_V_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_V_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (AVX2): exp by a degree-5 polynomial on x - n·ln2, scaled by 2^n built from
    exponent bits; |n| > 126 and > 192 take the overflow/underflow lanes."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        z = fmaf(x, _V_LOG2E, _V_SHIFT)
        n = z - _V_SHIFT
        b = fmaf(-n, _V_LN2_LO, fmaf(-n, _V_LN2_HI, x))
        e = z.view(np.int32) << 23
        k = (e + F32(1).view(np.int32)).view(F32)
        c = np.abs(n) > F32(126)
        u = b * b
        c0, c1, c2, c3, c4 = _V_C
        j = fmaf(fmaf(fmaf(c0, b, c1), u, fmaf(c2, b, c3)), u, c4 * b)
        out = fmaf(k, j, k)
        if c.any():
            g = np.where(n <= 0, np.int32(-0x7E000000), np.int32(0))  # 0x82000000 as int32
            s1 = (g + np.int32(0x7F000000)).view(F32)
            s2 = (e - g).view(F32)
            d = np.abs(n) > F32(192)
            out = np.where(d, s1 * s1, np.where(c, fmaf(s2, j, s2) * s1, out))
    return out.astype(F32)


def v_silu(x: np.ndarray) -> np.ndarray:
    """ggml_v_silu: x / (1 + v_expf(0 - x))."""
    with np.errstate(all="ignore"):
        return x / (F32(1) + v_expf(F32(0) - x))


def silu_scalar(x: np.ndarray) -> np.ndarray:
    """ggml_silu_f32: x / (1 + expf(-x)) (the tail of a row, and f16 data)."""
    with np.errstate(all="ignore"):
        return x / (F32(1) + expf(-x))


def _silu_rows(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    np_ = n - n % SIMD_LANES
    if np_ == n:
        return v_silu(x)
    return np.concatenate([v_silu(x[..., :np_]), silu_scalar(x[..., np_:])], axis=-1)


def silu_rows(x: np.ndarray) -> np.ndarray:
    """ggml_vec_silu_f32 on every row of x (last axis): whole 8-lane groups by v_silu, the rest by
    the scalar formula, as the AVX2 build splits each row."""
    return by_rows(_silu_rows, x.reshape(-1, x.shape[-1])).reshape(x.shape)


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
def _widened(table: str) -> np.ndarray:
    """A table's entries as float32 (GGML_CPU_FP16_TO_FP32 of each), so a lookup is one gather."""
    return fp16_bits_to_fp32({"gelu": gelu_table, "gelu_quick": gelu_quick_table}[table]())


def _gelu_via_table(x: np.ndarray) -> np.ndarray:
    y = _widened("gelu")[fp16_bits(x)]
    np.copyto(y, x, where=x >= F32(10))
    np.copyto(y, F32(0), where=x <= F32(-10))
    return y


def gelu_via_table(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: 0 below -10, x above 10, else the table entry of
    fp16(x) widened back to float."""
    return by_rows(_gelu_via_table, x.reshape(-1, x.shape[-1])).reshape(x.shape)


def gelu_quick_via_table(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_quick_f32 with GGML_GELU_QUICK_FP16: the table entry of fp16(x), no clamp."""
    return _widened("gelu_quick")[fp16_bits(x)]
