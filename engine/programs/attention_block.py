"""attention-block: one LLaMA-style transformer block, named as llama.cpp names its tensors.

RMS norm, the Q/K/V projections, rope on Q and K, the new K and V rows copied into a KV cache
through views (watch "cache_k_l0 (view) (copy of Kcur-0)"), the masked softmax over KQ, the
weighted sum of V, the heads merged back with permute and cont, the output projection, the residual,
and a SwiGLU feed-forward.
"""

import numpy as np

from engine.ggml import *  # noqa: F403

n_embd, n_head, n_ff = 16, 2, 32
head_dim = n_embd // n_head
n_ctx, n_past, n_tokens = 8, 2, 3  # the cache holds 2 earlier tokens; 3 new ones come in
eps = 1e-5


def run(n_threads: int = 1) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=8 * 1024 * 1024, mem_buffer=None, no_alloc=False))
    rng = np.random.default_rng(7)

    def weight(name, *ne):
        t = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), list(ne))
        ggml_set_name(t, name)
        set_data(t, rng.normal(0, 0.25, tuple(reversed(ne))).astype(np.float32))
        return t

    attn_norm = weight("blk.0.attn_norm.weight", n_embd)
    wq, wk, wv = (weight(f"blk.0.attn_{x}.weight", n_embd, n_embd) for x in "qkv")
    wo = weight("blk.0.attn_output.weight", n_embd, n_embd)
    ffn_norm = weight("blk.0.ffn_norm.weight", n_embd)
    w_gate = weight("blk.0.ffn_gate.weight", n_embd, n_ff)
    w_up = weight("blk.0.ffn_up.weight", n_embd, n_ff)
    w_down = weight("blk.0.ffn_down.weight", n_ff, n_embd)

    # the KV cache: F16, one row of n_embd per position, earlier positions already filled
    cache_k = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, n_embd * n_ctx)
    cache_v = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, n_embd * n_ctx)
    ggml_set_name(cache_k, "cache_k_l0")
    ggml_set_name(cache_v, "cache_v_l0")
    set_data(cache_k, rng.normal(0, 0.5, n_embd * n_ctx).astype(np.float32))
    set_data(cache_v, rng.normal(0, 0.5, n_embd * n_ctx).astype(np.float32))

    x = weight("inp_embd", n_embd, n_tokens)
    pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens)
    ggml_set_name(pos, "inp_pos")
    set_data(pos, np.arange(n_past, n_past + n_tokens, dtype=np.int32))
    n_kv = n_past + n_tokens
    mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n_tokens)
    ggml_set_name(mask, "kq_mask")
    causal = np.triu(np.full((n_tokens, n_kv), -np.inf, dtype=np.float32), k=n_past + 1)
    set_data(mask, causal)

    cur = ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), attn_norm)
    ggml_set_name(cur, "attn_norm-0")

    q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, wq, cur), head_dim, n_head, n_tokens)
    k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, wk, cur), head_dim, n_head, n_tokens)
    v = ggml_mul_mat(ctx, wv, cur)
    q = ggml_rope_ext(ctx, q, pos, None, head_dim, GGML_ROPE_TYPE_NORMAL, 0, 10000.0, 1.0, 0.0,
                      1.0, 0.0, 0.0)
    k = ggml_rope_ext(ctx, k, pos, None, head_dim, GGML_ROPE_TYPE_NORMAL, 0, 10000.0, 1.0, 0.0,
                      1.0, 0.0, 0.0)
    ggml_set_name(q, "Qcur-0")
    ggml_set_name(k, "Kcur-0")
    ggml_set_name(v, "Vcur-0")

    # store the new K and V rows into the cache, through views at position n_past
    k_view = ggml_view_1d(ctx, cache_k, n_tokens * n_embd, n_past * n_embd * 2)
    v_view = ggml_view_1d(ctx, cache_v, n_tokens * n_embd, n_past * n_embd * 2)
    k_store = ggml_cpy(ctx, k, k_view)
    v_store = ggml_cpy(ctx, v, v_view)

    gf = ggml_new_graph_custom(ctx, 128, False)
    ggml_build_forward_expand(gf, k_store)
    ggml_build_forward_expand(gf, v_store)

    # attention over all n_kv cached positions, one head per matrix
    K = ggml_view_3d(ctx, cache_k, head_dim, n_head, n_kv, head_dim * 2, n_embd * 2, 0)
    V = ggml_view_3d(ctx, cache_v, head_dim, n_head, n_kv, head_dim * 2, n_embd * 2, 0)
    Qp = ggml_permute(ctx, q, 0, 2, 1, 3)  # [head_dim, n_tokens, n_head]
    Kp = ggml_permute(ctx, K, 0, 2, 1, 3)  # [head_dim, n_kv, n_head]
    kq = ggml_mul_mat(ctx, Kp, Qp)  # [n_kv, n_tokens, n_head]
    ggml_set_name(kq, "kq-0")
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0 / head_dim ** 0.5, 0.0)
    ggml_set_name(kq, "kq_soft_max-0")
    Vt = ggml_cont(ctx, ggml_permute(ctx, V, 1, 2, 0, 3))  # [n_kv, head_dim, n_head]
    kqv = ggml_mul_mat(ctx, Vt, kq)  # [head_dim, n_tokens, n_head]
    merged = ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), n_embd, n_tokens)
    ggml_set_name(merged, "kqv_out-0")

    attn_out = ggml_add(ctx, ggml_mul_mat(ctx, wo, merged), x)  # the residual
    ggml_set_name(attn_out, "ffn_inp-0")
    cur = ggml_mul(ctx, ggml_rms_norm(ctx, attn_out, eps), ffn_norm)
    ggml_set_name(cur, "ffn_norm-0")
    ffn = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, w_gate, cur), ggml_mul_mat(ctx, w_up, cur))
    out = ggml_add(ctx, ggml_mul_mat(ctx, w_down, ffn), attn_out)
    ggml_set_name(out, "l_out-0")

    ggml_build_forward_expand(gf, out)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"l_out-0": out, "cache_k_l0": cache_k}
