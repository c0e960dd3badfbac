"""ggml-backend for the CPU: buffer types, buffers with real bytes, tensor data movement, the backend.

A buffer (`struct ggml_backend_buffer`) is a numpy byte region mapped in the program's simulated
address space like a context pool, at a 64-byte aligned base; its struct gets an address of its
own, which is what `ggml_backend_tensor_alloc` writes into a tensor's `buffer` field, while `data`
becomes base + offset — the two fields real ggml writes. Computing a graph goes through the
engine's compute (ggml_graph_plan + ggml_graph_compute) with the work buffer in a buffer of its
own, as the CPU backend's graph_compute does with its work_data.
"""

from __future__ import annotations

import numpy as np

from engine.context import current_address_space
from engine.errors import ggml_assert
from engine.tensor import Tensor, ggml_nbytes

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

    def alloc_size(self, t: Tensor) -> int:
        return ggml_nbytes(t)

    def __repr__(self) -> str:
        return f"<ggml_backend_buffer_type {self.name} alignment={self.alignment}>"


_CPU_BUFT = BufferType()


class _Struct:
    """The host memory holding a buffer's struct: gives the struct its own simulated address."""

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
        self.pool = np.zeros(max(size, 1), dtype=np.uint8) if data is None else data
        self.mem_size = self.pool.size
        self.space = current_address_space()
        self.base = self.space.place(self, self.mem_size)  # 1 MiB aligned: any alignment holds
        self.struct = _Struct()
        self.address = self.struct.base  # what a tensor's `buffer` field holds
        _BUFFERS[self.address] = self
        self.freed = False

    def __repr__(self) -> str:
        return f"<ggml_backend_buffer {self.buft.name} base={self.base:#x} size={self.size}>"


_BUFFERS: dict[int, Buffer] = {}


def tensor_buffer(t: Tensor) -> Buffer | None:
    """The buffer whose address is in t->buffer (None for context tensors)."""
    return _BUFFERS.get(buffer_field(t))


def buffer_field(t: Tensor) -> int:
    """The address in t->buffer (0: NULL)."""
    return int(t._r["buffer"][0])


# --- buffer types -----------------------------------------------------------------------------

def ggml_backend_cpu_buffer_type() -> BufferType:
    return _CPU_BUFT


def ggml_backend_buft_name(buft: BufferType) -> str:
    return buft.name


def ggml_backend_buft_get_alignment(buft: BufferType) -> int:
    return buft.alignment


def ggml_backend_buft_get_max_size(buft: BufferType) -> int:
    return buft.max_size


def ggml_backend_buft_get_alloc_size(buft: BufferType, t: Tensor) -> int:
    return buft.alloc_size(t)


def ggml_backend_buft_is_host(buft: BufferType) -> bool:
    return buft.is_host


def ggml_backend_buft_alloc_buffer(buft: BufferType, size: int) -> Buffer:
    return Buffer(buft, size)


# --- buffers ----------------------------------------------------------------------------------

def ggml_backend_buffer_name(buf: Buffer) -> str:
    return buf.buft.name


def ggml_backend_buffer_get_base(buf: Buffer) -> int:
    return buf.base


def ggml_backend_buffer_get_size(buf: Buffer) -> int:
    return buf.size


def ggml_backend_buffer_get_alignment(buf: Buffer) -> int:
    return buf.buft.alignment


def ggml_backend_buffer_get_max_size(buf: Buffer) -> int:
    return buf.buft.max_size


def ggml_backend_buffer_get_alloc_size(buf: Buffer, t: Tensor) -> int:
    return buf.buft.alloc_size(t)


def ggml_backend_buffer_get_type(buf: Buffer) -> BufferType:
    return buf.buft


def ggml_backend_buffer_is_host(buf: Buffer) -> bool:
    return buf.buft.is_host


def ggml_backend_buffer_set_usage(buf: Buffer, usage: int) -> None:
    buf.usage = usage


def ggml_backend_buffer_get_usage(buf: Buffer) -> int:
    return buf.usage


def ggml_backend_buffer_clear(buf: Buffer, value: int) -> None:
    buf.pool[:buf.size] = value & 0xFF


def ggml_backend_buffer_reset(buf: Buffer) -> None:
    """The CPU buffer has no per-tensor state to drop."""


def ggml_backend_buffer_init_tensor(buf: Buffer, t: Tensor) -> int:
    """The CPU buffer has no per-tensor setup (no init_tensor callback): success."""
    return 0


