"""Views of tensor memory: ggml keeps whatever ne and nb a program gives; the engine's one way of
seeing memory with strides (engine.core.tensor_data.strided_view) checks with exact integers that a
view's bytes lie in its buffer before numpy sees the strides (numpy's own check overflows on a
stride of 2**62, and the process dies reading).

The oracle is real ggml (ggml-python), one child process per case since it aborts on a failed
GGML_ASSERT: where it accepts a view (its size_t arithmetic wrapping), the engine makes the same
struct (ne, nb, data) and accepts it too; where it asserts, the engine raises the same condition;
and the engine reads a view's elements exactly when all of them lie in the pool, the values real
ggml's ggml_get_f32_nd reads there.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine import ggml as eng
from engine import ggml_cpu
from engine.compute.kernels.common import view4
from engine.compute.kernels.views import flat_rows
from engine.core.errors import GGMLAssertionError, TensorBoundsError
from engine.core.tensor_data import data_bytes, strided_view, to_numpy

MEM = 1 << 14  # the context's pool: a holds 64 floats 0..63, then whatever the case makes
RED_TEAM = "g.ggml_view_4d(ctx, a, 4, 5, 1, 1, 2**62, 16, 16, 0)"

# (id, the expression making the view, from g, ctx and a): the red team's view and its kin
CASES = [
    ("red_team", RED_TEAM),
    ("negative_offset", "g.ggml_view_1d(ctx, a, 4, OFFSET(-8))"),
    ("empty_at_the_data_end", "g.ggml_view_1d(ctx, a, 0, 4 * 64)"),
    ("empty_past_the_pool", f"g.ggml_view_1d(ctx, a, 0, {2 * MEM})"),
    ("ne_2_62", "g.ggml_view_1d(ctx, a, 2**62, 0)"),
    ("ne_2_62_rows_of_nb_0", "g.ggml_view_2d(ctx, a, 1, 2**62, 0, 0)"),
    ("nb_0", "g.ggml_view_4d(ctx, a, 4, 5, 1, 1, 0, 0, 0, 0)"),
    ("span_ends_at_the_end", "g.ggml_view_2d(ctx, a, 4, 16, 16, 0)"),
    ("span_ends_one_byte_past", "g.ggml_view_2d(ctx, a, 4, 16, 16, 4)"),
    ("rows_leave_the_pool", f"g.ggml_view_2d(ctx, a, 4, 2, {MEM}, 0)"),
    ("huge_strides_where_ne_is_1", "g.ggml_view_4d(ctx, a, 4, 1, 1, 1, 2**63 + 4, 2**64 - 1, 2**62, 8)"),
    ("view_of_the_red_team_view", f"g.ggml_view_1d(ctx, {RED_TEAM}, 4, 8)"),
    ("permuted_red_team_view", f"g.ggml_permute(ctx, {RED_TEAM}, 1, 0, 2, 3)"),
    ("transposed_red_team_view", f"g.ggml_transpose(ctx, {RED_TEAM})"),
    ("transposed_nb_0", "g.ggml_transpose(ctx, g.ggml_view_4d(ctx, a, 4, 5, 1, 1, 0, 0, 0, 0))"),
]

REAL = textwrap.dedent("""
    import json, math, sys
    import ggml as g
    OFFSET = lambda x: x % 2**64  # a size_t argument, as C converts it
    ctx = g.ggml_init(g.ggml_init_params(mem_size={mem}, mem_buffer=None, no_alloc=False))
    a = g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 64)
    for i in range(64):
        g.ggml_set_f32_1d(a, i, float(i))
    print("READY", flush=True)
    v = {expr}
    c = v.contents
    ne, nb = list(c.ne), list(c.nb)
    base = g.ggml_get_mem_buffer(ctx)
    start = c.data - base  # where the view's data lies in the pool
    out = dict(ne=ne, nb=nb, nbytes=g.ggml_nbytes(v), data=c.data - a.contents.data, start=start)
    empty = min(ne) <= 0
    end = start + sum((n - 1) * s for n, s in zip(ne, nb)) + 4
    if not empty and 0 <= start and end <= {mem} and math.prod(ne) <= 4096:
        out["values"] = [g.ggml_get_f32_nd(v, i0, i1, i2, i3) for i3 in range(ne[3])
                         for i2 in range(ne[2]) for i1 in range(ne[1]) for i0 in range(ne[0])]
    print("RESULT " + json.dumps(out))
