"""ggml's CPU dot products, reproduced operation by operation (AVX2 build): F32, F16, BF16, and the
quantized Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 (with Q8_0 activations), Q4_1, Q5_1 (with Q8_1
activations), Q2_K, Q3_K, IQ4_XS, Q4_K, Q5_K, Q6_K, TQ2_0, TQ1_0, IQ1_M, IQ3_XXS, IQ3_S and IQ2_S
(with Q8_K activations).

Each output of mul_mat is one `ggml_vec_dot_*` call (the transposed convolutions, conv_3d,
soft_max_back and gated_delta_net call the float ones too), and these emulate that call's
arithmetic for whole tiles at once: the same lanes, the same fused multiply-adds, the same
horizontal sums. Their results equal real ggml's bit for bit (tested), where a BLAS product only
agrees to rounding; which products mul_mat gives them is matmul.emulates_vec_dot's rule.

The loops over rows and blocks run in C (engine._lanes: dot_f32, float_dot, quant_dot, called
as `lanes.<name>`); each has its numpy twin here, the same bits, written for reading (and run in
pure-numpy mode, engine/lanes.py):

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
- ggml_vec_dot_q{4,5,8}_0_q8_0: per block, 8 lanes each summing 4 int8 products as
  mul_sum_i8_pairs_float makes them, |x| * sign(y, x) (exact integers, but that a -128 activation
  against a negative weight counts as +128), times d = d_x*d_y by fma into 8 lane accumulators;
  hsum_float_8 at the end.
- ggml_vec_dot_iq4_nl_q8_0: the same lanes of kvalues_iq4nl[nibble] (ggml's mul_add_epi8, whose
  sign trick makes a -128 activation against a negative value count as +128), the even blocks
  into one accumulator and the odd ones into another, hsum_float_8 of their sum; a row's odd
  last block by ggml's scalar loop (true products), fmaf(d, sum, result). llama.cpp's build
  hands its products of 2 or more activation rows to llamafile's tinyBLAS (`tiny`): one
  accumulator for every block, the lanes the same. ggml_vec_dot_mxfp4_q8_0
  (kernels/vecdot_tq.py) does the same over kvalues_mxfp4[nibble] (no tinyBLAS).
- ggml_vec_dot_q{4,5}_1_q8_1: the same lanes of unsigned quants; the offsets apart, summs =
  fmaf(x.m, y.s, summs) block after block, added to hsum_float_8(acc).
- ggml_vec_dot_q{2,3,4,5,6}_K_q8_K: per super-block, 8 integer lanes of scaled products, then the
  same fma and horizontal sums; the mins apart (Q4_K: 4 lanes of their own; Q5_K: one integer,
  summs = fmaf(-y.d * x.dmin, it, summs)), or Q2_K's 8 lanes of mins fma'd into the same
  accumulators just before each block's quants.
- ggml_vec_dot_iq4_xs_q8_K: IQ4_NL's lanes over 8 runs of 32, each run times its six-bit scale
  (minus 32), one accumulator.
- ggml_vec_dot_iq3_xxs_q8_K, _iq3_s_q8_K, _iq2_s_q8_K (vecdot_iq.py): signed grid values by the
  same sign trick, each run (IQ2_S: each 16) times 2 * ls + 1, one accumulator; IQ3_XXS's result
  0.25f * hsum_float_8(acc), IQ2_S's 0.125f * it.
- ggml_vec_dot_tq2_0_q8_K, _tq1_0_q8_K (kernels/vecdot_tq.py): lanes of the unsigned quants or
  trits (value + 1) less the block sums, in int16, then the same fma and horizontal sum.
- ggml_vec_dot_iq1_m_q8_K (kernels/vecdot_tq.py): the grid's values times their 3-bit scales by
  the sign trick, one accumulator; the shifts' lanes (+-1 per 8, the same scales) in a second,
  fma'd with the same d (the min lanes' path); the result fmaf(hsum(shifts), 1/8, hsum(acc)).
  decode_weights and block_lanes are one block's steps (the debugger shows them); quant_dot runs
  them over whole matrices.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import numpy as np

from engine.compute.kernels import vecdot_tq
from engine.compute.kernels.common import byte_span
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.vecdot_iq import IQ_GRIDS, decode_iq, iq_result, scaled_products
from engine.lanes import lanes, twin
from engine.quants.common import KVALUES_IQ4NL, bit_fields, get_scale_min_k4, half_at, nibbles, unpack_2bit
from engine.quants.kquants import q3_k_scales
from engine.quants.legacy import nibbles_with_qh
from engine.core.types import NUMPY_DTYPE, GGMLType, TYPE_TRAITS, bf16_bits_to_fp32, \
    fp16_bits_to_fp32

F32, F64 = np.float32, np.float64
EPR, ARR = 8, 4  # AVX2: floats per vector, accumulators per step (GGML_F32_STEP = 32)
STEP = EPR * ARR
PAIRS = 1 << 12  # the float twins: this many pairs of rows at a time (in the CPU's cache)
CHUNK = 1 << 21  # quant_dot's twin: about this many integer products at a time (its arrays stay
# near the CPU: several times faster than arrays of main memory)


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

def _rows(buf, dtype, n: int, ld: int, width: int) -> np.ndarray:
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
        wf = widen(_rows(w, np.uint16, n0, ldw, k))
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
    """lanes.float_dot (engine/_lanes_float.c, or the twin float_dot): every pair's product,
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


