"""Build the same graph on the engine and on real ggml, compute both, compare the results.

    def build(g, ctx, x, y):            # g: engine.ggml or ggml-python, with ggml's names
        return g.ggml_add(ctx, x, y)

    check_op(build, [Leaf(F32, (4, 3)), Leaf(F32, (4, 1))], n_threads=2)

Leafs are created in both contexts with the same seeded values (raw bytes copied, so F16/BF16/
quantized leafs hold identical bits). The result's type, ne, nb, op, op_params and name must be
identical, and its values within ggml's test-backend-ops NMSE bound.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

import ggml as real
import numpy as np

from engine import ggml as eng
from engine.core.types import GGMLType, TYPE_TRAITS, fp32_to_bf16_bits, fp32_to_fp16_bits

MEM = 256 * 1024 * 1024


@dataclass
class Leaf:
    type: int
    ne: tuple[int, ...]
    values: np.ndarray | None = None  # float values in numpy order (reversed ne); None: random
    name: str = ""
    low: float = -1.0
    high: float = 1.0
    permute: tuple[int, int, int, int] | None = None  # pass ggml_permute(leaf, *permute) instead


def leaf_bytes(leaf: Leaf, rng: np.random.Generator) -> bytes:
    """The raw data of a leaf, in ggml's layout for its type."""
    shape = tuple(reversed(leaf.ne))
    t = GGMLType(leaf.type)
    if leaf.values is not None:
        x = np.asarray(leaf.values).reshape(shape)
    elif t in (GGMLType.I32, GGMLType.I64, GGMLType.I16, GGMLType.I8):
        x = rng.integers(int(leaf.low), int(leaf.high), size=shape)
    else:
        x = rng.uniform(leaf.low, leaf.high, size=shape).astype(np.float32)
    if t == GGMLType.F32:
        return x.astype(np.float32).tobytes()
    if t == GGMLType.F16:
        return fp32_to_fp16_bits(x.astype(np.float32)).tobytes()
    if t == GGMLType.BF16:
        return fp32_to_bf16_bits(x.astype(np.float32)).tobytes()
    if t in (GGMLType.I32, GGMLType.I64, GGMLType.I16, GGMLType.I8):
        return x.astype({GGMLType.I32: np.int32, GGMLType.I64: np.int64, GGMLType.I16: np.int16,
                         GGMLType.I8: np.int8}[t]).tobytes()
    # quantized: quantize with real ggml so both sides hold ggml's own blocks
    x = x.astype(np.float32).reshape(-1, leaf.ne[0])
    n_bytes = x.shape[0] * TYPE_TRAITS[t].type_size * leaf.ne[0] // TYPE_TRAITS[t].blck_size
    out = (ctypes.c_uint8 * n_bytes)()
    real.ggml_quantize_chunk(int(t), x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out, 0,
                             x.shape[0], leaf.ne[0], None)
    return bytes(out)


def _new_leaf(api: Any, ctx: Any, leaf: Leaf) -> Any:
    fn = getattr(api, f"ggml_new_tensor_{len(leaf.ne)}d")
    t = fn(ctx, int(leaf.type), *leaf.ne)
    if leaf.name:
        api.ggml_set_name(t, leaf.name if api is eng else leaf.name.encode())
    return t


def _write(api: Any, t: Any, data: bytes) -> None:
    if api is eng:
        eng.data_bytes(t)[:] = np.frombuffer(data, dtype=np.uint8)
    else:
        ctypes.memmove(t.contents.data, data, len(data))


def _result(api: Any, t: Any) -> dict:
    if api is eng:
        raw = eng.data_bytes(t).tobytes() if t.data is not None else b""
        return dict(type=t.type, ne=[int(x) for x in t.ne], nb=[int(x) for x in t.nb], op=t.op,
                    op_params=[int(x) for x in t.op_params], name=t.name, raw=raw)
    c = t.contents
    n = real.ggml_nbytes(t)
    return dict(type=c.type, ne=list(c.ne), nb=list(c.nb), op=c.op, op_params=list(c.op_params),
                name=c.name.decode(), raw=ctypes.string_at(c.data, n))


def values(res: dict) -> np.ndarray:
    """A result's elements as float64, in ggml order (strided results are gathered)."""
    t = GGMLType(res["type"])
    if TYPE_TRAITS[t].is_quantized:  # compare the blocks byte for byte
        return np.frombuffer(res["raw"], dtype=np.uint8).astype(np.float64)
    dt = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32,
          GGMLType.I64: np.int64, GGMLType.BF16: np.uint16}[t]
    buf = np.frombuffer(res["raw"], dtype=np.uint8)
    itemsize = np.dtype(dt).itemsize
    pad = (-len(buf)) % itemsize
    buf = np.concatenate([buf, np.zeros(pad, np.uint8)])
    a = np.ndarray(tuple(reversed(res["ne"])), dtype=dt, buffer=buf.data,
                   strides=tuple(reversed(res["nb"])))
    if t == GGMLType.BF16:
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float64)


