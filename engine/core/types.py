"""ggml's type system: `enum ggml_type`, its traits table, and fp16/bf16 conversion.

Mirrors `type_traits[]` in ggml.c and the CPU's `vec_dot_type` from ggml-cpu.c, at the oracle's
version (ggml 0.15.3 as vendored by ggml-python 0.0.45: 42 types, NVFP4 = 40 and Q1_0 = 41). The
removed slots (4, 5, 31-33, 36-38) stay in the table as ggml keeps them: block size 0, type size 0.

fp16 and bf16 conversion round to nearest even exactly as ggml's scalar converters do, with ggml's
NaN rules (fp16: every NaN becomes 0x7E00 with its sign; bf16: NaNs are truncated and made quiet).
Leaves out: the CPU's per-type function pointers, which live with the quantizers and kernels.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from engine.core.api import query

CFloat = float | np.float32  # a C `float` argument: a Python float or a numpy float32


class GGMLType(enum.IntEnum):
    """enum ggml_type, with the oracle's numbering."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q4_2 = 4  # removed
    Q4_3 = 5  # removed
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    Q4_0_4_4 = 31  # removed
    Q4_0_4_8 = 32  # removed
    Q4_0_8_8 = 33  # removed
    TQ1_0 = 34
    TQ2_0 = 35
    IQ4_NL_4_4 = 36  # removed
    IQ4_NL_4_8 = 37  # removed
    IQ4_NL_8_8 = 38  # removed
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


GGML_TYPE_COUNT = 42
QK_K = 256  # elements in a K-quant super-block
K_SCALE_SIZE = 12


@dataclass(frozen=True, slots=True)
class TypeTraitsRow:
    """One row of ggml's `type_traits[]` (plus the CPU's vec_dot_type)."""

    type: GGMLType
    type_name: str  # what ggml_type_name returns
    blck_size: int  # elements per block (1 for plain types, 0 for removed slots)
    type_size: int  # bytes per block
    is_quantized: bool
    vec_dot_type: GGMLType | None  # what mul_mat converts src1 to; None: no CPU vec_dot

    @property
    def removed(self) -> bool:
        return self.blck_size == 0


T = GGMLType
_REMOVED_Q4_0 = "TYPE_{} REMOVED, use Q4_0 with runtime repacking"
_REMOVED_IQ4_NL = "TYPE_{} REMOVED, use IQ4_NL with runtime repacking"

# (type, name, blck_size, type_size as the sum of the block's fields, quantized, vec_dot_type)
_TABLE: list[tuple[GGMLType, str, int, int, bool, GGMLType | None]] = [
    (T.F32, "f32", 1, 4, False, T.F32),
    (T.F16, "f16", 1, 2, False, T.F16),
    (T.Q4_0, "q4_0", 32, 2 + 16, True, T.Q8_0),
    (T.Q4_1, "q4_1", 32, 2 + 2 + 16, True, T.Q8_1),
    (T.Q4_2, "DEPRECATED", 0, 0, False, None),
    (T.Q4_3, "DEPRECATED", 0, 0, False, None),
    (T.Q5_0, "q5_0", 32, 2 + 4 + 16, True, T.Q8_0),
    (T.Q5_1, "q5_1", 32, 2 + 2 + 4 + 16, True, T.Q8_1),
    (T.Q8_0, "q8_0", 32, 2 + 32, True, T.Q8_0),
    (T.Q8_1, "q8_1", 32, 2 + 2 + 32, True, T.Q8_1),
    (T.Q2_K, "q2_K", QK_K, 16 + 64 + 2 + 2, True, T.Q8_K),
    (T.Q3_K, "q3_K", QK_K, 32 + 64 + 12 + 2, True, T.Q8_K),
    (T.Q4_K, "q4_K", QK_K, 2 + 2 + 12 + 128, True, T.Q8_K),
    (T.Q5_K, "q5_K", QK_K, 2 + 2 + 12 + 32 + 128, True, T.Q8_K),
    (T.Q6_K, "q6_K", QK_K, 128 + 64 + 16 + 2, True, T.Q8_K),
    (T.Q8_K, "q8_K", QK_K, 4 + 256 + 2 * 16, True, None),
    (T.IQ2_XXS, "iq2_xxs", QK_K, 2 + 2 * 32, True, T.Q8_K),
    (T.IQ2_XS, "iq2_xs", QK_K, 2 + 2 * 32 + 8, True, T.Q8_K),
    (T.IQ3_XXS, "iq3_xxs", QK_K, 2 + 96, True, T.Q8_K),
    (T.IQ1_S, "iq1_s", QK_K, 2 + 32 + 2 * 8, True, T.Q8_K),
    (T.IQ4_NL, "iq4_nl", 32, 2 + 16, True, T.Q8_0),
    (T.IQ3_S, "iq3_s", QK_K, 2 + 64 + 8 + 32 + 4, True, T.Q8_K),
    (T.IQ2_S, "iq2_s", QK_K, 2 + 64 + 8 + 8, True, T.Q8_K),
    (T.IQ4_XS, "iq4_xs", QK_K, 2 + 2 + 4 + 128, True, T.Q8_K),
    (T.I8, "i8", 1, 1, False, None),
    (T.I16, "i16", 1, 2, False, None),
    (T.I32, "i32", 1, 4, False, None),
    (T.I64, "i64", 1, 8, False, None),
    (T.F64, "f64", 1, 8, False, None),
    (T.IQ1_M, "iq1_m", QK_K, 32 + 16 + 8, True, T.Q8_K),
    (T.BF16, "bf16", 1, 2, False, T.BF16),
    (T.Q4_0_4_4, _REMOVED_Q4_0.format("Q4_0_4_4"), 0, 0, False, None),
    (T.Q4_0_4_8, _REMOVED_Q4_0.format("Q4_0_4_8"), 0, 0, False, None),
    (T.Q4_0_8_8, _REMOVED_Q4_0.format("Q4_0_8_8"), 0, 0, False, None),
    (T.TQ1_0, "tq1_0", QK_K, 48 + 4 + 2, True, T.Q8_K),
    (T.TQ2_0, "tq2_0", QK_K, 64 + 2, True, T.Q8_K),
    (T.IQ4_NL_4_4, _REMOVED_IQ4_NL.format("IQ4_NL_4_4"), 0, 0, False, None),
    (T.IQ4_NL_4_8, _REMOVED_IQ4_NL.format("IQ4_NL_4_8"), 0, 0, False, None),
    (T.IQ4_NL_8_8, _REMOVED_IQ4_NL.format("IQ4_NL_8_8"), 0, 0, False, None),
    (T.MXFP4, "mxfp4", 32, 1 + 16, True, T.Q8_0),
    (T.NVFP4, "nvfp4", 64, 4 + 32, True, T.Q8_0),
    (T.Q1_0, "q1_0", 128, 2 + 16, True, T.Q8_0),
]

