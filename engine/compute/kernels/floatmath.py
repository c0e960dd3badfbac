"""float32 math the way the oracle's CPU build computes it, vectorised with numpy.

ggml's kernels call glibc's float functions (expf, tanhf, erff, ...) one element at a time, and
its AVX2 build replaces some of them with SIMD code (`ggml_v_expf`, `ggml_v_silu`) for the part of
a row that fills whole 8-lane vectors. This module rebuilds those results over whole arrays:

* fmaf: a fused multiply-add (one rounding), computed exactly in float64 then rounded. The
  product of two floats is exact in a double; only a sum landing on a float rounding midpoint
  after the double rounding could differ (vanishingly rare).
* expm1f, and tanhf built on it exactly as glibc 2.36 builds it: bit-exact with glibc.
* expf, logf, sinf, cosf: the float64 result rounded once. glibc's versions are within about half
  an ulp, so a small fraction of results differ from glibc's by one ulp.
* erff: glibc's rational approximations (fdlibm's coefficients), in float32.
* v_expf / v_silu: ggml's AVX2 polynomial, lane by lane (8 lanes on the oracle's machine).
* The fp16 GELU and GELU-quick tables that ggml_cpu_init builds (GGML_GELU_FP16).
"""

from __future__ import annotations

from functools import cache

import numpy as np

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


def expf(x: np.ndarray) -> np.ndarray:
    """expf, correctly rounded (glibc's is within 0.502 ulp)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(np.asarray(x, F64)).astype(F32)


def logf(x: np.ndarray) -> np.ndarray:
    """logf, correctly rounded."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(x, F64)).astype(F32)


def sinf(x: np.ndarray) -> np.ndarray:
    return np.sin(np.asarray(x, F64)).astype(F32)


def cosf(x: np.ndarray) -> np.ndarray:
    return np.cos(np.asarray(x, F64)).astype(F32)


def expm1f(x: np.ndarray) -> np.ndarray:
    """expm1f: numpy's float32 expm1 calls libm's, so this is glibc's own result."""
    with np.errstate(over="ignore"):
        return np.expm1(np.asarray(x, F32))


def tanhf(x: np.ndarray) -> np.ndarray:
    """glibc's tanhf: 1 - 2/(expm1(2|x|) + 2) for |x| >= 1, -t/(t + 2) with t = expm1(-2|x|)
    below, 1 from |x| >= 22; the sign of x put back."""
    x = np.asarray(x, F32)
    ax = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):
        big = ax >= 1
        t = expm1f(np.where(big, F32(2) * ax, F32(-2) * ax))
        z = np.where(big, F32(1) - F32(2) / (t + F32(2)), -t / (t + F32(2)))
    z = np.where(ax >= 22, F32(1), z)
    return np.where(np.isnan(x), x, np.copysign(z, x)).astype(F32)


# erff on [0, 0.84375), [0.84375, 1.25), [1.25, 1/0.35) and [1/0.35, 6): fdlibm's coefficients
_ERX = F32(8.4506291151e-01)
_EFX = F32(1.2837916613e-01)
_PP = [F32(v) for v in (1.2837916613e-01, -3.2504209876e-01, -2.8481749818e-02, -5.7702702470e-03,
                        -2.3763017452e-05)]
_QQ = [F32(v) for v in (3.9791721106e-01, 6.5022252500e-02, 5.0813062117e-03, 1.3249473704e-04,
                        -3.9602282413e-06)]
_PA = [F32(v) for v in (-2.3621185683e-03, 4.1485610604e-01, -3.7220788002e-01, 3.1834661961e-01,
                        -1.1089469492e-01, 3.5478305072e-02, -2.1663755178e-03)]
_QA = [F32(v) for v in (1.0642088205e-01, 5.4039794207e-01, 7.1828655899e-02, 1.2617121637e-01,
                        1.3637083583e-02, 1.1984500103e-02)]
_RA = [F32(v) for v in (-9.8649440333e-03, -6.9385856390e-01, -1.0558626175e+01, -6.2375331879e+01,
                        -1.6239666748e+02, -1.8460508728e+02, -8.1287437439e+01, -9.8143291473e+00)]
_SA = [F32(v) for v in (1.9651271820e+01, 1.3765776062e+02, 4.3456588745e+02, 6.4538726807e+02,
                        4.2900814819e+02, 1.0863500214e+02, 6.5702495575e+00, -6.0424413532e-02)]
_RB = [F32(v) for v in (-9.8649431020e-03, -7.9928326607e-01, -1.7757955551e+01, -1.6063638306e+02,
                        -6.3756646729e+02, -1.0250950928e+03, -4.8351919556e+02)]
_SB = [F32(v) for v in (3.0338060379e+01, 3.2579251099e+02, 1.5367296143e+03, 3.1998581543e+03,
                        2.5530502930e+03, 4.7452853394e+02, -2.2440952301e+01)]


def _horner(z: np.ndarray, coefs: list, lead_one: bool) -> np.ndarray:
    """c0 + z*(c1 + z*(...)) in float32; with lead_one, 1 + z*(c0 + z*(...))."""
    acc = np.full_like(z, coefs[-1])
    for c in reversed(coefs[:-1]):
        acc = c + z * acc
    return F32(1) + z * acc if lead_one else acc


def erff(x: np.ndarray) -> np.ndarray:
    """erff by glibc's (fdlibm's) piecewise rational approximations, in float32."""
    x = np.asarray(x, F32)
    ax = np.abs(x)
    one = F32(1)
    with np.errstate(all="ignore"):
        z = x * x
        small = x + x * (_horner(z, _PP, False) / _horner(z, _QQ, True))
        tiny = x + _EFX * x
        s = ax - one
        pq = _horner(s, _PA, False) / _horner(s, _QA, True)
        mid = np.where(x >= 0, _ERX + pq, -_ERX - pq)
        s = one / (ax * ax)
        near = ax < F32(1 / 0.35)
        r = np.where(near, _horner(s, _RA, False), _horner(s, _RB, False))
        q = np.where(near, _horner(s, _SA, True), _horner(s, _SB, True))
        zt = (ax.view(np.uint32) & np.uint32(0xFFFFF000)).view(F32)
        e = expf(-zt * zt - F32(0.5625)) * expf((zt - ax) * (zt + ax) + r / q)
        tail = np.where(x >= 0, one - e / ax, e / ax - one)
    y = np.where(ax < F32(0.84375), np.where(ax < F32(2.0 ** -28), tiny, small),
                 np.where(ax < F32(1.25), mid, np.where(ax < 6, tail, np.copysign(one, x))))
    return np.where(np.isnan(x), x, y).astype(F32)


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
