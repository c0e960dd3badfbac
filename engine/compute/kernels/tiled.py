"""llama.cpp's tiled K-quant products (ggml-cpu/tiled/): MUL_MAT of K-quant and IQ weights by
a batch of activation rows, as the AVX2 build of llama.cpp's ggml computes them by default.

ggml's stock mul_mat (matmul.py) makes each output one vec_dot: the weight row and the activation
row walked block by block, eight float lanes accumulated with a fused multiply-add per block and
summed at the end. llama.cpp's ggml first asks `ggml_compute_forward_mul_mat_tiled` (ggml-cpu.c
calls it before anything else), which takes the whole node when `takes` says so: a weight type of
FORMATS, not in a CPU_REPACK buffer, and at least TILED_MIN_BATCH rows in src1's ne[1] (where,
by its authors' measure, it starts to pay: each weight block is decoded once for many rows, where
vec_dot decodes it again for every row). Then, as in a BLAS:

- the activations are quantized to Q8_K as for vec_dot (each thread a range of blocks of every
  row), and the threads take chunks of dst from a shared counter: 256 x 256 when there are enough
  of them, halved until every thread has about four (chunk_grid);
- a chunk is computed in windows: up to 256 weight rows of one 256-element block are decoded
  once into a tile (tiled_unpack_src0) and multiplied with up to 256 activation rows in 16 x 16
  microtiles, the window's floats staying in an L2-sized accumulator (its weights read once for
  all the rows; at most 16 rows read longer runs of K at a time, which changes no value);
- a weight block is decoded to one signed byte per element and an integer scale per sub-block
  of 16 or 32 (TiledBlocks), the microtile sums each block's byte products exactly in integers
  (AVX2's maddubs and madd), and only then turns to floats, once per block:

      s1  = sum over sub-blocks s of scale[s] * sum over e in s of w[e] * y.q[e]      (exact)
      res = d * (float)s1                          (with mins: fmaf(-dmin, (float)s2, res),
                                                    s2 = sum of min[s] * y.bsums over s)
      acc = fmaf(res, y.d, acc)                    block after block, from +0.0f

  where vec_dot keeps eight float lanes and reduces them last, so the two paths' last bits
  differ on every product of 8 or more rows. The microtile's tricks (the +128 the activations
  carry on the act-bias formats, taken back by the weights' sums) change no integer; IQ4_XS's
  sign trick does where an activation byte is -128 against a negative weight (counted +128 * w).

MUL_MAT_ID decides expert by expert (takes_expert: the rows routed to the expert): a tiled
expert's product is the same formula, its weight rows shared out statically in groups of 64
(expert_tiles) instead of chunks from the expert's counter.

The product runs in C (engine._lanes.tiled_mul_mat, engine/c/tiled.c); its numpy twin
tiled_mul_mat is here. The engine computes each chunk a thread takes (its values are the same
whatever the tiles, each output being its own chain); it reserves the per-thread tile slots in
the work buffer as ggml does (wdata_size) but leaves them unwritten.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.backend.repack import repacked_layout
from engine.compute.kernels.common import byte_span, chunks_taken, view4
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.vecdot_float import F32, strided_rows, written
from engine.compute.shares import Interval, ShareKind, Tile
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.tensor import Tensor
from engine.core.tensor_data import tensor_view
from engine.core.types import GGMLType, TYPE_TRAITS, ggml_row_size
from engine.lanes import lanes, twin
from engine.quants import grids_iq1_iq3, grids_iq2
from engine.quants.common import KVALUES_IQ4NL, bit_fields, get_scale_min_k4, h2f, half_at, nibbles, \
    unpack_2bit
from engine.quants.kquants import q3_k_scales

TILED_TILE_ROWS = 256  # a window's rows at most (weight rows, activation rows)
TILED_MICRO = 16  # the microtile's edge; also the smallest chunk
TILED_WS_SLOT = 512 * 1024  # each thread's workspace in the work buffer (its tiles, acc)
TILED_MIN_BATCH = 8  # ggml_tiled_min_batch: src1 rows (ne[1]) from which the tiled path pays
TILED_MMID_GROUP = 64  # MUL_MAT_ID: weight rows a thread's group (a thread takes whole groups)
Q8K = GGMLType.Q8_K
Q8K_SIZE = 292  # block_q8_K: float d, 256 int8, 16 int16 sums of 16


@dataclass(frozen=True, slots=True)
class TiledBlocks:
    """Weight blocks as tiled_unpack_src0 leaves them in its tile (n blocks)."""

    w: np.ndarray  # int8 (n, 256): the signed integers (the tile's codes less the format's BIAS)
    scales: np.ndarray  # int32 (n, 256 / subblk): one per sub-block
    d: np.ndarray  # float32 (n): the block's scale (times 0.125f or 0.25f for some IQ types)
    mins: np.ndarray | None = None  # int32 (n, 256 / subblk): HAS_MIN formats
    dmin: np.ndarray | None = None  # float32 (n)


@dataclass(frozen=True, slots=True)
class TiledFormat:
    """A weight type the tiled path takes (its tiled_matmul_dispatch<block, SUBBLK, HAS_MIN,
    BIAS, ACTBIAS> instance), and how its blocks decode."""

    subblk: int  # SUBBLK: the elements one scale covers (16 or 32)
    has_min: bool  # HAS_MIN: a min per sub-block, by the activations' block sums
    bias: int  # BIAS: what the tile's unsigned codes carry (code = w + bias)
    actbias: bool  # ACTBIAS: the AVX2 microtile biases the activations +128 (exact); False with a
    #                BIAS: the sign trick (IQ4_XS), which wraps on an activation of -128
    decode: Callable[[np.ndarray], TiledBlocks]  # raw blocks (n, type size) uint8
    grid: np.ndarray | None = None  # the table the C loop's decoder reads (the IQ grids)

    @property
    def sign_trick(self) -> bool:
        return self.bias != 0 and not self.actbias


# --- the decoders: tiled_unpack_src0, one per type ---------------------------------------------

def _sign_bits(signs: np.ndarray) -> np.ndarray:
    """Sign bytes (..., k) -> (..., 8k) bool: element 8i + j negative where bit j of byte i is set."""
    bits = np.unpackbits(signs[..., None], axis=-1, bitorder="little")
    return bits.reshape(*signs.shape[:-1], 8 * signs.shape[-1]).astype(bool)


def _signed(g: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Grid magnitudes g (n, 256) uint8, negated where neg: tiled_unpk_sign32's codes less 128."""
    return np.where(neg, -g.astype(np.int16), g.astype(np.int16)).astype(np.int8)


