"""Op constructors for neural-network ops: rows, masks, softmax, RoPE, convolution, pooling,
resampling, padding, timestep embedding and flash attention.

Mirrors the corresponding graph-building functions of ggml.c (oracle version 0.15.3): the result's
shape and type, `op_params` packed exactly as ggml packs them, the `src` slots (set_rows' odd
order included), automatic names, and ggml's GGML_ASSERTs with their condition text. As in
engine/ops/base.py, nothing here computes; the kernels live in engine/compute/kernels/.

Leaves out: the backward ops (get_rows_back, soft_max_ext_back, im2col_back, pool_2d_back),
im2col_3d / conv_3d, depthwise and transposed convolutions, pad_reflect_1d and roll.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from engine import libm
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.ops.base import _ne, _record, ggml_cont, ggml_mul_mat, ggml_permute, ggml_reshape_2d, \
    ggml_reshape_3d, ggml_reshape_4d, ggml_set_op_params, ggml_set_op_params_i32
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_dup_tensor, ggml_is_contiguous, ggml_is_contiguous_rows, \
    ggml_is_vector, ggml_new_tensor, ggml_new_tensor_2d, ggml_new_tensor_4d, ggml_view_tensor
from engine.core.types import GGMLType

# --- constants of ggml.h used by these ops ----------------------------------------------------

GGML_ROPE_TYPE_NORMAL = 0
GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_VISION = 24
GGML_ROPE_TYPE_IMROPE = 40  # binary 101000: MROPE with interleaved sections
GGML_MROPE_SECTIONS = 4

GGML_OP_POOL_MAX = 0  # enum ggml_op_pool
GGML_OP_POOL_AVG = 1
GGML_OP_POOL_COUNT = 2

GGML_SCALE_MODE_NEAREST = 0  # enum ggml_scale_mode (low byte of the upscale mode)
GGML_SCALE_MODE_BILINEAR = 1
GGML_SCALE_MODE_BICUBIC = 2
GGML_SCALE_MODE_COUNT = 3
GGML_SCALE_FLAG_ALIGN_CORNERS = 1 << 8
GGML_SCALE_FLAG_ANTIALIAS = 1 << 9

GGML_PREC_DEFAULT = 0
GGML_PREC_F32 = 10

_F32 = np.float32



def _f32_params(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _i32_params(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


def _c_div(a: int, b: int) -> int:
    """C integer division: truncates toward zero (Python's // floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# --- get_rows, set_rows ----------------------------------------------------------------------

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
    return _record(result, GGMLOp.GET_ROWS, a, b)


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
    return _record(result, GGMLOp.SET_ROWS, b, c, a)


# --- diag_mask -------------------------------------------------------------------------------

def _diag_mask(ctx: Context, a: Tensor, n_past: int, inplace: bool, op: GGMLOp) -> Tensor:
    result = ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)
    ggml_set_op_params(result, _i32_params(n_past))
    return _record(result, op, a)


def ggml_diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_inf: set a[i, j] = -inf where i > n_past + j (the causal mask)."""
    return _diag_mask(ctx, a, n_past, False, GGMLOp.DIAG_MASK_INF)


def ggml_diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_inf_inplace."""
    return _diag_mask(ctx, a, n_past, True, GGMLOp.DIAG_MASK_INF)


def ggml_diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """ggml_diag_mask_zero: set a[i, j] = 0 where i > n_past + j."""
    return _diag_mask(ctx, a, n_past, False, GGMLOp.DIAG_MASK_ZERO)


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
    if _F32(max_bias) > 0:
        ggml_assert(mask is not None, "mask", fn, "ALiBi (max_bias > 0) needs a mask")
    result = ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)
    ggml_set_op_params(result, _f32_params(scale, max_bias))
    return _record(result, GGMLOp.SOFT_MAX, a, mask)


def ggml_soft_max(ctx: Context, a: Tensor) -> Tensor:
    """ggml_soft_max: softmax along dim 0 (scale 1, no mask, no ALiBi)."""
    return _soft_max(ctx, a, None, 1.0, 0.0, False, "ggml_soft_max")


def ggml_soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    """ggml_soft_max_inplace."""
    return _soft_max(ctx, a, None, 1.0, 0.0, True, "ggml_soft_max_inplace")


