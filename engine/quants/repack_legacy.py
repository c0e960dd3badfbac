"""The 8-row interleaved layouts of the 32-element 4-bit types (repack.cpp): q4_0_8x8, iq4_nl_8x8
and mxfp4_8x8, as ggml-cpu's CPU_REPACK buffer writes them (set_tensor: repack<block, 8, 8>).

A weight whose rows come in whole groups of 8 (ne[1] % 8 == 0) is rewritten group by group: for
rows 8g .. 8g+7 and block column b, the 8 blocks b of those rows become one wider block
(block_q4_0x8, block_iq4_nlx8, block_mxfp4x8):

    the 8 rows' scales first      d[0..7] (8 halves, 16 bytes), or MXFP4's e[0..7] (8 bytes)
    then their 8 x 16 quant bytes interleaved 8 bytes at a time (INTER_SIZE = 8):
        qs[  0 ..  63]  row 0's bytes 0-7, row 1's bytes 0-7, ..., row 7's bytes 0-7
        qs[ 64 .. 127]  row 0's bytes 8-15, ...,                   row 7's bytes 8-15

Byte j of a row's 16 still holds element j in its low nibble and element j + 16 in its high one,
so 32 consecutive bytes hold the same 8 elements of 4 rows: one AVX2 load feeds 4 rows at once.
The blocks of a group follow each other (b = 0 .. nb-1), then the next group: the buffer is as
long as the plain tensor. Q4_0 alone changes its nibbles too: make_block_q4_0x8 XORs every quant
byte with 0x88, which turns each nibble q (the value q - 8) into q ^ 8, the same value as a
signed 4-bit number (two's complement), so the product can sign-extend it by a table lookup
instead of subtracting 8. IQ4_NL's and MXFP4's nibbles are table indices already and stay as
they are.
"""

from __future__ import annotations

import numpy as np

from engine.core.types import TYPE_TRAITS, GGMLType
from engine.quants.repack import RepackLayout, register

ROWS = 8  # NB_COLS: rows interleaved into one block
INTERLEAVE = 8  # INTER_SIZE: bytes of quants taken from one row at a time
QS_BYTES = 16  # a block's quant bytes (32 nibbles)
Q4_0_XOR = 0x88  # make_block_q4_0x8's xor_mask, byte by byte: q - 8 as a signed nibble


def _blocks_by_group(rows: np.ndarray, type_: GGMLType) -> np.ndarray:
    """Plain rows (nrows, row_bytes) -> (groups, 8, nb, block bytes), checked as repack checks."""
    rows = np.ascontiguousarray(rows, np.uint8)
    size = TYPE_TRAITS[type_].type_size
    assert rows.ndim == 2 and rows.shape[1] % size == 0, "rows of whole blocks"
    assert rows.shape[0] % ROWS == 0, f"ne[1] % {ROWS} == 0 (repack_*_to_*_8_bl)"
    return rows.reshape(rows.shape[0] // ROWS, ROWS, rows.shape[1] // size, size)


def _pack(rows: np.ndarray, type_: GGMLType, scale_bytes: int, xor: int) -> np.ndarray:
    """make_block_*x8 for every group and block column: the 8 scales, then the quants 8 bytes
    of each row in turn (XOR'd with xor) -> the buffer's bytes, flat."""
    blocks = _blocks_by_group(rows, type_)
    groups, _, nb, _ = blocks.shape
    by_column = blocks.transpose(0, 2, 1, 3)  # (groups, nb, 8 rows, block bytes)
    scales = by_column[..., :scale_bytes].reshape(groups, nb, ROWS * scale_bytes)
    qs = by_column[..., scale_bytes:].reshape(groups, nb, ROWS, QS_BYTES // INTERLEAVE, INTERLEAVE)
    qs = qs.transpose(0, 1, 3, 2, 4).reshape(groups, nb, ROWS * QS_BYTES) ^ np.uint8(xor)
    return np.concatenate([scales, qs], axis=-1).reshape(-1)


def _into(out: np.ndarray | None, packed: np.ndarray) -> np.ndarray:
    """The packed bytes, copied into out when there is one."""
    if out is None:
        return packed
    out.reshape(-1)[:] = packed
    return out


def _unpack(packed: np.ndarray, nrows: int, type_: GGMLType, scale_bytes: int,
            xor: int) -> np.ndarray:
    """The inverse of _pack: the buffer's bytes -> plain rows (nrows, row_bytes)."""
    size = TYPE_TRAITS[type_].type_size
    packed = np.asarray(packed, np.uint8).reshape(nrows // ROWS, -1, ROWS * size)
    groups, nb, _ = packed.shape
    scales = packed[..., :ROWS * scale_bytes].reshape(groups, nb, ROWS, scale_bytes)
    qs = (packed[..., ROWS * scale_bytes:] ^ np.uint8(xor)).reshape(
        groups, nb, QS_BYTES // INTERLEAVE, ROWS, INTERLEAVE).transpose(0, 1, 3, 2, 4)
    blocks = np.concatenate([scales, qs.reshape(groups, nb, ROWS, QS_BYTES)], axis=-1)
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3)).reshape(nrows, nb * size)


def _layout(name: str, type_: GGMLType, scale_bytes: int, xor: int = 0) -> RepackLayout:
    size = TYPE_TRAITS[type_].type_size
    assert size == scale_bytes + QS_BYTES

    def unpack(packed: np.ndarray) -> np.ndarray:
        """The buffer's bytes seen as the tensor's rows (nrows, row_bytes) -> the plain rows."""
        packed = np.asarray(packed, np.uint8)
        if packed.ndim != 2:
            raise ValueError(f"{name}: unpack takes the bytes as (nrows, row_bytes), not "
                             f"{packed.shape}")
        return _unpack(packed, packed.shape[0], type_, scale_bytes, xor)

    return register(RepackLayout(
        name=name, type=type_, rows=ROWS, interleave=INTERLEAVE, vec_dot_type=GGMLType.Q8_0,
        pack=lambda rows, out=None: _into(out, _pack(rows, type_, scale_bytes, xor)), unpack=unpack))


# block_q4_0x8: d[8] (halves), qs[128] XOR 0x88
Q4_0_8X8 = _layout("q4_0_8x8", GGMLType.Q4_0, scale_bytes=2, xor=Q4_0_XOR)
# block_iq4_nlx8: d[8] (halves), qs[128]
IQ4_NL_8X8 = _layout("iq4_nl_8x8", GGMLType.IQ4_NL, scale_bytes=2)
# block_mxfp4x8: e[8] (E8M0 exponents), qs[128]
MXFP4_8X8 = _layout("mxfp4_8x8", GGMLType.MXFP4, scale_bytes=1)
