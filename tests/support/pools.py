"""Run the same ggml program on the engine and on real ggml, and compare their pools byte for byte.

A program is a function `program(g)` written against an API object `g` with ggml's function names
(`g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 2, 4)`); `g.init(mem_size, buffer=..., no_alloc=...)`
stands for ggml_init. `Engine()` runs it on engine.ggml, `Real()` on ggml-python. After every call
each API takes a snapshot of all its contexts, with every pointer rewritten as (pool index, offset),
so two pools at different addresses compare equal when ggml would have written the same bytes.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import ggml as real_ggml
import numpy as np

from engine import ggml as eng
from engine.core.layout import CGRAPH, OBJECT, POINTER_FIELDS, TENSOR

OBJ_TENSOR, OBJ_GRAPH = 0, 1


class _Api:
    """What both APIs share: the list of pools and the snapshots after each call."""

    def __init__(self) -> None:
        self.pools: list[tuple[int, int]] = []  # (base address, mem_size) in creation order
        self.snapshots: list[dict] = []
        self.calls: list[str] = []

    def pool_bytes(self, i: int) -> bytes:
        raise NotImplementedError

    def rel(self, p: int) -> int:
        """A pointer as (pool index + 1) << 40 | offset; 0 stays 0."""
        if p == 0:
            return 0
        for i, (base, size) in enumerate(self.pools):
            if base <= p <= base + size:
                return ((i + 1) << 40) | (p - base)
        return -1  # points outside every pool

    def snapshot(self, used: list[int]) -> dict:
        snap = {"call": self.calls[-1] if self.calls else "", "pools": []}
        for i, u in enumerate(used):
            raw = np.frombuffer(self.pool_bytes(i), dtype=np.uint8)[:u].copy()
            snap["pools"].append({"used_mem": u, "objects": _normalise(raw, u, self)})
        return snap


def _normalise(raw: np.ndarray, used: int, api: _Api) -> list[dict]:
    """Walk the object list (in place rewriting pointers) and describe every object."""
    out: list[dict] = []
    if used == 0:
        return out
    hdr = 0
    while True:
        obj = raw[hdr:hdr + OBJECT.itemsize].view(OBJECT)
        nxt, offs, size, typ = int(obj["next"][0]), int(obj["offs"][0]), int(obj["size"][0]), \
            int(obj["type"][0])
        obj["next"] = api.rel(nxt)
        entry: dict[str, Any] = {"header": hdr, "offs": offs, "size": size, "type": typ}
        if typ == OBJ_TENSOR:
            t = raw[offs:offs + TENSOR.itemsize].view(TENSOR)
            for f in POINTER_FIELDS[TENSOR]:
                t[f] = np.vectorize(api.rel, otypes=[np.uint64])(t[f])
            r = t[0]
            entry.update(type_=int(r["type"]), ne=[int(x) for x in r["ne"]],
                         nb=[int(x) for x in r["nb"]], op=int(r["op"]),
                         op_params=[int(x) for x in r["op_params"]], flags=int(r["flags"]),
                         src=[int(x) for x in r["src"]], view_src=int(r["view_src"]),
                         view_offs=int(r["view_offs"]), data=int(r["data"]),
                         name=bytes(r["name"]).decode("utf-8", "replace"))
        elif typ == OBJ_GRAPH:
            entry.update(_graph(raw, offs, api))
            out.append(entry)  # hash slots depend on addresses: compare the set, not the bytes
            if nxt == 0:
                break
            hdr = api.rel(nxt) & ((1 << 40) - 1)
            continue
        entry["bytes"] = raw[hdr:offs + size].tobytes()
        out.append(entry)
        if nxt == 0:
            break
        hdr = api.rel(nxt) & ((1 << 40) - 1)  # objects of a context all lie in its own pool
    return out


def _graph(raw: np.ndarray, offs: int, api: _Api) -> dict:
    """A cgraph read from pool bytes: struct fields, node and leaf lists, and the hash set as
    {tensor: use count}, every pointer relative to its pool."""
    g = raw[offs:offs + CGRAPH.itemsize].view(CGRAPH)[0]
    fields = {k: int(g[k]) for k in CGRAPH.names}
    local = lambda address: api.rel(address) & ((1 << 40) - 1)  # noqa: E731 - same pool

    def array(field: str, dtype: str, n: int) -> np.ndarray:
        start = local(fields[field])
        return raw[start:start + n * np.dtype(dtype).itemsize].view(dtype)

    hash_size = fields["hash_size"]
    used = array("hash_used", "<u4", (hash_size + 31) // 32)
    keys, counts = array("hash_keys", "<u8", hash_size), array("use_counts", "<i4", hash_size)
    uses = {api.rel(int(keys[i])): int(counts[i]) for i in range(hash_size)
            if used[i >> 5] & (1 << (i & 31))}
    struct = {k: (api.rel(v) if k in POINTER_FIELDS[CGRAPH] else v) for k, v in fields.items()}
    return {"cgraph": struct, "uses": uses,
            "nodes": [api.rel(int(a)) for a in array("nodes", "<u8", fields["n_nodes"])],
            "leafs": [api.rel(int(a)) for a in array("leafs", "<u8", fields["n_leafs"])]}


class Engine(_Api):
    """engine.ggml behind the shared API."""

    def __init__(self) -> None:
        super().__init__()
        self.ctxs: list[eng.Context] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(eng, name)
        if not callable(attr) or isinstance(attr, type) or not name.startswith("ggml_"):
            return attr

        def call(*args):
            result = attr(*args)
            self.calls.append(name)
            self.snapshots.append(self.snapshot([eng.ggml_used_mem(c) for c in self.ctxs]))
            return result
        return call

    def init(self, mem_size: int, buffer: bool = False, no_alloc: bool = False):
        buf = np.zeros(mem_size, dtype=np.uint8) if buffer else None
        ctx = eng.ggml_init(eng.ggml_init_params(mem_size, buf, no_alloc))
        self.ctxs.append(ctx)
        self.pools.append((ctx.base, ctx.mem_size))
        self.calls.append("ggml_init")
        self.snapshots.append(self.snapshot([eng.ggml_used_mem(c) for c in self.ctxs]))
        return ctx

    def pool_bytes(self, i: int) -> bytes:
        return self.ctxs[i].pool.tobytes()


class Real(_Api):
    """Real ggml (ggml-python) behind the shared API: str arguments become bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.ctxs: list[Any] = []
        self._buffers: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("GGML_"):
            return getattr(eng, name)  # same numbering; checked by the enum tests
        fn = getattr(real_ggml, name)

        def call(*args):
            args = tuple(a.encode() if isinstance(a, str) else a for a in args)
            result = fn(*args)
            self.calls.append(name)
            self.snapshots.append(self.snapshot([real_ggml.ggml_used_mem(c) for c in self.ctxs]))
            return result
        return call

    def init(self, mem_size: int, buffer: bool = False, no_alloc: bool = False):
        buf = None
        if buffer:
            buf = (ctypes.c_uint8 * (mem_size + 64))()
            addr = (ctypes.addressof(buf) + 63) & ~63  # ggml asserts a 16-aligned caller buffer
            self._buffers.append(buf)
            buf = ctypes.c_void_p(addr)
        params = real_ggml.ggml_init_params(mem_size=mem_size, mem_buffer=buf, no_alloc=no_alloc)
        ctx = real_ggml.ggml_init(params)
        base = real_ggml.ggml_get_mem_buffer(ctx)
        size = real_ggml.ggml_get_mem_size(ctx)
        ctypes.memset(base, 0, size)  # ggml does not zero its pool; ours starts zeroed
        self.ctxs.append(ctx)
        self.pools.append((base, size))
        self.calls.append("ggml_init")
        self.snapshots.append(self.snapshot([real_ggml.ggml_used_mem(c) for c in self.ctxs]))
        return ctx

    def pool_bytes(self, i: int) -> bytes:
        base, size = self.pools[i]
        return ctypes.string_at(base, size)

    def free_all(self) -> None:
        for c in self.ctxs:
            real_ggml.ggml_free(c)


def run_both(program: Callable[[Any], Any]) -> tuple[Engine, Real]:
    ours, real = Engine(), Real()
    program(ours)
    try:
        program(real)
    finally:
        real.free_all()
    return ours, real