def ggml_soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                      max_bias: float) -> Tensor:
    """ggml_soft_max_ext: softmax(a*scale + slope*mask); mask F16/F32, broadcast over dims 2, 3
    by modulo; slope is 1, or the ALiBi slope of head i2 when max_bias > 0."""
    return _soft_max(ctx, a, mask, scale, max_bias, False, "ggml_soft_max_ext")


def ggml_soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                              max_bias: float) -> Tensor:
    """ggml_soft_max_ext_inplace."""
    return _soft_max(ctx, a, mask, scale, max_bias, True, "ggml_soft_max_ext_inplace")


def ggml_soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_soft_max_add_sinks: one extra logit per head (F32 [a.ne2]) joins each row's softmax."""
    if sinks is None:
        a.src[2] = None
        return
    fn = "ggml_soft_max_add_sinks"
    ggml_assert(a.op == GGMLOp.SOFT_MAX, "a->op == GGML_OP_SOFT_MAX", fn)
    ggml_assert(a.src[2] is None, "a->src[2] == NULL", fn)
    ggml_assert(int(a.src[0].ne[2]) == int(sinks.ne[0]), "a->src[0]->ne[2] == sinks->ne[0]", fn)
    ggml_assert(sinks.type == GGMLType.F32, "sinks->type == GGML_TYPE_F32", fn)
    a.src[2] = sinks


# --- rope ------------------------------------------------------------------------------------

def _rope(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
          sections: list[int] | None, mode: int, n_ctx_orig: int, freq_base: float,
          freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
          beta_slow: float, inplace: bool, fn: str) -> Tensor:
    """ggml_rope_impl: 15 op_params, floats stored in int32 slots."""
    ggml_assert((mode & 1) == 0, '(mode & 1) == 0 && "mode & 1 == 1 is no longer supported"', fn)
    ggml_assert(ggml_is_vector(b), "ggml_is_vector(b)", fn)
    ggml_assert(b.type == GGMLType.I32, "b->type == GGML_TYPE_I32", fn)
    mrope_used = bool(mode & GGML_ROPE_TYPE_MROPE)
    if mrope_used:
        ggml_assert(int(a.ne[2]) * 4 == int(b.ne[0]), "a->ne[2] * 4 == b->ne[0]", fn,
                    "multi-rope needs 4 positions per token")
    else:
        ggml_assert(int(a.ne[2]) == int(b.ne[0]), "a->ne[2] == b->ne[0]", fn,
                    f"{int(a.ne[2])} tokens but {int(b.ne[0])} positions")
    if c is not None:
        ggml_assert(c.type == GGMLType.F32, "c->type == GGML_TYPE_F32", fn)
        ggml_assert(int(c.ne[0]) >= n_dims // 2, "c->ne[0] >= n_dims / 2", fn)
    result = ggml_view_tensor(ctx, a) if inplace else ggml_dup_tensor(ctx, a)
    sect = list(sections) if (mrope_used and sections is not None) else [0] * GGML_MROPE_SECTIONS
    params = _i32_params(0, n_dims, mode, 0, n_ctx_orig)  # n_past and n_ctx are always 0
    params += _f32_params(freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    params += _i32_params(*sect)
    ggml_set_op_params(result, params)
    return _record(result, GGMLOp.ROPE, a, b, c)


def ggml_rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    """ggml_rope: rotary position embedding of the first n_dims of each row; b = I32 positions
    (one per a.ne2). Defaults: freq_base 10000, freq_scale 1, no YaRN."""
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False,
                 "ggml_rope")


def ggml_rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    """ggml_rope_inplace."""
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, True,
                 "ggml_rope_inplace")


def ggml_rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                  n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                  attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_ext: rope with optional freq_factors c (F32, >= n_dims/2) and YaRN parameters."""
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False, "ggml_rope_ext")


def ggml_rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                          mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
                          ext_factor: float, attn_factor: float, beta_fast: float,
                          beta_slow: float) -> Tensor:
    """ggml_rope_ext_inplace."""
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, True, "ggml_rope_ext_inplace")


def ggml_rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                    sections: list[int], mode: int, n_ctx_orig: int, freq_base: float,
                    freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
                    beta_slow: float) -> Tensor:
    """ggml_rope_multi: M-RoPE (t, h, w, e positions per token, 4·a.ne2 of them in b) with the
    rotary dims split into `sections`."""
    return _rope(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, False, "ggml_rope_multi")


def ggml_rope_multi_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                            sections: list[int], mode: int, n_ctx_orig: int, freq_base: float,
                            freq_scale: float, ext_factor: float, attn_factor: float,
                            beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_multi_inplace."""
    return _rope(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, True, "ggml_rope_multi_inplace")


