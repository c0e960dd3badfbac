"""Neural-network op constructors: rows (get_rows, set_rows), masks, softmax, pooling, resampling,
padding (zeros, circular, reflection), roll, timestep embedding, flash attention, and Segment
Anything's windows and relative positions. RoPE is in rope.py, convolution in conv.py.

Mirrors the corresponding graph-building functions of ggml.c (oracle version 0.15.3): the result's
shape and type, `op_params` packed exactly as ggml packs them, the `src` slots (set_rows' odd
order included), automatic names, and ggml's GGML_ASSERTs with their condition text. Nothing here
computes; the kernels live in engine/compute/kernels/.

Leaves out: the backward ops (get_rows_back, soft_max_ext_back, pool_2d_back: backward.py).
"""

from __future__ import annotations

import numpy as np

from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_dup_tensor, ggml_is_contiguous, ggml_is_contiguous_rows, \
    ggml_new_tensor, ggml_new_tensor_2d, ggml_new_tensor_4d, ggml_view_tensor
from engine.core.types import GGMLType, TYPE_TRAITS
from engine.ops.base import dup_or_view, f32_params, ggml_set_op_params, ggml_set_op_params_i32, \
    i32_params, set_op_src, shape_of

# --- constants of ggml.h used by these ops ----------------------------------------------------

GGML_OP_POOL_MAX = 0  # enum ggml_op_pool
GGML_OP_POOL_AVG = 1
GGML_OP_POOL_COUNT = 2

GGML_SCALE_MODE_NEAREST = 0  # enum ggml_scale_mode (low byte of the upscale mode)
GGML_SCALE_MODE_BILINEAR = 1
GGML_SCALE_MODE_BICUBIC = 2
GGML_SCALE_MODE_COUNT = 3
GGML_SCALE_FLAG_ALIGN_CORNERS = 1 << 8
GGML_SCALE_FLAG_ANTIALIAS = 1 << 9

F32 = np.float32


# --- get_rows, set_rows ----------------------------------------------------------------------

@op
def ggml_get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_get_rows: rows b[i] of a, as F32 (I32 for an I32 a): [a.ne0, b.ne0, b.ne1, b.ne2].

    b holds I32 row numbers per matrix: result[:, i, j, k] = a[:, b[i, j, k], j, k].
    """
    fn = "ggml_get_rows"
    ggml_assert(int(a.ne[2]) == int(b.ne[1]), "a->ne[2] == b->ne[1]", fn)
    ggml_assert(int(a.ne[3]) == int(b.ne[2]), "a->ne[3] == b->ne[2]", fn)
    ggml_assert(int(b.ne[3]) == 1, "b->ne[3] == 1", fn)
    ggml_assert(b.type == GGMLType.I32, "b->type == GGML_TYPE_I32", fn)
    type_ = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    result = ggml_new_tensor_4d(ctx, type_, int(a.ne[0]), int(b.ne[0]), int(b.ne[1]), int(b.ne[2]))
    return set_op_src(result, GGMLOp.GET_ROWS, a, b)


@op
def ggml_set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_set_rows: a[:, c[i], j, k] = b[:, i, j, k] (converted to a's type); a view of a.

    Note the src order ggml keeps for legacy reasons: src[0] = b (the rows), src[1] = c (the
    I64/I32 indices, broadcast over dims 2 and 3), src[2] = a (the destination).
    """
    fn = "ggml_set_rows"
    ggml_assert(int(a.ne[0]) == int(b.ne[0]), "a->ne[0] == b->ne[0]", fn)
    ggml_assert(int(a.ne[2]) == int(b.ne[2]), "a->ne[2] == b->ne[2]", fn)
    ggml_assert(int(a.ne[3]) == int(b.ne[3]), "a->ne[3] == b->ne[3]", fn)
    ggml_assert(int(b.ne[1]) == int(c.ne[0]), "b->ne[1] == c->ne[0]", fn)
    ggml_assert(int(b.ne[2]) % int(c.ne[1]) == 0, "b->ne[2] % c->ne[1] == 0", fn)
    ggml_assert(int(b.ne[3]) % int(c.ne[2]) == 0, "b->ne[3] % c->ne[2] == 0", fn)
    ggml_assert(int(c.ne[3]) == 1, "c->ne[3] == 1", fn)
    ggml_assert(b.type == GGMLType.F32, "b->type == GGML_TYPE_F32", fn)
    ggml_assert(c.type in (GGMLType.I64, GGMLType.I32),
                "c->type == GGML_TYPE_I64 || c->type == GGML_TYPE_I32", fn)
    ggml_assert(ggml_is_contiguous_rows(a), "ggml_is_contiguous_rows(a)", fn)
    ggml_assert(ggml_is_contiguous_rows(b), "ggml_is_contiguous_rows(b)", fn)
    result = ggml_view_tensor(ctx, a)
    return set_op_src(result, GGMLOp.SET_ROWS, b, c, a)


