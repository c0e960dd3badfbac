"""A recorded trace and the states rebuilt from it.

A `Trace` holds the program's steps; each step keeps its patches (the bytes it wrote). The pools
at any step are rebuilt without running anything (`Trace.state_at`): the last checkpoint at or
before the step, then the patches after it. Checkpoints (copies of the pools at some step
boundaries) are made on the first rebuild, within a budget, so a state of a big trace replays a
bounded number of bytes; what they copy together is bounded by a few times what the steps wrote
(`checkpoint_budget`), so a pool of 1 GiB touched by small steps is never copied: its states
replay the steps from an earlier checkpoint instead. A `State` puts the engine's objects
(contexts, tensors, graphs, backend buffers) over the rebuilt pools.
"""

from __future__ import annotations

import hashlib
import json
import threading
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from engine.core.context import GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR, AddressSpace, Context
from engine.core.graph import Graph
from engine.core.infos import PoolTensor, graph_tensors, tensor_infos
from engine.core.layout import CGRAPH, struct_at
from engine.core.notes import tell
from engine.core.tensor import Tensor
from engine.trace.backend import restored_buffers
from engine.core.pages import pool_over_file
from engine.trace.pools import file_pages, file_pool, fresh_pool, frozen, shared_pages
from engine.trace.steps import ContextMeta, Step, StepKind


CHECKPOINT_MIN_BYTES = 4 << 20  # no checkpoints for traces whose patches replay faster than this
BIG_STEP_BYTES = 4 << 20  # a step that writes this much (weights loaded) is followed by a checkpoint
CHECKPOINT_PATCHES = 4096  # a rebuild replays at most about this many (a model's graph makes tens of thousands)
CHECKPOINT_BYTES = 1 << 30  # what one trace's checkpoints may copy together (then states replay more),
CHECKPOINT_RATIO = 4  # and at most this many times the bytes its steps wrote,
CHECKPOINT_FLOOR = 64 << 20  # or this many when that is less (a small trace's pools are copied)


