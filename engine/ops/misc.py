"""Op constructors for ggml's small remaining ops: cumsum, diag, tri, fill, roll, add_id, add_cast,
reflection padding, the triangular solve, Segment Anything's windows and relative positions, and the
rope_custom wrappers.

Mirrors ggml.c: each only records (shape, type, op_params, sources, the GGML_ASSERTs with ggml's
condition text); the kernels (engine/compute/kernels/misc_more.py) compute.
"""

from __future__ import annotations

import struct

from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.layout import GGML_MAX_DIMS
from engine.ops.base import _dup_or_view, _ne, _record, ggml_set_op_params, ggml_set_op_params_f32, \
    ggml_set_op_params_i32
from engine.ops.base import ggml_cont, ggml_mul_mat, ggml_permute, ggml_reshape_2d, ggml_reshape_3d, \
    ggml_reshape_4d
from engine.ops.nn import ggml_conv_1d, ggml_im2col, ggml_rope_ext, ggml_rope_ext_inplace
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_can_repeat_rows, ggml_dup_tensor, ggml_is_contiguous, \
    ggml_is_contiguous_channels, ggml_is_matrix, ggml_new_tensor, ggml_new_tensor_4d
from engine.core.types import GGMLType, TYPE_TRAITS


# enum ggml_tri_type: which triangle (with or without the diagonal) ggml_tri keeps
GGML_TRI_TYPE_UPPER_DIAG, GGML_TRI_TYPE_UPPER, GGML_TRI_TYPE_LOWER_DIAG, GGML_TRI_TYPE_LOWER = 0, 1, 2, 3


def ggml_cumsum(ctx: Context, a: Tensor) -> Tensor:
    """ggml_cumsum: each row's running sum along dim 0 (F32)."""
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", "ggml_cumsum")
    return _record(ggml_dup_tensor(ctx, a), GGMLOp.CUMSUM, a)


def ggml_diag(ctx: Context, a: Tensor) -> Tensor:
    """ggml_diag: a row vector [n, 1, ne2, ne3] made the diagonal of [n, n, ne2, ne3]."""
    ggml_assert(int(a.ne[1]) == 1, "a->ne[1] == 1", "ggml_diag", f"ne = {_ne(a)}")
    ne = [int(a.ne[0]), int(a.ne[0]), int(a.ne[2]), int(a.ne[3])]
    return _record(ggml_new_tensor(ctx, a.type, 4, ne), GGMLOp.DIAG, a)


def ggml_tri(ctx: Context, a: Tensor, type_: int) -> Tensor:
    """ggml_tri: a square F32 matrix with one triangle kept (GGML_TRI_TYPE_*), the rest 0;
    op_params[0] = the triangle."""
    fn = "ggml_tri"
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", fn)
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    ggml_assert(int(a.ne[0]) == int(a.ne[1]), "a->ne[0] == a->ne[1]", fn, f"ne = {_ne(a)}")
    result = ggml_dup_tensor(ctx, a)
    ggml_set_op_params_i32(result, 0, int(type_))
    return _record(result, GGMLOp.TRI, a)


def _fill(ctx: Context, a: Tensor, c: float, inplace: bool) -> Tensor:
    fn = "ggml_fill_impl"
    ggml_assert(a.type in (GGMLType.F32, GGMLType.F16), "a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16",
                fn)
    ggml_assert(ggml_is_contiguous(a), "ggml_is_contiguous(a)", fn)
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params_f32(result, 0, c)
    return _record(result, GGMLOp.FILL, a)


def ggml_fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    """ggml_fill: a tensor like a with every element c; op_params[0] = c (f32)."""
    return _fill(ctx, a, c, False)


def ggml_fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    """ggml_fill_inplace: the same, into a view of a."""
    return _fill(ctx, a, c, True)


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
    return _record(result, GGMLOp.ROLL, a)


