"""ggml's CPU dot products of quantized weights (AVX2 build), reproduced operation by operation:
`ggml_vec_dot_<type>_<vec_dot_type>` of every type whose record says how it multiplies
(engine/quants, QuantKind.vec_dot; EXACT_QUANT): the legacy types and IQ4_NL and MXFP4 with Q8_0
or Q8_1 activations, the K-quants, IQ4_XS, the ternary and the IQ grid types with Q8_K. The float
dot products are vecdot_float.py's.

Each output of mul_mat is one vec_dot call, and these emulate that call's arithmetic for whole
tiles at once: the same lanes, the same fused multiply-adds, the same horizontal sums. Their
results equal real ggml's bit for bit (tested), where a BLAS product of the dequantized rows only
agrees to rounding; which products mul_mat gives them is matmul.emulates_vec_dot's rule.

The loop over rows and blocks runs in C (engine._lanes.quant_dot: engine/c/quant.c, which
hands the IQ grid types to c/iq.c and TQ2_0, TQ1_0, MXFP4 and IQ1_M to c/tq.c); its
numpy twin quant_dot is here, the same bits, written for reading (and run in pure-numpy mode,
engine/lanes.py). Every decision in it is a lookup on the type's record (VecDot), in three
steps, which the debugger also shows one block at a time (engine/compute/kernel_card.py):

1. decode_weights: the type's own decoder (VecDot.decode, in its family's module beside its
   dequantizer) makes each weight block's integers q, with the scales vec_dot folds in folded in,
   its d, and apart the mins, offsets, scales or shifts (DotBlocks).
2. block_lanes: the activation blocks read as their type lays them out (ACTIVATIONS), then the
   block's 8 integer lanes by the type's Lanes rule (LANE_RULES: lane l sums the products of
   elements 4l..4l+3 of every run of 32, exact integers, so in any order), each run's products
   times its scale first where VecDot.run_scales; the mins' lanes by its Mins rule (MIN_RULES);
   scale = y.d * x.d.
3. quant_dot: block after block acc[l] = fmaf(lanes[l], scale, acc[l]), Mins.IN_ACC's lanes fma'd
   into the same acc just before, the other mins' into acc_m; a paired type's even and odd blocks
   in two accumulators and a row's odd last block by ggml's scalar loop (paired_total); the
   result hsum_float_8(acc) times VecDot.result, plus the mins' total (MinRule.total).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from engine.compute.kernels.common import byte_span
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.vecdot_float import F32, hsum8, strided_rows, written
from engine.lanes import lanes, twin
from engine.quants import QUANT_KINDS
from engine.quants.common import DotBlocks, Lanes, Mins, VecDot, half_at
from engine.core.types import GGMLType, TYPE_TRAITS

CHUNK = 1 << 21  # quant_dot's twin: about this many integer products at a time (its arrays stay
# near the CPU: several times faster than arrays of main memory)

# the quantized types whose vec_dot the engine emulates bit for bit: those whose record says how
EXACT_QUANT = frozenset(t for t, kind in QUANT_KINDS.items() if kind.exact)


def vec_dot_of(type_: int) -> VecDot:
    """The type's VecDot record; a ValueError for a type without one."""
    kind = QUANT_KINDS.get(GGMLType(type_))
    if kind is None or kind.vec_dot is None:
        raise ValueError(f"{TYPE_TRAITS[type_].type_name}: the engine has no bit-exact vec_dot "
                         "for this type")
    return kind.vec_dot


def activations_type(type_: int) -> GGMLType:
    """The vec_dot_type of a type with a VecDot: its activations' blocks (Q8_0, Q8_1 or Q8_K)."""
    vdt = TYPE_TRAITS[type_].vec_dot_type
    assert vdt is not None, type_  # (QuantKind holds a type with a VecDot to having one)
    return vdt


# --- the weights and the activations, as vec_dot reads them ------------------------------------

