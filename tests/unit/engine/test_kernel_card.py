"""The debugger's worked block (engine/compute/kernel_card.py) against the node it explains."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ggml as eng
from engine.compute.kernel_card import worked_block
from engine.compute.kernels.vecdot import EXACT_QUANT
from engine.core.types import GGMLType, TYPE_TRAITS
from engine.quants import quantize


@pytest.mark.parametrize("type_", sorted(EXACT_QUANT), ids=lambda t: t.name)
def test_worked_block_result_is_the_nodes_value(type_: GGMLType):
    """The block-by-block replay (lanes, fmas, the mins or offsets) ends on the node's own bits."""
    rng = np.random.default_rng(int(type_))
    k = 3 * TYPE_TRAITS[type_].blck_size
    ctx = eng.ggml_init(eng.ggml_init_params(16 << 20))
    a = eng.ggml_new_tensor_2d(ctx, int(type_), k, 3)
    eng.data_bytes(a)[:] = quantize(type_, rng.standard_normal((3, k)).astype(np.float32)) \
        .view(np.uint8).reshape(-1)
    b = eng.ggml_new_tensor_2d(ctx, int(GGMLType.F32), k, 2)
    eng.data_bytes(b)[:] = rng.standard_normal(2 * k).astype(np.float32).view(np.uint8)
    c = eng.ggml_mul_mat(ctx, a, b)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, c)
    assert eng.ggml_graph_compute_with_ctx(ctx, gf, 1) == 0
    for row, col in ((0, 0), (2, 1)):
        w = worked_block(c, row, col, 1)
        assert np.float32(w.result).tobytes() == np.float32(w.dst_value).tobytes(), (row, col)
        assert (w.min_lanes is not None) == (type_ == GGMLType.Q4_K)
