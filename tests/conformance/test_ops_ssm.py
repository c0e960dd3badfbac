"""Mamba's SSM_CONV (engine/ops_ssm.py, kernels/ssm.py) against real ggml: bit for bit at 1 and 3
threads, each thread's channels as ggml splits them, and ggml's asserts."""

from __future__ import annotations

import pytest

from engine import ggml as eng
from engine.errors import GGMLAssertionError
from engine.optable import GGMLOp
from engine.types import GGMLType
from tests.support.graphs import Leaf, check_op, engine_shares

F32 = GGMLType.F32


def ssm_conv(g, ctx, sx, c):
    return g.ggml_ssm_conv(ctx, sx, c)


@pytest.mark.parametrize("n_threads", [1, 3, 4])
@pytest.mark.parametrize("d_conv,d_inner,n_t,n_s", [(4, 16, 5, 2), (3, 7, 1, 3), (4, 33, 9, 1), (2, 9, 3, 1),
                                                    (5, 9, 3, 1), (6, 11, 2, 2), (7, 9, 3, 1), (13, 20, 3, 2)])
def test_ssm_conv(d_conv, d_inner, n_t, n_s, n_threads):
    leaves = [Leaf(F32, (d_conv - 1 + n_t, d_inner, n_s)), Leaf(F32, (d_conv, d_inner))]
    check_op(ssm_conv, leaves, n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [2, 3])
def test_ssm_conv_threads_take_channels(n_threads):
    (shares,) = engine_shares(ssm_conv, [Leaf(F32, (7, 10, 2)), Leaf(F32, (4, 10))], n_threads, GGMLOp.SSM_CONV)
    dr = -(-10 // n_threads)
    assert [tuple(s.ranges[0]) for s in shares] == [(min(dr * i, 10), min(dr * i + dr, 10)) for i in range(n_threads)]


def test_ssm_conv_asserts():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    c = eng.ggml_new_tensor_2d(ctx, F32, 4, 8)
    with pytest.raises(GGMLAssertionError, match=r"sx->ne\[1\] == d_inner"):
        eng.ggml_ssm_conv(ctx, eng.ggml_new_tensor_3d(ctx, F32, 6, 7, 1), c)
    with pytest.raises(GGMLAssertionError, match=r"ggml_is_matrix\(c\)"):
        eng.ggml_ssm_conv(ctx, eng.ggml_new_tensor_3d(ctx, F32, 6, 8, 1), eng.ggml_new_tensor_3d(ctx, F32, 4, 8, 2))
