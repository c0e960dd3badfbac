"""Convolution op constructors: IM2COL, IM2COL_3D, COL2IM_1D, CONV_2D, CONV_2D_DW, CONV_3D,
CONV_TRANSPOSE_1D and CONV_TRANSPOSE_2D, and the convolutions ggml.c composes of im2col and
mul_mat (ggml_conv_1d, ggml_conv_2d, their depthwise and "same"-padding forms, ggml_conv_3d).
Each records as ggml.c does (shape, op_params, sources, GGML_ASSERTs with ggml's condition text);
the kernels are in engine/compute/kernels/conv.py. Pooling is in nn.py, IM2COL_BACK in backward.py.
"""

from __future__ import annotations

import struct

from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_is_contiguous_channels, ggml_is_matrix, \
    ggml_new_tensor
from engine.core.types import GGMLType, TYPE_TRAITS
from engine.ops.base import ggml_set_op_params, ggml_set_op_params_i32, i32_params, set_op_src, shape_of
from engine.ops.matmul import ggml_mul_mat
from engine.ops.views import ggml_cont, ggml_permute, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d


def _c_div(a: int, b: int) -> int:
    """C integer division: truncates toward zero (Python's // floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size (C integer division)."""
    return _c_div(ins + 2 * p - d * (ks - 1) - 1, s) + 1


# --- im2col; 1-d and 2-d convolution ---------------------------------------------------------

@op
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
    a_ne = shape_of(a)
    ne = [a_ne[2] * a_ne[1] * a_ne[0] if is_2D else a_ne[1] * a_ne[0], ow,
          oh if is_2D else int(b.ne[2]), int(b.ne[3]) if is_2D else 1]
    result = ggml_new_tensor(ctx, dst_type, 4, ne)
    ggml_set_op_params(result, i32_params(s0, s1, p0, p1, d0, d1, 1 if is_2D else 0))
    return set_op_src(result, GGMLOp.IM2COL, a, b)


@op
def ggml_conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_1d: im2col (F16) then mul_mat; a [K, IC, OC] (F16), b [L, IC, N]."""
    im2col = ggml_im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, GGMLType.F16)
    i_ne, a_ne = shape_of(im2col), shape_of(a)
    result = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, im2col, i_ne[0], i_ne[2] * i_ne[1]),
                          ggml_reshape_2d(ctx, a, a_ne[0] * a_ne[1], a_ne[2]))
    return ggml_reshape_3d(ctx, result, i_ne[1], a_ne[2], i_ne[2])


@op
def ggml_conv_1d_ph(ctx: Context, a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    """ggml_conv_1d_ph: ggml_conv_1d with half the kernel as padding ("same" length at s = 1)."""
    return ggml_conv_1d(ctx, a, b, s, int(a.ne[0]) // 2, d)


@op
def ggml_conv_1d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_1d_dw: depthwise 1-d convolution, each channel by its own kernel: im2col (F16) of
    b as channels of one, times the kernels, reshaped to [OL, C, 1]."""
    new_b = ggml_reshape_4d(ctx, b, int(b.ne[0]), 1, int(b.ne[1]), int(b.ne[2]))
    im2col = ggml_im2col(ctx, a, new_b, s0, 0, p0, 0, d0, 0, False, GGMLType.F16)
    result = ggml_mul_mat(ctx, im2col, a)
    return ggml_reshape_3d(ctx, result, int(result.ne[0]), int(result.ne[2]), 1)


