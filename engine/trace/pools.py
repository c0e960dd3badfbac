"""The pools of a trace: finding the bytes a step changed, and the pools a rebuilt state reads.

A step's patches are the runs of bytes its call changed (`changed_runs`, found from the edges
of the changed runs, so a model's hundreds of megabytes loaded at once never become an index per
byte), compared with the recorder's `Shadow` of each pool, where bytes read from a file are that
file's pages (`FileMaps`): a model's weights are neither copied nor kept twice. A rebuilt
state's pools are fresh ones (`fresh_pool`: copy-on-write mappings of a checkpoint's big pools)
or, where no later patch touches them, a checkpoint's read-only copy (`frozen`), shared by every
state rebuilt from it.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
import weakref
from bisect import bisect_right
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from engine.core.context import FileBytes
from engine.core.graph import Graph
from engine.core.layout import CGRAPH
from engine.core.pages import PAGE, map_private, mmap_fn
from engine.core.tensor import Tensor


# pools from this size up are mapped, not copied: a state's private copy of a checkpoint shares
# its pages until a patch writes one (copy on write), so rebuilding a state whose model or compute
# buffer is tens of MB costs the pages its patches touch, not a copy of every page
MAPPED_BYTES = 1 << 20


class _Checkpoint(mmap.mmap):
    """A checkpoint's pool in a memory file (memfd): read-only here, mapped copy-on-write by
    the states rebuilt from it. `fd` stays open while the mapping lives."""

    fd: int


class Region(Enum):
    """Memory a step may have written besides its tensors and graphs."""

    WORK_BUFFERS = "work buffers"  # the kernels' scratch data (rows converted for a product)
    ALL_MEMORY = "all memory"  # every pool and buffer (a call that writes tensors nobody named)


@dataclass(frozen=True)
class StructOf:
    """Only the struct of a tensor (its fields changed; its data did not)."""

    tensor: Tensor


@dataclass(frozen=True)
class PoolRange:
    """A byte range [start, stop) of a context's pool (a few entries of a graph's arrays)."""

    ctx: Any
    start: int
    stop: int


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only copy: a checkpoint's pools are shared by the states rebuilt from it."""
    if a.nbytes < MAPPED_BYTES or not hasattr(os, "memfd_create"):
        c = a.copy()
        c.setflags(write=False)
        return c
    fd = os.memfd_create("ggml-lens-checkpoint", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, a.nbytes)
        with mmap.mmap(fd, a.nbytes) as shared:
            np.frombuffer(shared, np.uint8)[:] = a
        m = _Checkpoint(fd, a.nbytes, access=mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    m.fd = fd
    weakref.finalize(m, os.close, fd)
    return np.frombuffer(m, np.uint8)


def fresh_pool(size: int, like: np.ndarray | None) -> np.ndarray:
    """A writable pool for a rebuilt state: zeros, or the bytes of a checkpoint's pool. A big
    one is a private mapping (of the checkpoint's memory file, or of zeros): no page is copied
    or zeroed before something writes it. (A small one is an array; numpy would ask for huge
    pages for a big one, whose faults can cost ~10 ms each once memory is fragmented.)"""
    source = getattr(getattr(like, "base", None), "obj", None)
    if isinstance(source, _Checkpoint) and len(source) == size:
        return np.frombuffer(mmap.mmap(source.fd, size, access=mmap.ACCESS_COPY), np.uint8)
    if size >= MAPPED_BYTES:
        pool = np.frombuffer(mmap.mmap(-1, size), np.uint8)
    else:
        pool = np.zeros(size, dtype=np.uint8)
    if like is not None:
        np.copyto(pool, like)
    return pool


class _FileMap(mmap.mmap):
    """A file mapped read-only whose pages are the bytes of patches: a model file (FileMaps), or
    a weights buffer's mirror (`Mirror`, a memory file the trace holds: `held`)."""

    path: str
    held: bool


def mapped_file(path: str) -> _FileMap:
    """The file at `path` mapped read-only, once: a patch that is a view of its pages is found
    by file_pages (a model file the recorder read, or one a decoded trace refers to).
    OSError if it cannot be opened, ValueError if it is empty."""
    with open(path, "rb") as f:
        pages = _FileMap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pages.path, pages.held = path, False
    return pages


def file_pages(data: object) -> tuple[_FileMap, int] | None:
    """Where a patch's bytes lie, as (mapped file, offset), if they are a file's pages."""
    if isinstance(data, memoryview) and isinstance(data.obj, _FileMap):
        base = np.frombuffer(data.obj, np.uint8).ctypes.data
        return data.obj, np.frombuffer(data, np.uint8).ctypes.data - base
    return None


def file_pool(source: _FileMap, offset: int, size: int) -> np.ndarray:
    """A writable pool whose bytes are the file's [offset, offset + size): a private
    (copy-on-write) mapping, so a rebuilt state reads a model's weights from the page cache (or
    the trace's mirror of them) and copies only a page something writes."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(source.path, "rb") as f:
        m = mmap.mmap(f.fileno(), offset + size - start, access=mmap.ACCESS_COPY, offset=start)
    return np.frombuffer(m, np.uint8, size, offset - start)


def shared_pages(source: _FileMap, offset: int, size: int) -> np.ndarray:
    """The file's [offset, offset + size), read-only, shared (a checkpoint's pool)."""
    return np.frombuffer(source, np.uint8, size, offset)


MIRROR_MIN = 1 << 16  # bytes: a weights buffer's changes this large go to its mirror


def _spill_file() -> int:
    """A file of no name in the temporary directory (O_TMPFILE: gone when closed), whose pages
    the kernel may write back and drop as it does a model file's; a memory file where the
    directory cannot hold one."""
    try:
        return os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (AttributeError, OSError):
        return os.memfd_create("ggml-lens-weights", os.MFD_CLOEXEC)


class Ranges:
    """Byte ranges [a, b), sorted, those that touch merged: what a mirror holds."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __iter__(self):
        return zip(self.starts, self.ends)

    def __len__(self) -> int:
        return len(self.starts)

    def overlaps(self, a: int, b: int) -> bool:
        i = bisect_right(self.starts, b - 1)  # (the last range starting before b ends last)
        return a < b and i > 0 and self.ends[i - 1] > a

    def add(self, a: int, b: int) -> None:
        """Add [a, b), which overlaps none of them."""
        i = bisect_right(self.starts, a)
        if i > 0 and self.ends[i - 1] == a:  # (joins the one before)
            i -= 1
            a = self.starts[i]
            del self.starts[i], self.ends[i]
        if i < len(self.starts) and self.starts[i] == b:  # (and the one after)
            b = self.ends[i]
            del self.starts[i], self.ends[i]
        self.starts.insert(i, a)
        self.ends.insert(i, b)

    def split(self, a: int, b: int) -> list[tuple[int, int, bool]]:
        """[a, b) cut where the ranges begin and end: (start, end, inside one of them)."""
        out, at = [], a
        first = max(0, bisect_right(self.starts, a) - 1)
        for x, y in zip(self.starts[first:], self.ends[first:]):
            if x >= b:
                break
            if y <= at:
                continue
            if x > at:
                out.append((at, x, False))
            out.append((max(at, x), min(y, b), True))
            at = min(y, b)
        if at < b:
            out.append((at, b, False))
        return out


