"""gguf.h as Python: the same function names, arguments and constants, over GGUFContext.

A program written against gguf.h reads the same here:

    ctx = gguf_init_from_file("model.gguf", gguf_init_params(no_alloc=True))
    i = gguf_find_key(ctx, "general.architecture")       # -1 when missing
    arch = gguf_get_val_str(ctx, i)

Where C asserts (a wrong type, an index out of range) this raises GGUFError naming the assertion.
Where C returns NULL after logging (a malformed file) this raises GGUFError with the reason.
Leaves out: gguf_init_from_file_ptr/_from_buffer/_from_callback (GGUFReader takes bytes), and
gguf_get_data (tensor data are views: GGUFReader.tensor_data).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.api import query, writes

from .format import (GGUF_DEFAULT_ALIGNMENT, GGUF_KEY_GENERAL_ALIGNMENT, GGUF_MAGIC,
                     GGUF_VERSION, GGUFError, GGUFValueType, gguf_type_name, gguf_type_size)
from .loader import load_into_context
from .reader import GGUFReader, StringArray
from .writer import GGUFContext

__all__ = [
    "GGUF_MAGIC", "GGUF_VERSION", "GGUF_DEFAULT_ALIGNMENT", "GGUF_KEY_GENERAL_ALIGNMENT",
    "gguf_init_params", "gguf_init_empty", "gguf_init_from_file", "gguf_free", "gguf_type_name",
    "gguf_type_size", "gguf_get_version", "gguf_get_alignment", "gguf_get_data_offset",
    "gguf_get_n_kv", "gguf_find_key", "gguf_get_key", "gguf_get_kv_type", "gguf_get_arr_type",
    "gguf_get_arr_n", "gguf_get_arr_data", "gguf_get_arr_str", "gguf_get_val_u8",
    "gguf_get_val_i8", "gguf_get_val_u16", "gguf_get_val_i16", "gguf_get_val_u32",
    "gguf_get_val_i32", "gguf_get_val_f32", "gguf_get_val_u64", "gguf_get_val_i64",
    "gguf_get_val_f64", "gguf_get_val_bool", "gguf_get_val_str", "gguf_get_val_data",
    "gguf_get_n_tensors", "gguf_find_tensor", "gguf_get_tensor_offset", "gguf_get_tensor_name",
    "gguf_get_tensor_type", "gguf_get_tensor_size", "gguf_remove_key", "gguf_set_val_u8",
    "gguf_set_val_i8", "gguf_set_val_u16", "gguf_set_val_i16", "gguf_set_val_u32",
    "gguf_set_val_i32", "gguf_set_val_f32", "gguf_set_val_u64", "gguf_set_val_i64",
    "gguf_set_val_f64", "gguf_set_val_bool", "gguf_set_val_str", "gguf_set_arr_data",
    "gguf_set_arr_str", "gguf_set_kv", "gguf_add_tensor", "gguf_write_to_file",
    "gguf_get_meta_size", "gguf_get_meta_data", "gguf_init_from_buffer", "gguf_init_from_callback",
    "gguf_set_tensor_type", "gguf_set_tensor_data",
]

T = GGUFValueType
GGUF_TYPE_UINT8, GGUF_TYPE_INT8, GGUF_TYPE_UINT16, GGUF_TYPE_INT16 = 0, 1, 2, 3
GGUF_TYPE_UINT32, GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL = 4, 5, 6, 7
GGUF_TYPE_STRING, GGUF_TYPE_ARRAY, GGUF_TYPE_UINT64, GGUF_TYPE_INT64 = 8, 9, 10, 11
GGUF_TYPE_FLOAT64, GGUF_TYPE_COUNT = 12, 13
__all__ += [name for name in list(globals()) if name.startswith("GGUF_TYPE_")]


@dataclass(frozen=True, slots=True)
class gguf_init_params:  # noqa: N801 - C's name
    """struct gguf_init_params. In C `ctx` is a `struct ggml_context **` out-pointer; here it is
    a flag, and gguf_init_from_file returns the created context beside the gguf context."""

    no_alloc: bool = False
    ctx: bool = False


@writes()
def gguf_init_empty() -> GGUFContext:
    """gguf_init_empty: an empty context to fill and write."""
    return GGUFContext()


@writes()
def gguf_init_from_file(fname: str | os.PathLike, params: gguf_init_params | None = None) -> Any:
    """gguf_init_from_file: read and check a GGUF file.

    Returns the gguf context; with `params.ctx` true, returns `(gguf_ctx, ggml_ctx)`, the ggml
    context laid out as ggml lays it out (see loader.py): in C that second result is written
    through the `params.ctx` out-pointer. Where C logs and returns NULL this raises GGUFError;
    like ggml it refuses big-endian files (GGUFReader alone reads them).
    """
    params = params or gguf_init_params()
    try:
        r = GGUFReader(fname)
    except OSError as e:
        raise GGUFError("file", -1, f"failed to open GGUF file '{os.fspath(fname)}' "
                                    f"({e.strerror})") from None
    return _init_from_reader(r, params)


@writes()
def gguf_init_from_buffer(data: Any, size: int, params: gguf_init_params | None = None) -> Any:
    """gguf_init_from_buffer: read and check a GGUF file held in memory (its first `size` bytes);
    None for no data, as C returns NULL. Returns what gguf_init_from_file returns."""
    if data is None or size == 0:
        return None
    return _init_from_reader(GGUFReader(bytes(memoryview(data).cast("B")[:size])), params)


@writes()
def gguf_init_from_callback(callback: Any, userdata: Any, max_chunk_read: int, max_expected_size: int,
                            params: gguf_init_params | None = None) -> Any:
    """gguf_init_from_callback: read a GGUF file through callback(userdata, out, offset, n) -> bytes
    written into `out` (a writable memoryview of n bytes), in chunks of at most max_chunk_read
    (0: no limit), up to max_expected_size bytes or until the callback gives fewer than asked.
    None without a callback, as C returns NULL."""
    if callback is None:
        return None
    chunk = max_chunk_read if max_chunk_read > 0 else 1 << 20
    data, offset = bytearray(), 0
    while offset < max_expected_size:
        want = min(chunk, max_expected_size - offset)
        buf = bytearray(want)
        got = int(callback(userdata, memoryview(buf), offset, want))
        data += buf[:max(0, min(got, want))]
        offset += max(got, 0)
        if got < want:
            break
    return _init_from_reader(GGUFReader(bytes(data)), params)


def _init_from_reader(r: GGUFReader, params: gguf_init_params | None) -> Any:
    params = params or gguf_init_params()
    if r.byte_order != "little":
        r.close()
        raise GGUFError("version", 4, f"this GGUF file version {r.version << 24} is extremely "
                        "large: the file is big-endian, which ggml does not read")
    ctx = GGUFContext.from_reader(r)
    if not params.ctx:
        return ctx
    return ctx, load_into_context(r, params.no_alloc)


@writes()
def gguf_free(ctx: GGUFContext) -> None:
    """gguf_free: drop the context (and its file mapping)."""
    if ctx.reader is not None:
        ctx.reader.close()


@query
def gguf_get_version(ctx: GGUFContext) -> int:
    """gguf_get_version."""
    return ctx.version


@query
def gguf_get_alignment(ctx: GGUFContext) -> int:
    """gguf_get_alignment."""
    return ctx.alignment


@query
def gguf_get_data_offset(ctx: GGUFContext) -> int:
    """gguf_get_data_offset: where the data section starts in the file read (0 if none)."""
    return ctx.offset


@query
def gguf_get_n_kv(ctx: GGUFContext) -> int:
    """gguf_get_n_kv."""
    return len(ctx.kv)


@query
def gguf_find_key(ctx: GGUFContext, key: str) -> int:
    """gguf_find_key: the key's index, -1 when missing."""
    return ctx.find_key(key)


