"""mnist-style: two contexts, as in ggml's MNIST example: one holds the weights, one the compute.

The program first writes a small fully connected network (64 inputs, 32 hidden, 10 classes) to a
GGUF file; gguf_init_from_file then creates the weights context (one blob holding all the data,
tensors pointing into it); a second context holds the input and the graph; its nodes read weights
across contexts.
"""

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.resources import scratch_path


def write_model(path: str) -> None:
    """A deterministic two-layer classifier, saved as ggml's MNIST example saves its model."""
    rng = np.random.default_rng(42)
    ctx = ggml_init(ggml_init_params(mem_size=64 * 1024, mem_buffer=None, no_alloc=False))
    gguf = gguf_init_empty()
    gguf_set_val_str(gguf, "general.architecture", "mnist-fc")
    for name, ne, scale in (("fc1.weight", (64, 32), 0.3), ("fc1.bias", (32,), 0.1),
                            ("fc2.weight", (32, 10), 0.3), ("fc2.bias", (10,), 0.1)):
        t = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), list(ne))
        ggml_set_name(t, name)
        set_data(t, rng.normal(0, scale, tuple(reversed(ne))).astype(np.float32))
        gguf_add_tensor(gguf, t)
    gguf_write_to_file(gguf, path, False)
    gguf_free(gguf)
    ggml_free(ctx)


def run(n_threads: int = 1) -> dict:
    path = scratch_path("mnist-fc.gguf")
    write_model(path)

    # the weights context: made by gguf_init_from_file (in C, through params.ctx)
    gguf, ctx_weights = gguf_init_from_file(path, gguf_init_params(no_alloc=False, ctx=True))
    fc1_w = ggml_get_tensor(ctx_weights, "fc1.weight")
    fc1_b = ggml_get_tensor(ctx_weights, "fc1.bias")
    fc2_w = ggml_get_tensor(ctx_weights, "fc2.weight")
    fc2_b = ggml_get_tensor(ctx_weights, "fc2.bias")

    # the compute context: the input, the intermediate tensors and the graph
    ctx_compute = ggml_init(ggml_init_params(mem_size=1024 * 1024, mem_buffer=None, no_alloc=False))
    images = ggml_new_tensor_2d(ctx_compute, GGML_TYPE_F32, 64, 2)  # a batch of two 8x8 images
    ggml_set_name(images, "images")
    pixels = np.zeros((2, 8, 8), dtype=np.float32)
    pixels[0, 1:7, 3:5] = 1.0  # a "1"
    pixels[1, 1:7, 1:7] = 1.0
    pixels[1, 2:6, 2:6] = 0.0  # a "0"
    set_data(images, pixels)

    fc1 = ggml_relu(ctx_compute, ggml_add(ctx_compute, ggml_mul_mat(ctx_compute, fc1_w, images), fc1_b))
    logits = ggml_add(ctx_compute, ggml_mul_mat(ctx_compute, fc2_w, fc1), fc2_b)
    ggml_set_name(logits, "logits")
    probs = ggml_soft_max(ctx_compute, logits)
    ggml_set_name(probs, "probs")
    pred = ggml_argmax(ctx_compute, probs)
    ggml_set_name(pred, "pred")

    gf = ggml_new_graph_custom(ctx_compute, 64, False)
    ggml_build_forward_expand(gf, pred)
    ggml_graph_compute_with_ctx(ctx_compute, gf, n_threads)
    gguf_free(gguf)
    return {"probs": probs, "pred": pred}