# --- diag_mask -------------------------------------------------------------------------------

def _diag_mask(ctx: Context, a: Tensor, n_past: int, inplace: bool, op: GGMLOp) -> Tensor:
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, i32_params(n_past))
    return set_op_src(result, op, a)


@op
def ggml_diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_inf: set a[i, j] = -inf where i > n_past + j (the causal mask)."""
    return _diag_mask(ctx, a, n_past, False, GGMLOp.DIAG_MASK_INF)


@op
def ggml_diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_inf_inplace."""
    return _diag_mask(ctx, a, n_past, True, GGMLOp.DIAG_MASK_INF)


@op
def ggml_diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_zero: set a[i, j] = 0 where i > n_past + j."""
    return _diag_mask(ctx, a, n_past, False, GGMLOp.DIAG_MASK_ZERO)


@op
def ggml_diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_zero_inplace."""
    return _diag_mask(ctx, a, n_past, True, GGMLOp.DIAG_MASK_ZERO)


# --- soft_max --------------------------------------------------------------------------------

def _soft_max(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float,
              inplace: bool, fn: str) -> Tensor:
    """ggml_soft_max_impl: softmax(a*scale + slope*mask) along dim 0."""
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    if mask is not None:
        ggml_assert(mask.type in (GGMLType.F16, GGMLType.F32),
                    "mask->type == GGML_TYPE_F16 || mask->type == GGML_TYPE_F32", fn)
        ggml_assert(ggml_is_contiguous(mask), "ggml_is_contiguous(mask)", fn)
        ggml_assert(int(mask.ne[0]) == int(a.ne[0]), "mask->ne[0] == a->ne[0]", fn)
        ggml_assert(int(mask.ne[1]) >= int(a.ne[1]), "mask->ne[1] >= a->ne[1]", fn)
        ggml_assert(int(a.ne[2]) % int(mask.ne[2]) == 0, "a->ne[2]%mask->ne[2] == 0", fn)
        ggml_assert(int(a.ne[3]) % int(mask.ne[3]) == 0, "a->ne[3]%mask->ne[3] == 0", fn)
    if F32(max_bias) > 0:
        ggml_assert(mask is not None, "mask", fn, "ALiBi (max_bias > 0) needs a mask")
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params(result, f32_params(scale, max_bias))
    return set_op_src(result, GGMLOp.SOFT_MAX, a, mask)


@op
def ggml_soft_max(ctx: Context, a: Tensor) -> Tensor:
    """ggml_soft_max: softmax along dim 0 (scale 1, no mask, no ALiBi)."""
    return _soft_max(ctx, a, None, 1.0, 0.0, False, "ggml_soft_max")


