"""Shared pieces of the quantizers: C float semantics in numpy, and the per-type record (QuantKind,
with how ggml's vec_dot multiplies the type: VecDot and its Lanes and Mins rules).

Mirrors the small helpers at the top of ggml-quants.c (`nearest_int`, `best_index_int8`, the
absolute-max scans) and the lookup tables of ggml-common.h that more than one family uses.
Everything here works on whole arrays of blocks at once; float32 arithmetic is done in float32,
in C's order of operations, so results are bit-identical to ggml's scalar C code.
Leaves out: the grid tables of the IQ1/IQ2/IQ3 types (see `grids_iq2.py` and `grids_iq1_iq3.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.lanes import lanes, twin
from engine.core.types import GGMLType, fp16_bits_to_fp32, fp32_to_fp16_bits, traits

F32 = np.float32
QK_K = 256

# kvalues_iq4nl: the 16 non-linear levels of IQ4_NL and IQ4_XS.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# kvalues_mxfp4: the e2m1 values, doubled (so the scale is half the E8M0/UE4M3 value).
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


@dataclass(frozen=True, slots=True)
class SubScales:
    """A super-block's sub-block scales (and mins), decoded as its dequantizer decodes them."""

    scales: tuple  # one per sub-block
    mins: tuple | None = None  # K-quants with a min per sub-block


class Lanes(enum.Enum):
    """How ggml's vec_dot (AVX2 build) makes a block's 8 integer lanes from the weights' integers
    q and the activation quants y: lane l sums the products of elements 4l..4l+3 of every run of
    32 (exact integers, so in any order)."""

    PLAIN = "plain"  # q * y as they are (maddubs of unsigned quants, madd of widened ones)
    SIGNED = "signed"  # |q| * sign(y, q) (mul_sum_i8_pairs_float, mul_add_epi8): a y of -128
    #                    against a negative q counts as +128 (the int8 negation wraps)
    LESS_32 = "less 32"  # PLAIN over unsigned quants, less 32 * (bsums[2l] * aux[2l] +
    #                      bsums[2l+1] * aux[2l+1]): the -32 of Q6_K's values, by the block sums
    TERNARY = "ternary"  # unsigned quants t = value + 1 in 16 int16 lanes, less the block sums,
    #                      wrapping as int16; then lane l = h[2l] + h[2l+1] (TQ2_0, TQ1_0)


class Mins(enum.Enum):
    """What vec_dot accumulates besides the quants' lanes: the mins, offsets or shifts."""

    NONE = "none"
    OFFSETS = "offsets"  # x.m * y.s a block: summs = fmaf(x.m, y.s, summs), added to the result
    IN_ACC = "in acc"  # 8 lanes of the mins times the block sums (aux[2l] * bsums[2l] +
    #                    aux[2l+1] * bsums[2l+1]), fma'd with -y.d * x.dmin into acc itself,
    #                    before the block's own lanes
    FOUR_LANES = "four lanes"  # 4 lanes: the block sums added in pairs (int16, wrapping), lane l
    #                            = aux[2l] * s[2l] + aux[2l+1] * s[2l+1]; acc_m = fmaf(lanes,
    #                            -y.d * x.dmin, acc_m), added as (m0 + m2) + (m1 + m3)
    SUMMED = "summed"  # those 4 lanes summed into one integer, added as it is
    SHIFTS = "shifts"  # aux's lanes as SIGNED makes them, with the block's own scale into acc_m;
    #                    the result fmaf(hsum_float_8(acc_m), shift, hsum_float_8(acc))


@dataclass(frozen=True, slots=True)
class DotBlocks:
    """Weight blocks as ggml's vec_dot multiplies them (engine/c/quant.c's `decode`): one
    entry per block (n, and per block)."""

    q: np.ndarray  # int16 (n, 32 or 256): the integers, the scales vec_dot folds in folded in
    d: np.ndarray  # float32 (n): the block's scale
    dmin: np.ndarray | None = None  # float32 (n): the mins' scale (Q4_1's and Q5_1's m)
    aux: np.ndarray | None = None  # int16 (n, k): the mins, scales or shifts the type's VecDot
    #                                reads apart from q (Mins, run_scales, Lanes.LESS_32)


