"""The C struct layouts ggml writes into its pool, as numpy structured dtypes (64-bit Linux).

Mirrors `struct ggml_object` (32 B) and `struct ggml_tensor` (336 B) from ggml-impl.h / ggml.h, and
`struct ggml_cgraph` (96 B). A record is a numpy view of pool bytes: writing a field writes the pool,
so the bytes in the pool are the only copy of a struct. Pointers are stored as simulated addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.api import query

GGML_MEM_ALIGN = 16
GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_MAX_OP_PARAMS = 64  # bytes: int32 op_params[16]


@query
def GGML_PAD(x: int, n: int) -> int:
    """GGML_PAD (a macro in ggml.h): round x up to a multiple of n (a power of two)."""
    return (x + n - 1) & ~(n - 1)


def _struct(fields: list[tuple[str, str, int]], itemsize: int) -> np.dtype:
    names, formats, offsets = zip(*fields)
    return np.dtype({"names": list(names), "formats": list(formats), "offsets": list(offsets),
                     "itemsize": itemsize})


# (field, numpy format, byte offset)
OBJECT = _struct([
    ("offs", "<u8", 0),    # payload offset from the pool start
    ("size", "<u8", 8),    # payload size, padded to GGML_MEM_ALIGN
    ("next", "<u8", 16),   # address of the next object header, 0 for the last
    ("type", "<i4", 24),   # enum ggml_object_type; 4 bytes of padding follow
], 32)

TENSOR = _struct([
    ("type", "<i4", 0),         # enum ggml_type; 4 bytes of padding follow
    ("buffer", "<u8", 8),       # ggml_backend_buffer *, NULL for context tensors
    ("ne", "(4,)<i8", 16),      # elements per dimension, ne[0] fastest
    ("nb", "(4,)<u8", 48),      # byte strides
    ("op", "<i4", 80),          # enum ggml_op
    ("op_params", "(16,)<i4", 84),
    ("flags", "<i4", 148),
    ("src", "(10,)<u8", 152),   # source tensor addresses
    ("view_src", "<u8", 232),   # base tensor address for views
    ("view_offs", "<u8", 240),  # byte offset into view_src's data
    ("data", "<u8", 248),       # data address, 0 when unallocated
    ("name", "S64", 256),
    ("extra", "<u8", 320),      # backend-private pointer, NULL here; 8 bytes of padding follow
], 336)

CGRAPH = _struct([
    ("size", "<i4", 0),          # capacity of nodes and leafs
    ("n_nodes", "<i4", 4),
    ("n_leafs", "<i4", 8),
    ("nodes", "<u8", 16),        # ggml_tensor ** (addresses)
    ("grads", "<u8", 24),
    ("grad_accs", "<u8", 32),
    ("leafs", "<u8", 40),
    ("use_counts", "<u8", 48),   # int32 *, indexed by hash slot
    ("hash_size", "<u8", 56),    # visited_hash_set.size
    ("hash_used", "<u8", 64),    # visited_hash_set.used (uint32 bitset)
    ("hash_keys", "<u8", 72),    # visited_hash_set.keys
    ("order", "<i4", 80),        # enum ggml_cgraph_eval_order
    ("uid", "<u8", 88),
], 96)

GGML_OBJECT_SIZE = OBJECT.itemsize
GGML_TENSOR_SIZE = TENSOR.itemsize
assert GGML_OBJECT_SIZE == 32 and GGML_TENSOR_SIZE == 336 and CGRAPH.itemsize == 96
assert GGML_OBJECT_SIZE % GGML_MEM_ALIGN == 0 and GGML_TENSOR_SIZE % GGML_MEM_ALIGN == 0

# Fields holding addresses: a pool dump makes these relative to the pool base to compare pools.
POINTER_FIELDS = {
    OBJECT: ("next",),
    TENSOR: ("buffer", "src", "view_src", "data", "extra"),
    CGRAPH: ("nodes", "grads", "grad_accs", "leafs", "use_counts", "hash_used", "hash_keys"),
}


@dataclass(frozen=True, slots=True)
class FieldSpan:
    """One field of a struct, for annotating a hex view."""

    name: str
    offset: int  # from the struct's start
    size: int
    pointer: bool


def struct_fields(dtype: np.dtype) -> dict[str, tuple[np.dtype, int]]:
    """A struct dtype's fields in declaration order: name -> (dtype, offset)."""
    fields = dtype.fields
    assert fields is not None, f"{dtype} is not a struct"  # (numpy's None: a plain dtype)
    return {name: (f[0], f[1]) for name, f in fields.items()}


def field_spans(dtype: np.dtype) -> list[FieldSpan]:
    """The fields of a struct dtype in memory order, padding left out."""
    pointers = set(POINTER_FIELDS.get(dtype, ()))
    spans = [FieldSpan(name, off, dt.itemsize, name in pointers)
             for name, (dt, off) in struct_fields(dtype).items()]
    return sorted(spans, key=lambda s: s.offset)


def struct_at(pool: np.ndarray, offset: int, dtype: np.dtype) -> np.ndarray:
    """The struct at pool[offset]: a 1-element structured array viewing its itemsize bytes
    (writes go through)."""
    return pool[offset:offset + dtype.itemsize].view(dtype)
