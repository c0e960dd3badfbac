"""What kernels share: numpy views of tensors, type conversion through f32, ggml's thread splits."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from engine.compute.shares import Interval
from engine.core.context import Context
from engine.core.errors import GGMLAssertionError
from engine.core.tensor import Tensor
from engine.core.tensor_data import tensor_view
from engine.lanes import twin
from engine.core.types import NUMPY_DTYPE, GGMLType, TYPE_TRAITS, bf16_bits_to_fp32, fp16_bits_to_fp32, \
    fp32_to_bf16_bits, fp32_to_fp16_bits


_VIEWS_MAX = 1 << 12  # views kept per context


def data_place(t: Tensor) -> tuple[Context, int]:
    """The context whose pool holds t's data, and the data's offset in it (a kernel's tensor has
    data: ggml dereferences tensor->data unchecked)."""
    data = t.data
    if data is None:
        raise GGMLAssertionError("tensor->data != NULL", "ggml_compute_forward", f"'{t.name}' has no data")
    return t.ctx.space.resolve(data)


def view4(t: Tensor) -> np.ndarray:
    """t's data as a 4-d strided view, numpy axes (i3, i2, i1, i0): shape reversed ne.

    F16 elements are float16, BF16 their uint16 bits; quantized types are not viewable here.
    Each context keeps the views into its pool by the tensor's struct bytes (type, ne, nb, data
    and the rest), so computing a graph again builds none; they go with the context.
    """
    ctx, off = data_place(t)
    views = ctx.__dict__.setdefault("_views4", {})
    key = (off, t._r.tobytes())
    view = views.get(key)
    if view is not None:
        return view
    tr = TYPE_TRAITS[t.type]
    assert not tr.is_quantized, "view4 of a quantized tensor"
    view = tensor_view(t, reversed(t.ne.tolist()), reversed(t.nb.tolist()),
                       NUMPY_DTYPE[GGMLType(t.type)], function="view4")
    if len(views) >= _VIEWS_MAX:
        views.clear()
    views[key] = view
    return view


def spans(a: np.ndarray) -> bool:
    """Does span_of take this array: its last axis packed, every stride non-negative?"""
    return a.strides[-1] == a.itemsize and all(st >= 0 for st in a.strides)


def span_of(a: np.ndarray) -> np.ndarray:
    """An array's elements (spans(a)) as a C loop takes them: one flat span of bytes from its
    first element to its last, read with the array's strides."""
    if not a.size:
        return np.empty(0, np.uint8)
    size = sum((n - 1) * st for n, st in zip(a.shape, a.strides)) + a.itemsize
    first = a[(0,) * (a.ndim - 1)][:1]  # (the first element, as an array)
    return np.lib.stride_tricks.as_strided(first.view(np.uint8), shape=(size,), strides=(1,))


def byte_span(a: np.ndarray) -> tuple[np.ndarray, int]:
    """The rows of a 2-d array (each packed, a non-negative distance apart) as a C loop takes
    them: span_of's bytes and the rows' distance in bytes (a row's own size when there is one)."""
    rows, n = a.shape
    return span_of(a), a.strides[0] if rows > 1 else n * a.itemsize


def to_f32(a: np.ndarray, type_: int) -> np.ndarray:
    """Elements of a ggml type as float32 (exact for f16 and bf16)."""
    if type_ == GGMLType.F32:
        return a
    if type_ == GGMLType.F16:
        return fp16_bits_to_fp32(a.view(np.uint16))
    if type_ == GGMLType.BF16:
        return bf16_bits_to_fp32(a)
    return a.astype(np.float32)


def from_f32(x: np.ndarray, type_: int) -> np.ndarray:
    """float32 values as elements of a ggml type, rounded the way ggml rounds."""
    if type_ == GGMLType.F32:
        return x
    if type_ == GGMLType.F16:
        return fp32_to_fp16_bits(x).view(np.float16)
    if type_ == GGMLType.BF16:
        return fp32_to_bf16_bits(x)
    with np.errstate(invalid="ignore"):  # C's float -> int conversion truncates toward zero
        return np.trunc(x).astype(NUMPY_DTYPE[GGMLType(type_)])


@twin("round_floats")
def round_floats(x, bits, back, bf16: bool) -> None:
    """engine._lanes.round_floats: float32 x rounded to halves (bf16) into bits, as
    ggml_fp32_to_fp16_row (_bf16_row) rounds them; unless back is None, those widened again into
    back (float32)."""
    xs = np.frombuffer(x, np.float32)
    h = fp32_to_bf16_bits(xs) if bf16 else fp32_to_fp16_bits(xs)
    np.frombuffer(bits, np.uint16)[:] = h
    if back is not None:
        np.frombuffer(back, np.float32)[:] = bf16_bits_to_fp32(h) if bf16 else fp16_bits_to_fp32(h)


def chunks_taken(params, total: int) -> list[int]:
    """The chunks of `total` this thread takes from the counter its kernel set to nth
    (ggml_threadpool_chunk_set, then ggml_threadpool_chunk_add): chunk ith first, then the next
    free one until none is left. One thread running every share in turn (alone), or a chunk a
    thread or fewer, takes them as threads of equal speed would: every nth from its own."""
    if params.alone or params.nth >= total:
        return list(range(params.ith, total, params.nth))
    taken, chunk = [], params.ith
    while chunk < total:
        taken.append(chunk)
        chunk = next(params.shared["chunk"])
    return taken


def thread_range(nr: int, ith: int, nth: int) -> Interval:
    """get_thread_range: rows [dr*ith, min(dr*ith + dr, nr)) with dr = ceil(nr/nth)."""
    dr = (nr + nth - 1) // nth
    ir0 = dr * ith
    return Interval(min(ir0, nr), min(ir0 + dr, nr))


def row_blocks(ne1: int, ne2: int, ir0: int, ir1: int) -> Iterator[tuple[int, int, int, int]]:
    """Split flat rows [ir0, ir1) (row = (i3*ne2 + i2)*ne1 + i1) into (i3, i2, i1a, i1b) runs."""
    ir = ir0
    while ir < ir1:
        i3, rest = divmod(ir, ne2 * ne1)
        i2, i1 = divmod(rest, ne1)
        end = min(ir1, ir - i1 + ne1)
        yield i3, i2, i1, i1 + (end - ir)
        ir = end


def row_index(ir: int, t: Tensor) -> tuple[int, int, int]:
    """(i3, i2, i1) of t's flat row ir (row = (i3*ne2 + i2)*ne1 + i1)."""
    ne1, ne2 = int(t.ne[1]), int(t.ne[2])
    return ir // (ne2 * ne1), ir // ne1 % ne2, ir % ne1
