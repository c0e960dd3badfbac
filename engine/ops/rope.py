"""RoPE op constructors: ggml_rope and its _ext, _multi, _custom (deprecated) and _inplace forms,
the ROPE_BACK forms (the inverse rotation) and YaRN's correction dims, as ggml.c builds them:
15 op_params (floats in int32 slots), src = (a, positions, freq_factors), and the GGML_ASSERTs
with ggml's condition text. The kernel is engine/compute/kernels/rope.py.
"""

from __future__ import annotations

import math

import numpy as np

from engine import libm
from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_vector
from engine.core.types import GGMLType, CFloat
from engine.ops.base import dup_or_view, f32_params, ggml_set_op_params, i32_params, set_op_src

GGML_ROPE_TYPE_NORMAL = 0
GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_VISION = 24
GGML_ROPE_TYPE_IMROPE = 40  # binary 101000: MROPE with interleaved sections
GGML_MROPE_SECTIONS = 4

F32 = np.float32


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
    result = dup_or_view(ctx, a, inplace)
    sect = list(sections) if (mrope_used and sections is not None) else [0] * GGML_MROPE_SECTIONS
    params = i32_params(0, n_dims, mode, 0, n_ctx_orig)  # n_past and n_ctx are always 0
    params += f32_params(freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    params += i32_params(*sect)
    ggml_set_op_params(result, params)
    return set_op_src(result, GGMLOp.ROPE, a, b, c)


@op
def ggml_rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    """ggml_rope: rotary position embedding of the first n_dims of each row; b = I32 positions
    (one per a.ne2). Defaults: freq_base 10000, freq_scale 1, no YaRN."""
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False,
                 "ggml_rope")


@op
def ggml_rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    """ggml_rope_inplace."""
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, True,
                 "ggml_rope_inplace")


@op
def ggml_rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                  n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                  attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_ext: rope with optional freq_factors c (F32, >= n_dims/2) and YaRN parameters."""
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False, "ggml_rope_ext")


@op
def ggml_rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                          mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
                          ext_factor: float, attn_factor: float, beta_fast: float,
                          beta_slow: float) -> Tensor:
    """ggml_rope_ext_inplace."""
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, True, "ggml_rope_ext_inplace")


@op
def ggml_rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                    sections: list[int], mode: int, n_ctx_orig: int, freq_base: float,
                    freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
                    beta_slow: float) -> Tensor:
    """ggml_rope_multi: M-RoPE (t, h, w, e positions per token, 4·a.ne2 of them in b) with the
    rotary dims split into `sections`."""
    return _rope(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, False, "ggml_rope_multi")


@op
def ggml_rope_multi_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                            sections: list[int], mode: int, n_ctx_orig: int, freq_base: float,
                            freq_scale: float, ext_factor: float, attn_factor: float,
                            beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_multi_inplace."""
    return _rope(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, True, "ggml_rope_multi_inplace")


@op
def ggml_rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                       mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
                       ext_factor: float, attn_factor: float, beta_fast: float,
                       beta_slow: float) -> Tensor:
    """ggml_rope_ext_back: the inverse rotation (op ROPE_BACK: sin's sign flipped)."""
    result = ggml_rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                           ext_factor, attn_factor, beta_fast, beta_slow)
    result.op = GGMLOp.ROPE_BACK
    return result


@op
def ggml_rope_multi_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                         sections: list[int], mode: int, n_ctx_orig: int, freq_base: float,
                         freq_scale: float, ext_factor: float, attn_factor: float,
                         beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_multi_back: ggml_rope_multi recorded as ROPE_BACK (the inverse rotation)."""
    result = ggml_rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base,
                             freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    result.op = GGMLOp.ROPE_BACK
    return result


@op
def ggml_rope_custom(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                     freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                     beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_custom (deprecated in ggml.h): ggml_rope_ext without frequency factors."""
    return ggml_rope_ext(ctx, a, b, None, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                         attn_factor, beta_fast, beta_slow)


@op
def ggml_rope_custom_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                             beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_custom_inplace (deprecated in ggml.h): ggml_rope_ext_inplace without frequency
    factors."""
    return ggml_rope_ext_inplace(ctx, a, b, None, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                                 attn_factor, beta_fast, beta_slow)


def _rope_yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: CFloat, base: CFloat) -> np.float32:
    """ggml_rope_yarn_corr_dim: n_dims·ln(n_ctx_orig / (n_rot·2π)) / (2·ln(base)), in float."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = F32(n_ctx_orig) / (F32(n_rot) * F32(2) * F32(math.pi))
        return (F32(n_dims) * libm.scalar(libm.logf, ratio)
                / (F32(2) * libm.scalar(libm.logf, base)))


@op
def ggml_rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: CFloat, beta_fast: CFloat,
                             beta_slow: CFloat) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the first and last rotary dims YaRN blends (float math)."""
    start = np.floor(_rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base))
    end = np.ceil(_rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base))
    # MAX(0, start) and MIN(n_dims - 1, end) as C's macros evaluate them
    return (0.0 if 0 > start else float(start),
            float(n_dims - 1) if n_dims - 1 < end else float(end))
