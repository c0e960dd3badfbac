"""The graph pieces the model builders here share, llama.cpp's llm_graph_context helpers
(src/llama-graph.cpp): the callback that names a layer's tensors (`named`, the graph callback
`cb`), build_norm's RMS norm (`rms_norm`), build_qkv (`build_qkv`: a fused attn_qkv weight or
separate Q, K and V projections), build_attn_mha (`attention`: KQ, softmax, KQV, or flash
attention's one FLASH_ATTN_EXT) and llama_mul_mat_hadamard (`mul_mat_hadamard`: the rotation of a
quantized KV cache). BERT (bert.py) and the decoders (llama.py, gemma2.py, phi3.py, mamba.py)
build their graphs with them; what a model loads and how a decoder runs its cache are in
decoder.py.
Leaves out: LoRA adapters (build_lora_mm is a plain ggml_mul_mat), attention sinks and ALiBi, and
the feed-forward and mixture-of-experts helpers, which each builder writes for its own weights.
"""

from __future__ import annotations

from engine.ggml import (GGML_HINT_SRC0_IS_HADAMARD, GGML_PREC_F32, GGML_TYPE_F16, GGML_TYPE_F32,
                         Tensor, ggml_add, ggml_cast, ggml_concat, ggml_cont, ggml_cont_2d,
                         ggml_flash_attn_ext, ggml_flash_attn_ext_set_prec, ggml_is_contiguous,
                         ggml_mul, ggml_mul_mat, ggml_mul_mat_set_hint, ggml_mul_mat_set_prec,
                         ggml_nelements, ggml_permute, ggml_reshape_2d, ggml_reshape_3d,
                         ggml_reshape_4d, ggml_rms_norm, ggml_row_size, ggml_scale, ggml_set_name,
                         ggml_soft_max_ext, ggml_tanh, ggml_transpose, ggml_view_3d)


def named(t: Tensor, name: str, il: int) -> Tensor:
    """llama.cpp's graph callback names tensors '<name>-<layer>'."""
    ggml_set_name(t, f"{name}-{il}" if il >= 0 else name)
    return t


def rms_norm(ctx, x: Tensor, w: Tensor, eps: float, name: str, il: int) -> Tensor:
    """build_norm(LLM_NORM_RMS) and the builder's callback: rms_norm(x) (named 'norm') * w."""
    return named(ggml_mul(ctx, named(ggml_rms_norm(ctx, x, eps), "norm", il), w), name, il)


def build_qkv(ctx, L: dict, cur: Tensor, head_dim: int, n_head: int, n_head_kv: int,
              il: int) -> tuple[Tensor, Tensor, Tensor]:
    """llm_graph_context::build_qkv: Q [head_dim, n_head, n], K and V [head_dim, n_head_kv, n]
    from the layer's weights (what decoder.load_qkv found); fused, they are views of one product."""
    n = int(cur.ne[1])
    n_q, n_k = head_dim * n_head, head_dim * n_head_kv
    if L.get("wqkv") is not None:
        qkv = named(ggml_mul_mat(ctx, L["wqkv"], cur), "wqkv", il)  # [n_q + 2 n_k, n]
        if L.get("bqkv") is not None:
            qkv = named(ggml_add(ctx, qkv, L["bqkv"]), "wqkv_b", il)
        elif all(L.get(b) is not None for b in ("bq", "bk", "bv")):
            b = ggml_concat(ctx, ggml_concat(ctx, L["bq"], L["bk"], 0), L["bv"], 0)
            qkv = named(ggml_add(ctx, qkv, b), "wqkv_b", il)
        row, es = int(qkv.nb[1]), ggml_row_size(qkv.type, 1)
        q = ggml_view_3d(ctx, qkv, head_dim, n_head, n, head_dim * es, row, 0)
        k = ggml_view_3d(ctx, qkv, head_dim, n_head_kv, n, head_dim * es, row, n_q * es)
        v = ggml_view_3d(ctx, qkv, head_dim, n_head_kv, n, head_dim * es, row, (n_q + n_k) * es)
    else:
        out = []
        for w, bias, name, heads in (("wq", "bq", "Qcur", n_head), ("wk", "bk", "Kcur", n_head_kv),
                                     ("wv", "bv", "Vcur", n_head_kv)):
            y = named(ggml_mul_mat(ctx, L[w], cur), name, il)
            if L.get(bias) is not None:
                y = named(ggml_add(ctx, y, L[bias]), name, il)
            out.append((y, heads))
        q, k, v = (ggml_reshape_3d(ctx, y, head_dim, heads, n) for y, heads in out)
    return named(q, "Qcur", il), named(k, "Kcur", il), named(v, "Vcur", il)


