"""Malformed GGUF files, one rule each: ours raises GGUFError naming the field, its offset and
the rule; real ggml (gguf_init_from_file) refuses the same file, and says why in its log.

Where ggml does not refuse, the case says what it does instead: "accepts" (we are stricter on
purpose, see engine/gguf/reader.py), "load" (ggml notices only when it loads the data blob),
"dies" (ggml aborts or crashes: run in a child process).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from engine.gguf import GGUFError, GGUFReader
from engine.gguf import api
from tests.support.gguf_oracle import oracle_check, oracle_dies

HEADER = 24  # magic, version, n_tensors, n_kv


def s(x: str | bytes) -> bytes:
    raw = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, type_: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<i", type_) + payload


def u32(key: str, v: int) -> bytes:
    return kv(key, 4, struct.pack("<I", v))


def arr(key: str, elem: int, n: int, payload: bytes) -> bytes:
    return kv(key, 9, struct.pack("<iQ", elem, n) + payload)


def info(name: str | bytes, ne: tuple[int, ...], type_: int = 0, offset: int = 0,
         n_dims: int | None = None) -> bytes:
    n_dims = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack(f"<I{len(ne)}qiQ", n_dims, *ne, type_, offset)


def gguf(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", version: int = 3,
         n_kv: int | None = None, n_tensors: int | None = None, align: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<Iqq", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    meta = head + b"".join(kvs) + b"".join(infos)
    if infos:
        meta += bytes(-len(meta) % align)
    return meta + data


@dataclass(frozen=True)
class Case:
    data: bytes
    field: str  # a part of GGUFError.field
    offset: int  # GGUFError.offset
    rule: str  # a part of GGUFError.rule
    ggml: str = "rejects"  # or "accepts", "load", "dies"
    ggml_says: str = ""  # a part of what ggml logs


K0 = HEADER  # where the first kv starts
A = u32("a", 1)  # a 17-byte kv
T1 = info("t", (4,))  # a 4-float tensor info: 8+1+4+8+4+8 = 33 bytes
CASES = {
    "empty file": Case(b"", "magic", 0, "truncated", ggml_says="failed to read magic"),
    "bad magic": Case(b"GGUX" + bytes(20), "magic", 0, "'GGUX'",
                      ggml_says="invalid magic characters: 'GGUX'"),
    "version 0": Case(gguf(version=0), "version", 4, "bad GGUF version 0",
                      ggml_says="bad GGUF version: 0"),
    "version 1": Case(gguf(version=1), "version", 4, "GGUFv1 is no longer supported",
                      ggml_says="GGUFv1 is no longer supported"),
    "version 4": Case(gguf(version=4), "version", 4, "version 4",
                      ggml_says="only supports up to version 3"),
    "truncated header": Case(gguf()[:12], "n_tensors", 8, "truncated",
                             ggml_says="failed to read header"),
    "negative n_tensors": Case(gguf(n_tensors=-1), "n_tensors", 8, "must not be negative",
                               ggml_says="number of tensors is -1"),
    "n_tensors beyond the file": Case(gguf(n_tensors=10**12), "n_tensors", 8, "remain",
                                      ggml_says="failed to read tensor info"),
    "negative n_kv": Case(gguf(n_kv=-5), "n_kv", 16, "must not be negative",
                          ggml_says="number of key value pairs is -5"),
    "n_kv beyond the file": Case(gguf([A], n_kv=2), "n_kv", 16, "remain",
                                 ggml_says="failed to read key-value pairs"),
    "key longer than the file": Case(gguf([struct.pack("<Q", 99) + b"abc" + bytes(11)]),
                                     "key 0 length", K0, "exceeds the",
                                     ggml_says="exceeds remaining file size"),
    "key over 1 GiB": Case(gguf([struct.pack("<Q", 2**30 + 1) + bytes(14)]), "key 0 length",
                           K0, "exceeds ggml's maximum", ggml_says="exceeds maximum"),
    "empty key": Case(gguf([kv("", 0, b"\x01")]), "key 0", K0, "empty", ggml="dies"),
    "duplicate key": Case(gguf([A, A]), "key 1 'a'", K0 + len(A), "duplicate key",
                          ggml_says="duplicate key 'a'"),
    "key not UTF-8": Case(gguf([kv(b"a\xff", 4, bytes(4))]), "key 0",
                          K0, "not valid UTF-8", ggml="accepts"),
    "unknown value type": Case(gguf([kv("a", 13, bytes(8))]), "key 0 'a' type", K0 + 9,
                               "invalid GGUF type 13", ggml_says="has invalid GGUF type 13"),
    "negative value type": Case(gguf([kv("a", -1, bytes(8))]), "key 0 'a' type", K0 + 9,
                                "invalid GGUF type -1", ggml_says="has invalid GGUF type -1"),
    "nested array": Case(gguf([arr("a", 9, 1, struct.pack("<iQ", 4, 0))]),
                         "key 0 'a' array element type", K0 + 13, "arrays of arrays",
                         ggml_says="has invalid GGUF type 9"),
    "array beyond the file": Case(gguf([arr("a", 4, 1000, bytes(8))]),
                                  "key 0 'a' array length", K0 + 17, "cannot fit",
                                  ggml_says="failed to read key-value pairs"),
    "array over 2^30 elements": Case(gguf([arr("a", 0, 2**30 + 1, bytes(8))]),
                                     "key 0 'a' array length", K0 + 17, "exceed ggml's maximum",
                                     ggml_says="failed to read key-value pairs"),
    "string element beyond the file": Case(
        gguf([arr("a", 8, 2, s("ok") + struct.pack("<Q", 50) + b"xy")]),
        "key 0 'a' value[1] length", K0 + 25 + 10, "exceeds the",
        ggml_says="exceeds remaining file size"),
    "truncated value": Case(gguf([kv("a", 10, bytes(4))]), "key 0 'a' value", K0 + 13,
                            "truncated", ggml_says="failed to read key-value pairs"),
    "alignment 0": Case(gguf([u32("general.alignment", 0)]), "general.alignment", K0,
                        "not a power of 2", ggml_says="alignment 0 is not a power of 2"),
    "alignment 48": Case(gguf([u32("general.alignment", 48)]), "general.alignment", K0,
                         "not a power of 2", ggml_says="alignment 48 is not a power of 2"),
    "alignment of type i32": Case(gguf([kv("general.alignment", 5, struct.pack("<i", 32))]),
                                  "general.alignment", K0, "must be of type u32 but is i32",
                                  ggml="dies"),
    "alignment as an array": Case(gguf([arr("general.alignment", 4, 1, struct.pack("<I", 64))]),
                                  "general.alignment", K0, "an array of u32", ggml="accepts"),
    "tensor name of 64 bytes": Case(gguf(infos=[info("n" * 64, (4,))], data=bytes(32)),
                                    "tensor 0 name", K0, "too long: 64 bytes >= 64",
                                    ggml_says="tensor name 0 is too long: 64 >= 64"),
    "tensor name with NUL": Case(gguf(infos=[info(b"a\0b", (4,))], data=bytes(32)),
                                 "tensor 0 name", K0, "NUL", ggml="accepts"),
    "duplicate tensor name": Case(gguf(infos=[T1, info("t", (4,), offset=32)], data=bytes(64)),
                                  "tensor 1 't'", K0 + len(T1), "duplicate tensor name",
                                  ggml_says="duplicate tensor name 't'"),
    "five dims": Case(gguf(infos=[info("t", (1, 1, 1, 1, 1))], data=bytes(32)),
                      "tensor 't' n_dims", K0 + 9, "5 > 4",
                      ggml_says="invalid number of dimensions: 5 > 4"),
    "negative dim": Case(gguf(infos=[info("t", (4, -2))], data=bytes(32)),
                         "tensor 't' ne[1]", K0 + 21, "-2 < 0",
                         ggml_says="dimension 1 has invalid number of elements: -2 < 0"),
    "too many elements": Case(gguf(infos=[info("t", (2**32, 2**32))], data=bytes(32)),
                              "tensor 't' ne", K0 + 13, "total number of elements",
                              ggml_says="total number of elements"),
    "tensor type 42": Case(gguf(infos=[info("t", (4,), type_=42)], data=bytes(32)),
                           "tensor 't' type", K0 + 21, "invalid ggml type 42",
                           ggml_says="invalid ggml type 42"),
    "negative tensor type": Case(gguf(infos=[info("t", (4,), type_=-3)], data=bytes(32)),
                                 "tensor 't' type", K0 + 21, "invalid ggml type -3",
                                 ggml_says="invalid ggml type -3"),
    "removed type Q4_2": Case(gguf(infos=[info("t", (32,), type_=4)], data=bytes(32)),
                              "tensor 't' type", K0 + 21, "block size (0)",
                              ggml_says="not a multiple of block size (0)"),
    "ne0 not a multiple of the block": Case(gguf(infos=[info("t", (33,), type_=8)],
                                                 data=bytes(64)),
                                            "tensor 't' type", K0 + 21, "block size (32)",
                                            ggml_says="not a multiple of block size (32)"),
    "size in bytes over SIZE_MAX": Case(gguf(infos=[info("t", (2**62,), type_=28)],
                                             data=bytes(32)),
                                        "tensor 't' type", K0 + 21, "size in bytes",
                                        ggml_says="has a size in bytes"),
    "first offset not 0": Case(gguf(infos=[info("t", (4,), offset=32)], data=bytes(64)),
                               "tensor 't' offset", K0 + 25, "offset is 32, expected 0",
                               ggml_says="tensor 't' has offset 32, expected 0"),
    "offsets not packed": Case(gguf(infos=[T1, info("u", (4,), offset=64)], data=bytes(96)),
                               "tensor 'u' offset", K0 + len(T1) + 25,
                               "offset is 64, expected 32",
                               ggml_says="tensor 'u' has offset 64, expected 32"),
    "data past the end": Case(gguf(infos=[T1], data=bytes(8)), "tensor 't' offset", K0 + 25,
                              "past the end of the file", ggml="load",
                              ggml_says="failed to read tensor data binary blob"),
    "data section past the end": Case(gguf(infos=[info("t", (0,))])[:-1],
                                      "padding", K0 + 33, "past the end of the file",
                                      ggml_says="failed to seek to beginning of data section"),
}


@pytest.mark.parametrize("name", CASES)
def test_ours_refuses(name):
    case = CASES[name]
    with pytest.raises(GGUFError) as e:
        GGUFReader(case.data)
    err = e.value
    assert case.field in err.field, err
    assert err.offset == case.offset, err
    assert case.rule in err.rule, err
    assert f"{err.field} at byte {err.offset}: {err.rule}" == str(err)


@pytest.mark.parametrize("name", CASES)
def test_ggml_agrees(name, tmp_path):
    case = CASES[name]
    if case.ggml == "dies":
        assert oracle_dies(case.data, tmp_path) != 0
        return
    accepted, log = oracle_check(case.data)
    if case.ggml == "accepts":
        assert accepted
        return
    if case.ggml == "load":
        assert accepted
        accepted, log = oracle_check(case.data, load=True)
    assert not accepted
    assert case.ggml_says in log, log


def test_big_endian_is_read_but_the_facade_refuses_like_ggml(tmp_path):
    be = b"GGUF" + struct.pack(">Iqq", 3, 0, 1) + struct.pack(">Q", 1) + b"a" + \
        struct.pack(">iI", 4, 7)
    r = GGUFReader(be)
    assert (r.byte_order, r.version, r.get("a")) == ("big", 3, 7)
    path = tmp_path / "be.gguf"
    path.write_bytes(be)
    with pytest.raises(GGUFError, match="big-endian") as e:
        api.gguf_init_from_file(path)
    assert e.value.field == "version" and e.value.offset == 4
    accepted, log = oracle_check(be)
    assert not accepted and "mismatch between the host and model endianness" in log


def test_zero_sized_dim_is_an_empty_tensor_where_ggml_crashes(tmp_path):
    """ggml divides INT64_MAX by ne[1] before looking at it: a 0 there kills the process."""
    data = gguf(infos=[info("t", (4, 0))])
    r = GGUFReader(data)
    assert (r.tensors[0].ne, r.tensors[0].nbytes, r.data_size) == ((4, 0, 1, 1), 0, 0)
    assert oracle_dies(data, tmp_path) != 0


def test_zero_dims_is_a_one_element_tensor_as_in_ggml():
    data = gguf(infos=[info("t", (), n_dims=0)], data=bytes(32))
    r = GGUFReader(data)
    assert (r.tensors[0].n_dims, r.tensors[0].ne, r.tensors[0].nbytes) == (0, (1, 1, 1, 1), 4)
    assert oracle_check(data)[0]


def test_string_values_are_not_checked_like_ggml():
    data = gguf([kv("a", 8, s(b"\xff\xfe ok"))])
    r = GGUFReader(data)
    assert r.get("a") == "\udcff\udcfe ok"
    assert r.get("a").encode("utf-8", "surrogateescape") == b"\xff\xfe ok"
    assert oracle_check(data)[0]


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(GGUFError, match="failed to open GGUF file"):
        api.gguf_init_from_file(tmp_path / "nope.gguf")


def test_loading_a_short_data_section_fails_like_ggml(tmp_path):
    """The last tensor's padding is missing: the reader accepts it, loading the blob does not."""
    data = gguf(infos=[info("t", (3,))], data=bytes(12))
    GGUFReader(data)
    path = tmp_path / "short.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match="failed to read tensor data binary blob"):
        api.gguf_init_from_file(path, api.gguf_init_params(no_alloc=False, ctx=True))
    assert oracle_check(data) == (True, "")
    accepted, log = oracle_check(data, load=True)
    assert not accepted and "failed to read tensor data binary blob" in log
    api.gguf_init_from_file(path, api.gguf_init_params(no_alloc=True, ctx=True))