TYPE_TRAITS: tuple[TypeTraitsRow, ...] = tuple(TypeTraitsRow(*row) for row in _TABLE)
assert len(TYPE_TRAITS) == GGML_TYPE_COUNT
assert all(tr.type == i for i, tr in enumerate(TYPE_TRAITS))

# numpy dtypes for the types whose elements numpy can hold directly. F16 is float16; BF16 has no
# numpy type and is shown as its uint16 bit patterns; quantized types are raw block bytes.
NUMPY_DTYPE: dict[GGMLType, np.dtype] = {
    T.F32: np.dtype("<f4"),
    T.F16: np.dtype("<f2"),
    T.BF16: np.dtype("<u2"),
    T.I8: np.dtype("i1"),
    T.I16: np.dtype("<i2"),
    T.I32: np.dtype("<i4"),
    T.I64: np.dtype("<i8"),
    T.F64: np.dtype("<f8"),
}


def traits(type_: int) -> TypeTraitsRow:
    """The traits row of a ggml_type, checking the range as ggml does."""
    if not 0 <= int(type_) < GGML_TYPE_COUNT:
        from engine.core.errors import GGMLAssertionError

        raise GGMLAssertionError("type >= 0 && type < GGML_TYPE_COUNT", "ggml_get_type_traits",
                                 f"type {int(type_)}")
    return TYPE_TRAITS[int(type_)]


@query
def ggml_type_name(type_: int) -> str:
    """ggml_type_name: the type's short name ("f32", "q4_K", ...)."""
    return traits(type_).type_name


@query
def ggml_blck_size(type_: int) -> int:
    """ggml_blck_size: elements per block."""
    return traits(type_).blck_size


@query
def ggml_type_size(type_: int) -> int:
    """ggml_type_size: bytes per block."""
    return traits(type_).type_size


@query
def ggml_is_quantized(type_: int) -> bool:
    """ggml_is_quantized."""
    return traits(type_).is_quantized


@query
def ggml_row_size(type_: int, ne: int) -> int:
    """ggml_row_size: bytes of `ne` elements of `type_` (type_size * ne / blck_size)."""
    tr = traits(type_)
    from engine.core.errors import ggml_assert

    ggml_assert(tr.blck_size > 0 and ne % tr.blck_size == 0, "ne % ggml_blck_size(type) == 0",
                "ggml_row_size", f"{ne} elements of {tr.type_name} (block size {tr.blck_size})")
    return tr.type_size * ne // tr.blck_size


# --- fp16 ------------------------------------------------------------------------------------

def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_fp16_row: float32 -> fp16 bit patterns (uint16), round to nearest even.

    numpy's float16 cast already rounds to nearest even through subnormals and overflow; ggml
    differs only for NaN, which it always writes as the quiet NaN 0x7E00 with the input's sign.
    """
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
    nan = np.isnan(x)
    if nan.any():  # (most rows hold none)
        sign = (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000)
        return np.where(nan, sign | np.uint16(0x7E00), h.view(np.uint16))
    return h.view(np.uint16)


def fp16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """ggml_fp16_to_fp32_row: fp16 bit patterns -> float32, exact.

    NaN payloads are kept but made quiet, as ggml's converter does (its scaling multiply quiets
    signalling NaNs).
    """
    with np.errstate(invalid="ignore"):
        f = np.asarray(h, dtype=np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(f)
    if not nan.any():  # (most rows hold none)
        return f
    u = f.view(np.uint32)
    return np.where(nan, u | np.uint32(0x00400000), u).view(np.float32)


# --- bf16 ------------------------------------------------------------------------------------

def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_bf16_row: float32 -> bf16 bits, round to nearest even; NaNs made quiet."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    quiet_nan = (u >> 16) | np.uint32(64)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """ggml_bf16_to_fp32_row: bf16 bits -> float32 (exact: the bits are the float's top half)."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
