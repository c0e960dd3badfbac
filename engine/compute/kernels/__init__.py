"""The kernel dispatch table: one `compute_forward_<op>(params, dst)` per op, found by op.

Mirrors the switch in ggml_compute_forward (ggml-cpu.c). Kernel modules register themselves with
`@kernel(GGMLOp.X)`; every op of the table has a kernel, is a view op (VIEW_OPS: nothing to compute),
or has an entry in NOT_SUPPORTED saying why (tests/unit/engine/test_kernels.py holds this), and a
kernel that meets a type combination it does not handle raises GGMLNotSupportedError: never a silent
wrong result.

A kernel declares its own facts where it is registered (KernelInfo), for the planner, the thread
pool and the debugger to read: how many threads ggml plans for its nodes and how big a work buffer
they need (ggml_get_n_tasks and ggml_graph_plan's work-size switch, case by case), whether it waits
at a barrier, whether its numpy holds the interpreter lock, which loop of it runs in C, and which of
its nodes take a BLAS product, e.g. `@kernel(GGMLOp.SOFT_MAX, n_tasks=_soft_max_tasks,
work=f32_row_per_task, barrier=False, in_c=CLoop("soft_max", "ggml_vec_soft_max_f32"))`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from engine.core.errors import GGMLNotSupportedError
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType, TYPE_TRAITS

Prepared = Callable[[], None] | tuple[Callable[[], None], ...]  # what a kernel's prepare makes

Kernel = Callable[..., None]
CACHE_LINE_SIZE = 64  # x86-64: ggml_graph_plan adds one per thread; mul_mat_id pads by it
NTasks = Callable[..., int]  # n_tasks(node, n_threads): how many threads ggml plans for the node
WorkSize = Callable[..., int]  # work(node, n_tasks): the work-buffer bytes the node needs


def all_threads(node, n_threads: int) -> int:
    """n_tasks of most ops: every thread takes a share."""
    return n_threads


def one_thread(node, n_threads: int) -> int:
    """n_tasks of the ops ggml computes on one thread."""
    return 1


def no_work(node, n_tasks: int) -> int:
    """The work size of the ops ggml_graph_plan's switch leaves out: none."""
    return 0


def f32_row_per_task(node, n_tasks: int) -> int:
    """A row of dst as floats per task (SOFT_MAX, ROPE, ROPE_BACK)."""
    return 4 * int(node.ne[0]) * n_tasks


def src0_row_per_task(node, n_tasks: int) -> int:
    """A row of src0 as floats per task when src0 is quantized (dequantized a row at a time:
    ADD, ADD1, ADD_ID, OUT_PROD), else none."""
    if not TYPE_TRAITS[node.source_type(0)].is_quantized:
        return 0
    return 4 * int(node.source(0).ne[0]) * n_tasks


@dataclass(frozen=True, slots=True)
class CLoop:
    """A kernel's inner loop that runs in C (engine._lanes) without the interpreter lock, for its
    F32 nodes (those of one sub-op, when one is named)."""

    lane: str  # the engine._lanes function: "v_silu"
    ggml: str  # ggml's function it mirrors: "ggml_vec_silu_f32"
    sub_op: int | None = None  # the ggml_unary_op or ggml_glu_op (op_params[0]); None: every node


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """A registered kernel, and what it declares of itself for the thread pool and the debugger."""

    fn: Kernel
    n_tasks: NTasks  # ggml_get_n_tasks's case for these ops
    work: WorkSize  # ggml_graph_plan's work-size case (no_work: the switch leaves them out)
    barrier: bool = True  # it may wait at a barrier (False: never, so thread 0 may compute a
    # small node alone, each thread's share in turn)
    alone_when: Callable[..., bool] | None = None  # for a kernel that waits at its barriers only
    # when not params.alone: the nodes thread 0 computes alone when several threads run
    holds_gil: bool = False  # its numpy passes hold the interpreter lock (in_c's loop aside): a
    # second thread would only wait for it, so thread 0 computes its nodes alone at any size
    in_c: CLoop | None = None
    blas: Callable[..., bool] | None = None  # which nodes take a BLAS product instead of ggml's
    # own order of operations: such a result agrees with ggml to rounding, and its last bits
    # depend on which kernel the CPU's BLAS library picks
    prepare: Callable[..., Prepared | None] | None = None  # prepare(params, dst): a ready call
    # (or a tuple of them, run in order) computing the whole node (the same bytes as fn), made
    # once for a graph computed again unwatched (engine.compute.compiled), or None where the
    # node takes fn's path

    def loop_in_c(self, dst) -> CLoop | None:
        """The loop of this node that runs in C (None: its kernel's numpy runs it all)."""
        loop = self.in_c
        if loop is None or dst.type != GGMLType.F32 or (
                loop.sub_op is not None and int(dst.op_params[0]) != loop.sub_op):
            return None
        return loop


