"""simple-backend: the same product as simple-ctx, the way real programs run: ggml-backend and the scheduler.

Mirrors ggml's examples/simple/simple-backend.cpp line for line: the best backend and the CPU
backend go to a ggml_backend_sched; the graph's context is `no_alloc` (its tensors get no data),
ggml_backend_sched_alloc_graph decides where each tensor runs and gives every tensor its bytes in
a compute buffer planned by the graph allocator, the inputs are copied in with
ggml_backend_tensor_set, and the result is read back with ggml_backend_tensor_get.
"""

import numpy as np

from engine.ggml import *  # noqa: F403 - ggml's names, as the C example includes ggml.h
from engine.ggml_backend import *  # noqa: F403 - and ggml-backend.h

rows_A, cols_A = 4, 2
matrix_A = np.array([2, 8,
                     5, 1,
                     4, 2,
                     8, 6], dtype=np.float32)
rows_B, cols_B = 3, 2
matrix_B = np.array([10, 5,  # transpose([10, 9, 5], [5, 9, 4])
                     9, 9,
                     5, 4], dtype=np.float32)


class simple_model:  # noqa: N801 - the example's struct
    a = None
    b = None
    backend = None
    cpu_backend = None
    sched = None
    buf = None


def init_model(model: simple_model) -> None:
    ggml_backend_load_all()
    model.backend = ggml_backend_init_best()
    model.cpu_backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, None)
    backends = [model.backend, model.cpu_backend]
    model.sched = ggml_backend_sched_new(backends, None, 2, GGML_DEFAULT_GRAPH_SIZE, False, True)


def build_graph(model: simple_model):
    buf_size = ggml_tensor_overhead() * GGML_DEFAULT_GRAPH_SIZE + ggml_graph_overhead()
    model.buf = bytearray(buf_size)
    ctx = ggml_init(ggml_init_params(mem_size=buf_size, mem_buffer=model.buf, no_alloc=True))
    gf = ggml_new_graph(ctx)
    model.a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols_A, rows_A)
    model.b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols_B, rows_B)
    result = ggml_mul_mat(ctx, model.a, model.b)  # result = a * b^T
    ggml_build_forward_expand(gf, result)
    ggml_free(ctx)  # the tensors and the graph live on in model.buf
    return gf


def compute(model: simple_model, gf, n_threads: int):
    ggml_backend_sched_reset(model.sched)
    ggml_backend_sched_alloc_graph(model.sched, gf)
    ggml_backend_tensor_set(model.a, matrix_A, 0, ggml_nbytes(model.a))
    ggml_backend_tensor_set(model.b, matrix_B, 0, ggml_nbytes(model.b))
    ggml_backend_cpu_set_n_threads(model.cpu_backend, n_threads)
    ggml_backend_sched_graph_compute(model.sched, gf)
    return ggml_graph_node(gf, -1)  # the last node is the result


def run(n_threads: int = 1) -> dict:
    model = simple_model()
    init_model(model)
    gf = build_graph(model)
    result = compute(model, gf, n_threads)
    out_data = np.frombuffer(ggml_backend_tensor_get(result, 0, ggml_nbytes(result)), dtype=np.float32)
    ggml_backend_sched_free(model.sched)
    ggml_backend_free(model.backend)
    ggml_backend_free(model.cpu_backend)
    return {"result": out_data.reshape(result.ne[1], result.ne[0])}
