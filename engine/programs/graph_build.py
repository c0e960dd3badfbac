"""graph-build: how ggml_build_forward_expand turns tensors into a graph.

A depth-first walk from the result visits each tensor's sources before the tensor (post-order):
tensors with no op become leafs ("leaf_N" if unnamed), everything else nodes ("node_N"). Each visited
tensor takes a slot in the graph's hash set (its address >> 4, modulo the table size, then the next
free slot), and each use of a tensor as a source is counted.
"""

from engine.ggml import *  # noqa: F403


def run(n_threads: int = 1) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=256 * 1024, mem_buffer=None, no_alloc=False))

    x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    ggml_set_name(x, "x")
    ggml_set_f32(x, 2.0)
    ggml_set_f32(a, 3.0)
    ggml_set_f32(b, 4.0)

    x2 = ggml_mul(ctx, x, x)  # x is used twice: use count 2
    ax2 = ggml_mul(ctx, a, x2)
    f = ggml_add(ctx, ax2, b)  # f(x) = a*x^2 + b, ggml.h's own example
    ggml_set_name(f, "f")

    gf = ggml_new_graph_custom(ctx, 32, False)
    ggml_build_forward_expand(gf, f)  # 3 leafs (x, a, b), 3 nodes (x2, ax2, f)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"f": f}
