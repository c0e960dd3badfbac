"""ggml-backend's buffer types, buffers with real bytes, and tensor data movement.

A buffer (`struct ggml_backend_buffer`) is a numpy byte region mapped in the program's simulated
address space like a context pool, at a 64-byte aligned base; its struct gets an address of its
own, which is what `ggml_backend_tensor_alloc` writes into a tensor's `buffer` field, while `data`
becomes base + offset — the two fields real ggml writes. Computing a graph goes through the
engine's compute (ggml_graph_plan + ggml_graph_compute) with the work buffer in a buffer of its
own, as the CPU backend's graph_compute does with its work_data.
"""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Any

import numpy as np

from engine.core.api import Writes, query, writes
from engine.core.context import FileBytes, current_address_space
from engine.core.errors import ggml_assert, ggml_assert_not_null
from engine.core.tensor import Tensor, ggml_nbytes

TENSOR_ALIGNMENT = 32  # the CPU buffer type's alignment (ggml-backend.cpp)
SIZE_MAX = (1 << 64) - 1

GGML_BACKEND_BUFFER_USAGE_ANY = 0
GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1
GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2


class BufferType:
    """struct ggml_backend_buffer_type: how buffers of one kind are made and what they hold."""

    def __init__(self, name: str = "CPU", alignment: int = TENSOR_ALIGNMENT, max_size: int = SIZE_MAX,
                 is_host: bool = True) -> None:
        self.name, self.alignment, self.max_size, self.is_host = name, alignment, max_size, is_host
        # the Device that allocates this buffer type, which sets it (engine.backend.device, which
        # imports this module: named Any here)
        self.device: Any = None

    def alloc_size(self, t: Tensor) -> int:
        return ggml_nbytes(t)

    # the buffer interface its buffers get (ggml_backend_buffer_i); the CPU's by default
    def init_tensor(self, buf: "Buffer", t: Tensor) -> int:
        """The CPU buffer has no per-tensor setup (no init_tensor callback): success."""
        return 0

    def set_tensor(self, buf: "Buffer", t: Tensor, src: np.ndarray, offset: int, size: int) -> None:
        """The bytes as they are (the CPU buffer's memcpy)."""
        tensor_bytes(t, offset, size, "ggml_backend_tensor_set")[:] = src[:size]

    def get_tensor(self, buf: "Buffer", t: Tensor, offset: int, size: int) -> bytes:
        """The bytes as they are (the CPU buffer's memcpy)."""
        return tensor_bytes(t, offset, size, "ggml_backend_tensor_get").tobytes()

    def __repr__(self) -> str:
        return f"<ggml_backend_buffer_type {self.name} alignment={self.alignment}>"


CPU_BUFT = BufferType()
# the type of a buffer over memory the caller owns (ggml_backend_cpu_buffer_from_ptr: a model
# file's mapping, in llama.cpp); it makes no buffers of its own
CPU_MAPPED_BUFT = BufferType("CPU_Mapped")


class HostStruct:
    """The host memory holding a struct of ggml's own (a buffer's, a buffer type's tensor traits):
    gives the struct its own simulated address."""

    def __init__(self) -> None:
        self.pool = np.zeros(64, dtype=np.uint8)
        self.mem_size = 64
        self.space = current_address_space()
        self.base = self.space.place(self, 64)


class Buffer:
    """struct ggml_backend_buffer: `size` bytes at a simulated, aligned `base`."""

    def __init__(self, buft: BufferType, size: int, data: np.ndarray | None = None) -> None:
        self.buft, self.size = buft, size
        self.usage = GGML_BACKEND_BUFFER_USAGE_ANY
        self.space = current_address_space()
        made = self.space.pool_maker(buft, size) if data is None and self.space.pool_maker else None
        self.pool = data if data is not None else made if made is not None else \
            np.zeros(max(size, 1), dtype=np.uint8)
        self.mem_size = self.pool.size
        self.id = self.space.placed  # a small stable id, from the same count as the contexts'
        self.base = self.space.place(self, self.mem_size)  # 1 MiB aligned: any alignment holds
        self.struct = HostStruct()
        self.address = self.struct.base  # what a tensor's `buffer` field holds
        _BUFFERS[(self.space, self.address)] = self
        self.freed = False
        self.is_work = False  # a backend's work buffer (the tracer diffs it after every node)
        self.tensor_extra: dict[int, object] = {}  # what its buffer type keeps per tensor, by data
        # address (CPU_REPACK: each tensor's layout; the CPU buffer keeps nothing)
        self.read_from: FileBytes | None = None  # bytes that are a file's pages (CPU_Mapped)

    def __repr__(self) -> str:
        return f"<ggml_backend_buffer {self.buft.name} base={self.base:#x} size={self.size}>"


