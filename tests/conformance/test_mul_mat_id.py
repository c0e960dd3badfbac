"""MUL_MAT_ID (mixture of experts) against real ggml: float and quantized experts, broadcast
inputs, tokens choosing the same expert twice or no token choosing one, 1 to 4 threads; each
thread's chunks of each expert as ggml hands them out."""

from __future__ import annotations

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.compute.kernels.matmul import chunking
from engine.core.errors import GGMLAssertionError
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType, TYPE_TRAITS
from tests.support.graphs import Leaf, check_op, engine_result, engine_shares

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
T = GGMLType


def ids_leaf(n_ids: int, n_tok: int, n_expert: int, seed: int = 0, values=None) -> Leaf:
    if values is None:
        rng = np.random.default_rng(seed)
        values = np.stack([rng.permutation(n_expert)[:n_ids] for _ in range(n_tok)])
    return Leaf(I32, (n_ids, n_tok), values=np.asarray(values, np.int32))


def mmid(g, ctx, as_, b, ids):
    return g.ggml_mul_mat_id(ctx, as_, b, ids)


# (expert type, cols, rows, n_expert, n_ids, n_b, n_tokens, NMSE bound)
# exact vec_dot emulation (F32, F16, BF16, vecdot.EXACT_QUANT) must give ggml's bits;
# other quantized types are BLAS products within test-backend-ops' mul_mat bound (5e-4)
CASES = [
    (F32, 64, 20, 4, 2, 2, 5, 0.0),
    (F32, 32, 16, 6, 3, 1, 7, 0.0),   # one input row broadcast to every expert slot
    (F16, 64, 20, 4, 2, 2, 3, 0.0),
    (T.BF16, 72, 12, 4, 2, 2, 3, 0.0),
    (T.Q4_0, 64, 24, 4, 2, 1, 6, 0.0),
    (T.Q8_0, 96, 17, 5, 2, 2, 4, 0.0),
    (T.Q5_0, 64, 8, 3, 2, 2, 3, 0.0),
    (T.Q4_K, 256, 12, 4, 2, 1, 3, 0.0),
    (T.Q6_K, 256, 9, 3, 2, 2, 2, 0.0),
    (T.Q5_K, 256, 8, 3, 2, 1, 3, 0.0),
    (T.Q4_1, 64, 8, 3, 2, 2, 3, 0.0),
    (T.Q5_1, 96, 10, 4, 2, 1, 4, 0.0),
    (T.Q2_K, 256, 8, 3, 2, 1, 3, 0.0),
    (T.Q3_K, 512, 6, 3, 2, 2, 3, 0.0),
    (T.IQ4_XS, 256, 9, 4, 2, 2, 3, 0.0),
    (T.IQ3_XXS, 512, 7, 3, 2, 2, 3, 0.0),
    (T.IQ3_S, 256, 9, 4, 2, 1, 4, 0.0),
    (T.IQ2_S, 512, 8, 3, 2, 2, 3, 0.0),
    (T.TQ2_0, 768, 10, 3, 2, 2, 3, 0.0),
    (T.TQ1_0, 512, 9, 4, 2, 1, 3, 0.0),
    (T.MXFP4, 64, 8, 4, 2, 2, 3, 0.0),
    (T.MXFP4, 96, 7, 3, 2, 1, 4, 0.0),  # an odd number of blocks: the last by ggml's scalar loop
    (T.IQ1_M, 512, 8, 3, 2, 2, 3, 0.0),
    (T.IQ4_NL, 64, 8, 4, 2, 2, 3, 0.0),
    (T.IQ4_NL, 96, 7, 3, 2, 1, 4, 0.0),  # an odd number of blocks: the last by ggml's scalar loop
]


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}x{c[2]}x{c[3]}")
def test_mul_mat_id(case, n_threads):
    t, cols, rows, n_exp, n_ids, n_b, n_tok, bound = case
    leaves = [Leaf(t, (cols, rows, n_exp)), Leaf(F32, (cols, n_b, n_tok)), ids_leaf(n_ids, n_tok, n_exp)]
    check_op(mmid, leaves, n_threads, max_nmse=bound, exact=bound == 0.0)


def test_an_expert_chosen_twice_and_one_never():
    ids = [[1, 1], [3, 1], [1, 3], [0, 1]]  # expert 2 unused; token 0 uses expert 1 in both slots
    leaves = [Leaf(T.Q8_0, (64, 10, 4)), Leaf(F32, (64, 2, 4)), ids_leaf(2, 4, 4, values=ids)]
    for n in (1, 2, 4):
        check_op(mmid, leaves, n, exact=True)