def ggml_rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                       mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
                       ext_factor: float, attn_factor: float, beta_fast: float,
                       beta_slow: float) -> Tensor:
    """ggml_rope_ext_back: the inverse rotation (op ROPE_BACK: sin's sign flipped)."""
    result = ggml_rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                           ext_factor, attn_factor, beta_fast, beta_slow)
    result.op = GGMLOp.ROPE_BACK
    return result


def _rope_yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> np.float32:
    """ggml_rope_yarn_corr_dim: n_dims·ln(n_ctx_orig / (n_rot·2π)) / (2·ln(base)), in float."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = _F32(n_ctx_orig) / (_F32(n_rot) * _F32(2) * _F32(math.pi))
        return (_F32(n_dims) * libm.scalar(libm.logf, ratio)
                / (_F32(2) * libm.scalar(libm.logf, base)))


def ggml_rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                             beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the first and last rotary dims YaRN blends (float math)."""
    start = np.floor(_rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base))
    end = np.ceil(_rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base))
    # MAX(0, start) and MIN(n_dims - 1, end) as C's macros evaluate them
    return (0.0 if 0 > start else float(start),
            float(n_dims - 1) if n_dims - 1 < end else float(end))


# --- im2col and convolution ------------------------------------------------------------------

def _conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size (C integer division)."""
    return _c_div(ins + 2 * p - d * (ks - 1) - 1, s) + 1


def ggml_im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                d1: int, is_2D: bool, dst_type: int) -> Tensor:
    """ggml_im2col: the patches of image b that kernel a would see, one row per output pixel.

    2-D: a [KW, KH, IC, OC], b [W, H, IC, N] -> [IC·KH·KW, OW, OH, N];
    1-D: a [K, IC, OC],      b [L, IC, N]    -> [IC·K, OL, N, 1].
    """
    fn = "ggml_im2col"
    if is_2D:
        ggml_assert(int(a.ne[2]) == int(b.ne[2]), "a->ne[2] == b->ne[2]", fn)
    else:
        ggml_assert(int(b.ne[1]) == int(a.ne[1]), "b->ne[1] == a->ne[1]", fn)
        ggml_assert(int(b.ne[3]) == 1, "b->ne[3] == 1", fn)
    oh = _conv_output_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1) if is_2D else 0
    ow = _conv_output_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0)
    ggml_assert(not is_2D or oh > 0, '(!is_2D || OH > 0) && "b too small compared to a"', fn,
                f"OH = {oh}")
    ggml_assert(ow > 0, '(OW > 0) && "b too small compared to a"', fn, f"OW = {ow}")
    a_ne = _ne(a)
    ne = [a_ne[2] * a_ne[1] * a_ne[0] if is_2D else a_ne[1] * a_ne[0], ow,
          oh if is_2D else int(b.ne[2]), int(b.ne[3]) if is_2D else 1]
    result = ggml_new_tensor(ctx, dst_type, 4, ne)
    ggml_set_op_params(result, _i32_params(s0, s1, p0, p1, d0, d1, 1 if is_2D else 0))
    return _record(result, GGMLOp.IM2COL, a, b)


def ggml_conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_1d: im2col (F16) then mul_mat; a [K, IC, OC] (F16), b [L, IC, N]."""
    im2col = ggml_im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, GGMLType.F16)
    i_ne, a_ne = _ne(im2col), _ne(a)
    result = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, im2col, i_ne[0], i_ne[2] * i_ne[1]),
                          ggml_reshape_2d(ctx, a, a_ne[0] * a_ne[1], a_ne[2]))
    return ggml_reshape_3d(ctx, result, i_ne[1], a_ne[2], i_ne[2])


