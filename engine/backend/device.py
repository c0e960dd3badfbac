"""ggml-backend's backends, devices and registry: the CPU, and simulated accelerators (accel.py).

A device (`struct ggml_backend_device`) says what it is (name, description, type, memory), which
buffer type it allocates, which ops it can run (`supports_op`), which buffer types it can read
(`supports_buft`) and which ops it wants to take over from the CPU (`offload_op`). A backend
(`struct ggml_backend`) is a device opened for computing: it has a name, a thread count and a
work buffer; every backend here computes with the engine's own kernels.
"""

from __future__ import annotations

import os
from typing import Callable

from engine.backend import repack
from engine.backend.buffer import (
    CPU_BUFT,
    Buffer,
    BufferType,
    ggml_backend_buffer_free,
    ggml_backend_buft_alloc_buffer,
    ggml_backend_cpu_buffer_from_ptr,
    ggml_backend_tensor_copy,
    ggml_backend_tensor_get,
    ggml_backend_tensor_get_2d,
    ggml_backend_tensor_set,
    ggml_backend_tensor_set_2d,
    tensor_buffer,
)
from engine.core.api import query, writes
from engine.core.errors import ggml_assert, ggml_assert_not_null
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType, ggml_is_quantized, traits

GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3

VIEW_OPS = frozenset((GGMLOp.NONE, GGMLOp.RESHAPE, GGMLOp.VIEW, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE))
# type_traits_cpu[].from_float is missing for these: the CPU cannot write them (CPY, SET_ROWS)
NO_FROM_FLOAT = frozenset(GGMLType[n] for n in ("IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"))


def cpu_supports_op(op) -> bool:
    """ggml-cpu's device supports_op: an op reading a tensor of an extra buffer type (among its
    first four sources) is that buffer type's to answer; otherwise everything but a few type
    combinations."""
    kind, src0, src1 = op.op, op.src[0], op.src[1]
    if kind in VIEW_OPS:
        return True
    for i in range(4):
        src = op.src[i]
        buf = tensor_buffer(src) if src is not None else None
        if buf is not None and repack.is_extra_buffer_type(buf.buft):
            return repack.supports_op(op)
    if kind in (GGMLOp.CPY, GGMLOp.SET_ROWS):
        return op.type not in NO_FROM_FLOAT
    if kind == GGMLOp.MUL_MAT:
        return src1.type == GGMLType.F32 or src1.type == traits(src0.type).vec_dot_type
    if kind == GGMLOp.SOFT_MAX_BACK:
        max_bias = op.op_params[:2].view("<f4")[1]
        return src0.type == GGMLType.F32 and src1.type == GGMLType.F32 and max_bias == 0.0
    if kind == GGMLOp.IM2COL_BACK:
        return src0.type == GGMLType.F32 and src1.type == GGMLType.F32
    if kind == GGMLOp.GET_ROWS_BACK:
        return src0.type in (GGMLType.F32, GGMLType.F16)
    if kind == GGMLOp.OUT_PROD:
        return ((src0.type == GGMLType.F32 or (ggml_is_quantized(src0.type) and src0.ne[2] == src1.ne[2]
                                                and src0.ne[3] == src1.ne[3]))
                and src1.type == GGMLType.F32 and op.type == GGMLType.F32)
    return True


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


def _host_memory() -> tuple[int, int]:
    """(free, total): all physical memory, as ggml-cpu reports it on Linux."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return total, total


class Device:
    """struct ggml_backend_device: what a device is and what it can do."""

    def __init__(self, reg: "Registry | None", name: str, description: str, type_: int, buft: BufferType,
                 backend_name: str, supports_op: Callable = cpu_supports_op,
                 offload_op: Callable | None = None, memory: Callable[[], tuple[int, int]] = _host_memory,
                 guid: bytes = b"") -> None:
        self.reg, self.name, self.description, self.type = reg, name, description, type_
        self.buft, self.backend_name, self.guid = buft, backend_name, guid
        self._supports_op, self._offload_op, self._memory = supports_op, offload_op, memory
        buft.device = self

    def supports_op(self, op) -> bool:
        return bool(self._supports_op(op))

    def supports_buft(self, buft: BufferType) -> bool:
        """The CPU reads any host buffer and its extra buffer types; another device only its own
        buffer type."""
        if self.type == GGML_BACKEND_DEVICE_TYPE_CPU:
            return buft.is_host or repack.is_extra_buffer_type(buft)
        return buft is self.buft

    def offload_op(self, op) -> bool:
        return self._offload_op is not None and bool(self._offload_op(op))

    def __repr__(self) -> str:
        return f"<ggml_backend_device {self.name}: {self.description}>"


class Backend:
    """struct ggml_backend: a device opened for computing, with a thread count and a work buffer
    that grows when a graph needs more."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.name = device.backend_name
        self.n_threads = 4  # GGML_DEFAULT_N_THREADS
        self.work: Buffer | None = None
        self.freed = False

    def __repr__(self) -> str:
        return f"<ggml_backend {self.name} n_threads={self.n_threads}>"


