"""Graphviz draws what a learner's program builds, within bounds: a graph too large, or one dot
is still drawing after its time limit, becomes a drawing that says so."""

from __future__ import annotations

import time

import pytest

from app.views.debugger import graph as G


def test_a_small_graph_is_drawn():
    svg = G.render_svg('digraph { a -> b }')
    assert svg.startswith("<svg") and "<title>a</title>" in svg


def test_a_graph_too_large_is_a_message():
    svg = G.render_svg("digraph {" + " ".join(f"n{i} -> n{i + 1};" for i in range(600_000)) + "}")
    assert svg.startswith("<svg") and "too large to draw" in svg


def test_graphviz_is_stopped_at_its_time_limit(monkeypatch):
    monkeypatch.setattr(G, "DOT_SECONDS", 0.5)
    dense = "digraph {" + " ".join(f"n{i} -> n{j};" for i in range(300) for j in range(i + 1, min(300, i + 40))) + "}"
    started = time.monotonic()
    with pytest.raises(G.NotDrawnInTime) as stopped:
        G.render_svg(dense)
    assert time.monotonic() - started < 5
    assert "did not finish drawing this graph in 0.5 s" in stopped.value.svg
    svgs = G.SvgCache(4)  # not kept: asked again, graphviz draws it again
    with pytest.raises(G.NotDrawnInTime):
        svgs("k", lambda: dense)
    assert svgs.drawn("k") is None
