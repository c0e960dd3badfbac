"""A validating, memory-mapped GGUF reader that keeps every item's byte range.

Mirrors `gguf_init_from_reader` in gguf.cpp: the same fields read in the same order, every check
ggml makes (in ggml's order, so a bad file fails on the same rule), and the same derived numbers
(alignment, data offset `ctx->offset`, data size `ctx->size`, each tensor's ne, nb and nbytes).
Differences, all on purpose:
  * Big-endian files (ggml's rule: the version's low 16 bits read as 0) are read, byte-swapped.
    ggml refuses them; the gguf.h facade (`api.gguf_init_from_file`) refuses them as ggml does.
  * Stricter than ggml: counts that cannot fit in the rest of the file are refused before the
    loop that would read them; keys and tensor names must be valid UTF-8 and tensor names must not
    hold a NUL byte (ggml would cut the name there); `general.alignment` must be a u32 scalar
    (ggml aborts on another type and takes a one-element u32 array); a tensor's data must lie in
    the file even when no context is made (ggml only notices when it loads the blob).
  * String values are not checked (ggml does not); they decode with "surrogateescape", so every
    byte string round-trips through `str` and the writer unchanged.
  * A zero-sized dimension is accepted as an empty tensor (ggml divides by it and crashes).
  * n_dims == 0 is accepted as ggml does: ne stays (1, 1, 1, 1), a one-element tensor.
Nothing is read from the tensor data until asked; tensor data and numeric arrays are zero-copy
numpy views of the mapping; arrays of strings keep only their offsets and decode on access.
Leaves out: the ggml_context (see loader.py) and GGUF v1, which is recognised and refused.
"""

from __future__ import annotations

import array
import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.types import GGML_TYPE_COUNT, NUMPY_DTYPE, GGMLType, traits

from .format import (GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_DEFAULT_ALIGNMENT,
                     GGUF_KEY_GENERAL_ALIGNMENT, GGUF_MAGIC, GGUF_MAX_ARRAY_ELEMENTS,
                     GGUF_MAX_STRING_LENGTH, GGUF_VERSION, INT64_MAX, SIZE_MAX, TYPE_NAME,
                     GGUFError, GGUFValueType, dtype_for, gguf_type_size, pad, struct_for)

T = GGUFValueType
MIN_KV_BYTES = 8 + 4 + 1  # key length (the key may be empty: refused later), type, u8
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length (empty name), n_dims = 0, type, offset


@dataclass(frozen=True, slots=True)
class Span:
    """One labelled byte range of the file: what a byte map draws and highlights."""

    kind: str  # "magic", "kv", "key", "value", "tensor_info", "ne", "padding", "tensor_data", ...
    label: str  # what a reader of the map sees: the key, the tensor name, "ne[1]"
    offset: int  # first byte, from the start of the file
    size: int  # bytes
    children: tuple[Span, ...] = ()  # the fields inside a kv pair or a tensor info

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True, slots=True)
class KV:
    """One key-value pair, as `struct gguf_kv` plus where it lies in the file."""

    index: int
    key: str
    type: GGUFValueType  # ARRAY for an array (what gguf_get_kv_type returns)
    arr_type: GGUFValueType | None  # the element type of an array
    n: int  # elements: 1 for a scalar
    value: Any  # int/float/bool/str, a numpy array, or a StringArray
    span: Span  # the whole pair; children: key, type, [arr_type, arr_n], value

    @property
    def value_type(self) -> GGUFValueType:
        """The type of the value or of each element (gguf_kv::get_type)."""
        return self.arr_type if self.arr_type is not None else self.type


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor info (`struct gguf_tensor_info`) plus where it and its data lie."""

    index: int
    name: str
    n_dims: int  # as stored; ne is padded with 1s to 4 dims
    ne: tuple[int, int, int, int]
    type: GGMLType
    offset: int  # as stored: bytes from the start of the data section
    nb: tuple[int, int, int, int]  # contiguous byte strides, as gguf.cpp computes them
    nbytes: int  # ggml_nbytes
    data_offset: int  # absolute file offset of the data (data section start + offset)
    span: Span  # the info record; children: name, n_dims, ne[j]..., type, offset

    @property
    def n_elements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def shape(self) -> tuple[int, ...]:
        """ne[:n_dims] (at least one dim), fastest first, as ggml prints shapes."""
        return self.ne[:max(self.n_dims, 1)]


class StringArray(Sequence[str]):
    """An array of GGUF strings, located by one scan and decoded only when read.

    `offsets[i]` is the file offset of string i's 8-byte length field; `lengths[i]` its length.
    """

    __slots__ = ("_buf", "offsets", "lengths", "_decoded")

    def __init__(self, buf: Any, offsets: np.ndarray, lengths: np.ndarray) -> None:
        self._buf = buf
        self.offsets = offsets
        self.lengths = lengths
        self._decoded: list[str] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, i: int) -> bytes:
        """String i's bytes, exactly as stored."""
        start = int(self.offsets[i]) + 8
        return bytes(self._buf[start:start + int(self.lengths[i])])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._decoded is not None:
            return self._decoded[i]
        return self.raw(i).decode("utf-8", "surrogateescape")

    def tolist(self) -> list[str]:
        """Every string, decoded once and kept."""
        if self._decoded is None:
            buf = self._buf
            starts = (self.offsets + 8).tolist()
            self._decoded = [str(buf[s:s + n], "utf-8", "surrogateescape")
                             for s, n in zip(starts, self.lengths.tolist())]
        return self._decoded

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


