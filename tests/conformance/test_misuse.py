"""Misuse: where real ggml aborts with GGML_ASSERT, the engine raises naming the same condition.

Real ggml ends the process, so each case runs it in a child process and reads the condition from
its stderr; the engine must raise GGMLAssertionError (or GGMLPoolError) with that text, and leave
the pool as it was.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from engine import ggml as eng
from engine.core.errors import GGMLAssertionError, GGMLPoolError

F32, F16 = int(eng.GGML_TYPE_F32), int(eng.GGML_TYPE_F16)

# (id, program body using `g`, `ctx`, and F32/F16) — run against both engines
CASES = [
    ("reshape_non_contiguous",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\n"
     "g.ggml_reshape_1d(ctx, g.ggml_transpose(ctx, a), 12)"),
    ("reshape_wrong_count",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\n"
     "g.ggml_reshape_2d(ctx, a, 5, 2)"),
    ("view_out_of_bounds",
     "a = g.ggml_new_tensor_1d(ctx, F32, 8)\n"
     "g.ggml_view_1d(ctx, a, 4, 20)"),
    ("permute_repeated_axis",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\n"
     "g.ggml_permute(ctx, a, 0, 0, 2, 3)"),
    ("permute_axis_range",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\n"
     "g.ggml_permute(ctx, a, 0, 1, 2, 4)"),
    ("cpy_count_mismatch",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\n"
     "b = g.ggml_new_tensor_1d(ctx, F16, 11)\n"
     "g.ggml_cpy(ctx, a, b)"),
    ("cont_4d_count",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\n"
     "g.ggml_cont_4d(ctx, a, 4, 4, 1, 1)"),
    ("pool_exhausted",
     "g.ggml_new_tensor_1d(ctx, F32, 100)\n"
     "g.ggml_new_tensor_2d(ctx, F32, 64, 64)"),
]

REAL_RUNNER = textwrap.dedent("""
    import ggml as g
    F32, F16 = g.GGML_TYPE_F32, g.GGML_TYPE_F16
    ctx = g.ggml_init(g.ggml_init_params(mem_size=4096, mem_buffer=None, no_alloc=False))
    print("READY", flush=True)
    {body}
    print("NO ABORT")
""")


def real_ggml_failure(body: str) -> str:
    """Run body on real ggml in a child process; return what it printed when it aborted."""
    code = REAL_RUNNER.format(body=body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "READY" in proc.stdout, proc.stderr  # the child got as far as the program
    assert proc.returncode != 0 and "NO ABORT" not in proc.stdout, "real ggml accepted it"
    assert "GGML_ASSERT" in proc.stderr, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("case_id,body", CASES, ids=[c[0] for c in CASES])
def test_engine_raises_what_ggml_asserts(case_id, body):
    stderr = real_ggml_failure(body)

    ctx = eng.ggml_init(eng.ggml_init_params(4096))
    g = eng
    with pytest.raises((GGMLAssertionError, GGMLPoolError)) as err:
        exec(body, {"g": g, "ctx": ctx, "F32": F32, "F16": F16})
    if isinstance(err.value, GGMLPoolError):
        # ggml logs "needed N, available M" and then fails GGML_ASSERT(obj_new)
        m = re.search(r"needed (\d+), available (\d+)", stderr)
        assert m, stderr
        assert (err.value.needed, err.value.available) == (int(m[1]), int(m[2]))
    else:
        assert f"GGML_ASSERT({err.value.condition}) failed" in stderr, stderr


def test_failed_call_leaves_pool_untouched():
    ctx = eng.ggml_init(eng.ggml_init_params(4096))
    a = eng.ggml_new_tensor_2d(ctx, F32, 4, 3)
    before, used = ctx.pool.tobytes(), eng.ggml_used_mem(ctx)
    for bad in (lambda: eng.ggml_reshape_2d(ctx, a, 5, 2),
                lambda: eng.ggml_view_1d(ctx, a, 4, 40),
                lambda: eng.ggml_new_tensor_2d(ctx, F32, 64, 64),
                lambda: eng.ggml_permute(ctx, a, 1, 1, 2, 3)):
        with pytest.raises((GGMLAssertionError, GGMLPoolError)):
            bad()
        assert ctx.pool.tobytes() == before and eng.ggml_used_mem(ctx) == used


def test_errors_name_the_rule():
    ctx = eng.ggml_init(eng.ggml_init_params(4096))
    with pytest.raises(GGMLAssertionError, match=r"ggml_reshape_2d: GGML_ASSERT\(ggml_nelements"):
        eng.ggml_reshape_2d(ctx, eng.ggml_new_tensor_1d(ctx, F32, 6), 4, 2)
    with pytest.raises(GGMLAssertionError, match="block size 32"):
        eng.ggml_new_tensor_1d(ctx, eng.GGML_TYPE_Q4_0, 33)
    with pytest.raises(GGMLAssertionError, match="was removed"):
        eng.ggml_new_tensor_1d(ctx, 4, 32)
    with pytest.raises(GGMLPoolError, match=r"needed \d+, available 4096"):
        eng.ggml_new_tensor_1d(ctx, F32, 2000)