def ggml_conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                 d1: int) -> Tensor:
    """ggml_conv_2d: im2col (of a's type) -> mul_mat -> reshape -> permute -> cont.

    a [KW, KH, IC, OC], b [W, H, IC, N] -> [OW, OH, OC, N].
    """
    im2col = ggml_im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, a.type)
    i_ne, a_ne = _ne(im2col), _ne(a)
    result = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, im2col, i_ne[0], i_ne[3] * i_ne[2] * i_ne[1]),
                          ggml_reshape_2d(ctx, a, a_ne[0] * a_ne[1] * a_ne[2], a_ne[3]))
    result = ggml_reshape_4d(ctx, result, i_ne[1], i_ne[2], i_ne[3], a_ne[3])
    return ggml_cont(ctx, ggml_permute(ctx, result, 0, 1, 3, 2))


def ggml_conv_2d_sk_p0(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_conv_2d_sk_p0: stride = kernel size, no padding (non-overlapping patches)."""
    return ggml_conv_2d(ctx, a, b, int(a.ne[0]), int(a.ne[1]), 0, 0, 1, 1)


def ggml_conv_2d_s1_ph(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_conv_2d_s1_ph: stride 1, half padding ("same" size for odd kernels)."""
    return ggml_conv_2d(ctx, a, b, 1, 1, int(a.ne[0]) // 2, int(a.ne[1]) // 2, 1, 1)


def ggml_conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int,
                        d0: int, d1: int) -> Tensor:
    """ggml_conv_2d_direct: one CONV_2D op; a [KW, KH, IC, OC], b [W, H, IC, N] ->
    b.type [OW, OH, OC, N]."""
    ggml_assert(int(a.ne[2]) == int(b.ne[2]), "a->ne[2] == b->ne[2]", "ggml_conv_2d_direct")
    ne = [_conv_output_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0),
          _conv_output_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1), int(a.ne[3]), int(b.ne[3])]
    result = ggml_new_tensor(ctx, b.type, 4, ne)
    for i, v in enumerate((s0, s1, p0, p1, d0, d1)):
        ggml_set_op_params_i32(result, i, v)
    return _record(result, GGMLOp.CONV_2D, a, b)


# --- pooling ---------------------------------------------------------------------------------

def _pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    """ggml_calc_pool_output_size: computed in float (p is a float), then truncated."""
    return int((_F32(ins) + _F32(2) * _F32(p) - _F32(ks)) / _F32(s) + _F32(1))


def ggml_pool_1d(ctx: Context, a: Tensor, op: int, k0: int, s0: int, p0: int) -> Tensor:
    """ggml_pool_1d: max or average over windows of k0 along dim 0 -> F32."""
    ne = [_pool_output_size(int(a.ne[0]), k0, s0, p0), int(a.ne[1]), int(a.ne[2]), int(a.ne[3])]
    ggml_assert(ne[0] > 0, "ne[0] > 0", "ggml_pool_1d", f"output length {ne[0]}")
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, _i32_params(op, k0, s0, p0))
    return _record(result, GGMLOp.POOL_1D, a)


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
    ggml_set_op_params(result, _i32_params(op, k0, k1, s0, s1, int(_F32(p0)), int(_F32(p1))))
    return _record(result, GGMLOp.POOL_2D, a)


# --- upscale / interpolate, pad, timestep_embedding ------------------------------------------

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
    return _record(result, GGMLOp.UPSCALE, a)


def ggml_upscale(ctx: Context, a: Tensor, scale_factor: int, mode: int) -> Tensor:
    """ggml_upscale: dims 0 and 1 times scale_factor (> 1)."""
    ggml_assert(scale_factor > 1, "scale_factor > 1", "ggml_upscale")
    return _interpolate(ctx, a, int(a.ne[0]) * scale_factor, int(a.ne[1]) * scale_factor,
                        int(a.ne[2]), int(a.ne[3]), mode)


def ggml_upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                     mode: int) -> Tensor:
    """ggml_upscale_ext (deprecated in ggml.h for ggml_interpolate)."""
    return _interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


def ggml_interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                     mode: int) -> Tensor:
    """ggml_interpolate: resample a to [ne0, ne1, ne2, ne3] (nearest, bilinear or bicubic in
    dims 0 and 1; nearest in dims 2 and 3)."""
    return _interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