class Registry:
    """struct ggml_backend_reg: a named family of devices."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.devices: list[Device] = []

    def __repr__(self) -> str:
        return f"<ggml_backend_reg {self.name} devices={len(self.devices)}>"


CPU_GUID = bytes([0xaa, 0x67, 0xc7, 0x43, 0x96, 0xe6, 0xa3, 0x8a, 0xe3, 0xaf, 0xea, 0x92, 0x36, 0xbc, 0xfc, 0x89])
_CPU_REG = Registry("CPU")
_CPU_DEV = Device(_CPU_REG, "CPU", _host_cpu_description(), GGML_BACKEND_DEVICE_TYPE_CPU, CPU_BUFT, "CPU",
                  guid=CPU_GUID)
_CPU_REG.devices.append(_CPU_DEV)
_REGS = [_CPU_REG]  # accelerators register before the CPU, as ggml registers GPUs first


@writes()
def ggml_backend_register(reg: Registry) -> None:
    """Add a registry (ggml_backend_register); the CPU's stays last."""
    if reg not in _REGS:
        _REGS.insert(len(_REGS) - 1, reg)


@writes()
def ggml_backend_device_register(dev: Device) -> None:
    """Add a device to its registry (ggml_backend_device_register)."""
    reg = ggml_assert_not_null(dev.reg, "device->reg != NULL", "ggml_backend_device_register")
    if dev not in reg.devices:
        reg.devices.append(dev)
    ggml_backend_register(reg)


# --- the backend object -----------------------------------------------------------------------

@writes()
def ggml_backend_cpu_init() -> Backend:
    return Backend(_CPU_DEV)


@query
def ggml_backend_name(backend: Backend) -> str:
    return backend.name


@query
def ggml_backend_is_cpu(backend: Backend | None) -> bool:
    return isinstance(backend, Backend) and backend.device is _CPU_DEV


@writes()
def ggml_backend_cpu_set_n_threads(backend: Backend, n_threads: int) -> None:
    ggml_assert(ggml_backend_is_cpu(backend), "ggml_backend_is_cpu(backend_cpu)", "ggml_backend_cpu_set_n_threads")
    backend.n_threads = n_threads


@query
def ggml_backend_get_default_buffer_type(backend: Backend) -> BufferType:
    return backend.device.buft


@query
def ggml_backend_get_alignment(backend: Backend) -> int:
    return backend.device.buft.alignment


@query
def ggml_backend_get_max_size(backend: Backend) -> int:
    return backend.device.buft.max_size


@writes()
def ggml_backend_alloc_buffer(backend: Backend, size: int) -> Buffer:
    return ggml_backend_buft_alloc_buffer(backend.device.buft, size)


@writes()
def ggml_backend_graph_compute_async(backend: Backend, cgraph) -> int:
    """Plan with the backend's thread count, grow its work buffer if needed, compute (every
    backend here computes with the engine's kernels, synchronously)."""
    from engine.compute.plan import ggml_graph_plan
    from engine.compute.threadpool import ggml_graph_compute
    cplan = ggml_graph_plan(cgraph, backend.n_threads)
    if cplan.work_size > 0:
        if backend.work is None or backend.work.size < cplan.work_size:
            ggml_backend_buffer_free(backend.work)
            backend.work = Buffer(CPU_BUFT, cplan.work_size)
            backend.work.is_work = True  # scratch the kernels write (converted rows)
        cplan.work_data = backend.work.base
    return ggml_graph_compute(cgraph, cplan)


@writes()
def ggml_backend_graph_compute(backend: Backend, cgraph) -> int:
    status = ggml_backend_graph_compute_async(backend, cgraph)
    ggml_backend_synchronize(backend)
    return status


@writes()
def ggml_backend_synchronize(backend: Backend) -> None:
    """Every backend here finishes its work before returning: nothing to wait for."""


@writes()
def ggml_backend_free(backend: Backend | None) -> None:
    if backend is not None:
        ggml_backend_buffer_free(backend.work)
        backend.freed = True


@query
def ggml_backend_supports_op(backend: Backend, op) -> bool:
    return backend.device.supports_op(op)


@query
def ggml_backend_supports_buft(backend: Backend, buft: BufferType) -> bool:
    return backend.device.supports_buft(buft)


@query
def ggml_backend_offload_op(backend: Backend, op) -> bool:
    return backend.device.offload_op(op)


