"""ggml_context: the memory arena. A real byte pool, a linked list of objects inside it.

Mirrors ggml_init, ggml_new_object and the context accessors of ggml.c. The pool is a numpy uint8
buffer of `mem_size` bytes at a simulated address; every object header, tensor struct, graph and
tensor's data lives in it at the offset real ggml uses. Pointers written into the pool are simulated
addresses, resolved through the AddressSpace the pool was placed in.

Leaves out: the context struct itself (malloc'd outside the pool in C; here a Python object holding
the same fields), and the one-time `ggml_time_init`.
"""

from __future__ import annotations

import contextvars
import struct
import weakref
from bisect import bisect_right
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from engine.core.api import Writes, query, writes
from engine.core.errors import GGMLPoolError, ggml_assert
from engine.core.layout import GGML_MEM_ALIGN, GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, OBJECT, GGML_PAD, \
    struct_at

_OBJECT_STRUCT = struct.Struct("<QQQi")  # OBJECT's offs, size, next, type (layout.py)

GGML_OBJECT_TYPE_TENSOR = 0
GGML_OBJECT_TYPE_GRAPH = 1
GGML_OBJECT_TYPE_WORK_BUFFER = 2
OBJECT_TYPE_NAMES = {0: "TENSOR", 1: "GRAPH", 2: "WORK_BUFFER"}


class Pool(Protocol):
    """What an address space maps: an owner of a pool of bytes (a context, a backend buffer, a
    buffer's struct, or one rebuilt from a trace)."""

    pool: np.ndarray
    mem_size: int


class AddressSpace:
    """Simulated virtual memory: hands out aligned base addresses and maps addresses to pools.

    Bases are deterministic (the n-th pool of a space always gets the same address), so a program
    traced twice writes the same pointer values. Pools are 64-byte aligned like ggml_aligned_malloc.
    An address resolves to its Context, or to a backend buffer, which holds tensor data the same
    way (a pool, mem_size, id and base): the engine reads either through that shape.
    """

    FIRST_BASE = 0x7F0000000000  # where the first pool of a space is placed
    GAP = 1 << 20  # unmapped bytes between pools

    def __init__(self, weak: bool = False) -> None:
        self._next = self.FIRST_BASE
        self._bases: list[int] = []  # sorted
        self._owners: list = []  # the contexts, or weak references to them (weak=True)
        self.placed = 0  # pools placed so far: the next context's small id
        # A space whose contexts are held by something else (a rebuilt state) refers to them
        # weakly, so that dropping that holder frees the pools at once (no reference cycle).
        self.weak = weak
        # what makes a backend buffer's pool in this space, given its type and size (None, or
        # its answer None: zeros of its own); a recorder makes repacked weights' pools the pages
        # of their mirror, so they are written once (engine/trace/pools.py)
        self.pool_maker: Callable[[Any, int], Any] | None = None

    def place(self, owner: Pool, size: int) -> int:
        base = self._next
        self._next = GGML_PAD(base + max(size, 1) + self.GAP, 1 << 20)
        self.placed += 1
        self._bases.append(base)
        self._owners.append(self._ref(owner))
        return base

    def _ref(self, owner: Pool):
        return weakref.ref(owner) if self.weak else owner

    def _owner(self, i: int) -> "Context | None":
        return self._owners[i]() if self.weak else self._owners[i]

    def place_at(self, owner: Pool, base: int) -> None:
        """Map a pool at a given base (rebuilding a traced state at its original addresses)."""
        i = bisect_right(self._bases, base)
        self._bases.insert(i, base)
        self._owners.insert(i, self._ref(owner))

    def owners(self) -> list:
        """Every pool mapped here (contexts and buffers), live ones only."""
        return [o for o in (self._owner(j) for j in range(len(self._owners))) if o is not None]

    def remove(self, owner: Pool) -> None:
        i = next(j for j in range(len(self._owners)) if self._owner(j) is owner)
        del self._bases[i], self._owners[i]

    def resolve(self, address: int) -> tuple["Context", int]:
        """The context whose pool holds `address`, and the offset in that pool. The address
        one past a pool's end resolves too: an empty tensor at the end of a buffer points there
        (llama.cpp's recurrent memory views 0 rows after its last state)."""
        i = bisect_right(self._bases, address) - 1
        if i >= 0:
            ctx = self._owner(i)
            offset = address - self._bases[i]
            if ctx is not None and offset <= ctx.mem_size:
                return ctx, offset
        raise ValueError(f"address {address:#x} is in no live ggml_context pool")

    def resolve_all(self, addresses: np.ndarray) -> tuple[list["Context | None"], list[int], list[int]]:
        """resolve() of many addresses at once: the space's contexts (None where freed), and for
        each address the index of its context among them and its offset in that pool (ValueError
        as resolve)."""
        owners = [self._owner(j) for j in range(len(self._bases))]
        if not len(addresses):
            return owners, [], []
        if not owners:
            raise ValueError(f"address {int(addresses[0]):#x} is in no live ggml_context pool")
        bases = np.asarray(self._bases, dtype=np.uint64)
        which = np.searchsorted(bases, addresses, side="right").astype(np.int64) - 1
        ends = np.asarray([-1 if o is None else o.mem_size for o in owners] + [-1], dtype=np.int64)
        offsets = addresses.astype(np.int64) - bases[which].astype(np.int64)
        bad = (which < 0) | (offsets > ends[which])
        if bad.any():
            raise ValueError(f"address {int(addresses[bad.argmax()]):#x} is in no live ggml_context pool")
        return owners, which.tolist(), offsets.tolist()