# --- quantized weights, their raw blocks ------------------------------------------------------

EXACT_QUANT = frozenset({GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                         GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.Q2_K, GGMLType.Q3_K,
                         GGMLType.IQ4_XS, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                         GGMLType.TQ2_0, GGMLType.TQ1_0, GGMLType.MXFP4, GGMLType.IQ1_M}) \
    | frozenset(IQ_GRIDS)  # IQ3_XXS, IQ3_S, IQ2_S (vecdot_iq.py)
K_QUANTS = frozenset({GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_XS, GGMLType.Q4_K, GGMLType.Q5_K,
                      GGMLType.Q6_K, GGMLType.TQ2_0, GGMLType.TQ1_0,
                      GGMLType.IQ1_M}) | frozenset(IQ_GRIDS)  # with Q8_K activations
MINS_IN_ACC = frozenset({GGMLType.Q2_K})  # its mins' 8 lanes go into acc itself, first
SIGNED_LANES = frozenset({GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.IQ4_NL,
                          GGMLType.IQ4_XS, GGMLType.MXFP4}) \
    | frozenset(IQ_GRIDS)  # lanes by _mm256_sign_epi8 (see block_lanes)
PAIRED_BLOCKS = frozenset({GGMLType.IQ4_NL, GGMLType.MXFP4})  # two accumulators, and a scalar odd last block
OFFSET_QUANTS = frozenset({GGMLType.Q4_1, GGMLType.Q5_1})  # with Q8_1 (the others: Q8_0)


class Decoded(NamedTuple):
    """Weight blocks as ggml's vec_dot multiplies them (engine/_lanes_quant.c `decode`)."""

    q: np.ndarray  # int16 (..., 32 or 256): the integers; Q4_K's and Q5_K's times their run's
    #                six-bit scale, Q2_K's times the 4-bit scale of their 16, Q3_K's (signed, -4..3)
    #                times the six-bit scale (minus 32) of their 16, Q6_K's (unsigned) times the
    #                int8 scale of their 16; IQ4_NL's and IQ4_XS's the non-linear values
    #                kvalues_iq4nl[nibble] (IQ4_XS's scales apart, in aux); TQ2_0's and TQ1_0's the
    #                unsigned quants, value + 1; MXFP4's kvalues_mxfp4[nibble];
    #                IQ1_M's grid values times the 3-bit scale (2s + 1) of their 16; the IQ grid
    #                types' grid values with their signs (their scales in aux)
    d: np.ndarray  # float32 (...): the block's scale
    dmin: np.ndarray  # float32 (...): Q2_K's, Q4_K's and Q5_K's scale of the mins, Q4_1's and
    #                   Q5_1's m (0 for the other types)
    aux: np.ndarray  # int16 (..., 8 mins of Q4_K and Q5_K | 16 mins of Q2_K | 16 scales of Q6_K
    #                  | 8 scales (minus 32) of IQ4_XS | 256 shifts (+-1) times their scale of
    #                  IQ1_M | 8 or 16 scales 2 * ls + 1 of the IQ grid types | 0 for the others)


