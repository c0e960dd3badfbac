"""The GGUF format's vocabulary: `enum gguf_type`, its sizes and names, limits, and GGUFError.

Mirrors the constants of gguf.h and the type tables at the top of gguf.cpp (ggml 0.15.3). Adds the
numpy dtypes the reader uses for zero-copy array views, and the one error class of this package.
Leaves out: nothing of the format; the v1 layout is only recognised (and refused).
"""

from __future__ import annotations

import enum
import struct

import numpy as np

from engine.core.api import query

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3  # the newest version ggml reads and the one it writes
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_KEY_GENERAL_ALIGNMENT = "general.alignment"
GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024  # gguf.cpp's limit on one string's length
GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024  # ... and on one array's element count
GGML_MAX_NAME = 64  # a tensor name must be shorter than this, in bytes
GGML_MAX_DIMS = 4
SIZE_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1


class TokenType(enum.IntEnum):
    """llama.cpp's enum llama_token_type: the values of the `tokenizer.ggml.token_type` array."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6

    @classmethod
    def label(cls, value: int) -> str:
        """'control' for 3, 'user-defined' for 4; '?' for a value outside the enum."""
        try:
            return cls(value).name.lower().replace("_", "-")
        except ValueError:
            return "?"


class GGUFValueType(enum.IntEnum):
    """enum gguf_type."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


GGUF_TYPE_COUNT = 13
T = GGUFValueType

# gguf_type_name and the struct/numpy codes of each fixed-size type (no byte-order prefix),
# looked up by a type's number as a file stores it
TYPE_NAME: dict[int, str] = {
    T.UINT8: "u8", T.INT8: "i8", T.UINT16: "u16", T.INT16: "i16", T.UINT32: "u32", T.INT32: "i32",
    T.FLOAT32: "f32", T.BOOL: "bool", T.STRING: "str", T.ARRAY: "arr", T.UINT64: "u64", T.INT64: "i64",
    T.FLOAT64: "f64"}
_CODE: dict[int, str] = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
                         T.FLOAT32: "f", T.BOOL: "b", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}
_NP_CODE: dict[int, str] = {T.UINT8: "u1", T.INT8: "i1", T.UINT16: "u2", T.INT16: "i2", T.UINT32: "u4",
            T.INT32: "i4", T.FLOAT32: "f4", T.BOOL: "i1", T.UINT64: "u8", T.INT64: "i8",
            T.FLOAT64: "f8"}


@query
def gguf_type_size(type_: int) -> int:
    """gguf_type_size: bytes of one value; 0 for STRING and ARRAY (and unknown types)."""
    return struct.calcsize(_CODE[type_]) if type_ in _CODE else 0


@query
def gguf_type_name(type_: int) -> str | None:
    """gguf_type_name: "u8", "str", ...; None for an unknown type, as C returns NULL."""
    return TYPE_NAME.get(type_)


def struct_for(type_: int, endian: str) -> struct.Struct:
    """The struct that reads or writes one value of a fixed-size type in byte order `endian`."""
    return struct.Struct(endian + _CODE[type_])


def dtype_for(type_: int, endian: str) -> np.dtype:
    """The numpy dtype of an array element (BOOL as int8, which the reader turns into bool)."""
    return np.dtype(endian + _NP_CODE[type_])


def pad(x: int, n: int) -> int:
    """GGML_PAD: x rounded up to a multiple of n (a power of two)."""
    return (x + n - 1) // n * n


class GGUFError(ValueError):
    """A GGUF file (or a request to a GGUF context) broke a rule.

    `field` names the item ("n_kv", "key 3 'general.name' value", "tensor 'a' ne[1]"), `offset`
    is its first byte in the file (-1 when it is not about a byte of the file), `rule` says what
    was wrong, with the values and limits involved.
    """

    def __init__(self, field: str, offset: int, rule: str) -> None:
        self.field = field
        self.offset = offset
        self.rule = rule
        where = f" at byte {offset}" if offset >= 0 else ""
        super().__init__(f"{field}{where}: {rule}")
