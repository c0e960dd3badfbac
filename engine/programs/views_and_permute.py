"""views-and-permute: views share their parent's bytes; only ne, nb and the data pointer change.

A [4, 3, 2] tensor is permuted (1, 0, 2, 3) and transposed (both views: no bytes move), a fused
QKV tensor is split into three ggml_view_2d views at byte offsets, ggml_cont makes a contiguous copy,
and ggml_cpy writes into a view of another tensor (watch its automatic name).
"""

import numpy as np

from engine.ggml import *  # noqa: F403


def run(n_threads: int = 1) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=64 * 1024, mem_buffer=None, no_alloc=False))

    x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 3, 2)  # nb = [4, 16, 48, 96]
    ggml_set_name(x, "x")
    set_data(x, np.arange(24, dtype=np.float32).reshape(2, 3, 4))

    p = ggml_permute(ctx, x, 1, 0, 2, 3)  # dims 0 and 1 swap: ne = [3, 4, 2], nb = [16, 4, 48]
    t = ggml_transpose(ctx, x)  # the same strides, its own op and name

    d, n_tokens = 4, 3
    qkv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3 * d, n_tokens)  # one fused projection output
    ggml_set_name(qkv, "qkv")
    set_data(qkv, np.arange(3 * d * n_tokens, dtype=np.float32).reshape(n_tokens, 3 * d))
    row = qkv.nb[1]  # bytes per token
    q = ggml_view_2d(ctx, qkv, d, n_tokens, row, 0 * d * 4)
    k = ggml_view_2d(ctx, qkv, d, n_tokens, row, 1 * d * 4)
    v = ggml_view_2d(ctx, qkv, d, n_tokens, row, 2 * d * 4)
    ggml_set_name(q, "Q")
    ggml_set_name(k, "K")
    ggml_set_name(v, "V")

    pc = ggml_cont(ctx, p)  # a new tensor: the permuted elements, now packed
    kt = ggml_cont(ctx, ggml_transpose(ctx, k))

    dst = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, d, n_tokens)
    ggml_set_name(dst, "v_half")
    cp = ggml_cpy(ctx, v, dst)  # named "v_half (copy of V)": a view of dst with op CPY

    gf = ggml_new_graph_custom(ctx, 32, False)
    ggml_build_forward_expand(gf, pc)
    ggml_build_forward_expand(gf, kt)
    ggml_build_forward_expand(gf, cp)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"x_permuted_cont": pc, "K_transposed": kt, "transposed": t, "v_half": dst}
