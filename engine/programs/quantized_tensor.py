"""quantized-tensor: a [32, 6] Q4_0 tensor is 6 rows of one 18-byte block each.

nb = [18, 18, 108, 108]: nb[0] is the size of a block, not of an element. Each row of 32 floats is
quantized into one block (an fp16 scale d and 16 bytes of 4-bit quants) and copied back to f32
through ggml_cpy, which dequantizes it block by block.
"""

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.libm import sinf  # C's sinf: the same bits on every CPU, unlike numpy's np.sin


def run(n_threads: int = 1) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=64 * 1024, mem_buffer=None, no_alloc=False))

    x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 6)
    ggml_set_name(x, "x")
    rows = sinf(np.arange(6 * 32, dtype=np.float32) / 5).reshape(6, 32) * np.float32(3)
    set_data(x, rows)

    q = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 32, 6)  # 6 blocks of 2 + 16 bytes
    ggml_set_name(q, "q")
    back = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 6)
    ggml_set_name(back, "dequantized")

    quantize = ggml_cpy(ctx, x, q)  # f32 -> Q4_0: each row becomes one block
    dequantize = ggml_cpy(ctx, quantize, back)  # Q4_0 -> f32, block by block

    gf = ggml_new_graph_custom(ctx, 16, False)
    ggml_build_forward_expand(gf, dequantize)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"x": x, "dequantized": back, "q": q}