def checkpoint_every(dirty_bytes: int) -> int:
    """Patch bytes after which a checkpoint is made, when the pools written since the last one
    total dirty_bytes (what the checkpoint copies): a state replays at most that many bytes, and
    the checkpoints together copy at most ~4 times the bytes the steps wrote."""
    return max(CHECKPOINT_MIN_BYTES, dirty_bytes // 4)


def checkpoint_budget(recorded_bytes: int) -> int:
    """Bytes one trace's checkpoints may copy together: CHECKPOINT_RATIO times what its steps
    wrote (at least CHECKPOINT_FLOOR), at most CHECKPOINT_BYTES. The memory a trace costs grows
    with the trace, not with the pools its program asked for."""
    return min(CHECKPOINT_BYTES, max(CHECKPOINT_FLOOR, CHECKPOINT_RATIO * recorded_bytes))


@dataclass
class Trace:
    program: str
    source: str
    n_threads: int
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    printed: str = ""  # what the program printed (a learner's program in the playground)
    # the walkthrough's other files whose facade calls are steps too, as (path under the
    # package, text): Step.file k > 0 is also[k - 1]
    also: tuple[tuple[str, str], ...] = ()
    # an upper bound of the memory its records (steps, outputs, files) take besides the patches'
    # bytes, counted by whoever built it (the app's wire decoder: from its head's size); 0: not yet
    records_bytes: int = field(default=0, compare=False, repr=False)

    @property
    def hash(self) -> str:
        """Content hash over everything but timings and which thread took which chunk."""
        cached = self.__dict__.get("_hash")
        if cached is not None and cached[0] == len(self.steps):
            return cached[1]
        h = hashlib.sha256()
        h.update(self.program.encode())
        h.update(str(self.n_threads).encode())
        for name, _text in self.also:
            h.update(name.encode())
        for s in self.steps:
            h.update(s.hash_bytes())
        self.__dict__["_hash"] = (len(self.steps), h.hexdigest()[:16])
        return self.__dict__["_hash"][1]

    def of_kinds(self, *kinds: StepKind) -> list[Step]:
        """The steps of these kinds, in order (a page asks at every step: found in `_index`)."""
        by_kind = self._index().by_kind
        return [self.steps[k] for k in sorted(k for kind in kinds for k in by_kind.get(kind, ()))]

    def _index(self) -> "_Index":
        """What the steps hold, gathered in one pass (again once steps were added)."""
        index = self.__dict__.get("_steps_index")
        if index is None or index.n_steps != len(self.steps):
            index = self.__dict__["_steps_index"] = _index_of(self.steps)
        return index

    # --- rebuilding a state -----------------------------------------------------------------
    @property
    def recorded_bytes(self) -> int:
        """The bytes the steps' patches hold (what keeping this trace costs)."""
        return self._index().nbytes

    def state_at(self, k: int) -> "State":
        """The pools after step k: the last checkpoint at or before k, then the patches of the
        steps after it (from step 0 when there is none)."""
        k = max(0, min(k, len(self.steps) - 1))
        index = self._index()
        flat, ends = index.patches, index.ends
        metas: dict[int, ContextMeta] = _as_of(index.contexts, k)
        buffers: dict[int, Any] = _as_of(index.buffers, k)
        metas = {cid: m for cid, m in metas.items() if not m.freed}  # their memory is gone
        start, saved = 0, {}
        for at, pools_then in self._checkpoints():  # (at: the patches before the checkpoint)
            if at > ends[k]:
                break
            start, saved = at, pools_then
        # a pool whose every patch is a file's pages (a model's mapped weights, a weights
        # buffer's mirror) is that file, mapped, once the state is past its last patch
        whole = {cid: m for cid, m in index.mirrors.items() if m.last < ends[k]}
        # (and one that is being loaded: the file's pages over what its patches wrote so far)
        part = {cid: m for cid, m in index.mirrors.items() if m.ranges[0][0] < ends[k] <= m.last}
        # a pool no patch after the checkpoint touches is the checkpoint's own (read-only) array:
        # a loaded model's weights are not copied for every step a learner opens
        touched = {p[0] for p in flat[start:ends[k]]} - whole.keys() - part.keys()
        sizes = {**{cid: m.mem_size for cid, m in metas.items()},
                 **{bid: m.size for bid, m in buffers.items()}}
        pools = {cid: saved[cid] if cid in saved and cid not in touched
                 else file_pool(whole[cid].pages, whole[cid].shift, size) if cid in whole
                 else pool_over_file(size, part[cid].pages.path, part[cid].shift, part[cid].written(ends[k]),
                                     np.frombuffer(part[cid].pages, np.uint8)) if cid in part
                 else fresh_pool(size, saved.get(cid)) for cid, size in sizes.items()}
        views = {cid: a.data for cid, a in pools.items() if cid in touched}
        for cid, a, b, data in flat[start:ends[k]]:
            view = views.get(cid)
            if view is not None:
                view[a:b] = data
        return State(self, k, metas, pools, buffers)

    def _checkpoints(self) -> list[tuple[int, dict[int, np.ndarray]]]:
        """Copies of every pool at some step boundaries, as (patches before it, pools): one each
        time the patches since the last reach the pools' total size or number CHECKPOINT_PATCHES,
        so a rebuild copies one checkpoint and replays at most that many bytes or patches. Made
        once, on the first rebuild."""
        cached = getattr(self, "_cps", None)
        if cached is not None and cached[0] == len(self.steps):
            return cached[1]
        with self.__dict__.setdefault("_cps_lock", threading.Lock()):  # (two first rebuilds copy once)
            cached = getattr(self, "_cps", None)
            if cached is None or cached[0] != len(self.steps):
                self._make_checkpoints()
            return self._cps[1]

    def _make_checkpoints(self) -> None:
        """_checkpoints' work, once per trace (under its lock): the copies, and what they hold."""
        index = self._index()
        flat, ends = index.patches, index.ends
        last = len(self.steps) - 1
        sizes = {**{cid: m.mem_size for cid, m in _as_of(index.contexts, last).items()},
                 **{bid: m.size for bid, m in _as_of(index.buffers, last).items()}}
        checkpoints: list[tuple[int, dict[int, np.ndarray]]] = []
        copied = index.copied  # (what the checkpoints copy comes from these patches alone)
        if copied > min(checkpoint_every(sum(sizes.values())), BIG_STEP_BYTES) \
                or len(flat) > CHECKPOINT_PATCHES:
            budget = checkpoint_budget(copied)
            pools: dict[int, np.ndarray] = {}
            dirty: set[int] = set()  # pools written since the last checkpoint
            since, done, spent, replays, written = 0, 0, 0, 0, 0
            for k, s in enumerate(self.steps):
                for c in s.contexts:
                    if c.freed:
                        pools.pop(c.id, None)
                    else:
                        pools.setdefault(c.id, np.zeros(c.mem_size, dtype=np.uint8))
                for buf in s.buffers:
                    pools.setdefault(buf.id, np.zeros(buf.size, dtype=np.uint8))
                step_bytes = 0
                for cid, a, b, data in flat[done:ends[k]]:
                    if cid in pools and cid not in index.mirrors:
                        pools[cid][a:b] = np.frombuffer(data, np.uint8)
                        dirty.add(cid)
                        step_bytes += b - a
                since += step_bytes
                written += step_bytes
                replays += ends[k] - done
                done = ends[k]
                # a mirrored pool is its file's pages (shared) once complete; no checkpoint
                # while one is made but not complete (its states replay it instead)
                waiting = False
                for cid, m in index.mirrors.items():
                    if cid in pools and m.last < done:
                        pools[cid] = shared_pages(m.pages, m.shift, pools[cid].size)
                    elif cid in pools:
                        waiting = True
                # also right after a step that writes a lot (a model's weights loaded): the
                # states after it share that checkpoint's pool instead of rebuilding it. The
                # budget is spent as the steps write (its share so far), so the checkpoints are
                # spread over the trace; one that costs more waits (its states replay instead)
                cost = sum(a.nbytes for cid, a in pools.items() if cid in dirty)
                if (since >= checkpoint_every(cost) or step_bytes >= BIG_STEP_BYTES or replays >= CHECKPOINT_PATCHES) \
                        and k + 1 < len(self.steps) and not waiting \
                        and spent + cost <= budget * written // max(1, copied):
                    prev = checkpoints[-1][1] if checkpoints else {}
                    # a pool nothing wrote since the last checkpoint is that checkpoint's copy
                    checkpoints.append((done, {cid: a if cid in index.mirrors else prev[cid]
                                               if cid in prev and cid not in dirty
                                               else frozen(a) for cid, a in pools.items()}))
                    since, dirty, spent, replays = 0, set(), spent + cost, 0
        self._cp_bytes = sum({id(a): a.nbytes for _, pools in checkpoints for a in pools.values()}.values())
        self._cps = (len(self.steps), checkpoints)

    @property
    def held_bytes(self) -> int:
        """What keeping this trace costs: its patches, its records (as counted, `records_bytes`),
        and its checkpoints once a rebuild made them."""
        return self.recorded_bytes + self.records_bytes + getattr(self, "_cp_bytes", 0)

    def to_json(self) -> dict:
        return {"program": self.program, "hash": self.hash, "n_threads": self.n_threads,
                "error": self.error,
                "steps": [{"index": s.index, "kind": s.kind.value, "call": s.call, "line": s.line,
                           "note": tell(s.notes), "parent": s.parent, "changes": s.changes(),
                           "same_on_every_cpu": s.same_on_every_cpu,
                           **({"file": s.file} if s.file else {}),  # (another file's line)
                           "threads": [{"ith": t.ith, "kind": t.kind, "ranges": t.ranges, "seconds": t.seconds,
                                        "note": tell(t.notes)} for t in s.threads]} for s in self.steps],
                "outputs": self.outputs}


Declared = dict[int, tuple[list[int], list[Any]]]  # id -> the steps declaring it, and what each said


class Mirrored(NamedTuple):
    """A pool every patch of which is a file's pages, each at the same distance from its offset
    in the pool: the pool is the file from `shift` on, once past patch `last`; before, the file's
    pages over the ranges its patches wrote so far."""

    pages: Any  # the mapped file (engine.trace.pools._FileMap)
    shift: int
    last: int
    ranges: list[tuple[int, int, int]]  # (patch index, start, end) of each patch, in order

    def written(self, end: int) -> list[tuple[int, int]]:
        """The ranges the patches before patch `end` wrote, adjacent ones joined."""
        out: list[tuple[int, int]] = []
        for i, a, b in self.ranges[:bisect_right(self.ranges, (end, -1, -1))]:
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out


class _Index(NamedTuple):
    """What a trace's steps hold, as a rebuild and the panels look it up."""

    n_steps: int
    patches: list[tuple[int, int, int, bytes]]  # every patch in order as (ctx, start, end, bytes)
    ends: list[int]  # how many patches steps 0..k wrote
    nbytes: int  # the bytes the patches hold (a weights buffer's mirror, not a model file's pages)
    copied: int  # the bytes of the patches of pools that are not mirrored (a rebuild replays these)
    mirrors: dict[int, Mirrored]  # the pools that are a file's pages
    # each context's metas and each buffer's, with the steps that declared them (a context's
    # meta changes with every object it makes: a state finds its own by bisection, `_as_of`)
    contexts: Declared
    buffers: Declared
    by_kind: dict[StepKind, list[int]]  # the steps of each kind


def _index_of(steps: list[Step]) -> _Index:
    patches: list[tuple[int, int, int, bytes]] = []
    ends: list[int] = []
    by_kind: dict[StepKind, list[int]] = {}
    contexts: Declared = {}
    buffers: Declared = {}
    for k, s in enumerate(steps):
        patches += [(p.ctx, p.offset, p.offset + len(p.data), p.data) for p in s.patches]
        ends.append(len(patches))
        by_kind.setdefault(s.kind, []).append(k)
        for found, items in ((contexts, s.contexts), (buffers, s.buffers)):
            for item in items:
                at, said = found.setdefault(item.id, ([], []))
                at.append(k)
                said.append(item)
    mirrors: dict[int, Mirrored] = {}
    broken: set[int] = set()
    held = 0
    for i, (cid, a, _, data) in enumerate(patches):
        src = file_pages(data)
        if src is None or src[0].held:  # (not a model file's pages: the page cache has those)
            held += len(data)
        m = mirrors.get(cid)
        if src is None or (m is not None and (m.pages is not src[0] or m.shift != src[1] - a)):
            broken.add(cid)
        elif cid not in broken:
            ranges = m.ranges if m is not None else []
            ranges.append((i, a, a + len(data)))
            mirrors[cid] = Mirrored(src[0], src[1] - a, i, ranges)
    mirrors = {cid: m for cid, m in mirrors.items() if cid not in broken}
    copied = sum(len(p[3]) for p in patches if p[0] not in mirrors)
    return _Index(len(steps), patches, ends, held, copied, mirrors, contexts, buffers, by_kind)


def _as_of(declared: Declared, k: int) -> dict[int, Any]:
    """What the steps up to k last declared of each id, in the order the ids were first declared."""
    out = {}
    for id_, (at, said) in declared.items():
        i = bisect_right(at, k)
        if i:
            out[id_] = said[i - 1]
    return out


class State:
    """The engine's objects over rebuilt pools: contexts, tensors and graphs as they were."""

    def __init__(self, trace: Trace, k: int, metas: dict[int, ContextMeta], pools: dict,
                 buffers: dict | None = None) -> None:
        self.trace, self.k = trace, k
        self.space = AddressSpace(weak=True)  # the state holds the contexts
        self.contexts = {cid: Context.restored(self.space, cid, m.base, pools[cid],
                                               m.objects_end, m.no_alloc)
                         for cid, m in sorted(metas.items())}
        self.buffers = restored_buffers(self.space, buffers or {}, pools)  # backend buffers
        # what keeping this state costs: its own pools (a checkpoint's read-only ones are shared)
        self.nbytes = sum(p.nbytes for p in pools.values() if p.flags.writeable)
        self._infos: dict[int, list[PoolTensor]] = {}
        self._headers: dict[int, list[tuple[int, int, int, int, int]]] = {}
        self._graphs: list[Graph] | None = None
        # by (the graph's offset in its context: None for a view of one, the context's id)
        self._graph_tensors: dict[tuple[int | None, int], tuple[np.ndarray, np.ndarray]] = {}

    def tensor_infos(self, cid: int) -> list[PoolTensor]:
        """tensor_infos of context cid, read once: a state's pools never change."""
        if cid not in self._infos:
            self._infos[cid] = tensor_infos(self.contexts[cid], self.headers(cid))
        return self._infos[cid]

    def headers(self, cid: int) -> list[tuple[int, int, int, int, int]]:
        """Context cid's object list (Context.headers), walked once."""
        if cid not in self._headers:
            self._headers[cid] = self.contexts[cid].headers()
        return self._headers[cid]

    def tensor(self, ref: tuple[int, int]) -> Tensor:
        return Tensor(self.contexts[ref[0]], ref[1])

    def tensors(self) -> list[Tensor]:
        return [Tensor(self.contexts[cid], offs) for cid in self.contexts for offs in self._tensor_offsets(cid)]

    def newest_tensor(self) -> Tensor | None:
        """tensors()[-1] without a handle for every other tensor."""
        for cid in reversed(self.contexts):
            offsets = self._tensor_offsets(cid)
            if offsets:
                return Tensor(self.contexts[cid], offsets[-1])
        return None

    def _tensor_offsets(self, cid: int) -> list[int]:
        return [offs for _, offs, _, type_, _ in self.headers(cid) if type_ == GGML_OBJECT_TYPE_TENSOR]

    def graphs(self) -> list[Graph]:
        """The graphs in the state's pools (found once: a state's pools never change), but for
        one whose tensors were in a context freed since: it holds dangling pointers (in C too)
        and is not shown."""
        if self._graphs is None:
            self._graphs = []
            for cid, ctx in self.contexts.items():
                for _, offs, _, type_, _ in self.headers(cid):
                    if type_ == GGML_OBJECT_TYPE_GRAPH:
                        g = Graph(ctx, struct_at(ctx.pool, offs, CGRAPH), offs)
                        try:
                            self._graph_tensors[offs, ctx.id] = graph_tensors(g)
                        except ValueError:
                            continue
                        self._graphs.append(g)
        return list(self._graphs)

    def graph_tensors(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        """engine.core.infos.graph_tensors of one of graphs(), read once."""
        self.graphs()
        return self._graph_tensors[g.offs, g.ctx.id]


def dumps(trace: Trace) -> str:
    return json.dumps(trace.to_json())