@op
def ggml_soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_soft_max_inplace."""
    return _soft_max(ctx, a, None, 1.0, 0.0, True, "ggml_soft_max_inplace")


@op
def ggml_soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                      max_bias: float) -> Tensor:
    """ggml_soft_max_ext: softmax(a*scale + slope*mask); mask F16/F32, broadcast over dims 2, 3
    by modulo; slope is 1, or the ALiBi slope of head i2 when max_bias > 0."""
    return _soft_max(ctx, a, mask, scale, max_bias, False, "ggml_soft_max_ext")


@op
def ggml_soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                              max_bias: float) -> Tensor:
    """ggml_soft_max_ext_inplace."""
    return _soft_max(ctx, a, mask, scale, max_bias, True, "ggml_soft_max_ext_inplace")


@op
def ggml_soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_soft_max_add_sinks: one extra logit per head (F32 [a.ne2]) joins each row's softmax."""
    if sinks is None:
        a.src[2] = None
        return
    fn = "ggml_soft_max_add_sinks"
    ggml_assert(a.op == GGMLOp.SOFT_MAX, "a->op == GGML_OP_SOFT_MAX", fn)
    ggml_assert(a.src[2] is None, "a->src[2] == NULL", fn)
    ggml_assert(int(a.source(0).ne[2]) == int(sinks.ne[0]), "a->src[0]->ne[2] == sinks->ne[0]", fn)
    ggml_assert(sinks.type == GGMLType.F32, "sinks->type == GGML_TYPE_F32", fn)
    a.src[2] = sinks


# --- pooling ---------------------------------------------------------------------------------

def _pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    """ggml_calc_pool_output_size: computed in float (p is a float), then truncated."""
    return int((F32(ins) + F32(2) * F32(p) - F32(ks)) / F32(s) + F32(1))


@op
def ggml_pool_1d(ctx: Context, a: Tensor, op: int, k0: int, s0: int, p0: int) -> Tensor:
    """ggml_pool_1d: max or average over windows of k0 along dim 0 -> F32."""
    ne = [_pool_output_size(int(a.ne[0]), k0, s0, p0), int(a.ne[1]), int(a.ne[2]), int(a.ne[3])]
    ggml_assert(ne[0] > 0, "ne[0] > 0", "ggml_pool_1d", f"output length {ne[0]}")
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, i32_params(op, k0, s0, p0))
    return set_op_src(result, GGMLOp.POOL_1D, a)


@op
def ggml_pool_2d(ctx: Context, a: Tensor, op: int, k0: int, k1: int, s0: int, s1: int, p0: float,
                 p1: float) -> Tensor:
    """ggml_pool_2d: max or average over k0 x k1 windows of each plane -> F32.

    The paddings are floats for the size; op_params keep them as int32 (truncated), as C does.
    """
    ne = [_pool_output_size(int(a.ne[0]), k0, s0, p0),
          _pool_output_size(int(a.ne[1]), k1, s1, p1), int(a.ne[2]), int(a.ne[3])]
    ggml_assert(ne[0] > 0, "ne[0] > 0", "ggml_pool_2d", f"output width {ne[0]}")
    ggml_assert(ne[1] > 0, "ne[1] > 0", "ggml_pool_2d", f"output height {ne[1]}")
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, i32_params(op, k0, k1, s0, s1, int(F32(p0)), int(F32(p1))))
    return set_op_src(result, GGMLOp.POOL_2D, a)


# --- upscale / interpolate, pad, roll, timestep_embedding -------------------------------------

def _interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                 mode: int) -> Tensor:
    """ggml_interpolate_impl: op UPSCALE, op_params[0] = mode | flags."""
    fn = "ggml_interpolate_impl"
    ggml_assert((mode & 0xFF) < GGML_SCALE_MODE_COUNT, "(mode & 0xFF) < GGML_SCALE_MODE_COUNT", fn)
    ggml_assert(not (mode & GGML_SCALE_FLAG_ANTIALIAS)
                or (mode & 0xFF) == GGML_SCALE_MODE_BILINEAR,
                "!(mode & GGML_SCALE_FLAG_ANTIALIAS) || (mode & 0xFF) == GGML_SCALE_MODE_BILINEAR",
                fn)
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", fn)
    result = ggml_new_tensor_4d(ctx, a.type, ne0, ne1, ne2, ne3)
    ggml_set_op_params_i32(result, 0, int(np.uint32(mode).view(np.int32)))
    return set_op_src(result, GGMLOp.UPSCALE, a)