def ggml_add_id(ctx: Context, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_add_id: a [n, n_used, n_tokens] plus, for each (slot, token), the row of b that
    ids[slot, token] picks (mixture of experts: each chosen expert's bias)."""
    fn = "ggml_add_id"
    ggml_assert(int(a.ne[0]) == int(b.ne[0]), "a->ne[0] == b->ne[0]", fn)
    ggml_assert(int(a.ne[1]) == int(ids.ne[0]), "a->ne[1] == ids->ne[0]", fn)
    ggml_assert(int(a.ne[2]) == int(ids.ne[1]), "a->ne[2] == ids->ne[1]", fn)
    ggml_assert(ids.type == GGMLType.I32, "ids->type == GGML_TYPE_I32", fn)
    return _record(ggml_dup_tensor(ctx, a), GGMLOp.ADD_ID, a, b, ids)


def ggml_add_cast(ctx: Context, a: Tensor, b: Tensor, type_: int) -> Tensor:
    """ggml_add_cast: ADD whose result has another type (a quantized, F16 or BF16 a)."""
    fn = "ggml_add_cast_impl"
    ggml_assert(ggml_can_repeat_rows(b, a), "ggml_can_repeat_rows(b, a)", fn)
    ggml_assert(TYPE_TRAITS[a.type].is_quantized or a.type in (GGMLType.F16, GGMLType.BF16),
                "ggml_is_quantized(a->type) || a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16", fn)
    result = ggml_new_tensor(ctx, type_, GGML_MAX_DIMS, a.ne)
    return _record(result, GGMLOp.ADD, a, b)


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
    ggml_set_op_params(result, struct.pack("<2i", p0, p1))
    return _record(result, GGMLOp.PAD_REFLECT_1D, a)


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
    return _record(result, GGMLOp.SOLVE_TRI, a, b)


# --- Segment Anything's windows and relative positions ----------------------------------------

def ggml_win_part(ctx: Context, a: Tensor, w: int) -> Tensor:
    """ggml_win_part: an image [C, W, H] cut into w×w windows [C, w, w, n_windows], zero-padded;
    op_params = {windows across, windows down, w}."""
    ggml_assert(int(a.ne[3]) == 1, "a->ne[3] == 1", "ggml_win_part")
    ggml_assert(a.type == GGMLType.F32, "a->type  == GGML_TYPE_F32", "ggml_win_part")
    px, py = (w - int(a.ne[1]) % w) % w, (w - int(a.ne[2]) % w) % w
    npx, npy = (px + int(a.ne[1])) // w, (py + int(a.ne[2])) // w
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [int(a.ne[0]), w, w, npx * npy])
    ggml_set_op_params(result, struct.pack("<3i", npx, npy, w))
    return _record(result, GGMLOp.WIN_PART, a)


def ggml_win_unpart(ctx: Context, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    """ggml_win_unpart: w×w windows put back together into [C, w0, h0] (the padding dropped)."""
    ggml_assert(a.type == GGMLType.F32, "a->type == GGML_TYPE_F32", "ggml_win_unpart")
    result = ggml_new_tensor(ctx, GGMLType.F32, 3, [int(a.ne[0]), w0, h0, 1])
    ggml_set_op_params(result, struct.pack("<i", w))
    return _record(result, GGMLOp.WIN_UNPART, a)


def ggml_get_rel_pos(ctx: Context, a: Tensor, qh: int, kh: int) -> Tensor:
    """ggml_get_rel_pos: from a table of 2·h - 1 relative positions, the F16 [C, kh, qh] of each
    (query, key) pair's row."""
    ggml_assert(qh == kh, "qh == kh", "ggml_get_rel_pos")
    ggml_assert(2 * max(qh, kh) - 1 == int(a.ne[1]), "2*MAX(qh, kh) - 1 == a->ne[1]", "ggml_get_rel_pos")
    return _record(ggml_new_tensor(ctx, GGMLType.F16, 3, [int(a.ne[0]), kh, qh, 1]), GGMLOp.GET_REL_POS, a)


def _add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor, inplace: bool) -> Tensor:
    fn = "ggml_add_rel_pos_impl"
    ggml_assert(_ne(pw) == _ne(ph), "ggml_are_same_shape(pw, ph)", fn)
    for t, name in ((a, "a"), (pw, "pw"), (ph, "ph")):
        ggml_assert(ggml_is_contiguous(t), f"ggml_is_contiguous({name})", fn)
    ggml_assert(ph.type == GGMLType.F32, "ph->type == GGML_TYPE_F32", fn)
    ggml_assert(pw.type == GGMLType.F32, "pw->type == GGML_TYPE_F32", fn)
    ggml_assert(int(pw.ne[3]) == int(a.ne[2]), "pw->ne[3] == a->ne[2]", fn)
    ggml_assert(int(pw.ne[0]) ** 2 == int(a.ne[0]), "pw->ne[0]*pw->ne[0] == a->ne[0]", fn)
    ggml_assert(int(pw.ne[1]) * int(pw.ne[2]) == int(a.ne[1]), "pw->ne[1]*pw->ne[2] == a->ne[1]", fn)
    result = _dup_or_view(ctx, a, inplace)
    ggml_set_op_params_i32(result, 0, 1 if inplace else 0)
    return _record(result, GGMLOp.ADD_REL_POS, a, pw, ph)


def ggml_add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """ggml_add_rel_pos: attention scores a plus the decomposed relative positions: each k×k
    block gets ph[row] added along its rows and pw[col] along its columns."""
    return _add_rel_pos(ctx, a, pw, ph, False)


def ggml_add_rel_pos_inplace(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """ggml_add_rel_pos_inplace: the same, into a view of a."""
    return _add_rel_pos(ctx, a, pw, ph, True)


# --- convolutions made of im2col and mul_mat, as ggml.c composes them -----------------------------

def ggml_conv_1d_ph(ctx: Context, a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    """ggml_conv_1d_ph: ggml_conv_1d with half the kernel as padding ("same" length at s = 1)."""
    return ggml_conv_1d(ctx, a, b, s, int(a.ne[0]) // 2, d)


def ggml_conv_1d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_1d_dw: depthwise 1-d convolution, each channel by its own kernel: im2col (F16) of
    b as channels of one, times the kernels, reshaped to [OL, C, 1]."""
    new_b = ggml_reshape_4d(ctx, b, int(b.ne[0]), 1, int(b.ne[1]), int(b.ne[2]))
    im2col = ggml_im2col(ctx, a, new_b, s0, 0, p0, 0, d0, 0, False, GGMLType.F16)
    result = ggml_mul_mat(ctx, im2col, a)
    return ggml_reshape_3d(ctx, result, int(result.ne[0]), int(result.ne[2]), 1)


def ggml_conv_1d_dw_ph(ctx: Context, a: Tensor, b: Tensor, s0: int, d0: int) -> Tensor:
    """ggml_conv_1d_dw_ph: ggml_conv_1d_dw with half the kernel as padding."""
    return ggml_conv_1d_dw(ctx, a, b, s0, int(a.ne[0]) // 2, d0)


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


def ggml_conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_transpose_1d: kernels a [K, C_out, C_in], input b [L, C_in]; F32
    [(L - 1)·s0 + K, C_out]: each input position scatters its kernel-weighted sum s0 apart.
    ggml computes only p0 = 0, d0 = 1; op_params = {s0, p0, d0}."""
    fn = "ggml_conv_transpose_1d"
    ggml_assert(ggml_is_matrix(b), "ggml_is_matrix(b)", fn, f"b ne = {_ne(b)}")
    ggml_assert(int(a.ne[2]) == int(b.ne[1]), "a->ne[2] == b->ne[1]", fn, "input channels")
    ggml_assert(int(a.ne[3]) == 1, "a->ne[3] == 1", fn)
    ggml_assert(p0 == 0, "p0 == 0", fn)
    ggml_assert(d0 == 1, "d0 == 1", fn)
    ol = (int(b.ne[0]) - 1) * s0 - 2 * p0 + d0 * (int(a.ne[0]) - 1) + 1
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [ol, int(a.ne[1]), int(b.ne[2]), 1])
    ggml_set_op_params(result, struct.pack("<3i", s0, p0, d0))
    return _record(result, GGMLOp.CONV_TRANSPOSE_1D, a, b)


def ggml_conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                           dilation0: int, dilation1: int) -> Tensor:
    """ggml_conv_2d_dw_direct: depthwise 2-d convolution computed directly. a [KW, KH, 1, C] the
    kernels, b [W, H, C, N] the images; the result has b's type, and b's layout when b is
    channels-first in memory (CWHN); op_params = {s0, s1, p0, p1, d0, d1}."""
    fn = "ggml_conv_2d_dw_direct"
    ggml_assert(int(a.ne[2]) == 1, "a->ne[2] == 1", fn)
    ggml_assert(int(a.ne[3]) == int(b.ne[2]), "a->ne[3] == b->ne[2]", fn, "one kernel per channel")
    ow = (int(b.ne[0]) + 2 * pad0 - dilation0 * (int(a.ne[0]) - 1) - 1) // stride0 + 1
    oh = (int(b.ne[1]) + 2 * pad1 - dilation1 * (int(a.ne[1]) - 1) - 1) // stride1 + 1
    result = ggml_new_tensor(ctx, b.type, 4, [ow, oh, int(b.ne[2]), int(b.ne[3])])
    if ggml_is_contiguous_channels(b):  # the result permuted as b is: channels first in memory
        ts = TYPE_TRAITS[result.type].type_size
        ggml_assert(TYPE_TRAITS[result.type].blck_size == 1, "ggml_blck_size(result->type) == 1", fn)
        result.nb[0] = int(result.ne[2]) * ts
        result.nb[1] = int(result.ne[0]) * int(result.nb[0])
        result.nb[2] = ts
    ggml_set_op_params(result, struct.pack("<6i", stride0, stride1, pad0, pad1, dilation0, dilation1))
    return _record(result, GGMLOp.CONV_2D_DW, a, b)


def ggml_conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """ggml_conv_transpose_2d_p0: kernels a [KW, KH, C_out, C_in], images b [W, H, C_in, N]; F32
    [(W - 1)·s + KW, (H - 1)·s + KH, C_out, N], no padding; op_params[0] = the stride."""
    ggml_assert(int(a.ne[3]) == int(b.ne[2]), "a->ne[3] == b->ne[2]", "ggml_conv_transpose_2d_p0", "input channels")
    ne = [(int(b.ne[0]) - 1) * stride + int(a.ne[0]), (int(b.ne[1]) - 1) * stride + int(a.ne[1]), int(a.ne[2]),
          int(b.ne[3])]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params_i32(result, 0, stride)
    return _record(result, GGMLOp.CONV_TRANSPOSE_2D, a, b)


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
    return _record(result, GGMLOp.COL2IM_1D, a)


def _conv_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def ggml_im2col_3d(ctx: Context, a: Tensor, b: Tensor, ic: int, s0: int, s1: int, s2: int, p0: int, p1: int,
                   p2: int, d0: int, d1: int, d2: int, dst_type: int) -> Tensor:
    """ggml_im2col_3d: the 3-d patches of volumes b [W, H, D, N·IC] under kernels a [KW, KH, KD,
    OC·IC]: [KW·KH·KD·IC, OW, OH, OD·N]; op_params = {s0, s1, s2, p0, p1, p2, d0, d1, d2, IC}."""
    fn = "ggml_im2col_3d"
    n = int(b.ne[3]) // ic
    od = _conv_size(int(b.ne[2]), int(a.ne[2]), s2, p2, d2)
    oh = _conv_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1)
    ow = _conv_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0)
    for v, name in ((od, "OD"), (oh, "OH"), (ow, "OW")):
        ggml_assert(v > 0, f"({name} > 0)  && \"b too small compared to a\"", fn)
    ne = [int(a.ne[0]) * int(a.ne[1]) * int(a.ne[2]) * ic, ow, oh, od * n]
    result = ggml_new_tensor(ctx, dst_type, 4, ne)
    ggml_set_op_params(result, struct.pack("<10i", s0, s1, s2, p0, p1, p2, d0, d1, d2, ic))
    return _record(result, GGMLOp.IM2COL_3D, a, b)