@op
def ggml_conv_1d_dw_ph(ctx: Context, a: Tensor, b: Tensor, s0: int, d0: int) -> Tensor:
    """ggml_conv_1d_dw_ph: ggml_conv_1d_dw with half the kernel as padding."""
    return ggml_conv_1d_dw(ctx, a, b, s0, int(a.ne[0]) // 2, d0)


@op
def ggml_conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                 d1: int) -> Tensor:
    """ggml_conv_2d: im2col (of a's type) -> mul_mat -> reshape -> permute -> cont.

    a [KW, KH, IC, OC], b [W, H, IC, N] -> [OW, OH, OC, N].
    """
    im2col = ggml_im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, a.type)
    i_ne, a_ne = shape_of(im2col), shape_of(a)
    result = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, im2col, i_ne[0], i_ne[3] * i_ne[2] * i_ne[1]),
                          ggml_reshape_2d(ctx, a, a_ne[0] * a_ne[1] * a_ne[2], a_ne[3]))
    result = ggml_reshape_4d(ctx, result, i_ne[1], i_ne[2], i_ne[3], a_ne[3])
    return ggml_cont(ctx, ggml_permute(ctx, result, 0, 1, 3, 2))


@op
def ggml_conv_2d_sk_p0(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_conv_2d_sk_p0: stride = kernel size, no padding (non-overlapping patches)."""
    return ggml_conv_2d(ctx, a, b, int(a.ne[0]), int(a.ne[1]), 0, 0, 1, 1)


@op
def ggml_conv_2d_s1_ph(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_conv_2d_s1_ph: stride 1, half padding ("same" size for odd kernels)."""
    return ggml_conv_2d(ctx, a, b, 1, 1, int(a.ne[0]) // 2, int(a.ne[1]) // 2, 1, 1)


@op
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
    return set_op_src(result, GGMLOp.CONV_2D, a, b)


# --- depthwise 2-d convolution ---------------------------------------------------------------

@op
def ggml_conv_2d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                    d1: int) -> Tensor:
    """ggml_conv_2d_dw: depthwise 2-d convolution as ggml.c composes it: each channel an image
    of one channel (im2col, F16), times its own kernel, reshaped to [OW, OH, C, N]."""
    new_a = ggml_reshape_4d(ctx, a, int(a.ne[0]), int(a.ne[1]), 1, int(a.ne[2]) * int(a.ne[3]))
    im2col = ggml_im2col(ctx, new_a, ggml_reshape_4d(ctx, b, int(b.ne[0]), int(b.ne[1]), 1,
                                                      int(b.ne[2]) * int(b.ne[3])),
                         s0, s1, p0, p1, d0, d1, True, GGMLType.F16)
    new_b = ggml_reshape_4d(ctx, im2col, int(im2col.ne[0]), int(im2col.ne[2]) * int(im2col.ne[1]),
                            int(b.ne[2]), int(b.ne[3]))
    new_a = ggml_reshape_4d(ctx, new_a, int(new_a.ne[0]) * int(new_a.ne[1]), int(new_a.ne[2]),
                            int(new_a.ne[3]), 1)
    result = ggml_mul_mat(ctx, new_a, new_b)
    return ggml_reshape_4d(ctx, result, int(im2col.ne[1]), int(im2col.ne[2]), int(b.ne[2]), int(b.ne[3]))


@op
def ggml_conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                           dilation0: int, dilation1: int) -> Tensor:
    """ggml_conv_2d_dw_direct: depthwise 2-d convolution computed directly. a [KW, KH, 1, C] the
    kernels, b [W, H, C, N] the images; the result has b's type, and b's layout when b is
    channels-first in memory (CWHN); op_params = {s0, s1, p0, p1, d0, d1}."""
    fn = "ggml_conv_2d_dw_direct"
    ggml_assert(int(a.ne[2]) == 1, "a->ne[2] == 1", fn)
    ggml_assert(int(a.ne[3]) == int(b.ne[2]), "a->ne[3] == b->ne[2]", fn, "one kernel per channel")
    ow = _conv_output_size(int(b.ne[0]), int(a.ne[0]), stride0, pad0, dilation0)
    oh = _conv_output_size(int(b.ne[1]), int(a.ne[1]), stride1, pad1, dilation1)
    result = ggml_new_tensor(ctx, b.type, 4, [ow, oh, int(b.ne[2]), int(b.ne[3])])
    if ggml_is_contiguous_channels(b):  # the result permuted as b is: channels first in memory
        ts = TYPE_TRAITS[result.type].type_size
        ggml_assert(TYPE_TRAITS[result.type].blck_size == 1, "ggml_blck_size(result->type) == 1", fn)
        result.nb[0] = int(result.ne[2]) * ts
        result.nb[1] = int(result.ne[0]) * int(result.nb[0])
        result.nb[2] = ts
    ggml_set_op_params(result, struct.pack("<6i", stride0, stride1, pad0, pad1, dilation0, dilation1))
    return set_op_src(result, GGMLOp.CONV_2D_DW, a, b)


