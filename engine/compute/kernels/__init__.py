"""The kernel dispatch table: one `compute_forward_<op>(params, dst)` per op, found by op.

Mirrors the switch in ggml_compute_forward (ggml-cpu.c). Kernel modules register themselves with
`@kernel(GGMLOp.X)`; every op of the table has a kernel, is a view op (VIEW_OPS: nothing to compute),
or has an entry in NOT_SUPPORTED saying why (tests/unit/engine/test_kernels.py holds this), and a
kernel that meets a type combination it does not handle raises GGMLNotSupportedError: never a silent
wrong result.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from engine.core.errors import GGMLNotSupportedError
from engine.core.optable import GGMLOp
from engine.core.types import TYPE_TRAITS

Kernel = Callable[..., None]
KERNELS: dict[int, Kernel] = {}

# ops this engine does not compute, with the reason shown to the user
NOT_SUPPORTED: dict[int, str] = {
    GGMLOp.FLASH_ATTN_BACK: "ggml_flash_attn_back aborts in ggml 0.15.3 before it builds the node "
                            "(\"TODO: adapt to ggml_flash_attn_ext() changes\"), so no graph holds one",
}


def kernel(*ops: GGMLOp) -> Callable[[Kernel], Kernel]:
    """Register a compute_forward_<op> function for these ops."""
    def register(fn: Kernel) -> Kernel:
        for op in ops:
            assert op not in KERNELS, f"two kernels for {op.name}"
            KERNELS[op] = fn
        return fn
    return register


# Ops that compute some of their nodes with a BLAS product instead of ggml's own order of
# operations: such a result agrees with ggml to rounding, and its last bits depend on which
# kernel the CPU's BLAS library picks. op -> does this node take that path? No other kernel's
# bits depend on the CPU: the C library is called as ggml calls it (engine.libm), ggml's own
# arithmetic is emulated with IEEE operations, and numpy's reductions have a fixed order.
BLAS_PATHS: dict[int, Callable[..., bool]] = {}


def uses_blas(*ops: GGMLOp) -> Callable:
    """Register the predicate telling which nodes of these ops take a BLAS product."""
    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        for op in ops:
            BLAS_PATHS[op] = fn
        return fn
    return register


def same_bits_on_every_cpu(dst) -> bool:
    """Does this node's result have the same bits on every CPU (given such inputs)?"""
    takes_blas = BLAS_PATHS.get(dst.op)
    return takes_blas is None or not takes_blas(dst)


def not_supported(dst, why: str = "") -> GGMLNotSupportedError:
    """The error for a node this backend cannot compute: names the op and the types."""
    types = ", ".join(TYPE_TRAITS[s.type].type_name for s in dst.src if s is not None)
    msg = (f"{GGMLOp(dst.op).name} is not supported on this backend "
           f"(dst {TYPE_TRAITS[dst.type].type_name}; src {types or 'none'})")
    return GGMLNotSupportedError(msg + (f": {why}" if why else ""))


def compute_forward(params, dst) -> None:
    """ggml_compute_forward: dispatch a node to its kernel."""
    fn = KERNELS.get(dst.op)
    if fn is None:
        raise not_supported(dst, NOT_SUPPORTED.get(dst.op, "no kernel"))
    fn(params, dst)


for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