def decode_weights(type_: int, blocks: np.ndarray) -> DotBlocks:
    """Weight blocks (..., block size) uint8 of a quant_dot type, decoded by the type's own
    decoder (VecDot.decode: see DotBlocks), their quants unpacked as its dequantizer unpacks
    them; every array keeps the blocks' leading axes."""
    lead = blocks.shape[:-1]
    dec = vec_dot_of(type_).decode(np.ascontiguousarray(blocks).reshape(-1, blocks.shape[-1]))

    def each(a: np.ndarray) -> np.ndarray:  # (n, k) -> (..., k), (n) -> (...)
        return a.reshape(*lead, *a.shape[1:])
    return DotBlocks(each(dec.q), each(dec.d), None if dec.dmin is None else each(dec.dmin),
                     None if dec.aux is None else each(dec.aux))


@dataclass(frozen=True, slots=True)
class Activations:
    """Activation blocks as ggml's vec_dot reads them."""

    d: np.ndarray  # float32 (...): the block's scale
    q: np.ndarray  # int8 (..., 32 or 256): the quants
    bsums: np.ndarray | None = None  # int16 (..., 16): Q8_K's sums of 16 quants
    s: np.ndarray | None = None  # float32 (...): Q8_1's s, d * the sum of its quants


def _q8_0(y: np.ndarray) -> Activations:
    """block_q8_0: fp16 d, 32 int8."""
    return Activations(half_at(y, 0), y[..., 2:34].view(np.int8))


def _q8_1(y: np.ndarray) -> Activations:
    """block_q8_1: fp16 d, fp16 s, 32 int8."""
    return Activations(half_at(y, 0), y[..., 4:36].view(np.int8), s=half_at(y, 2))


def _q8_k(y: np.ndarray) -> Activations:
    """block_q8_K: float d, 256 int8, 16 int16 sums of 16."""
    d = np.ascontiguousarray(y[..., :4]).view(np.float32)[..., 0]
    return Activations(d, y[..., 4:260].view(np.int8),
                       np.ascontiguousarray(y[..., 260:292]).view("<i2"))


# the vec_dot_types (the activations' types), by how their blocks are laid out
ACTIVATIONS: dict[GGMLType, Callable[[np.ndarray], Activations]] = {
    GGMLType.Q8_0: _q8_0, GGMLType.Q8_1: _q8_1, GGMLType.Q8_K: _q8_k}


def decode_activations(vdt: GGMLType, yblocks: np.ndarray) -> Activations:
    """Activation blocks (..., size) uint8 of the vec_dot_type vdt (Q8_0, Q8_1 or Q8_K)."""
    return ACTIVATIONS[vdt](yblocks)


# --- one block's integer lanes: the Lanes rules ------------------------------------------------

def lane_sums(p: np.ndarray) -> np.ndarray:
    """Products p (..., 32 * runs) int32 -> the 8 lanes int32 (..., 8), as engine/c/quant.c's
    lane_sums adds them: s[e] = element e's products summed over the runs, lane l = (s[4l] +
    s[4l+1]) + (s[4l+2] + s[4l+3])."""
    runs = p.reshape(*p.shape[:-1], -1, 32)
    e = runs[..., 0, :]
    for r in range(1, runs.shape[-2]):  # s[e]: element e's products, run after run
        e = e + runs[..., r, :]
    return (e[..., 0::4] + e[..., 1::4]) + (e[..., 2::4] + e[..., 3::4])