def attention(ctx, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor | None, kq_scale: float,
              il: int, softcap: float = 0.0, flash: bool = False) -> Tensor:
    """build_attn_mha: q [d, n_head, n_q], k, v [d, n_head_kv, n_kv] (V may be given already
    transposed, as a KV cache without flash attention keeps it); returns [d * n_head, n_q].
    softcap (Gemma 2's attention logit soft-capping): KQ -> softcap * tanh(KQ / softcap) before
    the softmax.

    Without flash attention: KQ = K·Q (F32 precision), soft-capped, soft_max_ext with the mask
    and kq_scale, then V (transposed: ggml_cont of V's transpose when it is not) times it. With
    it (`flash`): one FLASH_ATTN_EXT of Q, K and V (V not transposed; an F32 K or V cast to F16
    first, as llama.cpp casts a cache-less model's), the mask an F16 one, F32 precision."""
    v_trans = int(v.nb[1]) > int(v.nb[2])
    q = ggml_permute(ctx, q, 0, 2, 1, 3)  # [d, n_q, n_head]: one matrix per head
    k = ggml_permute(ctx, k, 0, 2, 1, 3)  # [d, n_kv, n_head_kv]
    v = ggml_permute(ctx, v, 0, 2, 1, 3)
    if flash:
        if v_trans:
            v = ggml_transpose(ctx, v)
        if k.type == GGML_TYPE_F32:
            k = ggml_cast(ctx, k, GGML_TYPE_F16)
        if v.type == GGML_TYPE_F32:
            v = ggml_cast(ctx, v, GGML_TYPE_F16)
        cur = ggml_flash_attn_ext(ctx, q, k, v, kq_mask, kq_scale, 0.0, softcap)
        ggml_flash_attn_ext_set_prec(cur, GGML_PREC_F32)  # [d, n_head, n_q]
        cur = ggml_reshape_2d(ctx, cur, int(cur.ne[0] * cur.ne[1]), int(cur.ne[2] * cur.ne[3]))
        return named(cur, "kqv_out", il)
    kq = ggml_mul_mat(ctx, k, q)  # [n_kv, n_q, n_head]: heads beyond n_head_kv share K (GQA)
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32)
    named(kq, "kq", il)
    if softcap:
        kq = named(ggml_scale(ctx, kq, 1.0 / softcap), "kq_scaled_1", il)
        kq = named(ggml_tanh(ctx, kq), "kq_tanh", il)
        kq = named(ggml_scale(ctx, kq, softcap), "kq_scaled_2", il)
    kq = ggml_soft_max_ext(ctx, kq, kq_mask, kq_scale, 0.0)
    named(kq, "kq_soft_max", il)
    if not v_trans:
        v = ggml_cont(ctx, ggml_transpose(ctx, v))  # [n_kv, d, n_head_kv]
        named(v, "v_cont", il)
    kqv = ggml_mul_mat(ctx, v, kq)  # [d, n_q, n_head]
    named(kqv, "kqv", il)
    cur = ggml_permute(ctx, kqv, 0, 2, 1, 3)  # [d, n_head, n_q]
    cur = ggml_cont_2d(ctx, cur, int(cur.ne[0] * cur.ne[1]), int(cur.ne[2] * cur.ne[3]))
    return named(cur, "kqv_out", il)


def mul_mat_hadamard(ctx, cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard: every run of rot's n elements of cur times the Hadamard matrix rot
    (F32 [n, n]): cur as rows of n (a copy when it is not contiguous), ggml_mul_mat marked
    GGML_HINT_SRC0_IS_HADAMARD (the CPU computes the fast transform), reshaped back."""
    n = int(rot.ne[0])
    rows = ggml_nelements(cur) // n
    res = ggml_cont_2d(ctx, cur, n, rows) if not ggml_is_contiguous(cur) \
        else ggml_reshape_2d(ctx, cur, n, rows)
    res = ggml_mul_mat(ctx, rot, res)
    ggml_mul_mat_set_hint(res, GGML_HINT_SRC0_IS_HADAMARD)
    return ggml_reshape_4d(ctx, res, *(int(x) for x in cur.ne))
