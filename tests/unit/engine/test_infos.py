"""engine.core.infos (bulk tensor infos and graph edges) and ggml_graph_dump_dot's decorations,
checked against the engine's one-tensor-at-a-time functions on real walkthroughs."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.context import GGML_OBJECT_TYPE_TENSOR
from engine.core.graph import DotStyle, ggml_graph_dump_dot
from engine.core.infos import graph_tensors, record_names, tensor_infos
from engine.programs import trace_program
from engine.core.tensor import Tensor, ggml_nbytes

PROGRAMS = ("simple-ctx", "views-and-permute", "quantized-tensor", "attention-block",
            "mnist-style")


@pytest.fixture(scope="module", params=PROGRAMS)
def state(request):
    trace = trace_program(request.param)
    return trace.state_at(len(trace.steps) - 1)


def test_tensor_infos_equal_each_tensor(state):
    for ctx in state.contexts.values():
        handles = [Tensor(ctx, o.offs) for o in ctx.objects() if o.type == GGML_OBJECT_TYPE_TENSOR]
        infos = tensor_infos(ctx)
        assert len(infos) == len(handles) > 0 or not handles
        for info, t in zip(infos, handles):
            assert (info.offs, info.address, info.name, info.type, info.op, info.flags) == \
                (t.offs, t.address, t.name, t.type, t.op, t.flags)
            assert info.ne == tuple(int(x) for x in t.ne)
            assert info.nbytes == ggml_nbytes(t), t.name
            assert info.is_view == (t.view_src is not None)
            assert info.data == (t.data or 0)


def test_graph_edges_are_the_srcs(state):
    for g in state.graphs():
        want = [(s.address, n.address, j) for n in g.nodes for j, s in enumerate(n.src)
                if s is not None]
        addresses, recs = graph_tensors(g)
        edges = [(a, dst, j) for dst, srcs in zip(addresses[:g.n_nodes].tolist(), recs["src"][:g.n_nodes].tolist())
                 for j, a in enumerate(srcs) if a]
        assert edges == want


def test_graph_tensors_are_the_nodes_and_leafs(state):
    for g in state.graphs():
        addresses, recs = graph_tensors(g)
        tensors = g.nodes + g.leafs
        assert addresses.tolist() == [t.address for t in tensors]
        assert record_names(recs) == [t.name for t in tensors]
        assert recs["src"].tolist() == [[0 if s is None else s.address for s in t.src] for t in tensors]


def test_resolve_all_is_resolve_of_each(state):
    space = state.space
    ctx = next(iter(state.contexts.values()))
    inside = [ctx.base, ctx.base + 17, ctx.base + ctx.mem_size] + [t.address for t in state.tensors()]
    owners, which, offsets = space.resolve_all(np.asarray(inside, dtype=np.uint64))
    assert [(owners[i], o) for i, o in zip(which, offsets)] == [space.resolve(a) for a in inside]
    for outside in (ctx.base - 1, ctx.base + ctx.mem_size + 1):
        with pytest.raises(ValueError, match=f"{outside:#x} is in no live ggml_context pool"):
            space.resolve_all(np.asarray(inside + [outside], dtype=np.uint64))


def test_dump_dot_decorations(state):
    """decorate adds attributes to a node, or folds tensors into a node of the caller's; edges
    into, out of and inside a fold are drawn once; nothing else changes."""
    g = state.graphs()[-1]
    plain = ggml_graph_dump_dot(g)
    same = ggml_graph_dump_dot(g, decorate=lambda t: None)
    assert same == plain  # (these programs' names need no escaping)
    marked = ggml_graph_dump_dot(g, decorate=lambda t: DotStyle(f'id = "t{t.address:x}"'))
    for t in g.nodes + g.leafs:
        assert f'id = "t{t.address:x}"; ]' in marked
    leafs = {t.address for t in g.leafs}
    folded = ggml_graph_dump_dot(g, decorate=lambda t: DotStyle(fold="box")
                                 if t.address in leafs else None,
                                 extra=('  "box" [shape = box3d];',))
    assert '"box" [shape = box3d];' in folded
    for t in g.leafs:
        assert f'"{t.address:#x}" [' not in folded  # drawn only as the box
    edges = [line for line in folded.splitlines() if " -> " in line]
    assert len(edges) == len(set(edges))
    assert not any(line.strip().startswith('"box" -> "box"') for line in edges)




def test_dump_dot_escapes_names_only_when_decorating():
    from engine import ggml as G

    ctx = G.ggml_init(G.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
    G.ggml_set_name(a, "a|{b}")
    gf = G.ggml_new_graph(ctx)
    G.ggml_build_forward_expand(gf, G.ggml_sqr(ctx, a))
    assert "a|{b} (f32)" in G.ggml_graph_dump_dot(gf)  # as ggml writes it
    assert "a\\|\\{b\\} (f32)" in G.ggml_graph_dump_dot(gf, decorate=lambda t: None)


def test_digests_follow_structs_not_data():
    """layout_digest and graph_digest: the same for two states of a graph's compute
    (only data written), different once a struct is (a tensor named), different between graphs."""
    from engine import ggml as G
    from engine.core.infos import graph_digest, layout_digest

    trace = trace_program("simple-ctx")
    computed = [k for k, s in enumerate(trace.steps) if s.kind.value == "node"]
    before, after = trace.state_at(computed[0] - 1), trace.state_at(len(trace.steps) - 1)
    for cid in before.contexts:
        assert layout_digest(before.contexts[cid]) == layout_digest(after.contexts[cid])
    assert graph_digest(before.graphs()[-1]) == graph_digest(after.graphs()[-1])
    ctx = after.contexts[min(after.contexts)]
    digest, drawn = layout_digest(ctx), graph_digest(after.graphs()[-1])
    node = after.graphs()[-1].nodes[-1]
    G.ggml_set_name(node, "renamed")
    assert layout_digest(ctx) != digest and graph_digest(after.graphs()[-1]) != drawn
    other = trace_program("views-and-permute")
    assert graph_digest(other.state_at(len(other.steps) - 1).graphs()[-1]) != drawn
