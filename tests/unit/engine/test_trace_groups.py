"""Steps grouped like the program: layers from the program's `il` loops and blk.N weights,
forward passes from n_past, calls with steps inside them; layer jumps; search."""

from __future__ import annotations

from engine.core.notes import tell
from engine.programs import trace_program
from engine.trace.steps import StepKind
from engine.trace.groups import find_steps, layer_jump, step_groups


def test_minilm_groups_are_its_calls_and_layers():
    trace = trace_program("minilm")
    groups = step_groups(trace.steps)
    calls = [g for g in groups if g.kind == "call"]
    assert [tell([g.label]).split("(")[0] for g in calls] == ["ggml_build_forward_expand",
                                                      "ggml_gallocr_alloc_graph",
                                                      "ggml_backend_graph_compute"]
    compute = calls[2]
    layers = [tell([c.label]) for c in compute.children if c.label.key == "group_layer"]
    assert layers == [f"layer {i}" for i in range(6)]  # nodes computed layer after layer
    # every group covers consecutive steps, children inside their parent, no gaps
    assert groups[0].first == 0 and groups[-1].last == len(trace.steps) - 1
    for a, b in zip(groups, groups[1:]):
        assert b.first == a.last + 1
    for g in calls:
        assert g.children[0].first == g.first + 1 and g.children[-1].last == g.last
    # a node reading a layer's weight is in that layer
    state = trace.state_at(len(trace.steps) - 1)
    for s in trace.steps[compute.first:compute.last + 1]:
        if s.kind == StepKind.NODE:
            node = state.tensor(s.tensor)
            blks = {int(x.name.split(".")[1]) for x in node.src if x is not None and x.name.startswith("blk.")}
            if blks:
                assert s.layer in blks


def test_layer_jumps():
    steps = trace_program("minilm").steps
    start3 = next(s.index for s in steps if s.layer == 3)
    assert layer_jump(steps, start3 - 1, 1) == start3
    inside = start3 + 5
    assert layer_jump(steps, inside, -1) == start3  # back to this layer's start first
    assert steps[layer_jump(steps, start3, -1)].layer == 2
    assert layer_jump(steps, len(steps) - 1, 1) is None


def test_tiny_llama_passes_by_n_past():
    groups = step_groups(trace_program("tiny-llama").steps)
    assert [tell([g.label]) for g in groups] == ["setting up", "forward pass at n_past = 0",
                                                 "forward pass at n_past = 4"]
    second = groups[2]
    assert any(c.kind == "call" and tell([c.label]).startswith("ggml_backend_graph_compute")
               for c in second.children)


def test_simple_ctx_has_no_layers():
    trace = trace_program("simple-ctx")
    assert all(s.layer is None and s.n_past is None for s in trace.steps)
    assert layer_jump(trace.steps, 0, 1) is None


def test_find_steps_by_text_and_tensor_name():
    trace = trace_program("minilm")
    state = trace.state_at(len(trace.steps) - 1)
    names = {(t.ctx.id, t.offs): t.name for t in state.tensors()}
    hits = find_steps(trace.steps, "blk.3.ffn_up", names)
    assert hits and all("blk.3.ffn_up" in trace.steps[i].call + tell(trace.steps[i].notes)
                        + names.get(trace.steps[i].tensor, "") for i in hits)
    assert any("blk.3.ffn_up" in trace.steps[i].call for i in hits)  # the layer's own lines
    assert find_steps(trace.steps, "GELU", names) == [s.index for s in trace.steps
                                                      if "gelu" in (s.call + tell(s.notes)).lower()]
    assert find_steps(trace.steps, "   ", names) == []