def sign_trick(q: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The activation quants y as maddubs(|q|, sign(y, q)) meets q: a y of -128 against a
    negative q counts as +128 (the int8 negation wraps) -> int16."""
    return np.where((y == -128) & (q < 0), np.int16(128), y)


def products(vd: VecDot, q: np.ndarray, y: np.ndarray, aux: np.ndarray | None) -> np.ndarray:
    """The products q * y int32 (the leading axes broadcast), each run's times its scale aux[r]
    (8 runs of 32, or 16 of 16) where the type has run_scales."""
    p = np.multiply(q, y, dtype=np.int32)
    if vd.run_scales:
        assert aux is not None  # (a run_scales type's decoder sets aux)
        p = (p.reshape(*p.shape[:-1], aux.shape[-1], -1) * aux[..., None]).reshape(p.shape)
    return p


def plain_lanes(vd: VecDot, dec: DotBlocks, act: Activations) -> np.ndarray:
    return lane_sums(products(vd, dec.q, act.q, dec.aux))


def signed_lanes(vd: VecDot, dec: DotBlocks, act: Activations) -> np.ndarray:
    return lane_sums(products(vd, dec.q, sign_trick(dec.q, act.q), dec.aux))


def less_32_lanes(vd: VecDot, dec: DotBlocks, act: Activations) -> np.ndarray:
    """PLAIN's lanes less 32 * (bsums[2l] * aux[2l] + bsums[2l+1] * aux[2l+1])."""
    assert act.bsums is not None and dec.aux is not None  # (Q8_K's sums; the decoder's aux)
    corr = act.bsums.astype(np.int32) * dec.aux
    return plain_lanes(vd, dec, act) - 32 * (corr[..., 0::2] + corr[..., 1::2])


def ternary_lanes(vd: VecDot, dec: DotBlocks, act: Activations) -> np.ndarray:
    """Unsigned quants' int16 lane m = the products of bytes 2m, 2m+1 of each run of 32, less
    bsums[m], wrapped to int16 (_mm256_sub_epi16); then lane l = m[2l] + m[2l+1] in int32."""
    assert act.bsums is not None  # (Q8_K's sums)
    p = np.multiply(dec.q, act.q, dtype=np.int32)
    pairs = p.reshape(*p.shape[:-1], 8, 16, 2).sum((-3, -1), dtype=np.int32)  # (..., 16)
    h = (pairs - act.bsums).astype(np.int16)
    return h[..., 0::2].astype(np.int32) + h[..., 1::2]


# (VecDot, weights, activations) -> the block's 8 lanes, int32 (..., 8)
LANE_RULES: dict[Lanes, Callable[[VecDot, DotBlocks, Activations], np.ndarray]] = {
    Lanes.PLAIN: plain_lanes, Lanes.SIGNED: signed_lanes, Lanes.LESS_32: less_32_lanes,
    Lanes.TERNARY: ternary_lanes}


# --- the mins, offsets and shifts: the Mins rules ----------------------------------------------

def _offsets(vd: VecDot, dec: DotBlocks, act: Activations, scale: np.ndarray) -> tuple:
    assert dec.dmin is not None and act.s is not None  # (Q4_1's and Q5_1's m; Q8_1's s)
    shape = np.broadcast_shapes(dec.dmin.shape, act.s.shape)
    return np.broadcast_to(dec.dmin, shape)[..., None], np.broadcast_to(act.s, shape)


def _in_acc(vd: VecDot, dec: DotBlocks, act: Activations, scale: np.ndarray) -> tuple:
    assert act.bsums is not None and dec.aux is not None and dec.dmin is not None  # (the K-quants')
    mins = act.bsums.astype(np.int32) * dec.aux  # _mm256_madd_epi16
    return mins[..., 0::2] + mins[..., 1::2], -act.d * dec.dmin


def _four_lanes(vd: VecDot, dec: DotBlocks, act: Activations, scale: np.ndarray) -> tuple:
    assert act.bsums is not None and dec.aux is not None and dec.dmin is not None  # (the K-quants')
    s = (act.bsums[..., 0::2].astype(np.int32) + act.bsums[..., 1::2]).astype(np.int16)
    mins = dec.aux.astype(np.int32) * s  # the sums in pairs: _mm256_hadd_epi16, wrapping
    return mins[..., 0::2] + mins[..., 1::2], -act.d * dec.dmin


def _summed(vd: VecDot, dec: DotBlocks, act: Activations, scale: np.ndarray) -> tuple:
    m, min_scale = _four_lanes(vd, dec, act, scale)
    return ((m[..., 0] + m[..., 1]) + (m[..., 2] + m[..., 3]))[..., None], min_scale


def _shifts(vd: VecDot, dec: DotBlocks, act: Activations, scale: np.ndarray) -> tuple:
    assert dec.aux is not None  # (the shifts: IQ1_M's decoder sets them)
    return lane_sums(products(vd, dec.aux, sign_trick(dec.aux, act.q), None)), scale


def _plus_first(vd: VecDot, r: np.ndarray | np.float32, acc_m: np.ndarray) -> np.ndarray:
    return r + acc_m[..., 0]


def _plus_four(vd: VecDot, r: np.ndarray | np.float32, acc_m: np.ndarray) -> np.ndarray:
    return r + ((acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]))


