"""ggml_graph_compute: real OS threads walk the node list together, meeting at a barrier per node.

Mirrors ggml_graph_compute / ggml_graph_compute_thread in ggml-cpu.c: thread `ith` of `nth` runs its
share of every node (how it splits a node is the kernel's business), view ops are skipped without a
barrier, thread 0 polls the abort callback after each node, and everyone meets at a barrier before
the next. The pool persists across graphs (the calling thread is worker 0), like a ggml threadpool.

One liberty, for speed: Python threads share one interpreter lock, so waking a second thread for
a node of a few thousand elements costs more than the node. Small nodes of ops whose kernels never
wait at a barrier (registered with barrier=False: engine.compute.kernels.KernelInfo) are computed
by thread 0 alone, each thread's share in turn: the same shares and the same bytes, which the
observer and the trace see as before.

Unwatched (no observer), a graph computed again runs prepared steps (engine.compute.compiled): a
node whose kernel registered `prepare=` is one ready call, made once from the structs, run by
thread 0 while the others wait at the next barrier; its C loop shares the rows out between the
compute's threads in C (engine/c/pool.c), so Python threads and C threads never compete for
the cores. When every node is a ready call (or skipped) and nobody is told of nodes, the calling
thread runs them all and no Python thread is woken. Watched, every node takes its kernel's
general path, thread by thread, as below.

An observer with the shape of ggml's eval callback (`observer(node, ask)`: asked before a node with
ask=True, told after with ask=False; returning False after a node stops the run) also receives every
thread's share of the node: which rows or chunks it computed, and how long it took.
"""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from engine.compute.compiled import remembered
from engine.compute.plan import CPlan, ggml_graph_plan
from engine.compute.shares import ShareKind, ShareRange, ThreadShare
from engine.core.api import writes
from engine.core.context import Context, ggml_new_buffer
from engine.core.errors import ggml_assert, ggml_assert_not_null
from engine.core.graph import Graph
from engine.core.notes import Note
from engine.core.optable import VIEW_OPS
from engine.core.tensor import GGML_TENSOR_FLAG_COMPUTE, Tensor, ggml_is_empty, ggml_nelements

GGML_STATUS_SUCCESS = 0
GGML_STATUS_ABORTED = 1


@dataclass(slots=True)
class ComputeParams:
    """struct ggml_compute_params: who this thread is, and the shared work buffer."""

    ith: int
    nth: int
    wsize: int
    wdata: np.ndarray | None  # the whole work buffer (uint8), shared by all threads
    barrier: Callable[[], None]
    shared: dict  # per-node state shared by the threads (e.g. mul_mat's chunk counter)
    use_ref: bool = False
    llamafile: bool = False  # GGML_USE_LLAMAFILE (engine.compute.plan.llamafile_build)
    alone: bool = False  # thread 0 runs every share in turn (ith order); barrier() must not be called
    watched: bool = True  # an observer is shown each share: a kernel may skip recording one when not
    cores: int = 1  # the compute's thread count (nth is 1 when thread 0 computes a node in one share)
    tiled: bool = False  # GGML_CPU_TILED_MM (engine.compute.plan.tiled_build)
    _kind: ShareKind = ShareKind.IDLE
    _ranges: list[ShareRange] = field(default_factory=list)
    _notes: tuple[Note, ...] = ()

    @property
    def c_threads(self) -> int:
        """How many threads this share's C loop may share its rows with: the compute's when the
        share is the whole node (a prepared call), else one (the other threads have shares of
        their own)."""
        return self.cores if self.nth == 1 else 1

    def took(self, kind: ShareKind, *ranges: ShareRange,
             note: Note | tuple[Note, ...] = ()) -> None:
        """Record this thread's share of the current node (for the observer), and a note (or
        notes) on how the kernel split it."""
        self._kind = kind
        self._ranges.extend(ranges)
        if note:
            self._notes = (note,) if isinstance(note, Note) else note


Observer = Callable[..., bool]

