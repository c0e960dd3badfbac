"""minilm: a real model end to end — all-MiniLM-L6-v2 (BERT, Q8_0) turns a sentence into a vector.

It runs the way llama.cpp runs it. The weights come from a GGUF file made by llama.cpp's converter:
gguf_init_from_file(no_alloc) reads their shapes, the CPU backend gives them one buffer
(ggml_backend_alloc_ctx_tensors) and ggml_backend_tensor_set copies each one's bytes from the
file. A no_alloc context holds the graph llama.cpp builds for BERT: token, position and
token-type embeddings and a layer norm; per layer Q/K/V projections (Q8_0 weights times f32
activations, which ggml first quantizes to Q8_0), attention of every token to every token
(KQ, soft_max_ext, KQV), the output projection, residual, layer norm, a GELU feed-forward,
residual, layer norm; finally the mean over the tokens (a matrix product with a column of 1/n)
and L2 normalisation. The graph allocator (ggml_gallocr) then places every tensor of the graph in
one compute buffer, intermediates sharing memory once their last reader is done; the inputs are
copied in, the CPU backend computes the graph, and the embedding is copied out.
engine/models/bert.py builds the same graph for any BERT GGUF.
"""

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.ggml_alloc import *  # noqa: F403 - ggml-alloc.h
from engine.ggml_backend import *  # noqa: F403 - and ggml-backend.h
from engine.models.tokenizer import WordPiece
from engine.resources import fixture_path

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
    path = path or fixture_path("minilm-q8_0.gguf")
    ids = token_ids(path, prompt)
    n = len(ids)

    # the weights: shapes from the file, bytes in a CPU backend buffer; hyperparameters too
    backend = ggml_backend_cpu_init()
    gguf, weights = load_weights(path, backend)
    w = lambda name: ggml_get_tensor(weights, name)  # noqa: E731
    n_layer = gguf_get_val_u32(gguf, gguf_find_key(gguf, "bert.block_count"))  # 6
    n_embd = gguf_get_val_u32(gguf, gguf_find_key(gguf, "bert.embedding_length"))  # 384
    n_head = gguf_get_val_u32(gguf, gguf_find_key(gguf, "bert.attention.head_count"))  # 12
    eps = gguf_get_val_f32(gguf, gguf_find_key(gguf, "bert.attention.layer_norm_epsilon"))
    head_dim = n_embd // n_head  # 32

    # the graph's context: tensor structs and the graph only (no_alloc: no data here)
    ctx = ggml_init(ggml_init_params(mem_size=1024 * ggml_tensor_overhead()
                                     + ggml_graph_overhead_custom(512, False), mem_buffer=None,
                                     no_alloc=True))
    tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
    ggml_set_name(tokens, "inp_tokens")
    ggml_set_input(tokens)
    pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
    ggml_set_name(pos, "inp_pos")
    ggml_set_input(pos)
    mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n)  # all zeros: every token sees every token
    ggml_set_name(mask, "self_kq_mask")
    ggml_set_input(mask)
    mean = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1)  # a column of 1/n: pooling as a matmul
    ggml_set_name(mean, "inp_mean")
    ggml_set_input(mean)

    # embeddings: rows of the Q8_0 token table (dequantized by get_rows) + type 0 + position
    x = ggml_get_rows(ctx, w("token_embd.weight"), tokens)  # [384, n]
    ggml_set_name(x, "embd")
    x = ggml_add(ctx, x, ggml_view_1d(ctx, w("token_types.weight"), n_embd, 0))
    x = ggml_add(ctx, ggml_get_rows(ctx, w("position_embd.weight"), pos), x)
    ggml_set_name(x, "inp_embd")
    x = ggml_norm(ctx, x, eps)
    x = ggml_add(ctx, ggml_mul(ctx, x, w("token_embd_norm.weight")),
                 w("token_embd_norm.bias"))

    for il in range(n_layer):
        lw = {name: w(f"blk.{il}.{name}") for name in (
            "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
            "attn_v.bias", "attn_output.weight", "attn_output.bias", "attn_output_norm.weight",
            "attn_output_norm.bias", "ffn_up.weight", "ffn_up.bias", "ffn_down.weight",
            "ffn_down.bias", "layer_output_norm.weight", "layer_output_norm.bias")}
        q = ggml_add(ctx, cb(ggml_mul_mat(ctx, lw["attn_q.weight"], x), "Qcur", il),
                     lw["attn_q.bias"])  # [384, n]
        k = ggml_add(ctx, cb(ggml_mul_mat(ctx, lw["attn_k.weight"], x), "Kcur", il), lw["attn_k.bias"])
        v = ggml_add(ctx, cb(ggml_mul_mat(ctx, lw["attn_v.weight"], x), "Vcur", il), lw["attn_v.bias"])
        q = ggml_permute(ctx, ggml_reshape_3d(ctx, q, head_dim, n_head, n), 0, 2, 1, 3)  # [32,n,12]
        k = ggml_permute(ctx, ggml_reshape_3d(ctx, k, head_dim, n_head, n), 0, 2, 1, 3)
        v = ggml_permute(ctx, ggml_reshape_3d(ctx, v, head_dim, n_head, n), 0, 2, 1, 3)
        kq = cb(ggml_mul_mat(ctx, k, q), "kq", il)  # [n_kv, n_q, 12]: a score per key, query, head
        kq = cb(ggml_soft_max_ext(ctx, kq, mask, 1.0 / np.sqrt(head_dim), 0.0), "kq_soft_max", il)
        vt = cb(ggml_cont(ctx, ggml_transpose(ctx, v)), "v_cont", il)  # [n, 32, 12]
        kqv = cb(ggml_mul_mat(ctx, vt, kq), "kqv", il)  # [32, n, 12]
        cur = ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), n_embd, n)  # heads side by side
        cb(cur, "kqv_out", il)
        cur = ggml_add(ctx, ggml_mul_mat(ctx, lw["attn_output.weight"], cur), lw["attn_output.bias"])
        cur = ggml_add(ctx, cur, x)  # residual
        cur = ggml_norm(ctx, cur, eps)
        ffn_inp = cb(ggml_add(ctx, ggml_mul(ctx, cur, lw["attn_output_norm.weight"]),
                              lw["attn_output_norm.bias"]), "ffn_inp", il)
        cur = cb(ggml_mul_mat(ctx, lw["ffn_up.weight"], ffn_inp), "ffn_up", il)
        cur = cb(ggml_add(ctx, cur, lw["ffn_up.bias"]), "ffn_up_b", il)
        cur = cb(ggml_gelu(ctx, cur), "ffn_gelu", il)  # [1536, n]
        cur = cb(ggml_mul_mat(ctx, lw["ffn_down.weight"], cur), "ffn_down", il)
        cur = cb(ggml_add(ctx, cur, lw["ffn_down.bias"]), "ffn_out", il)
        cur = ggml_add(ctx, cur, ffn_inp)  # residual
        cur = ggml_norm(ctx, cur, eps)
        x = ggml_add(ctx, ggml_mul(ctx, cur, lw["layer_output_norm.weight"]),
                     lw["layer_output_norm.bias"])

    pooled = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, x)), mean)  # [384, 1]: the mean
    embedding = ggml_l2_norm(ctx, pooled, 1e-12)
    ggml_set_name(embedding, "embedding")

    ggml_set_output(embedding)

    gf = ggml_new_graph_custom(ctx, 512, False)
    ggml_build_forward_expand(gf, embedding)

    # the graph allocator's plan: one compute buffer, memory reused once a tensor is read
    galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend))
    ggml_gallocr_alloc_graph(galloc, gf)
    ggml_backend_tensor_set(tokens, np.array(ids, dtype=np.int32), 0, ggml_nbytes(tokens))
    ggml_backend_tensor_set(pos, np.arange(n, dtype=np.int32), 0, ggml_nbytes(pos))
    ggml_backend_tensor_set(mask, np.zeros((n, n), dtype=np.float32), 0, ggml_nbytes(mask))
    ggml_backend_tensor_set(mean, np.full((1, n), 1.0 / n, dtype=np.float32), 0, ggml_nbytes(mean))
    ggml_backend_cpu_set_n_threads(backend, n_threads)
    ggml_backend_graph_compute(backend, gf)
    out = ggml_backend_tensor_get(embedding, 0, ggml_nbytes(embedding))
    return {"embedding": np.frombuffer(out, dtype=np.float32).copy(), "token_ids": ids}


def load_weights(path: str, backend):
    """llama.cpp's loader on one backend: every tensor's shape from the file into a no_alloc
    context, one buffer for them all, then each one's bytes read from the file into it."""
    gguf, ctx_meta = gguf_init_from_file(path, gguf_init_params(no_alloc=True, ctx=True))
    n = gguf_get_n_tensors(gguf)
    ctx_w = ggml_init(ggml_init_params(mem_size=n * ggml_tensor_overhead(), mem_buffer=None,
                                       no_alloc=True))
    for i in range(n):
        name = gguf_get_tensor_name(gguf, i)
        ggml_set_name(ggml_dup_tensor(ctx_w, ggml_get_tensor(ctx_meta, name)), name)
    buf = ggml_backend_alloc_ctx_tensors(ctx_w, backend)
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    with open(path, "rb") as f:
        data = f.read()
    for i in range(n):
        t = ggml_get_tensor(ctx_w, gguf_get_tensor_name(gguf, i))
        start = gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, i)
        ggml_backend_tensor_set(t, data[start:start + ggml_nbytes(t)], 0, ggml_nbytes(t))
    return gguf, ctx_w