def ggml_backend_buffer_free(buf: Buffer | None) -> None:
    if buf is None or buf.freed:
        return
    buf.freed = True
    buf.space.remove(buf)
    buf.space.remove(buf.struct)
    _BUFFERS.pop(buf.address, None)


def ggml_backend_cpu_buffer_from_ptr(data: np.ndarray | bytearray, size: int) -> Buffer:
    """A CPU buffer over memory the caller owns (ggml asserts the pointer is aligned)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    ggml_assert(arr.size >= size, "size <= sizeof(ptr)", "ggml_backend_cpu_buffer_from_ptr")
    return Buffer(_CPU_BUFT, size, arr[:size])


# --- tensors in buffers -----------------------------------------------------------------------

def ggml_backend_tensor_alloc(buf: Buffer, t: Tensor, addr: int) -> int:
    """Place t at address addr of buffer buf: sets t->buffer and t->data."""
    ggml_assert(buffer_field(t) == 0, "tensor->buffer == NULL", "ggml_backend_tensor_alloc")
    ggml_assert(t.data is None, "tensor->data == NULL", "ggml_backend_tensor_alloc")
    ggml_assert(t.view_src is None, "tensor->view_src == NULL", "ggml_backend_tensor_alloc")
    ggml_assert(buf.base <= addr <= buf.base + buf.size - buf.buft.alloc_size(t),
                "(char *)addr + ggml_backend_buffer_get_alloc_size(buffer, tensor) <= "
                "(char *)ggml_backend_buffer_get_base(buffer) + ggml_backend_buffer_get_size(buffer)",
                "ggml_backend_tensor_alloc")
    t._r["buffer"] = buf.address
    t.data = addr
    return ggml_backend_buffer_init_tensor(buf, t)


def ggml_backend_view_init(t: Tensor) -> int:
    """A view gets its view_src's buffer and data + view_offs."""
    vs = t.view_src
    ggml_assert(buffer_field(t) == 0, "tensor->buffer == NULL", "ggml_backend_view_init")
    ggml_assert(vs is not None, "tensor->view_src != NULL", "ggml_backend_view_init")
    ggml_assert(buffer_field(vs) != 0, "tensor->view_src->buffer != NULL", "ggml_backend_view_init")
    ggml_assert(vs.data is not None, "tensor->view_src->data != NULL", "ggml_backend_view_init")
    t._r["buffer"] = buffer_field(vs)
    t.data = vs.data + t.view_offs
    return 0


def _tensor_bytes(t: Tensor, offset: int, size: int, fn: str) -> np.ndarray:
    buf = tensor_buffer(t)
    ggml_assert(buf is not None, "buf != NULL && \"tensor buffer not set\"", fn)
    ggml_assert(t.data is not None, "tensor->data != NULL && \"tensor not allocated\"", fn)
    ggml_assert(offset + size <= ggml_nbytes(t), "offset + size <= ggml_nbytes(tensor) && \"tensor write out of bounds\""
                if fn != "ggml_backend_tensor_get" else
                "offset + size <= ggml_nbytes(tensor) && \"tensor read out of bounds\"", fn)
    start = t.data - buf.base + offset
    return buf.pool[start:start + size]


def ggml_backend_tensor_set(t: Tensor, data: bytes | np.ndarray, offset: int, size: int) -> None:
    if size == 0:
        return
    src = np.frombuffer(data if not isinstance(data, np.ndarray) else np.ascontiguousarray(data).tobytes(),
                        dtype=np.uint8)
    _tensor_bytes(t, offset, size, "ggml_backend_tensor_set")[:] = src[:size]


def ggml_backend_tensor_get(t: Tensor, offset: int, size: int) -> bytes:
    if size == 0:
        return b""
    return _tensor_bytes(t, offset, size, "ggml_backend_tensor_get").tobytes()


def ggml_backend_tensor_memset(t: Tensor, value: int, offset: int, size: int) -> None:
    if size == 0:
        return
    _tensor_bytes(t, offset, size, "ggml_backend_tensor_memset")[:] = value & 0xFF


# --- the CPU backend --------------------------------------------------------------------------

class Backend:
    """struct ggml_backend for the CPU: a thread count and a work buffer that grows when needed."""

    def __init__(self) -> None:
        self.n_threads = 4  # GGML_DEFAULT_N_THREADS
        self.work: Buffer | None = None
        self.freed = False

    def __repr__(self) -> str:
        return f"<ggml_backend CPU n_threads={self.n_threads}>"


def ggml_backend_cpu_init() -> Backend:
    return Backend()


def ggml_backend_name(backend: Backend) -> str:
    return "CPU"