@writes()
def ggml_backend_tensor_set_async(backend: Backend, t, data, offset: int, size: int) -> None:
    """No backend here has set_tensor_async: the synchronous copy."""
    ggml_backend_tensor_set(t, data, offset, size)


@query
def ggml_backend_tensor_get_async(backend: Backend, t, offset: int, size: int) -> bytes:
    return ggml_backend_tensor_get(t, offset, size)


@writes()
def ggml_backend_tensor_set_2d_async(backend: Backend, t, data, offset: int, size: int, n_copies: int,
                                     stride_tensor: int, stride_data: int) -> None:
    ggml_backend_tensor_set_2d(t, data, offset, size, n_copies, stride_tensor, stride_data)


@query
def ggml_backend_tensor_get_2d_async(backend: Backend, t, offset: int, size: int, n_copies: int,
                                     stride_tensor: int, stride_data: int) -> bytes:
    return ggml_backend_tensor_get_2d(t, offset, size, n_copies, stride_tensor, stride_data)


@writes()
def ggml_backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src, dst) -> None:
    ggml_backend_tensor_copy(src, dst)


@query
def ggml_backend_guid(backend: Backend) -> bytes:
    """The backend's 16-byte guid (the CPU's is ggml_backend_cpu_guid)."""
    return backend.device.guid


# --- events: no device here has any (caps.events is false), as for ggml's CPU -----------------

@writes()
def ggml_backend_event_new(device: Device) -> None:
    """NULL: the device has no event_new."""
    return None


@writes()
def ggml_backend_event_free(event) -> None:
    """Nothing to release."""


@writes()
def ggml_backend_event_record(event: object, backend: Backend) -> None:
    ggml_assert(event is not None, "event", "ggml_backend_event_record")


@writes()
def ggml_backend_event_synchronize(event: object) -> None:
    ggml_assert(event is not None, "event", "ggml_backend_event_synchronize")


@writes()
def ggml_backend_event_wait(backend: Backend, event: object) -> None:
    ggml_assert(event is not None, "event", "ggml_backend_event_wait")


# --- devices and the registry ------------------------------------------------------------------

@writes()
def ggml_backend_cpu_reg() -> Registry:
    return _CPU_REG


@query
def ggml_backend_reg_count() -> int:
    return len(_REGS)


@query
def ggml_backend_reg_get(index: int) -> Registry:
    ggml_assert(0 <= index < len(_REGS), "index < ggml_backend_reg_count()", "ggml_backend_reg_get")
    return _REGS[index]


@query
def ggml_backend_reg_by_name(name: str) -> Registry | None:
    return next((r for r in _REGS if r.name.lower() == str(name).lower()), None)


@query
def ggml_backend_reg_name(reg: Registry) -> str:
    return reg.name


@query
def ggml_backend_reg_dev_count(reg: Registry) -> int:
    return len(reg.devices)


@query
def ggml_backend_reg_dev_get(reg: Registry, index: int) -> Device:
    ggml_assert(0 <= index < len(reg.devices), "index < ggml_backend_reg_dev_count(reg)", "ggml_backend_reg_dev_get")
    return reg.devices[index]


def _devices() -> list[Device]:
    return [d for r in _REGS for d in r.devices]


@query
def ggml_backend_dev_count() -> int:
    return len(_devices())


@query
def ggml_backend_dev_get(index: int) -> Device:
    devs = _devices()
    ggml_assert(0 <= index < len(devs), "index < ggml_backend_dev_count()", "ggml_backend_dev_get")
    return devs[index]


@query
def ggml_backend_dev_by_name(name: str) -> Device | None:
    return next((d for d in _devices() if d.name.lower() == str(name).lower()), None)


@query
def ggml_backend_dev_by_type(type_: int) -> Device | None:
    return next((d for d in _devices() if d.type == type_), None)


@query
def ggml_backend_dev_name(dev: Device) -> str:
    return dev.name


@query
def ggml_backend_dev_description(dev: Device) -> str:
    return dev.description


@query
def ggml_backend_dev_type(dev: Device) -> int:
    return dev.type


@query
def ggml_backend_dev_memory(dev: Device) -> tuple[int, int]:
    """(free, total) bytes (C writes them through two pointers)."""
    return dev._memory()


class DeviceProps:
    """struct ggml_backend_dev_props (caps: no async, no host buffer, no events on any device here;
    buffer_from_host_ptr only on the CPU)."""

    def __init__(self, dev: Device) -> None:
        self.name, self.description, self.type = dev.name, dev.description, dev.type
        self.memory_free, self.memory_total = dev._memory()
        is_cpu = dev.type == GGML_BACKEND_DEVICE_TYPE_CPU
        self.caps_async, self.caps_host_buffer, self.caps_events = False, False, False
        self.caps_buffer_from_host_ptr = is_cpu