# by address space and the address of its struct, from its making to its freeing (two programs'
# spaces, recorded or planned at once by a server's threads, use the same addresses)
_BUFFERS: dict[tuple[Any, int], Buffer] = {}


def live_buffers() -> list[Buffer]:
    """Every buffer made and not freed yet, in any address space (a device counts its memory)."""
    return [b for b in _BUFFERS.values() if not b.freed]


def tensor_buffer(t: Tensor) -> Buffer | None:
    """The buffer whose address is in t->buffer (None for context tensors)."""
    return _BUFFERS.get((t.ctx.space, buffer_field(t)))


def buffer_field(t: Tensor) -> int:
    """The address in t->buffer (0: NULL)."""
    return int(t._r["buffer"][0])


def set_buffer_field(t: Tensor, address: int) -> None:
    """t->buffer = the buffer struct at address (0: NULL)."""
    t._r["buffer"] = address


# --- buffer types -----------------------------------------------------------------------------

@writes()
def ggml_backend_cpu_buffer_type() -> BufferType:
    return CPU_BUFT


@query
def ggml_backend_buft_name(buft: BufferType) -> str:
    return buft.name


@query
def ggml_backend_buft_get_alignment(buft: BufferType) -> int:
    return buft.alignment


@query
def ggml_backend_buft_get_max_size(buft: BufferType) -> int:
    return buft.max_size


@query
def ggml_backend_buft_get_alloc_size(buft: BufferType, t: Tensor) -> int:
    return buft.alloc_size(t)


@query
def ggml_backend_buft_is_host(buft: BufferType) -> bool:
    return buft.is_host


@writes()
def ggml_backend_buft_alloc_buffer(buft: BufferType, size: int) -> Buffer:
    return Buffer(buft, size)


# --- buffers ----------------------------------------------------------------------------------

@query
def ggml_backend_buffer_name(buf: Buffer) -> str:
    return buf.buft.name


@query
def ggml_backend_buffer_get_base(buf: Buffer) -> int:
    return buf.base


@query
def ggml_backend_buffer_get_size(buf: Buffer) -> int:
    return buf.size


@query
def ggml_backend_buffer_get_alignment(buf: Buffer) -> int:
    return buf.buft.alignment


@query
def ggml_backend_buffer_get_max_size(buf: Buffer) -> int:
    return buf.buft.max_size


@query
def ggml_backend_buffer_get_alloc_size(buf: Buffer, t: Tensor) -> int:
    return buf.buft.alloc_size(t)


@query
def ggml_backend_buffer_get_type(buf: Buffer) -> BufferType:
    return buf.buft


@query
def ggml_backend_buffer_is_host(buf: Buffer) -> bool:
    return buf.buft.is_host


@writes()
def ggml_backend_buffer_set_usage(buf: Buffer, usage: int) -> None:
    if isinstance(buf, MultiBuffer):  # ggml_backend_multi_buffer_set_usage
        buf.set_usage(usage)
    buf.usage = usage


@query
def ggml_backend_buffer_get_usage(buf: Buffer) -> int:
    return buf.usage


@writes()
def ggml_backend_buffer_clear(buf: Buffer, value: int) -> None:
    if isinstance(buf, MultiBuffer):
        buf.clear(value)
        return
    buf.pool[:buf.size] = value & 0xFF


@writes()
def ggml_backend_buffer_reset(buf: Buffer) -> None:
    """The CPU buffer has no per-tensor state to drop."""


@writes()
def ggml_backend_buffer_init_tensor(buf: Buffer, t: Tensor) -> int:
    """The buffer type's init_tensor (the CPU buffer has none: success)."""
    return buf.buft.init_tensor(buf, t)


@writes()
def ggml_backend_buffer_free(buf: Buffer | None) -> None:
    if buf is None or buf.freed:
        return
    if isinstance(buf, MultiBuffer):
        buf.free()
        return
    buf.freed = True
    buf.space.remove(buf)
    buf.space.remove(buf.struct)
    _BUFFERS.pop((buf.space, buf.address), None)
    buf.pool = np.zeros(0, dtype=np.uint8)  # its memory released now, whoever holds the handle


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # (Linux's)
_MAPPINGS: dict[int, tuple[int, str]] = {}  # files mapped by map_file: start address -> (size, path)