@dataclass(frozen=True, slots=True)
class VecDot:
    """How ggml's CPU vec_dot (AVX2 build) multiplies a row of the type with a row of its
    vec_dot_type, reproduced bit for bit by engine._lanes.quant_dot (engine/c/quant.c and the
    families it hands types to) and by its twin, kernels/vecdot.py's quant_dot."""

    decode: Callable[[np.ndarray], DotBlocks]  # blocks (n, type_size) uint8 -> DotBlocks
    lanes: Lanes
    mins: Mins = Mins.NONE
    run_scales: bool = False  # the products of run r times aux[r] (8 runs of 32, or 16 of 16)
    paired: bool = False  # the even blocks in one accumulator, the odd in a second; a row's odd
    #                       last block by ggml's scalar loop: fmaf(d, (float)sum, result)
    result: float = 1.0  # what hsum_float_8(acc) is multiplied by
    shift: float = 0.0  # Mins.SHIFTS: what the shifts' lanes are worth (IQ1M_DELTA)


@dataclass(frozen=True, slots=True)
class QuantKind:
    """Everything the engine knows about one quantized type, in one record: its block struct and
    sizes, its functions, how vec_dot multiplies it, what the block explainer says of it.

    `type` is also the id the C lanes know the type by: engine/c/types.h (its enum, block
    sizes and vec_dot partners) is written from these records (types_c.py). The sizes and the
    vec_dot partner are ggml's type traits (engine/core/types.py), which the block struct is
    checked against."""

    type: GGMLType
    dtype: np.dtype  # numpy mirror of the C block struct
    dequantize: Callable[[np.ndarray], np.ndarray] | None  # blocks (nb,) -> float32 (nb, blck)
    quantize: Callable[[np.ndarray], np.ndarray] | None  # float32 (nb, blck) -> blocks (nb,)
    quantize_ref: Callable[[np.ndarray], np.ndarray] | None = None  # from_float_ref, if different
    from_float_cpu: Callable[[np.ndarray], np.ndarray] | None = None  # CPU from_float, if different
    fields: tuple[tuple[str, str], ...] = ()  # (field, meaning) for the block explainer
    # for the block explainer: how one block's fields make its values, in words
    formula: str = ""
    # one block (a (1,) array of dtype) -> each element's integer quant, in element order
    unpack: Callable[[np.ndarray], np.ndarray] | None = None
    # one block -> its sub-block scales (and mins) as the dequantizer decodes them
    sub_scales: Callable[[np.ndarray], SubScales] | None = None
    # one block (np.void of dtype) -> its values one at a time, as dequantize_row_<t> writes
    # them: the readable reference the vectorised dequantize is tested against
    dequantize_ref: Callable[[np.void], list] | None = None
    vec_dot: VecDot | None = None  # None: no bit-exact vec_dot (products by BLAS, to rounding)
    requires_imatrix: bool = False  # ggml_quantize_requires_imatrix (the engine cannot quantize)
    # ggml's base type_traits leave these out (the CPU's intermediate types, IQ1_M)
    traits_to_float: bool = True
    traits_from_float_ref: bool = True

    def __post_init__(self) -> None:
        assert self.dtype.itemsize == traits(self.type).type_size, self.type
        assert self.vec_dot is None or traits(self.type).vec_dot_type is not None, self.type

    @property
    def blck_size(self) -> int:
        """Elements a block (ggml's type traits)."""
        return traits(self.type).blck_size

    @property
    def type_size(self) -> int:
        """Bytes a block (ggml's type traits; the block struct's size)."""
        return traits(self.type).type_size

    @property
    def vec_dot_type(self) -> GGMLType | None:
        """What mul_mat converts the activations to for this type's vec_dot (its partner)."""
        return traits(self.type).vec_dot_type

    @property
    def exact(self) -> bool:
        """Are this type's products ggml's bits on every CPU (vec_dot emulated operation by
        operation), rather than a BLAS product's?"""
        return self.vec_dot is not None


