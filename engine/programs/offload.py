"""offload: the tiny LLaMA split between an accelerator and the CPU, as llama.cpp's -ngl does.

The same model and prompt as tiny-llama, run the way llama.cpp runs a model that does not fit on
the GPU: the weights of the first N_GPU_LAYERS layers (and their KV cache) go into buffers of a
second device with memory of its own (a simulated accelerator: the CPU cannot read its buffers),
the rest into CPU buffers. A ggml_backend_sched decides, pass by pass, which backend computes each
node, cuts the graph into splits, and copies each split's inputs across; a learner watches every
pass colour the graph, each split, and each copy. The tokens it generates equal tiny-llama's.
"""

import numpy as np

from engine.backend.accel import ggml_backend_accel_init
from engine.ggml import *  # noqa: F403
from engine.ggml_alloc import *  # noqa: F403
from engine.ggml_backend import *  # noqa: F403
from engine.resources import scratch_path
from engine.programs.tiny_llama import (HEAD_DIM, N_CTX, N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_NEW, PROMPT,
                                        write_model)

N_GPU_LAYERS = 1  # llama.cpp's -ngl: layers 0 .. N_GPU_LAYERS-1 on the device


def load_weights(path, gpu, cpu):
    """Each weight into a no_alloc context of its device, then one buffer per device, then the
    bytes read from the file into the buffers (llama.cpp's loader, for two buffer types)."""
    gguf, ctx_meta = gguf_init_from_file(path, gguf_init_params(no_alloc=True, ctx=True))
    n = gguf_get_n_tensors(gguf)
    ctx_gpu = ggml_init(ggml_init_params(mem_size=n * ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    ctx_cpu = ggml_init(ggml_init_params(mem_size=n * ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    weights = {}
    for i in range(n):
        name = gguf_get_tensor_name(gguf, i)
        on_gpu = name.startswith("blk.") and int(name.split(".")[1]) < N_GPU_LAYERS
        t = ggml_dup_tensor(ctx_gpu if on_gpu else ctx_cpu, ggml_get_tensor(ctx_meta, name))
        ggml_set_name(t, name)
        weights[name] = t
    buf_gpu = ggml_backend_alloc_ctx_tensors(ctx_gpu, gpu)
    buf_cpu = ggml_backend_alloc_ctx_tensors(ctx_cpu, cpu)
    ggml_backend_buffer_set_usage(buf_gpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    ggml_backend_buffer_set_usage(buf_cpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    data = open(path, "rb").read()
    for i in range(n):
        t = weights[gguf_get_tensor_name(gguf, i)]
        start = gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, i)
        ggml_backend_tensor_set(t, data[start:start + ggml_nbytes(t)], 0, ggml_nbytes(t))
    return weights


def run(n_threads: int = 1) -> dict:
    path = scratch_path("tiny-llama.gguf")
    write_model(path)
    gpu = ggml_backend_accel_init("GPU0")
    cpu = ggml_backend_cpu_init()
    ggml_backend_cpu_set_n_threads(cpu, n_threads)
    weights = load_weights(path, gpu, cpu)
    w = lambda il, name: weights[f"blk.{il}.{name}.weight"]  # noqa: E731

    # the KV cache: one K and one V tensor per layer, on the device of its layer
    kv = HEAD_DIM * N_HEAD_KV
    f16 = ggml_type_size(GGML_TYPE_F16)
    ctx_kv_gpu = ggml_init(ggml_init_params(mem_size=4 * N_LAYER * ggml_tensor_overhead(), mem_buffer=None,
                                            no_alloc=True))
    ctx_kv_cpu = ggml_init(ggml_init_params(mem_size=4 * N_LAYER * ggml_tensor_overhead(), mem_buffer=None,
                                            no_alloc=True))
    cache_k, cache_v = [], []
    for il in range(N_LAYER):
        ctx_kv = ctx_kv_gpu if il < N_GPU_LAYERS else ctx_kv_cpu
        cache_k.append(ggml_new_tensor_1d(ctx_kv, GGML_TYPE_F16, N_CTX * kv))
        cache_v.append(ggml_new_tensor_1d(ctx_kv, GGML_TYPE_F16, N_CTX * kv))  # transposed
        ggml_set_name(cache_k[il], f"cache_k_l{il}")
        ggml_set_name(cache_v[il], f"cache_v_l{il}")
    for ctx_kv, backend in ((ctx_kv_gpu, gpu), (ctx_kv_cpu, cpu)):
        buf_kv = ggml_backend_alloc_ctx_tensors(ctx_kv, backend)
        ggml_backend_buffer_clear(buf_kv, 0)  # llama.cpp clears the cache

    sched = ggml_backend_sched_new([gpu, cpu], None, 2, 1024, False, True)
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
        mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n)
        ggml_set_name(mask, "kq_mask")
        ggml_set_input(mask)

        x = ggml_get_rows(ctx, weights["token_embd.weight"], inp)
        for il in range(N_LAYER):
            cur = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-5), w(il, "attn_norm"))
            q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, w(il, "attn_q"), cur), HEAD_DIM, N_HEAD, n)
            k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, w(il, "attn_k"), cur), HEAD_DIM, N_HEAD_KV, n)
            v = ggml_mul_mat(ctx, w(il, "attn_v"), cur)
            q = ggml_rope_ext(ctx, q, pos, None, HEAD_DIM, 0, N_CTX, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
            k = ggml_rope_ext(ctx, k, pos, None, HEAD_DIM, 0, N_CTX, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
            k_dst = ggml_view_1d(ctx, cache_k[il], n * kv, n_past * kv * f16)
            ggml_build_forward_expand(gf, ggml_cpy(ctx, k, k_dst))
            v_dst = ggml_view_2d(ctx, cache_v[il], n, kv, N_CTX * f16, n_past * f16)
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_transpose(ctx, v), v_dst))
            k_all = ggml_view_3d(ctx, cache_k[il], HEAD_DIM, N_HEAD_KV, n_kv, HEAD_DIM * f16, kv * f16, 0)
            v_all = ggml_view_3d(ctx, cache_v[il], n_kv, N_HEAD_KV, HEAD_DIM, N_CTX * HEAD_DIM * f16, N_CTX * f16, 0)
            kq = ggml_mul_mat(ctx, ggml_permute(ctx, k_all, 0, 2, 1, 3), ggml_permute(ctx, q, 0, 2, 1, 3))
            kq = ggml_soft_max_ext(ctx, kq, mask, 1.0 / np.sqrt(HEAD_DIM), 0.0)
            kqv = ggml_mul_mat(ctx, ggml_permute(ctx, v_all, 0, 2, 1, 3), kq)
            cur = ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), N_EMBD, n)
            ffn_inp = ggml_add(ctx, ggml_mul_mat(ctx, w(il, "attn_output"), cur), x)
            cur = ggml_mul(ctx, ggml_rms_norm(ctx, ffn_inp, 1e-5), w(il, "ffn_norm"))
            cur = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, w(il, "ffn_gate"), cur), ggml_mul_mat(ctx, w(il, "ffn_up"), cur))
            x = ggml_add(ctx, ggml_mul_mat(ctx, w(il, "ffn_down"), cur), ffn_inp)

        x = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-5), weights["output_norm.weight"])
        logits = ggml_mul_mat(ctx, weights["output.weight"], x)
        best = ggml_argmax(ctx, logits)
        ggml_set_output(logits)
        ggml_set_output(best)
        ggml_build_forward_expand(gf, best)

        ggml_backend_sched_reset(sched)
        ggml_backend_sched_alloc_graph(sched, gf)  # the five passes, the splits, the compute buffers
        ggml_backend_tensor_set(inp, np.array(tokens, dtype=np.int32), 0, ggml_nbytes(inp))
        ggml_backend_tensor_set(pos, np.arange(n_past, n_kv, dtype=np.int32), 0, ggml_nbytes(pos))
        causal = np.triu(np.full((n, n_kv), -np.inf, dtype=np.float32), n_past + 1)
        ggml_backend_tensor_set(mask, causal, 0, ggml_nbytes(mask))
        ggml_backend_sched_graph_compute(sched, gf)  # each split on its backend, inputs copied first

        ids = np.frombuffer(ggml_backend_tensor_get(best, 0, ggml_nbytes(best)), dtype=np.int32)
        generated.append(int(ids[n - 1]))
        outputs["prompt_logits" if step == 0 else f"logits_{step}"] = np.frombuffer(
            ggml_backend_tensor_get(logits, 0, ggml_nbytes(logits)), dtype=np.float32).reshape(n, -1)
        n_past, tokens = n_kv, generated[-1:]
    outputs["generated"] = generated
    outputs["n_splits"] = ggml_backend_sched_get_n_splits(sched)
    return outputs
