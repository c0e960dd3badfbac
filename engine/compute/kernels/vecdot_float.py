"""ggml's CPU dot products of float rows, reproduced operation by operation (AVX2 build): F32, F16
and BF16, and llamafile's tinyBLAS for all three; and what the quantized ones (vecdot.py) share
with them: hsum_float_8, rows of a buffer, a C loop's result written into place.

Each output of mul_mat is one `ggml_vec_dot_*` call (the transposed convolutions, conv_3d,
soft_max_back and gated_delta_net call these too), and these emulate that call's arithmetic for
whole tiles at once: the same lanes, the same fused multiply-adds, the same horizontal sums.
Their results equal real ggml's bit for bit (tested), where a BLAS product only agrees to
rounding; which products mul_mat gives them is matmul.emulates_vec_dot's rule.

The loops over rows run in C (engine._lanes: dot_f32, float_dot, called as `lanes.<name>`); each
has its numpy twin here, the same bits, written for reading (and run in pure-numpy mode,
engine/lanes.py):

- ggml_vec_dot_f32 (f32_row): 4 accumulators of 8 lanes over steps of 32, fma per lane, reduced
  pairwise (lanes32), then the leftover elements as gcc's code does them (vector products summed
  in order, the last few by fma).
- ggml_vec_dot_f16 (f16_row): the same lanes over halves widened to float (F16C); the leftovers
  each rounded to float and summed in double.
- ggml_vec_dot_bf16 (bf16_row; src1 converted to bf16 first): the same 4 accumulators of 8 lanes
  over bf16 widened to float (gcc fuses the loop's mul and add), reduced (a0 + a2) + (a1 + a3)
  and then by hsum8; the leftovers as f16_row's.
- llamafile's tinyBLAS (tiny_row), for F32, F16 and BF16 weights alike: one accumulator of 8
  lanes, then hsum8.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from engine.compute.kernels.floatmath import fmaf
from engine.lanes import lanes, twin
from engine.core.types import NUMPY_DTYPE, GGMLType, bf16_bits_to_fp32, fp16_bits_to_fp32

F32, F64 = np.float32, np.float64
EPR, ARR = 8, 4  # AVX2: floats per vector, accumulators per step (GGML_F32_STEP = 32)
STEP = EPR * ARR
PAIRS = 1 << 12  # the float twins: this many pairs of rows at a time (in the CPU's cache)

# --- the shared pieces: horizontal sums, the float lanes ---------------------------------------

def hsum8(acc: np.ndarray) -> np.ndarray:
    """hsum_float_8 over the last axis (8 lanes): (hi + lo), then (r0 + r2) + (r1 + r3)."""
    r = acc[..., 4:] + acc[..., :4]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def acc32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The SIMD loop of ggml_vec_dot_f32 (and _f16, _bf16) over the last axis (a multiple of 32;
    the leading axes broadcast): 4 accumulators of 8 lanes, acc += a·b fused per lane, reduced
    (acc0 + acc2) + (acc1 + acc3) -> float32 (..., 8)."""
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    acc = np.zeros((*shape, ARR, EPR), F32)  # accumulator j, lane l: elements 32s + 8j + l
    for i in range(0, a.shape[-1], STEP):  # the 4 accumulators' fmas of a step at once
        acc = fmaf(a[..., i:i + STEP].reshape(*a.shape[:-1], ARR, EPR),
                   b[..., i:i + STEP].reshape(*b.shape[:-1], ARR, EPR), acc)
    return (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])


def lanes32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The GGML_F32_VEC loop of ggml_vec_dot_f32 over the last axis (a multiple of 32): acc32,
    then the rest of GGML_F32x8_REDUCE (low + high half, two horizontal adds) -> float32 (...)."""
    v = acc32(a, b)
    t0 = v[..., :4] + v[..., 4:]
    return (t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])


def f32_row(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 over the last axis: lanes32 over the first k & ~31 elements, then the rest
    as gcc compiled `sumf += x[i]*y[i]`: runs of 8 (then one of 4) as vector products, each
    rounded to float and added in order; the last k % 4 by fmaf."""
    k = a.shape[-1]
    n32 = k & ~(STEP - 1)
    sumf = lanes32(a[..., :n32], b[..., :n32])
    fused = k - k % 4
    for i in range(n32, k):
        if i < fused:
            sumf = sumf + a[..., i] * b[..., i]
        else:
            sumf = fmaf(a[..., i], b[..., i], sumf)
    return sumf


