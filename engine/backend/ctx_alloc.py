"""ggml-alloc's other half: a context's tensors placed in backend buffers.

`ggml_tallocr` is a bump allocator over one buffer (each tensor at the next aligned offset);
`ggml_backend_alloc_ctx_tensors(_from_buft)` gives every tensor of a `no_alloc` context that has no
data its bytes in one buffer of the backend's type — or, past the type's max size, in several
wrapped in one multi-buffer — as llama.cpp places a model's weights and its KV cache.
(engine/backend/alloc.py is the graph allocator, the planning half.)
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.backend import buffer as be
from engine.backend.alloc import padded
from engine.backend.device import ggml_backend_get_default_buffer_type
from engine.core.api import Writes, query, writes
from engine.core.errors import ggml_assert
from engine.core.tensor import Tensor


@dataclass
class Tallocr:
    """struct ggml_tallocr: a bump allocator over one buffer."""
    buffer: be.Buffer
    base: int
    alignment: int
    offset: int


@writes()
def ggml_tallocr_new(buffer: be.Buffer) -> Tallocr:
    align = buffer.buft.alignment
    return Tallocr(buffer, buffer.base, align, (align - buffer.base % align) % align)


@writes()
def ggml_tallocr_alloc(talloc: Tallocr, t: Tensor) -> int:
    size = padded(talloc.buffer.buft.alloc_size(t), talloc.alignment)
    ggml_assert(talloc.offset + size <= talloc.buffer.size, "not enough space in the buffer",
                "ggml_tallocr_alloc", f"tensor {t.name} needs {size} bytes, "
                f"{talloc.buffer.size - talloc.offset} available")
    addr = talloc.base + talloc.offset
    talloc.offset += size
    ggml_assert(addr % talloc.alignment == 0, "((uintptr_t) (addr) % talloc->alignment) == 0", "ggml_tallocr_alloc")
    return be.ggml_backend_tensor_alloc(talloc.buffer, t, addr)


def _ctx_tensors(ctx):
    from engine.core.tensor_list import ggml_get_first_tensor, ggml_get_next_tensor
    t = ggml_get_first_tensor(ctx)
    while t is not None:
        yield t
        t = ggml_get_next_tensor(ctx, t)


def _alloc_range(tensors, buft, size):
    buf = be.ggml_backend_buft_alloc_buffer(buft, size)
    talloc = ggml_tallocr_new(buf)
    for t in tensors:
        if t.data is None and t.view_src is None:
            ggml_tallocr_alloc(talloc, t)
        elif t.view_src is not None and be.buffer_field(t) == 0:
            be.ggml_backend_view_init(t)
    return buf


def _ctx_ranges(ctx, buft):
    """The context's tensors cut into runs that each fit the buffer type's max size, with sizes."""
    ggml_assert(ctx.no_alloc, "ggml_get_no_alloc(ctx) == true", "ggml_backend_alloc_ctx_tensors_from_buft")
    ranges, cur, cur_size = [], [], 0
    for t in _ctx_tensors(ctx):
        this = padded(buft.alloc_size(t), buft.alignment) if t.data is None and t.view_src is None else 0
        if cur_size > 0 and cur_size + this > buft.max_size:
            ranges.append((cur, cur_size))
            cur, cur_size = [t], this
        else:
            cur.append(t)
            cur_size += this
    if cur_size > 0:
        ranges.append((cur, cur_size))
    return ranges


@query
def ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, buft) -> int:
    return sum(size for _, size in _ctx_ranges(ctx, buft))


@writes(Writes.PLACES)
def ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft):
    """Every tensor of a no_alloc context without data, in one buffer — or, past the buffer
    type's max size, in several wrapped in one multi-buffer. None when every tensor already has data."""
    bufs = [_alloc_range(ts, buft, size) for ts, size in _ctx_ranges(ctx, buft)]
    if not bufs:
        return None
    return bufs[0] if len(bufs) == 1 else be.ggml_backend_multi_buffer_alloc_buffer(bufs)


@writes(Writes.PLACES)
def ggml_backend_alloc_ctx_tensors(ctx, backend):
    return ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_get_default_buffer_type(backend))
