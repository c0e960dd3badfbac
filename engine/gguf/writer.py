"""`struct gguf_context` as a mutable record, and ggml's GGUF writer.

Mirrors gguf.cpp's context (kv pairs in order, tensor infos in order, alignment) with its mutation
rules (setting a key removes it first and appends it, a duplicate tensor name is refused) and
`gguf_write_out`: magic, version 3, counts, kv pairs, tensor infos, zero padding to the alignment
(`gguf_get_meta_size` stops here), then each tensor's bytes followed by zero padding.
Differences: where C aborts (GGML_ASSERT) this raises GGUFError; integer values out of their
type's range are refused instead of wrapping; `general.alignment` set on the context is honoured
when the file is written (ggml keeps padding to the alignment it had when tensors were added);
tensor offsets are computed when writing, so they always match the final alignment.
Leaves out: big-endian output and backend buffers (tensor data is given as bytes).
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.core.errors import GGMLAbortError, ggml_assert
from engine.core.tensor import dims4, n_dims_of
from engine.core.types import GGML_TYPE_COUNT, GGMLType, traits

from .format import (GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_DEFAULT_ALIGNMENT,
                     GGUF_KEY_GENERAL_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, TYPE_NAME, GGUFError,
                     GGUFValueType, dtype_for, pad, struct_for)
from .reader import GGUFReader, StringArray

T = GGUFValueType
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class KVEntry:
    """One `struct gguf_kv`: a key and a scalar value or an array of one type."""

    key: str
    type: GGUFValueType  # of the value, or of each element of an array
    is_array: bool
    value: Any  # python scalar; numpy array; list of str or StringArray for a string array

    @property
    def n(self) -> int:
        """gguf_kv::get_ne: 1 for a scalar, the element count of an array."""
        return len(self.value) if self.is_array else 1


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One `struct gguf_tensor_info`: name, type, ne, the dims to store, and the bytes."""

    name: str
    type: GGMLType
    ne: tuple[int, int, int, int]
    n_dims: int  # what the info stores (ggml writes ggml_n_dims: trailing 1s dropped)
    nbytes: int
    data: Any  # bytes-like of nbytes, or None when only metadata is known