@query
def ggml_backend_dev_get_props(dev: Device) -> DeviceProps:
    return DeviceProps(dev)


@query
def ggml_backend_dev_backend_reg(dev: Device) -> Registry | None:
    return dev.reg


@query
def ggml_backend_dev_buffer_type(dev: Device) -> BufferType:
    return dev.buft


@query
def ggml_backend_dev_host_buffer_type(dev: Device) -> BufferType | None:
    """None: no device here has a pinned host buffer type (ggml's CPU has none either)."""
    return None


@query
def ggml_backend_dev_init(dev: Device, params: str | None = None) -> Backend:
    return Backend(dev)


@query
def ggml_backend_dev_supports_op(dev: Device, op) -> bool:
    return dev.supports_op(op)


@query
def ggml_backend_dev_supports_buft(dev: Device, buft: BufferType) -> bool:
    return dev.supports_buft(buft)


@query
def ggml_backend_dev_offload_op(dev: Device, op) -> bool:
    return dev.offload_op(op)


@query
def ggml_backend_dev_buffer_from_host_ptr(dev: Device, data, size: int, max_tensor_size: int = 0) -> Buffer:
    ggml_assert(dev.type == GGML_BACKEND_DEVICE_TYPE_CPU, "device->iface.buffer_from_host_ptr != NULL",
                "ggml_backend_dev_buffer_from_host_ptr")
    return ggml_backend_cpu_buffer_from_ptr(data, size)


@query
def ggml_backend_get_device(backend: Backend) -> Device:
    return backend.device


@query
def ggml_backend_buft_get_device(buft: BufferType) -> Device | None:
    return buft.device


@writes()
def ggml_backend_init_by_name(name: str, params: str | None = None) -> Backend | None:
    dev = ggml_backend_dev_by_name(name)
    return None if dev is None else ggml_backend_dev_init(dev, params)


@writes()
def ggml_backend_init_by_type(type_: int, params: str | None = None) -> Backend | None:
    dev = ggml_backend_dev_by_type(type_)
    return None if dev is None else ggml_backend_dev_init(dev, params)


@writes()
def ggml_backend_init_best() -> Backend | None:
    """A GPU, else an integrated GPU, else the CPU."""
    dev = (ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU)
           or ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU)
           or ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU))
    return None if dev is None else ggml_backend_dev_init(dev, None)


@writes()
def ggml_backend_load_all() -> str:
    """Loads nothing: the engine's backends are built in (real ggml scans for libggml-*.so here)."""
    return "ggml_backend_load_all: the engine's backends are built in; nothing to load"


# --- graph plans ------------------------------------------------------------------------------

class GraphPlan:
    """ggml_backend_graph_plan_t: a cplan and its work buffer for one graph."""

    def __init__(self, backend: Backend, cgraph) -> None:
        from engine.compute.plan import ggml_graph_plan
        self.cgraph = cgraph
        self.cplan = ggml_graph_plan(cgraph, backend.n_threads)
        self.work = Buffer(CPU_BUFT, self.cplan.work_size) if self.cplan.work_size > 0 else None
        if self.work is not None:
            self.work.is_work = True
            self.cplan.work_data = self.work.base


@writes()
def ggml_backend_graph_plan_create(backend: Backend, cgraph) -> GraphPlan:
    return GraphPlan(backend, cgraph)


@writes()
def ggml_backend_graph_plan_compute(backend: Backend, plan: GraphPlan) -> int:
    from engine.compute.threadpool import ggml_graph_compute
    return ggml_graph_compute(plan.cgraph, plan.cplan)


@writes()
def ggml_backend_graph_plan_free(backend: Backend, plan: GraphPlan) -> None:
    ggml_backend_buffer_free(plan.work)
    plan.work = None


@query
def ggml_backend_reg_get_proc_address(reg: Registry, name: str):
    """The functions a registry hands out by name (the CPU's: set_n_threads, numa, threadpools);
    None for any other name, as in ggml."""
    if reg is not _CPU_REG:
        return None
    from engine.compute import cpu_api
    procs = {"ggml_backend_set_n_threads": ggml_backend_cpu_set_n_threads,
             "ggml_backend_dev_get_extra_bufts": repack.ggml_backend_dev_get_extra_bufts,
             "ggml_backend_cpu_numa_init": cpu_api.ggml_numa_init,
             "ggml_backend_cpu_is_numa": cpu_api.ggml_is_numa,
             "ggml_threadpool_new": cpu_api.ggml_threadpool_new,
             "ggml_threadpool_free": cpu_api.ggml_threadpool_free}
    return procs.get(name.decode() if isinstance(name, bytes) else name)
