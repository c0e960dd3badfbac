"""Every walkthrough's final values against real ggml running the same program code."""

from __future__ import annotations

import numpy as np
import pytest

from engine.programs import PROGRAMS, trace_program
from tests.support.graphs import nmse
from tests.support.real_facade import run_on_real_ggml

# walkthroughs whose program needs files or ops only the engine side provides are listed here
# with the reason; every other one runs on both
ENGINE_ONLY: dict[str, str] = {}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_final_values_match_real_ggml(name):
    assert name not in ENGINE_ONLY, ENGINE_ONLY.get(name)
    prog = PROGRAMS[name]
    trace = trace_program(name)
    assert trace.error is None, trace.error
    theirs = run_on_real_ggml(prog.load().run, n_threads=prog.threads)
    assert set(trace.outputs) == set(theirs)
    for key, ours in trace.outputs.items():
        if isinstance(ours, str):  # quantized blocks, as hex: byte for byte
            assert ours == theirs[key], key
        else:  # floats: within test-backend-ops' bound (sums may run in another order)
            a, b = np.array(ours, dtype=np.float64), np.array(theirs[key], dtype=np.float64)
            assert a.shape == b.shape, key
            assert nmse(a, b) <= 1e-7, (key, nmse(a, b))


def test_simple_ctx_result():
    trace = trace_program("simple-ctx")
    assert trace.outputs["result"] == [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]]