class GGUFContext:
    """gguf_init_empty: an empty GGUF context (version 3, alignment 32) to fill and write."""

    def __init__(self) -> None:
        self.version = GGUF_VERSION
        self.kv: list[KVEntry] = []
        self.info: list[TensorEntry] = []
        self.offset = 0  # where the data section starts in the file it was read from
        self.reader: GGUFReader | None = None  # the parsed file, when read from one

    # --- kv pairs ---------------------------------------------------------------------------

    @property
    def alignment(self) -> int:
        """gguf_get_alignment: general.alignment when set, else 32."""
        i = self.find_key(GGUF_KEY_GENERAL_ALIGNMENT)
        return GGUF_DEFAULT_ALIGNMENT if i < 0 else int(self.kv[i].value)

    def find_key(self, key: str) -> int:
        """gguf_find_key: the index of `key`, or -1."""
        return next((i for i, kv in enumerate(self.kv) if kv.key == key), -1)

    def remove_key(self, key: str) -> int:
        """gguf_remove_key: drop `key` if present; return its old index or -1."""
        i = self.find_key(key)
        if i >= 0:
            del self.kv[i]
        return i

    def set_val(self, key: str, type_: int, value: Any) -> None:
        """gguf_set_val_<type>: set a scalar, replacing (and moving to the end) any old value."""
        self._set(KVEntry(key, _value_type(type_, key), False, _scalar(type_, value, key)))

    def set_arr(self, key: str, type_: int, values: Any) -> None:
        """gguf_set_arr_data / gguf_set_arr_str: set an array of one element type."""
        type_ = _value_type(type_, key)
        if type_ == T.STRING:
            if not isinstance(values, StringArray):
                values = [_scalar(T.STRING, v, key) for v in values]
        else:
            values = _array(type_, values, key)
        self._set(KVEntry(key, type_, True, values))

    def _set(self, kv: KVEntry) -> None:
        if not kv.key:
            raise GGUFError("key", -1, "a key must not be empty")
        if kv.key == GGUF_KEY_GENERAL_ALIGNMENT:
            if kv.is_array or kv.type != T.UINT32:
                raise GGUFError(f"key '{kv.key}'", -1, "general.alignment must be type u32")
            if kv.value == 0 or kv.value & (kv.value - 1):
                raise GGUFError(f"key '{kv.key}'", -1,
                                f"general.alignment must be a power of 2, not {kv.value}")
        self.remove_key(kv.key)
        self.kv.append(kv)

    # --- tensors ----------------------------------------------------------------------------

    def find_tensor(self, name: str) -> int:
        """gguf_find_tensor: the index of tensor `name`, or -1."""
        return next((i for i, t in enumerate(self.info) if t.name == name), -1)

    def add_tensor(self, name: str, type_: int, ne: tuple[int, ...] | list[int], data: Any,
                   n_dims: int | None = None) -> None:
        """gguf_add_tensor, from raw bytes: `ne` fastest first; `data` holds exactly ggml_nbytes
        bytes (or None for metadata only). n_dims defaults to what ggml_n_dims gives (n_dims_of)."""
        field = f"tensor '{name}'"
        raw = name.encode("utf-8", "surrogateescape")
        if len(raw) >= GGML_MAX_NAME or "\0" in name:
            raise GGUFError(field, -1, f"a tensor name must be under {GGML_MAX_NAME} bytes "
                                       "without NUL bytes")
        if self.find_tensor(name) >= 0:
            raise GGUFError(field, -1, f"duplicate tensor name: {name}")
        if not 0 <= int(type_) < GGML_TYPE_COUNT or traits(type_).blck_size == 0:
            raise GGUFError(field, -1, f"{int(type_)} is not a usable ggml type")
        if not 1 <= len(ne) <= GGML_MAX_DIMS or any(int(x) < 0 for x in ne):
            raise GGUFError(field, -1, f"ne {tuple(ne)} must be 1 to 4 non-negative sizes")
        ne4 = dims4([*ne, *[1] * (GGML_MAX_DIMS - len(ne))])
        tr = traits(type_)
        if ne4[0] % tr.blck_size:
            raise GGUFError(field, -1, f"ne[0] = {ne4[0]} is not a multiple of the "
                                       f"{tr.type_name} block size {tr.blck_size}")
        n_dims = n_dims_of(ne4) if n_dims is None else n_dims
        if not 0 <= n_dims <= GGML_MAX_DIMS or any(x != 1 for x in ne4[n_dims:]):
            raise GGUFError(field, -1, f"n_dims {n_dims} does not fit ne {ne4}")
        nbytes = ne4[0] * ne4[1] * ne4[2] * ne4[3] // tr.blck_size * tr.type_size
        if data is not None:
            data = memoryview(data).cast("B")
            if len(data) != nbytes:
                raise GGUFError(field, -1, f"data holds {len(data)} bytes; a {tr.type_name} "
                                           f"tensor of ne {ne4} needs {nbytes}")
        self.info.append(TensorEntry(name, GGMLType(type_), ne4, n_dims, nbytes, data))

    def _tensor(self, name: str, fn: str) -> int:
        i = self.find_tensor(name)
        if i < 0:
            raise GGMLAbortError(f"tensor not found: {name}", fn)
        return i

    def set_tensor_type(self, name: str, type_: int) -> None:
        """gguf_set_tensor_type: a new type for tensor `name`; its nbytes follow (and its old
        bytes, which no longer fit, are dropped)."""
        i = self._tensor(name, "gguf_set_tensor_type")
        t = self.info[i]
        tr = traits(type_)
        ggml_assert(t.ne[0] % tr.blck_size == 0,
                    "tensor->ne[0] % blck_size == 0 && \"tensor row size not divisible by block size of new type\"",
                    "gguf_set_tensor_type", f"ne[0] = {t.ne[0]}, {tr.type_name} blocks of {tr.blck_size}")
        nbytes = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3] // tr.blck_size * tr.type_size
        self.info[i] = TensorEntry(t.name, GGMLType(type_), t.ne, t.n_dims, nbytes,
                                   t.data if t.data is not None and len(t.data) == nbytes else None)

    def set_tensor_data(self, name: str, data: Any) -> None:
        """gguf_set_tensor_data: the bytes written for tensor `name` (its first nbytes)."""
        i = self._tensor(name, "gguf_set_tensor_data")
        t = self.info[i]
        raw = memoryview(data).cast("B")
        if len(raw) < t.nbytes:
            raise GGUFError(f"tensor '{name}'", -1, f"data holds {len(raw)} bytes; it needs {t.nbytes}")
        self.info[i] = TensorEntry(t.name, t.type, t.ne, t.n_dims, t.nbytes, raw[:t.nbytes])

    def tensor_offsets(self) -> list[int]:
        """gguf_get_tensor_offset for every tensor: packed, each padded to the alignment."""
        offsets, at = [], 0
        for t in self.info:
            offsets.append(at)
            at += pad(t.nbytes, self.alignment)
        return offsets

    @property
    def size(self) -> int:
        """ctx->size: the data section's size, every tensor padded."""
        return sum(pad(t.nbytes, self.alignment) for t in self.info)

    # --- writing ----------------------------------------------------------------------------

    def write(self, out: _Sink, only_meta: bool = False) -> int:
        """gguf_write_to_file_ptr: write the file (or only its metadata); return bytes written."""
        align, written = self.alignment, 0

        def put(b: Any) -> None:
            nonlocal written
            out.write(b)
            written += len(b)

        put(GGUF_MAGIC + struct.pack("<Iqq", self.version, len(self.info), len(self.kv)))
        for kv in self.kv:
            for b in kv_bytes(kv):
                put(b)
        for t, offset in zip(self.info, self.tensor_offsets()):
            put(_string(t.name) + struct.pack(f"<I{t.n_dims}qiQ", t.n_dims, *t.ne[:t.n_dims],
                                              t.type, offset))
        put(bytes(pad(written, align) - written))
        if only_meta:
            return written
        for t in self.info:
            if t.data is None:
                raise GGUFError(f"tensor '{t.name}'", -1, "has no data to write")
            put(t.data)
            put(bytes(pad(t.nbytes, align) - t.nbytes))
        return written

    def to_bytes(self, only_meta: bool = False) -> bytes:
        """gguf_write_to_buf: the file as bytes."""
        buf = io.BytesIO()
        self.write(buf, only_meta)
        return buf.getvalue()

    def write_to_file(self, path: str | os.PathLike, only_meta: bool = False) -> bool:
        """gguf_write_to_file."""
        with open(path, "wb") as f:
            self.write(f, only_meta)
        return True

    def meta_size(self) -> int:
        """gguf_get_meta_size: bytes before the data section, padding included."""
        return self.write(_Counter(), only_meta=True)

    @classmethod
    def from_reader(cls, r: GGUFReader) -> GGUFContext:
        """The context gguf_init_from_file builds: r's kv pairs and tensor infos, values and
        tensor data as zero-copy views of r's mapping."""
        ctx = cls()
        ctx.version, ctx.offset, ctx.reader = r.version, r.data_offset, r
        for kv in r.kvs:
            value = kv.value
            if r.byte_order == "big" and kv.arr_type is not None:  # keep arrays little-endian
                value = value.tolist() if kv.arr_type == T.STRING else \
                    value.astype(value.dtype.newbyteorder("<"))
            ctx.kv.append(KVEntry(kv.key, kv.value_type, kv.arr_type is not None, value))
        for t in r.tensors:
            ctx.info.append(TensorEntry(t.name, t.type, t.ne, t.n_dims, t.nbytes,
                                        r.tensor_bytes(t) if r.byte_order == "little" else None))
        return ctx