def map_file(path: str | os.PathLike) -> np.ndarray:
    """The file's bytes mapped read-only (llama_mmap): a buffer made over them (from_ptr) knows
    they are the file's pages (`Buffer.read_from`), so a recorder keeps where they came from
    instead of a copy. Not part of ggml's API: llama.cpp's loader maps the file itself."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ValueError(f"{os.fspath(path)}: the file is empty: nothing to map")
        # every page mapped at once, as llama_mmap maps a model with prefetch (MAP_POPULATE):
        # reading the weights then takes no page fault a page
        pages = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    arr = np.frombuffer(pages, np.uint8)
    start = arr.ctypes.data
    _MAPPINGS[start] = (arr.size, os.fspath(path))
    weakref.finalize(arr, _MAPPINGS.pop, start, None)
    return arr


def _file_pages(arr: np.ndarray, size: int) -> FileBytes | None:
    """Where in a file mapped by map_file the bytes arr[:size] lie, if they do."""
    at = arr.ctypes.data
    for start, (n, path) in list(_MAPPINGS.items()):
        if start <= at and at + size <= start + n:
            return FileBytes(0, size, path, at - start)
    return None


@writes()
def ggml_backend_cpu_buffer_from_ptr(data: np.ndarray | bytearray, size: int) -> Buffer:
    """A CPU buffer over memory the caller owns (ggml asserts the pointer is aligned), of the
    buffer type ggml names CPU_Mapped. Read-only memory (a file mapped for reading) stays
    read-only: a write into it fails as numpy refuses it."""
    arr = data if isinstance(data, np.ndarray) and data.dtype == np.uint8 else np.frombuffer(data, dtype=np.uint8)
    ggml_assert(arr.size >= size, "size <= sizeof(ptr)", "ggml_backend_cpu_buffer_from_ptr")
    buf = Buffer(CPU_MAPPED_BUFT, size, arr[:size])
    buf.read_from = _file_pages(arr, size)
    return buf


# --- tensors in buffers -----------------------------------------------------------------------

@writes()
def ggml_backend_tensor_alloc(buf: Buffer, t: Tensor, addr: int) -> int:
    """Place t at address addr of buffer buf: sets t->buffer and t->data."""
    ggml_assert(buffer_field(t) == 0, "tensor->buffer == NULL", "ggml_backend_tensor_alloc")
    ggml_assert(t.data is None, "tensor->data == NULL", "ggml_backend_tensor_alloc")
    ggml_assert(t.view_src is None, "tensor->view_src == NULL", "ggml_backend_tensor_alloc")
    ggml_assert(buf.base <= addr <= buf.base + buf.size - buf.buft.alloc_size(t),
                "(char *)addr + ggml_backend_buffer_get_alloc_size(buffer, tensor) <= "
                "(char *)ggml_backend_buffer_get_base(buffer) + ggml_backend_buffer_get_size(buffer)",
                "ggml_backend_tensor_alloc")
    set_buffer_field(t, buf.address)
    t.data = addr
    return ggml_backend_buffer_init_tensor(buf, t)


@writes()
def ggml_backend_view_init(t: Tensor) -> int:
    """A view gets its view_src's buffer and data + view_offs."""
    fn = "ggml_backend_view_init"
    ggml_assert(buffer_field(t) == 0, "tensor->buffer == NULL", fn)
    vs = ggml_assert_not_null(t.view_src, "tensor->view_src != NULL", fn)
    ggml_assert(buffer_field(vs) != 0, "tensor->view_src->buffer != NULL", fn)
    vs_data = ggml_assert_not_null(vs.data, "tensor->view_src->data != NULL", fn)
    set_buffer_field(t, buffer_field(vs))
    t.data = vs_data + t.view_offs
    return 0


def tensor_bytes(t: Tensor, offset: int, size: int, fn: str) -> np.ndarray:
    """The bytes [offset, offset + size) of t's data in its buffer, checked as ggml checks them."""
    buf = ggml_assert_not_null(tensor_buffer(t), "buf != NULL && \"tensor buffer not set\"", fn)
    data = ggml_assert_not_null(t.data, "tensor->data != NULL && \"tensor not allocated\"", fn)
    what = "read" if fn == "ggml_backend_tensor_get" else "write"
    ggml_assert(offset + size <= ggml_nbytes(t),
                f"offset + size <= ggml_nbytes(tensor) && \"tensor {what} out of bounds\"", fn)
    start = data - buf.base + offset
    return buf.pool[start:start + size]


@writes(Writes.DATA)
def ggml_backend_tensor_set(t: Tensor, data: bytes | np.ndarray, offset: int, size: int) -> None:
    if size == 0:
        return
    # (the caller's bytes as they are, not a copy: a model's weights come from the file's mapping)
    src = np.ascontiguousarray(data).reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) \
        else np.frombuffer(data, dtype=np.uint8)
    buf = ggml_assert_not_null(tensor_buffer(t), "buf != NULL && \"tensor buffer not set\"",
                               "ggml_backend_tensor_set")
    buf.buft.set_tensor(buf, t, src, offset, size)