def _shifted(vd: VecDot, r: np.ndarray | np.float32, acc_m: np.ndarray) -> np.ndarray:
    return fmaf(hsum8(acc_m), F32(vd.shift), r)  # fused by the oracle: vfmadd132ss


@dataclass(frozen=True, slots=True)
class MinRule:
    """How one Mins rule makes its lanes and adds them to the result."""

    # (VecDot, weights, activations, the block's scale) -> (min_lanes (..., k: 8, 4 or 1),
    # min_scale (...)): acc_m = fmaf(min_lanes, min_scale, acc_m) block after block
    lanes: Callable[[VecDot, DotBlocks, Activations, np.ndarray], tuple]
    # (VecDot, hsum_float_8(acc): rows' or one row's, acc_m) -> the row's result; None: the lanes
    # go into acc itself
    total: Callable[[VecDot, np.ndarray | np.float32, np.ndarray], np.ndarray] | None


MIN_RULES: dict[Mins, MinRule] = {
    Mins.OFFSETS: MinRule(_offsets, _plus_first), Mins.IN_ACC: MinRule(_in_acc, None),
    Mins.FOUR_LANES: MinRule(_four_lanes, _plus_four), Mins.SUMMED: MinRule(_summed, _plus_first),
    Mins.SHIFTS: MinRule(_shifts, _shifted)}  # Mins.NONE: none


def block_lanes(type_: int, dec: DotBlocks, yblocks: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One block's integer lanes and scales, for decoded weight blocks and activation blocks
    (..., size) uint8 (their leading axes broadcast) -> (lanes int32 (..., 8), scale float32 (...),
    min_lanes (..., k: 8, 4 or 1) or None, min_scale float32 (...) or None), by the type's
    Lanes and Mins rules. scale = y.d * x.d."""
    vd = vec_dot_of(type_)
    act = decode_activations(activations_type(type_), yblocks)
    scale = act.d * dec.d
    lane = LANE_RULES[vd.lanes](vd, dec, act)
    rule = MIN_RULES.get(vd.mins)
    if rule is None:
        return lane, scale, None, None
    min_lanes, min_scale = rule.lanes(vd, dec, act, scale)
    return lane, scale, min_lanes, min_scale


# --- a row's result ------------------------------------------------------------------------------

def tail_sum(q: np.ndarray, yblocks: np.ndarray) -> np.ndarray:
    """A paired type's (IQ4_NL's, MXFP4's) odd last block of a row, as ggml's scalar loop sums it:
    the true products of its values q (DotBlocks.q, (..., 32)) and the quants of its Q8_0
    activation blocks (no sign trick), int32 (...)."""
    yq = decode_activations(GGMLType.Q8_0, yblocks).q
    return np.multiply(q, yq, dtype=np.int32).sum(-1, dtype=np.int32)


def paired_total(acc1: np.ndarray, acc2: np.ndarray, nb: int, scale_last: np.ndarray,
                 tail: np.ndarray | None) -> np.ndarray:
    """A paired type's result: hsum_float_8(acc1 + acc2) (the even and the odd blocks'
    accumulators), then for an odd number of blocks fmaf(d, (float)sum, result) with the last
    block's d and true sum (tail_sum)."""
    r = hsum8(acc1 + acc2)
    if not nb % 2:
        return r
    assert tail is not None  # (an odd number of blocks has its tail_sum)
    return fmaf(scale_last, tail.astype(F32), r)