def ggml_backend_is_cpu(backend: Backend | None) -> bool:
    return isinstance(backend, Backend)


def ggml_backend_cpu_set_n_threads(backend: Backend, n_threads: int) -> None:
    backend.n_threads = n_threads


def ggml_backend_get_default_buffer_type(backend: Backend) -> BufferType:
    return _CPU_BUFT


def ggml_backend_get_alignment(backend: Backend) -> int:
    return _CPU_BUFT.alignment


def ggml_backend_get_max_size(backend: Backend) -> int:
    return _CPU_BUFT.max_size


def ggml_backend_alloc_buffer(backend: Backend, size: int) -> Buffer:
    return ggml_backend_buft_alloc_buffer(_CPU_BUFT, size)


def ggml_backend_graph_compute(backend: Backend, cgraph) -> int:
    """Plan with the backend's thread count, grow its work buffer if needed, compute."""
    from engine.compute.plan import ggml_graph_plan
    from engine.compute.threadpool import ggml_graph_compute
    cplan = ggml_graph_plan(cgraph, backend.n_threads)
    if cplan.work_size > 0:
        if backend.work is None or backend.work.size < cplan.work_size:
            ggml_backend_buffer_free(backend.work)
            backend.work = Buffer(_CPU_BUFT, cplan.work_size)
        cplan.work_data = backend.work.base
    return ggml_graph_compute(cgraph, cplan)


def ggml_backend_graph_compute_async(backend: Backend, cgraph) -> int:
    return ggml_backend_graph_compute(backend, cgraph)


def ggml_backend_synchronize(backend: Backend) -> None:
    """The CPU backend computes synchronously: nothing to wait for."""


def ggml_backend_free(backend: Backend | None) -> None:
    if backend is not None:
        ggml_backend_buffer_free(backend.work)
        backend.freed = True


def ggml_backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy src's bytes into dst (same layout); a no-op when they are the same tensor."""
    ggml_assert(ggml_nbytes(src) == ggml_nbytes(dst) and src.type == dst.type
                and list(src.ne) == list(dst.ne) and list(src.nb) == list(dst.nb),
                "ggml_are_same_layout(src, dst) && \"cannot copy tensors with different layouts\"",
                "ggml_backend_tensor_copy")
    if src == dst:
        return
    n = ggml_nbytes(src)
    ggml_backend_tensor_set(dst, ggml_backend_tensor_get(src, 0, n), 0, n)


def ggml_backend_tensor_set_async(backend: Backend, t: Tensor, data, offset: int, size: int) -> None:
    """The CPU backend has no set_tensor_async: the synchronous copy."""
    ggml_backend_tensor_set(t, data, offset, size)


def ggml_backend_tensor_get_async(backend: Backend, t: Tensor, offset: int, size: int) -> bytes:
    return ggml_backend_tensor_get(t, offset, size)


def ggml_backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    ggml_backend_tensor_copy(src, dst)


CPU_GUID = bytes([0xaa, 0x67, 0xc7, 0x43, 0x96, 0xe6, 0xa3, 0x8a, 0xe3, 0xaf, 0xea, 0x92, 0x36, 0xbc, 0xfc, 0x89])


def ggml_backend_guid(backend: Backend) -> bytes:
    """The CPU backend's 16-byte guid (ggml_backend_cpu_guid)."""
    return CPU_GUID


# --- devices and the registry: one registry ("CPU") with one device ---------------------------

GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3


