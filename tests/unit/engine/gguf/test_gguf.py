"""engine.gguf on its own terms: byte spans, lazy strings, big-endian files (written by gguf-py),
the gguf.h facade's C semantics, the writer's rules, and the inspect report."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.gguf import GGUFError, GGUFReader, StringArray, api
from engine.gguf.inspect import inspect_json, inspect_text, layer_totals
from engine.gguf.writer import GGUFContext
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR
MINILM = FIXTURES / "minilm-q8_0.gguf"
SPM = FIXTURES / "ggml-vocab-llama-spm.gguf"


def _small() -> bytes:
    ctx = api.gguf_init_empty()
    api.gguf_set_val_str(ctx, "general.architecture", "test")
    api.gguf_set_arr_data(ctx, "xs", api.GGUF_TYPE_UINT32, np.array([1, 2, 3]))
    api.gguf_set_arr_str(ctx, "words", ["a", "bc", ""])
    api.gguf_add_tensor(ctx, "a", 0, (3, 2), np.arange(6, dtype=np.float32).tobytes())
    api.gguf_add_tensor(ctx, "b", 0, (10,), np.ones(10, np.float32).tobytes())
    return ctx.to_bytes()


def test_byte_map_tiles_the_file():
    for r in [GGUFReader(MINILM), GGUFReader(SPM), GGUFReader(_small())]:
        spans = r.byte_map()
        assert spans[0].offset == 0 and spans[-1].end == r.size
        for a, b in zip(spans, spans[1:]):
            assert a.end == b.offset, (a, b)
        for item in r.kvs + r.tensors:
            kids = item.span.children
            assert kids[0].offset == item.span.offset and kids[-1].end == item.span.end
            assert all(x.end == y.offset for x, y in zip(kids, kids[1:]))


def test_reference_example_data_offset_192():
    """GGML-REFERENCE §9.1's worked example: 2 kvs and tensors a (3x2) and b (10)."""
    r = GGUFReader(_example())
    assert (r.data_offset, r.data_size, [t.offset for t in r.tensors]) == (192, 96, [0, 32])


def _example() -> bytes:
    ctx = api.gguf_init_empty()
    api.gguf_set_val_str(ctx, "general.architecture", "test")
    api.gguf_set_arr_data(ctx, "xs", api.GGUF_TYPE_UINT32, [1, 2, 3])
    api.gguf_add_tensor(ctx, "a", 0, (3, 2), bytes(24))
    api.gguf_add_tensor(ctx, "b", 0, (10,), bytes(40))
    return ctx.to_bytes()


def test_string_arrays_are_lazy_and_exact():
    r = GGUFReader(SPM)
    tokens = r.kvs[r.find_key("tokenizer.ggml.tokens")].value
    assert isinstance(tokens, StringArray) and tokens._decoded is None
    assert tokens[1] == "<s>" and tokens[-1] == gguf.GGUFReader(SPM).fields[
        "tokenizer.ggml.tokens"].contents(-1)
    assert tokens._decoded is None  # single reads decode one string
    assert tokens == gguf.GGUFReader(SPM).fields["tokenizer.ggml.tokens"].contents()
    assert tokens.raw(3) == b"<0x00>" and int(tokens.lengths[3]) == 6


