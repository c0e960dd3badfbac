"""ggml_backend_sched on the engine against real ggml with a real second backend (ggml's RPC).

Real ggml runs an RPC server on loopback (tests/support/rpc_server.py) and schedules each graph
over [RPC, CPU]; the engine schedules the same graph over [a simulated accelerator with the RPC
backend's capabilities and names, its CPU]. Weights are split between the two as llama.cpp's
`-ngl` does, nodes are pinned with ggml_backend_sched_set_tensor_backend, and for each case the
test compares: every node's and leaf's backend, the splits (their backends, first nodes and
inputs, from ggml's own GGML_SCHED_DEBUG report), the copies the sources were rewired to,
n_splits and n_copies, each backend's compute buffer size, every tensor's offset in its buffer,
the eval callback's calls, and the result bytes.
"""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import ggml as real
import numpy as np
import pytest

from engine import ggml_alloc as alloc  # (ggml-alloc.h, as a C program includes it)
from engine import ggml as eng
from engine.backend import accel, buffer as ebuf, device as edev, sched as escheduler, sched_api as esched
from engine.core.errors import GGMLAssertionError
from tests.support.real_facade import RealTensor, real_namespace
from tests.support.rpc_server import rpc_server

F32 = 0
N_EMBD, N_FF, N_TOK = 32, 48, 3


@pytest.fixture(scope="module")
def endpoint():
    real.ggml_cpu_init()
    with rpc_server() as ep:
        yield ep


# --- the two sides ----------------------------------------------------------------------------

