"""ggml_tensor: handles onto tensor structs in a pool, tensor creation, names, flags, shape queries.

Mirrors ggml_new_tensor_impl and the tensor helpers of ggml.c (names, sizes, contiguity
predicates). A `Tensor` holds nothing but its context and the offset of its 336-byte struct; every
field read or write goes to the pool. The data behind it: engine/core/tensor_data.py.

The `buffer` field is set by ggml-backend (engine/backend/buffer.py); `extra` stays NULL.
"""

from __future__ import annotations

import math

import numpy as np

from engine.core.api import query, writes
from engine.core.context import GGML_OBJECT_TYPE_TENSOR, Context, ggml_new_object
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS, GGML_MAX_NAME, GGML_MEM_ALIGN, GGML_TENSOR_SIZE, TENSOR, GGML_PAD, \
    struct_at, struct_fields
from engine.core.types import GGML_TYPE_COUNT, GGMLType, TYPE_TRAITS


SIZE_T = 1 << 64  # ggml's byte counts and strides are size_t: its arithmetic wraps modulo this

GGML_TENSOR_FLAG_INPUT = 1
GGML_TENSOR_FLAG_OUTPUT = 2
GGML_TENSOR_FLAG_PARAM = 4
GGML_TENSOR_FLAG_LOSS = 8
GGML_TENSOR_FLAG_COMPUTE = 16

_NAME = struct_fields(TENSOR)["name"][1]  # the offset of char name[GGML_MAX_NAME] in the struct (256)


class SrcPointers:
    """tensor->src[10]: indexable like the C array; reads and writes tensor addresses."""

    __slots__ = ("_t",)

    def __init__(self, t: "Tensor") -> None:
        self._t = t

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> "Tensor | None":
        return self._t._resolve(int(self._t._r["src"][0][i]))

    def __setitem__(self, i: int, value: "Tensor | None") -> None:
        self._t._r["src"][0][i] = 0 if value is None else value.address

    def __iter__(self):
        return iter(self._t.sources())

    def __repr__(self) -> str:
        return repr(list(self))