def test_tensor_data_is_a_zero_copy_view():
    r = GGUFReader(_small())
    a = r.tensor_data("a")
    assert a.shape == (1, 1, 2, 3) and a.dtype == np.float32 and not a.flags.writeable
    assert a.reshape(-1).tolist() == [0, 1, 2, 3, 4, 5]
    q = GGUFReader(MINILM)
    t = q.tensors[q.find_tensor("blk.0.attn_q.weight")]
    assert q.tensor_data(t).shape == (1, 1, 384, 384 // 32 * 34)
    assert np.shares_memory(q.tensor_data(t), q.tensor_bytes(t))


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_gguf_py_files_in_both_byte_orders(endian, tmp_path):
    path = tmp_path / "e.gguf"
    w = gguf.GGUFWriter(path, arch="test", endianess=endian)
    w.add_uint32("n", 7)
    w.add_float32("f", 0.5)
    w.add_array("words", ["x", "yz"] * 40)
    w.add_array("ints", list(range(100)))
    w.add_tensor("w", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = GGUFReader(path)
    assert r.byte_order == ("big" if endian == gguf.GGUFEndian.BIG else "little")
    assert (r.get("n"), r.get("f"), r.get("words")[:3]) == (7, 0.5, ["x", "yz", "x"])
    assert r.get("ints").tolist() == list(range(100))
    assert r.tensor_data("w").reshape(-1).tolist() == list(range(8))
    theirs = gguf.GGUFReader(path, "r")
    assert [f.offset for k, f in theirs.fields.items() if not k.startswith("GGUF.")] == \
        [kv.span.offset for kv in r.kvs]


def test_facade_follows_c_semantics():
    ctx = api.gguf_init_empty()
    api.gguf_set_val_u32(ctx, "a", 1)
    api.gguf_set_val_f32(ctx, "b", 0.1)
    api.gguf_set_val_u32(ctx, "a", 2)  # removed, then appended
    assert [api.gguf_get_key(ctx, i) for i in range(api.gguf_get_n_kv(ctx))] == ["b", "a"]
    assert api.gguf_find_key(ctx, "zz") == -1 and api.gguf_find_tensor(ctx, "zz") == -1
    assert api.gguf_get_val_u32(ctx, 1) == 2
    assert api.gguf_get_val_f32(ctx, 0) == float(np.float32(0.1))
    assert api.gguf_get_arr_n(ctx, 0) == 1  # C answers 1 for a scalar
    with pytest.raises(GGUFError, match="gguf_get_val_i32.*type is u32"):
        api.gguf_get_val_i32(ctx, 1)
    with pytest.raises(GGUFError, match="key_id >= 0"):
        api.gguf_get_key(ctx, 5)
    with pytest.raises(GGUFError, match="is_array"):
        api.gguf_get_arr_type(ctx, 0)
    api.gguf_set_arr_str(ctx, "s", ["x", "y"])
    with pytest.raises(GGUFError, match="get_ne"):
        api.gguf_get_val_str(ctx, 2)
    with pytest.raises(GGUFError, match="!= GGUF_TYPE_STRING"):
        api.gguf_get_arr_data(ctx, 2)
    assert api.gguf_get_arr_str(ctx, 2, 1) == "y"
    assert api.gguf_get_val_data(ctx, 1) == (2).to_bytes(4, "little")
    assert api.gguf_remove_key(ctx, "b") == 0 and api.gguf_get_n_kv(ctx) == 2


def test_facade_reads_a_file():
    ctx = api.gguf_init_from_file(MINILM)
    assert api.gguf_get_version(ctx) == 3 and api.gguf_get_alignment(ctx) == 32
    i = api.gguf_find_key(ctx, "general.architecture")
    assert api.gguf_get_val_str(ctx, i) == "bert"
    assert api.gguf_get_kv_type(ctx, i) == api.GGUF_TYPE_STRING
    j = api.gguf_find_tensor(ctx, "blk.0.attn_q.weight")
    assert api.gguf_get_tensor_type(ctx, j) == 8
    assert api.gguf_get_tensor_size(ctx, j) == 384 * 384 // 32 * 34
    assert api.gguf_get_data_offset(ctx) + api.gguf_get_tensor_offset(ctx, j) == \
        ctx.reader.tensors[j].data_offset
    api.gguf_free(ctx)


def test_writer_rules():
    ctx = GGUFContext()
    with pytest.raises(GGUFError, match="power of 2"):
        api.gguf_set_val_u32(ctx, "general.alignment", 48)
    with pytest.raises(GGUFError, match="must be type u32"):
        api.gguf_set_val_i32(ctx, "general.alignment", 64)
    with pytest.raises(GGUFError, match="empty"):
        api.gguf_set_val_u8(ctx, "", 1)
    with pytest.raises(GGUFError, match="does not fit in u8"):
        api.gguf_set_val_u8(ctx, "x", 256)
    with pytest.raises(GGUFError, match="invalid GGUF value type 9"):
        ctx.set_arr("x", 9, [])
    api.gguf_add_tensor(ctx, "t", 8, (64, 2), bytes(2 * 2 * 34))
    with pytest.raises(GGUFError, match="duplicate tensor name"):
        api.gguf_add_tensor(ctx, "t", 0, (1,), bytes(4))
    with pytest.raises(GGUFError, match="not a multiple"):
        api.gguf_add_tensor(ctx, "u", 8, (33,), bytes(34))
    with pytest.raises(GGUFError, match="needs 4"):
        api.gguf_add_tensor(ctx, "u", 0, (1,), bytes(3))
    with pytest.raises(GGUFError, match="under 64 bytes"):
        api.gguf_add_tensor(ctx, "n" * 64, 0, (1,), bytes(4))
    with pytest.raises(GGUFError, match="not a usable ggml type"):
        api.gguf_add_tensor(ctx, "u", 4, (32,), bytes(0))


def test_writer_honours_alignment_and_meta_size():
    ctx = api.gguf_init_empty()
    api.gguf_add_tensor(ctx, "a", 0, (3,), bytes(12))
    api.gguf_add_tensor(ctx, "b", 0, (3, 1, 1, 1), bytes(12))
    api.gguf_set_val_u32(ctx, "general.alignment", 128)
    data = ctx.to_bytes()
    r = GGUFReader(data)
    assert r.alignment == 128 and r.data_offset % 128 == 0
    assert [t.offset for t in r.tensors] == [0, 128] and len(data) == r.data_offset + 256
    assert [t.n_dims for t in r.tensors] == [1, 1]  # ggml_n_dims drops trailing 1s
    assert api.gguf_get_meta_size(ctx) == r.data_offset
    assert len(api.gguf_get_meta_data(ctx)) == r.data_offset


def test_write_to_file_round_trip(tmp_path):
    ctx = api.gguf_init_from_file(MINILM)
    out = tmp_path / "copy.gguf"
    assert api.gguf_write_to_file(ctx, out)
    assert out.read_bytes() == MINILM.read_bytes()


def test_inspect_report():
    r = GGUFReader(MINILM)
    j = inspect_json(r)
    json.dumps(j, allow_nan=False)
    assert j["header"]["n_tensors"] == 101 and len(j["tensors"]) == 101
    assert [g["layer"] for g in j["layers"]] == [f"blk.{i}" for i in range(6)] + \
        ["(not in a layer)"]
    assert sum(g["nbytes"] for g in j["layers"]) == j["totals"]["nbytes"]
    q = next(t for t in j["tensors"] if t["name"] == "blk.0.attn_q.weight")
    assert (q["type"], q["shape"], q["bpw"]) == ("Q8_0", [384, 384], 8.5)
    assert j["byte_map"][0] == {"kind": "magic", "label": "magic", "offset": 0, "size": 4}
    text = inspect_text(r)
    assert "blk.0.attn_q.weight" in text and "tensor data (101)" in text
    assert "tensors (" not in inspect_text(r, show_tensors=False)
    vocab = inspect_json(GGUFReader(SPM))
    tokens = next(k for k in vocab["kv"] if k["key"] == "tokenizer.ggml.tokens")
    assert tokens["shortened"] and tokens["n"] == 32000 and len(tokens["value"]) == 8
    assert "(n=32000)" in inspect_text(GGUFReader(SPM), show_kv=True)
    assert layer_totals([]) == []


def test_a_big_data_section_is_the_files_pages_copy_on_write(monkeypatch):
    """gguf_init_from_file (ctx, allocating) maps a data section from 1 MB up instead of reading
    it: the pool holds the same bytes as a read (and as the fallback when mmap is missing), its
    whole pages there are the file's own (in /proc/self/maps), and a write to them changes the
    pool, never the file."""
    from engine.core import pages
    from engine.core.context import fresh_address_space
    from engine.gguf import loader

    path = FIXTURES_DIR / "minilm-q8_0.gguf"
    raw = path.read_bytes()

    def load():
        with fresh_address_space():
            return api.gguf_init_from_file(str(path), api.gguf_init_params(no_alloc=False, ctx=True))[1]

    mapped = load()
    fb = mapped.read_from
    assert fb.size >= loader.MAPPED_DATA and fb.path == str(path)
    assert mapped.pool[fb.start:fb.start + fb.size].tobytes() == raw[fb.offset:fb.offset + fb.size]
    lo = mapped.pool.ctypes.data + fb.start
    maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()]
    ranges = [tuple(int(x, 16) for x in m[0].split("-")) for m in maps
              if len(m) >= 6 and m[5] == str(path.resolve())]
    assert any(lo <= a and b <= lo + fb.size for a, b in ranges), "the data section is not mapped"
    with monkeypatch.context() as m:
        m.setattr(pages, "mmap_fn", None)  # no mmap: the pool is the same, read
        assert np.array_equal(load().pool, mapped.pool)
    with monkeypatch.context() as m:
        m.setattr(loader, "MAPPED_DATA", 1 << 62)  # a small section: read into a zeroed pool
        assert np.array_equal(load().pool, mapped.pool)
    at = fb.start + 3 * 4096 + 5  # inside the mapped pages
    mapped.pool[at] ^= 0xFF
    assert mapped.pool[at] != raw[fb.offset + at - fb.start] and path.read_bytes() == raw
