"""The arena, tensors and views against real ggml: after every call, the same pool bytes.

Each scenario runs on the engine and on ggml-python; after each call both pools are compared object
by object (header, struct and data bytes, pointers made relative to their pool) and as a whole.
"""

from __future__ import annotations

import pytest

from engine.core.types import GGMLType, TYPE_TRAITS
from tests.support.pools import run_both

MB = 1 << 20
LIVE_TYPES = [tr for tr in TYPE_TRAITS if not tr.removed]


def assert_same_run(program) -> None:
    ours, real = run_both(program)
    assert ours.calls == real.calls
    assert len(ours.snapshots) == len(real.snapshots)
    for step, (a, b) in enumerate(zip(ours.snapshots, real.snapshots)):
        where = f"after call {step} ({a['call']})"
        assert [p["used_mem"] for p in a["pools"]] == [p["used_mem"] for p in b["pools"]], where
        for pa, pb in zip(a["pools"], b["pools"]):
            assert len(pa["objects"]) == len(pb["objects"]), where
            for oa, ob in zip(pa["objects"], pb["objects"]):
                fields_a = {k: v for k, v in oa.items() if k != "bytes"}
                fields_b = {k: v for k, v in ob.items() if k != "bytes"}
                assert fields_a == fields_b, where
                assert oa.get("bytes") == ob.get("bytes"), f"{where}: object bytes at {oa['header']}"


# --- every type x 1-d ... 4-d ----------------------------------------------------------------

SHAPES = {1: (1,), 2: (3, 2), 3: (2, 3, 2), 4: (1, 2, 3, 2)}


@pytest.mark.parametrize("n_dims", [1, 2, 3, 4])
@pytest.mark.parametrize("tr", LIVE_TYPES, ids=lambda tr: tr.type_name)
def test_every_type_and_rank(tr, n_dims):
    ne = [tr.blck_size * 2] + [n + 1 for n in SHAPES[n_dims][1:]]

    def program(g):
        ctx = g.init(1 * MB)
        fn = getattr(g, f"ggml_new_tensor_{n_dims}d")
        t = fn(ctx, int(tr.type), *ne)
        g.ggml_set_name(t, f"t_{tr.type_name}")
        g.ggml_dup_tensor(ctx, t)
        g.ggml_view_tensor(ctx, t)
        fn(ctx, int(tr.type), *([tr.blck_size] + [1] * (n_dims - 1)))
    assert_same_run(program)


# --- views, shapes and names -----------------------------------------------------------------

F32, F16, Q4_0, Q8_0, Q4_K = (int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.Q4_0),
                              int(GGMLType.Q8_0), int(GGMLType.Q4_K))


def simple_ctx_tensors(g):
    ctx = g.init(84424)
    a = g.ggml_new_tensor_2d(ctx, F32, 2, 4)
    b = g.ggml_new_tensor_2d(ctx, F32, 2, 3)
    return ctx, a, b


def sc_simple_ctx(g):
    simple_ctx_tensors(g)