# an observer for every graph computed in this context (the tracer sets it), unless one is passed
COMPUTE_OBSERVER: contextvars.ContextVar[Observer | None] = contextvars.ContextVar(
    "compute_observer", default=None)


class _Pool:
    """Persistent workers: run(fn, n) calls fn(ith) for ith in 1..n-1 on workers, 0 here."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._size = 0
        self._lock = threading.Lock()

    def run_here(self, calls: list[Callable[[], None]]) -> None:
        """Run ready calls in order on this thread, the workers left asleep (one graph at a
        time here too: two graphs computed at once would share the work buffer)."""
        with self._lock, np.errstate(all="ignore"):
            for call in calls:
                call()

    def run(self, fn: Callable[[int], None], n: int) -> None:
        with self._lock:  # one graph at a time per pool, as with a ggml threadpool
            if n - 1 > self._size:
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                self._executor = ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="ggml")
                self._size = n - 1
            futures = []
            if n > 1:
                executor = self._executor
                assert executor is not None  # (made above for at least n - 1 workers)
                futures = [executor.submit(fn, ith) for ith in range(1, n)]
            error = None
            try:
                fn(0)
            except BaseException as e:  # noqa: BLE001 - re-raised below after the others stop
                error = e
            for f in futures:
                try:
                    f.result()
                except BaseException as e:  # noqa: BLE001
                    error = error or e
            if error is not None:
                raise error


_POOL = _Pool()
# numpy's BLAS starts threads of its own (OpenBLAS: one per core). In this process it runs on the
# calling thread alone: a compute's n_threads threads are all the threads it uses, so a BLAS call
# of one thread's share must not wake more threads to fight the other shares for the cores (and
# "1 thread" means one). Set once here, at import: a learner's program runs in a sandbox that
# refuses the foreign-function calls that setting it takes.
threadpool_limits(limits=1, user_api="blas")


class _Run:
    """The state all threads share while computing one graph."""

    def __init__(self, cgraph: Graph, cplan: CPlan, observer: Observer | None) -> None:
        from engine.compute.kernels import compute_forward

        self.compute_forward = compute_forward
        self.nodes = cgraph.nodes
        self.cplan = cplan
        self.nth = cplan.n_threads
        self.observer = observer
        self.barrier = threading.Barrier(self.nth)
        self.stopping = False  # set by thread 0 (observer or abort callback); read after barriers
        self.status = GGML_STATUS_SUCCESS
        self.wdata = None
        if cplan.work_size > 0:
            work_data = ggml_assert_not_null(cplan.work_data, "cplan->work_size == 0 || cplan->work_data != NULL",
                                             "ggml_graph_compute")
            ctx, off = cgraph.ctx.space.resolve(work_data)
            self.wdata = ctx.pool[off:off + cplan.work_size]
        key = ("steps", self.nth, observer is not None, cplan.abort_callback is not None,
               cplan.llamafile, cplan.tiled, cplan.use_ref, cplan.work_data, cplan.work_size)
        self.steps, self.calls = remembered(cgraph, key, self._prepare_all)
        # what each node's threads share and did (not made when every node is one ready call)
        self.shared: list[dict] = [] if self.calls is not None else [{} for _ in self.nodes]
        self.shares: list[list[ThreadShare | None]] = [] if self.calls is not None else \
            [[None] * self.nth for _ in self.nodes]

    def _prepare_all(self) -> tuple[list[tuple[str, tuple | None]], list | None]:
        """Every node's step, and, when each node is skipped or one ready call and nobody is
        told of nodes (no observer, no abort callback), those calls alone in order: the calling
        thread runs them (_Pool.run_here), no other thread has anything to do."""
        steps = [self._prepare(node) for node in self.nodes]
        alone = self.cplan.abort_callback is None and all(
            mode is _SKIP or mode is _PREPARED for mode, _calls in steps)
        return steps, [call for mode, calls in steps if mode is _PREPARED and calls is not None
                       for call in calls] if alone else None

    def _prepare(self, node: Tensor) -> tuple[str, tuple[Callable[[], None], ...] | None]:
        """How a node is computed (node_mode), and, unwatched, its kernel's prepared calls for the
        whole node, run in order (thread 0 runs them; their C loops share the rows out between
        the compute's threads)."""
        from engine.compute.kernels import KERNELS, calls_of

        mode = node_mode(node, self.nth)
        info = KERNELS.get(node.op)
        if mode is _SKIP or self.observer is not None or info is None or info.prepare is None \
                or ggml_is_empty(node):
            return mode, None
        params = ComputeParams(0, 1, self.cplan.work_size, self.wdata, _no_barrier, {},
                               self.cplan.use_ref, self.cplan.llamafile, alone=True, watched=False,
                               cores=self.nth, tiled=self.cplan.tiled)
        call = info.prepare(params, node)  # (None, a call, or a tuple of calls)
        if call is None:
            return mode, None
        return _PREPARED, calls_of(call)

    def wait(self) -> None:
        if self.nth > 1:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                raise RuntimeError("another compute thread failed") from None

    def thread(self, ith: int) -> None:
        try:
            with np.errstate(all="ignore"):  # (the kernels compute IEEE results: inf, nan)
                self._loop(ith)
        except BaseException:
            self.barrier.abort()
            raise

    def _loop(self, ith: int) -> None:
        pending = False  # thread 0 has computed small nodes alone since the last barrier
        told = self.observer is not None or self.cplan.abort_callback is not None
        for node_n, (mode, calls) in enumerate(self.steps):
            if mode is _SKIP:
                continue  # nothing to compute, and no barrier
            node = self.nodes[node_n]
            if mode is _PREPARED:
                if ith == 0 and not self.stopping:
                    for call in calls:
                        call()
                    if told:  # (nobody to tell, no abort callback to poll: nothing after it)
                        self._after(node_n, node)
                pending = True
                continue
            if mode is _ALONE:
                if ith == 0 and not self.stopping:
                    self._alone(node_n, node)
                pending = True
                continue
            if pending:  # everyone sees what thread 0 computed alone
                pending = False
                self.wait()
                if self.stopping:
                    break
            observer = self.observer
            if observer is not None:  # nobody starts the node before the observer has been asked
                if ith == 0:
                    observer(node, True, None)
                self.wait()
            self._share(node_n, node, ith, self.wait)
            if observer is not None:  # everyone's share is known once all have arrived
                self.wait()
            if ith == 0:
                self._after(node_n, node)
            self.wait()
            if self.stopping:
                break
        self.wait()

    def _alone(self, node_n: int, node: Tensor) -> None:
        """Thread 0 computes a small node without waking the other threads for it. Watched, it
        computes every thread's share in turn (each thread's rows: the same bytes as if they had
        run at once, and the shares the observer is shown); unwatched, the node in one share,
        as one thread would (the same bytes: a node's values never depend on the thread count)."""
        if self.observer is None:
            self._share(node_n, node, 0, _no_barrier, alone=True, nth=1)
            self._after(node_n, node)
            return
        self.observer(node, True, None)
        for j in range(self.nth):
            self._share(node_n, node, j, _no_barrier, alone=True)
        self._after(node_n, node)

    def _share(self, node_n: int, node: Tensor, ith: int, barrier: Callable[[], None],
               alone: bool = False, nth: int | None = None) -> None:
        """Thread ith's share of a node, timed and recorded."""
        params = ComputeParams(ith, nth or self.nth, self.cplan.work_size, self.wdata, barrier,
                               self.shared[node_n], self.cplan.use_ref, self.cplan.llamafile, alone,
                               self.observer is not None, self.nth, tiled=self.cplan.tiled)
        t0 = time.perf_counter()
        if not ggml_is_empty(node):
            self.compute_forward(params, node)
        self.shares[node_n][ith] = ThreadShare(ith, params._kind, tuple(params._ranges),
                                               time.perf_counter() - t0, params._notes)

    def _after(self, node_n: int, node: Tensor) -> None:
        """Thread 0, after a node: tell the observer, poll the abort callback."""
        stop = False
        if self.observer is not None:
            stop = self.observer(node, False, self.shares[node_n]) is False
        cb = self.cplan.abort_callback
        if stop or (cb is not None and cb(self.cplan.abort_callback_data)):
            self.stopping = True
            self.status = GGML_STATUS_ABORTED


def _no_barrier() -> None:
    raise AssertionError("a kernel that waits at a barrier was run by one thread alone (its "
                         "@kernel registration must not say barrier=False, nor its alone_when "
                         "pick this node)")


_SKIP, _ALONE, _TOGETHER, _PREPARED = "skip", "alone", "together", "prepared"
SMALL_NODE = 1 << 16  # elements: below this a node of a kernel without barriers is computed by
# thread 0 alone, share after share, when several threads run (waking the others costs more)


def _computed_alone(node: Tensor, info) -> bool:
    """Does thread 0 compute this node (of this KernelInfo) alone when several threads run? A
    small node of a kernel without barriers, a node its kernel's alone_when picks, or any node of
    a kernel whose numpy holds the interpreter lock (a second thread would only wait for it) but
    for its loop in C."""
    if info is None:
        return False
    if info.alone_when is not None:
        return info.alone_when(node)
    return not info.barrier and (ggml_nelements(node) <= SMALL_NODE
                                 or (info.holds_gil and info.loop_in_c(node) is None))


def node_mode(node: Tensor, nth: int) -> str:
    """How a node is computed: skipped (views, nodes not marked for compute), by thread 0 alone
    (when several threads run: _computed_alone), or by all threads."""
    from engine.compute.kernels import KERNELS

    if node.op in VIEW_OPS or not node.flags & GGML_TENSOR_FLAG_COMPUTE:
        return _SKIP
    if nth > 1 and _computed_alone(node, KERNELS.get(node.op)):
        return _ALONE
    return _TOGETHER


@writes()
def ggml_graph_compute(cgraph: Graph, cplan: CPlan, observer: Observer | None = None) -> int:
    """ggml_graph_compute: run the graph on cplan.n_threads threads; returns a ggml_status."""
    ggml_assert(cplan.n_threads > 0, "cplan->n_threads > 0", "ggml_graph_compute")
    ggml_assert(cplan.work_size == 0 or cplan.work_data is not None,
                "cplan->work_size == 0 || cplan->work_data != NULL", "ggml_graph_compute")
    observer = observer or COMPUTE_OBSERVER.get()
    # an observer that asks only which nodes were computed, after the graph (`graph_only`: a
    # recorder inside a training loop, which is one step): the graph runs unwatched, ready calls
    # and all, and the observer is told after it (`after_graph`)
    graph_only = getattr(observer, "graph_only", None)
    whole = cplan.abort_callback is None and graph_only is not None and graph_only()
    run = _Run(cgraph, cplan, None if whole else observer)
    if run.calls is not None:  # every node one ready call: this thread runs them, none waits
        _POOL.run_here(run.calls)
    else:
        _POOL.run(run.thread, run.nth)
    if whole:  # (the nodes an observer is told of, in their order: every node not skipped)
        observer.after_graph([node for node, (mode, _calls) in zip(run.nodes, run.steps)  # type: ignore[union-attr]
                              if mode is not _SKIP])
    return run.status


@writes()
def ggml_graph_compute_with_ctx(ctx: Context, cgraph: Graph, n_threads: int,
                                observer: Observer | None = None) -> int:
    """ggml_graph_compute_with_ctx: plan, put the work buffer in ctx (always, even if empty),
    compute."""
    cplan = ggml_graph_plan(cgraph, n_threads)
    cplan.work_data = ggml_new_buffer(ctx, cplan.work_size)
    return ggml_graph_compute(cgraph, cplan, observer)
