"""Fuzzing the GGUF reader: mutated, truncated and generated files must parse or raise GGUFError.

Nothing else may escape, and each parse must stay small: bounded time, and memory (tracemalloc
peak) a small multiple of the file's size whatever counts and lengths the file claims. Accepted
files must also survive everything a viewer does with them (byte map, report, tensor views) and
round-trip through the writer. A seeded byte-mutation fuzzer covers thousands of files; hypothesis
builds structured ones from random (often invalid) fields.
"""

from __future__ import annotations

import random
import struct
import time
import tracemalloc

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.gguf import GGUFError, GGUFReader, StringArray, api
from engine.gguf.inspect import inspect_json
from engine.gguf.writer import GGUFContext

MAX_SECONDS = 0.5  # per parse, generous for a loaded CI machine
INTERESTING = [0, 1, 2, 3, 4, 8, 9, 12, 13, 31, 32, 63, 64, 255, 2**16, 2**30, 2**30 + 1,
               2**31 - 1, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**64 - 1]


def _seed_files() -> list[bytes]:
    """Small valid files touching every part of the format."""
    rng = np.random.default_rng(0)
    seeds = []
    ctx = api.gguf_init_empty()
    api.gguf_set_val_str(ctx, "general.architecture", "fuzz")
    for t, v in [(0, 1), (1, -1), (2, 2), (3, -2), (4, 3), (5, -3), (6, 0.5), (7, True),
                 (10, 5), (11, -5), (12, 1.25)]:
        ctx.set_val(f"s{t}", t, v)
        ctx.set_arr(f"a{t}", t, [v, v])
    api.gguf_set_arr_str(ctx, "tokens", ["<s>", "", "ab", "ü"] * 20)
    seeds.append(ctx.to_bytes())
    ctx = api.gguf_init_empty()
    api.gguf_set_val_u32(ctx, "general.alignment", 16)
    for i, (t, ne) in enumerate([(0, (3, 2)), (8, (32, 1)), (12, (256,)), (1, (2, 1, 2)),
                                 (30, (1, 1, 1, 3))]):
        from engine.core.types import TYPE_TRAITS
        tr = TYPE_TRAITS[t]
        n = int(np.prod(ne)) // tr.blck_size * tr.type_size
        api.gguf_add_tensor(ctx, f"blk.{i}.w", t, ne, rng.integers(0, 256, n, np.uint8))
    seeds.append(ctx.to_bytes())
    be = b"GGUF" + struct.pack(">Iqq", 3, 1, 2) + struct.pack(">Q", 1) + b"a" + \
        struct.pack(">iI", 4, 7) + struct.pack(">Q", 1) + b"b" + struct.pack(">iiQ", 9, 8, 2) + \
        struct.pack(">Q", 2) + b"hi" + struct.pack(">Q", 0) + struct.pack(">Q", 1) + b"t" + \
        struct.pack(">Iqiq", 1, 4, 0, 0)
    seeds.append(be + bytes(-len(be) % 32) + bytes(16) + bytes(16))
    return seeds


SEEDS = _seed_files()


def _exercise(data: bytes) -> None:
    """Parse, and if accepted do what a viewer would; only GGUFError may escape."""
    try:
        r = GGUFReader(data)
    except GGUFError as e:
        assert e.field and e.rule and -1 <= e.offset <= len(data), e
        return
    spans = r.byte_map()
    assert spans[-1].end == len(data) or not spans
    inspect_json(r)
    for kv in r.kvs:
        if isinstance(kv.value, StringArray):
            kv.value.tolist()
    for t in r.tensors:
        assert r.tensor_bytes(t).size == t.nbytes
    if r.byte_order == "little":
        again = GGUFReader(GGUFContext.from_reader(r).to_bytes())
        assert [(k.key, k.type, k.n) for k in again.kvs] == [(k.key, k.type, k.n) for k in r.kvs]
        assert [(t.name, t.type, t.ne) for t in again.tensors] == \
            [(t.name, t.type, t.ne) for t in r.tensors]