class Mirror:
    """A weights buffer's bytes, as the steps wrote them, in a file of its own (`_spill_file`)
    at the buffer's offsets, instead of a bytes object per patch: the patches are views of its
    pages, and a state rebuilt after the last of them maps it (copy-on-write) instead of
    replaying them, as it maps a model file's pages. (Repacked weights, which are no file's:
    held on disk and read through the page cache, as the model file is.)
    A range written a second time is refused (`put` gives None): its first patch must keep the
    bytes it had."""

    def __init__(self, size: int) -> None:
        fd = _spill_file()
        try:
            os.ftruncate(fd, size)
            self.pages = _FileMap(fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self.pages.path, self.pages.held = f"/proc/self/fd/{fd}", True
        weakref.finalize(self.pages, os.close, fd)
        self.fd, self.size = fd, size
        self.written = Ranges()
        self.sealed = Ranges()  # a pooled mirror's pages its pool maps copy-on-write (page-aligned)

    def put(self, offset: int, data: np.ndarray) -> memoryview | None:
        end = offset + data.size
        if self.written.overlaps(offset, end):
            return None
        self.written.add(offset, end)
        os.pwrite(self.fd, np.ascontiguousarray(data).data, offset)
        return memoryview(self.pages)[offset:end]

    # --- a pooled mirror: the buffer's pool is this file's pages ------------------------------

    def shared_pool(self) -> np.ndarray:
        """A pool over this file's pages, shared: what the buffer's first writes put there is the
        mirror's at once, nothing copied (`mark` then keeps it)."""
        pages = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return np.frombuffer(pages, np.uint8)

    def first_writes(self, pool: np.ndarray, a: int, b: int) -> list[tuple[int, Any]]:
        """What a step wrote into [a, b) of the pool, which no step wrote before (zeros, then):
        each run (offset, a view of the file's pages), held from now on (`mark`). What was
        written before is compared with the mirror's pages as any pool is with its shadow:
        `mark` made the pool's pages copy-on-write, so a second write shows."""
        starts, ends = changed_runs(pool[a:b], None)
        return [(a + int(s), self.mark(pool, a + int(s), a + int(e))) for s, e in zip(starts, ends)]

    def mark(self, pool: np.ndarray, a: int, b: int) -> memoryview | None:
        """[a, b) of the pool, written for the first time, held from now on (None if any of it
        was held before): the patch is a view of the file's pages. The bytes that fell in pages
        the pool already maps copy-on-write are written into the file; then every page of [a, b)
        is mapped copy-on-write, so a later write changes the pool, never the first bytes."""
        if self.written.overlaps(a, b):
            return None
        for x, y, sealed in self.sealed.split(a, b):
            if sealed:
                os.pwrite(self.fd, pool[x:y].data, x)
        self.written.add(a, b)
        lo, hi = a // PAGE * PAGE, min(-(-b // PAGE) * PAGE, -(-self.size // PAGE) * PAGE)
        for x, y, sealed in self.sealed.split(lo, hi):
            if not sealed and not map_private(pool.ctypes.data + x, y - x, self.fd, x):
                raise OSError("the pool's pages could not be mapped copy-on-write")
            if not sealed:
                self.sealed.add(x, y)
        return memoryview(self.pages)[a:b]

    def shadow(self, pooled: bool = False) -> "Shadow":
        """A shadow that is this mirror's pages (zeros outside the ranges written); `pooled`:
        the buffer's pool is these pages too (`first_writes`)."""
        out = Shadow(self.size, 0, np.frombuffer(self.pages, np.uint8), self.written)
        out.pooled = self if pooled else None
        return out


class Mirrors:
    """The recorder's mirrors of weights buffers, by buffer id. A weights buffer's first write of
    at least MIRROR_MIN bytes into a buffer nothing wrote yet starts its mirror, and its shadow
    becomes the mirror's pages: from then on its patches are views of them, nothing copied but
    into the mirror. A CPU_REPACK buffer (repacked weights: no file holds them) is made with its
    pool the mirror's pages (`pool_for`, the recording address space's pool maker): the repack
    is written once, into the mirror, instead of into the pool and then the mirror."""

    def __init__(self) -> None:
        self.by_id: dict[int, Mirror] = {}
        self.pooled: list[tuple[np.ndarray, Mirror]] = []  # pools made by pool_for (until adopted)

    def pool_for(self, buft: Any, size: int) -> np.ndarray | None:
        """A pool for a buffer of type buft (the address space's pool maker): a repacked weights
        buffer's is a new mirror's pages; None for any other (zeros of its own)."""
        if getattr(buft, "name", "") != "CPU_REPACK" or size < MIRROR_MIN or mmap_fn is None:
            return None
        try:
            mirror = Mirror(size)
            pool = mirror.shared_pool()
        except OSError:  # (no file to be had: the pool is zeros, its patches copies)
            return None
        self.pooled.append((pool, mirror))
        return pool

    def adopt(self, owner: Any) -> "Shadow | None":
        """The shadow of a buffer whose pool pool_for made: the mirror's pages, each range held
        once the buffer writes it (`Mirror.first_writes`)."""
        for k, (pool, mirror) in enumerate(self.pooled):
            if owner.pool is pool:
                del self.pooled[k]
                self.by_id[owner.id] = mirror
                return mirror.shadow(pooled=True)
        return None

    def write(self, shadows: dict[int, "Shadow"], owner: int, size: int, weights: bool, at: int,
              data: np.ndarray) -> bytes | None:
        """The patch's bytes as a view of owner's mirror, or None: the patch is a copy (and the
        shadow writable again, where a range is written twice)."""
        mirror = self.by_id.get(owner)
        if mirror is None:
            shadow = shadows[owner]
            if not (weights and data.size >= MIRROR_MIN and sys.platform == "linux") \
                    or shadow.file.size or not shadow.untouched:  # (written before: stays a copy)
                return None
            try:
                mirror = self.by_id[owner] = Mirror(size)
            except OSError:  # (no file to be had, in a sandbox say: the patches are copies)
                return None
            shadows[owner] = mirror.shadow()
        view = mirror.put(at, data)
        if view is None and shadows[owner].file.size:
            shadows[owner] = Shadow.copy_of(shadows[owner])
        return view  # type: ignore[return-value]  # (read as bytes, as a file's pages are)


class FileMaps:
    """The files a recording read pool bytes from, each mapped once, twice over: read-only (the
    bytes a step's patch holds, shared with the page cache: no copy) and copy-on-write (a
    shadow's bytes, which later steps may overwrite privately). The files are taken as
    immutable while the trace lives, as the app's stores of models and uploads keep them."""

    def __init__(self) -> None:
        self.maps: dict[str, tuple[_FileMap, mmap.mmap]] = {}

    def bytes_of(self, fb: FileBytes) -> tuple[memoryview, np.ndarray]:
        """fb's bytes read-only (for a patch), and a writable private copy-on-write view (for a
        shadow)."""
        maps = self.maps.get(fb.path)
        if maps is None:
            with open(fb.path, "rb") as f:
                maps = self.maps[fb.path] = (mapped_file(fb.path),
                                             mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))
        shared, private = maps
        if fb.offset + fb.size > len(shared):
            raise ValueError(f"{fb.path} is shorter than when it was read: its {len(shared)} bytes "
                             f"do not hold [{fb.offset}, {fb.offset + fb.size})")
        return (memoryview(shared)[fb.offset:fb.offset + fb.size],
                np.frombuffer(private, np.uint8, fb.size, fb.offset))


