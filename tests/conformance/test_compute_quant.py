"""Quantized weights in the kernels: mul_mat, copies to and from quantized types, ADD, against
real ggml."""

from __future__ import annotations

import numpy as np
import pytest

from engine.compute.kernels.vecdot import EXACT_QUANT
from engine.quants import QUANT_KINDS
from engine.core.types import GGMLType, TYPE_TRAITS
from tests.support.graphs import Leaf, check_op, values

F32, F16 = GGMLType.F32, GGMLType.F16
# weight types real ggml can quantize without an importance matrix, and that have a vec_dot
WEIGHTS = [t for t, k in QUANT_KINDS.items() if TYPE_TRAITS[t].vec_dot_type is not None
           and k.quantize is not None and t not in (GGMLType.Q8_1,)]


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("wtype", WEIGHTS, ids=lambda t: TYPE_TRAITS[t].type_name)
def test_mul_mat_quantized(wtype, batch, n_threads):
    """The types whose vec_dot the engine emulates (vecdot.EXACT_QUANT; these products are
    small enough for it) bit for bit, the others to rounding."""
    k = TYPE_TRAITS[wtype].blck_size * 2 if TYPE_TRAITS[wtype].blck_size > 32 else 128
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(wtype, (k, 24)), Leaf(F32, (k, batch))], n_threads, max_nmse=5e-4,
             exact=wtype in EXACT_QUANT)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K,
                                   GGMLType.IQ4_NL])
def test_copies_through_quantized(qtype):
    n = TYPE_TRAITS[qtype].blck_size * 2
    check_op(lambda g, ctx, a, b: g.ggml_cpy(ctx, a, b),
             [Leaf(F32, (n, 3)), Leaf(qtype, (n, 3))], 2, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_cpy(ctx, a, b),
             [Leaf(qtype, (n, 3)), Leaf(F32, (n // 2, 6))], 3, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_add(ctx, a, b),
             [Leaf(qtype, (n, 3)), Leaf(F32, (n, 3))], 2, exact=True)


@pytest.mark.parametrize("wtype", [F32, F16, GGMLType.Q4_K, GGMLType.Q8_0],
                         ids=lambda t: TYPE_TRAITS[t].type_name)
def test_mul_mat_result_does_not_depend_on_thread_count(wtype):
    """Products are computed in fixed units shared out among the threads: 600 weight rows make
    three units, and K = 2048 takes F32 and Q8_0 off the exact path onto BLAS. Every thread
    count must give the same bits (as ggml's one-vec_dot-per-output does), and agree with ggml."""
    leaves = [Leaf(wtype, (2048, 600)), Leaf(F32, (2048, 7))]
    results = [values(check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b), leaves, n,
                               max_nmse=5e-4)[0]) for n in (1, 2, 3, 4)]
    for r in results[1:]:
        np.testing.assert_array_equal(r.view(np.uint32), results[0].view(np.uint32))