def f16_row(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 (F16C build) over the last axis, the halves widened to float: lanes32 over
    the first k & ~31 elements, then each leftover product rounded to float and added in double,
    in order; the double rounded to float."""
    k = a.shape[-1]
    n32 = k & ~(STEP - 1)
    sumf = lanes32(a[..., :n32], b[..., :n32]).astype(F64)
    for i in range(n32, k):
        sumf = sumf + (a[..., i] * b[..., i]).astype(F64)
    return sumf.astype(F32)


def bf16_row(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_bf16 (AVX2 build) over the last axis, bf16 widened to float: acc32 over the
    first k & ~31 elements, its 8 lanes summed by hsum8 (ggml's _mm256 to _mm_ shuffles), then
    the leftovers as f16_row's: each product rounded to float, added in double."""
    k = a.shape[-1]
    n32 = k & ~(STEP - 1)
    sumf = hsum8(acc32(a[..., :n32], b[..., :n32])).astype(F64)
    for i in range(n32, k):
        sumf = sumf + (a[..., i] * b[..., i]).astype(F64)
    return sumf.astype(F32)


def tiny_row(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """llamafile's tinyBLAS (AVX2, FMA) over the last axis (a multiple of 8): one accumulator of 8
    lanes, an fma per 8 elements, then hsum8."""
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    acc = np.zeros((*shape, EPR), F32)
    for s in range(0, a.shape[-1], EPR):
        acc = fmaf(a[..., s:s + EPR], b[..., s:s + EPR], acc)
    return hsum8(acc)


# The twins take the C functions' arguments: buffers (contiguous, anything with the buffer
# protocol), read and written through np.frombuffer.

def strided_rows(buf, dtype, n: int, ld: int, width: int) -> np.ndarray:
    """n rows of `width` elements lying ld elements apart in a buffer -> (n, width), a view."""
    flat = np.frombuffer(buf, dtype)
    return np.lib.stride_tricks.as_strided(flat, shape=(n, width), strides=(ld * flat.itemsize,
                                           flat.itemsize), writeable=False)


def _all_pairs(row: Callable, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[i1, i0] = row(w[i0], x[i1]) for every pair of rows of w (n0, k) and x (n1, k): a block
    of weight rows at a time, every activation row at once."""
    step = max(1, PAIRS // max(1, len(x)))
    for a in range(0, len(w), step):
        out[:, a:a + step] = row(w[None, a:a + step], x[:, None])


@twin("float_dot")
def float_dot(w, x, out, n0: int, n1: int, k: int, tiny: bool, ldw: int = -1,
              threads: int = 1, bf16: bool = False, portable: bool = False) -> None:
    """engine._lanes.float_dot: out (n1, n0) float32 = ggml_vec_dot_f16 (f16_row; bf16:
    ggml_vec_dot_bf16, bf16_row; tiny: tinyBLAS, tiny_row) of row i0 of w (n0, k) and row i1 of
    x (n1, k). ldw >= 0: w holds halves (bf16: bf16, which asks for ldw >= 0), row i0 at element
    i0 * ldw, widened to float first. (`threads`: how many threads the C loop shares the rows
    out to, `portable`: its loop for CPUs without FMA; here one does them all, the same bits.)"""
    if bf16 and ldw < 0:
        raise ValueError("_lanes: bad sizes")
    if ldw < 0:
        wf = np.frombuffer(w, F32).reshape(n0, k)
    else:
        widen = bf16_bits_to_fp32 if bf16 else fp16_bits_to_fp32
        wf = widen(strided_rows(w, np.uint16, n0, ldw, k))
    row = tiny_row if tiny else bf16_row if bf16 else f16_row
    _all_pairs(row, wf, np.frombuffer(x, F32).reshape(n1, k),
               np.frombuffer(out, F32).reshape(n1, n0))


@twin("dot_f32")
def dot_f32(w, x, out, n0: int, n1: int, k: int, pairs: bool = False) -> None:
    """engine._lanes.dot_f32: out (n1, n0) float32 = ggml_vec_dot_f32 (f32_row) of row i0 of w
    (n0, k) and row i1 of x (n1, k); pairs (n1 == n0): out (n0) of row i of w and row i of x."""
    wf, xf = np.frombuffer(w, F32).reshape(n0, k), np.frombuffer(x, F32).reshape(n1, k)
    if not pairs:
        _all_pairs(f32_row, wf, xf, np.frombuffer(out, F32).reshape(n1, n0))
        return
    o = np.frombuffer(out, F32)
    for a in range(0, n0, PAIRS):
        o[a:a + PAIRS] = f32_row(wf[a:a + PAIRS], xf[a:a + PAIRS])


def vec_dot_f16(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16(K, w row, x row) for every pair: w (n0, K), x (n1, K) fp16 values
    (given as float32 or float16) -> (n1, n0).

    The F16C build widens each 8 halves to floats and runs the F32 loop (GGML_F32Cx8 = the F32
    lanes, fmas and reduction); the leftovers are added in double, each product rounded to float
    first: sumf += (ggml_float)(x[i]*y[i])."""
    return _float_dot(w, x, False)


def vec_dot_bf16(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_bf16(K, w row, x row) for every pair: w (n0, K) bf16 bits (uint16), x (n1, K)
    bf16 values as float32 (src1 after ggml_cpu_fp32_to_bf16) -> (n1, n0).

    The AVX2 build widens each 8 bf16 to floats (a shift) into 4 accumulators, their mul and
    add fused by gcc into one fma (each product is exact in float anyway: what the fusion
    changes is where a product overflows or underflows); reduced (c1 + c3) + (c2 + c4), then
    hi + lo and two shuffled adds, into a double; the leftovers added in double, each product
    rounded to float first."""
    return _float_dot(w, x, False)


def _float_dot(w: np.ndarray, x: np.ndarray, tiny: bool) -> np.ndarray:
    """lanes.float_dot (engine/c/float.c, or the twin float_dot): every pair's product,
    (n1, n0) float32."""
    out = np.empty((x.shape[0], w.shape[0]), F32)
    float_product(w, out, tiny)(x)
    return out


def float_product(w: np.ndarray, out: np.ndarray, tiny: bool, threads: int = 1
                  ) -> Callable[[np.ndarray], None]:
    """_float_dot laid out once, ready to run on x (floats): out (n1, n0). w: floats, halves
    (float16), or bf16 bits (uint16: BF16 weights, ggml_vec_dot_bf16's row). Half or bf16 weights
    whose rows are contiguous (a KV cache's view) go as they lie: the loop widens them, row
    stride and all; other bf16 weights are packed, other weights widened to float32, when it
    runs."""
    n0, k = w.shape
    bf16 = w.dtype == NUMPY_DTYPE[GGMLType.BF16]
    halves = _halves_as_they_lie(w)
    dot = lanes.float_dot

    def run(x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, F32)
        if halves is not None:
            span, ld = halves
            written(out, lambda res: dot(span, x, res, n0, len(x), k, tiny, ld, threads, bf16))
        elif bf16:
            packed = np.ascontiguousarray(w)
            written(out, lambda res: dot(packed, x, res, n0, len(x), k, tiny, k, threads, True))
        else:
            wf = np.ascontiguousarray(w, F32)
            written(out, lambda res: dot(wf, x, res, n0, len(x), k, tiny, -1, threads))
    return run


def bound_float_product(w: np.ndarray, out: np.ndarray, x: np.ndarray, tiny: bool,
                        threads: int = 1) -> Callable[[], None]:
    """float_product on activation rows x that stay where they lie (floats): when w's halves or
    bf16 lie as the C loop reads them and x and out are packed, its call with every argument
    bound once; else float_product's run on x."""
    halves = _halves_as_they_lie(w)
    if halves is not None and out.flags.c_contiguous and x.flags.c_contiguous \
            and x.dtype == F32 and len(x):
        span, ld = halves
        return partial(lanes.float_dot, span, x, out, w.shape[0], len(x), w.shape[1], tiny, ld,
                       threads, w.dtype == NUMPY_DTYPE[GGMLType.BF16])
    return partial(float_product(w, out, tiny, threads), x)


def _halves_as_they_lie(w: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Half or bf16 weight rows (n0, k) whose elements are packed, rows apart: as float_dot reads
    them (one flat span of uint16 from the first row's first element, and the rows' distance in
    elements); None for other weights."""
    n0, k = w.shape
    if w.dtype not in (np.float16, NUMPY_DTYPE[GGMLType.BF16]) or not n0 or w.strides[1] != 2 \
            or w.strides[0] % 2 or w.strides[0] < 2 * k:
        return None
    ld = w.strides[0] // 2
    return np.lib.stride_tricks.as_strided(w.view(np.uint16)[0], shape=((n0 - 1) * ld + k,),
                                           strides=(2,)), ld


def vec_dot_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32(K, w row, x row) for every pair: w (n0, K), x (n1, K) -> (n1, n0), by
    lanes.dot_f32 (in C without the GIL, or the twin dot_f32)."""
    out = np.empty((len(x), w.shape[0]), F32)
    f32_product(w, out)(x)
    return out


def f32_product(w: np.ndarray, out: np.ndarray) -> Callable[[np.ndarray], None]:
    """vec_dot_f32 ready to run on x: out (n1, n0)."""
    n0, k = w.shape
    dot = lanes.dot_f32

    def run(x: np.ndarray) -> None:
        wf, xf = np.ascontiguousarray(w, F32), np.ascontiguousarray(x, F32)
        written(out, lambda res: dot(wf, xf, res, n0, len(xf), k))
    return run


def f32_products(w4: np.ndarray, out4: np.ndarray, r2: int, r3: int, tiny: bool
                 ) -> Callable[[np.ndarray], None]:
    """Every matrix of a node of float32 weights at once, ready to run on x4 (ne13, ne12, n1, k):
    out4[i13, i12] (n1, n0) = vec_dot_f32 (tiny: llamafile's tinyBLAS) of w4[i13 // r3,
    i12 // r2] (n0, k) with x4[i13, i12]. Each operand is packed once for the node (the
    attention's heads lie interleaved), then one C loop per matrix: f32_product's or
    float_product's bits."""
    n0, k = w4.shape[2:]
    ne13, ne12, n1 = out4.shape[:3]
    matrices = [(i13 // r3, i12 // r2, i13, i12) for i13 in range(ne13) for i12 in range(ne12)]
    packed = out4.flags.c_contiguous
    f32, flt = lanes.dot_f32, lanes.float_dot

    def run(x4: np.ndarray) -> None:
        wf, xf = np.ascontiguousarray(w4, F32), np.ascontiguousarray(x4, F32)
        res = out4 if packed else np.empty(out4.shape, F32)
        for i03, i02, i13, i12 in matrices:
            if tiny:
                flt(wf[i03, i02], xf[i13, i12], res[i13, i12], n0, n1, k, True)
            else:
                f32(wf[i03, i02], xf[i13, i12], res[i13, i12], n0, n1, k)
        if not packed:
            out4[...] = res
    return run


def vec_dot_tinyblas(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """llamafile's tinyBLAS (AVX2, FMA) for every pair: w (n0, K), x (n1, K) float values (F32,
    F16 or BF16 widened; w may be float16, or bf16 bits as uint16), K a multiple of 8 ->
    (n1, n0). One 8-lane accumulator per output, an fma
    per 8 elements along K, then the same horizontal sum as hsum_float_8."""
    return _float_dot(w, x, True)


def vec_dot_f32_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 of each row of a with the same row of b (broadcast against each other,
    elements on the last axis): (..., K), (..., K) -> (...), by lanes.dot_f32 (pairs)."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    shape, k = a.shape[:-1], a.shape[-1]
    a2, b2 = (np.ascontiguousarray(v).reshape(-1, k) for v in (a, b))
    out = np.empty(a2.shape[0], F32)
    lanes.dot_f32(a2, b2, out, a2.shape[0], a2.shape[0], k, True)
    return out.reshape(shape)


def written(out: np.ndarray, fill: Callable[[np.ndarray], None]) -> None:
    """fill(res) writes a C loop's (n1, n0) float32 result: out itself when its rows are packed,
    else a buffer copied into it."""
    if out.flags.c_contiguous:
        fill(out)
    else:
        res = np.empty(out.shape, F32)
        fill(res)
        out[...] = res
