"""Op constructors for ggml's remaining convolution and vision ops: transposed, depthwise and 3-d convolutions, im2col_3d, col2im_1d, reflection padding, windows and relative positions.

Each only records (shape, type, op_params, sources, asserts as ggml.c); the kernels compute.
"""

from __future__ import annotations

__all__: list[str] = []