class _Cursor:
    """Reads fixed-size fields, checking each against the bytes left (gguf_reader::read)."""

    def __init__(self, buf: Any, size: int, endian: str) -> None:
        self.buf = buf
        self.pos = 0
        self.end = size
        self.endian = endian
        self.structs = {t: struct_for(t, endian) for t in TYPE_NAME if gguf_type_size(t)}

    def need(self, n: int, field: str) -> None:
        if n > self.end - self.pos:
            raise GGUFError(field, self.pos, f"needs {n} bytes but only {self.end - self.pos} "
                                             "remain: the file is truncated")

    def read(self, type_: int, field: str) -> Any:
        st = self.structs[type_]
        self.need(st.size, field)
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def string(self, field: str) -> tuple[int, int]:
        """Read a string's length and skip its bytes; return (offset of its bytes, length)."""
        start = self.pos
        n = self.read(T.UINT64, f"{field} length")
        if n > GGUF_MAX_STRING_LENGTH:
            raise GGUFError(f"{field} length", start,
                            f"string length {n} exceeds ggml's maximum {GGUF_MAX_STRING_LENGTH}")
        if n > self.end - self.pos:
            raise GGUFError(f"{field} length", start, f"string length {n} exceeds the "
                                                      f"{self.end - self.pos} bytes left in file")
        self.pos += n
        return self.pos - n, n

    def text(self, field: str) -> tuple[str, int, int]:
        """A key or tensor name: (decoded text, offset of its bytes, length); UTF-8 checked."""
        at, n = self.string(field)
        try:
            return str(self.buf[at:at + n], "utf-8"), at, n
        except UnicodeDecodeError as e:
            raise GGUFError(field, at - 8, f"is not valid UTF-8 ({e.reason} at byte "
                                           f"{at + e.start})") from None


