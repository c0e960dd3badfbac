"""engine.gguf against real ggml's gguf.cpp (through ggml-python) and llama.cpp's gguf-py.

Inputs: the two fixtures, every ggml-vocab-*.gguf of llama-cpp-python 0.3.36 (fetched by
tests/support/vocab.py), files written by gguf-py's GGUFWriter with a tensor of every type it
supports, and files written by our own writer. For each: every gguf.h getter agrees with C; the
ggml context made by the loader matches C's in mem_size, used_mem, tensor order, types, ne and
data offsets; our metadata bytes equal C's gguf_write_to_file(only_meta).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.ggml import ggml_free, ggml_get_first_tensor, ggml_get_next_tensor, ggml_used_mem
from engine.gguf import GGUFReader, api
from engine.gguf.loader import MAPPED_DATA
from engine.gguf.writer import GGUFContext
from engine.core.types import TYPE_TRAITS
from tests.support.gguf_oracle import (oracle_context, oracle_meta, oracle_summary,
                                       ours_summary)
from tests.support.vocab import vocab_files
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR
MINILM = FIXTURES / "minilm-q8_0.gguf"
SPM = FIXTURES / "ggml-vocab-llama-spm.gguf"
VT = gguf.GGUFValueType
LIVE_TYPES = [t for t in gguf.GGMLQuantizationType if TYPE_TRAITS[t.value].blck_size > 0]
# gguf-py 0.19 sizes a Q8_1 block as 40 bytes (float d and s); ggml's is 36 (two halves), so
# gguf-py cannot write a Q8_1 tensor ggml reads. Our writer covers Q8_1.
GGUF_PY_TYPES = [t for t in LIVE_TYPES if t != gguf.GGMLQuantizationType.Q8_1]


def _gguf_py_file(path: Path, alignment: int | None = None) -> Path:
    """A file from gguf-py's GGUFWriter: every kv type and a tensor of every live ggml type."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, arch="test")
    if alignment:
        w.add_custom_alignment(alignment)
    scalars = [(VT.UINT8, 200), (VT.INT8, -100), (VT.UINT16, 60000), (VT.INT16, -30000),
               (VT.UINT32, 4_000_000_000), (VT.INT32, -2_000_000_000), (VT.FLOAT32, 0.25),
               (VT.BOOL, True), (VT.STRING, "héllo ✓"), (VT.UINT64, 2**64 - 1),
               (VT.INT64, -2**63), (VT.FLOAT64, -1.5e300)]
    for vt, value in scalars:
        w.add_key_value(f"test.scalar.{vt.name.lower()}", value, vt)
        sample = [value, value] if vt != VT.BOOL else [True, False, True]
        w.add_key_value(f"test.array.{vt.name.lower()}", sample, VT.ARRAY, sub_type=vt)
    w.add_key_value("test.array.tokens", ["", "a", "ü", "<0x0A>"] * 50, VT.ARRAY,
                    sub_type=VT.STRING)
    for t in GGUF_PY_TYPES:
        tr = TYPE_TRAITS[t.value]
        ne = (tr.blck_size * 2, 3)
        raw = rng.integers(0, 256, size=(ne[1], ne[0] // tr.blck_size * tr.type_size),
                           dtype=np.uint8)
        w.add_tensor(f"t.{t.name.lower()}", raw, raw_dtype=t)
    w.add_tensor("blk.0.cube", rng.standard_normal((2, 3, 5)).astype(np.float32))
    w.add_tensor("blk.1.hyper", rng.standard_normal((2, 1, 3, 4)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _our_file(path: Path) -> Path:
    """A file from our writer: every kv type, empty arrays, odd strings, every live type."""
    rng = np.random.default_rng(11)
    ctx = api.gguf_init_empty()
    api.gguf_set_val_u32(ctx, "general.alignment", 64)
    for t, value in [(0, 7), (1, -7), (2, 700), (3, -700), (4, 70000), (5, -70000), (6, 1.5),
                     (7, False), (10, 2**40), (11, -2**40), (12, 3.25)]:
        ctx.set_val(f"ours.scalar.{t}", t, value)
        ctx.set_arr(f"ours.array.{t}", t, [value] * 3 if t != 7 else [True, False])
        ctx.set_arr(f"ours.empty.{t}", t, [])
    api.gguf_set_val_str(ctx, "ours.str", "tab\tnewline\n ∑")
    api.gguf_set_arr_str(ctx, "ours.strs", ["x" * 300, "", "ok"])
    api.gguf_set_arr_str(ctx, "ours.strs.empty", [])
    api.gguf_set_val_u8(ctx, "ours.scalar.0", 9)  # set again: removed, then appended last
    for t in LIVE_TYPES:
        tr = TYPE_TRAITS[t.value]
        ne = (tr.blck_size, 2, 1, 2)
        nbytes = tr.type_size * 4
        api.gguf_add_tensor(ctx, f"ours.{t.name.lower()}", t.value, ne,
                            rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    api.gguf_add_tensor(ctx, "ours.empty", 0, (0, 3), b"")
    api.gguf_write_to_file(ctx, path)
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    files = {"gguf-py": _gguf_py_file(d / "gguf_py.gguf"),
             "gguf-py-align64": _gguf_py_file(d / "gguf_py_a64.gguf", alignment=64),
             "ours": _our_file(d / "ours.gguf")}
    v2 = bytearray(files["gguf-py"].read_bytes())
    v2[4] = 2  # version 2: the same layout
    (d / "v2.gguf").write_bytes(v2)
    files["v2"] = d / "v2.gguf"
    return files


def _all_files(written: dict[str, Path]) -> list[Path]:
    return [MINILM, SPM, *vocab_files(), *written.values()]


def test_vocab_files_present():
    names = [p.name for p in vocab_files()]
    assert len(names) >= 15 and "ggml-vocab-llama-spm.gguf" in names


@pytest.mark.parametrize("name", ["minilm", "spm", "vocab", "gguf-py", "gguf-py-align64",
                                  "ours", "v2"])
def test_getters_match_ggml(name, written):
    paths = {"minilm": [MINILM], "spm": [SPM], "vocab": vocab_files()}.get(name)
    for path in paths or [written[name]]:
        assert ours_summary(path) == oracle_summary(path), path.name


def test_written_files_cover_every_type(written):
    with GGUFReader(written["gguf-py"]) as r:
        assert {t.type for t in r.tensors} == {t.value for t in GGUF_PY_TYPES}
        assert {kv.value_type for kv in r.kvs} == set(range(13)) - {9}
    with GGUFReader(written["ours"]) as r:
        assert {t.type for t in r.tensors} == {t.value for t in LIVE_TYPES}
        assert r.alignment == 64 and r.kvs[-1].key == "ours.scalar.0"
        assert r.data_offset % 64 == 0


@pytest.mark.parametrize("no_alloc", [True, False])
def test_loader_matches_ggml_context(no_alloc, written):
    """Our context against ggml's: sizes, tensors, and the data section's bytes, both where it is
    read and where it is mapped (MiniLM's 25 MB: the file's pages, engine/gguf/loader.py)."""
    sizes: list[int] = []
    for path in [MINILM, SPM, written["gguf-py"], written["gguf-py-align64"], written["ours"]]:
        mem_size, used, tensors, blob = oracle_context(path, no_alloc)
        ctx, g = api.gguf_init_from_file(path, api.gguf_init_params(no_alloc=no_alloc, ctx=True))
        ours, t = [], ggml_get_first_tensor(g)
        while t is not None:
            ours.append((t.name, t.type, tuple(int(x) for x in t.ne),
                         None if t.data is None else t.data - g.base))
            t = ggml_get_next_tensor(g, t)
        assert (g.mem_size, ggml_used_mem(g)) == (mem_size, used), path.name
        assert ours == tensors, path.name
        if not no_alloc:  # tensors alias the blob, which holds the file's data section
            start, size = ours[0][3], int(np.prod(ours[0][2]))  # (the blob: I8, one byte each)
            ours_blob = hashlib.sha256(g.pool[start:start + size]).hexdigest() if size else None
            assert ours_blob == blob, f"{path.name}: the data section as loaded"
            sizes.append(size)
            r = ctx.reader
            for info in r.tensors[:5]:
                off = ours[info.index + 1][3]
                assert bytes(g.pool[off:off + info.nbytes]) == r.tensor_bytes(info).tobytes()
        ggml_free(g)
        api.gguf_free(ctx)
    assert no_alloc or (min(sizes) < MAPPED_DATA <= max(sizes))


def test_metadata_bytes_match_ggml_writer(written, tmp_path):
    for path in _all_files(written):
        ctx = api.gguf_init_from_file(path)
        assert api.gguf_get_meta_data(ctx) == oracle_meta(path, tmp_path / "c.gguf"), path.name
        api.gguf_free(ctx)


def test_rewrite_is_byte_identical(tmp_path):
    """minilm was written by gguf-py in ggml's layout: reading and writing it changes nothing;
    a vocab file only gains ggml's final padding."""
    for path in [MINILM, SPM]:
        r = GGUFReader(path)
        out = GGUFContext.from_reader(r).to_bytes()
        orig = path.read_bytes()
        assert out[:len(orig)] == orig and set(out[len(orig):]) <= {0}
        assert len(out) % 32 == 0 and len(out) - len(orig) < 32


def test_gguf_py_reads_our_file(written):
    ours = GGUFReader(written["ours"])
    theirs = gguf.GGUFReader(written["ours"])
    for kv in ours.kvs:
        field = theirs.fields[kv.key]
        assert field.offset == kv.span.offset
        assert [int(t) for t in field.types][0] == kv.type
        if kv.arr_type is None:
            assert field.contents() == pytest.approx(kv.value)
        else:
            assert field.contents() == pytest.approx(list(kv.value))
    assert [t.name for t in theirs.tensors] == [t.name for t in ours.tensors]
    for mine, tt in zip(ours.tensors, theirs.tensors):
        assert (int(tt.tensor_type), int(tt.data_offset)) == (mine.type, mine.data_offset)
        if mine.type in GGUF_PY_TYPES:  # gguf-py misjudges a Q8_1 tensor's size
            assert tt.data.tobytes() == ours.tensor_bytes(mine).tobytes()


def test_spans_match_gguf_py(written):
    """Every kv's and tensor info's byte range agrees with gguf-py's field offsets."""
    for path in [MINILM, written["gguf-py"]]:
        ours, theirs = GGUFReader(path), gguf.GGUFReader(path)
        for kv in ours.kvs:
            f = theirs.fields[kv.key]
            assert (f.offset, sum(p.nbytes for p in f.parts)) == (kv.span.offset, kv.span.size)
        for t, tt in zip(ours.tensors, theirs.tensors):
            f = tt.field
            assert (f.offset, sum(p.nbytes for p in f.parts)) == (t.span.offset, t.span.size)
            assert tt.data_offset == t.data_offset


def test_token_types_match_gguf_py():
    """engine.gguf.format.TokenType is llama.h's enum llama_token_type (gguf-py leaves out
    UNDEFINED, which llama.h has)."""
    import llama_cpp

    from engine.gguf.format import TokenType

    assert {t.name: t.value for t in TokenType} == {
        n.removeprefix("LLAMA_TOKEN_TYPE_"): getattr(llama_cpp, n) for n in dir(llama_cpp)
        if n.startswith("LLAMA_TOKEN_TYPE_")}
    assert {t.name: t.value for t in gguf.TokenType}.items() <= \
        {t.name: t.value for t in TokenType}.items()
    assert TokenType.label(4) == "user-defined" and TokenType.label(99) == "?"
