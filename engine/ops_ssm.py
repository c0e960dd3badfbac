"""Op constructors for ggml's state-space and linear-attention ops: Mamba's SSM_CONV and SSM_SCAN, RWKV's WKV6 and WKV7, gated linear attention and the gated delta net.

Each only records (shape, type, op_params, sources, asserts as ggml.c); the kernels compute.
"""

from __future__ import annotations

__all__: list[str] = []