class GGUFReader:
    """gguf_init_from_file (no ggml context): parse and validate a GGUF file, memory-mapped.

    `source` is a path or a bytes-like object. Raises GGUFError for any malformed input.
    """

    def __init__(self, source: str | os.PathLike | bytes | bytearray | memoryview) -> None:
        self.path: str | None = None
        self._mmap: mmap.mmap | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            buf: Any = bytes(source) if not isinstance(source, bytes) else source
        else:
            self.path = os.fspath(source)
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                self._mmap = buf if size else None
        self._buf = buf
        self.size = len(buf)
        self.kvs: list[KV] = []
        self.tensors: list[TensorInfo] = []
        self._key_index: dict[str, int] = {}
        self._tensor_index: dict[str, int] = {}
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # --- parsing, in gguf_init_from_reader's order ------------------------------------------

    def _parse(self) -> None:
        buf, header = self._buf, []
        cur = _Cursor(buf, self.size, "<")
        cur.need(4, "magic")
        magic = bytes(buf[0:4])
        if magic != GGUF_MAGIC:
            shown = "".join(chr(c) if 32 <= c < 127 else "?" for c in magic)
            raise GGUFError("magic", 0, f"invalid magic characters '{shown}', expected 'GGUF'")
        cur.pos = 4
        header.append(Span("magic", "magic", 0, 4))
        version = cur.read(T.UINT32, "version")
        if version & 0xFFFF == 0 and version != 0:  # ggml's sign of a byte-swapped file
            cur = _Cursor(buf, self.size, ">")
            cur.pos = 8
            version = struct.unpack_from(">I", buf, 4)[0]
        self.byte_order = "little" if cur.endian == "<" else "big"
        if version == 0 or version & 0xFFFF == 0:
            raise GGUFError("version", 4, f"bad GGUF version {version}")
        if version == 1:
            raise GGUFError("version", 4, "GGUFv1 is no longer supported (ggml reads v2 and v3)")
        if version > GGUF_VERSION:
            raise GGUFError("version", 4, f"this GGUF file is version {version} but ggml only "
                                          f"supports up to version {GGUF_VERSION}")
        self.version = version
        header.append(Span("version", "version", 4, 4))
        self.n_tensors = self._count(cur, "n_tensors", MIN_TENSOR_INFO_BYTES, 0)
        header.append(Span("n_tensors", "n_tensors", 8, 8))
        self.n_kv = self._count(cur, "n_kv", MIN_KV_BYTES,
                                self.n_tensors * MIN_TENSOR_INFO_BYTES)
        header.append(Span("n_kv", "n_kv", 16, 8))
        self.header = tuple(header)

        for i in range(self.n_kv):
            self.kvs.append(self._read_kv(cur, i))
        self.alignment = self._alignment()
        for i in range(self.n_tensors):
            self.tensors.append(self._read_tensor_info(cur, i))

        self.infos_end = cur.pos
        self.data_offset = cur.pos  # ctx->offset
        if self.n_tensors > 0:
            self.data_offset = pad(cur.pos, self.alignment)
            if self.data_offset > self.size:
                raise GGUFError("padding", cur.pos, f"the data section would start at "
                                f"{self.data_offset} (aligned to {self.alignment}), past the "
                                f"end of the file ({self.size} bytes)")
        self._check_data()

    def _count(self, cur: _Cursor, field: str, min_bytes: int, reserved: int) -> int:
        at = cur.pos
        n = cur.read(T.INT64, field)
        if n < 0:
            raise GGUFError(field, at, f"is {n} but must not be negative")
        room = cur.end - cur.pos - reserved
        if n * min_bytes > room:
            raise GGUFError(field, at, f"is {n} but {n} items need at least {n * min_bytes} "
                                       f"bytes and only {max(room, 0)} remain in the file")
        return n

    def _read_kv(self, cur: _Cursor, i: int) -> KV:
        start = cur.pos
        key, _, klen = cur.text(f"key {i}")
        if klen == 0:
            raise GGUFError(f"key {i}", start, "the key is empty")
        if key in self._key_index:
            raise GGUFError(f"key {i} '{key}'", start,
                            f"duplicate key: key {self._key_index[key]} has the same name")
        fields = [Span("key", key, start, cur.pos - start)]
        at = cur.pos
        type_ = cur.read(T.INT32, f"key {i} '{key}' type")
        fields.append(Span("type", "type", at, 4))
        arr_type, n = None, 1
        if type_ == T.ARRAY:
            at = cur.pos
            arr_type = cur.read(T.INT32, f"key {i} '{key}' array type")
            fields.append(Span("arr_type", "array type", at, 4))
            at = cur.pos
            n = cur.read(T.UINT64, f"key {i} '{key}' array length")
            fields.append(Span("arr_n", "array length", at, 8))
            elem = arr_type
        else:
            elem = type_
        if not 0 <= elem < len(TYPE_NAME) or elem == T.ARRAY:
            what = "array element type" if arr_type is not None else "type"
            rule = ("arrays of arrays are not supported by ggml" if elem == T.ARRAY else
                    f"{elem} is not a GGUF type (must be in [0, {len(TYPE_NAME)}))")
            raise GGUFError(f"key {i} '{key}' {what}", fields[-1 if arr_type is None else -2]
                            .offset, f"invalid GGUF type {elem}: {rule}")
        vfield = f"key {i} '{key}' value"
        at = cur.pos
        if arr_type is None:
            value = self._read_scalar(cur, elem, vfield)
        else:
            value = self._read_array(cur, elem, n, vfield, fields[-1].offset)
        fields.append(Span("value", "value", at, cur.pos - at))
        self._key_index[key] = i
        span = Span("kv", key, start, cur.pos - start, tuple(fields))
        return KV(i, key, T(type_), None if arr_type is None else T(arr_type), n, value, span)

    def _read_scalar(self, cur: _Cursor, type_: int, field: str) -> Any:
        if type_ == T.STRING:
            at, n = cur.string(field)
            return str(self._buf[at:at + n], "utf-8", "surrogateescape")
        value = cur.read(type_, field)
        return value != 0 if type_ == T.BOOL else value

    def _read_array(self, cur: _Cursor, type_: int, n: int, field: str, n_at: int) -> Any:
        if n > GGUF_MAX_ARRAY_ELEMENTS:
            raise GGUFError(field.replace(" value", " array length"), n_at,
                            f"{n} elements exceed ggml's maximum {GGUF_MAX_ARRAY_ELEMENTS}")
        size = 8 if type_ == T.STRING else gguf_type_size(type_)
        if n * size > cur.end - cur.pos:
            raise GGUFError(field.replace(" value", " array length"), n_at,
                            f"{n} elements of at least {size} bytes cannot fit in the "
                            f"{cur.end - cur.pos} bytes left in the file")
        if type_ == T.STRING:
            offsets, cur.pos = scan_strings(self._buf, cur.pos, n, cur.end, cur.endian, field)
            lengths = np.diff(offsets, append=cur.pos) - 8
            return StringArray(self._buf, offsets, lengths)
        arr = np.frombuffer(self._buf, dtype=dtype_for(type_, cur.endian), count=n,
                            offset=cur.pos)
        cur.pos += n * size
        return arr != 0 if type_ == T.BOOL else arr

    def _alignment(self) -> int:
        i = self._key_index.get(GGUF_KEY_GENERAL_ALIGNMENT)
        if i is None:
            return GGUF_DEFAULT_ALIGNMENT
        kv = self.kvs[i]
        field = f"key {i} '{GGUF_KEY_GENERAL_ALIGNMENT}'"
        if kv.type != T.UINT32:
            shown = f"an array of {TYPE_NAME[kv.value_type]}" if kv.arr_type is not None \
                else TYPE_NAME[kv.type]
            raise GGUFError(field, kv.span.offset, f"must be of type u32 but is {shown}")
        if kv.value == 0 or kv.value & (kv.value - 1):
            raise GGUFError(field, kv.span.offset, f"alignment {kv.value} is not a power of 2")
        return kv.value

    def _read_tensor_info(self, cur: _Cursor, i: int) -> TensorInfo:
        start = cur.pos
        name, at, n = cur.text(f"tensor {i} name")
        if n >= GGML_MAX_NAME:
            raise GGUFError(f"tensor {i} name", start,
                            f"tensor name is too long: {n} bytes >= {GGML_MAX_NAME}")
        if "\0" in name:
            raise GGUFError(f"tensor {i} name", start, "tensor name holds a NUL byte")
        if name in self._tensor_index:
            raise GGUFError(f"tensor {i} '{name}'", start, f"duplicate tensor name: tensor "
                                                           f"{self._tensor_index[name]} has it")
        fields = [Span("name", name, start, cur.pos - start)]
        at = cur.pos
        n_dims = cur.read(T.UINT32, f"tensor '{name}' n_dims")
        fields.append(Span("n_dims", "n_dims", at, 4))
        if n_dims > GGML_MAX_DIMS:
            raise GGUFError(f"tensor '{name}' n_dims", at, f"invalid number of dimensions: "
                                                           f"{n_dims} > {GGML_MAX_DIMS}")
        ne = [1, 1, 1, 1]
        for j in range(n_dims):
            at = cur.pos
            ne[j] = cur.read(T.INT64, f"tensor '{name}' ne[{j}]")
            fields.append(Span("ne", f"ne[{j}]", at, 8))
            if ne[j] < 0:
                raise GGUFError(f"tensor '{name}' ne[{j}]", at,
                                f"dimension {j} has invalid number of elements: {ne[j]} < 0")
        if all(ne) and (INT64_MAX // ne[1] <= ne[0] or INT64_MAX // ne[2] <= ne[0] * ne[1]
                        or INT64_MAX // ne[3] <= ne[0] * ne[1] * ne[2]):
            raise GGUFError(f"tensor '{name}' ne", fields[2].offset, f"total number of "
                            f"elements of shape {tuple(ne)} is >= {INT64_MAX}")
        at = cur.pos
        type_ = cur.read(T.INT32, f"tensor '{name}' type")
        fields.append(Span("type", "type", at, 4))
        if not 0 <= type_ < GGML_TYPE_COUNT:
            raise GGUFError(f"tensor '{name}' type", at, f"invalid ggml type {type_}: "
                                                         f"should be in [0, {GGML_TYPE_COUNT})")
        tr = traits(type_)
        if tr.blck_size == 0 or ne[0] % tr.blck_size:
            raise GGUFError(f"tensor '{name}' type", at,
                            f"type {type_} ({tr.type_name}) has {ne[0]} elements per row, not "
                            f"a multiple of block size ({tr.blck_size})")
        n_el = ne[0] * ne[1] * ne[2] * ne[3]
        if n_el // tr.blck_size > SIZE_MAX // tr.type_size:
            raise GGUFError(f"tensor '{name}' type", at,
                            f"shape {tuple(ne)} has a size in bytes > {SIZE_MAX}")
        nb0 = tr.type_size
        nb1 = nb0 * (ne[0] // tr.blck_size)
        nb = (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])
        at = cur.pos
        offset = cur.read(T.UINT64, f"tensor '{name}' offset")
        fields.append(Span("offset", "offset", at, 8))
        self._tensor_index[name] = i
        span = Span("tensor_info", name, start, cur.pos - start, tuple(fields))
        nbytes = n_el // tr.blck_size * tr.type_size
        return TensorInfo(i, name, n_dims, (ne[0], ne[1], ne[2], ne[3]), GGMLType(type_), offset, nb,
                          nbytes, -1, span)

    def _check_data(self) -> None:
        """Offsets must be ggml's packed offsets; data must lie inside the file."""
        expected = 0
        for k, t in enumerate(self.tensors):
            field = f"tensor '{t.name}' offset"
            at = t.span.children[-1].offset
            if t.offset != expected:
                raise GGUFError(field, at, f"offset is {t.offset}, expected {expected}: "
                                "tensors must be packed in order, each padded to "
                                f"{self.alignment} bytes")
            start = self.data_offset + t.offset
            if start + t.nbytes > self.size:
                raise GGUFError(field, at, f"data [{start}, {start + t.nbytes}) lies past the "
                                           f"end of the file ({self.size} bytes)")
            expected += pad(t.nbytes, self.alignment)
            if expected > SIZE_MAX:
                raise GGUFError(field, at, "size overflow accumulating the data section size")
            self.tensors[k] = _with_data_offset(t, start)
        self.data_size = expected  # ctx->size

    # --- queries ----------------------------------------------------------------------------

    def find_key(self, key: str) -> int:
        """gguf_find_key: the key's index, or -1."""
        return self._key_index.get(key, -1)

    def find_tensor(self, name: str) -> int:
        """gguf_find_tensor: the tensor's index, or -1."""
        return self._tensor_index.get(name, -1)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key` (decoded strings for a string array), or `default`."""
        i = self._key_index.get(key)
        if i is None:
            return default
        value = self.kvs[i].value
        return value.tolist() if isinstance(value, StringArray) else value

    def tensor_bytes(self, t: TensorInfo | int | str) -> np.ndarray:
        """A tensor's data as a zero-copy uint8 view of the file."""
        t = self._tensor(t)
        return np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.data_offset)

    def tensor_data(self, t: TensorInfo | int | str) -> np.ndarray:
        """A tensor's data as a zero-copy view, shaped (ne3, ne2, ne1, ne0) in numpy order.

        Plain types get their element dtype (F16 as float16, BF16 as its uint16 bits); quantized
        types are raw block bytes, shaped (ne3, ne2, ne1, row bytes).
        """
        t = self._tensor(t)
        raw = self.tensor_bytes(t)
        dtype = NUMPY_DTYPE.get(t.type)
        if dtype is None:
            return raw.reshape(t.ne[3], t.ne[2], t.ne[1], t.nb[1])
        dtype = dtype.newbyteorder("<" if self.byte_order == "little" else ">")
        return raw.view(dtype).reshape(t.ne[::-1])

    def _tensor(self, t: TensorInfo | int | str) -> TensorInfo:
        if isinstance(t, TensorInfo):
            return t
        i = t if isinstance(t, int) else self._tensor_index.get(t, -1)
        if not 0 <= i < len(self.tensors):
            raise GGUFError(f"tensor {t!r}", -1, "no such tensor in this file")
        return self.tensors[i]

    def byte_map(self) -> list[Span]:
        """Every region of the file in order: header fields, kv pairs, tensor infos, padding,
        each tensor's data and its padding, and any bytes after the data section."""
        spans = list(self.header) + [kv.span for kv in self.kvs]
        spans += [t.span for t in self.tensors]
        pos = self.infos_end
        if self.data_offset > pos:
            spans.append(Span("padding", "padding before data", pos, self.data_offset - pos))
        pos = self.data_offset
        for t in self.tensors:
            spans.append(Span("tensor_data", t.name, t.data_offset, t.nbytes))
            end = min(self.data_offset + t.offset + pad(t.nbytes, self.alignment), self.size)
            if end > t.data_offset + t.nbytes:
                spans.append(Span("tensor_padding", f"padding after {t.name}",
                                  t.data_offset + t.nbytes, end - t.data_offset - t.nbytes))
            pos = end
        if pos < self.size:
            spans.append(Span("trailing", "bytes after the data section", pos, self.size - pos))
        return spans

    def close(self) -> None:
        """gguf_free: drop the mapping (views still alive keep it open until they go)."""
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # numpy views still use it; it closes when they are gone
            self._mmap = None

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_data_offset(t: TensorInfo, data_offset: int) -> TensorInfo:
    return TensorInfo(t.index, t.name, t.n_dims, t.ne, t.type, t.offset, t.nb, t.nbytes,
                      data_offset, t.span)


# --- arrays of strings ----------------------------------------------------------------------

def scan_strings(buf: Any, pos: int, n: int, end: int, endian: str,
                 field: str) -> tuple[np.ndarray, int]:
    """Locate n consecutive length-prefixed strings from `pos`: (file offsets of their length
    fields, position after the last), each length checked as gguf_reader::read(std::string).

    One step per string, by necessity: where string i+1 starts depends on string i's length.
    The loop only records offsets (no bytes objects, no decoding) and checks nothing: a length
    that runs past the buffer makes the next read fail, and the rules are checked after the
    loop, so a step costs about 130 ns. (Vectorised numpy scans were tried: on short strings
    they lost to this loop.)
    """
    length = struct.Struct(endian + "Q").unpack_from
    offsets = array.array("q")
    keep = offsets.append
    try:
        for _ in range(n >> 2):  # unrolled by four: the loop's own overhead is a fifth
            keep(pos)
            pos += 8 + length(buf, pos)[0]
            keep(pos)
            pos += 8 + length(buf, pos)[0]
            keep(pos)
            pos += 8 + length(buf, pos)[0]
            keep(pos)
            pos += 8 + length(buf, pos)[0]
        for _ in range(n & 3):
            keep(pos)
            pos += 8 + length(buf, pos)[0]
    except (struct.error, OverflowError):
        _string_error(buf, offsets, end, endian, field)
    found = np.frombuffer(offsets, dtype=np.int64) if n else np.zeros(0, np.int64)
    if pos > end or (n and int(np.diff(found, append=pos).max()) - 8 > GGUF_MAX_STRING_LENGTH):
        _string_error(buf, offsets, end, endian, field)
    return found, pos


def _string_error(buf: Any, offsets: Sequence[int], end: int, endian: str, field: str) -> None:
    """Raise GGUFError for the first string that breaks a rule."""
    for i, pos in enumerate(offsets):
        what = f"{field}[{i}] length"
        if pos > end - 8:
            raise GGUFError(what, pos, f"needs 8 bytes but only {max(end - pos, 0)} remain: "
                                       "the file is truncated")
        (size,) = struct.unpack_from(endian + "Q", buf, pos)
        if size > GGUF_MAX_STRING_LENGTH:
            raise GGUFError(what, pos, f"string length {size} exceeds ggml's maximum "
                                       f"{GGUF_MAX_STRING_LENGTH}")
        if size > end - pos - 8:
            raise GGUFError(what, pos, f"string length {size} exceeds the {end - pos - 8} "
                                       "bytes left in the file")
    raise AssertionError("no string breaks a rule")  # unreachable: the caller found one
