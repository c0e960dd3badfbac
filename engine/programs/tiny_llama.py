"""tiny-llama: a 2-layer LLaMA with a KV cache predicts its next tokens, the way llama.cpp runs one.

The program first writes a small LLaMA-architecture GGUF (random but deterministic weights, 4 query
heads sharing 2 K/V heads) with gguf.h's writer, and loads it back as llama.cpp does: shapes from
gguf_init_from_file(no_alloc), bytes into a CPU backend buffer. The KV cache has a buffer of its
own: per layer one F16 K tensor and one F16 V tensor (V transposed), cleared. Each forward pass is
a no_alloc context and graph: RMS norm, Q/K/V, rope on Q and K, then ggml_cpy of the new K and V
into ggml_view's of the cache, attention over every cached position (causal mask, grouped-query),
SwiGLU feed-forward, output head, and ggml_argmax for greedy decoding; the graph allocator places
it in a compute buffer (intermediates share memory over time), the CPU backend computes it. The
prompt goes through in one pass; each generated token then goes through alone, reading the cache.
engine/models/llama.py builds the same graph for any LLaMA GGUF.
"""

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.ggml_alloc import *  # noqa: F403 - ggml-alloc.h
from engine.ggml_backend import *  # noqa: F403 - and ggml-backend.h
from engine.resources import scratch_path

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_CTX = 64, 64, 4, 2, 128, 2, 32
HEAD_DIM = N_EMBD // N_HEAD  # 16
PROMPT = [1, 5, 9, 13]
N_NEW = 2  # the prompt pass gives one token, one pass through the cache another


def write_model(path: str) -> None:
    """A deterministic tiny LLaMA as llama.cpp's converter would lay it out (F32 weights)."""
    rng = np.random.default_rng(7)
    ctx = ggml_init(ggml_init_params(mem_size=1024 * 1024, mem_buffer=None, no_alloc=False))
    gguf = gguf_init_empty()
    gguf_set_val_str(gguf, "general.architecture", "llama")
    gguf_set_val_u32(gguf, "llama.context_length", N_CTX)
    gguf_set_val_u32(gguf, "llama.embedding_length", N_EMBD)
    gguf_set_val_u32(gguf, "llama.block_count", N_LAYER)
    gguf_set_val_u32(gguf, "llama.feed_forward_length", N_FF)
    gguf_set_val_u32(gguf, "llama.attention.head_count", N_HEAD)
    gguf_set_val_u32(gguf, "llama.attention.head_count_kv", N_HEAD_KV)
    gguf_set_val_u32(gguf, "llama.rope.dimension_count", HEAD_DIM)
    gguf_set_val_f32(gguf, "llama.attention.layer_norm_rms_epsilon", 1e-5)
    gguf_set_val_f32(gguf, "llama.rope.freq_base", 10000.0)
    gguf_set_val_u32(gguf, "llama.vocab_size", N_VOCAB)
    gguf_set_val_str(gguf, "tokenizer.ggml.model", "none")  # token ids in, token ids out
    kv = HEAD_DIM * N_HEAD_KV
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (N_EMBD, N_VOCAB))]
    for il in range(N_LAYER):
        shapes += [(f"blk.{il}.attn_norm.weight", (N_EMBD,)),
                   (f"blk.{il}.attn_q.weight", (N_EMBD, N_EMBD)),
                   (f"blk.{il}.attn_k.weight", (N_EMBD, kv)),
                   (f"blk.{il}.attn_v.weight", (N_EMBD, kv)),
                   (f"blk.{il}.attn_output.weight", (N_EMBD, N_EMBD)),
                   (f"blk.{il}.ffn_norm.weight", (N_EMBD,)),
                   (f"blk.{il}.ffn_gate.weight", (N_EMBD, N_FF)),
                   (f"blk.{il}.ffn_up.weight", (N_EMBD, N_FF)),
                   (f"blk.{il}.ffn_down.weight", (N_FF, N_EMBD))]
    shapes += [("output_norm.weight", (N_EMBD,)), ("output.weight", (N_EMBD, N_VOCAB))]
    for name, ne in shapes:
        t = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), list(ne))
        ggml_set_name(t, name)
        if len(ne) == 1:  # norm weights near 1
            values = 1.0 + 0.1 * rng.standard_normal(ne[0])
        else:  # rows of n_in weights scaled by 1/sqrt(n_in)
            values = rng.standard_normal(tuple(reversed(ne))) / np.sqrt(ne[0])
        set_data(t, values.astype(np.float32))
        gguf_add_tensor(gguf, t)
    gguf_write_to_file(gguf, path, False)
    gguf_free(gguf)
    ggml_free(ctx)


