"""ggml-alloc.h: `from engine.ggml_alloc import *` as a C program includes the header.

ggml_gallocr_reserve_n_size returns the list of sizes (C fills a size_t array);
ggml_backend_alloc_ctx_tensors(_from_buft) returns one buffer, or the list of buffers when the
context was split past the buffer type's max size (C returns them wrapped in a multi-buffer).
"""

from engine.backend.alloc import (
    ggml_gallocr_alloc_graph,
    ggml_gallocr_free,
    ggml_gallocr_get_buffer_size,
    ggml_gallocr_new,
    ggml_gallocr_new_n,
    ggml_gallocr_reserve,
    ggml_gallocr_reserve_n,
    ggml_gallocr_reserve_n_size,
)
from engine.backend.ctx_alloc import (
    ggml_backend_alloc_ctx_tensors,
    ggml_backend_alloc_ctx_tensors_from_buft,
    ggml_backend_alloc_ctx_tensors_from_buft_size,
    ggml_tallocr_alloc,
    ggml_tallocr_new,
)

__all__ = [
    "ggml_backend_alloc_ctx_tensors",
    "ggml_backend_alloc_ctx_tensors_from_buft",
    "ggml_backend_alloc_ctx_tensors_from_buft_size",
    "ggml_gallocr_alloc_graph",
    "ggml_gallocr_free",
    "ggml_gallocr_get_buffer_size",
    "ggml_gallocr_new",
    "ggml_gallocr_new_n",
    "ggml_gallocr_reserve",
    "ggml_gallocr_reserve_n",
    "ggml_gallocr_reserve_n_size",
    "ggml_tallocr_alloc",
    "ggml_tallocr_new",
]
