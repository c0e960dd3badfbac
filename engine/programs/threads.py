"""threads: a mul_mat big enough that four threads share it in chunks.

The plan asks for 4 threads and a work buffer; compute hands each thread the node together, thread
ith starts with chunk ith of a 16x16 grid over the output and takes the next free chunk from a
shared counter until none is left; all meet at the barrier before the next node.
"""

import numpy as np

from engine.ggml import *  # noqa: F403


def run(n_threads: int = 4) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=4 * 1024 * 1024, mem_buffer=None, no_alloc=False))

    w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 96)  # 96 output rows of 64
    x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 40)  # a batch of 40 inputs
    ggml_set_name(w, "weight")
    ggml_set_name(x, "input")
    rng = np.random.default_rng(0)
    set_data(w, rng.uniform(-1, 1, (96, 64)).astype(np.float32))
    set_data(x, rng.uniform(-1, 1, (40, 64)).astype(np.float32))

    y = ggml_mul_mat(ctx, w, x)  # [96, 40]: 6 x 3 = 18 chunks of 16 x 16
    ggml_set_name(y, "y")
    z = ggml_add(ctx, y, y)  # rows split evenly: each thread a contiguous range
    ggml_set_name(z, "z")

    gf = ggml_new_graph_custom(ctx, 16, False)
    ggml_build_forward_expand(gf, z)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"z": z}