def _bounded(data: bytes, trace: bool) -> None:
    start = time.perf_counter()
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    try:
        try:
            r = GGUFReader(data)
            r.byte_map()
        except GGUFError:
            pass
        if trace:
            _, peak = tracemalloc.get_traced_memory()
            assert peak < 256 * 1024 + 64 * len(data), (peak, len(data))
    finally:
        if trace:
            tracemalloc.stop()
    assert time.perf_counter() - start < MAX_SECONDS


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 3, 8])):
        if not b:
            break
        op = rng.randrange(7)
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif op == 2:  # an interesting 4- or 8-byte number where a field may be
            width = rng.choice([4, 8])
            v = rng.choice(INTERESTING + [len(b), -1 % 2**64]) % 2**(8 * width)
            b[i:i + width] = v.to_bytes(width, rng.choice(["little", "big"]))
        elif op == 3:
            del b[rng.randrange(len(b)):]
        elif op == 4:
            del b[i:i + rng.randrange(1, 16)]
        elif op == 5:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        else:
            j = rng.randrange(len(b))
            b[i:i] = b[j:j + rng.randrange(1, 32)]
    return bytes(b)


def test_seeds_are_valid():
    for data in SEEDS:
        GGUFReader(data)


def test_every_truncation():
    for data in SEEDS:
        for n in range(len(data)):
            _exercise(data[:n])


def test_seeded_byte_mutations():
    rng = random.Random(20240611)
    for k in range(10_000):
        data = _mutate(rng, rng.choice(SEEDS))
        _exercise(data)
        if k % 8 == 0:
            _bounded(data, trace=k % 40 == 0)


def test_huge_claims_stay_small():
    """Counts and lengths near the limits must not allocate or loop by what they claim."""
    head = b"GGUF" + struct.pack("<I", 3)
    for n_tensors, n_kv in [(0, 2**62), (2**62, 0), (2**40, 2**40), (0, 10**6)]:
        _bounded(head + struct.pack("<qq", n_tensors, n_kv) + bytes(4000), trace=True)
    key = struct.pack("<Q", 1) + b"k"
    for elem, n in [(8, 2**30), (0, 2**30), (8, 500), (11, 2**27)]:
        body = key + struct.pack("<iiQ", 9, elem, n) + bytes(4000)
        _bounded(head + struct.pack("<qq", 0, 1) + body, trace=True)


field = st.one_of(st.sampled_from(INTERESTING), st.integers(-2**63, 2**64 - 1))


@st.composite
def gguf_files(draw) -> bytes:
    """Structurally plausible files whose every number may be wrong."""
    le = draw(st.booleans())
    e = "<" if le else ">"
    out = bytearray(b"GGUF")
    kvs = draw(st.lists(st.tuples(st.binary(max_size=12), st.integers(-2, 14),
                                  st.integers(-2, 14), st.integers(0, 40),
                                  st.binary(max_size=48)), max_size=6))
    infos = draw(st.lists(st.tuples(st.binary(max_size=70), st.integers(0, 6),
                                    st.lists(st.integers(-3, 300), min_size=6, max_size=6),
                                    st.integers(-2, 44), st.sampled_from([0, 32, 64, 7])),
                          max_size=4))
    out += struct.pack(e + "I", draw(st.sampled_from([2, 3, 3, 1, 4])))
    out += struct.pack(e + "qq", len(infos) + draw(st.sampled_from([0, 0, 0, 1, -1])),
                       len(kvs) + draw(st.sampled_from([0, 0, 0, 1, -1])))
    for key, t, at, n, payload in kvs:
        out += struct.pack(e + "Q", len(key)) + key + struct.pack(e + "i", t)
        if t == 9:
            out += struct.pack(e + "iQ", at, n)
        out += payload
    for name, n_dims, ne, t, offset in infos:
        out += struct.pack(e + "Q", len(name)) + name + struct.pack(e + "I", n_dims)
        out += b"".join(struct.pack(e + "q", x) for x in ne[:n_dims])
        out += struct.pack(e + "iQ", t, offset)
    out += bytes(draw(st.integers(0, 40)))
    if draw(st.booleans()):
        v = draw(field)
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        out[at:at + 8] = (v % 2**64).to_bytes(8, "little")
    return bytes(out)


@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(gguf_files())
def test_generated_files(data):
    _exercise(data)
    _bounded(data, trace=False)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(range(len(SEEDS))), st.integers(0, 10_000), st.binary(max_size=16),
       st.integers(0, 16))
def test_splices(seed, at, insert, cut):
    data = SEEDS[seed]
    at %= len(data)
    _exercise(data[:at] + insert + data[at + cut:])
