"""gguf.h's other ways in and its tensor setters against real ggml's gguf.cpp:
gguf_init_from_buffer, gguf_init_from_callback, gguf_set_tensor_type, gguf_set_tensor_data."""

from __future__ import annotations

import ctypes

import ggml as real
import pytest

from engine.core.errors import GGMLAbortError, GGMLAssertionError
from engine.gguf import api
from engine.gguf.format import GGUFError
from engine.programs import FIXTURES_DIR
from engine.core.types import GGMLType

FILES = [FIXTURES_DIR / "minilm-q8_0.gguf", FIXTURES_DIR / "ggml-vocab-llama-spm.gguf"]


def c_summary(ctx) -> dict:
    return {"version": real.gguf_get_version(ctx), "alignment": real.gguf_get_alignment(ctx),
            "data_offset": real.gguf_get_data_offset(ctx),
            "keys": [real.gguf_get_key(ctx, i).decode() for i in range(real.gguf_get_n_kv(ctx))],
            "tensors": [(real.gguf_get_tensor_name(ctx, i).decode(), real.gguf_get_tensor_type(ctx, i),
                         real.gguf_get_tensor_offset(ctx, i), real.gguf_get_tensor_size(ctx, i))
                        for i in range(real.gguf_get_n_tensors(ctx))]}


def our_summary(ctx) -> dict:
    return {"version": api.gguf_get_version(ctx), "alignment": api.gguf_get_alignment(ctx),
            "data_offset": api.gguf_get_data_offset(ctx),
            "keys": [api.gguf_get_key(ctx, i) for i in range(api.gguf_get_n_kv(ctx))],
            "tensors": [(api.gguf_get_tensor_name(ctx, i), int(api.gguf_get_tensor_type(ctx, i)),
                         api.gguf_get_tensor_offset(ctx, i), api.gguf_get_tensor_size(ctx, i))
                        for i in range(api.gguf_get_n_tensors(ctx))]}


C_PARAMS = real.gguf_init_params(no_alloc=True, ctx=None)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_init_from_buffer(path):
    data = path.read_bytes()
    buf = ctypes.create_string_buffer(data, len(data))
    theirs = real.gguf_init_from_buffer(ctypes.cast(buf, ctypes.c_void_p), len(data), C_PARAMS)
    ours = api.gguf_init_from_buffer(data, len(data))
    try:
        assert our_summary(ours) == c_summary(theirs)
    finally:
        real.gguf_free(theirs)
    assert api.gguf_init_from_buffer(b"", 0) is None and api.gguf_init_from_buffer(None, 10) is None
    with pytest.raises(GGUFError):  # cut short: refused, as C refuses it (NULL)
        api.gguf_init_from_buffer(data, 100)
    assert not real.gguf_init_from_buffer(ctypes.cast(buf, ctypes.c_void_p), 100, C_PARAMS)


@pytest.mark.parametrize("chunk", [0, 1000, 4096])
def test_init_from_callback(chunk):
    data = FILES[0].read_bytes()
    asked: dict[str, list] = {"ours": [], "theirs": []}

    def read_into(out, offset, n, who):
        asked[who].append((offset, n))
        piece = data[offset:offset + n]
        out[:len(piece)] = piece
        return len(piece)

    @real.gguf_reader_callback_t
    def c_callback(userdata, output, offset, n):
        piece = data[offset:offset + n]
        ctypes.memmove(output, piece, len(piece))
        asked["theirs"].append((offset, n))
        return len(piece)

    theirs = real.gguf_init_from_callback(c_callback, None, chunk, len(data), C_PARAMS)
    ours = api.gguf_init_from_callback(lambda ud, out, off, n: read_into(out, off, n, "ours"), None, chunk,
                                       len(data))
    try:
        assert our_summary(ours) == c_summary(theirs)
    finally:
        real.gguf_free(theirs)
    if chunk:
        assert max(n for _, n in asked["ours"]) <= chunk
    assert api.gguf_init_from_callback(None, None, 0, 10) is None


def test_set_tensor_type_moves_the_tensors_after_it():
    path = str(FILES[0]).encode()
    theirs = real.gguf_init_from_file(path, C_PARAMS)
    ours = api.gguf_init_from_file(FILES[0])
    try:
        for name, t in (("blk.0.attn_q.weight", GGMLType.F16), ("token_embd.weight", GGMLType.Q4_0),
                        ("blk.3.ffn_down.weight", GGMLType.F32)):
            real.gguf_set_tensor_type(theirs, name.encode(), int(t))
            api.gguf_set_tensor_type(ours, name, t)
            assert our_summary(ours)["tensors"] == c_summary(theirs)["tensors"]
        # the metadata C writes for the changed file, byte for byte
        size = real.gguf_get_meta_size(theirs)
        out = (ctypes.c_uint8 * size)()
        real.gguf_get_meta_data(theirs, out)
        assert api.gguf_get_meta_data(ours) == bytes(out)
    finally:
        real.gguf_free(theirs)
    with pytest.raises(GGMLAssertionError, match="tensor row size not divisible by block size of new type"):
        api.gguf_set_tensor_type(ours, "blk.0.attn_output_norm.weight", GGMLType.Q4_K)  # 384 is not 256·k
    with pytest.raises(GGMLAbortError, match="tensor not found: nope"):
        api.gguf_set_tensor_type(ours, "nope", GGMLType.F32)


def test_set_tensor_data_is_what_gets_written(tmp_path):
    ctx = api.gguf_init_empty()
    api.gguf_add_tensor(ctx, "a", GGMLType.F32, (4, 2), bytes(32))
    api.gguf_add_tensor(ctx, "b", GGMLType.F32, (3,), bytes(12))
    api.gguf_set_tensor_type(ctx, "a", GGMLType.F16)  # 16 bytes now; the old 32 no longer fit
    with pytest.raises(GGUFError, match="has no data"):
        api.gguf_write_to_file(ctx, tmp_path / "x.gguf")
    api.gguf_set_tensor_data(ctx, "a", bytes(range(16)))
    with pytest.raises(GGUFError, match="needs 12"):
        api.gguf_set_tensor_data(ctx, "b", bytes(8))
    with pytest.raises(GGMLAbortError, match="tensor not found"):
        api.gguf_set_tensor_data(ctx, "c", bytes(8))
    assert api.gguf_write_to_file(ctx, tmp_path / "x.gguf")
    back = api.gguf_init_from_file(tmp_path / "x.gguf")
    start = api.gguf_get_data_offset(back) + api.gguf_get_tensor_offset(back, 0)
    assert (tmp_path / "x.gguf").read_bytes()[start:start + 16] == bytes(range(16))
    # real ggml reads the file we wrote
    theirs = real.gguf_init_from_file(str(tmp_path / "x.gguf").encode(), C_PARAMS)
    try:
        assert c_summary(theirs) == our_summary(back)
    finally:
        real.gguf_free(theirs)