@op
def ggml_upscale(ctx: Context, a: Tensor, scale_factor: int, mode: int) -> Tensor:
    """ggml_upscale: dims 0 and 1 times scale_factor (> 1)."""
    ggml_assert(scale_factor > 1, "scale_factor > 1", "ggml_upscale")
    return _interpolate(ctx, a, int(a.ne[0]) * scale_factor, int(a.ne[1]) * scale_factor,
                        int(a.ne[2]), int(a.ne[3]), mode)


@op
def ggml_upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                     mode: int) -> Tensor:
    """ggml_upscale_ext (deprecated in ggml.h for ggml_interpolate)."""
    return _interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


@op
def ggml_interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                     mode: int) -> Tensor:
    """ggml_interpolate: resample a to [ne0, ne1, ne2, ne3] (nearest, bilinear or bicubic in
    dims 0 and 1; nearest in dims 2 and 3)."""
    return _interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


@op
def ggml_pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int,
                 rp2: int, lp3: int, rp3: int) -> Tensor:
    """ggml_pad_ext: zeros before (lp) and after (rp) a in each dim."""
    ne = shape_of(a)
    result = ggml_new_tensor_4d(ctx, a.type, ne[0] + lp0 + rp0, ne[1] + lp1 + rp1,
                                ne[2] + lp2 + rp2, ne[3] + lp3 + rp3)
    for i, v in enumerate((lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, 0)):
        ggml_set_op_params_i32(result, i, v)  # [8] = 0: not circular
    return set_op_src(result, GGMLOp.PAD, a)


@op
def ggml_pad_ext_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int,
                          lp2: int, rp2: int, lp3: int, rp3: int) -> Tensor:
    """ggml_pad_ext_circular: pad by wrapping around (a torus) instead of zeros."""
    result = ggml_pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)
    ggml_set_op_params_i32(result, 8, 1)
    return result


@op
def ggml_pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """ggml_pad: zeros after a in each dim."""
    return ggml_pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