def decode_weights(type_: GGMLType, blocks: np.ndarray) -> Decoded:
    """Weight blocks (..., block size) uint8 of a quant_dot type, decoded (see Decoded), their
    quants unpacked as the type's dequantizer unpacks them."""
    lead = blocks.shape[:-1]
    raw = np.ascontiguousarray(blocks).reshape(-1, blocks.shape[-1])
    zeros, none = np.zeros(lead, F32), np.zeros((*lead, 0), np.int16)
    if type_ in vecdot_tq.TYPES:  # engine/_lanes_tq.c's
        q, d, aux = vecdot_tq.decode(type_, raw)
        return Decoded(q.reshape(*lead, -1), d.reshape(lead), zeros, aux.reshape(*lead, -1))
    if type_ == GGMLType.Q4_0:  # nibble - 8
        q = nibbles(raw, 2, 18, 16).astype(np.int16) - 8
    elif type_ == GGMLType.Q5_0:  # nibble + 16 * its qh bit - 16
        q = nibbles_with_qh(raw, 2, 6).astype(np.int16) - 16
    elif type_ in OFFSET_QUANTS:  # Q4_1's nibbles, Q5_1's nibble + 16 * its qh bit; m apart
        q = (nibbles(raw, 4, 20, 16) if type_ == GGMLType.Q4_1 else
             nibbles_with_qh(raw, 4, 8)).astype(np.int16)
        return Decoded(q.reshape(*lead, 32), half_at(blocks, 0), half_at(blocks, 2), none)
    elif type_ == GGMLType.Q8_0:
        q = raw[:, 2:].view(np.int8).astype(np.int16)
    elif type_ == GGMLType.IQ4_NL:
        q = nibbles(raw, 2, 18, 16, KVALUES_IQ4NL).astype(np.int16)
    elif type_ == GGMLType.Q2_K:  # each 16 times its 4-bit scale; the 4-bit mins apart
        q = np.multiply(unpack_2bit(raw[:, 16:80]).reshape(-1, 16, 16), (raw[:, :16] & 0x0F)[..., None],
                        dtype=np.int16)
        return Decoded(q.reshape(*lead, 256), half_at(blocks, 80), half_at(blocks, 82),
                       (raw[:, :16] >> 4).reshape(*lead, 16).astype(np.int16))
    elif type_ in IQ_GRIDS:  # the signed grid values, their scales apart
        q, scales = decode_iq(type_, raw)
        return Decoded(q.reshape(*lead, 256), half_at(blocks, 0), zeros,
                       scales.reshape(*lead, scales.shape[-1]))
    elif type_ == GGMLType.IQ4_XS:  # each run's scale: 4 bits of scales_l, 2 of scales_h
        q = nibbles(raw, 8, 136, 16, KVALUES_IQ4NL).astype(np.int16)
        sh = raw[:, 2].astype(np.int16) | raw[:, 3].astype(np.int16) << 8
        lo = np.stack([raw[:, 4:8] & 0x0F, raw[:, 4:8] >> 4], axis=-1).reshape(-1, 8).astype(np.int16)
        ls = (lo | ((sh[:, None] >> (2 * np.arange(8, dtype=np.int16))) & 3) << 4) - 32
        return Decoded(q.reshape(*lead, 256), half_at(blocks, 0), np.zeros(lead, F32),
                       ls.reshape(*lead, 8).astype(np.int16))
    elif type_ == GGMLType.Q3_K:  # the 2 low bits, minus 4 where the hmask bit is clear
        v = unpack_2bit(raw[:, 32:96]).astype(np.int16) + 4 * bit_fields(raw, 0, 32, 32, 1) - 4
        q = np.multiply(v.reshape(-1, 16, 16), q3_k_scales(raw[:, 96:108])[..., None], dtype=np.int16)
        return Decoded(q.reshape(*lead, 256), half_at(blocks, 108), np.zeros(lead, F32),
                       np.zeros((*lead, 0), np.int16))
    elif type_ in (GGMLType.Q4_K, GGMLType.Q5_K):  # each run of 32 times its six-bit scale
        sc, m = get_scale_min_k4(raw[:, 4:16])
        if type_ == GGMLType.Q4_K:
            u = nibbles(raw, 16, 144, 32)
        else:  # Q5_K: the nibble + 16 * bit r of qh[e] (element e of run r)
            u = nibbles(raw, 48, 176, 32) | bit_fields(raw, 16, 48, 32, 1) * np.uint8(16)
        q = np.multiply(u.reshape(-1, 8, 32), sc[..., None], dtype=np.int16)
        return Decoded(q.reshape(*lead, 256), half_at(blocks, 0), half_at(blocks, 2),
                       m.reshape(*lead, 8).astype(np.int16))
    else:  # Q6_K: the unsigned 6-bit values times the int8 scale of their 16
        q6 = nibbles(raw, 0, 128, 64) | unpack_2bit(raw[:, 128:192]) * np.uint8(16)
        sc = raw[:, 192:208].view(np.int8)
        q = np.multiply(q6.reshape(-1, 16, 16), sc[..., None], dtype=np.int16)
        return Decoded(q.reshape(*lead, 256), half_at(blocks, 208), zeros,
                       sc.reshape(*lead, 16).astype(np.int16))
    return Decoded(q.reshape(*lead, 32), half_at(blocks, 0), zeros, none)