def run(n_threads: int = 1) -> dict:
    path = scratch_path("tiny-llama.gguf")
    write_model(path)
    backend = ggml_backend_cpu_init()
    ggml_backend_cpu_set_n_threads(backend, n_threads)
    _, weights = load_weights(path, backend)
    w = lambda il, name: ggml_get_tensor(weights, f"blk.{il}.{name}.weight")  # noqa: E731

    # the KV cache: a buffer of its own, kept across forward passes
    kv = HEAD_DIM * N_HEAD_KV  # 32: one token's K (or V) over the K/V heads
    f16 = ggml_type_size(GGML_TYPE_F16)
    ctx_kv = ggml_init(ggml_init_params(mem_size=2 * N_LAYER * ggml_tensor_overhead(),
                                        mem_buffer=None, no_alloc=True))
    cache_k, cache_v = [], []
    for il in range(N_LAYER):
        cache_k.append(ggml_new_tensor_1d(ctx_kv, GGML_TYPE_F16, N_CTX * kv))
        cache_v.append(ggml_new_tensor_1d(ctx_kv, GGML_TYPE_F16, N_CTX * kv))  # transposed
        ggml_set_name(cache_k[il], f"cache_k_l{il}")
        ggml_set_name(cache_v[il], f"cache_v_l{il}")
    buf_kv = ggml_backend_alloc_ctx_tensors(ctx_kv, backend)
    ggml_backend_buffer_clear(buf_kv, 0)  # llama.cpp clears the cache

    # pass 0: the whole prompt; then one pass per generated token, the rest read from the cache
    galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend))
    outputs, generated, tokens, n_past = {}, [], PROMPT, 0
    for step in range(N_NEW):
        n = len(tokens)
        n_kv = n_past + n
        ctx = ggml_init(ggml_init_params(mem_size=256 * ggml_tensor_overhead() + ggml_graph_overhead(),
                                         mem_buffer=None, no_alloc=True))
        gf = ggml_new_graph(ctx)
        inp = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(inp, "inp_tokens")
        ggml_set_input(inp)
        pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(pos, "inp_pos")
        ggml_set_input(pos)
        mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n)  # query i sees cells <= n_past + i
        ggml_set_name(mask, "kq_mask")
        ggml_set_input(mask)

        x = ggml_get_rows(ctx, ggml_get_tensor(weights, "token_embd.weight"), inp)  # [64, n]
        for il in range(N_LAYER):
            cur = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-5), w(il, "attn_norm"))
            q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, w(il, "attn_q"), cur), HEAD_DIM, N_HEAD, n)
            k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, w(il, "attn_k"), cur), HEAD_DIM, N_HEAD_KV,
                                n)
            v = ggml_mul_mat(ctx, w(il, "attn_v"), cur)  # [32, n]
            # rope, normal mode: n_dims 16, n_ctx_orig 32, base 10000, scale 1, no YaRN
            q = ggml_rope_ext(ctx, q, pos, None, HEAD_DIM, 0, N_CTX, 10000.0, 1.0, 0.0, 1.0, 32.0,
                              1.0)
            k = ggml_rope_ext(ctx, k, pos, None, HEAD_DIM, 0, N_CTX, 10000.0, 1.0, 0.0, 1.0, 32.0,
                              1.0)

            # store the new K rows and V columns into the cache (f32 -> f16 by ggml_cpy)
            k_dst = ggml_view_1d(ctx, cache_k[il], n * kv, n_past * kv * f16)
            ggml_build_forward_expand(gf, ggml_cpy(ctx, k, k_dst))
            v_dst = ggml_view_2d(ctx, cache_v[il], n, kv, N_CTX * f16, n_past * f16)
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_transpose(ctx, v), v_dst))

            # attend over the n_kv cached cells: K as [16, 2, n_kv], V (transposed) as [n_kv, 2, 16]
            k_all = ggml_view_3d(ctx, cache_k[il], HEAD_DIM, N_HEAD_KV, n_kv, HEAD_DIM * f16,
                                 kv * f16, 0)
            v_all = ggml_view_3d(ctx, cache_v[il], n_kv, N_HEAD_KV, HEAD_DIM,
                                 N_CTX * HEAD_DIM * f16, N_CTX * f16, 0)
            kq = ggml_mul_mat(ctx, ggml_permute(ctx, k_all, 0, 2, 1, 3),
                              ggml_permute(ctx, q, 0, 2, 1, 3))  # [n_kv, n, 4]: 2 heads per K head
            kq = ggml_soft_max_ext(ctx, kq, mask, 1.0 / np.sqrt(HEAD_DIM), 0.0)
            kqv = ggml_mul_mat(ctx, ggml_permute(ctx, v_all, 0, 2, 1, 3), kq)  # [16, n, 4]
            cur = ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), N_EMBD, n)
            ffn_inp = ggml_add(ctx, ggml_mul_mat(ctx, w(il, "attn_output"), cur), x)  # residual

            cur = ggml_mul(ctx, ggml_rms_norm(ctx, ffn_inp, 1e-5), w(il, "ffn_norm"))
            cur = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, w(il, "ffn_gate"), cur),
                                    ggml_mul_mat(ctx, w(il, "ffn_up"), cur))  # silu(gate) * up
            x = ggml_add(ctx, ggml_mul_mat(ctx, w(il, "ffn_down"), cur), ffn_inp)  # residual

        x = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-5), ggml_get_tensor(weights, "output_norm.weight"))
        logits = ggml_mul_mat(ctx, ggml_get_tensor(weights, "output.weight"), x)  # [64, n]
        best = ggml_argmax(ctx, logits)  # greedy: the most likely next token after each position
        ggml_set_output(logits)
        ggml_set_output(best)
        ggml_build_forward_expand(gf, best)

        ggml_gallocr_alloc_graph(galloc, gf)  # the compute buffer's plan for this graph
        ggml_backend_tensor_set(inp, np.array(tokens, dtype=np.int32), 0, ggml_nbytes(inp))
        ggml_backend_tensor_set(pos, np.arange(n_past, n_kv, dtype=np.int32), 0, ggml_nbytes(pos))
        causal = np.triu(np.full((n, n_kv), -np.inf, dtype=np.float32), n_past + 1)
        ggml_backend_tensor_set(mask, causal, 0, ggml_nbytes(mask))
        ggml_backend_graph_compute(backend, gf)

        ids = np.frombuffer(ggml_backend_tensor_get(best, 0, ggml_nbytes(best)), dtype=np.int32)
        generated.append(int(ids[n - 1]))
        outputs["prompt_logits" if step == 0 else f"logits_{step}"] = np.frombuffer(
            ggml_backend_tensor_get(logits, 0, ggml_nbytes(logits)), dtype=np.float32).reshape(n, -1)
        n_past, tokens = n_kv, generated[-1:]
    outputs["generated"] = generated
    return outputs


def load_weights(path: str, backend):
    """llama.cpp's loader on one backend, as in the minilm walkthrough (a walkthrough's steps are
    the calls its own file makes, so each carries its loader)."""
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
