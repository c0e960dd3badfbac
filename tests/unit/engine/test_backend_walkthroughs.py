"""The ggml-backend walkthroughs: simple-backend and offload give the results of their context-path
twins, and their traces show the scheduler's passes, splits and copies, and the allocator's plan."""

from __future__ import annotations

import numpy as np

from engine import ggml as G
from engine.programs import PROGRAMS, trace_program


def test_simple_backend_equals_simple_ctx():
    backend = PROGRAMS["simple-backend"].load().run(1)["result"]
    ctx = G.to_numpy(PROGRAMS["simple-ctx"].load().run(1)["result"])
    assert np.array_equal(np.asarray(backend), np.asarray(ctx))


def test_offload_generates_what_tiny_llama_generates():
    """Half the layers on a device with its own memory, the graph in three splits with copies
    between them: the same logits, bit for bit, and the same tokens."""
    off = PROGRAMS["offload"].load().run(1)
    ref = PROGRAMS["tiny-llama"].load().run(1)
    assert off["generated"] == ref["generated"]
    assert off["n_splits"] == 3
    for key in ("prompt_logits", "logits_1"):
        assert np.array_equal(off[key].reshape(-1), np.asarray(ref[key]).reshape(-1))


def test_offload_trace_shows_passes_splits_and_copies():
    trace = trace_program("offload")
    kinds = [s.kind for s in trace.steps]
    assert kinds.count("split") == 6  # three splits, for each of the two forward passes
    assert "pass" in kinds and "copy" in kinds and "alloc" in kinds
    first_pass = next(s for s in trace.steps if s.kind == "pass")
    backends = {p.backend for p in first_pass.placements}
    assert backends == {"GPU0", "CPU"}  # weights on both devices place their ops in pass 1
    splits = [s.split for s in trace.steps if s.kind == "split"][:3]
    assert [(sp.backend, sp.i_start) for sp in splits] == \
        [("CPU", 0), ("GPU0", splits[1].i_start), ("CPU", splits[2].i_start)]
    decisions = [s.decision for s in trace.steps if s.kind == "alloc"]
    assert {d.kind for d in decisions} >= {"alloc", "free"} and {d.buffer for d in decisions} == {"GPU0", "CPU"}
    # a copy step writes the copy's bytes; the rebuilt state after it holds them in the device buffer
    copy = next(s for s in trace.steps if s.kind == "copy")
    state = trace.state_at(copy.index)
    cpy = state.tensor(copy.tensor)
    assert cpy.name.startswith("GPU0#")
    owner, _ = state.space.resolve(cpy.data)
    assert owner.name == "GPU0" and not owner.is_host
    src = cpy.name.split("#")[1]
    original = next(t for t in state.tensors() if t.name == src)
    n = G.ggml_nbytes(cpy)
    src_owner, off = state.space.resolve(original.data)
    dst_owner, off2 = state.space.resolve(cpy.data)
    assert bytes(src_owner.pool[off:off + n]) == bytes(dst_owner.pool[off2:off2 + n])
