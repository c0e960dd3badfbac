"""ggml-cpu's products of repacked 4-bit weights with Q8_0 activations (repack.cpp, the AVX2
build's arch/x86/repack.cpp): ggml_gemv_<type>_8x8_q8_0 and ggml_gemm_<type>_8x8_q8_0 for the
layouts q4_0_8x8, iq4_nl_8x8 and mxfp4_8x8 (engine/quants/repack_legacy.py), and
ggml_quantize_mat_q8_0_4x8, which quantizes the activations 4 rows at a time.

What is interleaved, and why. A plain Q4_0 row is a run of 18-byte blocks (a half d, 16 bytes of
nibbles: byte j holds element j low and j + 16 high). The CPU_REPACK buffer keeps 8 rows'
block b together: their 8 scales, then 8 bytes of row 0, 8 of row 1, ... 8 of row 7, then the
next 8 bytes of each row. One 32-byte load then holds the same 8 elements of 4 rows, and one
byte shuffle turns their nibbles into values (Q4_0's were XOR'd with 0x88 so that the shuffle's
table is simply the signed 4-bit numbers; IQ4_NL's and MXFP4's are their tables). The
activations are interleaved the same way, 4 rows by 8 bytes (block_q8_0x4: 4 halves, then 8
quants of each row in turn), so the gemm's one load of 32 bytes holds 8 elements of 4 rows.

Which rows go where (forward_mul_mat): the activation rows are quantized in place of work:
whole groups of 4 by ggml_quantize_mat_q8_0_4x8 (interleaved), the 0 to 3 rows left by the
plain quantize_row_q8_0; then every chunk of 8 weight rows (ggml's chunks, aligned to 8) takes
the first n - n % 4 activation rows by gemm and each row left by gemv. Each output is computed
by one thread alone, whatever the chunks, so the thread count changes no bit.

The accumulation order, for activation row r and weight row c (one lane of ggml's 8-float
accumulator, no horizontal sum):

    acc = 0
    for each block b of the row:   isum = the 32 products of the block (an exact int32)
                                   acc = fmaf((float)isum, d_w[c, b] * d_a[r, b], acc)
    dst[r, c] = acc

d_w is the weight block's half (MXFP4: 2^(e - 128), half its E8M0 scale, for its doubled
table), d_a the activation block's half, and their product a float32 rounded once before the
fused multiply-add. gemv and gemm differ in one place only, the products of isum: gemv forms
maddubs(|w|, sign(a, w)), so an activation quant of -128 against a negative weight counts as
-128 * |w| (the int8 negation wraps), gemm forms maddubs(|a|, sign(w, a)), always a * w.
The activation quantizer never makes -128 from finite values (amax / 127 scales them into
[-127, 127]), so the two agree but on NaN and infinite activations.

The loops run in C (engine/c/repack_q8_0.c: lanes.gemv_q4_b32_8x8, lanes.gemm_q4_b32_8x8);
their numpy twins below compute the same bits, a whole product at a time.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels.floatmath import fmaf_steps
from engine.core.types import GGMLType, fp16_bits_to_fp32
from engine.lanes import lanes, twin
from engine.quants.common import KVALUES_IQ4NL, KVALUES_MXFP4
from engine.quants.fp4 import e8m0_to_fp32_half
from engine.quants.repack import LAYOUTS, RepackLayout

F32 = np.float32
QK8_0 = 32
Q8_0_BYTES = 2 + QK8_0  # block_q8_0: the half d, 32 int8
Q8_0X4_BYTES = 4 * Q8_0_BYTES  # block_q8_0x4: 4 halves, then 4 x 32 int8 interleaved by 8
ACT_INTERLEAVE = 8  # quantize_mat_q8_0_4x8: 8 quants of each row in turn
Q4_0_VALUES = np.array([0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1], np.int8)

# the types this module multiplies: the value of each stored nibble (Q4_0's after its XOR 0x88:
# the signed 4-bit number), and how a block's 8 scales read into float32
NIBBLE_VALUES = {GGMLType.Q4_0: Q4_0_VALUES, GGMLType.IQ4_NL: KVALUES_IQ4NL,
                 GGMLType.MXFP4: KVALUES_MXFP4}


# --- the activations ---------------------------------------------------------------------------

def quantize_rows_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 (AVX2) of each float32 row (n, k) -> (n, k / 32 * 34) uint8."""
    x = np.ascontiguousarray(x, F32)
    out = np.empty((x.shape[0], x.shape[1] // QK8_0 * Q8_0_BYTES), np.uint8)
    lanes.quantize_q8_0(x.reshape(-1), out.reshape(-1))
    return out


def quantize_mat_q8_0_4x8(x: np.ndarray) -> np.ndarray:
    """ggml_quantize_mat_q8_0_4x8 of each group of 4 float32 rows (4m, k) -> (m, k / 32, 136) uint8.

    Each row's block is quantized as quantize_row_q8_0 quantizes it (the AVX2 loop is the same:
    amax, d = amax / 127, q = round-to-even(x * 127 / amax), saturated); block b of the 4 rows
    is then one block_q8_0x4: their 4 halves d, then elements 0-7 of row 0, of row 1, of row 2,
    of row 3, elements 8-15 of each, and so on (qs[32 j + 8 r + e] = row r's element 8 j + e)."""
    rows = quantize_rows_q8_0(x)
    m, nb = x.shape[0] // 4, x.shape[1] // QK8_0
    blocks = rows.reshape(m, 4, nb, Q8_0_BYTES)
    d = blocks[..., :2].transpose(0, 2, 1, 3).reshape(m, nb, 8)
    qs = blocks[..., 2:].reshape(m, 4, nb, QK8_0 // ACT_INTERLEAVE, ACT_INTERLEAVE)
    qs = qs.transpose(0, 2, 3, 1, 4).reshape(m, nb, 4 * QK8_0)
    return np.concatenate([d, qs], axis=-1)


def _activations(x, nr: int, nb: int, gemm: bool) -> tuple[np.ndarray, np.ndarray]:
    """The activation rows' quants (nr, nb, 32) int8 and halves d (nr, nb) float32: plain Q8_0
    rows (gemv), or groups of 4 interleaved rows (gemm) put back in row order."""
    raw = np.frombuffer(x, np.uint8)
    if not gemm:
        blocks = raw.reshape(nr, nb, Q8_0_BYTES)
        d = fp16_bits_to_fp32(blocks[..., :2].copy().view(np.uint16)[..., 0])
        return blocks[..., 2:].view(np.int8), d
    blocks = raw.reshape(nr // 4, nb, Q8_0X4_BYTES)
    d = fp16_bits_to_fp32(blocks[..., :8].copy().view(np.uint16))  # (m, nb, 4 rows)
    qs = blocks[..., 8:].view(np.int8).reshape(nr // 4, nb, 4, 4, ACT_INTERLEAVE)  # (run, row, e)
    qs = qs.transpose(0, 3, 1, 2, 4).reshape(nr, nb, QK8_0)
    return qs, d.transpose(0, 2, 1).reshape(nr, nb)


# --- the weights -------------------------------------------------------------------------------

def _weights(type_: GGMLType, w, nb: int, nc: int) -> tuple[np.ndarray, np.ndarray]:
    """The repacked weights as values (nc, nb, 32) int8 and scales (nc, nb) float32: the layout's
    unpack gives back the plain blocks (Q4_0's XOR undone, so its values are nibble - 8)."""
    plain = LAYOUTS[type_].unpack(np.frombuffer(w, np.uint8).reshape(nc, -1))
    blocks = plain.reshape(nc, nb, -1)
    nibbles = np.concatenate([blocks[..., -16:] & 0x0F, blocks[..., -16:] >> 4], axis=-1)
    if type_ == GGMLType.MXFP4:
        return KVALUES_MXFP4[nibbles], e8m0_to_fp32_half(blocks[..., 0])
    scales = fp16_bits_to_fp32(blocks[..., :2].copy().view(np.uint16)[..., 0])
    if type_ == GGMLType.Q4_0:
        return nibbles.astype(np.int8) - np.int8(8), scales
    return KVALUES_IQ4NL[nibbles], scales


# --- gemv and gemm: the twins of the C loops ---------------------------------------------------

def _product(type_: int, w, x, out, n: int, nr: int, nc: int, gemm: bool) -> None:
    """out (nr, nc) = the fmaf chains of the module docstring, every (row, column) at once."""
    type_ = GGMLType(type_)
    nb = n // QK8_0
    q, dw = _weights(type_, w, nb, nc)
    a, da = _activations(x, nr, nb, gemm)
    wq = q.transpose(1, 2, 0).astype(np.float64)  # (nb, 32, nc): exact in doubles
    aq = a.transpose(1, 0, 2).astype(np.float64)  # (nb, nr, 32)
    if gemm:
        isum = aq @ wq  # the true products
    else:  # an activation of -128 times a weight w counts as -128 * |w|
        wrapped = aq == -128
        isum = np.where(wrapped, 0, aq) @ wq + np.where(wrapped, -128, 0) @ np.abs(wq)
    scale = dw.T[:, None, :] * da.T[:, :, None]  # (nb, nr, nc): d_w * d_a, rounded to float32
    acc = fmaf_steps(isum.astype(F32), scale, np.zeros((nr, nc), F32))
    np.frombuffer(out, F32).reshape(nr, nc)[:] = acc


@twin("gemv_q4_b32_8x8")
def gemv_q4_b32_8x8(type_: int, w, x, out, n: int, nr: int, nc: int, portable: int = 0,
                    threads: int = 1) -> None:
    """engine._lanes.gemv_q4_b32_8x8: ggml_gemv_<type>_8x8_q8_0 of nc repacked weight rows (w:
    q4_0_8x8, iq4_nl_8x8 or mxfp4_8x8 bytes) and nr plain Q8_0 rows of n elements (x) into out
    (nr, nc) float32. portable and threads change no bit (ignored)."""
    _product(type_, w, x, out, n, nr, nc, gemm=False)


@twin("gemm_q4_b32_8x8")
def gemm_q4_b32_8x8(type_: int, w, x, out, n: int, nr: int, nc: int, portable: int = 0,
                    threads: int = 1) -> None:
    """engine._lanes.gemm_q4_b32_8x8: ggml_gemm_<type>_8x8_q8_0, as gemv_q4_b32_8x8 but x holds
    nr / 4 groups of block_q8_0x4 rows (quantize_mat_q8_0_4x8)."""
    _product(type_, w, x, out, n, nr, nc, gemm=True)


# --- the product forward_mul_mat computes --------------------------------------------------------

def _check(layout: RepackLayout, packed: np.ndarray, ne00: int, ne01: int) -> None:
    assert layout.type in NIBBLE_VALUES and layout.interleave == 8 and layout.rows == 8, \
        f"{layout.name}: not a layout of this module"
    assert ne00 % QK8_0 == 0 and ne01 % layout.rows == 0, f"{layout.name}: {ne00} x {ne01}"
    assert packed.dtype == np.uint8 and packed.flags.c_contiguous, "packed: contiguous bytes"


def gemv(layout: RepackLayout, packed: np.ndarray, ne00: int, ne01: int, xq: np.ndarray,
         out: np.ndarray, threads: int = 1) -> None:
    """ggml_gemv_<type>_8x8_q8_0: out (nr, ne01) float32 of the weight and plain Q8_0 rows xq
    (nr, ne00 / 32 * 34) uint8, computed in C (or the twin)."""
    _check(layout, packed, ne00, ne01)
    lanes.gemv_q4_b32_8x8(int(layout.type), packed.reshape(-1),
                          np.ascontiguousarray(xq).reshape(-1), out.reshape(-1), ne00, len(out),
                          ne01, 0, threads)


def gemm(layout: RepackLayout, packed: np.ndarray, ne00: int, ne01: int, xq: np.ndarray,
         out: np.ndarray, threads: int = 1) -> None:
    """ggml_gemm_<type>_8x8_q8_0: out (nr, ne01) float32 (nr a multiple of 4) of the weight and
    the block_q8_0x4 rows xq (quantize_mat_q8_0_4x8's), computed in C (or the twin)."""
    _check(layout, packed, ne00, ne01)
    lanes.gemm_q4_b32_8x8(int(layout.type), packed.reshape(-1),
                          np.ascontiguousarray(xq).reshape(-1), out.reshape(-1), ne00, len(out),
                          ne01, 0, threads)


def product(layout: RepackLayout, packed: np.ndarray, ne00: int, ne01: int, x: np.ndarray,
            out: np.ndarray, threads: int = 1) -> None:
    """One plane of the repacked mul_mat (tensor_traits::forward_mul_mat): out (n, ne01) float32,
    written in place, = the weight (ne01 rows of ne00 elements, `packed` in the layout's bytes)
    times each float32 activation row of x (n, ne00), exactly as ggml's AVX2 build computes it.

    The first n - n % 4 rows are quantized 4 at a time by quantize_mat_q8_0_4x8 into interleaved
    block_q8_0x4 blocks and multiplied by gemm; the n % 4 rows left are quantized by
    quantize_row_q8_0 and multiplied one by one by gemv. Both read the weights' interleaved
    blocks (8 rows' scales, then 8 quant bytes of each row in turn) and compute each output as
    one chain, block by block: acc = fmaf((float)isum, d_w * d_a, acc), isum the block's 32
    exact integer products (the module docstring says where gemv's and gemm's differ). Each
    output belongs to one chain alone, so `threads` (the column groups shared out in C) and
    ggml's own thread count change no bit."""
    n = x.shape[0]
    n4 = n - n % 4
    assert out.shape == (n, ne01) and out.dtype == F32 and out.flags.c_contiguous, "out (n, ne01)"
    if n4:
        gemm(layout, packed, ne00, ne01, quantize_mat_q8_0_4x8(x[:n4]), out[:n4], threads)
    if n > n4:
        gemv(layout, packed, ne00, ne01, quantize_rows_q8_0(x[n4:]), out[n4:], threads)