def nmse(ours: np.ndarray, theirs: np.ndarray) -> float:
    """test-backend-ops' NMSE: Σ(a-b)² / Σb² (0 when both are all zero)."""
    a, b = ours.ravel(), theirs.ravel()
    den = float(np.sum(b * b))
    num = float(np.sum((a - b) ** 2))
    return num / den if den else num


def run(api: Any, build: Callable, leaves: list[Leaf], datas: list[bytes], n_threads: int):
    if api is eng:
        ctx = eng.ggml_init(eng.ggml_init_params(MEM))
    else:
        ctx = real.ggml_init(real.ggml_init_params(mem_size=MEM, mem_buffer=None, no_alloc=False))
    tensors = []
    for leaf, data in zip(leaves, datas):
        t = _new_leaf(api, ctx, leaf)
        _write(api, t, data)
        if leaf.permute is not None:
            t = api.ggml_permute(ctx, t, *leaf.permute)
        tensors.append(t)
    out = build(api, ctx, *tensors)
    gf = api.ggml_new_graph(ctx)
    api.ggml_build_forward_expand(gf, out)
    status = api.ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    assert status == 0
    res = _result(api, out)
    res["used_mem"] = api.ggml_used_mem(ctx)
    if api is not eng:
        real.ggml_free(ctx)
    return res


def check_op(build: Callable, leaves: list[Leaf], n_threads: int = 1, max_nmse: float = 1e-7,
             seed: int = 0, exact: bool = False) -> tuple[dict, dict]:
    """Run `build` on both engines; assert same struct fields and values within max_nmse."""
    rng = np.random.default_rng(seed)
    datas = [leaf_bytes(leaf, rng) for leaf in leaves]
    ours = run(eng, build, leaves, datas, n_threads)
    theirs = run(real, build, leaves, datas, n_threads)
    for key in ("type", "ne", "nb", "op", "op_params", "name", "used_mem"):
        assert ours[key] == theirs[key], f"{key}: ours {ours[key]} vs ggml {theirs[key]}"
    a, b = values(ours), values(theirs)
    if exact:
        np.testing.assert_array_equal(a, b)
    else:
        finite = np.isfinite(b)
        np.testing.assert_array_equal(np.isfinite(a), finite)
        err = nmse(a[finite], b[finite])
        assert err <= max_nmse, f"NMSE {err:.3g} > {max_nmse:g}"
    return ours, theirs


def engine_shares(build: Callable, leaves: list[Leaf], n_threads: int, op: int, *,
                  all_threads: bool = False, seed: int = 0) -> list[list]:
    """Run `build` on the engine only; the per-thread Shares of every node with `op`, read through
    the compute observer. With all_threads, an independent ADD joins the graph, so the plan uses
    all n threads even when the op itself is single-task."""
    rng = np.random.default_rng(seed)
    ctx = eng.ggml_init(eng.ggml_init_params(64 * 1024 * 1024))
    ts = []
    for leaf in leaves:
        t = getattr(eng, f"ggml_new_tensor_{len(leaf.ne)}d")(ctx, int(leaf.type), *leaf.ne)
        eng.data_bytes(t)[:] = np.frombuffer(leaf_bytes(leaf, rng), np.uint8)
        ts.append(eng.ggml_permute(ctx, t, *leaf.permute) if leaf.permute else t)
    out = build(eng, ctx, *ts)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    if all_threads:
        z = eng.ggml_new_tensor_1d(ctx, GGMLType.F32, 64)
        eng.data_bytes(z)[:] = 0
        eng.ggml_build_forward_expand(gf, eng.ggml_add(ctx, z, z))
    found = []

    def observer(node, ask, shares):
        if not ask and node.op == op:
            found.append(list(shares))
        return True

    assert eng.ggml_graph_compute_with_ctx(ctx, gf, n_threads, observer) == 0
    assert found, f"no node with op {op} ran"
    return found


def engine_result(build: Callable, leaves: list[Leaf], n_threads: int, seed: int = 0) -> bytes:
    """The engine's result bytes for `build` on seeded leaves, at n threads."""
    rng = np.random.default_rng(seed)
    return run(eng, build, leaves, [leaf_bytes(leaf, rng) for leaf in leaves], n_threads)["raw"]