def sc_view_1d(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_1d(ctx, F32, 64)
    g.ggml_set_name(a, "a")
    g.ggml_view_1d(ctx, a, 16, 0)
    g.ggml_view_1d(ctx, a, 16, 4 * 48)
    g.ggml_view_1d(ctx, a, 3, 4 * 7)


def sc_view_2d_qkv(g):
    # a fused QKV projection output [3*d, n] split into three 2-d views
    ctx = g.init(MB)
    d, n = 8, 5
    qkv = g.ggml_new_tensor_2d(ctx, F32, 3 * d, n)
    g.ggml_set_name(qkv, "qkv")
    nb1 = 4 * 3 * d
    for i in range(3):
        v = g.ggml_view_2d(ctx, qkv, d, n, nb1, 4 * d * i)
        g.ggml_set_name(v, "QKV"[i] + "cur")


def sc_view_3d_4d(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_4d(ctx, F16, 8, 4, 3, 2)
    g.ggml_set_name(a, "a")
    g.ggml_view_3d(ctx, a, 4, 4, 3, 16, 64, 8)
    g.ggml_view_4d(ctx, a, 8, 2, 3, 2, 32, 64, 192, 32)
    g.ggml_view_4d(ctx, a, 2, 2, 2, 2, 16, 64, 192, 0)


def sc_view_of_view(g):
    ctx = g.init(MB)
    base = g.ggml_new_tensor_1d(ctx, F32, 32)
    g.ggml_set_name(base, "t")
    v1 = g.ggml_view_1d(ctx, base, 16, 4)
    v2 = g.ggml_view_1d(ctx, v1, 8, 8)
    v3 = g.ggml_view_2d(ctx, v2, 2, 2, 8, 4)
    g.ggml_view_tensor(ctx, v3)
    g.ggml_permute(ctx, v3, 1, 0, 2, 3)


def sc_permute_all(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_4d(ctx, F32, 4, 3, 2, 5)
    g.ggml_set_name(a, "a")
    for axes in [(0, 1, 2, 3), (1, 0, 2, 3), (2, 0, 1, 3), (0, 2, 1, 3), (3, 2, 1, 0), (1, 2, 3, 0)]:
        g.ggml_permute(ctx, a, *axes)


def sc_transpose_cont(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)
    g.ggml_set_name(a, "a")
    t = g.ggml_transpose(ctx, a)
    c = g.ggml_cont(ctx, t)
    g.ggml_transpose(ctx, c)
    g.ggml_cont_2d(ctx, t, 6, 2)
    g.ggml_cont_1d(ctx, a, 12)
    g.ggml_cont_3d(ctx, a, 2, 3, 2)
    g.ggml_cont_4d(ctx, a, 1, 2, 3, 2)


def sc_reshape(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_3d(ctx, F32, 4, 3, 2)
    g.ggml_set_name(a, "x")
    b = g.ggml_new_tensor_2d(ctx, F32, 6, 4)
    g.ggml_reshape(ctx, a, b)
    g.ggml_reshape(ctx, a, g.ggml_transpose(ctx, b))
    g.ggml_reshape_1d(ctx, a, 24)
    r2 = g.ggml_reshape_2d(ctx, a, 8, 3)
    g.ggml_reshape_3d(ctx, r2, 2, 4, 3)
    g.ggml_reshape_4d(ctx, a, 2, 2, 3, 2)


def sc_cpy_names(g):
    ctx = g.init(MB)
    t = g.ggml_new_tensor_2d(ctx, F32, 4, 2)
    g.ggml_set_name(t, "t")
    dst = g.ggml_new_tensor_2d(ctx, F16, 8, 1)
    g.ggml_cpy(ctx, t, dst)  # unnamed destination: "t (copy)"
    g.ggml_set_name(dst, "dst")
    g.ggml_cpy(ctx, t, dst)  # "dst (copy of t)"
    g.ggml_dup(ctx, t)
    g.ggml_dup_inplace(ctx, t)
    g.ggml_cast(ctx, t, F16)


def sc_kv_cache(g):
    # llama.cpp's KV cache: the new K rows are copied into a view of the cache
    ctx = g.init(MB)
    n_embd, n_ctx, n_tokens, n_past = 8, 16, 3, 5
    cache = g.ggml_new_tensor_1d(ctx, F16, n_embd * n_ctx)
    g.ggml_set_name(cache, "cache_k_l0")
    k = g.ggml_new_tensor_2d(ctx, F32, n_embd, n_tokens)
    g.ggml_set_name(k, "Kcur-0")
    view = g.ggml_view_1d(ctx, cache, n_embd * n_tokens, 2 * n_embd * n_past)
    g.ggml_cpy(ctx, k, view)


def sc_long_names(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_1d(ctx, F32, 4)
    g.ggml_set_name(a, "n" * 70)  # truncated to 63 characters
    v = g.ggml_view_tensor(ctx, a)
    g.ggml_set_name(v, "short")  # bytes after the terminator stay as they were
    g.ggml_format_name(a, "%s-%d", "blk", 7)
    p = g.ggml_permute(ctx, v, 1, 0, 2, 3)
    g.ggml_transpose(ctx, p)
    g.ggml_get_name(p)


def sc_quantized_views(g):
    ctx = g.init(MB)
    q = g.ggml_new_tensor_2d(ctx, Q4_0, 32, 6)  # nb = [18, 18, 108, 108]
    g.ggml_set_name(q, "q")
    g.ggml_view_2d(ctx, q, 32, 3, 18 * 2, 18)
    g.ggml_reshape_3d(ctx, q, 64, 3, 1)
    g.ggml_transpose(ctx, q)
    k = g.ggml_new_tensor_3d(ctx, Q4_K, 512, 3, 2)
    g.ggml_view_1d(ctx, k, 256, 144)
    g.ggml_cpy(ctx, g.ggml_new_tensor_2d(ctx, F32, 32, 6), q)


def sc_no_alloc(g):
    ctx = g.init(64 * 1024, no_alloc=True)
    a = g.ggml_new_tensor_2d(ctx, F32, 100, 100)
    g.ggml_set_name(a, "weights")
    g.ggml_view_2d(ctx, a, 10, 10, 400, 40)
    g.ggml_permute(ctx, a, 1, 0, 2, 3)
    g.ggml_cont(ctx, a)
    g.ggml_set_no_alloc(ctx, False)
    g.ggml_new_tensor_1d(ctx, F32, 8)
    g.ggml_set_no_alloc(ctx, True)
    g.ggml_new_tensor_1d(ctx, Q8_0, 64)


def sc_caller_buffer(g):
    ctx = g.init(4000, buffer=True)  # a caller's buffer is used as is, not padded
    a = g.ggml_new_tensor_1d(ctx, F32, 5)
    g.ggml_view_1d(ctx, a, 2, 8)
    g.ggml_new_tensor_3d(ctx, F16, 3, 3, 3)


def sc_two_contexts(g):
    # tensors may view tensors of another context (ggml's MNIST example has two)
    weights = g.init(MB)
    w = g.ggml_new_tensor_2d(weights, F32, 8, 4)
    g.ggml_set_name(w, "fc1.weight")
    compute = g.init(MB, no_alloc=False)
    g.ggml_view_2d(compute, w, 4, 4, 32, 16)
    g.ggml_transpose(compute, w)
    g.ggml_cpy(compute, g.ggml_new_tensor_2d(compute, F32, 8, 4), w)


def sc_new_buffer_and_reset(g):
    ctx = g.init(MB)
    g.ggml_new_tensor_1d(ctx, F32, 3)
    g.ggml_new_buffer(ctx, 100)
    g.ggml_new_buffer(ctx, 0)
    g.ggml_new_tensor_1d(ctx, F32, 1)
    g.ggml_reset(ctx)
    g.ggml_new_tensor_2d(ctx, F16, 4, 4)


def sc_zero_sized(g):
    ctx = g.init(MB)
    e = g.ggml_new_tensor_2d(ctx, F32, 0, 4)  # allocates no data: data stays NULL
    g.ggml_new_tensor_1d(ctx, F32, 0)
    g.ggml_view_tensor(ctx, e)
    g.ggml_new_tensor_1d(ctx, F32, 2)


def sc_inplace_chain(g):
    ctx = g.init(MB)
    a = g.ggml_new_tensor_3d(ctx, F32, 6, 4, 2)
    g.ggml_set_name(a, "attn")
    p = g.ggml_permute(ctx, a, 0, 2, 1, 3)
    c = g.ggml_cont(ctx, p)
    r = g.ggml_reshape_2d(ctx, c, 12, 4)
    v = g.ggml_view_2d(ctx, r, 6, 4, 48, 24)
    g.ggml_cpy(ctx, v, g.ggml_new_tensor_2d(ctx, F16, 6, 4))


VIEW_SCENARIOS = [sc_simple_ctx, sc_view_1d, sc_view_2d_qkv, sc_view_3d_4d, sc_view_of_view,
                  sc_permute_all, sc_transpose_cont, sc_reshape, sc_cpy_names, sc_kv_cache,
                  sc_long_names, sc_quantized_views, sc_no_alloc, sc_caller_buffer,
                  sc_two_contexts, sc_new_buffer_and_reset, sc_zero_sized, sc_inplace_chain]


@pytest.mark.parametrize("program", VIEW_SCENARIOS, ids=lambda f: f.__name__[3:])
def test_views_and_shapes(program):
    assert_same_run(program)


def test_scenario_table_is_large_enough():
    assert len(LIVE_TYPES) * 4 + len(VIEW_SCENARIOS) >= 60


def test_simple_ctx_layout_matches_reference_table():
    """The documented simple-ctx map, checked on real ggml and on the engine alike."""
    ours, real = run_both(sc_simple_ctx)
    for api in (ours, real):
        objs = api.snapshots[-1]["pools"][0]["objects"]
        assert [(o["header"], o["offs"], o["size"]) for o in objs] == [(0, 32, 368), (400, 432, 368)]
        assert api.pools[0][1] == 84432  # ggml_init padded 84424 to 16
