"""What one trace may cost the server: its checkpoints copy at most CHECKPOINT_BYTES together,
however its steps write (a learner's program chooses them), and every state still rebuilds the
same bytes."""

from __future__ import annotations

import numpy as np

import engine.trace.states as T
from engine.trace.steps import ContextMeta, Patch, Step, StepKind


def _trace(pool: int, steps: int, write: int) -> T.Trace:
    """Steps that each write `write` bytes of one pool of `pool` bytes (a different place each)."""
    rng = np.random.default_rng(0)
    out = [Step(0, StepKind.CALL, "ctx = ggml_init(...)", 1, "",
                contexts=(ContextMeta(1, 1 << 32, pool, None, False),))]
    for k in range(1, steps):
        at = (k * write) % (pool - write)
        out.append(Step(k, StepKind.CALL, "x", 2, "", patches=(Patch(1, at, rng.bytes(write)),)))
    return T.Trace("budget", "", 1, out)


def test_checkpoints_stay_within_their_budget(monkeypatch):
    monkeypatch.setattr(T, "CHECKPOINT_BYTES", 64 << 20)
    trace = _trace(16 << 20, 40, 4 << 20)  # every step "big": unbounded, 39 copies of 16 MB
    last = trace.state_at(len(trace.steps) - 1)
    assert 0 < len(trace._cps[1]) <= 4
    assert trace.held_bytes <= trace.recorded_bytes + (64 << 20)
    # the states after the last checkpoint replay more patches, to the same bytes
    expected = np.zeros(16 << 20, np.uint8)
    for s in trace.steps:
        for p in s.patches:
            expected[p.offset:p.end] = np.frombuffer(p.data, np.uint8)
    assert bytes(last.contexts[1].pool.data) == expected.tobytes()