@query
def ggml_backend_tensor_get(t: Tensor, offset: int, size: int) -> bytes:
    if size == 0:
        return b""
    buf = ggml_assert_not_null(tensor_buffer(t), "buf != NULL && \"tensor buffer not set\"",
                               "ggml_backend_tensor_get")
    return buf.buft.get_tensor(buf, t, offset, size)


@writes(Writes.DATA)
def ggml_backend_tensor_memset(t: Tensor, value: int, offset: int, size: int) -> None:
    if size == 0:
        return
    tensor_bytes(t, offset, size, "ggml_backend_tensor_memset")[:] = value & 0xFF


@writes()
def ggml_backend_tensor_set_2d(t: Tensor, data: bytes | np.ndarray, offset: int, size: int, n_copies: int,
                               stride_tensor: int, stride_data: int) -> None:
    """n_copies rows of `size` bytes: row i from data + i*stride_data to offset + i*stride_tensor."""
    raw = data if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data).tobytes()
    for i in range(n_copies):
        ggml_backend_tensor_set(t, raw[i * stride_data:i * stride_data + size], offset + i * stride_tensor, size)


@query
def ggml_backend_tensor_get_2d(t: Tensor, offset: int, size: int, n_copies: int, stride_tensor: int,
                               stride_data: int) -> bytes:
    """The rows ggml_backend_tensor_get_2d writes, laid out stride_data apart (gaps zero)."""
    out = bytearray(max(0, (n_copies - 1) * stride_data + size) if n_copies else 0)
    for i in range(n_copies):
        out[i * stride_data:i * stride_data + size] = ggml_backend_tensor_get(t, offset + i * stride_tensor, size)
    return bytes(out)


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and list(a.ne) == list(b.ne) and list(a.nb) == list(b.nb)


@writes()
def ggml_backend_buffer_copy_tensor(src: Tensor, dst: Tensor) -> bool:
    """The destination buffer's cpy_tensor: a host buffer copies from another host buffer; false
    otherwise (the caller then goes through host memory)."""
    dst_buf, src_buf = tensor_buffer(dst), tensor_buffer(src)
    if dst_buf is None or src_buf is None or not (dst_buf.buft.is_host and src_buf.buft.is_host):
        return False
    n = ggml_nbytes(src)
    ggml_backend_tensor_set(dst, ggml_backend_tensor_get(src, 0, n), 0, n)
    return True


@writes()
def ggml_backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy src's bytes into dst (same layout); a no-op when they are the same tensor. Between two
    non-host buffers without a direct copy the bytes go through host memory, as in ggml."""
    ggml_assert(_same_layout(src, dst),
                "ggml_are_same_layout(src, dst) && \"cannot copy tensors with different layouts\"",
                "ggml_backend_tensor_copy")
    if src == dst:
        return
    n = ggml_nbytes(src)
    ggml_backend_tensor_set(dst, ggml_backend_tensor_get(src, 0, n), 0, n)


class MultiBuffer:
    """A buffer made of several (ggml_backend_multi_buffer_alloc_buffer): what
    ggml_backend_alloc_ctx_tensors returns when a context's tensors pass the buffer type's max size.
    Its size is the sum; usage, clear and free reach every part."""

    def __init__(self, buffers: list[Buffer]) -> None:
        ggml_assert(len(buffers) > 0, "n_buffers > 0", "ggml_backend_multi_buffer_alloc_buffer")
        self.buffers = list(buffers)
        self.buft = buffers[0].buft
        self.size = sum(b.size for b in buffers)
        self.usage = GGML_BACKEND_BUFFER_USAGE_ANY
        self.freed = False

    def set_usage(self, usage: int) -> None:
        self.usage = usage
        for b in self.buffers:
            b.usage = usage

    def clear(self, value: int) -> None:
        for b in self.buffers:
            b.pool[:] = value & 0xFF

    def free(self) -> None:
        for b in self.buffers:
            ggml_backend_buffer_free(b)
        self.freed = True

    def __repr__(self) -> str:
        return f"<ggml_backend_buffer multi {self.buft.name} parts={len(self.buffers)} size={self.size}>"


@writes()
def ggml_backend_multi_buffer_alloc_buffer(buffers: list[Buffer], n_buffers: int | None = None) -> MultiBuffer:
    return MultiBuffer(buffers[:n_buffers] if n_buffers is not None else buffers)


@query
def ggml_backend_buffer_is_multi_buffer(buf) -> bool:
    return isinstance(buf, MultiBuffer)