KERNELS: dict[int, KernelInfo] = {}

# ops this engine does not compute, with the reason shown to the user
NOT_SUPPORTED: dict[int, str] = {
    GGMLOp.FLASH_ATTN_BACK: "ggml_flash_attn_back aborts in ggml 0.15.3 before it builds the node "
                            "(\"TODO: adapt to ggml_flash_attn_ext() changes\"), so no graph holds one",
}


def kernel(*ops: GGMLOp, n_tasks: NTasks, work: WorkSize, barrier: bool = True,
           alone_when: Callable[..., bool] | None = None, holds_gil: bool = False,
           in_c: CLoop | None = None, blas: bool | Callable[..., bool] = False,
           prepare: Callable[..., Prepared | None] | None = None
           ) -> Callable[[Kernel], Kernel]:
    """Register a compute_forward_<op> function for these ops, with the facts of KernelInfo
    (blas=True: every node takes a BLAS product). Ops of one function that ggml plans apart
    register it once per plan (one decorator per group of ops)."""
    assert not (holds_gil and barrier), "a kernel computed alone at any size waits at no barrier"
    takes_blas = (lambda dst: True) if blas is True else blas or None

    def register(fn: Kernel) -> Kernel:
        for op in ops:
            assert op not in KERNELS, f"two kernels for {op.name}"
            KERNELS[op] = KernelInfo(fn, n_tasks, work, barrier, alone_when, holds_gil, in_c,
                                     takes_blas, prepare)
        return fn
    return register


def calls_of(prepared: Prepared) -> tuple[Callable[[], None], ...]:
    """What a kernel's prepare made, as the calls to run in turn."""
    return prepared if isinstance(prepared, tuple) else (prepared,)


def run_prepared(prepared: Prepared) -> None:
    """Run what a kernel's prepare made: one call, or each of a tuple of calls in turn."""
    for call in calls_of(prepared):
        call()


def same_bits_on_every_cpu(dst) -> bool:
    """Does this node's result have the same bits on every CPU (given such inputs)? Only a BLAS
    product's bits depend on the CPU: the C library is called as ggml calls it (engine.libm),
    ggml's own arithmetic is emulated with IEEE operations, and numpy's reductions have a fixed
    order."""
    info = KERNELS.get(dst.op)
    return info is None or info.blas is None or not info.blas(dst)


def not_supported(dst, why: str = "") -> GGMLNotSupportedError:
    """The error for a node this backend cannot compute: names the op and the types."""
    types = ", ".join(TYPE_TRAITS[s.type].type_name for s in dst.src if s is not None)
    msg = (f"{GGMLOp(dst.op).name} is not supported on this backend "
           f"(dst {TYPE_TRAITS[dst.type].type_name}; src {types or 'none'})")
    return GGMLNotSupportedError(msg + (f": {why}" if why else ""))


def compute_forward(params, dst) -> None:
    """ggml_compute_forward: dispatch a node to its kernel."""
    info = KERNELS.get(dst.op)
    if info is None:
        raise not_supported(dst, NOT_SUPPORTED.get(dst.op, "no kernel"))
    info.fn(params, dst)


for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
