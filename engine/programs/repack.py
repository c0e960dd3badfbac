"""repack: a Q4_0 weight in llama.cpp's CPU_REPACK buffer: 8 rows interleaved, gemm for 4 rows, gemv for one.

llama.cpp's default CPU path loads a weight into the first buffer type whose device supports the op
the weight is used in, trying the CPU device's extra buffer types before the plain CPU one
(llama_model_loader's select_weight_buft; the list comes through the registry's proc address
"ggml_backend_dev_get_extra_bufts"). CPU_REPACK takes a 2-D weight read by MUL_MAT, of a type the
build repacks (Q4_0, Q4_K, IQ4_NL, MXFP4 on an AVX2 build), whose rows come in whole groups of 8;
token embeddings (read by GET_ROWS), norms and odd shapes stay in the CPU buffer.

Its set_tensor rewrites the bytes: block b of 8 consecutive rows becomes one block_q4_0x8, the 8
scales first, then 8 quant bytes of row 0, 8 of row 1, ..., 8 of row 7, then the next 8 of each;
every quant byte XOR 0x88 (the nibble q, worth q - 8, becomes q ^ 8, the same value as a signed
4-bit number). One 32-byte AVX2 load then holds the same 16 elements of 4 rows. The activations
are quantized to Q8_0 4 rows at a time, interleaved the same way, and multiplied by gemm; the 0
to 3 rows left over one by one by gemv. So x1 (1 row) goes through gemv alone, x5 (5 rows)
through gemm for rows 0-3 and gemv for row 4.

The bytes in the buffer are no longer the tensor's plain blocks: the buffer is not a host buffer,
and ggml_backend_tensor_get of the weight is refused (CPU_REPACK has no get_tensor).
"""

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.ggml_alloc import *  # noqa: F403
from engine.ggml_backend import *  # noqa: F403
from engine.libm import sinf  # C's sinf: the same bits on every CPU

K, ROWS = 256, 16  # the weight: 16 rows of 256 (two groups of 8 rows, 8 Q4_0 blocks each)


def run(n_threads: int = 2) -> dict:
    # the CPU device's extra buffer types, found as llama.cpp finds them
    reg = ggml_backend_cpu_reg()
    dev = ggml_backend_reg_dev_get(reg, 0)
    get_extra_bufts = ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
    repack_buft = get_extra_bufts(dev)[0]  # CPU_REPACK (this build has no AMX or KleidiAI)
    cpu_buft = ggml_backend_cpu_buffer_type()

    # the weight in a context of its own (llama.cpp: one context per buffer type), no data yet
    ctx_w = ggml_init(ggml_init_params(mem_size=ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    w = ggml_new_tensor_2d(ctx_w, GGML_TYPE_Q4_0, K, ROWS)
    ggml_set_name(w, "w")

    # the activations, one row and 4 + 1 rows, and the two products
    ctx = ggml_init(ggml_init_params(mem_size=8 * ggml_tensor_overhead() + ggml_graph_overhead(),
                                     mem_buffer=None, no_alloc=True))
    x1 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, 1)
    ggml_set_name(x1, "x1")
    x5 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, 5)
    ggml_set_name(x5, "x5")
    y1 = ggml_mul_mat(ctx, w, x1)  # [16, 1]: gemv
    ggml_set_name(y1, "y1")
    y5 = ggml_mul_mat(ctx, w, x5)  # [16, 5]: gemm for rows 0-3, gemv for row 4
    ggml_set_name(y5, "y5")
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, y1)
    ggml_build_forward_expand(gf, y5)

    # select_weight_buft would take CPU_REPACK here: its supports_op takes MUL_MAT of a 2-D Q4_0
    # weight of 16 rows (a multiple of 8) with F32 activations in host memory
    buf_w = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, repack_buft)  # init_tensor picks q4_0_8x8
    ggml_backend_buffer_set_usage(buf_w, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, cpu_buft)

    # the weight's plain Q4_0 rows, as a GGUF file holds them; set_tensor writes them repacked
    values = sinf(np.arange(ROWS * K, dtype=np.float32) / 7) * (1 + np.arange(ROWS * K, dtype=np.float32) % 5)
    q = np.zeros(ROWS * ggml_row_size(GGML_TYPE_Q4_0, K), dtype=np.uint8)
    ggml_quantize_chunk(GGML_TYPE_Q4_0, values, q, 0, ROWS, K, None)
    ggml_backend_tensor_set(w, q, 0, ggml_nbytes(w))
    # not host memory: ggml_backend_tensor_get(w, ...) would stop at GGML_ASSERT(buf->iface.get_tensor != NULL)
    w_is_host = ggml_backend_buffer_is_host(buf_w)

    x = sinf(np.arange(5 * K, dtype=np.float32) / 3)
    ggml_backend_tensor_set(x1, x[:K], 0, ggml_nbytes(x1))
    ggml_backend_tensor_set(x5, x, 0, ggml_nbytes(x5))

    backend = ggml_backend_cpu_init()
    ggml_backend_cpu_set_n_threads(backend, n_threads)
    ggml_backend_graph_compute(backend, gf)  # MUL_MAT of w: the CPU_REPACK traits' forward_mul_mat
    out1 = np.frombuffer(ggml_backend_tensor_get(y1, 0, ggml_nbytes(y1)), dtype=np.float32)
    out5 = np.frombuffer(ggml_backend_tensor_get(y5, 0, ggml_nbytes(y5)), dtype=np.float32)

    ggml_backend_free(backend)
    ggml_backend_buffer_free(buf)
    ggml_backend_buffer_free(buf_w)
    ggml_free(ctx)
    ggml_free(ctx_w)
    return {"y1": out1.reshape(1, ROWS), "y5": out5.reshape(5, ROWS), "w_is_host": w_is_host}
