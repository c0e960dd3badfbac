"""Tensor data: numpy views of a tensor's bytes and ggml-cpu.h's element accessors.

Mirrors ggml-cpu.c's ggml_new_i32/ggml_new_f32, ggml_set_f32/ggml_set_i32 (every element) and the
1-d accessors (ggml_get_f32_1d, ...), which walk rows by nb[1] and convert through the type's
scalar format; `to_numpy`/`set_data` are the engine's own ways in and out. Every strided numpy
view of memory in the engine (these, the kernels' view4 and flat_rows) is made by `strided_view`,
which checks with exact integers that its bytes lie in the buffer viewed.
"""

from __future__ import annotations

import math

import numpy as np

from engine.core.api import Writes, query, writes
from engine.core.context import Context
from engine.core.errors import GGMLAssertionError, TensorBoundsError, ggml_assert, ggml_assert_not_null
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_n_dims, ggml_nbytes, ggml_nelements, \
    ggml_nrows, ggml_new_tensor_1d
from engine.core.types import NUMPY_DTYPE, TYPE_TRAITS, GGMLType, bf16_bits_to_fp32, fp16_bits_to_fp32, \
    fp32_to_bf16_bits, fp32_to_fp16_bits


# --- one-element tensors ----------------------------------------------------------------

@writes()
def ggml_new_i32(ctx: Context, value: int) -> Tensor:
    """ggml_new_i32: a 1-element I32 tensor holding value (needs an allocating context)."""
    ggml_assert(not ctx.no_alloc, "!ctx->no_alloc", "ggml_new_i32")
    t = ggml_new_tensor_1d(ctx, GGMLType.I32, 1)
    ggml_set_i32(t, value)
    return t


@writes()
def ggml_new_f32(ctx: Context, value: float) -> Tensor:
    """ggml_new_f32: a 1-element F32 tensor holding value (needs an allocating context)."""
    ggml_assert(not ctx.no_alloc, "!ctx->no_alloc", "ggml_new_f32")
    t = ggml_new_tensor_1d(ctx, GGMLType.F32, 1)
    ggml_set_f32(t, value)
    return t


# --- data views ------------------------------------------------------------------------------------

NUMPY_MAX = 2**63 - 1  # numpy's strides, offsets and sizes are signed 64-bit


def strided_view(buffer: np.ndarray, offset: int, shape, strides, dtype, function: str,
                 what: str = "the view") -> np.ndarray:
    """The one way the engine looks at memory with strides: `shape` and byte `strides` (numpy
    order) from byte `offset` of `buffer` (uint8), checked with exact integers before numpy sees
    them (numpy's own check of a stride like 2**62 overflows int64 and lets the view through).

    The bytes a view reaches are ggml_nbytes's: from its first element to the end of its last,
    offset + sum((ne[i]-1)*nb[i]) + the element's size (with a negative stride, the span starts
    below the first element). They must lie in `buffer`, or TensorBoundsError names the rule.
    A stride counts only where its dimension has more than one element, as in ggml: a view with
    ne = 1 and a huge nb is fine, its stride given to numpy as 0 when numpy cannot hold it. An
    empty view reaches no byte; its start must still be inside (or at the end of) the buffer.
    """
    shape = [int(n) for n in shape]
    strides = [int(s) for s in strides]
    dtype = np.dtype(dtype)
    size = int(buffer.size)
    if any(n < 0 for n in shape):
        raise TensorBoundsError("ne[i] >= 0", function, f"{what} has shape {shape}")
    if 0 in shape:
        if not 0 <= offset <= size:
            raise TensorBoundsError("data >= mem_buffer && data <= mem_buffer + mem_size", function,
                                    f"{what} starts at byte {offset} of a {size}-byte buffer")
    else:
        low = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
        high = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + dtype.itemsize
        if low < 0 or high > size:
            raise TensorBoundsError("data + ggml_nbytes(tensor) <= mem_buffer + mem_size", function,
                                    f"{what} reaches bytes [{low}, {high}) of a {size}-byte buffer")
    count = math.prod(n for n in shape if n)  # (numpy counts the other dimensions of an empty view too)
    if count * dtype.itemsize > NUMPY_MAX:
        raise TensorBoundsError("ggml_nelements(tensor) * element size <= INT64_MAX", function,
                                f"{what} has {count} elements")
    # (past the checks a stride beyond numpy's range is one that is never multiplied)
    strides = [s if -NUMPY_MAX <= s <= NUMPY_MAX else 0 for s in strides]
    return np.ndarray(shape, dtype=dtype, buffer=buffer.data, offset=offset, strides=strides)