def test_results_identical_for_1_to_4_threads():
    leaves = [Leaf(T.Q4_K, (256, 40, 6)), Leaf(F32, (256, 2, 9)), ids_leaf(2, 9, 6, seed=3)]
    first = engine_result(mmid, leaves, 1)
    for n in (2, 3, 4):
        assert engine_result(mmid, leaves, n) == first


@pytest.mark.parametrize("n_threads", [2, 3, 4])
def test_each_thread_takes_its_chunks_of_each_expert(n_threads):
    ids = [[0, 2], [2, 1], [0, 1], [2, 0], [1, 2]]
    leaves = [Leaf(F32, (32, 70, 3)), Leaf(F32, (32, 1, 5)), ids_leaf(2, 5, 3, values=ids)]
    (shares,) = engine_shares(mmid, leaves, n_threads, GGMLOp.MUL_MAT_ID)
    counts = {e: sum(row.count(e) for row in ids) for e in range(3)}
    taken: dict[int, set] = {e: set() for e in counts}
    for s in shares:
        assert s.kind == "chunks"
        firsts = {}
        for label, r0, r1 in s.ranges:
            e, chunk = (int(x) for x in label[1:].split("."))
            nchunk0, nchunk1, dr0, dr1 = chunking(70, counts[e], n_threads)
            c0, c1 = chunk % nchunk0, chunk // nchunk0
            assert (tuple(r0), tuple(r1)) == ((dr0 * c0, min(dr0 * c0 + dr0, 70)),
                                              (dr1 * c1, min(dr1 * c1 + dr1, counts[e])))
            taken[e].add(chunk)
            firsts.setdefault(e, chunk)
        for e, chunk in firsts.items():  # each thread starts each expert at chunk ith
            assert chunk == s.ith
    for e, n in counts.items():
        nchunk0, nchunk1, _, _ = chunking(70, n, n_threads)
        assert taken[e] == set(range(nchunk0 * nchunk1))


def test_asserts():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    as_ = eng.ggml_new_tensor_3d(ctx, F32, 8, 4, 3)
    b = eng.ggml_new_tensor_3d(ctx, F32, 8, 2, 5)
    ids = eng.ggml_new_tensor_2d(ctx, I32, 2, 5)
    with pytest.raises(GGMLAssertionError, match=r"ids->type == GGML_TYPE_I32"):
        eng.ggml_mul_mat_id(ctx, as_, b, eng.ggml_new_tensor_2d(ctx, F32, 2, 5))
    with pytest.raises(GGMLAssertionError, match=r"ids->ne\[1\] == b->ne\[2\]"):
        eng.ggml_mul_mat_id(ctx, as_, b, eng.ggml_new_tensor_2d(ctx, I32, 2, 4))
    with pytest.raises(GGMLAssertionError, match=r"as->ne\[0\] == b->ne\[0\]"):
        eng.ggml_mul_mat_id(ctx, as_, eng.ggml_new_tensor_3d(ctx, F32, 6, 2, 5), ids)
    with pytest.raises(GGMLAssertionError, match=r"ids->ne\[0\] % b->ne\[1\] == 0"):
        eng.ggml_mul_mat_id(ctx, as_, eng.ggml_new_tensor_3d(ctx, F32, 8, 3, 5), ids)
    out = eng.ggml_mul_mat_id(ctx, as_, b, ids)
    assert [int(x) for x in out.ne] == [4, 2, 5, 1]


QUANTIZED = [t for t in GGMLType if TYPE_TRAITS[t].is_quantized and TYPE_TRAITS[t].vec_dot_type is not None
             and t not in (T.Q8_1, T.Q8_K) and hasattr(real, f"GGML_TYPE_{t.name}")
             and not real.ggml_quantize_requires_imatrix(int(t))]


@pytest.mark.parametrize("t", QUANTIZED, ids=lambda t: t.name)
def test_every_quantized_expert_type(t):
    """Every type ggml quantizes without an importance matrix, as experts: test-backend-ops'
    mul_mat bound (5e-4) where the product is a BLAS one, bit for bit where it is emulated."""
    leaves = [Leaf(t, (256, 8, 3)), Leaf(F32, (256, 1, 3)), ids_leaf(2, 3, 3)]
    check_op(mmid, leaves, 2, max_nmse=5e-4)