@op
def ggml_pad_circular(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """ggml_pad_circular."""
    return ggml_pad_ext_circular(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


@op
def ggml_pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    """ggml_pad_reflect_1d: each row padded by reflection, p0 before and p1 after (F32);
    op_params = {p0, p1}."""
    fn = "ggml_pad_reflect_1d"
    ggml_assert(p0 >= 0, "p0 >= 0", fn)
    ggml_assert(p1 >= 0, "p1 >= 0", fn)
    ggml_assert(p0 < int(a.ne[0]), "p0 < a->ne[0]", fn, "padding must be shorter than the row")
    ggml_assert(p1 < int(a.ne[0]), "p1 < a->ne[0]", fn, "padding must be shorter than the row")
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", fn)
    result = ggml_new_tensor_4d(ctx, a.type, int(a.ne[0]) + p0 + p1, int(a.ne[1]), int(a.ne[2]), int(a.ne[3]))
    ggml_set_op_params(result, i32_params(p0, p1))
    return set_op_src(result, GGMLOp.PAD_REFLECT_1D, a)



@op
def ggml_roll(ctx: Context, a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    """ggml_roll: a with every dimension rotated by its shift (elements pushed off one end come
    back at the other); op_params = the four shifts."""
    fn = "ggml_roll"
    ggml_assert(int(a.nb[0]) == TYPE_TRAITS[a.type].type_size, "a->nb[0] == ggml_type_size(a->type)", fn)
    for i, s in enumerate((shift0, shift1, shift2, shift3)):
        ggml_assert(abs(int(s)) < int(a.ne[i]), f"abs(shift{i}) < a->ne[{i}]", fn,
                    f"shift {s} in a dimension of {int(a.ne[i])}")
    result = ggml_dup_tensor(ctx, a)
    for i, s in enumerate((shift0, shift1, shift2, shift3)):
        ggml_set_op_params_i32(result, i, int(s))
    return set_op_src(result, GGMLOp.ROLL, a)



@op
def ggml_timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """ggml_timestep_embedding: sinusoidal embedding F32 [dim, n] of n timesteps (diffusion)."""
    result = ggml_new_tensor_2d(ctx, GGMLType.F32, dim, int(timesteps.ne[0]))
    ggml_set_op_params_i32(result, 0, dim)
    ggml_set_op_params_i32(result, 1, max_period)
    return set_op_src(result, GGMLOp.TIMESTEP_EMBEDDING, timesteps)


# --- flash attention -------------------------------------------------------------------------

@op
def ggml_flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                        scale: float, max_bias: float, logit_softcap: float) -> Tensor:
    """ggml_flash_attn_ext: softmax(scale·K·Q (+softcap) + slope·mask) · V in one op.

    q [DK, n_q, n_head, n_batch], k [DK, n_kv, n_head_kv, n_batch], v [DV, n_kv, n_head_kv, ..]
    (K/V heads shared by n_head/n_head_kv query heads: GQA), mask F16 [n_kv, >= n_q, ...].
    The result is F32 [DV, n_head, n_q, n_batch]: heads and tokens swapped, ready for a reshape.
    """
    fn = "ggml_flash_attn_ext"
    ggml_assert(int(k.ne[0]) == int(q.ne[0]) and int(q.ne[2]) % int(k.ne[2]) == 0
                and int(q.ne[3]) % int(k.ne[3]) == 0, "ggml_can_mul_mat(k, q)", fn,
                f"k {shape_of(k)}, q {shape_of(q)}")
    ggml_assert(int(q.ne[3]) == int(k.ne[3]), "q->ne[3] == k->ne[3]", fn)
    ggml_assert(int(q.ne[3]) == int(v.ne[3]), "q->ne[3] == v->ne[3]", fn)
    if mask is not None:
        ggml_assert(mask.type == GGMLType.F16, "mask->type == GGML_TYPE_F16", fn)
        ggml_assert(ggml_is_contiguous(mask), "ggml_is_contiguous(mask)", fn)
        ggml_assert(int(q.ne[2]) % int(mask.ne[2]) == 0, "q->ne[2] % mask->ne[2] == 0", fn)
        ggml_assert(int(q.ne[3]) % int(mask.ne[3]) == 0, "q->ne[3] % mask->ne[3] == 0", fn)
    if F32(max_bias) > 0:
        ggml_assert(mask is not None, "mask", fn, "ALiBi (max_bias > 0) needs a mask")
    ne = [int(v.ne[0]), int(q.ne[2]), int(q.ne[1]), int(q.ne[3])]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, f32_params(scale, max_bias, logit_softcap))
    return set_op_src(result, GGMLOp.FLASH_ATTN_EXT, q, k, v, mask)


@op
def ggml_flash_attn_ext_set_prec(a: Tensor, prec: int) -> None:
    """ggml_flash_attn_ext_set_prec: op_params[3] = prec (GGML_PREC_DEFAULT or GGML_PREC_F32)."""
    ggml_assert(a.op == GGMLOp.FLASH_ATTN_EXT, "a->op == GGML_OP_FLASH_ATTN_EXT",
                "ggml_flash_attn_ext_set_prec")
    ggml_set_op_params_i32(a, 3, prec)


@op
def ggml_flash_attn_ext_get_prec(a: Tensor) -> int:
    """ggml_flash_attn_ext_get_prec."""
    ggml_assert(a.op == GGMLOp.FLASH_ATTN_EXT, "a->op == GGML_OP_FLASH_ATTN_EXT",
                "ggml_flash_attn_ext_get_prec")
    return int(a.op_params[3])


@op
def ggml_flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_flash_attn_ext_add_sinks: one extra logit per query head (F32 [n_head]) in src[4]."""
    if sinks is None:
        a.src[4] = None
        return
    fn = "ggml_flash_attn_ext_add_sinks"
    ggml_assert(a.op == GGMLOp.FLASH_ATTN_EXT, "a->op == GGML_OP_FLASH_ATTN_EXT", fn)
    ggml_assert(a.src[4] is None, "a->src[4] == NULL", fn)
    ggml_assert(int(a.source(0).ne[2]) == int(sinks.ne[0]), "a->src[0]->ne[2] == sinks->ne[0]", fn)
    ggml_assert(sinks.type == GGMLType.F32, "sinks->type == GGML_TYPE_F32", fn)
    a.src[4] = sinks


# --- Segment Anything's windows and relative positions ----------------------------------------

@op
def ggml_win_part(ctx: Context, a: Tensor, w: int) -> Tensor:
    """ggml_win_part: an image [C, W, H] cut into w×w windows [C, w, w, n_windows], zero-padded;
    op_params = {windows across, windows down, w}."""
    ggml_assert(int(a.ne[3]) == 1, "a->ne[3] == 1", "ggml_win_part")
    ggml_assert(a.type == GGMLType.F32, "a->type  == GGML_TYPE_F32", "ggml_win_part")
    px, py = (w - int(a.ne[1]) % w) % w, (w - int(a.ne[2]) % w) % w
    npx, npy = (px + int(a.ne[1])) // w, (py + int(a.ne[2])) // w
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [int(a.ne[0]), w, w, npx * npy])
    ggml_set_op_params(result, i32_params(npx, npy, w))
    return set_op_src(result, GGMLOp.WIN_PART, a)


@op
def ggml_win_unpart(ctx: Context, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    """ggml_win_unpart: w×w windows put back together into [C, w0, h0] (the padding dropped)."""
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", "ggml_win_unpart")
    result = ggml_new_tensor(ctx, GGMLType.F32, 3, [int(a.ne[0]), w0, h0, 1])
    ggml_set_op_params(result, i32_params(w))
    return set_op_src(result, GGMLOp.WIN_UNPART, a)


@op
def ggml_get_rel_pos(ctx: Context, a: Tensor, qh: int, kh: int) -> Tensor:
    """ggml_get_rel_pos: from a table of 2·h - 1 relative positions, the F16 [C, kh, qh] of each
    (query, key) pair's row."""
    ggml_assert(qh == kh, "qh == kh", "ggml_get_rel_pos")
    ggml_assert(2 * max(qh, kh) - 1 == int(a.ne[1]), "2*MAX(qh, kh) - 1 == a->ne[1]", "ggml_get_rel_pos")
    return set_op_src(ggml_new_tensor(ctx, GGMLType.F16, 3, [int(a.ne[0]), kh, qh, 1]), GGMLOp.GET_REL_POS, a)


def _add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor, inplace: bool) -> Tensor:
    fn = "ggml_add_rel_pos_impl"
    ggml_assert(shape_of(pw) == shape_of(ph), "ggml_are_same_shape(pw, ph)", fn)
    for t, name in ((a, "a"), (pw, "pw"), (ph, "ph")):
        ggml_assert(ggml_is_contiguous(t), f"ggml_is_contiguous({name})", fn)
    ggml_assert(ph.type == GGMLType.F32, "ph->type == GGML_TYPE_F32", fn)
    ggml_assert(pw.type == GGMLType.F32, "pw->type == GGML_TYPE_F32", fn)
    ggml_assert(int(pw.ne[3]) == int(a.ne[2]), "pw->ne[3] == a->ne[2]", fn)
    ggml_assert(int(pw.ne[0]) ** 2 == int(a.ne[0]), "pw->ne[0]*pw->ne[0] == a->ne[0]", fn)
    ggml_assert(int(pw.ne[1]) * int(pw.ne[2]) == int(a.ne[1]), "pw->ne[1]*pw->ne[2] == a->ne[1]", fn)
    result = dup_or_view(ctx, a, inplace)
    ggml_set_op_params_i32(result, 0, 1 if inplace else 0)
    return set_op_src(result, GGMLOp.ADD_REL_POS, a, pw, ph)


@op
def ggml_add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """ggml_add_rel_pos: attention scores a plus the decomposed relative positions: each k×k
    block gets ph[row] added along its rows and pw[col] along its columns."""
    return _add_rel_pos(ctx, a, pw, ph, False)


@op
def ggml_add_rel_pos_inplace(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """ggml_add_rel_pos_inplace: the same, into a view of a."""
    return _add_rel_pos(ctx, a, pw, ph, True)
