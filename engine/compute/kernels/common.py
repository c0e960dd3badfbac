"""What kernels share: numpy views of tensors, type conversion through f32, ggml's thread splits."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from engine.core.tensor import Tensor
from engine.core.types import NUMPY_DTYPE, GGMLType, TYPE_TRAITS, bf16_bits_to_fp32, fp16_bits_to_fp32, \
    fp32_to_bf16_bits, fp32_to_fp16_bits


_VIEWS_MAX = 1 << 12  # views kept per context


def view4(t: Tensor) -> np.ndarray:
    """t's data as a 4-d strided view, numpy axes (i3, i2, i1, i0): shape reversed ne.

    F16 elements are float16, BF16 their uint16 bits; quantized types are not viewable here.
    Each context keeps the views into its pool by the tensor's struct bytes (type, ne, nb, data
    and the rest), so computing a graph again builds none; they go with the context.
    """
    ctx, off = t.ctx.space.resolve(t.data)
    views = ctx.__dict__.setdefault("_views4", {})
    key = (off, t._r.tobytes())
    view = views.get(key)
    if view is not None:
        return view
    tr = TYPE_TRAITS[t.type]
    assert not tr.is_quantized, "view4 of a quantized tensor"
    view = np.ndarray(tuple(int(x) for x in reversed(t.ne)), dtype=NUMPY_DTYPE[GGMLType(t.type)],
                      buffer=ctx.pool.data, offset=off,
                      strides=tuple(int(x) for x in reversed(t.nb)))
    if len(views) >= _VIEWS_MAX:
        views.clear()
    views[key] = view
    return view


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


def thread_range(nr: int, ith: int, nth: int) -> tuple[int, int]:
    """get_thread_range: rows [dr*ith, min(dr*ith + dr, nr)) with dr = ceil(nr/nth)."""
    dr = (nr + nth - 1) // nth
    ir0 = dr * ith
    return min(ir0, nr), min(ir0 + dr, nr)


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
