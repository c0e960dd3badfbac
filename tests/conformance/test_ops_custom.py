"""User ops (engine/ops/custom.py) against real ggml: the same Python function behind
ggml_map_custom1/2/3, ggml_custom_4d and ggml_custom_inplace on both engines (a ctypes callback
for real ggml), called once per thread with the same ith and nth, giving the same bytes."""

from __future__ import annotations

import ctypes
import threading

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.core.errors import GGMLAssertionError

F32 = 0
ROWS, COLS = 7, 5


def rows_of(api, t):
    """A tensor's F32 data as a (rows, cols) numpy view, on either engine."""
    if api is eng:
        return eng.to_numpy(t).reshape(-1, int(t.ne[0]))
    c = t.contents
    n = c.ne[0] * c.ne[1] * c.ne[2] * c.ne[3]
    buf = (ctypes.c_float * n).from_address(c.data)
    return np.frombuffer(buf, np.float32).reshape(-1, c.ne[0])


class Calls:
    """The (ith, nth) pairs a user function was called with, from any thread."""

    def __init__(self) -> None:
        self.seen, self.lock = [], threading.Lock()

    def add(self, ith, nth) -> None:
        with self.lock:
            self.seen.append((ith, nth))


def user_functions(api, calls: Calls):
    """One body per custom arity: each thread fills the rows ith, ith + nth, ... of dst."""
    def f1(dst, a, ith, nth, userdata):
        calls.add(ith, nth)
        d, x = rows_of(api, dst), rows_of(api, a)
        d[ith::nth] = x[ith::nth] * np.float32(2) + np.float32(ith)

    def f2(dst, a, b, ith, nth, userdata):
        calls.add(ith, nth)
        d, x, y = rows_of(api, dst), rows_of(api, a), rows_of(api, b)
        d[ith::nth] = x[ith::nth] * y[ith::nth]

    def f3(dst, a, b, c, ith, nth, userdata):
        calls.add(ith, nth)
        d, x, y, z = rows_of(api, dst), rows_of(api, a), rows_of(api, b), rows_of(api, c)
        d[ith::nth] = x[ith::nth] + y[ith::nth] * z[ith::nth]

    def f4(dst, ith, nth, userdata):
        calls.add(ith, nth)
        d = rows_of(api, dst)
        d[ith::nth] = np.arange(d.shape[1], dtype=np.float32) + np.float32(100 * ith)

    if api is eng:
        return f1, f2, f3, f4
    # the C callbacks receive tensor pointers; userdata is unused
    wrap = [(real.ggml_custom1_op_t, f1), (real.ggml_custom2_op_t, f2), (real.ggml_custom3_op_t, f3),
            (real.ggml_custom_op_t, f4)]
    return tuple(t(f) for t, f in wrap)


def run(api, case: str, n_tasks: int, n_threads: int):
    calls = Calls()
    f1, f2, f3, f4 = user_functions(api, calls)
    if api is eng:
        ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    else:
        ctx = real.ggml_init(real.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    rng = np.random.default_rng(1)
    ts = []
    for _ in range(3):
        t = api.ggml_new_tensor_2d(ctx, F32, COLS, ROWS)
        rows_of(api, t)[:] = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        ts.append(t)
    a, b, c = ts
    if case == "custom1":
        out = api.ggml_map_custom1(ctx, a, f1, n_tasks, None)
    elif case == "custom1_inplace":
        out = api.ggml_map_custom1_inplace(ctx, a, f1, n_tasks, None)
    elif case == "custom2":
        out = api.ggml_map_custom2(ctx, a, b, f2, n_tasks, None)
    elif case == "custom3":
        out = api.ggml_map_custom3(ctx, a, b, c, f3, n_tasks, None)
    elif case == "custom3_inplace":
        out = api.ggml_map_custom3_inplace(ctx, a, b, c, f3, n_tasks, None)
    elif case == "custom_4d":
        args = [a, b] if api is eng else (ctypes.POINTER(real.ggml_tensor) * 2)(a, b)
        out = api.ggml_custom_4d(ctx, F32, COLS, ROWS, 1, 1, args, 2, f4, n_tasks, None)
    else:
        args = [b] if api is eng else (ctypes.POINTER(real.ggml_tensor) * 1)(b)
        out = api.ggml_custom_inplace(ctx, a, args, 1, f4, n_tasks, None)
    gf = api.ggml_new_graph(ctx)
    api.ggml_build_forward_expand(gf, out)
    assert api.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
    if api is eng:
        fields = dict(ne=list(out.ne), nb=list(out.nb), op=int(out.op), type=int(out.type), name=out.name,
                      n_tasks=int(out.op_params[2]), srcs=sum(s is not None for s in out.src),
                      view=out.view_src is not None, used=eng.ggml_used_mem(ctx))
    else:
        o = out.contents
        fields = dict(ne=list(o.ne), nb=list(o.nb), op=o.op, type=o.type, name=o.name.decode(),
                      n_tasks=o.op_params[2], srcs=sum(1 for s in o.src if s), view=bool(o.view_src),
                      used=real.ggml_used_mem(ctx))
    values = rows_of(api, out).copy()
    if api is not eng:
        real.ggml_free(ctx)
    return fields, values, sorted(calls.seen)


CASES = ["custom1", "custom1_inplace", "custom2", "custom3", "custom3_inplace", "custom_4d", "custom_inplace"]


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("n_tasks", [-1, 1, 2, 8])
@pytest.mark.parametrize("case", CASES)
def test_custom_ops_match_ggml(case, n_tasks, n_threads):
    ours = run(eng, case, n_tasks, n_threads)
    theirs = run(real, case, n_tasks, n_threads)
    assert ours[0] == theirs[0]
    np.testing.assert_array_equal(ours[1], theirs[1])
    assert ours[2] == theirs[2]  # the same threads called, each with the same ith and nth
    n = n_threads if n_tasks == -1 else min(n_tasks, n_threads)
    assert ours[2] == [(i, n) for i in range(n)]


def test_custom_op_asserts():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 16))
    a = eng.ggml_new_tensor_1d(ctx, F32, 4)
    with pytest.raises(GGMLAssertionError, match="n_tasks == GGML_N_TASKS_MAX"):
        eng.ggml_map_custom1(ctx, a, lambda *args: None, 0, None)
    with pytest.raises(GGMLAssertionError, match=r"n_args < GGML_MAX_SRC - 1"):
        eng.ggml_custom_inplace(ctx, a, [a] * 9, 9, lambda *args: None, 1, None)
    with pytest.raises(GGMLAssertionError, match=r"n_args < GGML_MAX_SRC"):
        eng.ggml_custom_4d(ctx, F32, 4, 1, 1, 1, [a] * 10, 10, lambda *args: None, 1, None)


def test_userdata_reaches_the_function():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    a = eng.ggml_new_tensor_1d(ctx, F32, 4)
    eng.data_bytes(a)[:] = 0
    box = {"scale": 3.0}

    def scale(dst, x, ith, nth, userdata):
        if ith == 0:
            eng.to_numpy(dst)[:] = eng.to_numpy(x) + np.float32(userdata["scale"])

    out = eng.ggml_map_custom1(ctx, a, scale, 1, box)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    eng.ggml_graph_compute_with_ctx(ctx, gf, 2)
    assert eng.to_numpy(out).tolist() == [3.0] * 4