def tensor_view(t: Tensor, shape, strides, dtype, offset: int = 0,
                function: str = "to_numpy") -> np.ndarray:
    """strided_view of the pool holding t's data, from `offset` bytes past t->data."""
    data = ggml_assert_not_null(t.data, "tensor->data != NULL", function, f"'{t.name}' has no data")
    what = f"'{t.name}' (ne {[int(x) for x in t.ne]}, nb {[int(x) for x in t.nb]})"
    try:
        ctx, off = t.ctx.space.resolve(data)
    except ValueError as e:
        raise TensorBoundsError("tensor->data inside a live buffer", function, f"{what}: {e}") from None
    return strided_view(ctx.pool, off + offset, shape, strides, dtype, function,
                        f"{what} in context {ctx.id}'s pool")


@query
def data_bytes(t: Tensor, nbytes: int | None = None) -> np.ndarray:
    """The pool bytes at t->data (nbytes of them, default ggml_nbytes), as a writable view."""
    n = ggml_nbytes(t) if nbytes is None else nbytes
    return tensor_view(t, (n,), (1,), np.uint8, function="data_bytes")


@query
def to_numpy(t: Tensor) -> np.ndarray:
    """ggml.utils.to_numpy: a strided numpy view of t's data in the pool (no copy).

    Shape is reversed ne[:n_dims], strides reversed nb[:n_dims]. F16 is float16, BF16 its uint16
    bit patterns, quantized types the raw block bytes (last axis: bytes of one row). The bytes
    the view reaches are checked first (tensor_view): ggml keeps any nb a program gives.
    """
    n = ggml_n_dims(t)
    tr = TYPE_TRAITS[t.type]
    if tr.is_quantized:
        shape = [int(x) for x in reversed(t.ne[1:n])] + [int(t.ne[0]) // tr.blck_size * tr.type_size]
        strides = [int(x) for x in reversed(t.nb[1:n])] + [1]
        dtype = np.dtype(np.uint8)
    else:
        dtype = NUMPY_DTYPE[GGMLType(t.type)]
        shape = [int(x) for x in reversed(t.ne[:n])]
        strides = [int(x) for x in reversed(t.nb[:n])]
    return tensor_view(t, shape, strides, dtype)


def _element_view(t: Tensor, fn: str) -> np.ndarray:
    if t.type not in _SCALAR_TYPES:
        raise GGMLAssertionError("false", fn, f"type {TYPE_TRAITS[t.type].type_name} has no "
                                 "single-element access (GGML_ABORT(\"fatal error\"))")
    return to_numpy(t)


_SCALAR_TYPES = {GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.F16, GGMLType.BF16, GGMLType.F32}


def _from_f32(type_: int, value) -> np.ndarray:
    """A float converted to an element of type_ the way ggml-cpu's setters convert it."""
    v = np.asarray(value, dtype=np.float32)
    if type_ == GGMLType.F16:
        return fp32_to_fp16_bits(v).view(np.float16)
    if type_ == GGMLType.BF16:
        return fp32_to_bf16_bits(v)
    if type_ == GGMLType.F32:
        return v
    with np.errstate(invalid="ignore"):  # C's float -> int conversion truncates toward zero
        return np.trunc(v).astype(NUMPY_DTYPE[GGMLType(type_)])


def _to_f32(type_: int, raw: np.ndarray) -> np.ndarray:
    if type_ == GGMLType.F16:
        return fp16_bits_to_fp32(raw.view(np.uint16))
    if type_ == GGMLType.BF16:
        return bf16_bits_to_fp32(raw)
    return raw.astype(np.float32)


def _rows(t: Tensor, fn: str) -> np.ndarray:
    """ggml_set_f32's walk: nrows rows of ne[0] packed elements, row i at data + i*nb[1]."""
    dtype = _element_view(t, fn).dtype
    return tensor_view(t, (ggml_nrows(t), int(t.ne[0])), (int(t.nb[1]), dtype.itemsize), dtype,
                       function=fn)


@writes(Writes.DATA)
def ggml_set_f32(t: Tensor, value: float) -> Tensor:
    """ggml_set_f32: every element (of every row) set to value."""
    _rows(t, "ggml_set_f32")[...] = _from_f32(t.type, value)
    return t


@writes(Writes.DATA)
def ggml_set_i32(t: Tensor, value: int) -> Tensor:
    """ggml_set_i32: every element set to value."""
    rows = _rows(t, "ggml_set_i32")
    if t.type in (GGMLType.F16, GGMLType.BF16, GGMLType.F32):
        rows[...] = _from_f32(t.type, float(value))
    else:
        rows[...] = np.array(value).astype(rows.dtype)
    return t


def _element(t: Tensor, i: int, fn: str) -> tuple[np.ndarray, tuple]:
    """The 1-element location of flat index i: packed index if contiguous, else unravelled."""
    dtype = _element_view(t, fn).dtype
    if ggml_is_contiguous(t):
        return tensor_view(t, (ggml_nelements(t),), (dtype.itemsize,), dtype, function=fn), (i,)
    ne = [int(x) for x in t.ne]
    i0 = i % ne[0]
    i1 = (i // ne[0]) % ne[1]
    i2 = (i // (ne[0] * ne[1])) % ne[2]
    i3 = i // (ne[0] * ne[1] * ne[2])
    addr = sum(idx * int(nb) for idx, nb in zip((i0, i1, i2, i3), t.nb))
    return tensor_view(t, (1,), (dtype.itemsize,), dtype, addr, fn), (0,)


@query
def ggml_get_f32_1d(t: Tensor, i: int) -> float:
    """ggml_get_f32_1d."""
    arr, idx = _element(t, i, "ggml_get_f32_1d")
    return float(_to_f32(t.type, arr[idx[0]:idx[0] + 1])[0])


@writes(Writes.DATA)
def ggml_set_f32_1d(t: Tensor, i: int, value: float) -> None:
    """ggml_set_f32_1d."""
    arr, idx = _element(t, i, "ggml_set_f32_1d")
    arr[idx] = _from_f32(t.type, value)


@query
def ggml_get_i32_1d(t: Tensor, i: int) -> int:
    """ggml_get_i32_1d."""
    arr, idx = _element(t, i, "ggml_get_i32_1d")
    if t.type in (GGMLType.F16, GGMLType.BF16, GGMLType.F32):
        return int(np.trunc(_to_f32(t.type, arr[idx[0]:idx[0] + 1])[0]))
    return int(arr[idx])


@writes(Writes.DATA)
def ggml_set_i32_1d(t: Tensor, i: int, value: int) -> None:
    """ggml_set_i32_1d."""
    arr, idx = _element(t, i, "ggml_set_i32_1d")
    if t.type in (GGMLType.F16, GGMLType.BF16, GGMLType.F32):
        arr[idx] = _from_f32(t.type, float(value))
    else:
        arr[idx] = np.array(value).astype(arr.dtype)


@query
def ggml_get_data_f32(t: Tensor) -> np.ndarray:
    """ggml_get_data_f32: t's data as float32 (t must be F32)."""
    ggml_assert(t.type == GGMLType.F32, "tensor->type == GGML_TYPE_F32", "ggml_get_data_f32")
    return to_numpy(t)


@writes(Writes.DATA)
def set_data(t: Tensor, values) -> Tensor:
    """memcpy(t->data, values, ggml_nbytes(t)): fill t from a numpy array in ggml's element order.

    `values` is taken in numpy order (shape reversed ne) and converted to t's type; for quantized
    types it must already be the raw block bytes.
    """
    dst = to_numpy(t)
    src = np.asarray(values)
    if t.type == GGMLType.BF16 and src.dtype != np.uint16:
        src = fp32_to_bf16_bits(src.astype(np.float32))
    elif t.type == GGMLType.F16 and src.dtype != np.float16:
        src = fp32_to_fp16_bits(src.astype(np.float32)).view(np.float16)
    dst[...] = src.reshape(dst.shape)
    return t
