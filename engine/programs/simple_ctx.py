"""simple-ctx: ggml's first example. Two matrices in one context, ggml_mul_mat, one thread.

Mirrors ggml's examples/simple/simple-ctx.cpp line for line: the context is sized by hand (data,
two tensor overheads, one graph overhead, slack), the matrices are copied in, the graph is built and
computed with ggml_graph_compute_with_ctx, and the result is the last node.
"""

import numpy as np

from engine.ggml import *  # noqa: F403 - ggml's names, as the C example includes ggml.h


def run(n_threads: int = 1) -> dict:
    rows_A, cols_A = 4, 2
    matrix_A = np.array([2, 8, 5, 1, 4, 2, 8, 6], dtype=np.float32)
    rows_B, cols_B = 3, 2
    matrix_B = np.array([10, 5, 9, 9, 5, 4], dtype=np.float32)

    ctx_size = 0
    ctx_size += rows_A * cols_A * ggml_type_size(GGML_TYPE_F32)  # tensor a
    ctx_size += rows_B * cols_B * ggml_type_size(GGML_TYPE_F32)  # tensor b
    ctx_size += 2 * ggml_tensor_overhead()  # tensors
    ctx_size += ggml_graph_overhead()  # compute graph
    ctx_size += 1024  # some overhead
    # (ggml-lens: 456 of these 1024 bytes get used: the result tensor's 368 + 48 bytes, which the
    # sum above leaves out, and 40 of padding and work-buffer header; the accountant shows them)

    ctx = ggml_init(ggml_init_params(mem_size=ctx_size, mem_buffer=None, no_alloc=False))

    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols_A, rows_A)
    b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols_B, rows_B)
    set_data(a, matrix_A)  # memcpy(a->data, matrix_A, ggml_nbytes(a))
    set_data(b, matrix_B)  # memcpy(b->data, matrix_B, ggml_nbytes(b))

    gf = ggml_new_graph(ctx)
    result = ggml_mul_mat(ctx, a, b)  # result = a * b^T
    ggml_build_forward_expand(gf, result)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)

    result = ggml_graph_node(gf, -1)  # the last node is the result
    return {"result": result}
