"""ggml-cpu's repacked Q4_K: the q4_K_8x8 layout of the CPU_REPACK buffer (repack.cpp's
repack_q4_K_to_q4_K_8_bl and make_block_q4_Kx8; the structs are repack.h's).

A Q4_K weight whose rows come in groups of 8 (ne[1] % 8 == 0) is rewritten, 8 rows at a time,
into one block_q4_Kx8 per column of blocks: block b of rows 8g .. 8g + 7 become block (g, b) of
the buffer. Inside it (1152 bytes, the 8 blocks' 8 x 144):

    d[8], dmin[8]   the 8 rows' fp16 super-block scales, row by row
    scales[96]      12 bytes per sub-block j = 0..7: the 8 rows' six-bit scale and min of that
                    sub-block, packed exactly as one Q4_K block packs its 8 sub-blocks' (rows in
                    place of sub-blocks: get_scale_min_k4(scales[12 j:], r) is row r's)
    qs[1024]        the rows' quant bytes 8 at a time: bytes 8i .. 8i + 7 of row 0, of row 1, ...
                    of row 7, then bytes 8(i + 1) .. of row 0, ... (16 rounds of 8 x 8 bytes)

So the gemv and gemm (engine/compute/kernels/repack_q8_k.py) load 8 rows' quants of one run of
32 elements with a few contiguous loads, and one sub-block's 8 scales and 8 mins together. The
rewrite loses nothing: `unpack` gives the plain rows back, byte for byte, for any bytes.
"""

from __future__ import annotations

import os

import numpy as np


from engine.core.types import GGMLType
from engine.lanes import lanes, twin
from engine.quants.common import block_dtype, get_scale_min_k4
from engine.quants.kquants import BLOCK_Q4_K
from engine.quants.repack import RepackLayout, register

ROWS = 8  # NB_COLS: the rows interleaved into one block
INTERLEAVE = 8  # INTER_SIZE: quant bytes taken from one row at a time

# block_q4_Kx8 (repack.h)
BLOCK_Q4_KX8 = block_dtype(("d", "<u2", ROWS), ("dmin", "<u2", ROWS), ("scales", "u1", 12 * ROWS),
                           ("qs", "u1", 128 * ROWS))
assert BLOCK_Q4_KX8.itemsize == ROWS * BLOCK_Q4_K.itemsize == 2 * 8 + 2 * 8 + 96 + 1024

# block_q8_Kx4 (repack.h): 4 activation rows' Q8_K blocks, as ggml_quantize_mat_q8_K_4x8 lays
# them out (engine/compute/kernels/repack_q8_k.py)
BLOCK_Q8_KX4 = block_dtype(("d", "<f4", 4), ("qs", "i1", 4 * 256), ("bsums", "<i2", 4 * 16))
assert BLOCK_Q8_KX4.itemsize == 4 * 4 + 4 * 256 + 4 * 16 * 2


def scale_min_bytes(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The inverse of get_scale_min_k4: 8 six-bit scales and mins (..., 8) -> 12 bytes (..., 12).
    Bytes 0-3: scales 0-3 and the top 2 bits of scales 4-7; bytes 4-7 the same of the mins;
    bytes 8-11: the low nibbles of scales 4-7 and (high nibble) of mins 4-7."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    out = np.empty((*sc.shape[:-1], 12), np.uint8)
    out[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    return out


def _swap_scales(scales: np.ndarray) -> np.ndarray:
    """(..., 8, 12) scale bytes of 8 things by 8 others -> the same values with the two sets of
    8 swapped (rows' sub-blocks <-> sub-blocks' rows); the same function both ways."""
    shape = scales.shape
    sc, m = get_scale_min_k4(scales.reshape(-1, 12))
    sc, m = (v.reshape(*shape[:-1], 8).swapaxes(-1, -2) for v in (sc, m))
    return scale_min_bytes(sc, m)


PACK_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
# (a model's weights repack on every core the process may use, as they load)


def pack_q4_k_8x8(rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """repack_q4_K_to_q4_K_8_bl: plain Q4_K rows (nrows, row_bytes) uint8 -> the buffer's bytes
    in the same shape (the same size: each group of 8 rows becomes a row of block_q4_Kx8 over
    those 8 rows' bytes), written into `out` (as many contiguous bytes) when given. In C
    (engine._lanes.pack_q4_k_8x8: a model's weights repack as they load, straight into their
    buffer), the same bytes as its twin below."""
    rows = np.ascontiguousarray(rows, np.uint8)
    assert rows.ndim == 2 and rows.shape[0] % ROWS == 0 and rows.shape[1] % BLOCK_Q4_K.itemsize == 0
    out = np.empty_like(rows) if out is None else out.reshape(rows.shape)
    lanes.pack_q4_k_8x8(rows.reshape(-1), out.reshape(-1), rows.shape[0], rows.shape[1], PACK_THREADS)
    return out


@twin("pack_q4_k_8x8")
def pack_q4_k_8x8_rows(src, dst, nrows: int, row_bytes: int, threads: int = 1) -> None:
    """engine._lanes.pack_q4_k_8x8: the repacked bytes of nrows plain Q4_K rows (src) into dst
    (each group of 8 rows on its own: the threads change nothing)."""
    rows = np.frombuffer(src, np.uint8, nrows * row_bytes).reshape(nrows, row_bytes)
    src_b = rows.view(BLOCK_Q4_K).reshape(nrows // ROWS, ROWS, -1).swapaxes(1, 2)  # (g, b, r)
    out = np.frombuffer(dst, np.uint8, nrows * row_bytes).view(BLOCK_Q4_KX8).reshape(src_b.shape[:2])
    out["d"], out["dmin"] = src_b["d"], src_b["dmin"]
    out["scales"] = _swap_scales(src_b["scales"]).reshape(*src_b.shape[:2], 96)
    # qs: (g, b, r, round, 8 bytes) -> (g, b, round, r, 8 bytes)
    out["qs"] = src_b["qs"].reshape(*src_b.shape, 16, INTERLEAVE).swapaxes(2, 3).reshape(
        *src_b.shape[:2], 1024)


def unpack_q4_k_8x8(packed: np.ndarray) -> np.ndarray:
    """The inverse: the buffer's bytes in the weight's shape (nrows, row_bytes) -> its plain Q4_K
    rows (nrows, row_bytes) uint8."""
    packed = np.ascontiguousarray(packed, np.uint8)
    nrows = packed.shape[0]
    assert packed.ndim == 2 and nrows % ROWS == 0
    blocks = packed.reshape(nrows // ROWS, -1).view(BLOCK_Q4_KX8)  # (g, b)
    out = np.empty((*blocks.shape, ROWS), BLOCK_Q4_K)  # (g, b, r)
    out["d"], out["dmin"] = blocks["d"], blocks["dmin"]
    out["scales"] = _swap_scales(blocks["scales"].reshape(*blocks.shape, 8, 12))
    # qs: (g, b, round, r, 8 bytes) -> (g, b, r, round, 8 bytes)
    out["qs"] = blocks["qs"].reshape(*blocks.shape, 16, ROWS, INTERLEAVE).swapaxes(2, 3).reshape(
        *blocks.shape, ROWS, 128)
    return np.ascontiguousarray(out.swapaxes(1, 2)).reshape(nrows, -1).view(np.uint8)


Q4_K_8X8 = register(RepackLayout("q4_K_8x8", GGMLType.Q4_K, ROWS, INTERLEAVE, GGMLType.Q8_K,
                                 pack_q4_k_8x8, unpack_q4_k_8x8))