class _Sink(Protocol):
    """Where GGUFContext.write writes: a binary file, a buffer, or _Counter."""

    def write(self, b: bytes, /) -> object: ...


class _Counter:
    """A sink that only counts (for gguf_get_meta_size)."""

    def write(self, b: Any) -> None:
        pass


def _string(s: str | bytes) -> bytes:
    raw = s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")
    return _U64.pack(len(raw)) + raw


def kv_bytes(kv: KVEntry) -> list[bytes]:
    """One kv pair as gguf_writer_base::write(gguf_kv) lays it out."""
    head = _string(kv.key)
    if kv.is_array:
        head += struct.pack("<iiQ", T.ARRAY, kv.type, kv.n)
    else:
        head += struct.pack("<i", kv.type)
    if kv.type == T.STRING:
        if not kv.is_array:
            return [head, _string(kv.value)]
        if isinstance(kv.value, StringArray) and kv.n:
            sa = kv.value  # one little-endian run in the source file: copy it whole
            start, stop = int(sa.offsets[0]), int(sa.offsets[-1]) + 8 + int(sa.lengths[-1])
            return [head, bytes(sa._buf[start:stop])]
        return [head, b"".join(_string(s) for s in kv.value)]
    if not kv.is_array:
        value = int(bool(kv.value)) if kv.type == T.BOOL else kv.value
        return [head, struct_for(kv.type, "<").pack(value)]
    arr = np.asarray(kv.value)
    if kv.type == T.BOOL:
        arr = arr != 0
    return [head, arr.astype(dtype_for(kv.type, "<"), copy=False).tobytes()]


def _value_type(type_: int, key: str) -> GGUFValueType:
    if type_ not in TYPE_NAME or type_ == T.ARRAY:
        raise GGUFError(f"key '{key}'", -1, f"invalid GGUF value type {type_}")
    return T(type_)


def _scalar(type_: int, value: Any, key: str) -> Any:
    """A python value of gguf type `type_`, range-checked."""
    if type_ == T.STRING:
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8", "surrogateescape")
        return str(value)
    if type_ == T.BOOL:
        return bool(value)
    if type_ in (T.FLOAT32, T.FLOAT64):
        return float(np.float32(value)) if type_ == T.FLOAT32 else float(value)
    info = np.iinfo(dtype_for(type_, "<"))
    if not info.min <= int(value) <= info.max:
        raise GGUFError(f"key '{key}'", -1, f"{value} does not fit in {TYPE_NAME[T(type_)]}")
    return int(value)


def _array(type_: int, values: Any, key: str) -> np.ndarray:
    """An owned numpy array of gguf element type `type_` (copied, as C copies)."""
    if type_ == T.BOOL:
        return np.array(values, dtype=bool).reshape(-1)
    dtype = dtype_for(type_, "<")
    src = np.asarray(values)
    if src.dtype.kind in "iub" and src.size:
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        if info is not None and (src.min() < info.min or src.max() > info.max):
            raise GGUFError(f"key '{key}'", -1,
                            f"array values do not fit in {TYPE_NAME[T(type_)]}")
    return np.array(src, dtype=dtype).reshape(-1)