def _words(raw: np.ndarray, start: int, n: int, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(raw[:, start:start + n * np.dtype(dtype).itemsize]).view(dtype)


def _odd(ls: np.ndarray) -> np.ndarray:
    """The IQ types' scales 2 * ls + 1."""
    return 2 * ls.astype(np.int32) + 1


def _q45_k(raw: np.ndarray, five: bool) -> TiledBlocks:
    """Q4_K, Q5_K: 4-bit codes (Q5_K: plus 16 * bit r of qh for run r of 32), 6-bit scales and
    mins per 32 (get_scale_min_k4), d and dmin."""
    sc, m = get_scale_min_k4(raw[:, 4:16])
    w = nibbles(raw, 48, 176, 32) | bit_fields(raw, 16, 48, 32, 1) * np.uint8(16) if five \
        else nibbles(raw, 16, 144, 32)
    return TiledBlocks(w.astype(np.int8), sc.astype(np.int32), half_at(raw, 0), m.astype(np.int32),
                       half_at(raw, 2))


def _q6_k(raw: np.ndarray) -> TiledBlocks:
    """Q6_K: 4 bits of ql and 2 of qh, less 32 (BIAS 32); an int8 scale per 16."""
    q6 = nibbles(raw, 0, 128, 64) | unpack_2bit(raw[:, 128:192]) * np.uint8(16)
    return TiledBlocks((q6.astype(np.int16) - 32).astype(np.int8),
                       raw[:, 192:208].view(np.int8).astype(np.int32), half_at(raw, 208))


def _q3_k(raw: np.ndarray) -> TiledBlocks:
    """Q3_K: 2 bits of qs and the hmask bit on top, less 4 (BIAS 4); 6-bit scales less 32."""
    v = unpack_2bit(raw[:, 32:96]).astype(np.int16) + 4 * bit_fields(raw, 0, 32, 32, 1) - 4
    return TiledBlocks(v.astype(np.int8), q3_k_scales(raw[:, 96:108]).astype(np.int32),
                       half_at(raw, 108))


def _q2_k(raw: np.ndarray) -> TiledBlocks:
    """Q2_K: 2-bit codes; per 16 a byte, the scale in its low nibble, the min in its high one."""
    return TiledBlocks(unpack_2bit(raw[:, 16:80]).astype(np.int8), (raw[:, :16] & 0xF).astype(np.int32),
                       half_at(raw, 80), (raw[:, :16] >> 4).astype(np.int32), half_at(raw, 82))


def _iq4_xs(raw: np.ndarray) -> TiledBlocks:
    """IQ4_XS: kvalues_iq4nl of the nibbles; 6-bit scales (4 bits of scales_l, 2 of scales_h)
    less 32."""
    sh = _words(raw, 2, 1, "<u2")[:, :1].astype(np.int32)
    lo = np.stack([raw[:, 4:8] & 0x0F, raw[:, 4:8] >> 4], axis=-1).reshape(-1, 8).astype(np.int32)
    ls = lo | ((sh >> (2 * np.arange(8))) & 3) << 4
    return TiledBlocks(nibbles(raw, 8, 136, 16, KVALUES_IQ4NL).astype(np.int8), ls - 32, half_at(raw, 0))


def _iq2_xxs(raw: np.ndarray) -> TiledBlocks:
    """IQ2_XXS: per 32, four grid bytes (8 values each), then a word of 4 x 7 sign bits
    (ksigns_iq2xs) and a 4-bit scale; d * 0.125f."""
    q = raw[:, 2:66].reshape(-1, 8, 8)
    word = np.ascontiguousarray(q[..., 4:]).view("<u4")  # (n, 8, 1)
    g = grids_iq2.IQ2XXS_GRID[q[..., :4]].view(np.uint8).reshape(-1, 256)
    signs = grids_iq2.KSIGNS_IQ2XS[(word >> (7 * np.arange(4, dtype=np.uint32))) & 127]  # (n, 8, 4)
    return TiledBlocks(_signed(g, _sign_bits(signs.reshape(-1, 32))), _odd(word[..., 0] >> 28),
                       half_at(raw, 0) * F32(0.125))


def _iq2_xs(raw: np.ndarray) -> TiledBlocks:
    """IQ2_XS: 16-bit words (9-bit grid index, 7 sign bits); two 4-bit scales per 32; d * 0.125f."""
    qs = _words(raw, 2, 32, "<u2")
    g = grids_iq2.IQ2XS_GRID[qs & 511].view(np.uint8).reshape(-1, 256)
    signs = grids_iq2.KSIGNS_IQ2XS[qs >> 9]
    ls = np.stack([raw[:, 66:74] & 0xF, raw[:, 66:74] >> 4], axis=-1).reshape(-1, 16)
    return TiledBlocks(_signed(g, _sign_bits(signs)), _odd(ls), half_at(raw, 0) * F32(0.125))


def _iq2_s(raw: np.ndarray) -> TiledBlocks:
    """IQ2_S: per 8 a grid byte with 2 bits of qh on top (10-bit index) and a sign byte; two
    4-bit scales per 32; d * 0.125f."""
    hbits = (raw[:, 66:74, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3  # (n, ib, l)
    idx = raw[:, 2:34].reshape(-1, 8, 4).astype(np.uint16) | hbits.astype(np.uint16) << 8
    g = grids_iq2.IQ2S_GRID[idx].view(np.uint8).reshape(-1, 256)
    ls = np.stack([raw[:, 74:82] & 0xF, raw[:, 74:82] >> 4], axis=-1).reshape(-1, 16)
    return TiledBlocks(_signed(g, _sign_bits(raw[:, 34:66])), _odd(ls), half_at(raw, 0) * F32(0.125))


def _iq3_xxs(raw: np.ndarray) -> TiledBlocks:
    """IQ3_XXS: grid bytes of 4 values; per 32 a word of 4 x 7 sign bits and a 4-bit scale;
    d * 0.25f."""
    g = grids_iq1_iq3.IQ3XXS_GRID[raw[:, 2:66]].view(np.uint8).reshape(-1, 256)
    word = _words(raw, 66, 8, "<u4")  # (n, 8)
    signs = grids_iq2.KSIGNS_IQ2XS[(word[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]
    return TiledBlocks(_signed(g, _sign_bits(signs.reshape(-1, 32))), _odd(word >> 28),
                       half_at(raw, 0) * F32(0.25))


def _iq3_s(raw: np.ndarray) -> TiledBlocks:
    """IQ3_S: grid bytes of 4 values with bit j of qh[ib] on top (9-bit index), a sign bit per
    element, a 4-bit scale per 32 (two per byte); d."""
    hbit = (raw[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1  # (n, ib, j)
    idx = raw[:, 2:66].reshape(-1, 8, 8).astype(np.uint16) | hbit.astype(np.uint16) << 8
    g = grids_iq1_iq3.IQ3S_GRID[idx].view(np.uint8).reshape(-1, 256)
    ls = np.stack([raw[:, 106:110] & 0xF, raw[:, 106:110] >> 4], axis=-1).reshape(-1, 8)
    return TiledBlocks(_signed(g, _sign_bits(raw[:, 74:106])), _odd(ls), half_at(raw, 0))


_IQ1_ROWS = grids_iq1_iq3.IQ1S_GRID.view(np.int8).reshape(-1, 8).astype(np.int16)  # -1, 0, 1


def _iq1_s(raw: np.ndarray) -> TiledBlocks:
    """IQ1_S: the ternary grid (11-bit index: a qs byte, 3 bits of qh[ib]) times 8, plus the
    shift +-1 of its 32 (tiled_unpk_tern8); a 3-bit scale per 32; d * 0.125f."""
    qh = _words(raw, 34, 8, "<u2").astype(np.int32)  # (n, ib)
    idx = raw[:, 2:34].reshape(-1, 8, 4).astype(np.int32) | ((qh[..., None] >> (3 * np.arange(4))) & 7) << 8
    delta = np.where(qh & 0x8000, -1, 1)[..., None, None]  # (n, ib, 1, 1)
    w = 8 * _IQ1_ROWS[idx] + delta  # (n, ib, l, 8)
    return TiledBlocks(w.reshape(-1, 256).astype(np.int8), _odd((qh >> 12) & 7),
                       half_at(raw, 0) * F32(0.125))


def _iq1_m(raw: np.ndarray) -> TiledBlocks:
    """IQ1_M: as IQ1_S, the index's 3 high bits and the shift's sign in a nibble of qh per 8;
    3-bit scales per 16; the fp16 d spread over the scale words' top nibbles, times 0.125f."""
    s = _words(raw, 48, 4, "<u2").astype(np.int32)  # (n, 4)
    dbits = (s[:, 0] >> 12) | ((s[:, 1] >> 8) & 0xF0) | ((s[:, 2] >> 4) & 0xF00) | (s[:, 3] & 0xF000)
    nib = np.stack([raw[:, 32:48] & 0xF, raw[:, 32:48] >> 4], axis=-1).reshape(-1, 32).astype(np.int32)
    w = 8 * _IQ1_ROWS[raw[:, :32].astype(np.int32) | (nib & 7) << 8] + np.where(nib & 8, -1, 1)[..., None]
    h = np.arange(16)
    ls = (s[:, h // 4] >> (3 * (h % 4))) & 7  # half h's scale: 3 bits at 3 * (h % 4) of word h / 4
    return TiledBlocks(w.reshape(-1, 256).astype(np.int8), _odd(ls), h2f(dbits.astype(np.uint16)) * F32(0.125))


T = GGMLType
# ggml_tiled_matmul_type_dispatch's list, with each instance's constants
FORMATS: dict[GGMLType, TiledFormat] = {
    T.Q6_K: TiledFormat(16, False, 32, True, _q6_k),
    T.Q5_K: TiledFormat(32, True, 0, False, lambda raw: _q45_k(raw, True)),
    T.Q4_K: TiledFormat(32, True, 0, False, lambda raw: _q45_k(raw, False)),
    T.Q3_K: TiledFormat(16, False, 4, True, _q3_k),
    T.Q2_K: TiledFormat(16, True, 0, False, _q2_k),
    T.IQ4_XS: TiledFormat(32, False, 128, False, _iq4_xs),
    T.IQ2_XXS: TiledFormat(32, False, 128, True, _iq2_xxs, grids_iq2.IQ2XXS_GRID),
    T.IQ2_XS: TiledFormat(16, False, 128, True, _iq2_xs, grids_iq2.IQ2XS_GRID),
    T.IQ2_S: TiledFormat(16, False, 128, True, _iq2_s, grids_iq2.IQ2S_GRID),
    T.IQ3_XXS: TiledFormat(32, False, 128, True, _iq3_xxs, grids_iq1_iq3.IQ3XXS_GRID),
    T.IQ3_S: TiledFormat(32, False, 128, True, _iq3_s, grids_iq1_iq3.IQ3S_GRID),
    T.IQ1_S: TiledFormat(32, False, 128, True, _iq1_s, grids_iq1_iq3.IQ1S_GRID),
    T.IQ1_M: TiledFormat(16, False, 128, True, _iq1_m, grids_iq1_iq3.IQ1S_GRID),
}


# --- when llama.cpp takes the tiled path, and what it reserves ---------------------------------

def supported(src0: Tensor, src1: Tensor) -> bool:
    """ggml_tiled_supported (the build's switch GGML_CPU_TILED_MM on): src0's type is one of
    FORMATS and its bytes are plain (not in a CPU_REPACK buffer). Its checks of src1 come after
    the type switch has returned, so they never run: any src1 passes here."""
    return GGMLType(src0.type) in FORMATS and repacked_layout(src0) is None


def takes(src0: Tensor, src1: Tensor, use_ref: bool = False) -> bool:
    """ggml_compute_forward_mul_mat_tiled's gate: not the reference build (use_ref), supported,
    and at least TILED_MIN_BATCH rows in src1's ne[1] alone (not ne[1] * ne[2] * ne[3])."""
    return not use_ref and supported(src0, src1) and int(src1.ne[1]) >= TILED_MIN_BATCH


def takes_expert(src0: Tensor, src1: Tensor, cne1: int, use_ref: bool = False) -> bool:
    """ggml_compute_forward_mul_mat_id_tiled's gate, expert by expert: as takes', on the rows
    routed to the expert (cne1)."""
    return not use_ref and supported(src0, src1) and cne1 >= TILED_MIN_BATCH


def wdata_size(node: Tensor, n_tasks: int) -> int:
    """ggml_tiled_wdata_size: 64 bytes to align, then a TILED_WS_SLOT per task, whenever the
    weights are supported (at any batch: the plan reserves before the gate decides)."""
    return 64 + n_tasks * TILED_WS_SLOT if supported(node.source(0), node.source(1)) else 0


def chunk_grid(nr0: int, nr1: int, nth: int) -> tuple[int, int, int, int]:
    """The tiled driver's chunks of dst: (nchunk0, nchunk1, dr0, dr1). 256 x 256, halved (down
    to 16) while there are fewer than four chunks a thread."""
    size = 256
    n0, n1 = -(-nr0 // size), -(-nr1 // size)
    while n0 * n1 < nth * 4 and size > TILED_MICRO:
        size //= 2
        n0, n1 = -(-nr0 // size), -(-nr1 // size)
    return n0, n1, -(-nr0 // n0), -(-nr1 // n1)


# --- the product -------------------------------------------------------------------------------

def block_sums(fmt: TiledFormat, blk: TiledBlocks, q: np.ndarray) -> np.ndarray:
    """The microtile's s1 of one block for every pair of rows: q (n1, 256) int8 activations ->
    (n1, n0) int32, each sub-block's byte products times its scale, summed (exact)."""
    wsc = blk.w.astype(np.int64) * np.repeat(blk.scales, fmt.subblk, axis=1)  # (n0, 256)
    s1 = q.astype(np.int64) @ wsc.T
    if fmt.sign_trick:  # _mm256_sign_epi8(-128, w < 0) is -128: +128 * w where -128 * w is exact
        s1 += 256 * ((q == -128).astype(np.int64) @ (wsc * (blk.w < 0)).T)
    return s1.astype(np.int32)


@twin("tiled_mul_mat")
def tiled_mul_mat(type_: int, w, ldw: int, x, ldx: int, out, ldo: int, n0: int, n1: int, nb: int,
                  grid, portable: bool = False, threads: int = 1) -> None:
    """engine._lanes.tiled_mul_mat: out[i1 * ldo + i0] (float32) = llama.cpp's tiled product of
    weight row i0 (nb blocks of type_ at byte i0 * ldw of w) and Q8_K row i1 (at byte i1 * ldx of
    x). Block after block: each weight block decoded as the tile holds it (FORMATS' decode), the
    integer s1 (block_sums) and s2 (the mins by the block sums), then res and acc in float (see
    the module's docstring). grid: the table the C loop reads (the twin reads the same one from
    FORMATS); portable (C without the vector instructions) and threads change no bit (ignored)."""
    if not n0 or not n1:
        return
    fmt = FORMATS[GGMLType(type_)]
    wsize = TYPE_TRAITS[type_].type_size
    weights = strided_rows(w, np.uint8, n0, ldw, nb * wsize).reshape(n0, nb, wsize)
    acts = strided_rows(x, np.uint8, n1, ldx, nb * Q8K_SIZE).reshape(n1, nb, Q8K_SIZE)
    acc = np.zeros((n1, n0), F32)
    for b in range(nb):
        blk = fmt.decode(np.ascontiguousarray(weights[:, b]))
        y = np.ascontiguousarray(acts[:, b])
        d1, q, bsums = y[:, :4].view(F32)[:, 0], y[:, 4:260].view(np.int8), y[:, 260:].view("<i2")
        res = blk.d * block_sums(fmt, blk, q).astype(F32)
        if fmt.has_min:  # s2: each sub-block's min times its activations' sum (Q8_K's bsums)
            assert blk.mins is not None and blk.dmin is not None  # (has_min: decoded with the block)
            bs = bsums.astype(np.int64)
            if fmt.subblk == 32:
                bs = bs[:, 0::2] + bs[:, 1::2]
            s2 = (bs @ blk.mins.T.astype(np.int64)).astype(np.int32)
            res = fmaf(-blk.dmin, s2.astype(F32), res)
        acc = fmaf(res, d1[:, None], acc)
    o = np.lib.stride_tricks.as_strided(np.frombuffer(out, F32), (n1, n0), (4 * ldo, 4))
    o[...] = acc


def tiled_product(type_: GGMLType, w: np.ndarray, x: np.ndarray, out: np.ndarray,
                  threads: int = 1) -> None:
    """out (n1, n0) = the tiled product of weight rows w (n0, row bytes: packed rows, any
    distance apart) and Q8_K rows x (n1, row bytes, likewise); `threads`: the weight rows shared
    out between up to that many threads in C (the same bits)."""
    n0, row_bytes = w.shape
    if not n0 or not len(x):
        return
    nb = row_bytes // TYPE_TRAITS[type_].type_size
    wbuf, ldw = byte_span(w)
    xbuf, ldx = byte_span(x)
    grid = FORMATS[GGMLType(type_)].grid
    written(out, lambda res: lanes.tiled_mul_mat(int(type_), wbuf, ldw, xbuf, ldx, res, n0, n0,
                                                 len(x), nb, grid, False, threads))


# --- the node: llama.cpp's ggml_compute_forward_mul_mat_tiled_driver ---------------------------

def _broken(dst: Tensor) -> str | None:
    """The first of the driver's asserts that dst breaks (its condition), or None."""
    src0, src1 = dst.source(0), dst.source(1)
    ne, nb = [int(v) for v in dst.ne], [int(v) for v in dst.nb]
    rules = [(ne[0] == int(src0.ne[1]), "ne0 == ne01"), (ne[1] == int(src1.ne[1]), "ne1 == ne11"),
             (ne[2] == int(src1.ne[2]), "ne2 == ne12"), (ne[3] == int(src1.ne[3]), "ne3 == ne13"),
             (int(src1.nb[0]) == TYPE_TRAITS[src1.type].type_size, "nb10 == ggml_type_size(src1->type)"),
             (nb[0] == 4, "nb0 == sizeof(float)"), (nb[0] <= nb[1] <= nb[2] <= nb[3], "nb0 <= nb1 <= nb2 <= nb3"),
             (src1.type in (Q8K, GGMLType.F32), "src1->type == GGML_TYPE_F32")]
    return next((rule for ok, rule in rules if not ok), None)


def _weight_rows(src0: Tensor, i03: int, i02: int, r0: int, r1: int) -> np.ndarray:
    """Raw block bytes of src0 rows [r0, r1) of matrix (i02, i03): (rows, row bytes) uint8."""
    return tensor_view(src0, (r1 - r0, ggml_row_size(src0.type, int(src0.ne[0]))), (int(src0.nb[1]), 1),
                       np.uint8, int(src0.nb[3]) * i03 + int(src0.nb[2]) * i02 + int(src0.nb[1]) * r0,
                       "ggml_compute_forward_mul_mat_tiled")


def _q8k_rows(src1: Tensor) -> np.ndarray:
    """A Q8_K src1's rows as the driver reads them: flat row i at i * nb[1] from its data."""
    nrows = int(src1.ne[1]) * int(src1.ne[2]) * int(src1.ne[3])
    return tensor_view(src1, (nrows, ggml_row_size(Q8K, int(src1.ne[0]))), (int(src1.nb[1]), 1), np.uint8,
                       0, "ggml_compute_forward_mul_mat_tiled")


def _tile_values(dst: Tensor, x: np.ndarray, rows: Interval, cols: Interval, threads: int) -> None:
    """One chunk of dst: weight rows `rows` by the flat src1 rows `cols`, in windows that stay in
    one matrix of src1 (ne[1] rows), as the driver's one_chunk walks them."""
    src0 = dst.source(0)
    ne11, ne12 = int(dst.ne[1]), int(dst.ne[2])
    r2, r3 = ne12 // int(src0.ne[2]), int(dst.ne[3]) // int(src0.ne[3])
    d4 = view4(dst)
    i1 = cols.start
    while i1 < cols.end:
        end = min(cols.end, (i1 // ne11 + 1) * ne11)
        i13, i12, i11 = i1 // (ne12 * ne11), i1 // ne11 % ne12, i1 % ne11
        w = _weight_rows(src0, i13 // r3, i12 // r2, rows.start, rows.end)
        tiled_product(GGMLType(src0.type), w, x[i1:end], d4[i13, i12, i11:i11 + end - i1, rows.start:rows.end],
                      threads)
        i1 = end


def compute_forward_mul_mat_tiled(params, dst: Tensor, convert: Callable) -> None:
    """ggml_compute_forward_mul_mat_tiled_driver: src1 converted to Q8_K (`convert(params, src1,
    Q8_K)`: this thread's blocks of every row; mul_mat's own conversion), thread 0 sets the chunk
    counter to nth, barrier; then chunk ith, and the next free one until none is left: each
    chunk's values computed (a tile of dst) and recorded as the thread's share."""
    broken = _broken(dst)
    ggml_assert(broken is None, broken or "", "ggml_compute_forward_mul_mat_tiled_driver")
    src1 = dst.source(1)
    x = _q8k_rows(src1) if src1.type == Q8K else convert(params, src1, Q8K)
    if params.ith == 0:
        params.shared["chunk"] = itertools.count(params.nth)  # atomic under the GIL
    if not params.alone:
        params.barrier()
    nr0, nr1 = int(dst.ne[0]), int(dst.ne[1]) * int(dst.ne[2]) * int(dst.ne[3])
    nchunk0, nchunk1, dr0, dr1 = chunk_grid(nr0, nr1, params.nth)
    total = nchunk0 * nchunk1
    taken = chunks_taken(params, total)
    done = []
    for chunk in taken:
        i0, i1 = dr0 * (chunk % nchunk0), dr1 * (chunk // nchunk0)
        tile = Tile(chunk, Interval(i0, min(i0 + dr0, nr0)), Interval(i1, min(i1 + dr1, nr1)))
        _tile_values(dst, x, tile.rows, tile.cols, params.c_threads)
        done.append(tile)
    params.took(ShareKind.CHUNKS, *done, note=Note.of("mm_chunks", n0=nchunk0, n1=nchunk1, d0=dr0, d1=dr1))


def prepare_mul_mat_tiled(params, dst: Tensor, conversion: Callable):
    """The node as ready calls (a graph computed again unwatched): src1 converted into the work
    buffer (`conversion(params, src1, Q8_K)`: mul_mat's own), then one C loop per matrix of dst,
    its weight rows shared out between the compute's threads; None where the driver would
    assert (the general path raises it)."""
    if _broken(dst) is not None:
        return None
    src0, src1 = dst.source(0), dst.source(1)
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    ne11, ne12, ne13 = (int(v) for v in src1.ne[1:])
    if src1.type == Q8K:
        calls, x = [], _q8k_rows(src1)
    else:
        row_bytes = ggml_row_size(Q8K, ne00)
        calls = [conversion(params, src1, Q8K)]
        x = params.wdata[:row_bytes * ne11 * ne12 * ne13].reshape(-1, row_bytes)
    d4 = view4(dst)
    r2, r3 = ne12 // int(src0.ne[2]), ne13 // int(src0.ne[3])
    for i13 in range(ne13):
        for i12 in range(ne12):
            w = _weight_rows(src0, i13 // r3, i12 // r2, 0, ne01)
            rows = x[(i13 * ne12 + i12) * ne11:(i13 * ne12 + i12 + 1) * ne11]
            calls.append(lambda w=w, rows=rows, out=d4[i13, i12]:
                         tiled_product(GGMLType(src0.type), w, rows, out, params.cores))
    return tuple(calls)


# --- MUL_MAT_ID: one expert (ggml_compute_forward_mul_mat_id_tiled_one_expert) ------------------

def expert_product(src0: Tensor, e: int, r0: int, r1: int, x: np.ndarray) -> np.ndarray:
    """Weight rows [r0, r1) of expert e by the Q8_K rows routed to it, x (cne1, row bytes): the
    tiled product (cne1, r1 - r0), as MUL_MAT's (the same formula for every output)."""
    out = np.empty((len(x), r1 - r0), F32)
    tiled_product(GGMLType(src0.type), _weight_rows(src0, 0, e, r0, r1), np.ascontiguousarray(x), out)
    return out


def expert_tiles(e: int, ne01: int, cne1: int, ith: int, nth: int) -> list[Tile]:
    """Thread ith's part of a tiled expert: no counter; the groups of TILED_MMID_GROUP weight rows
    are split statically ([ngroups * ith / nth, ngroups * (ith + 1) / nth)), each against every
    window of up to 256 of the expert's rows."""
    ngroups = -(-ne01 // TILED_MMID_GROUP)
    g0, g1 = ngroups * ith // nth, ngroups * (ith + 1) // nth
    return [Tile(f"e{e}.g{g}", Interval(g * TILED_MMID_GROUP, min((g + 1) * TILED_MMID_GROUP, ne01)),
                 Interval(k, min(k + TILED_TILE_ROWS, cne1)))
            for k in range(0, cne1, TILED_TILE_ROWS) for g in range(g0, g1)]
