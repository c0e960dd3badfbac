"""Strided numpy views a kernel needs beyond view4: ggml's flat-row walks and acc/set's views.

Several CPU kernels (glu, scale, clamp, leaky_relu, argsort, top_k, cross_entropy_loss) address row
i as `data + i*nb1`, as if dims 1-3 were one packed dimension. `flat_rows` reproduces that walk
exactly (and so gives ggml's answer even for tensors where that assumption does not hold, as long as
the walk stays inside the tensor's pool).
"""

from __future__ import annotations

import numpy as np

from engine.core.tensor import Tensor, ggml_nrows
from engine.core.tensor_data import tensor_view
from engine.core.types import NUMPY_DTYPE, GGMLType


def strided(t: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0,
            dtype=None) -> np.ndarray:
    """t's data seen with any shape and byte strides, starting `offset` bytes in (tensor_view:
    TensorBoundsError where ggml's walk would leave the pool)."""
    return tensor_view(t, shape, strides, dtype or NUMPY_DTYPE[GGMLType(t.type)], offset,
                       "strided")


def flat_rows(t: Tensor, nrows: int | None = None) -> np.ndarray:
    """Rows i = 0..nrows-1 at `data + i*nb1`, each ne0 elements nb0 apart: shape (nrows, ne0)."""
    n = ggml_nrows(t) if nrows is None else nrows
    return strided(t, (n, int(t.ne[0])), (int(t.nb[1]), int(t.nb[0])))
