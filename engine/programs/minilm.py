"""minilm: a real model end to end — all-MiniLM-L6-v2 (BERT, Q8_0) turns a sentence into a vector.

The weights come from a GGUF file made by llama.cpp's converter (gguf_init_from_file puts them in
one context); a second context holds the graph llama.cpp builds for BERT: token, position and
token-type embeddings and a layer norm; per layer Q/K/V projections (Q8_0 weights times f32
activations, which ggml first quantizes to Q8_0), attention of every token to every token
(KQ, soft_max_ext, KQV), the output projection, residual, layer norm, a GELU feed-forward,
residual, layer norm; finally the mean over the tokens (a matrix product with a column of 1/n)
and L2 normalisation. engine/models/bert.py builds the same graph for any BERT GGUF.
"""

from pathlib import Path

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.models.tokenizer import WordPiece
from engine.programs import FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "minilm-q8_0.gguf"
TEXT = "ggml is a tensor library for machine learning."


def token_ids(path: str, text: str) -> list[int]:
    """WordPiece with the vocabulary in the file: [CLS] pieces... [SEP] (engine/models)."""
    from engine.models.common import ModelMeta

    return WordPiece.from_model_file(ModelMeta(path)).encode(text)


def cb(t, name: str, il: int):
    """Name a node as llama.cpp's graph callback does ("kq_soft_max-3"), so this program's
    eval-callback dump lines up with llama.cpp's node for node."""
    return ggml_format_name(t, "%s-%d", name, il)


