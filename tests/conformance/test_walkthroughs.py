"""Every walkthrough's final values against real ggml running the same program code."""

from __future__ import annotations

import numpy as np
import pytest

from engine.programs import PROGRAMS, trace_program
from tests.support.graphs import nmse
from tests.support import real_facade
from tests.support.real_facade import run_on_real_ggml
from tests.support.rpc_server import rpc_server

# walkthroughs whose program needs files or ops only the engine side provides are listed here
# with the reason; every other one runs on both
ENGINE_ONLY: dict[str, str] = {
    "gguf-load": "it spells out gguf.cpp's loading with a getter gguf.h lacks (the tensor's ne); "
                 "test_gguf_load_builds_the_context_ggml_builds compares it with real ggml instead",
    "repack": "it calls the proc address ggml_backend_dev_get_extra_bufts as a function, which "
              "ggml-python hands out as a bare pointer; test_repack_walkthrough.py compares its "
              "repacked bytes and products with llama.cpp's own ggml (the build the layouts are "
              "llama.cpp's from) instead",
}


@pytest.mark.parametrize("name", sorted(set(PROGRAMS) - set(ENGINE_ONLY)))
def test_final_values_match_real_ggml(name):
    prog = PROGRAMS[name]
    trace = trace_program(name)
    assert trace.error is None, trace.error
    if name == "offload":  # its accelerator is, on real ggml, the RPC backend of a loopback server
        with rpc_server() as endpoint:
            real_facade.RPC_ENDPOINT.append(endpoint)
            theirs = run_on_real_ggml(prog.load().run, n_threads=prog.threads)
            real_facade.RPC_ENDPOINT.pop()
    else:
        theirs = run_on_real_ggml(prog.load().run, n_threads=prog.threads)
    assert set(trace.outputs) == set(theirs)
    for key, ours in trace.outputs.items():
        if isinstance(ours, str) or _has_text(ours):  # blocks as hex, tokens: exactly
            assert ours == theirs[key], key
        else:  # floats: within test-backend-ops' bound (sums may run in another order)
            a, b = np.array(ours, dtype=np.float64), np.array(theirs[key], dtype=np.float64)
            assert a.shape == b.shape, key
            if np.array_equal(a, b, equal_nan=True):  # the same values, NaNs in the same places
                continue
            assert nmse(a, b) <= 1e-7, (key, nmse(a, b))


def _has_text(value) -> bool:
    """Outputs holding text (token pieces, with their ids and odds) compare as they are."""
    return isinstance(value, (list, tuple)) and any(
        isinstance(x, str) or _has_text(x) for x in value)


def test_simple_ctx_result():
    trace = trace_program("simple-ctx")
    assert trace.outputs["result"] == [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]]


def test_gguf_load_builds_the_context_ggml_builds():
    """The walkthrough's hand-built context equals the one real ggml's gguf_init_from_file makes:
    the same used memory, and every tensor's name, type, ne and data offset in the pool."""
    import ctypes

    import ggml as real

    from engine.resources import fixture_path

    FIXTURE = fixture_path("minilm-q8_0.gguf")

    trace = trace_program("gguf-load")
    assert trace.error is None, trace.error
    state = trace.state_at(len(trace.steps) - 1)
    ctx = state.contexts[0]
    ours = [(t.name, t.type, [int(x) for x in t.ne], t.data - ctx.base)
            for t in state.tensors() if t.ctx is ctx]
    out = ctypes.c_void_p()
    params = real.gguf_init_params(no_alloc=False, ctx=ctypes.pointer(out))
    g = real.gguf_init_from_file(str(FIXTURE).encode(), params)
    try:
        rctx = out.value
        base = real.ggml_get_mem_buffer(rctx)
        theirs = []
        t = real.ggml_get_first_tensor(rctx)
        while t:
            c = t.contents
            theirs.append((c.name.decode(), c.type, list(c.ne), c.data - base))
            t = real.ggml_get_next_tensor(rctx, t)
        assert trace.outputs["used_mem"] == real.ggml_used_mem(rctx)
        assert ours == theirs
    finally:
        real.gguf_free(g)
        real.ggml_free(out.value)
