"""Op constructors for ggml's state-space ops: Mamba's short convolution, SSM_CONV.

Each only records (shape, type, sources, the GGML_ASSERTs with ggml's condition text, as ggml.c);
the kernel (engine/compute/kernels/ssm.py) computes.
"""

from __future__ import annotations

from engine.context import Context
from engine.errors import ggml_assert
from engine.ops import _ne, _record
from engine.optable import GGMLOp
from engine.tensor import Tensor, ggml_is_3d, ggml_is_matrix, ggml_new_tensor_3d
from engine.types import GGMLType

__all__ = ["ggml_ssm_conv"]


def ggml_ssm_conv(ctx: Context, sx: Tensor, c: Tensor) -> Tensor:
    """ggml_ssm_conv: Mamba's causal depthwise convolution. sx [d_conv - 1 + n_t, d_inner, n_s]
    holds each channel's last d_conv - 1 inputs then the new n_t; c [d_conv, d_inner] the kernels;
    F32 [d_inner, n_t, n_s] with result[i, t, s] = Σ_k sx[t + k, i, s] · c[k, i]."""
    fn = "ggml_ssm_conv"
    ggml_assert(ggml_is_3d(sx), "ggml_is_3d(sx)", fn, f"sx ne = {_ne(sx)}")
    ggml_assert(ggml_is_matrix(c), "ggml_is_matrix(c)", fn, f"c ne = {_ne(c)}")
    d_conv, d_inner = int(c.ne[0]), int(c.ne[1])
    n_t, n_s = int(sx.ne[0]) - d_conv + 1, int(sx.ne[2])
    ggml_assert(int(sx.ne[1]) == d_inner, "sx->ne[1] == d_inner", fn, f"{int(sx.ne[1])} channels, c has {d_inner}")
    ggml_assert(n_t >= 0, "n_t >= 0", fn, f"sx holds {int(sx.ne[0])} steps for a kernel of {d_conv}")
    result = ggml_new_tensor_3d(ctx, GGMLType.F32, d_inner, n_t, n_s)
    return _record(result, GGMLOp.SSM_CONV, sx, c)