def _kv(ctx: GGUFContext, key_id: int, fn: str):
    if not 0 <= key_id < len(ctx.kv):
        raise GGUFError(f"key_id {key_id}", -1,
                        f"{fn}: GGML_ASSERT(key_id >= 0 && key_id < gguf_get_n_kv(ctx)) failed")
    return ctx.kv[key_id]


@query
def gguf_get_key(ctx: GGUFContext, key_id: int) -> str:
    """gguf_get_key."""
    return _kv(ctx, key_id, "gguf_get_key").key


@query
def gguf_get_kv_type(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_kv_type: GGUF_TYPE_ARRAY for an array, else the value's type."""
    kv = _kv(ctx, key_id, "gguf_get_kv_type")
    return T.ARRAY if kv.is_array else kv.type


@query
def gguf_get_arr_type(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_arr_type: an array's element type."""
    kv = _kv(ctx, key_id, "gguf_get_arr_type")
    _check(kv.is_array, ctx, key_id, "gguf_get_arr_type", "ctx->kv[key_id].is_array")
    return kv.type


@query
def gguf_get_arr_n(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_arr_n: the element count (1 for a scalar, as in C)."""
    return _kv(ctx, key_id, "gguf_get_arr_n").n


@query
def gguf_get_arr_data(ctx: GGUFContext, key_id: int) -> np.ndarray:
    """gguf_get_arr_data: the elements of a non-string array, as a numpy array."""
    kv = _kv(ctx, key_id, "gguf_get_arr_data")
    _check(kv.type != T.STRING, ctx, key_id, "gguf_get_arr_data",
           "ctx->kv[key_id].get_type() != GGUF_TYPE_STRING")
    return kv.value if kv.is_array else np.array([kv.value])


@query
def gguf_get_arr_str(ctx: GGUFContext, key_id: int, i: int) -> str:
    """gguf_get_arr_str: string i of a string array."""
    kv = _kv(ctx, key_id, "gguf_get_arr_str")
    _check(kv.type == T.STRING, ctx, key_id, "gguf_get_arr_str",
           "ctx->kv[key_id].get_type() == GGUF_TYPE_STRING")
    _check(0 <= i < kv.n, ctx, key_id, "gguf_get_arr_str", f"i < n ({i} of {kv.n})")
    return kv.value[i] if kv.is_array else kv.value


def _get_val(ctx: GGUFContext, key_id: int, type_: GGUFValueType) -> Any:
    fn = f"gguf_get_val_{gguf_type_name(type_)}"
    kv = _kv(ctx, key_id, fn)
    _check(kv.n == 1, ctx, key_id, fn, "ctx->kv[key_id].get_ne() == 1")
    _check(kv.type == type_, ctx, key_id, fn, f"type is {gguf_type_name(kv.type)}, "
                                              f"not {gguf_type_name(type_)}")
    if not kv.is_array:
        return kv.value
    value = kv.value[0]
    return value.item() if isinstance(value, np.generic) else value


def _check(ok: bool, ctx: GGUFContext, key_id: int, fn: str, condition: str) -> None:
    if not ok:
        kv = ctx.kv[key_id]
        r = ctx.reader
        at = r.kvs[key_id].span.offset if r is not None and key_id < len(r.kvs) \
            and r.kvs[key_id].key == kv.key else -1
        raise GGUFError(f"key {key_id} '{kv.key}'", at, f"{fn}: GGML_ASSERT({condition}) failed")


@query
def gguf_get_val_u8(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_u8."""
    return _get_val(ctx, key_id, T.UINT8)


@query
def gguf_get_val_i8(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_i8."""
    return _get_val(ctx, key_id, T.INT8)


@query
def gguf_get_val_u16(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_u16."""
    return _get_val(ctx, key_id, T.UINT16)


@query
def gguf_get_val_i16(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_i16."""
    return _get_val(ctx, key_id, T.INT16)


@query
def gguf_get_val_u32(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_u32."""
    return _get_val(ctx, key_id, T.UINT32)


@query
def gguf_get_val_i32(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_i32."""
    return _get_val(ctx, key_id, T.INT32)


@query
def gguf_get_val_f32(ctx: GGUFContext, key_id: int) -> float:
    """gguf_get_val_f32."""
    return _get_val(ctx, key_id, T.FLOAT32)


@query
def gguf_get_val_u64(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_u64."""
    return _get_val(ctx, key_id, T.UINT64)


@query
def gguf_get_val_i64(ctx: GGUFContext, key_id: int) -> int:
    """gguf_get_val_i64."""
    return _get_val(ctx, key_id, T.INT64)


@query
def gguf_get_val_f64(ctx: GGUFContext, key_id: int) -> float:
    """gguf_get_val_f64."""
    return _get_val(ctx, key_id, T.FLOAT64)


@query
def gguf_get_val_bool(ctx: GGUFContext, key_id: int) -> bool:
    """gguf_get_val_bool."""
    return bool(_get_val(ctx, key_id, T.BOOL))


@query
def gguf_get_val_str(ctx: GGUFContext, key_id: int) -> str:
    """gguf_get_val_str."""
    return _get_val(ctx, key_id, T.STRING)


@query
def gguf_get_val_data(ctx: GGUFContext, key_id: int) -> bytes:
    """gguf_get_val_data: a non-string scalar's bytes, little-endian."""
    kv = _kv(ctx, key_id, "gguf_get_val_data")
    _check(kv.n == 1, ctx, key_id, "gguf_get_val_data", "ctx->kv[key_id].get_ne() == 1")
    _check(kv.type != T.STRING, ctx, key_id, "gguf_get_val_data",
           "ctx->kv[key_id].get_type() != GGUF_TYPE_STRING")
    from .writer import kv_bytes

    return kv_bytes(kv)[-1][-gguf_type_size(kv.type):]


@query
def gguf_get_n_tensors(ctx: GGUFContext) -> int:
    """gguf_get_n_tensors."""
    return len(ctx.info)


@query
def gguf_find_tensor(ctx: GGUFContext, name: str) -> int:
    """gguf_find_tensor: the tensor's index, -1 when missing."""
    return ctx.find_tensor(name)


def _info(ctx: GGUFContext, tensor_id: int, fn: str):
    if not 0 <= tensor_id < len(ctx.info):
        raise GGUFError(f"tensor_id {tensor_id}", -1, f"{fn}: GGML_ASSERT(tensor_id >= 0 && "
                                                      "tensor_id < gguf_get_n_tensors(ctx)) failed")
    return ctx.info[tensor_id]


@query
def gguf_get_tensor_offset(ctx: GGUFContext, tensor_id: int) -> int:
    """gguf_get_tensor_offset: bytes from the start of the data section."""
    _info(ctx, tensor_id, "gguf_get_tensor_offset")
    return ctx.tensor_offsets()[tensor_id]


@query
def gguf_get_tensor_name(ctx: GGUFContext, tensor_id: int) -> str:
    """gguf_get_tensor_name."""
    return _info(ctx, tensor_id, "gguf_get_tensor_name").name


@query
def gguf_get_tensor_type(ctx: GGUFContext, tensor_id: int) -> int:
    """gguf_get_tensor_type: the ggml_type."""
    return _info(ctx, tensor_id, "gguf_get_tensor_type").type


@query
def gguf_get_tensor_size(ctx: GGUFContext, tensor_id: int) -> int:
    """gguf_get_tensor_size: ggml_nbytes of the tensor."""
    return _info(ctx, tensor_id, "gguf_get_tensor_size").nbytes


@writes()
def gguf_remove_key(ctx: GGUFContext, key: str) -> int:
    """gguf_remove_key: the removed key's old index, or -1."""
    return ctx.remove_key(key)


@writes()
def gguf_set_val_u8(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_u8."""
    ctx.set_val(key, T.UINT8, val)


@writes()
def gguf_set_val_i8(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_i8."""
    ctx.set_val(key, T.INT8, val)


@writes()
def gguf_set_val_u16(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_u16."""
    ctx.set_val(key, T.UINT16, val)


@writes()
def gguf_set_val_i16(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_i16."""
    ctx.set_val(key, T.INT16, val)


@writes()
def gguf_set_val_u32(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_u32."""
    ctx.set_val(key, T.UINT32, val)


@writes()
def gguf_set_val_i32(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_i32."""
    ctx.set_val(key, T.INT32, val)


@writes()
def gguf_set_val_f32(ctx: GGUFContext, key: str, val: float) -> None:
    """gguf_set_val_f32."""
    ctx.set_val(key, T.FLOAT32, val)


@writes()
def gguf_set_val_u64(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_u64."""
    ctx.set_val(key, T.UINT64, val)


@writes()
def gguf_set_val_i64(ctx: GGUFContext, key: str, val: int) -> None:
    """gguf_set_val_i64."""
    ctx.set_val(key, T.INT64, val)


@writes()
def gguf_set_val_f64(ctx: GGUFContext, key: str, val: float) -> None:
    """gguf_set_val_f64."""
    ctx.set_val(key, T.FLOAT64, val)


@writes()
def gguf_set_val_bool(ctx: GGUFContext, key: str, val: bool) -> None:
    """gguf_set_val_bool."""
    ctx.set_val(key, T.BOOL, val)


@writes()
def gguf_set_val_str(ctx: GGUFContext, key: str, val: str) -> None:
    """gguf_set_val_str."""
    ctx.set_val(key, T.STRING, val)


@writes()
def gguf_set_arr_data(ctx: GGUFContext, key: str, type_: int, data: Any, n: int | None = None
                      ) -> None:
    """gguf_set_arr_data: an array of `n` elements of `type_` (n defaults to len(data))."""
    values = np.asarray(data).reshape(-1)
    ctx.set_arr(key, type_, values if n is None else values[:n])


@writes()
def gguf_set_arr_str(ctx: GGUFContext, key: str, data: list[str] | StringArray,
                     n: int | None = None) -> None:
    """gguf_set_arr_str: an array of strings."""
    ctx.set_arr(key, T.STRING, data if n is None else list(data)[:n])


@writes()
def gguf_set_kv(ctx: GGUFContext, src: GGUFContext) -> None:
    """gguf_set_kv: copy every kv pair of `src` into `ctx` (set semantics: replace + move)."""
    for kv in src.kv:
        if kv.is_array:
            ctx.set_arr(kv.key, kv.type, kv.value)
        else:
            ctx.set_val(kv.key, kv.type, kv.value)


@writes()
def gguf_add_tensor(ctx: GGUFContext, tensor: Any, type_: int | None = None,
                    ne: tuple[int, ...] | list[int] | None = None, data: Any = None) -> None:
    """gguf_add_tensor(ctx, tensor): add a ggml tensor (its name, type, ne and data), as in C.

    Also takes what C reads from the tensor directly: gguf_add_tensor(ctx, name, type, ne, data).
    """
    if type_ is None:  # a ggml_tensor, as gguf.h has it
        from engine.core.tensor_data import data_bytes

        t = tensor
        raw = data_bytes(t).tobytes() if t.data is not None else None
        ctx.add_tensor(t.name, t.type, [int(x) for x in t.ne], raw)
    else:
        assert ne is not None, "gguf_add_tensor(ctx, name, type, ne, data) takes an ne"
        ctx.add_tensor(tensor, type_, ne, data)


@writes()
def gguf_set_tensor_type(ctx: GGUFContext, name: str, type_: int) -> None:
    """gguf_set_tensor_type: the tensor's new type (its data must then be set again: the old bytes
    no longer fit); the tensors after it move, each padded to the alignment."""
    ctx.set_tensor_type(name, type_)


@writes()
def gguf_set_tensor_data(ctx: GGUFContext, name: str, data: Any) -> None:
    """gguf_set_tensor_data: the bytes to write for the tensor (its nbytes of them)."""
    ctx.set_tensor_data(name, data)


@query
def gguf_get_tensor_ne(ctx: GGUFContext, tensor_id: int) -> tuple[int, int, int, int]:
    """Not in gguf.h: a tensor's ne, which gguf.cpp reads from its info (info.t.ne) when it
    creates the context's tensors."""
    return tuple(_info(ctx, tensor_id, "gguf_get_tensor_ne").ne)


@writes()
def gguf_write_to_file(ctx: GGUFContext, fname: str | os.PathLike, only_meta: bool = False
                       ) -> bool:
    """gguf_write_to_file."""
    return ctx.write_to_file(fname, only_meta)


@query
def gguf_get_meta_size(ctx: GGUFContext) -> int:
    """gguf_get_meta_size: bytes of the metadata, padding to the alignment included."""
    return ctx.meta_size()


@query
def gguf_get_meta_data(ctx: GGUFContext) -> bytes:
    """gguf_get_meta_data: the metadata bytes (C copies them into a caller's buffer)."""
    return ctx.to_bytes(only_meta=True)
