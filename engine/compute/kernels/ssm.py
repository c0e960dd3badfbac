"""SSM_CONV (ggml-cpu/ops.cpp): Mamba's short convolution.

The threads split the channels (rows of sx) as get_thread_range does; for every sequence and
token, each channel's window is multiplied by its kernel and summed in order in float32, as the
oracle's build compiles such a loop (floatmath.mac_in_order).
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import kernel, not_supported
from engine.compute.kernels.common import thread_range, view4
from engine.compute.kernels.floatmath import mac_in_order
from engine.errors import ggml_assert
from engine.optable import GGMLOp
from engine.tensor import Tensor
from engine.types import GGMLType



@kernel(GGMLOp.SSM_CONV)
def compute_forward_ssm_conv(params, dst: Tensor) -> None:
    """ggml_compute_forward_ssm_conv_f32: x[i, t, s] = Σ_k sx[t + k, i, s]·c[k, i], k in order."""
    sx, c = dst.src[0], dst.src[1]
    fn = "ggml_compute_forward_ssm_conv_f32"
    if sx.type != GGMLType.F32 or c.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(int(sx.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    ggml_assert(int(c.nb[0]) == 4, "src1->nb[0] == sizeof(float)", fn)
    ggml_assert(int(sx.nb[1]) == int(sx.ne[0]) * 4, "src0->nb[1] == src0->ne[0]*sizeof(float)", fn)
    nc, nr = int(c.ne[0]), int(sx.ne[1])
    n_t = int(dst.ne[1])
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    s3 = view4(sx)[0]  # (n_s, d_inner, ncs)
    w = view4(c)[0, 0][ir0:ir1]  # (rows, d_conv)
    out = view4(dst)[0]  # (n_s, n_t, d_inner)
    for t in range(n_t):
        win = s3[:, ir0:ir1, t:t + nc]  # (n_s, rows, d_conv)
        acc = np.zeros(win.shape[:2], np.float32)
        for k in range(nc):
            acc = mac_in_order(acc, win[:, :, k], w[:, k], k, nc)
        out[:, t, ir0:ir1] = acc
    params.took("rows", (ir0, ir1))
