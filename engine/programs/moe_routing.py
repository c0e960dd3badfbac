"""moe-routing: mixture of experts as llama.cpp builds it; a router sends each token to two experts.

Four experts, each its own SwiGLU feed-forward, stored side by side in one 3-d tensor per
weight (blk.0.ffn_up_exps.weight is [n_embd, n_ff, n_expert]), as Mixtral and Qwen3-MoE store
them. The router scores every expert for every token (ffn_moe_logits), softmax makes the scores
odds, ggml_argsort_top_k keeps each token's two likeliest experts (ffn_moe_topk: the routing),
ggml_get_rows picks their odds, which are renormalised to sum to 1. Then ggml_mul_mat_id
multiplies each token only by the experts it chose: watch the MUL_MAT_ID nodes group the tokens
by expert and hand out each expert's rows in chunks. The experts' outputs are weighted by their
odds and summed per token.
"""

import numpy as np

from engine.ggml import *  # noqa: F403

n_embd, n_ff = 16, 32
n_expert, n_expert_used = 4, 2
n_tokens = 6


def run(n_threads: int = 2) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=4 * 1024 * 1024, mem_buffer=None, no_alloc=False))
    rng = np.random.default_rng(11)

    def weight(name, *ne):
        t = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), list(ne))
        ggml_set_name(t, name)
        set_data(t, rng.normal(0, 0.5, tuple(reversed(ne))).astype(np.float32))
        return t

    gate_inp = weight("blk.0.ffn_gate_inp.weight", n_embd, n_expert)  # the router
    up_exps = weight("blk.0.ffn_up_exps.weight", n_embd, n_ff, n_expert)
    gate_exps = weight("blk.0.ffn_gate_exps.weight", n_embd, n_ff, n_expert)
    down_exps = weight("blk.0.ffn_down_exps.weight", n_ff, n_embd, n_expert)
    cur = weight("ffn_inp-0", n_embd, n_tokens)

    # the router: odds of every expert for every token, and each token's two likeliest
    logits = ggml_mul_mat(ctx, gate_inp, cur)  # [n_expert, n_tokens]
    ggml_set_name(logits, "ffn_moe_logits-0")
    probs = ggml_soft_max(ctx, logits)
    ggml_set_name(probs, "ffn_moe_probs-0")
    selected = ggml_argsort_top_k(ctx, probs, n_expert_used)  # [n_expert_used, n_tokens] I32
    ggml_set_name(selected, "ffn_moe_topk-0")
    weights = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, n_expert, n_tokens), selected)
    ggml_set_name(weights, "ffn_moe_weights-0")  # [1, n_expert_used, n_tokens]
    weights = ggml_reshape_2d(ctx, weights, n_expert_used, n_tokens)
    weights_sum = ggml_sum_rows(ctx, weights)
    ggml_set_name(weights_sum, "ffn_moe_weights_sum-0")
    weights = ggml_div(ctx, weights, weights_sum)  # the chosen odds, summing to 1
    ggml_set_name(weights, "ffn_moe_weights_norm-0")
    weights = ggml_reshape_3d(ctx, weights, 1, n_expert_used, n_tokens)

    # each token through its experts only: one MUL_MAT_ID per weight
    x = ggml_reshape_3d(ctx, cur, n_embd, 1, n_tokens)  # one input row, broadcast to both slots
    up = ggml_mul_mat_id(ctx, up_exps, x, selected)  # [n_ff, n_expert_used, n_tokens]
    ggml_set_name(up, "ffn_moe_up-0")
    gate = ggml_mul_mat_id(ctx, gate_exps, x, selected)
    ggml_set_name(gate, "ffn_moe_gate-0")
    par = ggml_swiglu_split(ctx, gate, up)  # silu(gate) * up
    ggml_set_name(par, "ffn_moe_gate_par-0")
    experts = ggml_mul_mat_id(ctx, down_exps, par, selected)  # [n_embd, n_expert_used, n_tokens]
    ggml_set_name(experts, "ffn_moe_down-0")
    experts = ggml_mul(ctx, experts, weights)
    ggml_set_name(experts, "ffn_moe_weighted-0")

    # the weighted outputs of each token's experts, added: a view per slot
    slot0 = ggml_view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], 0)
    slot1 = ggml_view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], experts.nb[1])
    moe_out = ggml_add(ctx, slot0, slot1)
    ggml_set_name(moe_out, "ffn_moe_out-0")

    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, moe_out)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)

    return {"experts": to_numpy(selected).tolist(),  # each token's two experts, likeliest first
            "odds": to_numpy(probs).tolist(),
            "moe_out": to_numpy(moe_out).tolist()}