class Activations(NamedTuple):
    """Activation blocks as ggml's vec_dot reads them."""

    d: np.ndarray  # float32 (...): the block's scale
    q: np.ndarray  # int8 (..., 32 or 256): the quants
    bsums: np.ndarray | None  # int16 (..., 16): Q8_K's sums of 16 quants (None for the others)
    s: np.ndarray | None  # float32 (...): Q8_1's s, d * the sum of its quants (None: others)


def decode_activations(type_: GGMLType, yblocks: np.ndarray) -> Activations:
    """Activation blocks (..., size) uint8 for weights of type_: Q8_0 (half d, 32 int8), Q8_1
    for Q4_1 and Q5_1 (half d, half s, 32 int8) or Q8_K for the K-quants (float d, 256 int8, 16
    int16 sums of 16)."""
    if type_ in OFFSET_QUANTS:
        return Activations(half_at(yblocks, 0), yblocks[..., 4:36].view(np.int8), None,
                           half_at(yblocks, 2))
    if type_ not in K_QUANTS:
        return Activations(half_at(yblocks, 0), yblocks[..., 2:34].view(np.int8), None, None)
    d = np.ascontiguousarray(yblocks[..., :4]).view(np.float32)[..., 0]
    bsums = np.ascontiguousarray(yblocks[..., 260:292]).view("<i2")
    return Activations(d, yblocks[..., 4:260].view(np.int8), bsums, None)