def row_result(type_: int, h: np.ndarray) -> np.ndarray:
    """The row's result from hsum_float_8(acc): times VecDot.result (IQ3_XXS's 0.25f, IQ2_S's
    0.125f), where it is not 1."""
    result = vec_dot_of(type_).result
    return h if result == 1 else F32(result) * h


def add_mins(type_: int, r: np.ndarray | np.float32, acc_m: np.ndarray) -> np.ndarray:
    """The result r with the mins' (or offsets', or shifts') accumulators acc_m (..., k: 8, 4 or 1),
    as the type's Mins rule adds them."""
    vd = vec_dot_of(type_)
    total = MIN_RULES[vd.mins].total
    assert total is not None  # (Mins.IN_ACC's mins went into acc: none are added here)
    return total(vd, r, acc_m)


@twin("quant_dot")
def quant_dot(type_: int, w, ldw: int, x, ldx: int, out, n0: int, n1: int, nb: int,
              portable: int = 0, threads: int = 1, tiny: bool = False) -> None:
    """engine._lanes.quant_dot: out (n1, n0) float32 = ggml's AVX2 vec_dot of weight row i0 (nb
    blocks of type_ at byte i0 * ldw of w) and activation row i1 (blocks of its vec_dot_type at
    byte i1 * ldx of x), for every type of EXACT_QUANT.

    A chunk of weight rows at a time: all its blocks decoded and their integer lanes summed at
    once (exact, so in any order), then block after block for every pair of rows acc[l] =
    fmaf(lanes[l], scale, acc[l]) (Mins.IN_ACC's mins first into the same acc; the others' mins,
    offsets or shifts into acc_m); the result add_mins(row_result(hsum8(acc)), acc_m); a paired
    type's two accumulators (paired_total), or with `tiny` (IQ4_NL as llamafile's tinyBLAS
    computes it) one. C computes the legacy types' products of two or more activation rows by
    tiles of weight rows by activation rows, each block loaded once for the tile (one
    activation row: row by row); each output is still its own sum in this order. portable (C's
    loop: 0 the best the CPU has, 1 the portable one, 2 AVX2 without AVX-512) and threads change
    no bit (ignored)."""
    type_ = GGMLType(type_)
    vd = vec_dot_of(type_)
    wsize = TYPE_TRAITS[type_].type_size
    ysize = TYPE_TRAITS[activations_type(type_)].type_size  # Q8_0, Q8_1 or Q8_K blocks
    weights = strided_rows(w, np.uint8, n0, ldw, nb * wsize).reshape(n0, nb, wsize)
    acts = strided_rows(x, np.uint8, n1, ldx, nb * ysize).reshape(n1, 1, nb, ysize)  # every row
    o = np.frombuffer(out, F32).reshape(n1, n0)
    in_acc = vd.mins is Mins.IN_ACC
    step = max(1, CHUNK // max(1, n1 * nb * TYPE_TRAITS[type_].blck_size))
    for a in range(0, n0, step):
        dec = decode_weights(type_, weights[a:a + step])  # (rows, nb, ...)
        lane, scale, min_lanes, min_scale = block_lanes(type_, dec, acts)  # (n1, rows, nb, ...)
        # block by block, lane by lane: lane l of every pair of rows lying together, so that each
        # fmaf runs over long rows of numbers (a block's scale the same for its 8 lanes)
        lane = np.ascontiguousarray(np.moveaxis(lane, (2, 3), (0, 1)), F32)  # (nb, 8, n1, rows)
        scale = np.ascontiguousarray(np.moveaxis(scale, 2, 0)[:, None])  # (nb, 1, n1, rows)
        if in_acc:
            assert min_lanes is not None and min_scale is not None  # (Mins.IN_ACC has mins)
            in_lanes = np.ascontiguousarray(np.moveaxis(min_lanes, (2, 3), (0, 1)), F32)
            in_scale = np.ascontiguousarray(np.moveaxis(min_scale, 2, 0)[:, None])
        acc = np.zeros(lane.shape[1:], F32)
        if vd.paired and not tiny:  # the even blocks into acc, the odd ones into acc2
            acc2 = acc
            for b in range(0, nb - 1, 2):
                acc, acc2 = fmaf(lane[b], scale[b], acc), fmaf(lane[b + 1], scale[b + 1], acc2)
            tail = tail_sum(dec.q[:, -1], acts[:, :, -1]) if nb % 2 else None  # (n1, rows)
            o[:, a:a + step] = paired_total(np.moveaxis(acc, 0, -1), np.moveaxis(acc2, 0, -1), nb,
                                            scale[-1, 0], tail)
            continue
        for b in range(nb):
            if in_acc:
                acc = fmaf(in_lanes[b], in_scale[b], acc)
            acc = fmaf(lane[b], scale[b], acc)
        acc = np.moveaxis(acc, 0, -1)  # (n1, rows, 8)
        if in_acc:
            min_lanes = None
        if min_lanes is not None:
            assert min_scale is not None  # (block_lanes gives both or neither)
            min_lanes = np.ascontiguousarray(np.moveaxis(min_lanes, (2, 3), (0, 1)), F32)
            min_scale = np.ascontiguousarray(np.moveaxis(min_scale, 2, 0)[:, None])
            acc_m = np.zeros(min_lanes.shape[1:], F32)
            for b in range(nb):
                acc_m = fmaf(min_lanes[b], min_scale[b], acc_m)
            acc_m = np.moveaxis(acc_m, 0, -1)  # (n1, rows, k): k 8, 4 or 1
        r = row_result(type_, hsum8(acc))
        if min_lanes is not None:
            r = add_mins(type_, r, acc_m)
        o[:, a:a + step] = r


# --- the products mul_mat runs ------------------------------------------------------------------

def vec_dot_quant(type_: int, w: np.ndarray, x: np.ndarray, portable: bool = False,
                  threads: int = 1, tiny: bool = False) -> np.ndarray:
    """ggml's AVX2 vec_dot of every weight row with every activation row, by lanes.quant_dot (in C
    without the GIL, or the twin quant_dot): w (n0, row_bytes) raw blocks of type_ (rows may lie
    any distance apart, as in a tensor's view), x (n1, row_bytes) raw blocks of its vec_dot_type
    -> (n1, n0).

    How each type multiplies is its record's VecDot (the family modules' dot_blocks_<type> say
    how its blocks unpack; Lanes and Mins how its lanes and mins are made). The lane sums are
    exact integers, so the vector instructions (where the CPU has AVX2, FMA and F16C) and the
    portable loop (`portable`, and other CPUs) give the same bits (but for which payload a NaN
    result has when two NaN scales meet: the compiler's operand order). `threads`: the weight
    rows shared out between up to that many threads in C (each output is its own row's: the
    same bits). `tiny`: IQ4_NL as llamafile's tinyBLAS computes it (llama.cpp's build, 2 or
    more rows): one accumulator for every block."""
    out = np.empty((len(x), w.shape[0]), F32)
    quant_product(type_, w, out, portable, threads, tiny)(x)
    return out


def quant_product(type_: int, w: np.ndarray, out: np.ndarray, portable: bool = False,
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


def bound_quant_product(type_: int, w: np.ndarray, out: np.ndarray, x: np.ndarray,
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