class Tensor:
    """struct ggml_tensor *: a typed handle onto 336 bytes of a context's pool."""

    __slots__ = ("ctx", "offs", "_r")

    def __init__(self, ctx: Context, offs: int) -> None:
        self.ctx = ctx
        self.offs = offs  # offset of the struct in ctx.pool
        self._r = struct_at(ctx.pool, offs, TENSOR)

    # identity is the address, as for a C pointer
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and other.address == self.address

    def __hash__(self) -> int:
        return hash(self.address)

    def __repr__(self) -> str:
        ne = ", ".join(str(int(n)) for n in self.ne)
        return f"<ggml_tensor '{self.name}' {TYPE_TRAITS[self.type].type_name} [{ne}] at {self.address:#x}>"

    def sources(self) -> "list[Tensor | None]":
        """src[0..9], the ten pointers read at once (None where NULL)."""
        resolve = self._resolve
        return [resolve(a) if a else None for a in self._r["src"][0].tolist()]

    def _resolve(self, address: int) -> "Tensor | None":
        if address == 0:
            return None
        ctx, off = self.ctx.space.resolve(address)
        return Tensor(ctx, off)

    @property
    def address(self) -> int:
        """The tensor's own (simulated) address."""
        return self.ctx.base + self.offs

    # --- the C fields ---------------------------------------------------------------------
    @property
    def type(self) -> int:
        return int(self._r["type"][0])

    @type.setter
    def type(self, v: int) -> None:
        self._r["type"] = v

    @property
    def ne(self) -> np.ndarray:
        """int64 ne[4], a writable view of the pool."""
        return self._r["ne"][0]

    @property
    def nb(self) -> np.ndarray:
        """size_t nb[4], a writable view of the pool."""
        return self._r["nb"][0]

    @property
    def op(self) -> int:
        return int(self._r["op"][0])

    @op.setter
    def op(self, v: int) -> None:
        self._r["op"] = v

    @property
    def op_params(self) -> np.ndarray:
        """int32 op_params[16], a writable view of the pool."""
        return self._r["op_params"][0]

    @property
    def flags(self) -> int:
        return int(self._r["flags"][0])

    @flags.setter
    def flags(self, v: int) -> None:
        self._r["flags"] = v

    @property
    def src(self) -> SrcPointers:
        return SrcPointers(self)

    def source(self, i: int) -> Tensor:
        """src[i] where the op recorded one: an operand that a kernel or a backward rule reads,
        as ggml's dereference `dst->src[i]` unchecked (a NULL there is the engine's bug)."""
        t = self._resolve(int(self._r["src"][0][i]))
        assert t is not None, f"{self.name}: src[{i}] is NULL"
        return t

    def source_type(self, i: int) -> int:
        """src[i]->type, read without making a handle for src[i] (the planner asks it of every
        node)."""
        ctx, off = self.ctx.space.resolve(int(self._r["src"][0][i]))
        return int(ctx.pool[off:off + 4].view(np.int32)[0])

    @property
    def view_src(self) -> "Tensor | None":
        return self._resolve(int(self._r["view_src"][0]))

    @view_src.setter
    def view_src(self, t: "Tensor | None") -> None:
        self._r["view_src"] = 0 if t is None else t.address

    @property
    def view_offs(self) -> int:
        return int(self._r["view_offs"][0])

    @view_offs.setter
    def view_offs(self, v: int) -> None:
        self._r["view_offs"] = v

    @property
    def data(self) -> int | None:
        """The data address, or None when the tensor has no data (NULL)."""
        return int(self._r["data"][0]) or None

    @data.setter
    def data(self, address: int | None) -> None:
        self._r["data"] = address or 0

    @property
    def name(self) -> str:
        return self.name_bytes.decode("utf-8", errors="replace")

    @property
    def name_bytes(self) -> bytes:
        return name_in(self.ctx.pool, self.offs)

    def _write_name(self, name: bytes) -> None:
        """Write at most 63 bytes and a NUL, leaving the bytes after it as they were (as C does)."""
        name = name[:GGML_MAX_NAME - 1]
        start = self.offs + _NAME
        self.ctx.pool[start:start + len(name)] = np.frombuffer(name, dtype=np.uint8)
        self.ctx.pool[start + len(name)] = 0

    @property
    def extra(self) -> int:
        return int(self._r["extra"][0])

    @property
    def struct_bytes(self) -> bytes:
        return self.ctx.pool[self.offs:self.offs + GGML_TENSOR_SIZE].tobytes()


# --- creation --------------------------------------------------------------------------------

@writes()
def ggml_new_tensor_impl(ctx: Context, type_: int, n_dims: int, ne, view_src: Tensor | None,
                         view_offs: int, fn: str = "ggml_new_tensor_impl") -> Tensor:
    """ggml_new_tensor_impl: one TENSOR object holding the struct and, unless a view or no_alloc,
    the data right after it."""
    ggml_assert(0 <= int(type_) < GGML_TYPE_COUNT, "type >= 0 && type < GGML_TYPE_COUNT", fn,
                f"type {int(type_)}")
    ggml_assert(1 <= n_dims <= GGML_MAX_DIMS, "n_dims >= 1 && n_dims <= GGML_MAX_DIMS", fn,
                f"n_dims {n_dims}")
    ne = [int(n) for n in ne[:n_dims]]
    ggml_assert(all(n >= 0 for n in ne), "ne[i] >= 0", fn, f"ne {ne}")
    tr = TYPE_TRAITS[int(type_)]
    ggml_assert(tr.blck_size > 0, "ggml_blck_size(type) > 0", fn, f"type {tr.type_name} was removed")
    ggml_assert(ne[0] % tr.blck_size == 0, "ne % ggml_blck_size(type) == 0", fn,
                f"ne[0] = {ne[0]} is not a multiple of {tr.type_name}'s block size {tr.blck_size}")

    # a view of a view records the base tensor and the absolute offset
    view_offs = int(view_offs) % SIZE_T  # (size_t: an offset of -8 is 2**64 - 8)
    if view_src is not None and view_src.view_src is not None:
        view_offs = (view_offs + view_src.view_offs) % SIZE_T
        view_src = view_src.view_src

    # in size_t, as ggml computes it: a size past 2**64 wraps (ggml then accepts such a view)
    data_size = tr.type_size * ne[0] // tr.blck_size * math.prod(ne[1:]) % SIZE_T
    ggml_assert(view_src is None or data_size == 0
                or (data_size + view_offs) % SIZE_T <= ggml_nbytes(view_src),
                "view_src == NULL || data_size == 0 || data_size + view_offs <= ggml_nbytes(view_src)",
                fn, f"data_size {data_size} + view_offs {view_offs}"
                + (f" > nbytes {ggml_nbytes(view_src)}" if view_src is not None else ""))

    data = None
    if view_src is not None and view_src.data is not None:
        data = (view_src.data + view_offs) % SIZE_T
    obj_alloc_size = data_size if view_src is None and not ctx.no_alloc else 0

    offs = ggml_new_object(ctx, GGML_OBJECT_TYPE_TENSOR, GGML_TENSOR_SIZE + obj_alloc_size)
    ctx.pool[offs:offs + GGML_TENSOR_SIZE] = 0
    t = Tensor(ctx, offs)
    r = t._r
    r["type"] = int(type_)
    r["view_src"] = 0 if view_src is None else view_src.address
    r["view_offs"] = view_offs
    r["data"] = ctx.address(offs + GGML_TENSOR_SIZE) if obj_alloc_size > 0 else (data or 0)
    full_ne = ne + [1] * (GGML_MAX_DIMS - n_dims)
    t.ne[:] = full_ne
    t.nb[:] = contiguous_strides(int(type_), full_ne)
    ctx.n_objects += 1
    return t


