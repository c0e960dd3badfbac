"""simple-add: two 3x2 matrices added element by element; the smallest graph with a real op.

Watch ggml_add record an op without computing anything, the graph find two leafs and one node, and
compute fill the result's data.
"""

import numpy as np

from engine.ggml import *  # noqa: F403


def run(n_threads: int = 1) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=16 * 1024, mem_buffer=None, no_alloc=False))

    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2)  # ne = [3, 2]: 2 rows of 3
    b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2)
    ggml_set_name(a, "a")
    ggml_set_name(b, "b")
    set_data(a, np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32))
    set_data(b, np.array([[10, 20, 30], [40, 50, 60]], dtype=np.float32))

    sum_ = ggml_add(ctx, a, b)  # records op ADD with src = [a, b]; no arithmetic yet
    ggml_set_name(sum_, "sum")

    gf = ggml_new_graph_custom(ctx, 16, False)  # a small graph: 16 nodes
    ggml_build_forward_expand(gf, sum_)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"sum": sum_}
