"""Real ggml's GGUF reader (gguf.cpp through ggml-python's ctypes), summarised for comparisons.

`oracle_summary(path)` reads a file with C `gguf_init_from_file` and returns what every gguf.h
getter says (for arrays of many strings, a sample: one ctypes call per string is slow, and the
metadata bytes C writes back from what it parsed are compared whole elsewhere);
`ours_summary(path)` gets the same from engine.gguf's facade, so a test compares two dicts.
`oracle_check(data)` runs C `gguf_init_from_file` on bytes and returns (accepted, the messages ggml
logged). `oracle_context(path, no_alloc)` loads the file into a ggml context through
the `params.ctx` out-pointer and returns ggml_used_mem and each tensor's data offset in the pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import ggml
import numpy as np

from engine.gguf import api

_ELEM_CTYPES = {0: ctypes.c_uint8, 1: ctypes.c_int8, 2: ctypes.c_uint16, 3: ctypes.c_int16,
                4: ctypes.c_uint32, 5: ctypes.c_int32, 6: ctypes.c_float, 7: ctypes.c_bool,
                10: ctypes.c_uint64, 11: ctypes.c_int64, 12: ctypes.c_double}
# gguf_get_arr_str straight from the library (ggml-python's wrapper costs more per call)
_raw_arr_str = ggml.ggml.lib.gguf_get_arr_str
_raw_arr_str.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]
_raw_arr_str.restype = ctypes.c_char_p
_SCALAR_GETTERS = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32",
                   7: "bool", 8: "str", 10: "u64", 11: "i64", 12: "f64"}


@contextmanager
def ggml_log() -> Iterator[list[str]]:
    """Collect what ggml logs while the block runs (ggml_log_set with a Python callback)."""
    lines: list[str] = []

    @ggml.ggml_log_callback
    def collect(level, text, user_data):  # noqa: ANN001 - a ctypes callback
        lines.append(text.decode("utf-8", "replace"))

    ggml.ggml_log_set(collect, None)
    try:
        yield lines
    finally:
        ggml.ggml_log_set(ctypes.cast(None, ggml.ggml_log_callback), None)


def oracle_check(data: bytes, load: bool = False) -> tuple[bool, str]:
    """C gguf_init_from_file on `data` (in a temporary file): (accepted, everything ggml
    logged). With `load`, ggml also creates a context and reads the tensor data blob."""
    out = ctypes.c_void_p()
    params = ggml.gguf_init_params(no_alloc=not load, ctx=ctypes.pointer(out) if load else None)
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f, ggml_log() as lines:
        f.write(data)
        f.flush()
        ctx = ggml.gguf_init_from_file(f.name.encode(), params)
    if out.value:
        ggml.ggml_free(out.value)
    if ctx:
        ggml.gguf_free(ctx)
    return bool(ctx), "".join(lines)


def oracle_dies(data: bytes, tmp: Path) -> int:
    """Run C gguf_init_from_file on `data` in a child process; its exit code (negative: the
    signal that killed it). For inputs on which ggml aborts or crashes instead of refusing."""
    import subprocess
    import sys

    path = tmp / "crash.gguf"
    path.write_bytes(data)
    code = ("import ggml; ggml.gguf_init_from_file(%r, "
            "ggml.gguf_init_params(no_alloc=True, ctx=None))" % str(path).encode())
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode


def _sample(n: int) -> range | list[int]:
    """Which strings of an n-string array the getters compare: all of a small array; the
    first and last 2000 and every 97th of a large one (gguf_get_meta_data compares all)."""
    if n <= 6000:
        return range(n)
    return sorted(set(range(2000)) | set(range(n - 2000, n)) | set(range(0, n, 97)))


def _c_value(ctx: Any, i: int) -> tuple[int, int | None, Any]:
    kv_type = ggml.gguf_get_kv_type(ctx, i)
    if kv_type != 9:
        getter = getattr(ggml, f"gguf_get_val_{_SCALAR_GETTERS[kv_type]}")
        value = getter(ctx, i)
        return kv_type, None, value.decode("utf-8", "surrogateescape") if kv_type == 8 else value
    arr_type = ggml.gguf_get_arr_type(ctx, i)
    n = ggml.gguf_get_arr_n(ctx, i)
    if arr_type == 8:
        get = _raw_arr_str
        return kv_type, arr_type, [get(ctx, i, j).decode("utf-8", "surrogateescape")
                                   for j in _sample(n)]
    ptr = ggml.gguf_get_arr_data(ctx, i)
    arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(_ELEM_CTYPES[arr_type])),
                                shape=(n,)) if n else np.zeros(0)
    return kv_type, arr_type, arr.tolist()


def oracle_summary(path: str | Path) -> dict[str, Any]:
    """What C gguf.h getters report for the file."""
    ctx = ggml.gguf_init_from_file(str(path).encode(),
                                   ggml.gguf_init_params(no_alloc=True, ctx=None))
    assert ctx, f"real ggml refused {path}"
    try:
        return {
            "version": ggml.gguf_get_version(ctx),
            "alignment": ggml.gguf_get_alignment(ctx),
            "data_offset": ggml.gguf_get_data_offset(ctx),
            "kv": [(ggml.gguf_get_key(ctx, i).decode("utf-8", "surrogateescape"),
                    *_c_value(ctx, i)) for i in range(ggml.gguf_get_n_kv(ctx))],
            "tensors": [(ggml.gguf_get_tensor_name(ctx, i).decode(),
                         ggml.gguf_get_tensor_type(ctx, i), ggml.gguf_get_tensor_offset(ctx, i),
                         ggml.gguf_get_tensor_size(ctx, i))
                        for i in range(ggml.gguf_get_n_tensors(ctx))],
            "meta_size": ggml.gguf_get_meta_size(ctx),
        }
    finally:
        ggml.gguf_free(ctx)


def _our_value(ctx: Any, i: int) -> tuple[int, int | None, Any]:
    kv_type = api.gguf_get_kv_type(ctx, i)
    if kv_type != api.GGUF_TYPE_ARRAY:
        getter = getattr(api, f"gguf_get_val_{_SCALAR_GETTERS[kv_type]}")
        return kv_type, None, getter(ctx, i)
    arr_type = api.gguf_get_arr_type(ctx, i)
    n = api.gguf_get_arr_n(ctx, i)
    if arr_type == api.GGUF_TYPE_STRING:
        return kv_type, arr_type, [api.gguf_get_arr_str(ctx, i, j) for j in _sample(n)]
    return kv_type, arr_type, api.gguf_get_arr_data(ctx, i).tolist()


def ours_summary(path: str | Path) -> dict[str, Any]:
    """The same report from engine.gguf's gguf.h facade."""
    ctx = api.gguf_init_from_file(path, api.gguf_init_params(no_alloc=True))
    try:
        return {
            "version": api.gguf_get_version(ctx),
            "alignment": api.gguf_get_alignment(ctx),
            "data_offset": api.gguf_get_data_offset(ctx),
            "kv": [(api.gguf_get_key(ctx, i), *_our_value(ctx, i))
                   for i in range(api.gguf_get_n_kv(ctx))],
            "tensors": [(api.gguf_get_tensor_name(ctx, i), api.gguf_get_tensor_type(ctx, i),
                         api.gguf_get_tensor_offset(ctx, i), api.gguf_get_tensor_size(ctx, i))
                        for i in range(api.gguf_get_n_tensors(ctx))],
            "meta_size": api.gguf_get_meta_size(ctx),
        }
    finally:
        api.gguf_free(ctx)


