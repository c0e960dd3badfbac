"""The memory plan as bars (engine.backend.alloc.memory_plan): what the plan view draws must be the plan.

On the random DAGs and the attention block of the gallocr conformance tests (whose offsets equal
real ggml's): every tensor the allocator placed has one bar at its planned offset; bars alive at
the same node never share bytes unless one took the other's bytes in place at that node; the
highest byte any bar reaches is the buffer's size; a freed tensor's bar ends at the node after
which ggml freed it (its last child)."""

from __future__ import annotations

import pytest

from engine.backend import alloc
from tests.conformance.test_alloc import _engine, attention, random_dag


def _pad(n: int) -> int:
    return (n + 31) // 32 * 32


def _check(build):
    gf, plan, galloc = _engine(build)
    n = gf.n_nodes
    bars = alloc.memory_plan(plan, n)
    placed = {t: a for t, a in plan.addresses.items()}
    assert {b.tensor for b in bars} >= set(placed)
    for b in bars:
        if b.tensor in placed:
            assert (b.buffer_id, b.chunk, b.offset) == placed[b.tensor] or b.reuses is not None
        assert -1 <= b.start <= b.end <= n - 1
    for i in range(-1, n):
        live = [b for b in bars if b.start <= i <= b.end]
        for x in live:
            for y in live:
                if x is y or (x.buffer_id, x.chunk) != (y.buffer_id, y.chunk):
                    continue
                overlap = x.offset < y.offset + _pad(y.size) and y.offset < x.offset + _pad(x.size)
                handover = (x.reuses == y.tensor and x.start == i == y.end) or \
                    (y.reuses == x.tensor and y.start == i == x.end)
                assert not overlap or handover, (i, x.tensor.name, y.tensor.name)
    top = max((b.offset + _pad(b.size) for b in bars), default=0)
    assert top == alloc.ggml_gallocr_get_buffer_size(galloc, 0)
    node, peak = alloc.plan_peak(bars, n)
    assert peak == max((b.offset + b.size for b in bars), default=0)
    first = (-1, 0)  # the rule said plainly: the first node whose highest byte in use is highest
    for i in range(-1, n):
        top = max((b.offset + b.size for b in bars if b.start <= i <= b.end), default=0)
        first = (i, top) if top > first[1] else first
    assert (node, peak) == first
    index = {t: k for k, t in enumerate(gf.nodes)}
    for d in plan.decisions:
        if d.kind == "free":
            bar = next(b for b in bars if b.tensor == d.tensor and b.end == d.node)
            assert any(d.tensor in [s for s in gf.nodes[k].src] or
                       any(s is not None and s.view_src == d.tensor for s in gf.nodes[k].src)
                       for k in [bar.end]), "a tensor is freed at a node that reads it"
    return bars, index


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_bars_are_the_plan_on_random_dags(seed):
    _check(random_dag(seed))


def test_bars_on_the_attention_block_reuse_in_place():
    bars, _ = _check(attention)
    assert any(b.reuses is not None for b in bars)
