"""MUL_MAT by a Hadamard matrix: ggml_compute_forward_fwht (ggml-cpu/ops.cpp), a fast transform.

A MUL_MAT whose op_params[1] is GGML_HINT_SRC0_IS_HADAMARD (ggml_mul_mat_set_hint; llama.cpp's
llama_mul_mat_hadamard rotates Q, K and V this way around a quantized KV cache) is not a product:
ggml_compute_forward_mul_mat hands it, unless params.use_ref, to the fast Walsh-Hadamard
transform, which never reads src0 (it must be the orthonormal Hadamard matrix of its size). Each
row of src1 (n elements, n a power of two; F32, or F16 widened) is scaled by 1/sqrtf(n), then
transformed in place by log2(n) butterfly passes, (u, v) -> (u + v, u - v) between the elements
len apart for len = 1, 2, 4, ... (the passes of 8 and more by vector code, whose fused
u + v·(-1) rounds as u - v does). Thread ith takes rows [ith·r, (ith + 1)·r), r = ceil(rows/nth).

Numerics: additions and subtractions of floats, ggml's bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels.common import row_blocks, thread_range, to_f32, view4
from engine.compute.shares import ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.tensor import Tensor
from engine.core.types import GGMLType
from engine.ops.matmul import GGML_HINT_SRC0_IS_HADAMARD

F32 = np.float32
FN = "ggml_compute_forward_fwht"


def takes(dst: Tensor, use_ref: bool) -> bool:
    """Does ggml_compute_forward_mul_mat hand this node to the transform?"""
    return int(dst.op_params[1]) == GGML_HINT_SRC0_IS_HADAMARD and not use_ref


def fwht_rows(x: np.ndarray) -> np.ndarray:
    """The transform of each row of x (rows, n) float32: scaled, then the butterfly passes."""
    rows, n = x.shape
    y = x * (F32(1) / np.sqrt(F32(n)))  # 1.0f / sqrtf((float) n)
    length = 1
    while length < n:
        pairs = y.reshape(rows, n // (2 * length), 2, length)
        u, v = pairs[:, :, 0, :].copy(), pairs[:, :, 1, :].copy()
        pairs[:, :, 0, :] = u + v
        pairs[:, :, 1, :] = u - v
        length *= 2
    return y


def compute_forward_fwht(params, dst: Tensor) -> None:
    """ggml_compute_forward_fwht: this thread's rows of src1, transformed into dst."""
    src1 = dst.source(1)
    with np.errstate(all="ignore"):
        if src1.type not in (GGMLType.F32, GGMLType.F16):
            ggml_assert(False, "src1 F32 or F16", FN, "fwht supports F32 and F16 input")
        n = int(src1.ne[0])
        ggml_assert(n > 0 and n & (n - 1) == 0, "(n & (n - 1)) == 0", FN,
                    f"rows of {n} elements: not a power of 2")
        ne11, ne12, ne13 = (int(x) for x in src1.ne[1:])
        rng = thread_range(ne11 * ne12 * ne13, params.ith, params.nth)
        x4, d4 = view4(src1), view4(dst)
        for i13, i12, a, b in row_blocks(ne11, ne12, rng.start, rng.end):
            d4[i13, i12, a:b] = fwht_rows(to_f32(x4[i13, i12, a:b], src1.type).astype(F32))
    params.took(ShareKind.ROWS, rng, note=Note("rows_src1"))
