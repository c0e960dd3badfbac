"""The mem_size accountant: its split adds up to ggml_used_mem, and the smallest mem_size it
names is enough for real ggml and one alignment step less is not."""

from __future__ import annotations

from pathlib import Path

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.core.accountant import account, format_account
from engine.core.errors import GGMLPoolError


def simple_ctx(api, mem_size: int):
    """ggml's simple-ctx allocations (two matrices, a graph, mul_mat, computed with the context);
    returns (ctx, used_mem)."""
    if api is eng:
        ctx = eng.ggml_init(eng.ggml_init_params(mem_size))
    else:
        ctx = real.ggml_init(real.ggml_init_params(mem_size=mem_size, mem_buffer=None,
                                                   no_alloc=False))
    a = api.ggml_new_tensor_2d(ctx, 0, 2, 4)
    b = api.ggml_new_tensor_2d(ctx, 0, 2, 3)
    gf = api.ggml_new_graph(ctx)
    api.ggml_build_forward_expand(gf, api.ggml_mul_mat(ctx, a, b))
    api.ggml_graph_compute_with_ctx(ctx, gf, 1)
    return ctx, api.ggml_used_mem(ctx)


def asked_by_simple_ctx() -> int:
    """simple-ctx's own formula: data + 2 tensor overheads + a graph overhead + 1024."""
    return (8 + 6) * 4 + 2 * eng.ggml_tensor_overhead() + eng.ggml_graph_overhead() + 1024


def test_the_split_adds_up_and_names_the_plus_1024():
    ctx, used = simple_ctx(eng, asked_by_simple_ctx())
    acc = account(ctx)
    assert acc.used == used
    assert acc.headers + acc.structs + acc.graphs + acc.data + acc.work + acc.padding == used
    assert acc.slack == ctx.mem_size - used
    kinds = [o.kind for o in acc.objects]
    assert kinds == ["TENSOR", "TENSOR", "GRAPH", "TENSOR", "WORK_BUFFER"]
    assert [o.data for o in acc.objects if o.kind == "TENSOR"] == [32, 24, 48]
    # the formulas ggml's example adds up are ggml's own
    assert eng.ggml_tensor_overhead() == real.ggml_tensor_overhead()
    assert eng.ggml_graph_overhead() == real.ggml_graph_overhead()
    text = format_account(acc)
    assert "unused (slack)" in text and str(acc.slack) in text


def test_the_smallest_mem_size_is_real_ggmls():
    ctx, _ = simple_ctx(eng, asked_by_simple_ctx())
    acc = account(ctx)
    smallest = acc.min_mem_size
    rctx, used = simple_ctx(real, smallest)  # real ggml aborts if this is too small
    assert used == smallest
    real.ggml_free(rctx)
    failing = acc.first_to_fail(smallest - 16)
    assert failing is not None and failing.kind == "WORK_BUFFER"
    with pytest.raises(GGMLPoolError):
        simple_ctx(eng, smallest - 16)


def test_views_and_no_alloc_tensors_hold_no_data():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 16))
    a = eng.ggml_new_tensor_2d(ctx, 0, 5, 3)  # 60 bytes of data, padded to 64
    eng.ggml_view_1d(ctx, a, 4, 8)
    eng.ggml_set_no_alloc(ctx, True)
    eng.ggml_new_tensor_1d(ctx, 0, 100)
    acc = account(ctx)
    assert [(o.data, o.padding) for o in acc.objects] == [(60, 4), (0, 0), (0, 0)]
    assert acc.first_to_fail(acc.used) is None
    assert np.sum([o.end - o.header for o in acc.objects]) == acc.used


def test_cli_prints_the_account_of_simple_ctx(capsys):
    from app.cli import main

    assert main(["trace", "simple-ctx", "--accountant"]) == 0
    out = capsys.readouterr().out
    ctx, used = simple_ctx(eng, asked_by_simple_ctx())
    acc = account(ctx)
    assert f"mem_size {acc.mem_size} bytes, used {used} (ggml_used_mem)" in out
    assert f"{'unused (slack)':<18} {acc.slack:>10}" in out


def test_what_simple_ctx_says_of_its_plus_1024_is_true():
    """simple-ctx's comment on `ctx_size += 1024` states how much of it is used: check it against
    the account of the pool the program really built."""
    import re

    from engine.programs import PROGRAMS, trace_program

    text = Path(PROGRAMS["simple-ctx"].source_file).read_text()
    used_of_1024, result_struct, result_data, rest = map(int, re.search(
        r"(\d+) of these 1024 bytes get used: the result tensor's (\d+) \+ (\d+) bytes.*?"
        r"and (\d+) of padding", text, re.S).groups())
    trace = trace_program("simple-ctx")
    acc = account(trace.state_at(len(trace.steps) - 1).contexts[0])
    a, b = (o.data for o in acc.objects if o.name in ("leaf_0", "leaf_1"))
    formula = 2 * eng.ggml_tensor_overhead() + eng.ggml_graph_overhead() + a + b  # the program's sum
    assert acc.used - formula == used_of_1024
    result = [o for o in acc.objects if o.name == "node_0"][0]
    assert (result.end - result.header - result.data, result.data) == (result_struct, result_data)
    assert used_of_1024 - result_struct - result_data == rest