class EngineSide:
    def __init__(self, ep: bytes) -> None:
        self.G = eng
        rpc_name = f"RPC0[{ep.decode()}]"
        self.backends = {"dev": accel.ggml_backend_accel_init("RPC0", rpc_name), "cpu": edev.ggml_backend_cpu_init()}

    def ctx(self, n: int):
        size = eng.ggml_tensor_overhead() * n + eng.ggml_graph_overhead()
        return eng.ggml_init(eng.ggml_init_params(size, None, True))

    def alloc_weights(self, ctx, where: str):
        buf = alloc.ggml_backend_alloc_ctx_tensors_from_buft(ctx, self.backends[where].device.buft)
        ebuf.ggml_backend_buffer_set_usage(buf, ebuf.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        return buf

    def set(self, t, values: np.ndarray) -> None:
        ebuf.ggml_backend_tensor_set(t, values, 0, eng.ggml_nbytes(t))

    def get(self, t) -> bytes:
        return ebuf.ggml_backend_tensor_get(t, 0, eng.ggml_nbytes(t))

    def sched(self, graph_size: int, parallel: bool, op_offload: bool):
        bes = [self.backends["dev"], self.backends["cpu"]]
        return esched.ggml_backend_sched_new(bes, None, 2, graph_size, parallel, op_offload)

    def pin(self, sched, t, where: str) -> None:
        esched.ggml_backend_sched_set_tensor_backend(sched, t, self.backends[where])

    def alloc_graph(self, sched, gf) -> list[tuple]:
        """(backend, first node that is not a view op, input names) for each split."""
        assert esched.ggml_backend_sched_alloc_graph(sched, gf)
        nodes = gf.nodes
        first = lambda s: next(i for i in range(s.i_start, s.i_end) if nodes[i].op not in escheduler.VIEW_OPS)  # noqa: E731
        return [(s.backend_id, first(s), [t.name for t in s.inputs]) for s in sched.splits]

    def compute(self, sched, gf) -> int:
        return esched.ggml_backend_sched_graph_compute(sched, gf)

    def set_callback(self, sched, log: list) -> None:
        def cb(t, ask):
            log.append((t.name, bool(ask)))
            return True
        esched.ggml_backend_sched_set_eval_callback(sched, cb, None)

    def backend_name(self, sched, t) -> str | None:
        b = esched.ggml_backend_sched_get_tensor_backend(sched, t)
        return None if b is None else edev.ggml_backend_name(b)

    def counts(self, sched) -> dict:
        return dict(n_splits=esched.ggml_backend_sched_get_n_splits(sched),
                    n_copies=esched.ggml_backend_sched_get_n_copies(sched),
                    n_backends=esched.ggml_backend_sched_get_n_backends(sched),
                    sizes=[esched.ggml_backend_sched_get_buffer_size(sched, b) for b in self.backends.values()])

    def place(self, t) -> tuple:
        buf = ebuf.tensor_buffer(t)
        return (t.name, None if buf is None else ebuf.ggml_backend_buffer_name(buf),
                None if t.data is None else t.data - buf.base)

    def srcs(self, t) -> list:
        return [s.name for s in t.src if s is not None]

    def nodes(self, gf) -> list:
        return gf.nodes

    def leafs(self, gf) -> list:
        return gf.leafs

    def free(self, sched) -> None:
        esched.ggml_backend_sched_free(sched)


class RealSide:
    def __init__(self, ep: bytes) -> None:
        self.G = SimpleNamespace(**real_namespace())
        self.backends = {"dev": real.ggml_backend_rpc_init(ep, 0), "cpu": real.ggml_backend_cpu_init()}
        assert self.backends["dev"], "could not open the RPC backend"
        self.keep = []

    def ctx(self, n: int):
        return real.ggml_init(real.ggml_init_params(
            mem_size=real.ggml_tensor_overhead() * n + real.ggml_graph_overhead(), mem_buffer=None, no_alloc=True))

    def alloc_weights(self, ctx, where: str):
        buft = real.ggml_backend_get_default_buffer_type(self.backends[where])
        buf = real.ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft)
        real.ggml_backend_buffer_set_usage(buf, real.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        return buf

    def set(self, t, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values)
        self.keep.append(v)
        real.ggml_backend_tensor_set(t.ptr, v.ctypes.data_as(ctypes.c_void_p), 0, real.ggml_nbytes(t.ptr))

    def get(self, t) -> bytes:
        out = ctypes.create_string_buffer(real.ggml_nbytes(t.ptr))
        real.ggml_backend_tensor_get(t.ptr, out, 0, real.ggml_nbytes(t.ptr))
        return out.raw

    def sched(self, graph_size: int, parallel: bool, op_offload: bool):
        arr = (real.ggml_backend_t_ctypes * 2)(self.backends["dev"], self.backends["cpu"])
        self.keep.append(arr)
        return real.ggml_backend_sched_new(arr, None, 2, graph_size, parallel, op_offload)

    def pin(self, sched, t, where: str) -> None:
        real.ggml_backend_sched_set_tensor_backend(sched, t.ptr, self.backends[where])

    def alloc_graph(self, sched, gf) -> list[tuple]:
        """The splits as ggml reports them with GGML_SCHED_DEBUG=2 (set when the sched was made):
        each "## SPLIT" line, its inputs, and the index of the first node it lists."""
        lines: list[str] = []

        @real.ggml_log_callback
        def log(level, text, user_data):
            lines.append(text.decode(errors="replace"))
        real.ggml_log_set(log, None)
        try:
            assert real.ggml_backend_sched_alloc_graph(sched, gf)
        finally:
            real.ggml_log_set(ctypes.cast(None, real.ggml_log_callback), None)
        report = "".join(lines)
        splits = []
        names = [real.ggml_backend_name(self.backends[k]).decode() for k in ("dev", "cpu")]
        for m in re.finditer(r"## SPLIT #(\d+): (\S+) # (\d+) inputs(?:: )?(.*)\n+node #\s*(\d+)", report):
            inputs = re.findall(r"\[(.+?) \(", m.group(4))
            assert len(inputs) == int(m.group(3))
            splits.append((names.index(m.group(2)), int(m.group(5)), inputs))
        return splits

    def compute(self, sched, gf) -> int:
        return real.ggml_backend_sched_graph_compute(sched, gf)

    def set_callback(self, sched, log: list) -> None:
        @real.ggml_backend_sched_eval_callback
        def cb(t, ask, user_data):
            log.append((t.contents.name.decode(), bool(ask)))
            return True
        self.keep.append(cb)
        real.ggml_backend_sched_set_eval_callback(sched, cb, None)

    def backend_name(self, sched, t) -> str | None:
        b = real.ggml_backend_sched_get_tensor_backend(sched, t.ptr)
        return None if not b else real.ggml_backend_name(b).decode()

    def counts(self, sched) -> dict:
        return dict(n_splits=real.ggml_backend_sched_get_n_splits(sched),
                    n_copies=real.ggml_backend_sched_get_n_copies(sched),
                    n_backends=real.ggml_backend_sched_get_n_backends(sched),
                    sizes=[real.ggml_backend_sched_get_buffer_size(sched, b) for b in self.backends.values()])

    def place(self, t) -> tuple:
        c = t.ptr.contents
        if not c.buffer:
            return (c.name.decode(), None, None if not c.data else c.data)
        base = real.ggml_backend_buffer_get_base(c.buffer)
        return (c.name.decode(), real.ggml_backend_buffer_name(c.buffer).decode(), c.data - base)

    def srcs(self, t) -> list:
        return [s.contents.name.decode() for s in t.ptr.contents.src if s]

    def nodes(self, gf) -> list:
        g = gf.contents
        return [RealTensor(g.nodes[i]) for i in range(g.n_nodes)]

    def leafs(self, gf) -> list:
        g = gf.contents
        return [RealTensor(g.leafs[i]) for i in range(g.n_leafs)]

    def free(self, sched) -> None:
        real.ggml_backend_sched_free(sched)


# --- the programs -----------------------------------------------------------------------------

def _mlp(side, n_layers: int, ngl: int, shapes=(N_EMBD, N_FF, N_TOK), views: bool = False, seed: int | None = None):
    """A residual MLP of n_layers: the first `ngl` layers' weights on the device, the rest on the
    CPU, as llama.cpp's -ngl places them; the input is a graph input the scheduler allocates."""
    G = side.G
    n_embd, n_ff, n_tok = shapes
    rng = np.random.default_rng(n_layers * 10 + ngl if seed is None else seed)
    weights = {}
    ctx_w = {where: side.ctx(4 * n_layers + 2) for where in ("dev", "cpu")}
    for layer in range(n_layers):
        where = "dev" if layer < ngl else "cpu"
        for name, ne in (("up", (n_embd, n_ff)), ("down", (n_ff, n_embd)), ("norm", (n_embd,))):
            t = G.ggml_new_tensor(ctx_w[where], F32, len(ne), list(ne))
            G.ggml_set_name(t, f"blk.{layer}.{name}")
            weights[(layer, name)] = t
    out_w = G.ggml_new_tensor_2d(ctx_w["cpu"], F32, n_embd, n_embd)
    G.ggml_set_name(out_w, "output")
    bufs = [side.alloc_weights(ctx_w[w], w) for w in ("dev", "cpu") if (w == "cpu" or ngl > 0)]
    for (layer, name), t in sorted(weights.items()):
        n = int(np.prod([x for x in (t.ne if isinstance(t, RealTensor) else list(t.ne))]))
        side.set(t, rng.uniform(-0.5, 0.5, n).astype(np.float32))
    side.set(out_w, rng.uniform(-0.5, 0.5, n_embd * n_embd).astype(np.float32))

    ctx = side.ctx(64 * n_layers + 64)
    gf = G.ggml_new_graph(ctx)
    inp = G.ggml_new_tensor_2d(ctx, F32, n_embd, n_tok)
    G.ggml_set_name(inp, "inp")
    G.ggml_set_input(inp)
    cur = inp
    for layer in range(n_layers):
        h = G.ggml_rms_norm(ctx, cur, 1e-6)
        h = G.ggml_mul(ctx, h, weights[(layer, "norm")])
        h = G.ggml_mul_mat(ctx, weights[(layer, "up")], h)
        G.ggml_set_name(h, f"ffn_up-{layer}")
        h = G.ggml_silu(ctx, h)
        if views:
            h = G.ggml_cont(ctx, G.ggml_transpose(ctx, G.ggml_cont(ctx, G.ggml_transpose(ctx, h))))
            h = G.ggml_reshape_2d(ctx, h, n_ff, n_tok)
        h = G.ggml_mul_mat(ctx, weights[(layer, "down")], h)
        G.ggml_set_name(h, f"ffn_down-{layer}")
        cur = G.ggml_add(ctx, cur, h)
        G.ggml_set_name(cur, f"l_out-{layer}")
    out = G.ggml_mul_mat(ctx, out_w, cur)
    G.ggml_set_name(out, "result")
    G.ggml_set_output(out)
    G.ggml_build_forward_expand(gf, out)
    return dict(gf=gf, inp=inp, out=out, ctx=ctx, bufs=bufs, ctx_w=ctx_w, rng=rng)


def run_case(side, n_layers=3, ngl=1, parallel=False, op_offload=True, pin=None, views=False, callback=False,
             twice=False):
    prog = _mlp(side, n_layers, ngl, views=views)
    gf = prog["gf"]
    sched = side.sched(2048, parallel, op_offload)
    nodes = side.nodes(gf)
    for name, where in (pin or {}).items():
        side.pin(sched, next(n for n in nodes if n.name == name or
                             (isinstance(n.name, bytes) and n.name.decode() == name)), where)
    splits = side.alloc_graph(sched, gf)
    inp_vals = prog["rng"].uniform(-1, 1, N_EMBD * N_TOK).astype(np.float32)
    side.set(prog["inp"], inp_vals)
    log: list = []
    if callback:
        side.set_callback(sched, log)
    assert side.compute(sched, gf) == 0
    if twice:  # the same graph again: the scheduler keeps its plan
        side.set(prog["inp"], inp_vals * 2)
        assert side.compute(sched, gf) == 0
    name = lambda t: t.name.decode() if isinstance(t.name, bytes) else t.name  # noqa: E731
    seen, places = set(), []
    srcs = [RealTensor(p) if isinstance(n, RealTensor) else p
            for n in nodes for p in (n.ptr.contents.src if isinstance(n, RealTensor) else n.src) if p]
    for t in side.leafs(gf) + nodes + srcs:  # the copies the sources were rewired to included
        if name(t) not in seen:
            seen.add(name(t))
            places.append(side.place(t))
    result = dict(
        backends=[(name(t), side.backend_name(sched, t)) for t in side.leafs(gf) + nodes],
        splits=splits,
        srcs=[(name(t), side.srcs(t)) for t in nodes],
        counts=side.counts(sched), places=places, log=log, out=side.get(prog["out"]))
    side.free(sched)
    return result


CASES = {
    "all-cpu": dict(ngl=0),
    "first-layer-on-device": dict(ngl=1),
    "two-of-three": dict(ngl=2),
    "all-on-device": dict(ngl=3),
    "pinned-node": dict(ngl=3, pin={"ffn_up-1": "cpu"}),
    "pinned-to-device": dict(ngl=0, pin={"ffn_down-0": "dev", "l_out-2": "dev"}),
    "no-offload": dict(ngl=2, op_offload=False),
    "views": dict(ngl=2, views=True),
    "parallel-copies": dict(ngl=1, parallel=True),
    "eval-callback": dict(ngl=2, callback=True),
    "computed-twice": dict(ngl=1, twice=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sched_equals_real_ggml_with_rpc(endpoint, case, monkeypatch):
    monkeypatch.setenv("GGML_SCHED_DEBUG", "2")  # real ggml reports its splits (read at sched_new)
    e = run_case(EngineSide(endpoint), **CASES[case])
    r = run_case(RealSide(endpoint), **CASES[case])
    assert len(r["splits"]) == r["counts"]["n_splits"] > 0
    assert e["backends"] == r["backends"]
    assert e["counts"] == r["counts"]
    assert e["srcs"] == r["srcs"]
    assert e["places"] == r["places"]
    assert e["log"] == r["log"]
    assert e["out"] == r["out"]
    assert e["splits"] == r["splits"]


def test_sched_misuse_names_ggml_assertions(endpoint):
    side = EngineSide(endpoint)
    dev, cpu = side.backends["dev"], side.backends["cpu"]
    with pytest.raises(GGMLAssertionError, match="GGML_BACKEND_DEVICE_TYPE_CPU"):
        esched.ggml_backend_sched_new([cpu, dev], None, 2, 64, False, True)  # the CPU must come last
    prog = _mlp(side, 1, 1)
    sched = side.sched(64, False, True)
    assert esched.ggml_backend_sched_alloc_graph(sched, prog["gf"])
    with pytest.raises(GGMLAssertionError, match=r"!sched->is_alloc"):
        esched.ggml_backend_sched_alloc_graph(sched, prog["gf"])
    small = esched.ggml_backend_sched_new([dev, cpu], None, 2, 8, False, True)
    with pytest.raises(GGMLAssertionError, match="hash_set.size >= graph->n_nodes"):
        esched.ggml_backend_sched_alloc_graph(small, _mlp(side, 1, 1)["gf"])


def test_device_without_an_op_leaves_it_to_the_cpu():
    """A device that cannot run SILU: expansion skips it, pass 3 gives it to the backend that
    can read most of its inputs (the CPU, through a copy), and the result is still right."""
    dev = accel.ggml_backend_accel_init("GPU0", ops=["MUL_MAT", "MUL", "ADD", "RMS_NORM"])
    side = EngineSide(b"x")
    side.backends["dev"] = dev
    prog = _mlp(side, 2, 2, seed=5)
    sched = side.sched(256, False, True)
    assert esched.ggml_backend_sched_alloc_graph(sched, prog["gf"])
    where = {t.name: sched.causes.get(t) for t in prog["gf"].nodes}
    silu = [n for n in prog["gf"].nodes if n.op == eng.GGML_OP_UNARY]
    assert silu and all(esched.ggml_backend_sched_get_tensor_backend(sched, n) is side.backends["cpu"] for n in silu)
    assert all(where[n.name] == "3.best" for n in silu)
    assert esched.ggml_backend_sched_get_n_splits(sched) == 6  # dev, cpu (silu), dev, cpu, dev, cpu (output)
    side.set(prog["inp"], np.ones(N_EMBD * N_TOK, np.float32))
    assert esched.ggml_backend_sched_graph_compute(sched, prog["gf"]) == 0
    # the same graph on the CPU alone gives the same bytes
    cpu_only = EngineSide(b"x")
    ref = _mlp(cpu_only, 2, 0, seed=5)
    s2 = cpu_only.sched(256, False, True)
    assert esched.ggml_backend_sched_alloc_graph(s2, ref["gf"])
    cpu_only.set(ref["inp"], np.ones(N_EMBD * N_TOK, np.float32))
    assert esched.ggml_backend_sched_graph_compute(s2, ref["gf"]) == 0
    assert side.get(prog["out"]) == cpu_only.get(ref["out"])
