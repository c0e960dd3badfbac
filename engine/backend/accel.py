"""A simulated accelerator: a second backend with memory of its own, as a GPU is to llama.cpp.

Its buffer type is not host memory, so the CPU backend cannot read its tensors and the scheduler
must copy every input that crosses between the two; it declares which ops it runs, its alignment
and its memory size. Its buffers still hold real bytes a learner can inspect, and its graphs are
computed by the engine's kernels (the same bytes a CPU would produce: this is a device for
watching placement and copies, not a model of another chip's arithmetic).

By default it can do what ggml's RPC backend can (every op, no offload_op, 32-byte alignment, no
maximum buffer size), which is how tests/conformance/test_sched.py compares the scheduler with
real ggml running an RPC server on loopback.
"""

from __future__ import annotations

from typing import Callable, Iterable

from engine.backend.buffer import SIZE_MAX, TENSOR_ALIGNMENT, BufferType, live_buffers
from engine.backend.device import (
    GGML_BACKEND_DEVICE_TYPE_GPU,
    VIEW_OPS,
    Backend,
    Device,
    Registry,
    ggml_backend_device_register,
)
from engine.core.api import writes
from engine.core.optable import GGMLOp

_ACCEL_REG = Registry("ACCEL")


def _op_set(ops: Iterable[int | str] | None) -> Callable | None:
    if ops is None:
        return None
    allowed = frozenset(GGMLOp[o] if isinstance(o, str) else GGMLOp(o) for o in ops) | VIEW_OPS
    return lambda op: op.op in allowed


def accel_device(name: str = "ACCEL0", backend_name: str | None = None, *, memory: int = 8 << 30,
                 alignment: int = TENSOR_ALIGNMENT, max_size: int = SIZE_MAX,
                 ops: Iterable[int | str] | None = None, offload_min_batch: int | None = None,
                 description: str = "simulated accelerator") -> Device:
    """A new accelerator device (not registered: see ggml_backend_accel_add_device).

    ops: the ops it supports (names or GGMLOp values; view ops always), None for every op.
    offload_min_batch: like the CUDA backend's offload_op, take over an op whose weights are in
    host memory when its batch (ne[1], ne[2] for MUL_MAT_ID) is at least this; None: never."""
    buft = BufferType(backend_name or name, alignment, max_size, is_host=False)
    supports = _op_set(ops) or (lambda op: True)

    def offload(op) -> bool:
        if offload_min_batch is None:
            return False
        batch = op.ne[2] if op.op == GGMLOp.MUL_MAT_ID else op.ne[1]
        return batch >= offload_min_batch and op.op != GGMLOp.GET_ROWS

    def mem() -> tuple[int, int]:
        used = sum(b.size for b in live_buffers() if b.buft is buft)
        return max(0, memory - used), memory

    return Device(_ACCEL_REG, name, description, GGML_BACKEND_DEVICE_TYPE_GPU, buft,
                  backend_name or name, supports_op=supports, offload_op=offload, memory=mem,
                  guid=name.encode()[:16].ljust(16, b"\0"))


@writes()
def ggml_backend_accel_init(name: str = "ACCEL0", backend_name: str | None = None, **caps) -> Backend:
    """A backend on a new, unregistered accelerator device (as ggml_backend_rpc_init opens a
    backend on a server without registering it)."""
    return Backend(accel_device(name, backend_name, **caps))


@writes()
def ggml_backend_accel_add_device(name: str = "ACCEL0", **caps) -> Device:
    """A new accelerator device, registered: ggml_backend_dev_by_name/by_type and
    ggml_backend_init_best find it (a GPU is preferred over the CPU)."""
    dev = accel_device(name, **caps)
    ggml_backend_device_register(dev)
    return dev