def oracle_context(path: str | Path, no_alloc: bool) -> tuple[int, int, list[tuple], str | None]:
    """C gguf_init_from_file with the ctx out-pointer: (mem_size, used_mem, [(name, type, ne,
    data offset in the pool or None)], the sha256 of the first tensor's data (the blob holding
    the data section) or None)."""
    out = ctypes.c_void_p()
    ctx = ggml.gguf_init_from_file(str(path).encode(),
                                   ggml.gguf_init_params(no_alloc=no_alloc,
                                                         ctx=ctypes.pointer(out)))
    assert ctx and out.value, f"real ggml refused {path}"
    try:
        base = ggml.ggml_get_mem_buffer(out.value)
        tensors, t = [], ggml.ggml_get_first_tensor(out.value)
        blob = None
        if t and t.contents.data:
            blob = hashlib.sha256(ctypes.string_at(t.contents.data, ggml.ggml_nbytes(t))).hexdigest()
        while t:
            c = t.contents
            tensors.append((ggml.ggml_get_name(t).decode(), c.type, tuple(c.ne),
                            c.data - base if c.data else None))
            t = ggml.ggml_get_next_tensor(out.value, t)
        return ggml.ggml_get_mem_size(out.value), ggml.ggml_used_mem(out.value), tensors, blob
    finally:
        ggml.ggml_free(out.value)
        ggml.gguf_free(ctx)


def oracle_meta(path: str | Path, out: str | Path) -> bytes:
    """Read `path` with C and write its metadata back with C gguf_write_to_file(only_meta)."""
    ctx = ggml.gguf_init_from_file(str(path).encode(),
                                   ggml.gguf_init_params(no_alloc=True, ctx=None))
    assert ctx
    try:
        assert ggml.gguf_write_to_file(ctx, str(out).encode(), True)
        return Path(out).read_bytes()
    finally:
        ggml.gguf_free(ctx)