def ggml_pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int,
                 rp2: int, lp3: int, rp3: int) -> Tensor:
    """ggml_pad_ext: zeros before (lp) and after (rp) a in each dim."""
    ne = _ne(a)
    result = ggml_new_tensor_4d(ctx, a.type, ne[0] + lp0 + rp0, ne[1] + lp1 + rp1,
                                ne[2] + lp2 + rp2, ne[3] + lp3 + rp3)
    for i, v in enumerate((lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, 0)):
        ggml_set_op_params_i32(result, i, v)  # [8] = 0: not circular
    return _record(result, GGMLOp.PAD, a)


def ggml_pad_ext_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int,
                          lp2: int, rp2: int, lp3: int, rp3: int) -> Tensor:
    """ggml_pad_ext_circular: pad by wrapping around (a torus) instead of zeros."""
    result = ggml_pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)
    ggml_set_op_params_i32(result, 8, 1)
    return result


def ggml_pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """ggml_pad: zeros after a in each dim."""
    return ggml_pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def ggml_pad_circular(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """ggml_pad_circular."""
    return ggml_pad_ext_circular(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def ggml_timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """ggml_timestep_embedding: sinusoidal embedding F32 [dim, n] of n timesteps (diffusion)."""
    result = ggml_new_tensor_2d(ctx, GGMLType.F32, dim, int(timesteps.ne[0]))
    ggml_set_op_params_i32(result, 0, dim)
    ggml_set_op_params_i32(result, 1, max_period)
    return _record(result, GGMLOp.TIMESTEP_EMBEDDING, timesteps)


# --- flash attention -------------------------------------------------------------------------

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
                f"k {_ne(k)}, q {_ne(q)}")
    ggml_assert(int(q.ne[3]) == int(k.ne[3]), "q->ne[3] == k->ne[3]", fn)
    ggml_assert(int(q.ne[3]) == int(v.ne[3]), "q->ne[3] == v->ne[3]", fn)
    if mask is not None:
        ggml_assert(mask.type == GGMLType.F16, "mask->type == GGML_TYPE_F16", fn)
        ggml_assert(ggml_is_contiguous(mask), "ggml_is_contiguous(mask)", fn)
        ggml_assert(int(q.ne[2]) % int(mask.ne[2]) == 0, "q->ne[2] % mask->ne[2] == 0", fn)
        ggml_assert(int(q.ne[3]) % int(mask.ne[3]) == 0, "q->ne[3] % mask->ne[3] == 0", fn)
    if _F32(max_bias) > 0:
        ggml_assert(mask is not None, "mask", fn, "ALiBi (max_bias > 0) needs a mask")
    ne = [int(v.ne[0]), int(q.ne[2]), int(q.ne[1]), int(q.ne[3])]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, _f32_params(scale, max_bias, logit_softcap))
    return _record(result, GGMLOp.FLASH_ATTN_EXT, q, k, v, mask)


def ggml_flash_attn_ext_set_prec(a: Tensor, prec: int) -> None:
    """ggml_flash_attn_ext_set_prec: op_params[3] = prec (GGML_PREC_DEFAULT or GGML_PREC_F32)."""
    ggml_assert(a.op == GGMLOp.FLASH_ATTN_EXT, "a->op == GGML_OP_FLASH_ATTN_EXT",
                "ggml_flash_attn_ext_set_prec")
    ggml_set_op_params_i32(a, 3, prec)


def ggml_flash_attn_ext_get_prec(a: Tensor) -> int:
    """ggml_flash_attn_ext_get_prec."""
    ggml_assert(a.op == GGMLOp.FLASH_ATTN_EXT, "a->op == GGML_OP_FLASH_ATTN_EXT",
                "ggml_flash_attn_ext_get_prec")
    return int(a.op_params[3])


def ggml_flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_flash_attn_ext_add_sinks: one extra logit per query head (F32 [n_head]) in src[4]."""
    if sinks is None:
        a.src[4] = None
        return
    fn = "ggml_flash_attn_ext_add_sinks"
    ggml_assert(a.op == GGMLOp.FLASH_ATTN_EXT, "a->op == GGML_OP_FLASH_ATTN_EXT", fn)
    ggml_assert(a.src[4] is None, "a->src[4] == NULL", fn)
    ggml_assert(int(a.src[0].ne[2]) == int(sinks.ne[0]), "a->src[0]->ne[2] == sinks->ne[0]", fn)
    ggml_assert(sinks.type == GGMLType.F32, "sinks->type == GGML_TYPE_F32", fn)
    a.src[4] = sinks