def contiguous_strides(type_: int, ne) -> list[int]:
    """The strides ggml gives a freshly created tensor: nb[0] = type size, rows packed (size_t)."""
    tr = TYPE_TRAITS[type_]
    nb = [tr.type_size, tr.type_size * (int(ne[0]) // tr.blck_size) % SIZE_T]
    for i in range(2, GGML_MAX_DIMS):
        nb.append(nb[i - 1] * int(ne[i - 1]) % SIZE_T)
    return nb


@writes()
def ggml_new_tensor(ctx: Context, type_: int, n_dims: int, ne) -> Tensor:
    """ggml_new_tensor."""
    return ggml_new_tensor_impl(ctx, type_, n_dims, ne, None, 0, "ggml_new_tensor")


@writes()
def ggml_new_tensor_1d(ctx: Context, type_: int, ne0: int) -> Tensor:
    """ggml_new_tensor_1d."""
    return ggml_new_tensor(ctx, type_, 1, [ne0])


@writes()
def ggml_new_tensor_2d(ctx: Context, type_: int, ne0: int, ne1: int) -> Tensor:
    """ggml_new_tensor_2d."""
    return ggml_new_tensor(ctx, type_, 2, [ne0, ne1])


@writes()
def ggml_new_tensor_3d(ctx: Context, type_: int, ne0: int, ne1: int, ne2: int) -> Tensor:
    """ggml_new_tensor_3d."""
    return ggml_new_tensor(ctx, type_, 3, [ne0, ne1, ne2])


@writes()
def ggml_new_tensor_4d(ctx: Context, type_: int, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """ggml_new_tensor_4d."""
    return ggml_new_tensor(ctx, type_, 4, [ne0, ne1, ne2, ne3])


@writes()
def ggml_dup_tensor(ctx: Context, src: Tensor) -> Tensor:
    """ggml_dup_tensor: a new contiguous tensor with src's type and shape (no data, no name)."""
    return ggml_new_tensor(ctx, src.type, GGML_MAX_DIMS, src.ne)


@writes()
def ggml_view_tensor(ctx: Context, src: Tensor) -> Tensor:
    """ggml_view_tensor: a view of all of src with src's strides, named "<src> (view)", op NONE."""
    result = ggml_new_tensor_impl(ctx, src.type, GGML_MAX_DIMS, src.ne, src, 0, "ggml_view_tensor")
    ggml_format_name(result, "%s (view)", src.name_bytes)
    result.nb[:] = src.nb
    return result


# --- names -----------------------------------------------------------------------------------

@writes()
def ggml_set_name(t: Tensor, name: str | bytes) -> Tensor:
    """ggml_set_name: copy at most 63 bytes of name and a NUL."""
    t._write_name(name.encode() if isinstance(name, str) else name)
    return t


@query
def ggml_get_name(t: Tensor) -> str:
    """ggml_get_name."""
    return t.name


@writes()
def ggml_format_name(t: Tensor, fmt: str | bytes, *args) -> Tensor:
    """ggml_format_name: printf-style name, truncated to 63 bytes like vsnprintf(name, 64, ...)."""
    fmt_b = fmt.encode() if isinstance(fmt, str) else fmt
    args_b = tuple(a.encode() if isinstance(a, str) else a for a in args)
    t._write_name(fmt_b % args_b)
    return t


def name_in(pool: np.ndarray, offs: int) -> bytes:
    """The name of the tensor struct at pool offset offs: its bytes up to the first NUL."""
    return pool[offs + _NAME:offs + _NAME + GGML_MAX_NAME].tobytes().split(b"\0", 1)[0]



# --- flags -----------------------------------------------------------------------------------

@writes()
def ggml_set_input(t: Tensor) -> None:
    """ggml_set_input."""
    t.flags |= GGML_TENSOR_FLAG_INPUT


@writes()
def ggml_set_output(t: Tensor) -> None:
    """ggml_set_output: marks t and every tensor along its view_src chain."""
    cur: Tensor | None = t
    while cur is not None:
        cur.flags |= GGML_TENSOR_FLAG_OUTPUT
        cur = cur.view_src


@writes()
def ggml_set_param(t: Tensor) -> None:
    """ggml_set_param: only leafs (op NONE) can be parameters."""
    ggml_assert(t.op == 0, "tensor->op == GGML_OP_NONE", "ggml_set_param")
    t.flags |= GGML_TENSOR_FLAG_PARAM


@writes()
def ggml_set_loss(t: Tensor) -> None:
    """ggml_set_loss: the loss must be an F32 scalar."""
    ggml_assert(ggml_is_scalar(t), "ggml_is_scalar(tensor)", "ggml_set_loss")
    ggml_assert(t.type == GGMLType.F32, "tensor->type == GGML_TYPE_F32", "ggml_set_loss")
    t.flags |= GGML_TENSOR_FLAG_LOSS


# --- sizes and shapes ------------------------------------------------------------------------

@query
def ggml_nelements(t: Tensor) -> int:
    """ggml_nelements."""
    return math.prod(t.ne.tolist())


@query
def ggml_nrows(t: Tensor) -> int:
    """ggml_nrows: ne1*ne2*ne3."""
    ne = t.ne
    return int(ne[1]) * int(ne[2]) * int(ne[3])


@query
def ggml_nbytes(t: Tensor) -> int:
    """ggml_nbytes: the byte span from the first element to the end of the last one."""
    ne = [int(n) for n in t.ne]
    nb = [int(n) for n in t.nb]
    if any(n <= 0 for n in ne):
        return 0
    tr = TYPE_TRAITS[t.type]
    if tr.blck_size == 1:
        nbytes = tr.type_size
        for i in range(GGML_MAX_DIMS):
            nbytes += (ne[i] - 1) * nb[i]
    else:
        nbytes = ne[0] * nb[0] // tr.blck_size
        for i in range(1, GGML_MAX_DIMS):
            nbytes += (ne[i] - 1) * nb[i]
    return nbytes


@query
def ggml_nbytes_pad(t: Tensor) -> int:
    """ggml_nbytes_pad."""
    return GGML_PAD(ggml_nbytes(t), GGML_MEM_ALIGN)


@query
def ggml_element_size(t: Tensor) -> int:
    """ggml_element_size: bytes per block of t's type."""
    return TYPE_TRAITS[t.type].type_size


@query
def ggml_n_dims(t: Tensor) -> int:
    """ggml_n_dims: 1 + the highest dimension with more than one element (at least 1)."""
    return n_dims_of(t.ne)


def dims4(values) -> tuple[int, int, int, int]:
    """Four sizes (an ne or an nb) as Python ints."""
    d0, d1, d2, d3 = (int(x) for x in values)
    return d0, d1, d2, d3


def n_dims_of(ne) -> int:
    """ggml_n_dims of a shape `ne` (fastest first), for what holds one without a tensor (a GGUF
    tensor info)."""
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


@query
def ggml_is_empty(t: Tensor) -> bool:
    """ggml_is_empty."""
    return 0 in t.ne.tolist()


@query
def ggml_is_scalar(t: Tensor) -> bool:
    """ggml_is_scalar."""
    return all(int(n) == 1 for n in t.ne)


@query
def ggml_is_vector(t: Tensor) -> bool:
    """ggml_is_vector."""
    return all(int(n) == 1 for n in t.ne[1:])


@query
def ggml_is_matrix(t: Tensor) -> bool:
    """ggml_is_matrix."""
    return int(t.ne[2]) == 1 and int(t.ne[3]) == 1


@query
def ggml_is_3d(t: Tensor) -> bool:
    """ggml_is_3d."""
    return int(t.ne[3]) == 1


def _is_contiguous_n(t: Tensor, n: int) -> bool:
    """ggml_is_contiguous_n: dims above n must be packed; the first n+1 may have any stride."""
    tr = TYPE_TRAITS[t.type]
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    next_nb = tr.type_size
    if ne[0] != tr.blck_size and nb[0] != next_nb:
        return False
    next_nb *= ne[0] // tr.blck_size
    for i in range(1, GGML_MAX_DIMS):
        if i > n:
            if ne[i] != 1 and nb[i] != next_nb:
                return False
            next_nb *= ne[i]
        else:  # this dimension may have any stride
            next_nb = ne[i] * nb[i]
    return True


@query
def ggml_is_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous: fully packed, ignoring dimensions of size 1."""
    return _is_contiguous_n(t, 0)


@query
def ggml_is_contiguous_0(t: Tensor) -> bool:
    """ggml_is_contiguous_0."""
    return _is_contiguous_n(t, 0)


@query
def ggml_is_contiguous_1(t: Tensor) -> bool:
    """ggml_is_contiguous_1: contiguous for dims >= 1."""
    return _is_contiguous_n(t, 1)


@query
def ggml_is_contiguous_2(t: Tensor) -> bool:
    """ggml_is_contiguous_2: contiguous for dims >= 2."""
    return _is_contiguous_n(t, 2)


@query
def ggml_is_contiguously_allocated(t: Tensor) -> bool:
    """ggml_is_contiguously_allocated: no gaps, though the dimensions may be permuted."""
    tr = TYPE_TRAITS[t.type]
    return ggml_nbytes(t) == ggml_nelements(t) * tr.type_size // tr.blck_size


@query
def ggml_is_contiguous_channels(t: Tensor) -> bool:
    """ggml_is_contiguous_channels."""
    nb = [int(x) for x in t.nb]
    return nb[0] > nb[2] and nb[1] > nb[0] and nb[2] == TYPE_TRAITS[t.type].type_size


@query
def ggml_is_contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: elements within a row are packed."""
    tr = TYPE_TRAITS[t.type]
    return int(t.ne[0]) == tr.blck_size or int(t.nb[0]) == tr.type_size


@query
def ggml_is_transposed(t: Tensor) -> bool:
    """ggml_is_transposed: nb[0] > nb[1]."""
    return int(t.nb[0]) > int(t.nb[1])


@query
def ggml_is_permuted(t: Tensor) -> bool:
    """ggml_is_permuted: strides out of increasing order."""
    nb = [int(x) for x in t.nb]
    return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]


@query
def ggml_are_same_shape(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_shape."""
    return all(int(x) == int(y) for x, y in zip(a.ne, b.ne))


@query
def ggml_are_same_stride(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_stride."""
    return all(int(x) == int(y) for x, y in zip(a.nb, b.nb))


@query
def ggml_can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_repeat: t1's shape is a whole multiple of t0's in every dimension."""
    if ggml_is_empty(t0):
        return ggml_is_empty(t1)
    return all(int(b) % int(a) == 0 for a, b in zip(t0.ne, t1.ne))


@query
def ggml_can_repeat_rows(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_repeat_rows: same ne[0], and repeatable."""
    return int(t0.ne[0]) == int(t1.ne[0]) and ggml_can_repeat(t0, t1)