def hex_table(hexes: tuple[str, ...], dtype: str) -> np.ndarray:
    """A lookup table written as little-endian bytes in hex (the IQ grids), read-only."""
    return np.frombuffer(bytes.fromhex("".join(hexes)), dtype=dtype)


def block_dtype(*fields: tuple) -> np.dtype:
    """A packed little-endian numpy struct, field for field like ggml-common.h."""
    return np.dtype(list(fields))


# --- C float semantics ------------------------------------------------------------------------

def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=F32)


_FP16_TO_FP32 = fp16_bits_to_fp32(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))


def h2f(bits: np.ndarray) -> np.ndarray:
    """GGML_FP16_TO_FP32 over an array of fp16 bit patterns (a lookup in all 65536 of them)."""
    h = np.asarray(bits, dtype=np.uint16)
    return np.take(_FP16_TO_FP32, h.reshape(-1)).reshape(h.shape)


def f2h(x: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16 (round to nearest even) over a float32 array."""
    return fp32_to_fp16_bits(f32(x))


def nearest_int(f: np.ndarray) -> np.ndarray:
    """nearest_int: add 1.5*2^23 in float32 and read the mantissa (ties to even) -> int32."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = f32(f) + F32(12582912.0)
    return (v.view(np.int32) & 0x007FFFFF) - 0x00400000


def c_int(f: np.ndarray) -> np.ndarray:
    """A C cast float -> int (truncation toward zero; x86 gives INT_MIN when out of range)."""
    f = np.asarray(f, dtype=np.float64)
    bad = ~(np.abs(f) < 2147483648.0)
    with np.errstate(invalid="ignore"):
        out = np.trunc(np.where(bad, 0.0, f)).astype(np.int64)
    return np.where(bad, -2147483648, out)


def c_int8(f: np.ndarray) -> np.ndarray:
    """(int8_t)(float): truncate to int, keep the low byte as a signed value (int64 result)."""
    return ((c_int(f) + 128) & 0xFF) - 128


def round_away(f: np.ndarray) -> np.ndarray:
    """roundf / lroundf: round half away from zero -> int64 (exact through float64)."""
    f = np.asarray(f, dtype=np.float64)
    return (np.sign(f) * np.floor(np.abs(f) + 0.5)).astype(np.int64)


def safe_inv(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f` in float32."""
    d = f32(d)
    out = np.zeros_like(d)
    np.divide(F32(1.0), d, out=out, where=d != 0)
    return out


def seq_sum(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """`float s = 0; for (...) s += a[i];` -- a strictly left-to-right float32 sum.

    np.add.accumulate never reorders, unlike np.sum's pairwise summation. Adding +0.0 at the end
    gives C's result for an all-(-0.0) input, where C's running sum starts at +0.0.
    """
    a = f32(a)
    return np.add.accumulate(a, axis=axis, dtype=F32).take(-1, axis=axis) + F32(0.0)


def absmax_signed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` over the last axis.

    Returns (amax, max): the largest |x| and the signed x where it first occurs (0 if all zero).
    A NaN is never larger (the comparison is false), so it is passed by.
    """
    ax = np.abs(x)
    ax = np.where(ax == ax, ax, F32(0.0))  # (NaN: not chosen; numpy's argmax would choose it)
    i = np.argmax(ax, axis=-1)
    amax = np.take_along_axis(ax, i[..., None], -1)[..., 0]
    vmax = np.take_along_axis(x, i[..., None], -1)[..., 0]
    return amax, np.where(amax > 0, vmax, F32(0.0)).astype(F32)


def first_min(x: np.ndarray) -> np.ndarray:
    """`if (v < min) min = v;` over the last axis: the first element equal to the minimum."""
    m = x.min(axis=-1)
    i = np.argmax(x == m[..., None], axis=-1)
    return np.take_along_axis(x, i[..., None], -1)[..., 0]


def first_max(x: np.ndarray) -> np.ndarray:
    """`if (v > max) max = v;` over the last axis: the first element equal to the maximum."""
    m = x.max(axis=-1)
    i = np.argmax(x == m[..., None], axis=-1)
    return np.take_along_axis(x, i[..., None], -1)[..., 0]


def best_index_int8(values: np.ndarray, x: np.ndarray | np.float32) -> np.ndarray:
    """best_index_int8: index of the sorted level nearest to x; the lower one only if closer."""
    v = values.astype(F32)
    x = f32(x)
    mu = np.clip(np.searchsorted(v, x, side="right"), 1, len(v) - 1)
    lo, hi = v[mu - 1], v[mu]
    idx = np.where(x - lo < hi - x, mu - 1, mu)
    idx = np.where(x <= v[0], 0, idx)
    return np.where(x >= v[-1], len(v) - 1, idx).astype(np.int64)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """`qs[j] = q[j] | q[j + n/2] << 4` over the last axis (n -> n/2 bytes)."""
    h = q.shape[-1] // 2
    return ((q[..., :h] & 0xFF) | (q[..., h:] << 4)).astype(np.uint8)


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """Inverse of pack_nibbles: (..., n/2) bytes -> (..., n) values 0..15 (low nibbles first)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


# --- dequantizing: whole-block byte passes, then one float32 pass --------------------------------
# The dequantizers below unpack quants on all blocks' bytes at once, moving whole runs of bytes
# as single `V<n>` elements (`copy_runs`, `bit_fields`) and shifting 8 bytes at a time, and finish
# with one float32 pass, `scaled`. Elementwise numpy ops over a field view such as `b["qs"]` of
# 32-element blocks would loop over 16-byte rows one at a time; a float32 temporary the size of
# the output costs more (in fresh memory) than all the integer work.

def byte_rows(b: np.ndarray) -> np.ndarray:
    """The blocks (nb,) as their raw bytes (nb, sizeof(block)), contiguous."""
    return np.ascontiguousarray(b).view(np.uint8).reshape(len(b), b.dtype.itemsize)


def copy_runs(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src for byte arrays whose last axis is contiguous: each run along the last axis
    moves as one `V<n>` element, so numpy loops over the runs instead of over their bytes."""
    n = src.shape[-1]
    dst.view(f"V{n}")[..., 0] = src.view(f"V{n}")[..., 0]


def byte_table(table: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """table[raw] for a 256-entry int8/uint8 table and a contiguous uint8 array.

    bytearray.translate is one C loop over the bytes; numpy's gather would first widen every
    index to intp.
    """
    out = bytearray(np.ascontiguousarray(raw)).translate(table.tobytes())
    return np.frombuffer(out, table.dtype).reshape(raw.shape)


def bit_fields(raw: np.ndarray, start: int, stop: int, run: int, bits: int) -> np.ndarray:
    """The `bits`-bit quants (1, 2 or 4 bits) in bytes [start, stop) of each block (nb, size), in
    ggml's element order: each run of `run` bytes holds field 0 (the lowest bits) of its bytes,
    then field 1, ... -> (nb, (stop - start) * 8 // bits) uint8.

    Each run is repeated once per field (whole runs, as `V<run>` elements), then every 8 bytes
    are shifted right by their field's bit offset and masked, as one uint64: no per-byte loops.
    """
    nb, fields, runs = len(raw), 8 // bits, (stop - start) // run
    v = np.repeat(raw[:, start:stop].reshape(nb, runs, run).view(f"V{run}"), fields, axis=2)
    w = v.view("<u8").reshape(-1)  # (nb, runs, field, run // 8) little-endian words
    offsets = np.repeat(np.arange(0, 8, bits, dtype=np.uint64), run // 8)
    w >>= np.tile(offsets, nb * runs)
    w &= np.uint64(0x0101010101010101 * ((1 << bits) - 1))  # the field's bits of every byte
    return w.view(np.uint8).reshape(nb, fields * (stop - start))


def nibbles(raw: np.ndarray, start: int, stop: int, run: int,
            table: np.ndarray | None = None) -> np.ndarray:
    """The 4-bit quants in bytes [start, stop) of each block (nb, size), in element order.

    Each run of `run` bytes holds 2*run elements: the low nibbles first, then the high nibbles
    (C's `qs[j] & 0xf` and `qs[j] >> 4`). Returns (nb, 2*(stop - start)) uint8, or the int8
    `table[nibble]` of a 16-entry table (kvalues_iq4nl, kvalues_mxfp4).
    """
    q = bit_fields(raw, start, stop, run, 4)
    return q if table is None else byte_table(np.resize(table, 256), q)  # reads entries 0..15


def unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """2-bit quants (nb, 64) -> (nb, 256) uint8 values 0..3 in element order: byte 32c + l holds
    elements 128c + 32k + l at bits 2k (Q2_K, Q3_K and Q6_K's qh, TQ2_0)."""
    return bit_fields(np.ascontiguousarray(qs), 0, 64, 32, 2)


def scaled(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """`q*d`, one float32 scale per run: quants q (..., n) int8/uint8, d (...) -> float32 (..., n).

    The output starts as each scale repeated n times and is multiplied in place by q (cast to
    float32 on the fly): one pass, no float32 copy of q. Multiplication commutes exactly, so this
    is C's `x*d` as well as `d*x`. A min is then added in place (`y -= m[..., None]`): a second
    float32 array the size of the output would cost more in fresh memory than it saves.
    """
    y = np.repeat(f32(d).reshape(-1), q.shape[-1])
    np.multiply(y, np.ascontiguousarray(q).reshape(-1), out=y)
    return y.reshape(q.shape)


def flip_nan_signs(y: np.ndarray, q: np.ndarray, d: np.ndarray) -> None:
    """Where C writes `d * g * (neg ? -1.f : 1.f)`, the compiled code flips the sign bit, even of a
    NaN; `d * (-g)` keeps a NaN's sign. Redo that in place for the (rare) runs whose d is NaN.

    y, q (..., n): the products and the signed quants; d (...): the scales.
    """
    bad = np.isnan(d)
    if bad.any():
        yb = y[bad]
        yb.view(np.uint32)[q[bad] < 0] ^= np.uint32(0x80000000)
        y[bad] = yb


def scale_words(scales: np.ndarray) -> np.ndarray:
    """The 12 scale bytes (nb, 12) as three little-endian uint32 words (3, nb), like ggml's
    `memcpy(utmp, x[i].scales, 12)`."""
    words = np.empty((len(scales), 12), np.uint8)
    copy_runs(words, scales)
    return words.view("<u4").T


def get_scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0..7: 12 bytes (nb, 12) -> sc (nb, 8), m (nb, 8) uint8.

    Four bytes at a time, as ggml's SIMD dot products unpack them (kmask1/2/3): scales 0-3 are the
    low 6 bits of bytes 0-3, scales 4-7 the low nibbles of bytes 8-11 plus the top 2 bits of bytes
    0-3; the mins likewise from bytes 4-7 and the high nibbles of bytes 8-11.
    """
    a0, a1, a2 = scale_words(scales)
    out = np.empty((2, len(a0), 2), "<u4")  # (sc, m) x block x (j = 0..3, j = 4..7)
    out[0, :, 0] = a0 & 0x3F3F3F3F
    out[0, :, 1] = (a2 & 0x0F0F0F0F) | (((a0 >> 6) & 0x03030303) << 4)
    out[1, :, 0] = a1 & 0x3F3F3F3F
    out[1, :, 1] = ((a2 >> 4) & 0x0F0F0F0F) | (((a1 >> 6) & 0x03030303) << 4)
    sc, m = out.view(np.uint8)  # (nb, 8) each
    return sc, m


def half_at(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of each block (..., size) uint8, as float32 (GGML_FP16_TO_FP32)."""
    return h2f(blocks[..., at].astype(np.uint16) | blocks[..., at + 1].astype(np.uint16) << 8)


# --- one block, one element at a time: the readable references (QuantKind.dequantize_ref) -------

def fp16_value(bits: int) -> float:
    """GGML_FP16_TO_FP32 of one fp16 bit pattern."""
    return float(h2f(np.array([bits], np.uint16))[0])


def nibble_of(b: np.void, j: int) -> int:
    """Element j of a 32-element nibble block: the low nibble of qs[j] for j < 16, else the high
    nibble of qs[j - 16]."""
    return (int(b["qs"][j % 16]) >> (4 * (j // 16))) & 0xF


_POW3 = np.array([1, 3, 9, 27, 81, 243], np.uint16)


def _trits(qs: np.ndarray, count: int) -> np.ndarray:
    """TQ1_0's trits 0..count-1 of each byte q of qs (nb, m), minus 1: ((uint8_t)(q * 3^n) * 3)
    >> 8, the trit n of q -> (nb, count, m) int16."""
    q = (qs[:, None, :].astype(np.uint16) * _POW3[:count, None]) & 0xFF
    return ((q * 3) >> 8).astype(np.int16) - 1


def tq1_0_values(blk: np.ndarray) -> np.ndarray:
    """TQ1_0's values (trit - 1) of whole blocks (nb, 54) uint8, in element order: 32n + m from
    qs[m], 160 + 16n + m from qs[32 + m], 240 + 4n + m from qh[m] -> (nb, 256) int16."""
    return np.concatenate([_trits(blk[:, 0:32], 5).reshape(-1, 160),
                           _trits(blk[:, 32:48], 5).reshape(-1, 80),
                           _trits(blk[:, 48:52], 4).reshape(-1, 16)], axis=1)


@twin("dequantize")
def dequantize_blocks(type_: int, raw, out) -> None:
    """engine._lanes.dequantize(type, raw, out): ggml's to_float (dequantize_row_q8_0, _q4_K,
    _q5_K, _tq1_0) of the whole blocks in raw (uint8) into out (float32), every block at once.
    Each product and difference is rounded to float as in the C; nothing is fused."""
    blk = np.frombuffer(raw, np.uint8).reshape(-1, traits(type_).type_size)
    y = np.frombuffer(out, F32).reshape(len(blk), -1)
    if type_ == GGMLType.Q8_0:  # y = q * d
        y[:] = blk[:, 2:].view(np.int8).astype(F32) * half_at(blk, 0)[:, None]
    elif type_ in (GGMLType.Q4_K, GGMLType.Q5_K):  # y = (d * sc) * q - (dmin * m), per run of 32
        five = type_ == GGMLType.Q5_K
        sc, m = get_scale_min_k4(blk[:, 4:16])  # (nb, 8) each
        d1 = half_at(blk, 0)[:, None] * sc.astype(F32)
        m1 = half_at(blk, 2)[:, None] * m.astype(F32)
        qs = blk[:, 48:176] if five else blk[:, 16:144]
        runs = qs.reshape(-1, 4, 1, 32)  # run 2j: the low nibbles of qs[32j..], 2j + 1: the high
        q = np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(-1, 8, 32)
        if five:  # plus 16 times bit j of qh[e] for element e of run j
            q = q + ((blk[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) * 16
        y.reshape(-1, 8, 32)[:] = d1[..., None] * q.astype(F32) - m1[..., None]
    else:  # TQ1_0: y = (trit - 1) * d
        y[:] = tq1_0_values(blk).astype(F32) * half_at(blk, 52)[:, None]


def dequantize_by_lanes(type_: int):
    """A QuantKind dequantizer run by lanes.dequantize (engine/c/blocks.c, or its twin
    dequantize_blocks): structured blocks (nb,) -> float32 (nb, block size), the same bits as
    ggml's to_float."""

    def dequantize(b: np.ndarray) -> np.ndarray:
        out = np.empty((len(b), traits(type_).blck_size), F32)
        lanes.dequantize(int(type_), byte_rows(b), out)
        return out
    return dequantize