def block_lanes(type_: GGMLType, dec: Decoded, yblocks: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One block's integer lanes and scales, for decoded weight blocks and activation blocks
    (..., size) uint8 (their leading axes broadcast) -> (lanes int32 (..., 8), scale float32 (...),
    min_lanes (..., 4 or 1) or None, min_scale float32 (...) or None).

    Lane l sums the products of elements 4l..4l+3 of every run of 32 (exact integers, so their
    order is free; here as engine/_lanes_quant.c's lane_sums: s[e] = element e's products summed
    over the runs, lane l = (s[4l] + s[4l+1]) + (s[4l+2] + s[4l+3])); Q6_K's lanes less
    32 * (bsums[2l] * sc[2l] + bsums[2l+1] * sc[2l+1]). scale = y.d * x.d. Q2_K's mins: 8 lanes,
    min lane l = m[2l] * bsums[2l] + m[2l+1] * bsums[2l+1] (_mm256_madd_epi16), min_scale =
    -y.d * x.dmin, fma'd into acc itself before the block's lanes (MINS_IN_ACC). Q4_K's mins: the 16
    block sums added in pairs into int16 (_mm256_hadd_epi16, wrapping), min lane l =
    m[2l] * s[2l] + m[2l+1] * s[2l+1], min_scale = -y.d * x.dmin; Q5_K's: those 4 lanes summed
    into one integer (..., 1). Q4_1's and Q5_1's: min_lanes x.m (..., 1) float32, min_scale y.s.
    Each is accumulated acc_m = fmaf(min_lanes, min_scale, acc_m), then added as min_total.
    Q4_0's, Q5_0's, Q8_0's, IQ4_NL's, IQ4_XS's and MXFP4's (SIGNED_LANES) products are ggml's
    mul_sum_i8_pairs_float / mul_add_epi8 (IQ4_XS's then times their run's scale):
    maddubs(|q|, sign(y, q)), so a y
    of -128 against a negative q counts as +128 (the int8 negation wraps); the IQ grid types' the
    same (their grid values unsigned, the activations signed), then times their scales. TQ2_0's
    and TQ1_0's: vecdot_tq.ternary_lanes. IQ1_M's: vecdot_tq.signed_lanes of its values, and of
    its shifts as the min lanes (min_scale the same scale), added by add_mins."""
    yd, yq, bsums, ys = decode_activations(type_, yblocks)
    if type_ in vecdot_tq.TERNARY:  # TQ2_0, TQ1_0: unsigned quants, less the block sums in int16
        return vecdot_tq.ternary_lanes(dec.q, yq, bsums), yd * dec.d, None, None
    if type_ == GGMLType.IQ1_M:  # the shifts as min lanes, with the same scale
        scale = yd * dec.d
        return vecdot_tq.signed_lanes(dec.q, yq), scale, vecdot_tq.signed_lanes(dec.aux, yq), scale
    if type_ in SIGNED_LANES:  # |q| * sign(y, q): -(-128) wraps to -128 in int8
        yq = np.where((yq == -128) & (dec.q < 0), np.int16(128), yq)
    p = np.multiply(dec.q, yq, dtype=np.int32)
    if type_ == GGMLType.IQ4_XS:  # each run of 32 times its scale
        p = (p.reshape(*p.shape[:-1], 8, 32) * dec.aux[..., None]).reshape(p.shape)
    elif type_ in IQ_GRIDS:
        p = scaled_products(p, dec.aux)
    runs = p.reshape(*p.shape[:-1], -1, 32)
    e = runs[..., 0, :]
    for r in range(1, runs.shape[-2]):  # s[e]: element e's products, run after run
        e = e + runs[..., r, :]
    lane = (e[..., 0::4] + e[..., 1::4]) + (e[..., 2::4] + e[..., 3::4])
    scale = yd * dec.d
    if type_ == GGMLType.Q6_K:
        corr = bsums.astype(np.int32) * dec.aux
        lane = lane - 32 * (corr[..., 0::2] + corr[..., 1::2])
    if type_ == GGMLType.Q2_K:
        mins = bsums.astype(np.int32) * dec.aux
        return lane, scale, mins[..., 0::2] + mins[..., 1::2], -yd * dec.dmin
    if type_ in OFFSET_QUANTS:
        shape = np.broadcast_shapes(dec.dmin.shape, ys.shape)
        return lane, scale, np.broadcast_to(dec.dmin, shape)[..., None], np.broadcast_to(ys, shape)
    if type_ not in (GGMLType.Q4_K, GGMLType.Q5_K):
        return lane, scale, None, None
    s = (bsums[..., 0::2].astype(np.int32) + bsums[..., 1::2]).astype(np.int16)
    mins = dec.aux.astype(np.int32) * s
    mins = mins[..., 0::2] + mins[..., 1::2]
    if type_ == GGMLType.Q5_K:
        mins = ((mins[..., 0] + mins[..., 1]) + (mins[..., 2] + mins[..., 3]))[..., None]
    return lane, scale, mins, -yd * dec.dmin


def tail_sum(q: np.ndarray, yblocks: np.ndarray) -> np.ndarray:
    """IQ4_NL's (MXFP4's) odd last block of a row, as ggml's scalar loop sums it: the true products of its
    values q (Decoded.q, (..., 32)) and the activation quants (no sign trick), int32 (...)."""
    yq = decode_activations(GGMLType.IQ4_NL, yblocks).q
    return np.multiply(q, yq, dtype=np.int32).sum(-1, dtype=np.int32)


def paired_total(acc1: np.ndarray, acc2: np.ndarray, nb: int, scale_last: np.ndarray,
                 tail: np.ndarray | None) -> np.ndarray:
    """IQ4_NL's (MXFP4's) result: hsum_float_8(acc1 + acc2) (the even and the odd blocks' accumulators),
    then for an odd number of blocks fmaf(d, (float)sum, result) with the last block's d and
    true sum (tail_sum)."""
    r = hsum8(acc1 + acc2)
    return fmaf(scale_last, tail.astype(F32), r) if nb % 2 else r


def add_mins(type_: GGMLType, r: np.ndarray, acc_m: np.ndarray) -> np.ndarray:
    """The result hsum8(acc) r with the mins' (or offsets', or IQ1_M's shifts') accumulators
    (..., 4, 1 or 8): r + min_total, or IQ1_M's vecdot_tq.shifted_total."""
    if type_ == GGMLType.IQ1_M:
        return vecdot_tq.shifted_total(r, hsum8(acc_m))
    return r + min_total(type_, acc_m)


