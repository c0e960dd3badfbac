"""Quantized weights in the kernels: mul_mat, copies to and from quantized types, ADD, against
real ggml."""

from __future__ import annotations

import pytest

from engine.quants import QUANT_KINDS
from engine.types import GGMLType, TYPE_TRAITS
from tests.support.graphs import Leaf, check_op

F32, F16 = GGMLType.F32, GGMLType.F16
# weight types real ggml can quantize without an importance matrix, and that have a vec_dot
WEIGHTS = [t for t, k in QUANT_KINDS.items() if TYPE_TRAITS[t].vec_dot_type is not None
           and k.quantize is not None and t not in (GGMLType.Q8_1,)]


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("wtype", WEIGHTS, ids=lambda t: TYPE_TRAITS[t].type_name)
def test_mul_mat_quantized(wtype, batch, n_threads):
    k = TYPE_TRAITS[wtype].blck_size * 2 if TYPE_TRAITS[wtype].blck_size > 32 else 128
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(wtype, (k, 24)), Leaf(F32, (k, batch))], n_threads, max_nmse=5e-4)


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
