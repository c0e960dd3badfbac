"""The backward and optimizer ops: REPEAT_BACK, SILU_BACK, RMS_NORM_BACK, GET_ROWS_BACK,
SOFT_MAX_BACK, IM2COL_BACK, POOL_2D_BACK, CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW and OPT_STEP_SGD
(ggml-cpu/ops.cpp), F32.

Thread splits, as ggml's:
* REPEAT_BACK, GET_ROWS_BACK, POOL_2D_BACK: thread 0 alone (zero dst, then add every repetition /
  row / pooled position in order);
* IM2COL_BACK: input channels interleaved (c = ith; c += nth);
* RMS_NORM_BACK: rows interleaved (i01 = ith; i01 += nth in every (i02, i03));
* SILU_BACK, SOFT_MAX_BACK, CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW, OPT_STEP_SGD: the generic
  row range [dr·ith, dr·ith + dr) of the flat rows.

Numerics: silu_back calls the C library's expf (engine.libm); soft_max_back's dot product is
ggml_vec_dot_f32's lanes (kernels/vecdot_float.py) and cross_entropy_loss_back's exponentials are
the soft_max kernel's (ggml_v_expf, then expf); sums ggml keeps in double are added left to right
(cumulative sums); where the -mfma build fuses a multiply and an add, fmaf does (floatmath).
The same bits as ggml on every CPU.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine import libm
from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import row_blocks, thread_range, view4
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.softmax import soft_max_rows
from engine.compute.kernels.vecdot_float import vec_dot_f32_rows
from engine.compute.kernels.views import flat_rows, strided
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_can_repeat, ggml_is_contiguous, \
    ggml_nbytes, ggml_nelements, ggml_nrows
from engine.core.types import GGMLType

F32, F64 = np.float32, np.float64


def _f32_only(dst: Tensor, *srcs: Tensor) -> None:
    if any(t.type != GGMLType.F32 for t in (dst, *srcs)):
        raise not_supported(dst, "ggml's CPU kernel computes F32 only")


def _in_order_sum(x: np.ndarray) -> np.ndarray:
    """Σ along the last axis in float64, left to right (a C loop into a ggml_float)."""
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], F64)
    return np.cumsum(x.astype(F64), axis=-1)[..., -1]


# --- repeat_back, get_rows_back --------------------------------------------------------------

@kernel(GGMLOp.REPEAT_BACK, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_repeat_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_repeat_back_f32: dst = zeros, then every repetition of dst's shape in
    src0 added to it, the repetitions in order (i3, i2, i1, i0)."""
    src0 = dst.source(0)
    _f32_only(dst, src0)
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    fn = "ggml_compute_forward_repeat_back_f32"
    ggml_assert(ggml_can_repeat(dst, src0), "ggml_can_repeat(dst, src0)", fn)
    ggml_assert(int(dst.nb[0]) == 4, "nb0  == sizeof(float)", fn)
    ggml_assert(int(src0.nb[0]) == 4, "nb00 == sizeof(float)", fn)
    ne = [int(x) for x in dst.ne]
    nr = [int(s) // d for s, d in zip(src0.ne, ne)]
    s4 = view4(src0)  # (ne03, ne02, ne01, ne00)
    blocks = s4.reshape(nr[3], ne[3], nr[2], ne[2], nr[1], ne[1], nr[0], ne[0])
    acc = np.zeros((ne[3], ne[2], ne[1], ne[0]), F32)
    for i3, i2, i1, i0 in itertools.product(range(nr[3]), range(nr[2]), range(nr[1]),
                                            range(nr[0])):
        acc += blocks[i3, :, i2, :, i1, :, i0, :]
    view4(dst)[:] = acc
    params.took(ShareKind.ALL)


@kernel(GGMLOp.GET_ROWS_BACK, n_tasks=one_thread, work=no_work, barrier=False)
def compute_forward_get_rows_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_get_rows_back_f32: dst = zeros; then for each index i in order,
    dst row src1[i] += src0 row i."""
    src0, src1 = dst.source(0), dst.source(1)
    _f32_only(dst, src0)
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    fn = "ggml_compute_forward_get_rows_back_f32"
    ggml_assert(ggml_is_contiguous(dst), "ggml_is_contiguous(dst)", fn)
    nc, nr = int(src0.ne[0]), ggml_nelements(src1)
    ggml_assert(int(dst.ne[0]) == nc, "dst->ne[0] == nc", fn)
    ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    strided(dst, (ggml_nbytes(dst),), (1,), dtype=np.uint8)[:] = 0
    rows = strided(src1, (nr,), (4,), dtype=np.int32)
    ggml_assert(bool(np.all((rows >= 0) & (rows < int(dst.ne[1])))), "0 <= r < dst->ne[1]", fn,
                "an index is outside dst (ggml would write outside its memory)")
    out = flat_rows(dst)
    np.add.at(out, rows, flat_rows(src0, nr))  # unbuffered, index by index: ggml's order
    params.took(ShareKind.ALL)


# --- silu_back, rms_norm_back ----------------------------------------------------------------

@kernel(GGMLOp.SILU_BACK, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_silu_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_silu_back_f32: dx = dy·s·(1 + x·(1 - s)), s = 1/(1 + expf(-x))."""
    grad, x = dst.source(0), dst.source(1)
    _f32_only(dst, grad, x)
    ir0, ir1 = thread_range(ggml_nrows(x), params.ith, params.nth)
    if ir0 < ir1:
        xs = flat_rows(x)[ir0:ir1]
        dy = flat_rows(grad)[ir0:ir1]
        with np.errstate(all="ignore"):
            s = F32(1) / (F32(1) + libm.expf(-xs))
            flat_rows(dst)[ir0:ir1] = dy * s * fmaf(xs, F32(1) - s, F32(1))
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.RMS_NORM_BACK, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_rms_norm_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_rms_norm_back_f32, per row with dz = src0 (the gradient) and x = src1:
    sums of x·x and x·dz in double, then dx = (dz + x·scale_x)·rrms with
    rrms = 1/sqrt(Σxx/n + eps) and scale_x = -Σxdz / (Σxx + eps·n)."""
    dz_t, x_t = dst.source(0), dst.source(1)
    _f32_only(dst, dz_t, x_t)
    fn = "ggml_compute_forward_rms_norm_back_f32"
    ggml_assert(ggml_are_same_shape(dz_t, dst) and ggml_are_same_shape(dz_t, x_t),
                "ggml_are_same_shape(src0, dst) && ggml_are_same_shape(src0, src1)", fn)
    ggml_assert(int(dz_t.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    ggml_assert(int(x_t.nb[0]) == 4, "src1->nb[0] == sizeof(float)", fn)
    eps = F32(dst.op_params.view(np.float32)[0])
    ne00, ne01 = int(dz_t.ne[0]), int(dz_t.ne[1])
    rows = np.arange(params.ith, ne01, params.nth)
    if len(rows):
        sl = slice(params.ith, ne01, params.nth)
        dz, x = view4(dz_t)[:, :, sl], view4(x_t)[:, :, sl]
        sum_xx = _in_order_sum(x * x).astype(F32)[..., None]
        sum_xdz = _in_order_sum(x * dz)[..., None]
        with np.errstate(all="ignore"):
            mean_eps = sum_xx / F32(ne00) + eps
            sum_eps = fmaf(eps, F32(ne00), sum_xx)
            rrms = F32(1) / np.sqrt(mean_eps)
            scale_x = (-sum_xdz).astype(F32) / sum_eps
            view4(dst)[:, :, sl] = fmaf(x, scale_x, dz) * rrms
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("rows_i01"))


# --- soft_max_back, cross_entropy_loss_back --------------------------------------------------

@kernel(GGMLOp.SOFT_MAX_BACK, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_soft_max_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_soft_max_ext_back_f32: per row, with dy = src0 and y = src1:
    dx = ((dy - dot(y, dy))·y)·scale."""
    dy_t, y_t = dst.source(0), dst.source(1)
    _f32_only(dst, dy_t, y_t)
    fn = "ggml_compute_forward_soft_max_ext_back_f32"
    for t, name in ((dy_t, "src0"), (y_t, "src1"), (dst, "dst")):
        ggml_assert(ggml_is_contiguous(t), f"ggml_is_contiguous({name})", fn)
    ggml_assert(ggml_are_same_shape(dy_t, dst), "ggml_are_same_shape(src0, dst)", fn)
    ggml_assert(ggml_are_same_shape(y_t, dst), "ggml_are_same_shape(src1, dst)", fn)
    scale, max_bias = (F32(v) for v in dst.op_params.view(np.float32)[:2])
    ggml_assert(max_bias == 0, "max_bias == 0.0f", fn)
    ir0, ir1 = thread_range(ggml_nrows(dy_t), params.ith, params.nth)
    if ir0 < ir1:
        dy, y = flat_rows(dy_t)[ir0:ir1], flat_rows(y_t)[ir0:ir1]
        dot = vec_dot_f32_rows(y, dy)[:, None]
        with np.errstate(all="ignore"):
            flat_rows(dst)[ir0:ir1] = ((dy + -dot) * y) * scale
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.CROSS_ENTROPY_LOSS_BACK, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_cross_entropy_loss_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_cross_entropy_loss_back_f32: per row of logits s0 with labels s1,
    ds0 = (softmax(s0) - s1)·(grad / nrows), the softmax as the SOFT_MAX kernel computes it."""
    grad, s0_t, s1_t = dst.source(0), dst.source(1), dst.source(2)
    _f32_only(dst, grad, s0_t, s1_t)
    fn = "ggml_compute_forward_cross_entropy_loss_back_f32"
    for t, name in ((dst, "dst"), (s0_t, "src0f"), (s1_t, "src1f"), (grad, "grad")):
        ggml_assert(ggml_is_contiguous(t), f"ggml_is_contiguous({name})", fn)
    ggml_assert(ggml_are_same_shape(s0_t, s1_t) and ggml_are_same_shape(s0_t, dst),
                "ggml_are_same_shape(src0f, src1f) && ggml_are_same_shape(src0f, dst)", fn)
    nr = ggml_nrows(s0_t)
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    d_by_nr = strided(grad, (1,), (4,), dtype=F32)[0] / F32(nr)
    if ir0 < ir1:
        s0, s1 = flat_rows(s0_t)[ir0:ir1], flat_rows(s1_t)[ir0:ir1]
        mx = s0.max(axis=-1, keepdims=True)
        y, total = soft_max_rows(s0, mx)
        with np.errstate(all="ignore"):
            inv = (1.0 / total).astype(F32)
            flat_rows(dst)[ir0:ir1] = ((y * inv) - s1) * d_by_nr
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


# --- the optimizer steps ---------------------------------------------------------------------

def _param_rows(params, dst: Tensor) -> tuple[int, int]:
    src0 = dst.source(0)
    ggml_assert(int(src0.nb[0]) == 4, "nb00 == sizeof(float)", "ggml_compute_forward_opt_step")
    return thread_range(ggml_nrows(src0), params.ith, params.nth)


def _row_views(dst: Tensor, tensors: tuple[Tensor, ...], ir0: int, ir1: int):
    """For the flat rows [ir0, ir1) of the parameter (dst's src0), writable views of the same
    rows of each tensor, one tuple per run of rows within a matrix."""
    ne1, ne2 = int(dst.source(0).ne[1]), int(dst.source(0).ne[2])
    views = [view4(t) for t in tensors]
    for i3, i2, a, b in row_blocks(ne1, ne2, ir0, ir1):
        yield tuple(v[i3, i2, a:b] for v in views)


@kernel(GGMLOp.OPT_STEP_ADAMW, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_opt_step_adamw(params, dst: Tensor) -> None:
    """ggml_compute_forward_opt_step_adamw_f32, per element of the parameter w:
    m = m·β1 + g·(1 - β1); v = v·β2 + g·g·(1 - β2); w = w·keep - α·(m·β1h)/(√(v·β2h) + eps),
    keep = 1 - α·wd; adamw_params = [α, β1, β2, eps, wd, β1h, β2h]."""
    w_t, g_t, m_t, v_t, p_t = (dst.source(i) for i in range(5))
    _f32_only(dst, w_t, g_t, m_t, v_t, p_t)
    fn = "ggml_compute_forward_opt_step_adamw_f32"
    for t, name in ((g_t, "src0_grad"), (m_t, "src0_grad_m"), (v_t, "src0_grad_v")):
        ggml_assert(ggml_are_same_shape(w_t, t), f"ggml_are_same_shape(src0, {name})", fn)
    ggml_assert(ggml_nelements(p_t) == 7, "ggml_nelements(adamw_params) == 7", fn)
    ir0, ir1 = _param_rows(params, dst)
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = strided(p_t, (7,), (4,), dtype=F32)
    keep = fmaf(-alpha, wd, F32(1))
    for w, g, m, v in _row_views(dst, (w_t, g_t, m_t, v_t), ir0, ir1):
        with np.errstate(all="ignore"):
            m[:] = fmaf(m, beta1, g * (F32(1) - beta1))
            v[:] = fmaf(v, beta2, g * g * (F32(1) - beta2))
            mh = m * beta1h
            vh = np.sqrt(v * beta2h) + eps
            w[:] = fmaf(w, keep, -(alpha * mh / vh))
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


@kernel(GGMLOp.OPT_STEP_SGD, n_tasks=all_threads, work=no_work, barrier=False)
def compute_forward_opt_step_sgd(params, dst: Tensor) -> None:
    """ggml_compute_forward_opt_step_sgd_f32: w = w·keep - α·g, keep = 1 - α·wd;
    params = [α, wd]."""
    w_t, g_t, p_t = dst.source(0), dst.source(1), dst.source(2)
    _f32_only(dst, w_t, g_t, p_t)
    fn = "ggml_compute_forward_opt_step_sgd_f32"
    ggml_assert(ggml_are_same_shape(w_t, g_t), "ggml_are_same_shape(src0, src0_grad)", fn)
    ggml_assert(ggml_nelements(p_t) == 2, "ggml_nelements(sgd_params) == 2", fn)
    ir0, ir1 = _param_rows(params, dst)
    alpha, wd = strided(p_t, (2,), (4,), dtype=F32)
    keep = fmaf(-alpha, wd, F32(1))
    for w, g in _row_views(dst, (w_t, g_t), ir0, ir1):
        with np.errstate(all="ignore"):
            w[:] = fmaf(w, keep, -(alpha * g))
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


# --- im2col_back, pool_2d_back ---------------------------------------------------------------

@kernel(GGMLOp.IM2COL_BACK, n_tasks=all_threads, work=no_work)
def compute_forward_im2col_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_im2col_back_f32: each image element (n, c, y, x) gets the sum, over
    the kernel taps (kh, kw) in order, of the im2col gradient entries it was copied to; threads
    take channels c in turn."""
    grad_t, kern = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_im2col_back_f32"
    ggml_assert(grad_t.type == GGMLType.F32, "src0->type == GGML_TYPE_F32", fn)
    ggml_assert(kern.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
    ggml_assert(dst.type == GGMLType.F32, "dst->type == GGML_TYPE_F32", fn)
    s0, s1, p0, p1, d0, d1, is_2d = (int(v) for v in dst.op_params[:7])
    ne, nb = [int(x) for x in dst.ne], [int(x) for x in dst.nb]
    n, ic, ih, iw = (ne[3], ne[2], ne[1], ne[0]) if is_2d else (ne[2], ne[1], 1, ne[0])
    kh, kw = (int(kern.ne[1]) if is_2d else 1), int(kern.ne[0])
    oh, ow = (int(grad_t.ne[2]) if is_2d else 1), int(grad_t.ne[1])
    ofs0, ofs1 = (nb[3], nb[2]) if is_2d else (nb[2], nb[1])
    ggml_assert(nb[0] == 4, "nb0  == sizeof(float)", fn)
    chans = np.arange(params.ith, ic, params.nth)
    if len(chans):
        g = strided(grad_t, (n * oh * ow * ic * kh * kw,), (4,), dtype=F32)
        y = np.arange(ih)[:, None]
        x = np.arange(iw)[None, :]
        base = (np.arange(n)[:, None, None, None] * (oh * ow)) * (ic * kh * kw) \
            + chans[None, :, None, None] * (kh * kw)
        acc = np.zeros((n, len(chans), ih, iw), F32)
        for ikh, ikw in itertools.product(range(kh), range(kw)):
            tw = x + p0 - ikw * d0
            th = y + p1 - ikh * d1 if is_2d else np.zeros_like(y)
            ok = tw % s0 == 0
            ow_i = tw // s0
            if is_2d:
                ok = ok & (th % s1 == 0)
                oh_i = th // s1
            else:
                oh_i = np.zeros_like(th)
            ok = ok & (ow_i >= 0) & (ow_i < ow) & (oh_i >= 0) & (oh_i < oh)
            pos = (oh_i * ow + np.where(ok, ow_i, 0)) * (ic * kh * kw) + ikh * kw + ikw
            idx = base + np.where(ok, pos, 0)[None, None]
            acc += np.where(ok[None, None], g[idx], F32(0))
        out = strided(dst, (n, len(chans), ih * iw), (ofs0, ofs1 * params.nth, 4), dtype=F32,
                      offset=params.ith * ofs1)
        out[:] = acc.reshape(n, len(chans), ih * iw)
    params.took(ShareKind.INTERLEAVED, *chans.tolist(), note=Note("input_channels"))


@kernel(GGMLOp.POOL_2D_BACK, n_tasks=one_thread, work=no_work)
def compute_forward_pool_2d_back(params, dst: Tensor) -> None:
    """ggml_compute_forward_pool_2d_back (F32, thread 0): dst = zeros; then for every pooled
    position (plane, oy, ox) in order, MAX adds its gradient at the first maximum of the
    forward input's window, AVG adds gradient/(k0·k1) at every tap inside the input."""
    src, dstf = dst.source(0), dst.source(1)
    if dst.type != GGMLType.F32 or src.type != GGMLType.F32:
        raise not_supported(dst, "F32 only here")
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    op, k0, k1, s0, s1, p0, p1 = (int(v) for v in dst.op_params[:7])
    ggml_assert(ggml_is_contiguous(dst), "ggml_is_contiguous(dst)",
                "ggml_compute_forward_pool_2d_back", "the engine adds into dst as one array")
    ne0, ne1, nb1, nb2 = int(dst.ne[0]), int(dst.ne[1]), int(dst.nb[1]), int(dst.nb[2])
    planes = -(-ggml_nbytes(dst) // nb2)  # `while (cdata < data_end)`, a plane per nb[2]
    px, py = int(src.ne[0]), int(src.ne[1])
    strided(dst, (ggml_nbytes(dst),), (1,), dtype=np.uint8)[:] = 0
    grads = strided(src, (planes, py, px), (px * py * 4, px * 4, 4), dtype=F32)
    fwd = strided(dstf, (planes, ne1, ne0), (nb2, nb1, 4), dtype=F32)
    plane = np.arange(planes)[:, None, None]
    iy = (np.arange(py) * s1 - p1)[None, :, None]
    ix = (np.arange(px) * s0 - p0)[None, None, :]
    targets, values = [], []
    if op == 0:  # GGML_OP_POOL_MAX: the first tap holding the window's maximum
        best = np.full((planes, py, px), -np.finfo(F32).max, F32)
        ky_best = np.full((planes, py, px), -1)
        kx_best = np.full((planes, py, px), -1)
        for ky, kx in itertools.product(range(k1), range(k0)):
            y, x = iy + ky, ix + kx
            ok = (y >= 0) & (y < ne1) & (x >= 0) & (x < ne0)
            val = np.where(ok, fwd[plane, np.clip(y, 0, ne1 - 1), np.clip(x, 0, ne0 - 1)],
                           -np.inf)
            better = ok & (val > best)
            best = np.where(better, val, best)
            ky_best = np.where(better, ky, ky_best)
            kx_best = np.where(better, kx, kx_best)
        found = (ky_best >= 0) & (kx_best >= 0)
        flat = (plane * ne1 + iy + ky_best) * ne0 + ix + kx_best
        targets.append(np.where(found, flat, -1).reshape(-1))
        values.append(grads.reshape(-1))
    elif op == 1:  # GGML_OP_POOL_AVG
        g = grads / F32(k0 * k1)
        for ky, kx in itertools.product(range(k1), range(k0)):
            y, x = iy + ky, ix + kx
            ok = (y >= 0) & (y < ne1) & (x >= 0) & (x < ne0)
            targets.append(np.where(ok, (plane * ne1 + y) * ne0 + x, -1))
            values.append(g)
        # ggml's order: every tap of one position before the next position
        targets = [np.stack(targets, axis=-1).reshape(-1)]
        values = [np.stack(np.broadcast_arrays(*values), axis=-1).reshape(-1)]
    else:
        ggml_assert(False, "false", "ggml_compute_forward_pool_2d_back", f"pool op {op}")
    t, v = targets[0], values[0]
    keep = t >= 0
    out = strided(dst, (planes, ne1, ne0), (nb2, nb1, 4), dtype=F32).reshape(-1)
    np.add.at(out, t[keep], v[keep])
    params.took(ShareKind.ALL)