def _host_cpu_description() -> str:
    """What ggml-cpu reports on Linux: the first "model name" of /proc/cpuinfo, trimmed."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


class Device:
    """struct ggml_backend_device for the CPU."""

    def __init__(self, reg: "Registry") -> None:
        self.reg = reg
        self.name = "CPU"
        self.description = _host_cpu_description()
        self.type = GGML_BACKEND_DEVICE_TYPE_CPU

    def __repr__(self) -> str:
        return f"<ggml_backend_device {self.name}: {self.description}>"


class Registry:
    """struct ggml_backend_reg for the CPU: its devices."""

    def __init__(self) -> None:
        self.name = "CPU"
        self.devices = [Device(self)]

    def __repr__(self) -> str:
        return f"<ggml_backend_reg {self.name} devices={len(self.devices)}>"


_CPU_REG = Registry()
_REGS = [_CPU_REG]


def ggml_backend_cpu_reg() -> Registry:
    return _CPU_REG


def ggml_backend_reg_count() -> int:
    return len(_REGS)


def ggml_backend_reg_get(index: int) -> Registry:
    ggml_assert(0 <= index < len(_REGS), "index < ggml_backend_reg_count()", "ggml_backend_reg_get")
    return _REGS[index]


def ggml_backend_reg_by_name(name: str) -> Registry | None:
    return next((r for r in _REGS if r.name.lower() == str(name).lower()), None)


def ggml_backend_reg_name(reg: Registry) -> str:
    return reg.name


def ggml_backend_reg_dev_count(reg: Registry) -> int:
    return len(reg.devices)


def ggml_backend_reg_dev_get(reg: Registry, index: int) -> Device:
    return reg.devices[index]


def ggml_backend_dev_count() -> int:
    return sum(len(r.devices) for r in _REGS)


def ggml_backend_dev_get(index: int) -> Device:
    devs = [d for r in _REGS for d in r.devices]
    ggml_assert(0 <= index < len(devs), "index < ggml_backend_dev_count()", "ggml_backend_dev_get")
    return devs[index]


def ggml_backend_dev_by_name(name: str) -> Device | None:
    return next((d for r in _REGS for d in r.devices if d.name.lower() == str(name).lower()), None)


def ggml_backend_dev_by_type(type_: int) -> Device | None:
    return next((d for r in _REGS for d in r.devices if d.type == type_), None)


def ggml_backend_dev_name(dev: Device) -> str:
    return dev.name


def ggml_backend_dev_description(dev: Device) -> str:
    return dev.description


def ggml_backend_dev_type(dev: Device) -> int:
    return dev.type


def ggml_backend_dev_backend_reg(dev: Device) -> Registry:
    return dev.reg


def ggml_backend_dev_buffer_type(dev: Device) -> BufferType:
    return _CPU_BUFT


def ggml_backend_dev_init(dev: Device, params: str | None = None) -> Backend:
    return ggml_backend_cpu_init()


def ggml_backend_dev_supports_buft(dev: Device, buft: BufferType) -> bool:
    """The CPU device uses host buffers."""
    return buft.is_host


def ggml_backend_dev_buffer_from_host_ptr(dev: Device, data, size: int, max_tensor_size: int = 0) -> Buffer:
    return ggml_backend_cpu_buffer_from_ptr(data, size)


def ggml_backend_get_device(backend: Backend) -> Device:
    return _CPU_REG.devices[0]


def ggml_backend_buft_get_device(buft: BufferType) -> Device:
    return _CPU_REG.devices[0]


def ggml_backend_supports_buft(backend: Backend, buft: BufferType) -> bool:
    return ggml_backend_dev_supports_buft(ggml_backend_get_device(backend), buft)


def ggml_backend_init_by_name(name: str, params: str | None = None) -> Backend | None:
    dev = ggml_backend_dev_by_name(name)
    return None if dev is None else ggml_backend_dev_init(dev, params)


def ggml_backend_init_by_type(type_: int, params: str | None = None) -> Backend | None:
    dev = ggml_backend_dev_by_type(type_)
    return None if dev is None else ggml_backend_dev_init(dev, params)


def ggml_backend_init_best() -> Backend | None:
    """A GPU, else an integrated GPU, else the CPU: here always the CPU."""
    dev = (ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU) or ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU)
           or ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU))
    return None if dev is None else ggml_backend_dev_init(dev, None)


def ggml_backend_load_all() -> str:
    """Loads nothing: the engine has one backend, the CPU, built in (real ggml scans for
    libggml-*.so backends here)."""
    return "ggml_backend_load_all: the engine has only its built-in CPU backend; nothing to load"


# --- graph plans ------------------------------------------------------------------------------

class GraphPlan:
    """ggml_backend_graph_plan_t of the CPU backend: a cplan and its work buffer for one graph."""

    def __init__(self, backend: Backend, cgraph) -> None:
        from engine.compute.plan import ggml_graph_plan
        self.cgraph = cgraph
        self.cplan = ggml_graph_plan(cgraph, backend.n_threads)
        self.work = Buffer(_CPU_BUFT, self.cplan.work_size) if self.cplan.work_size > 0 else None
        if self.work is not None:
            self.cplan.work_data = self.work.base


def ggml_backend_graph_plan_create(backend: Backend, cgraph) -> GraphPlan:
    return GraphPlan(backend, cgraph)


def ggml_backend_graph_plan_compute(backend: Backend, plan: GraphPlan) -> int:
    from engine.compute.threadpool import ggml_graph_compute
    return ggml_graph_compute(plan.cgraph, plan.cplan)


def ggml_backend_graph_plan_free(backend: Backend, plan: GraphPlan) -> None:
    ggml_backend_buffer_free(plan.work)
    plan.work = None