def run(n_threads: int = 1, path: str | None = None, prompt: str = TEXT) -> dict:
    path = str(path or FIXTURE)
    ids = token_ids(path, prompt)
    n = len(ids)

    # the weights context, made by gguf_init_from_file; hyperparameters from the metadata
    gguf, ctx_w = gguf_init_from_file(path, gguf_init_params(no_alloc=False, ctx=True))
    n_layer = gguf_get_val_u32(gguf, gguf_find_key(gguf, "bert.block_count"))  # 6
    n_embd = gguf_get_val_u32(gguf, gguf_find_key(gguf, "bert.embedding_length"))  # 384
    n_head = gguf_get_val_u32(gguf, gguf_find_key(gguf, "bert.attention.head_count"))  # 12
    eps = gguf_get_val_f32(gguf, gguf_find_key(gguf, "bert.attention.layer_norm_epsilon"))
    head_dim = n_embd // n_head  # 32

    # the compute context: inputs, every intermediate tensor, the graph and the work buffer
    ctx = ggml_init(ggml_init_params(mem_size=12 * 1024 * 1024, mem_buffer=None, no_alloc=False))
    tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
    ggml_set_name(tokens, "inp_tokens")
    set_data(tokens, np.array(ids, dtype=np.int32))
    pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
    ggml_set_name(pos, "inp_pos")
    set_data(pos, np.arange(n, dtype=np.int32))
    mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n)  # all zeros: every token sees every token
    ggml_set_name(mask, "self_kq_mask")
    set_data(mask, np.zeros((n, n), dtype=np.float32))
    mean = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1)  # a column of 1/n: pooling as a matmul
    ggml_set_name(mean, "inp_mean")
    set_data(mean, np.full((1, n), 1.0 / n, dtype=np.float32))

    # embeddings: rows of the Q8_0 token table (dequantized by get_rows) + type 0 + position
    x = ggml_get_rows(ctx, ggml_get_tensor(ctx_w, "token_embd.weight"), tokens)  # [384, n]
    ggml_set_name(x, "embd")
    x = ggml_add(ctx, x, ggml_view_1d(ctx, ggml_get_tensor(ctx_w, "token_types.weight"), n_embd, 0))
    x = ggml_add(ctx, ggml_get_rows(ctx, ggml_get_tensor(ctx_w, "position_embd.weight"), pos), x)
    ggml_set_name(x, "inp_embd")
    x = ggml_norm(ctx, x, eps)
    x = ggml_add(ctx, ggml_mul(ctx, x, ggml_get_tensor(ctx_w, "token_embd_norm.weight")),
                 ggml_get_tensor(ctx_w, "token_embd_norm.bias"))

    for il in range(n_layer):
        w = {name: ggml_get_tensor(ctx_w, f"blk.{il}.{name}") for name in (
            "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
            "attn_v.bias", "attn_output.weight", "attn_output.bias", "attn_output_norm.weight",
            "attn_output_norm.bias", "ffn_up.weight", "ffn_up.bias", "ffn_down.weight",
            "ffn_down.bias", "layer_output_norm.weight", "layer_output_norm.bias")}
        q = ggml_add(ctx, cb(ggml_mul_mat(ctx, w["attn_q.weight"], x), "Qcur", il),
                     w["attn_q.bias"])  # [384, n]
        k = ggml_add(ctx, cb(ggml_mul_mat(ctx, w["attn_k.weight"], x), "Kcur", il), w["attn_k.bias"])
        v = ggml_add(ctx, cb(ggml_mul_mat(ctx, w["attn_v.weight"], x), "Vcur", il), w["attn_v.bias"])
        q = ggml_permute(ctx, ggml_reshape_3d(ctx, q, head_dim, n_head, n), 0, 2, 1, 3)  # [32,n,12]
        k = ggml_permute(ctx, ggml_reshape_3d(ctx, k, head_dim, n_head, n), 0, 2, 1, 3)
        v = ggml_permute(ctx, ggml_reshape_3d(ctx, v, head_dim, n_head, n), 0, 2, 1, 3)
        kq = cb(ggml_mul_mat(ctx, k, q), "kq", il)  # [n_kv, n_q, 12]: a score per key, query, head
        kq = cb(ggml_soft_max_ext(ctx, kq, mask, 1.0 / np.sqrt(head_dim), 0.0), "kq_soft_max", il)
        vt = cb(ggml_cont(ctx, ggml_transpose(ctx, v)), "v_cont", il)  # [n, 32, 12]
        kqv = cb(ggml_mul_mat(ctx, vt, kq), "kqv", il)  # [32, n, 12]
        cur = ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), n_embd, n)  # heads side by side
        cb(cur, "kqv_out", il)
        cur = ggml_add(ctx, ggml_mul_mat(ctx, w["attn_output.weight"], cur), w["attn_output.bias"])
        cur = ggml_add(ctx, cur, x)  # residual
        cur = ggml_norm(ctx, cur, eps)
        ffn_inp = cb(ggml_add(ctx, ggml_mul(ctx, cur, w["attn_output_norm.weight"]),
                              w["attn_output_norm.bias"]), "ffn_inp", il)
        cur = cb(ggml_mul_mat(ctx, w["ffn_up.weight"], ffn_inp), "ffn_up", il)
        cur = cb(ggml_add(ctx, cur, w["ffn_up.bias"]), "ffn_up_b", il)
        cur = cb(ggml_gelu(ctx, cur), "ffn_gelu", il)  # [1536, n]
        cur = cb(ggml_mul_mat(ctx, w["ffn_down.weight"], cur), "ffn_down", il)
        cur = cb(ggml_add(ctx, cur, w["ffn_down.bias"]), "ffn_out", il)
        cur = ggml_add(ctx, cur, ffn_inp)  # residual
        cur = ggml_norm(ctx, cur, eps)
        x = ggml_add(ctx, ggml_mul(ctx, cur, w["layer_output_norm.weight"]),
                     w["layer_output_norm.bias"])

    pooled = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, x)), mean)  # [384, 1]: the mean
    embedding = ggml_l2_norm(ctx, pooled, 1e-12)
    ggml_set_name(embedding, "embedding")

    gf = ggml_new_graph_custom(ctx, 512, False)
    ggml_build_forward_expand(gf, embedding)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"embedding": embedding, "token_ids": ids}