class Shadow:
    """A pool as the last recorded step left it, which the next step's bytes are compared with:
    zeros, but where the pool's bytes were read from a file (a model's weights), that file's
    copy-on-write pages (`file`, from `file_at` on): hundreds of MB are neither copied here nor
    found changed against zeros."""

    def __init__(self, size: int, file_at: int = 0, file: np.ndarray | None = None,
                 written: Ranges | None = None) -> None:
        self.base = np.zeros(size, dtype=np.uint8)
        self.file_at, self.file = file_at, file if file is not None else self.base[:0]
        self.untouched = True  # nothing written into the zeros yet
        self.written = written  # a mirror's pages: the ranges written (the rest are zeros)
        self.pooled: Mirror | None = None  # the mirror whose pages the pool itself is

    def known_zeros(self, a: int, b: int) -> bool:
        """Is [a, b) zeros, known without reading it? (The zeros nothing wrote; a mirror's pages
        outside the ranges written: reading them would fault every page in.)"""
        s, e = self.file_at, self.file_at + self.file.size
        if s == e or b <= s or e <= a:
            return self.untouched
        return self.written is not None and s <= a and b <= e and \
            not self.written.overlaps(a - s, b - s)

    @classmethod
    def copy_of(cls, other: "Shadow") -> "Shadow":
        """A shadow of the same bytes, all of them its own (writable)."""
        out = cls(other.base.size)
        out.base[:] = other.read(0, other.base.size)
        out.untouched = False
        return out

    def write(self, at: int, data: np.ndarray) -> None:
        """Bytes [at, at + data.size) are now `data`."""
        self.untouched = False
        for start, piece in self.pieces(at, at + data.size):
            piece[:] = data[start - at:start - at + piece.size]

    def pieces(self, a: int, b: int) -> list[tuple[int, np.ndarray]]:
        """[a, b) as (start, writable bytes) pieces: in the zeros, or in the file's bytes."""
        s, e = self.file_at, self.file_at + self.file.size
        if e <= a or b <= s or s == e:
            return [(a, self.base[a:b])]
        out = [(a, self.base[a:s])] if a < s else []
        out.append((max(a, s), self.file[max(a, s) - s:min(b, e) - s]))
        return out + ([(e, self.base[e:b])] if e < b else [])

    def read(self, a: int, b: int) -> np.ndarray:
        """Bytes [a, b) (a copy when they span pieces)."""
        parts = self.pieces(a, b)
        return parts[0][1] if len(parts) == 1 else np.concatenate([p for _, p in parts])