def ggml_conv_3d(ctx: Context, a: Tensor, b: Tensor, ic: int, s0: int, s1: int, s2: int, p0: int, p1: int,
                 p2: int, d0: int, d1: int, d2: int) -> Tensor:
    """ggml_conv_3d: im2col_3d (in a's type), then mul_mat, as ggml.c composes them:
    [OW, OH, OD, N·OC]."""
    im2col = ggml_im2col_3d(ctx, a, b, ic, s0, s1, s2, p0, p1, p2, d0, d1, d2, a.type)
    oc, n = int(a.ne[3]) // ic, int(b.ne[3]) // ic
    i = _ne(im2col)
    result = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, im2col, i[0], i[3] * i[2] * i[1]),
                          ggml_reshape_2d(ctx, a, int(a.ne[0]) * int(a.ne[1]) * int(a.ne[2]) * ic, oc))
    od = i[3] // n
    result = ggml_reshape_4d(ctx, result, i[1] * i[2], od, n, oc)
    result = ggml_cont(ctx, ggml_permute(ctx, result, 0, 1, 3, 2))
    return ggml_reshape_4d(ctx, result, i[1], i[2], od, oc * n)


def ggml_conv_3d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                        d0: int, d1: int, d2: int, c: int, n: int, oc: int) -> Tensor:
    """ggml_conv_3d_direct: 3-d convolution computed directly (GGML_OP_CONV_3D). a [KW, KH, KD, C·OC],
    b [W, H, D, C·N]; F32 [OW, OH, OD, OC·N]; op_params = strides, paddings, dilations, C, N, OC."""
    fn = "ggml_conv_3d_direct"
    ggml_assert(int(a.ne[3]) == c * oc, "a->ne[3] == (int64_t) c * oc", fn)
    ggml_assert(int(b.ne[3]) == c * n, "b->ne[3] == (int64_t) c * n", fn)
    ne = [_conv_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0), _conv_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1),
          _conv_size(int(b.ne[2]), int(a.ne[2]), s2, p2, d2), oc * n]
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, ne)
    ggml_set_op_params(result, struct.pack("<12i", s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc))
    return _record(result, GGMLOp.CONV_3D, a, b)


def ggml_rope_custom(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                     freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                     beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_custom (deprecated in ggml.h): ggml_rope_ext without frequency factors."""
    return ggml_rope_ext(ctx, a, b, None, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                         attn_factor, beta_fast, beta_slow)


def ggml_rope_custom_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                             beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_custom_inplace (deprecated in ggml.h): ggml_rope_ext_inplace without frequency
    factors."""
    return ggml_rope_ext_inplace(ctx, a, b, None, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                                 attn_factor, beta_fast, beta_slow)
