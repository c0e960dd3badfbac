"""Matrix product op constructors: MUL_MAT (with its precision and hint setters), MUL_MAT_ID
(mixture of experts), OUT_PROD and the triangular solve SOLVE_TRI, as ggml.c builds them: result
shape and type, sources, op_params and the GGML_ASSERTs with ggml's condition text. The kernels
are in engine/compute/kernels/ (matmul.py, misc_math.py, triangular.py).
"""

from __future__ import annotations

from engine.core.api import op, query
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_is_transposed, ggml_new_tensor, \
    ggml_new_tensor_4d
from engine.core.types import GGMLType
from engine.ops.base import ggml_set_op_params_i32, set_op_src, shape_of

GGML_PREC_DEFAULT = 0  # enum ggml_prec: what mul_mat and flash_attn_ext may compute in
GGML_PREC_F32 = 10
GGML_HINT_NONE, GGML_HINT_SRC0_IS_HADAMARD = 0, 1  # what a MUL_MAT's src0 is (op_params[1])


@query
def ggml_can_mul_mat(a: Tensor, b: Tensor) -> bool:
    """ggml_can_mul_mat: same row length; b's matrices are a whole multiple of a's."""
    return (int(a.ne[0]) == int(b.ne[0]) and int(b.ne[2]) % int(a.ne[2]) == 0
            and int(b.ne[3]) % int(a.ne[3]) == 0)


@op
def ggml_mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: F32 [a.ne1, b.ne1, b.ne2, b.ne3] = a · bᵀ for each matrix (a broadcast)."""
    ggml_assert(ggml_can_mul_mat(a, b), "ggml_can_mul_mat(a, b)", "ggml_mul_mat",
                f"a {[int(x) for x in a.ne]}, b {[int(x) for x in b.ne]}")
    ggml_assert(not ggml_is_transposed(a), "!ggml_is_transposed(a)", "ggml_mul_mat")
    ne = [int(a.ne[1]), int(b.ne[1]), int(b.ne[2]), int(b.ne[3])]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    return set_op_src(result, GGMLOp.MUL_MAT, a, b)


@op
def ggml_mul_mat_set_prec(a: Tensor, prec: int) -> None:
    """ggml_mul_mat_set_prec: op_params[0] = prec (GGML_PREC_DEFAULT 0 or GGML_PREC_F32 10)."""
    ggml_assert(a.op == GGMLOp.MUL_MAT, "a->op == GGML_OP_MUL_MAT", "ggml_mul_mat_set_prec")
    ggml_set_op_params_i32(a, 0, prec)


@op
def ggml_mul_mat_set_hint(a: Tensor, hint: int) -> None:
    """ggml_mul_mat_set_hint: op_params[1] of a MUL_MAT node says what src0 is (GGML_HINT_*)."""
    ggml_assert(a.op == GGMLOp.MUL_MAT, "a->op == GGML_OP_MUL_MAT", "ggml_mul_mat_set_hint")
    ggml_set_op_params_i32(a, 1, int(hint))


@op
def ggml_mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: mixture of experts. as_ [cols, rows, n_expert] holds one matrix per
    expert, b [cols, n_b, n_tokens] the inputs, ids [n_expert_used, n_tokens] (I32) which experts
    each token uses; F32 [rows, n_expert_used, n_tokens] with
    result[:, e, t] = as_[:, :, ids[e, t]] · b[:, e % n_b, t]."""
    fn = "ggml_mul_mat_id"
    ggml_assert(not ggml_is_transposed(as_), "!ggml_is_transposed(as)", fn)
    ggml_assert(ids.type == GGMLType.I32, "ids->type == GGML_TYPE_I32", fn)
    ggml_assert(int(as_.ne[3]) == 1, "as->ne[3] == 1", fn, "as is 3-d: one matrix per expert")
    ggml_assert(int(b.ne[3]) == 1, "b->ne[3] == 1", fn, "b is 3-d")
    ggml_assert(int(ids.ne[2]) == 1 and int(ids.ne[3]) == 1, "ids->ne[2] == 1 && ids->ne[3] == 1", fn,
                "ids is 2-d")
    ggml_assert(int(ids.ne[1]) == int(b.ne[2]), "ids->ne[1] == b->ne[2]", fn,
                f"{int(ids.ne[1])} expert lists for {int(b.ne[2])} tokens")
    ggml_assert(int(as_.ne[0]) == int(b.ne[0]), "as->ne[0] == b->ne[0]", fn,
                f"rows of {int(as_.ne[0])} against rows of {int(b.ne[0])}")
    ggml_assert(int(ids.ne[0]) % int(b.ne[1]) == 0, "ids->ne[0] % b->ne[1] == 0", fn,
                f"{int(ids.ne[0])} experts per token cannot broadcast {int(b.ne[1])} inputs")
    ne = [int(as_.ne[1]), int(ids.ne[0]), int(b.ne[2]), 1]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    return set_op_src(result, GGMLOp.MUL_MAT_ID, as_, b, ids)


@query
def ggml_can_out_prod(t0: Tensor, t1: Tensor) -> bool:
    """ggml_can_out_prod: same ne1; t1's dims 2 and 3 whole multiples of t0's."""
    return (int(t0.ne[1]) == int(t1.ne[1]) and int(t1.ne[2]) % int(t0.ne[2]) == 0
            and int(t1.ne[3]) % int(t0.ne[3]) == 0)


@op
def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_out_prod: F32 [a.ne0, b.ne0, b.ne2, b.ne3] = Σ_k a[:, k] ⊗ b[:, k] (a broadcast)."""
    ggml_assert(ggml_can_out_prod(a, b), "ggml_can_out_prod(a, b)", "ggml_out_prod",
                f"a {shape_of(a)}, b {shape_of(b)}")
    ggml_assert(not ggml_is_transposed(a), "!ggml_is_transposed(a)", "ggml_out_prod")
    ne = [int(a.ne[0]), int(b.ne[0]), int(b.ne[2]), int(b.ne[3])]
    return set_op_src(ggml_new_tensor(ctx, GGMLType.F32, 4, ne), GGMLOp.OUT_PROD, a, b)


@op
def ggml_solve_tri(ctx: Context, a: Tensor, b: Tensor, left: bool, lower: bool, uni: bool) -> Tensor:
    """ggml_solve_tri: X with A·X = B for a lower-triangular A [n, n] and B [k, n] (batched);
    ggml solves only the left, lower, non-unit case."""
    fn = "ggml_solve_tri"
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", fn)
    ggml_assert(b.type == GGMLType.F32, "b->type == GGML_TYPE_F32", fn)
    ggml_assert(int(a.ne[0]) == int(a.ne[1]), "a->ne[0] == a->ne[1]", fn, "A must be square")
    ggml_assert(int(a.ne[1]) == int(b.ne[1]), "a->ne[1] == b->ne[1]", fn)
    ggml_assert(int(a.ne[2]) == int(b.ne[2]), "a->ne[2] == b->ne[2]", fn)
    ggml_assert(int(a.ne[3]) == int(b.ne[3]), "a->ne[3] == b->ne[3]", fn)
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    ggml_assert(ggml_is_contiguous(b), "ggml_is_contiguous(b)", fn)
    ggml_assert(lower and left and not uni, "lower && left && !uni", fn, "the only variant ggml solves")
    result = ggml_new_tensor_4d(ctx, GGMLType.F32, *(int(x) for x in b.ne))
    return set_op_src(result, GGMLOp.SOLVE_TRI, a, b)
