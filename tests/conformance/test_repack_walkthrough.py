"""The repack walkthrough against llama.cpp's ggml: the bytes its trace holds in the CPU_REPACK
buffer, and its two products (one activation row: gemv; five: gemm and gemv), are what llama.cpp's
own ggml makes of the same weight and activations (tests/support/llamacpp_ggml.py, repack=True)."""

from __future__ import annotations

import numpy as np

from engine.core.types import GGMLType
from engine.programs import PROGRAMS
from engine.quants.repack import LAYOUTS
from tests.support.llamacpp_ggml import MulMat, mul_mat_many
from tests.support.recorded import recorded


def test_the_walkthroughs_bytes_and_products_are_llama_cpps(tmp_path):
    trace = recorded("repack")
    k = next(s.index for s in trace.steps if s.call.startswith("ggml_backend_tensor_set(x5"))
    state = trace.state_at(k)
    t = {x.name: x for x in state.tensors()}

    def data(name: str) -> np.ndarray:
        owner, off = state.space.resolve(t[name].data)
        return owner.pool[off:off + int(t[name].nb[3])].copy()

    # the weight's plain rows (the program quantizes its own floats), read back from the trace
    # through the layout's unpack; llama.cpp repacks them again
    w = LAYOUTS[GGMLType.Q4_0].unpack(data("w").reshape(16, -1)).reshape(-1)
    x5 = data("x5").view(np.float32).reshape(5, 256)
    n = PROGRAMS["repack"].threads
    jobs = [MulMat(GGMLType.Q4_0, w, (256, 16), x5[:1], n, repack=True),
            MulMat(GGMLType.Q4_0, w, (256, 16), x5, n, repack=True)]
    (d1, packed), (d5, _) = mul_mat_many(jobs, tmp_path)
    assert np.array_equal(data("w"), packed)  # the trace's repacked bytes are llama.cpp's
    assert np.array_equal(data("x1").view(np.float32), x5[0])
    out = PROGRAMS["repack"].load().run(n)
    assert np.array_equal(out["y1"].reshape(-1), d1.reshape(-1))
    assert np.array_equal(out["y5"].reshape(-1), d5.reshape(-1))
    assert out["w_is_host"] is False  # (CPU_REPACK's is_host is NULL in ggml)