""")


def real_ggml(expr: str) -> dict | str:
    """The view real ggml makes: its struct and, when all its bytes lie in the pool, its values;
    or the GGML_ASSERT line it aborted with."""
    proc = subprocess.run([sys.executable, "-c", REAL.format(mem=MEM, expr=expr)],
                          capture_output=True, text=True, timeout=60)
    assert "READY" in proc.stdout, proc.stderr
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    failed = [line for line in proc.stderr.splitlines() if "GGML_ASSERT" in line]
    assert proc.returncode != 0 and failed, proc.stderr[-2000:]
    return failed[0]


def engine_pool():
    ctx = eng.ggml_init(eng.ggml_init_params(mem_size=MEM, mem_buffer=None, no_alloc=False))
    a = eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_F32, 64)
    eng.set_data(a, np.arange(64, dtype=np.float32))
    return ctx, a


def engine_view(expr: str):
    ctx, a = engine_pool()
    return eval(expr, {"g": eng, "ctx": ctx, "a": a, "OFFSET": int})


@pytest.mark.parametrize("expr", [e for _, e in CASES], ids=[c for c, _ in CASES])
def test_the_engine_accepts_and_reads_a_view_as_real_ggml_does(expr):
    real = real_ggml(expr)
    ctx, a = engine_pool()
    scope = {"g": eng, "ctx": ctx, "a": a, "OFFSET": int}
    if isinstance(real, str):  # ggml asserted: the engine raises the same condition
        with pytest.raises(GGMLAssertionError) as err:
            eval(expr, scope)
        assert f"GGML_ASSERT({err.value.condition}) failed" in real
        return
    v = eval(expr, scope)
    assert [int(x) for x in v.ne] == real["ne"] and [int(x) for x in v.nb] == real["nb"]
    assert eng.ggml_nbytes(v) % 2**64 == real["nbytes"]  # (ggml's size_t wraps; ours is exact)
    assert (v.data - a.data) % 2**64 == real["data"] % 2**64
    readers = (to_numpy, view4, flat_rows, data_bytes)
    ne, nb, start = real["ne"], real["nb"], real["start"]
    end = start + sum((n - 1) * s for n, s in zip(ne, nb)) + 4
    if min(ne) > 0 and not (0 <= start and end <= MEM):  # bytes outside the pool: refused
        assert "values" not in real
        for read in readers:
            with pytest.raises(TensorBoundsError, match=r"mem_buffer \+ mem_size does not hold"):
                read(v)
    elif min(ne) > 0 and math.prod(ne) * 4 >= 2**63:  # inside, more elements than numpy counts
        with pytest.raises(TensorBoundsError, match=r"INT64_MAX does not hold"):
            view4(v)
    elif min(ne) > 0:  # every byte in the pool: read, the values ggml reads
        assert view4(v).reshape(-1).tolist() == real["values"]
        assert to_numpy(v).reshape(-1).tolist() == real["values"]
    elif 0 <= real["start"] <= MEM:  # empty, inside: nothing to read
        assert to_numpy(v).size == 0 and view4(v).size == 0
    else:  # empty, its data outside the pool
        with pytest.raises(TensorBoundsError, match="tensor->data inside a live buffer"):
            to_numpy(v)


def test_the_red_team_view_is_refused_naming_the_rule_and_the_numbers():
    v = engine_view(RED_TEAM)
    with pytest.raises(TensorBoundsError) as err:
        to_numpy(v)
    e = err.value
    assert e.rule == "data + ggml_nbytes(tensor) <= mem_buffer + mem_size" and e.function == "to_numpy"
    assert "nb [4, 4611686018427387904, 16, 16]" in str(e)
    assert f"reaches bytes [{v.data - v.ctx.base}, {v.data - v.ctx.base + 4 * 2**62 + 16})" in str(e)
    assert f"of a {MEM}-byte buffer" in str(e)
    for read in (lambda: eng.ggml_get_f32_1d(v, 5), lambda: eng.ggml_set_f32(v, 1.0),
                 lambda: ggml_cpu.ggml_get_f32_nd(v, 0, 1, 0, 0), lambda: eng.set_data(v, np.zeros((5, 4)))):
        with pytest.raises(TensorBoundsError):
            read()


def test_a_graph_over_the_red_team_view_stops_with_the_rule():
    ctx = eng.ggml_init(eng.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    a = eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_F32, 64)
    v = eng.ggml_view_4d(ctx, a, 4, 5, 1, 1, 2**62, 16, 16, 0)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, eng.ggml_add(ctx, v, v))
    with pytest.raises(TensorBoundsError, match="view4"):
        eng.ggml_graph_compute_with_ctx(ctx, gf, 1)


def test_data_outside_every_pool_and_empty_views():
    ctx, a = engine_pool()
    v = eng.ggml_view_1d(ctx, a, 0, 0)
    v.data = ctx.base + MEM  # an empty view may point at the pool's end (llama.cpp's 0-row views)
    assert to_numpy(v).shape == (0,)
    v.ne[0] = 1
    with pytest.raises(TensorBoundsError, match=r"reaches bytes \[16384, 16388\)"):
        to_numpy(v)
    v.data = ctx.base + 10 * MEM
    with pytest.raises(TensorBoundsError, match="tensor->data inside a live buffer"):
        to_numpy(v)
    w = eng.ggml_view_1d(ctx, a, 4, 0)
    w.ne[1] = -3  # a struct written by hand
    with pytest.raises(TensorBoundsError, match=r"ne\[i\] >= 0"):
        view4(w)


def test_more_elements_than_numpy_can_count_are_refused():
    v = engine_view("g.ggml_view_4d(ctx, a, 1, 1, 1, 1, 0, 0, 0, 0)")
    v.ne[:] = [2**31, 2**31, 2**31, 1]
    v.nb[:] = [0, 0, 0, 0]  # every element the same 4 bytes: in the pool, but 2**93 of them
    with pytest.raises(TensorBoundsError, match="INT64_MAX"):
        view4(v)


def _corners(offset: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """The lowest byte and one past the highest a view reaches, from its extreme elements."""
    ends = [offset + sum(i * s for i, s in zip(idx, strides))
            for idx in itertools.product(*[(0, n - 1) for n in shape])]
    return min(ends), max(ends) + itemsize


def test_strided_view_refuses_exactly_what_leaves_its_buffer():
    """Random views, many hostile: the engine's answer against the extreme elements' addresses,
    and numpy's own bounds of every view it made."""
    rng = random.Random(48)
    buffer = np.arange(4096, dtype=np.uint32).view(np.uint8)
    numbers = [0, 1, 2, 3, 4, 7, 64, 1000, 4096, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
    made = refused = 0
    for _ in range(3000):
        ndim = rng.randint(1, 4)
        shape = [rng.choice([0, 1, 1, 2, 3, 5, 2**62]) for _ in range(ndim)]
        strides = [rng.choice(numbers) * rng.choice([1, 1, 1, -1]) for _ in range(ndim)]
        offset = rng.choice([0, 4, 100, buffer.size - 4, buffer.size, buffer.size + 1, -4])
        itemsize = rng.choice([1, 4])
        if 0 in shape:
            inside = 0 <= offset <= buffer.size
        else:
            low, high = _corners(offset, shape, strides, itemsize)
            inside = low >= 0 and high <= buffer.size
        inside = inside and math.prod(n for n in shape if n) * itemsize < 2**63
        try:
            view = strided_view(buffer, offset, shape, strides, f"u{itemsize}", "test")
        except TensorBoundsError:
            assert not inside, (shape, strides, offset)
            refused += 1
            continue
        assert inside, (shape, strides, offset)
        made += 1
        if view.size:
            low, high = np.lib.array_utils.byte_bounds(view)
            base = buffer.__array_interface__["data"][0]
            assert base <= low and high <= base + buffer.size
    assert made > 300 and refused > 300  # both kinds were tried