_SPACE: contextvars.ContextVar[AddressSpace] = contextvars.ContextVar("ggml_address_space",
                                                                       default=AddressSpace())


def current_address_space() -> AddressSpace:
    return _SPACE.get()


@contextmanager
def fresh_address_space() -> Iterator[AddressSpace]:
    """Run a program in its own address space, so its pointers do not depend on what ran before."""
    token = _SPACE.set(AddressSpace())
    try:
        yield _SPACE.get()
    finally:
        _SPACE.reset(token)


@dataclass(frozen=True, slots=True)
class FileBytes:
    """Pool bytes [start, start + size) read from the file at `path`, from byte `offset` (a
    GGUF's data section loaded by gguf_init_from_file). Not part of ggml: a recorder keeps where
    such bytes came from instead of a second copy of a model's weights."""

    start: int
    size: int
    path: str
    offset: int


@dataclass(slots=True)
class ggml_init_params:  # noqa: N801 - ggml's name
    """struct ggml_init_params."""

    mem_size: int  # bytes
    mem_buffer: np.ndarray | bytearray | None = None  # None: the context allocates its own pool
    no_alloc: bool = False  # don't allocate memory for tensor data


class Context:
    """struct ggml_context: the pool plus the object list's ends (as header offsets)."""

    def __init__(self, params: ggml_init_params) -> None:
        mem_size = params.mem_size or GGML_MEM_ALIGN
        if params.mem_buffer is None:
            mem_size = GGML_PAD(mem_size, GGML_MEM_ALIGN)
            self.pool = np.zeros(mem_size, dtype=np.uint8)
            self.mem_buffer_owned = True
        else:
            pool = np.frombuffer(params.mem_buffer, dtype=np.uint8)
            ggml_assert(pool.size >= mem_size, "mem_size <= sizeof(mem_buffer)", "ggml_init",
                        f"buffer of {pool.size} bytes for mem_size {mem_size}")
            self.pool = pool[:mem_size]
            self.mem_buffer_owned = False
        self.mem_size = mem_size
        self.no_alloc = bool(params.no_alloc)
        self.n_objects = 0
        self.objects_begin: int | None = None  # header offset of the first object
        self.objects_end: int | None = None  # header offset of the last object
        self.space = current_address_space()
        self.id = self.space.placed  # a small stable id for displays: 0 for the first context
        self.base = self.space.place(self, mem_size)  # simulated address of pool byte 0
        self.freed = False
        self.read_from: FileBytes | None = None  # pool bytes that are a file's (a GGUF's data section)

    @classmethod
    def restored(cls, space: AddressSpace, ctx_id: int, base: int, pool: np.ndarray,
                 objects_end: int | None, no_alloc: bool) -> "Context":
        """A context over pool bytes rebuilt from a trace, mapped at its original address."""
        ctx = cls.__new__(cls)
        ctx.pool, ctx.mem_size, ctx.mem_buffer_owned = pool, pool.size, True
        ctx.no_alloc, ctx.n_objects = no_alloc, 0
        ctx.objects_begin = None if objects_end is None else 0
        ctx.objects_end = objects_end
        ctx.space, ctx.base, ctx.id, ctx.freed = space, base, ctx_id, False
        ctx.read_from = None
        space.place_at(ctx, base)
        return ctx

    def __repr__(self) -> str:
        return f"<ggml_context {self.id} mem_size={self.mem_size} used={ggml_used_mem(self)}>"

    # --- pointers ---------------------------------------------------------------------------
    def address(self, offset: int) -> int:
        return self.base + offset

    def offset(self, address: int) -> int:
        """Pool offset of an address that must lie in this pool."""
        off = address - self.base
        if not 0 <= off <= self.mem_size:
            raise ValueError(f"address {address:#x} is outside context {self.id}'s pool")
        return off

    def object_header(self, header_offset: int) -> np.ndarray:
        return struct_at(self.pool, header_offset, OBJECT)

    def object_end(self, header_offset: int) -> int:
        """Where the payload of the object whose header is at header_offset ends (offs + size)."""
        offs, size, _, _ = _OBJECT_STRUCT.unpack_from(self.pool.data, header_offset)
        return offs + size

    def headers(self) -> list[tuple[int, int, int, int, int]]:
        """Each object as (header offset, offs, size, type, next), in creation order: the list
        walked through the `next` pointers stored in the pool, in one loop (headers read with
        struct: no numpy view, no object per entry; a lookup by name walks it for every weight a
        model builder asks for)."""
        self._check_live()
        out, hdr, buf, unpack = [], self.objects_begin, self.pool.data, _OBJECT_STRUCT.unpack_from
        while hdr is not None:
            offs, size, nxt, type_ = unpack(buf, hdr)
            out.append((hdr, offs, size, type_, nxt))
            hdr = nxt - self.base if nxt else None
            if hdr is not None and not 0 <= hdr <= self.mem_size:
                self.offset(nxt)  # (raises: a `next` outside the pool)
        return out

    def objects(self) -> Iterator["ObjectInfo"]:
        """The object list (`headers`) as ObjectInfo."""
        return (ObjectInfo(*h) for h in self.headers())

    def _check_live(self) -> None:
        ggml_assert(not self.freed, "ctx != NULL (context was freed)", "ggml_context")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One ggml_object as read from the pool."""

    header: int  # offset of the 32-byte header
    offs: int  # payload offset
    size: int  # payload size (padded)
    type: int  # GGML_OBJECT_TYPE_*
    next: int  # address of the next header, 0 for the last

    @property
    def type_name(self) -> str:
        return OBJECT_TYPE_NAMES.get(self.type, str(self.type))


@writes(Writes.CONTEXT)
def ggml_init(params: ggml_init_params) -> Context:
    """ggml_init: create a context with a pool of params.mem_size bytes (padded to 16 if owned)."""
    return Context(params)


@writes()
def ggml_new_object(ctx: Context, type_: int, size: int) -> int:
    """ggml_new_object: append an object to the pool; returns its payload offset.

    The 32-byte header is written right before the payload, at the end of the last object.
    Raises GGMLPoolError (with ggml's needed/available numbers) when the pool is full.
    """
    ctx._check_live()
    cur_end = 0
    if ctx.objects_end is not None:
        last = ctx.object_header(ctx.objects_end)[0]
        cur_end = int(last["offs"]) + int(last["size"])
    size_needed = GGML_PAD(size, GGML_MEM_ALIGN)
    needed = cur_end + size_needed + GGML_OBJECT_SIZE
    if needed > ctx.mem_size:
        raise GGMLPoolError(needed, ctx.mem_size)

    obj = ctx.object_header(cur_end)
    obj["offs"] = cur_end + GGML_OBJECT_SIZE
    obj["size"] = size_needed
    obj["next"] = 0
    obj["type"] = type_
    if ctx.objects_end is not None:
        ctx.object_header(ctx.objects_end)["next"] = ctx.address(cur_end)
    else:
        ctx.objects_begin = cur_end
    ctx.objects_end = cur_end
    return cur_end + GGML_OBJECT_SIZE


@query
def ggml_used_mem(ctx: Context) -> int:
    """ggml_used_mem: end of the last object's payload (headers included), 0 if empty."""
    return 0 if ctx.objects_end is None else ctx.object_end(ctx.objects_end)


@query
def ggml_get_mem_buffer(ctx: Context) -> int:
    """ggml_get_mem_buffer: the pool's (simulated) address. The bytes are `ctx.pool`."""
    return ctx.base


@query
def ggml_get_mem_size(ctx: Context) -> int:
    """ggml_get_mem_size."""
    return ctx.mem_size


@writes()
def ggml_set_no_alloc(ctx: Context, no_alloc: bool) -> None:
    """ggml_set_no_alloc."""
    ctx.no_alloc = bool(no_alloc)


@query
def ggml_get_no_alloc(ctx: Context) -> bool:
    """ggml_get_no_alloc."""
    return ctx.no_alloc


@query
def ggml_tensor_overhead() -> int:
    """ggml_tensor_overhead: one object header plus one tensor struct (368 bytes)."""
    return GGML_OBJECT_SIZE + GGML_TENSOR_SIZE


@writes()
def ggml_new_buffer(ctx: Context, nbytes: int) -> int:
    """ggml_new_buffer: a WORK_BUFFER object of nbytes; returns its (simulated) address."""
    return ctx.address(ggml_new_object(ctx, GGML_OBJECT_TYPE_WORK_BUFFER, nbytes))


@writes()
def ggml_reset(ctx: Context | None) -> None:
    """ggml_reset: forget every object; the bytes stay, the next object starts at offset 0."""
    if ctx is None:
        return
    ctx.n_objects = 0
    ctx.objects_begin = ctx.objects_end = None


@writes()
def ggml_free(ctx: Context | None) -> None:
    """ggml_free: the context may not be used afterwards. Its pool is released when the context
    owns it; a pool the program handed in (mem_buffer) stays the program's memory, so tensors and
    graphs in it stay readable, as in C (simple-backend frees its graph's context this way)."""
    if ctx is None or ctx.freed:
        return
    if ctx.mem_buffer_owned:
        ctx.space.remove(ctx)
    ctx.freed = True


def _object_line(obj) -> str:
    next_ = f"{obj.next:#x}" if obj.next else "(nil)"  # %p as glibc prints it
    return f" - ggml_object: type = {obj.type}, offset = {obj.offs}, size = {obj.size}, next = {next_}"


@query
def ggml_print_object(obj) -> str:
    """ggml_print_object: one object's line (returned, and printed)."""
    line = _object_line(obj)
    print(line)
    return line


@query
def ggml_print_objects(ctx: Context) -> str:
    """ggml_print_objects: the object list, one line per object (returned, and printed)."""
    lines = [f"ggml_print_objects: objects in context {ctx.id}:"]
    lines += [_object_line(obj) for obj in ctx.objects()]
    lines.append("ggml_print_objects: --- end ---")
    text = "\n".join(lines)
    print(text)
    return text