def min_total(type_: GGMLType, acc_m: np.ndarray) -> np.ndarray:
    """The mins' (or offsets') accumulators (..., 4 or 1) as ggml adds them to hsum_float_8(acc):
    Q4_K's 4 lanes as (m0 + m2) + (m1 + m3), the others' one float as it is."""
    if type_ == GGMLType.Q4_K:
        return (acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3])
    return acc_m[..., 0]


@twin("quant_dot")
def quant_dot(type_: int, w, ldw: int, x, ldx: int, out, n0: int, n1: int, nb: int,
              portable: int = 0, threads: int = 1, tiny: bool = False) -> None:
    """engine._lanes.quant_dot: out (n1, n0) float32 = ggml's AVX2 vec_dot (ggml_vec_dot_q4_0_q8_0,
    _q5_0_q8_0, _q8_0_q8_0, _iq4_nl_q8_0, _q4_1_q8_1, _q5_1_q8_1, _q2_K_q8_K, _q3_K_q8_K,
    _iq4_xs_q8_K, _q4_K_q8_K, _q5_K_q8_K, _q6_K_q8_K, _tq2_0_q8_K, _tq1_0_q8_K, _mxfp4_q8_0,
    _iq1_m_q8_K, _iq3_xxs_q8_K, _iq3_s_q8_K, _iq2_s_q8_K) of weight
    row i0 (nb blocks of type_ at byte i0 * ldw of w) and activation row i1 (Q8_0, Q8_1 or Q8_K
    blocks at byte i1 * ldx of x).

    A chunk of weight rows at a time: all its blocks decoded and their integer lanes summed at
    once (exact, so in any order), then block after block for every pair of rows acc[l] =
    fmaf(lanes[l], scale, acc[l]) (Q2_K's mins first into the same acc; the others' mins or
    offsets into acc_m); the result add_mins(hsum8(acc), acc_m) (the IQ grid types': iq_result of
    hsum8(acc)); IQ4_NL's and MXFP4's two accumulators (paired_total), or with `tiny` one. C
    computes the legacy types' products of two or more activation rows by tiles of weight rows
    by activation rows, each block loaded once for the tile (one activation row: row by row);
    each output is still its own sum in this order. portable (C's loop:
    0 the best the CPU has, 1 the portable one, 2 AVX2 without AVX-512) and threads change no bit
    (ignored)."""
    type_ = GGMLType(type_)
    wsize = TYPE_TRAITS[type_].type_size
    ysize = TYPE_TRAITS[TYPE_TRAITS[type_].vec_dot_type].type_size  # Q8_0 or Q8_K blocks
    weights = _rows(w, np.uint8, n0, ldw, nb * wsize).reshape(n0, nb, wsize)
    acts = _rows(x, np.uint8, n1, ldx, nb * ysize).reshape(n1, 1, nb, ysize)  # against every row
    o = np.frombuffer(out, F32).reshape(n1, n0)
    step = max(1, CHUNK // max(1, n1 * nb * TYPE_TRAITS[type_].blck_size))
    for a in range(0, n0, step):
        dec = decode_weights(type_, weights[a:a + step])  # (rows, nb, ...)
        lane, scale, min_lanes, min_scale = block_lanes(type_, dec, acts)  # (n1, rows, nb, ...)
        # block by block, lane by lane: lane l of every pair of rows lying together, so that each
        # fmaf runs over long rows of numbers (a block's scale the same for its 8 lanes)
        lane = np.ascontiguousarray(np.moveaxis(lane, (2, 3), (0, 1)), F32)  # (nb, 8, n1, rows)
        scale = np.ascontiguousarray(np.moveaxis(scale, 2, 0)[:, None])  # (nb, 1, n1, rows)
        if type_ in MINS_IN_ACC:
            min_lanes = np.ascontiguousarray(np.moveaxis(min_lanes, (2, 3), (0, 1)), F32)
            min_scale = np.ascontiguousarray(np.moveaxis(min_scale, 2, 0)[:, None])
        acc = np.zeros(lane.shape[1:], F32)
        if type_ in PAIRED_BLOCKS and not tiny:  # the even blocks into acc, the odd ones into acc2
            acc2 = acc
            for b in range(0, nb - 1, 2):
                acc, acc2 = fmaf(lane[b], scale[b], acc), fmaf(lane[b + 1], scale[b + 1], acc2)
            tail = tail_sum(dec.q[:, -1], acts[:, :, -1]) if nb % 2 else None  # (n1, rows)
            o[:, a:a + step] = paired_total(np.moveaxis(acc, 0, -1), np.moveaxis(acc2, 0, -1), nb,
                                            scale[-1, 0], tail)
            continue
        for b in range(nb):
            if type_ in MINS_IN_ACC:
                acc = fmaf(min_lanes[b], min_scale[b], acc)
            acc = fmaf(lane[b], scale[b], acc)
        acc = np.moveaxis(acc, 0, -1)  # (n1, rows, 8)
        if type_ in MINS_IN_ACC:
            min_lanes = None
        if min_lanes is not None:
            min_lanes = np.ascontiguousarray(np.moveaxis(min_lanes, (2, 3), (0, 1)), F32)
            min_scale = np.ascontiguousarray(np.moveaxis(min_scale, 2, 0)[:, None])
            acc_m = np.zeros(min_lanes.shape[1:], F32)
            for b in range(nb):
                acc_m = fmaf(min_lanes[b], min_scale[b], acc_m)
            acc_m = np.moveaxis(acc_m, 0, -1)  # (n1, rows, 4 or 1)
        r = hsum8(acc) if type_ not in IQ_GRIDS else iq_result(type_, hsum8(acc))
        if min_lanes is not None:
            r = add_mins(type_, r, acc_m)
        o[:, a:a + step] = r


def vec_dot_quant(type_: GGMLType, w: np.ndarray, x: np.ndarray, portable: bool = False,
                  threads: int = 1, tiny: bool = False) -> np.ndarray:
    """ggml's AVX2 vec_dot of every weight row with every activation row, by lanes.quant_dot (in C
    without the GIL, or the twin quant_dot): w (n0, row_bytes) raw blocks of type_ (rows may lie
    any distance apart, as in a tensor's view), x (n1, row_bytes) raw blocks of its vec_dot_type
    -> (n1, n0).

    Legacy types (ggml_vec_dot_q{4,5,8}_0_q8_0): lane L of each block of 32 sums the products of
    elements 4L..4L+3; acc = fma(x.d*y.d, lanes, acc) per block. Q4_1 and Q5_1 (_q8_1): the same
    lanes of the unsigned quants, and summs = fma(x.m, y.s, summs) per block.
    Q4_K (ggml_vec_dot_q4_K_q8_K): lane L of a super-block sums elements 4L..4L+3 of each of its
    8 runs of 32, times the runs' six-bit scales; acc = fma(y.d*x.d, lanes, acc); the mins go
    through 4 lanes, acc_m = fma(-y.d*x.dmin, sum of min*(q8 sums), acc_m), added as
    (m0 + m2) + (m1 + m3). Q5_K (ggml_vec_dot_q5_K_q8_K): as Q4_K with 5-bit quants, its mins
    one integer per super-block, summs = fma(-y.d*x.dmin, it, summs). Q2_K
    (ggml_vec_dot_q2_K_q8_K): the 2-bit quants times their 4-bit scales; per block first acc =
    fma(-y.d*x.dmin, 8 lanes of min*(q8 sums), acc), then the quants' fma into the same acc. Q3_K
    (ggml_vec_dot_q3_K_q8_K): the 3-bit quants (-4..3) times their six-bit scales, no mins.
    IQ4_NL and IQ4_XS (ggml_vec_dot_iq4_nl_q8_0, _iq4_xs_q8_K): the non-linear values by ggml's
    sign trick (a -128 activation against a negative value counts as +128), IQ4_XS's runs times
    their scales; IQ4_NL's blocks in two accumulators and an odd last one by the scalar loop;
    MXFP4 (ggml_vec_dot_mxfp4_q8_0) as IQ4_NL over its e2m1 values, its scale 2^(e - 128).
    IQ3_XXS, IQ3_S and IQ2_S (ggml_vec_dot_iq3_xxs_q8_K, ...): their signed grid values by the same
    trick, times 2 * ls + 1 of their run (IQ2_S: of their 16); hsum_float_8(acc) times 0.25f
    (IQ3_XXS), 0.125f (IQ2_S) or nothing (IQ3_S).
    Q6_K (ggml_vec_dot_q6_K_q8_K): the same lanes of sc*q (q unsigned), minus
    32*(bsums[2L]*sc[2L] + bsums[2L+1]*sc[2L+1]). TQ2_0 and TQ1_0 (ggml_vec_dot_tq2_0_q8_K,
    _tq1_0_q8_K): the unsigned quants' int16 lanes less the block sums (vecdot_tq.ternary_lanes).
    IQ1_M (ggml_vec_dot_iq1_m_q8_K): the grid values and, apart, the shifts, each times the
    3-bit scales, both accumulators by fma with the same d; hsum(acc) + hsum(shifts) / 8, fused.
    The result is hsum_float_8(acc) (+ the mins or offsets). The lane sums are exact integers, so the
    vector instructions (where the CPU has AVX2, FMA and F16C) and the portable loop
    (`portable`, and other CPUs) give the same bits (but for which payload a NaN result has when
    two NaN scales meet: the compiler's operand order). `threads`: the weight rows shared out
    between up to that many threads in C (each output is its own row's: the same bits). `tiny`:
    IQ4_NL as llamafile's tinyBLAS computes it (llama.cpp's build, 2 or more rows)."""
    out = np.empty((len(x), w.shape[0]), F32)
    quant_product(type_, w, out, portable, threads, tiny)(x)
    return out


def quant_product(type_: GGMLType, w: np.ndarray, out: np.ndarray, portable: bool = False,
                  threads: int = 1, tiny: bool = False) -> Callable[[np.ndarray], None]:
    """vec_dot_quant laid out once, ready to run on x: out (n1, n0) = each weight row of w
    (rows of raw blocks, lying as they lie when they can) with each row of x. The weights are
    read when it runs."""
    n0, row_bytes = w.shape
    nb = row_bytes // TYPE_TRAITS[type_].type_size
    fixed = byte_span(w) if _as_they_lie(w) else None
    dot = lanes.quant_dot

    def run(x: np.ndarray) -> None:
        buf, ldw = fixed if fixed is not None else byte_span(np.ascontiguousarray(w))
        x = np.ascontiguousarray(x, np.uint8)
        written(out, lambda res: dot(int(type_), buf, ldw, x, x.shape[1], res, n0, len(x), nb,
                                     portable, threads, tiny))
    return run


def bound_quant_product(type_: GGMLType, w: np.ndarray, out: np.ndarray, x: np.ndarray,
                        threads: int = 1, tiny: bool = False) -> Callable[[], None]:
    """quant_product on activation rows x that stay where they lie (a work buffer's converted
    rows): when w, x and out lie as the C loop reads them, its call with every argument bound
    once (a decoded token's products pay no Python around the loop); else quant_product's run
    on x."""
    n0, row_bytes = w.shape
    if n0 and _as_they_lie(w) and out.flags.c_contiguous and x.flags.c_contiguous \
            and x.dtype == np.uint8 and len(x):
        buf, ldw = byte_span(w)
        return partial(lanes.quant_dot, int(type_), buf, ldw, x, x.shape[1], out, n0, len(x),
                       row_bytes // TYPE_TRAITS[type_].type_size, False, threads, tiny)
    return partial(quant_product(type_, w, out, threads=threads, tiny=tiny), x)


def _as_they_lie(w: np.ndarray) -> bool:
    """Can the C loop read these weight rows where they lie (bytes packed, rows apart)?"""
    return not len(w) or (w.strides[1] == 1 and w.strides[0] >= w.shape[1])


def written(out: np.ndarray, fill: Callable[[np.ndarray], None]) -> None:
    """fill(res) writes a C loop's (n1, n0) float32 result: out itself when its rows are packed,
    else a buffer copied into it."""
    if out.flags.c_contiguous:
        fill(out)
    else:
        res = np.empty(out.shape, F32)
        fill(res)
        out[...] = res