_ZEROS = np.zeros(1, np.uint8)  # (the zeros changed_runs compares with, as one broadcast byte)
SMALL_RUNS = 1 << 14  # bytes: a region this small is compared byte by byte first,
SMALL_CHANGES = 64  # and its runs joined in Python when this few bytes changed


def changed_runs(cur: np.ndarray, old: np.ndarray | None, gap: int = 64
                 ) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each run of bytes where cur differs from old (None: zeros), runs whose
    changed bytes are at most `gap` apart merged. Compared 8 bytes at a time, then the edge words
    byte by byte: a loaded model's hundreds of MB are a few vector passes, and never an index per
    byte. (Runs inside two neighbouring words are always merged: gap is at least 16.)"""
    assert gap >= 16
    n = cur.size
    if old is None:
        old = _ZEROS[:0] if n == 0 else np.lib.stride_tricks.as_strided(_ZEROS, (n,), (0,))
    if n <= SMALL_RUNS:  # a struct's few changed fields: their runs joined in Python
        changed = np.flatnonzero(cur != old)
        if changed.size <= SMALL_CHANGES:
            at = changed.tolist()
            run_starts: list[int] = at[:1]
            run_ends: list[int] = []
            for p, q in zip(at, at[1:]):
                if q - p > gap:
                    run_ends.append(p + 1)
                    run_starts.append(q)
            run_ends += [at[-1] + 1] if at else []
            return np.array(run_starts, np.intp), np.array(run_ends, np.intp)
    n8 = n - n % 8
    words = np.empty(n8 // 8 + 2, dtype=np.int8)
    words[0] = words[-1] = 0
    old_words = old[:n8].view(np.uint64) if old.strides[0] else np.uint64(0)
    np.not_equal(cur[:n8].view(np.uint64), old_words, out=words[1:-1].view(bool))
    edges = np.flatnonzero(np.diff(words))  # alternately a run of changed words' start and end
    starts, ends = edges[0::2], edges[1::2]
    if starts.size:  # the first changed byte of each first word, the last of each last word
        lanes = np.arange(8)
        first = cur[starts[:, None] * 8 + lanes] != old[starts[:, None] * 8 + lanes]
        last = cur[(ends[:, None] - 1) * 8 + lanes] != old[(ends[:, None] - 1) * 8 + lanes]
        starts = starts * 8 + first.argmax(axis=1)
        ends = ends * 8 - last[:, ::-1].argmax(axis=1)
    tail = np.flatnonzero(cur[n8:] != old[n8:]) + n8  # the last n % 8 bytes, one by one
    if tail.size:
        starts, ends = np.concatenate([starts, tail]), np.concatenate([ends, tail + 1])
    if starts.size == 0:
        return starts, ends
    keep = np.concatenate([[True], starts[1:] - ends[:-1] + 1 > gap])
    return starts[keep], np.concatenate([ends[:-1][keep[1:]], ends[-1:]])


def visit_spans(g: Graph, is_leaf: bool, entered: list[Tensor], counted: int | None) -> list[PoolRange]:
    """What the graph walk (ggml_visit_parents) wrote since its last visit step: the graph's
    struct (n_nodes or n_leafs) and its last nodes or leafs entry; for each tensor it entered, its
    hash key, used bit and use count (a tensor's slot is taken when the walk enters it, before its
    sources); the use count of `counted`, the slot the last visit step showed (its parent counts
    it after that step). Only these are compared, not the graph's whole arrays (a model's graph
    holds hundreds of KB); the call's own step compares everything at its end."""
    if g.offs is None:
        return []

    def entry(field: str, index: int, size: int) -> PoolRange:
        ctx, off = g.ctx.space.resolve(g._field(field))
        return PoolRange(ctx, off + index * size, off + (index + 1) * size)

    count = g.n_leafs if is_leaf else g.n_nodes
    spans = [PoolRange(g.ctx, g.offs, g.offs + CGRAPH.itemsize),
             entry("leafs" if is_leaf else "nodes", count - 1, 8)]
    slots = {counted} if counted is not None else set()
    for t in entered:
        if (slot := g.slot_of(t)) is not None and slot not in slots:
            slots.add(slot)
            spans += [entry("hash_keys", slot, 8), entry("hash_used", slot >> 5, 4)]
    spans += [entry("use_counts", slot, 4) for slot in slots]
    return spans
