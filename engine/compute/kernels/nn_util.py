"""Helpers the neural-network kernels share: float math, raw strided views, ALiBi slopes.

The libm-style functions (expf, cosf, fmaf, ...) come from floatmath, re-exported here. Views onto
the pool follow a tensor's own byte strides, so a kernel reads memory exactly where ggml's pointer
arithmetic would.
"""

from __future__ import annotations

import numpy as np

from engine import libm
from engine.compute.kernels.floatmath import cosf, expf, fmaf, logf, sinf, tanhf, \
    v_expf  # noqa: F401 (re-exported)
from engine.compute.kernels.views import strided
from engine.core.tensor import Tensor
from engine.core.types import TYPE_TRAITS, CFloat

F32, F64 = np.float32, np.float64


def powf_scalar(x: CFloat, y: CFloat) -> np.float32:
    """C's powf on two scalars (engine.libm.powf works element by element)."""
    return libm.scalar(libm.powf, x, y)


def fp16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest fp16 (ties to even, as F16C does), back as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, F32).astype(np.float16).astype(F32)


def raw_rows4(t: Tensor) -> np.ndarray:
    """t's rows as raw bytes: uint8 (ne3, ne2, ne1, row_bytes) following nb1..nb3 (any type)."""
    tr = TYPE_TRAITS[t.type]
    row_bytes = tr.type_size * int(t.ne[0]) // tr.blck_size
    nb = [int(x) for x in t.nb]
    return strided(t, (int(t.ne[3]), int(t.ne[2]), int(t.ne[1]), row_bytes),
                   (nb[3], nb[2], nb[1], 1), dtype=np.uint8)


def alibi_slopes(n_head: int, max_bias: CFloat) -> np.ndarray:
    """The ALiBi slope of each head h (1 for all when max_bias <= 0), in float as ggml has it.

    n_head_log2 = 2^floor(log2(n_head)); m0 = 2^(-max_bias/n_head_log2),
    m1 = 2^(-(max_bias/2)/n_head_log2); slope = m0^(h+1) if h < n_head_log2 else
    m1^(2(h - n_head_log2) + 1).
    """
    max_bias = F32(max_bias)
    if not max_bias > 0:
        return np.ones(n_head, F32)
    n_head_log2 = 1 << (n_head.bit_length() - 1)  # 2^floor(log2(n_head))
    m0 = powf_scalar(2.0, -max_bias / F32(n_head_log2))
    m1 = powf_scalar(2.0, -(max_bias / F32(2)) / F32(n_head_log2))
    return np.array([powf_scalar(m0, h + 1) if h < n_head_log2 else
                     powf_scalar(m1, 2 * (h - n_head_log2) + 1) for h in range(n_head)], F32)