# --- transposed convolution, col2im ----------------------------------------------------------

@op
def ggml_conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_transpose_1d: kernels a [K, C_out, C_in], input b [L, C_in]; F32
    [(L - 1)·s0 + K, C_out]: each input position scatters its kernel-weighted sum s0 apart.
    ggml computes only p0 = 0, d0 = 1; op_params = {s0, p0, d0}."""
    fn = "ggml_conv_transpose_1d"
    ggml_assert(ggml_is_matrix(b), "ggml_is_matrix(b)", fn, f"b ne = {shape_of(b)}")
    ggml_assert(int(a.ne[2]) == int(b.ne[1]), "a->ne[2] == b->ne[1]", fn, "input channels")
    ggml_assert(int(a.ne[3]) == 1, "a->ne[3] == 1", fn)
    ggml_assert(p0 == 0, "p0 == 0", fn)
    ggml_assert(d0 == 1, "d0 == 1", fn)
    ol = (int(b.ne[0]) - 1) * s0 - 2 * p0 + d0 * (int(a.ne[0]) - 1) + 1
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [ol, int(a.ne[1]), int(b.ne[2]), 1])
    ggml_set_op_params(result, struct.pack("<3i", s0, p0, d0))
    return set_op_src(result, GGMLOp.CONV_TRANSPOSE_1D, a, b)


@op
def ggml_conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """ggml_conv_transpose_2d_p0: kernels a [KW, KH, C_out, C_in], images b [W, H, C_in, N]; F32
    [(W - 1)·s + KW, (H - 1)·s + KH, C_out, N], no padding; op_params[0] = the stride."""
    ggml_assert(int(a.ne[3]) == int(b.ne[2]), "a->ne[3] == b->ne[2]", "ggml_conv_transpose_2d_p0", "input channels")
    ne = [(int(b.ne[0]) - 1) * stride + int(a.ne[0]), (int(b.ne[1]) - 1) * stride + int(a.ne[1]), int(a.ne[2]),
          int(b.ne[3])]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params_i32(result, 0, stride)
    return set_op_src(result, GGMLOp.CONV_TRANSPOSE_2D, a, b)


@op
def ggml_col2im_1d(ctx: Context, a: Tensor, s0: int, oc: int, p0: int) -> Tensor:
    """ggml_col2im_1d: columns a [K·OC, T_in] folded back into a signal [T_out, OC] (overlapping
    taps summed), T_out = (T_in - 1)·s0 + K - 2·p0; op_params = {s0, OC, p0}."""
    fn = "ggml_col2im_1d"
    ggml_assert(ggml_is_matrix(a), "ggml_is_matrix(a)", fn)
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    ggml_assert(a.type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16),
                "a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16", fn)
    ggml_assert(s0 > 0, "s0 > 0", fn)
    ggml_assert(oc > 0, "oc > 0", fn)
    ggml_assert(p0 >= 0, "p0 >= 0", fn)
    k_oc, t_in = int(a.ne[0]), int(a.ne[1])
    k = k_oc // oc
    t_out = (t_in - 1) * s0 + k - 2 * p0
    ggml_assert(k_oc == k * oc, "K_OC == K * oc", fn, "a->ne[0] must be a whole number of oc blocks")
    ggml_assert(k > 0 and t_out > 0, "K > 0 && T_out > 0", fn)
    result = ggml_new_tensor(ctx, a.type, 2, [t_out, oc, 1, 1])
    ggml_set_op_params(result, struct.pack("<3i", s0, oc, p0))
    return set_op_src(result, GGMLOp.COL2IM_1D, a)


# --- 3-d convolution -------------------------------------------------------------------------

@op
def ggml_im2col_3d(ctx: Context, a: Tensor, b: Tensor, ic: int, s0: int, s1: int, s2: int, p0: int, p1: int,
                   p2: int, d0: int, d1: int, d2: int, dst_type: int) -> Tensor:
    """ggml_im2col_3d: the 3-d patches of volumes b [W, H, D, N·IC] under kernels a [KW, KH, KD,
    OC·IC]: [KW·KH·KD·IC, OW, OH, OD·N]; op_params = {s0, s1, s2, p0, p1, p2, d0, d1, d2, IC}."""
    fn = "ggml_im2col_3d"
    n = int(b.ne[3]) // ic
    od = _conv_output_size(int(b.ne[2]), int(a.ne[2]), s2, p2, d2)
    oh = _conv_output_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1)
    ow = _conv_output_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0)
    for v, name in ((od, "OD"), (oh, "OH"), (ow, "OW")):
        ggml_assert(v > 0, f"({name} > 0)  && \"b too small compared to a\"", fn)
    ne = [int(a.ne[0]) * int(a.ne[1]) * int(a.ne[2]) * ic, ow, oh, od * n]
    result = ggml_new_tensor(ctx, dst_type, 4, ne)
    ggml_set_op_params(result, struct.pack("<10i", s0, s1, s2, p0, p1, p2, d0, d1, d2, ic))
    return set_op_src(result, GGMLOp.IM2COL_3D, a, b)


@op
def ggml_conv_3d(ctx: Context, a: Tensor, b: Tensor, ic: int, s0: int, s1: int, s2: int, p0: int, p1: int,
                 p2: int, d0: int, d1: int, d2: int) -> Tensor:
    """ggml_conv_3d: im2col_3d (in a's type), then mul_mat, as ggml.c composes them:
    [OW, OH, OD, N·OC]."""
    im2col = ggml_im2col_3d(ctx, a, b, ic, s0, s1, s2, p0, p1, p2, d0, d1, d2, a.type)
    oc, n = int(a.ne[3]) // ic, int(b.ne[3]) // ic
    i = shape_of(im2col)
    result = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, im2col, i[0], i[3] * i[2] * i[1]),
                          ggml_reshape_2d(ctx, a, int(a.ne[0]) * int(a.ne[1]) * int(a.ne[2]) * ic, oc))
    od = i[3] // n
    result = ggml_reshape_4d(ctx, result, i[1] * i[2], od, n, oc)
    result = ggml_cont(ctx, ggml_permute(ctx, result, 0, 1, 3, 2))
    return ggml_reshape_4d(ctx, result, i[1], i[2], od, oc * n)


@op
def ggml_conv_3d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                        d0: int, d1: int, d2: int, c: int, n: int, oc: int) -> Tensor:
    """ggml_conv_3d_direct: 3-d convolution computed directly (GGML_OP_CONV_3D). a [KW, KH, KD, C·OC],
    b [W, H, D, C·N]; F32 [OW, OH, OD, OC·N]; op_params = strides, paddings, dilations, C, N, OC."""
    fn = "ggml_conv_3d_direct"
    ggml_assert(int(a.ne[3]) == c * oc, "a->ne[3] == (int64_t) c * oc", fn)
    ggml_assert(int(b.ne[3]) == c * n, "b->ne[3] == (int64_t) c * n", fn)
    ne = [_conv_output_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0),
          _conv_output_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1),
          _conv_output_size(int(b.ne[2]), int(a.ne[2]), s2, p2, d2), oc * n]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, struct.pack("<12i", s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc))
    return set_op_src(result, GGMLOp.CONV_3D, a, b)
