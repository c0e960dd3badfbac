"""Op constructors for ggml's small remaining ops: cumsum, diag, tri, fill, solve_tri, roll, add_id, add_cast and the rope_custom wrappers.

Each only records (shape, type, op_params, sources, asserts as ggml.c); the kernels compute.
"""

from __future__ import annotations

__all__: list[str] = []
