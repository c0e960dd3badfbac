"""The convolution kernels: IM2COL, IM2COL_3D, COL2IM_1D, CONV_2D (direct), CONV_2D_DW, CONV_3D,
CONV_TRANSPOSE_1D and CONV_TRANSPOSE_2D, and POOL_1D and POOL_2D (ggml-cpu/ops.cpp).

im2col:
    dst[n, oh, ow, ic·KH·KW + kh·KW + kw] = src[n, ic, oh·s1 + kh·d1 - p1, ow·s0 + kw·d0 - p0]
(0 outside the image). Threads take input channels in turn (ic = ith, ith + nth, ...). Within a
channel the source plane is read as packed rows of IW elements, from the batch and channel strides
only. im2col_3d is the same over volumes.

conv_2d (direct): output pixels ("patches") are processed in batches sized by the work buffer;
in each batch thread ith im2cols its dr range of patches (converted to the kernel's type), a GEMM
with the kernel follows (ggml splits it as mul_mat does), then the same thread range scatters the
results to dst. Here each thread computes the GEMM rows of its own patches. conv_3d batches its
patches the same way, its product being ggml's vec_dot.

conv_2d_dw: each output pixel a chain of fused multiply-adds over the kernel's taps.
conv_transpose_1d/2d: thread 0 lays kernel and input out in the work buffer; each thread then
scatters the vec_dots of its output channels. col2im_1d: each thread its stretch of output times.

pool_1d / pool_2d: thread 0 alone. Out-of-range taps are skipped; pool_1d averages over the taps
it used, pool_2d divides by k0·k1 always. Max starts from -FLT_MAX.

Numerics: im2col, col2im and the pools are copies and IEEE operations, the others ggml's own
vec_dot and fmaf (ggml's bits on every CPU); conv_2d's GEMM is a float64 BLAS product rounded to
float: ggml's result to rounding, its last bits the CPU's BLAS kernel's (registered with blas=True).
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import from_f32, thread_range, to_f32, view4
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.nn_util import fp16_round
from engine.compute.kernels.vecdot_float import vec_dot_f16, vec_dot_f32
from engine.compute.kernels.views import strided
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.ops.nn import GGML_OP_POOL_AVG, GGML_OP_POOL_MAX
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_is_contiguous_channels, ggml_nbytes, \
    ggml_nelements, ggml_nrows
from engine.core.types import NUMPY_DTYPE, GGMLType, TYPE_TRAITS

F32 = np.float32
FLT_MAX = np.finfo(F32).max
GGML_IM2COL_WORK_SIZE = 16 * 1024 * 1024  # CONV_2D's and CONV_3D's work buffer: patches in batches


def _im2col_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's CONV_2D and CONV_3D: a fixed buffer, the patch batches sized to it."""
    return GGML_IM2COL_WORK_SIZE


def _taps(n_out: int, n_k: int, stride: int, dil: int, pad: int, n_in: int):
    """Input index of every (output, tap) pair, clipped, and whether it is inside the input."""
    i = np.arange(n_out)[:, None] * stride + np.arange(n_k)[None, :] * dil - pad
    ok = (i >= 0) & (i < n_in)
    return np.where(ok, i, 0), ok


@kernel(GGMLOp.IM2COL, n_tasks=all_threads, work=no_work)
def compute_forward_im2col(params, dst: Tensor) -> None:
    """ggml_compute_forward_im2col (f32 and f16 dst)."""
    src0, src1 = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_im2col"
    if dst.type == GGMLType.F32:
        ggml_assert(src1.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn + "_f32")
        ggml_assert(int(src1.nb[0]) == 4, "nb10 == sizeof(float)", fn + "_f32")
    elif dst.type == GGMLType.F16:
        fn += "_f16"
        ggml_assert(src0.type == GGMLType.F16, "src0->type == GGML_TYPE_F16", fn)
        ggml_assert(src1.type in (GGMLType.F16, GGMLType.F32),
                    "src1->type == GGML_TYPE_F16 || src1->type == GGML_TYPE_F32", fn)
        ggml_assert(int(src0.nb[0]) == 2, "nb00 == sizeof(ggml_fp16_t)", fn)
        ggml_assert(int(src1.nb[0]) == TYPE_TRAITS[src1.type].type_size,
                    "nb10 == ggml_type_size(src1->type)", fn)
    else:
        raise not_supported(dst, "im2col writes F32 or F16 only (ggml aborts)")
    s0, s1, p0, p1, d0, d1, is_2d = (int(x) for x in dst.op_params[:7])
    is_2d = is_2d == 1
    ne0, ne1, ne2 = (int(x) for x in dst.ne[:3])
    ne10, ne11, ne12, ne13 = (int(x) for x in src1.ne)
    nb11, nb12, nb13 = (int(x) for x in src1.nb[1:])
    N, IC = (ne13, ne12) if is_2d else (ne12, ne11)
    IH, IW = (ne11 if is_2d else 1), ne10
    KH, KW = (int(src0.ne[1]) if is_2d else 1), int(src0.ne[0])
    OH, OW = (ne2 if is_2d else 1), ne1
    ofs0, ofs1 = (nb13, nb12) if is_2d else (nb12, nb11)
    chans = np.arange(params.ith, IC, params.nth)
    if len(chans):
        es = TYPE_TRAITS[src1.type].type_size
        src = strided(src1, (N, IC, IH, IW), (ofs0, ofs1, IW * es, es),
                      dtype=NUMPY_DTYPE[GGMLType(src1.type)])
        ih, vh = _taps(OH, KH, s1, d1, p1, IH)  # (OH, KH)
        iw, vw = _taps(OW, KW, s0, d0, p0, IW)  # (OW, KW)
        sub = src[:, chans]  # (N, C, IH, IW)
        g = sub[:, :, ih[:, None, :, None], iw[None, :, None, :]]  # (N, C, OH, OW, KH, KW)
        ok = vh[:, None, :, None] & vw[None, :, None, :]
        vals = to_f32(g, src1.type) if src1.type != dst.type else g
        if dst.type == GGMLType.F16 and src1.type == GGMLType.F32:
            vals = from_f32(vals, GGMLType.F16)
        vals = np.where(ok, vals, np.zeros((), vals.dtype))
        out = view4(dst).reshape(N, OH, OW, IC, KH, KW)
        out[:, :, :, chans] = vals.transpose(0, 2, 3, 1, 4, 5)
    params.took(ShareKind.INTERLEAVED, *chans.tolist(), note=Note("input_channels"))


@kernel(GGMLOp.CONV_2D, n_tasks=all_threads, work=_im2col_work, blas=True)
def compute_forward_conv_2d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_2d: im2col by patch batches, GEMM with the kernel, scatter."""
    kern, src = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_conv_2d_impl"
    ggml_assert(ggml_is_contiguous(kern), "ggml_is_contiguous(kernel)", fn)
    ggml_assert(kern.type in (GGMLType.F16, GGMLType.F32),
                "kernel_type == GGML_TYPE_F16 || kernel_type == GGML_TYPE_F32", fn)
    if src.type != GGMLType.F32 or dst.type != GGMLType.F32:
        raise not_supported(dst, "the CPU kernel reads and writes the data as F32")
    s0, s1, p0, p1, d0, d1 = (int(x) for x in dst.op_params[:6])
    c_in, c_out = int(src.ne[2]), int(kern.ne[3])
    ggml_assert(c_in == int(kern.ne[2]), "c_in == kernel->ne[2]", fn)
    kw, kh = int(kern.ne[0]), int(kern.ne[1])
    ow, oh = int(dst.ne[0]), int(dst.ne[1])
    knl_n = kw * kh * c_in
    patch_total = int(dst.ne[3]) * ow * oh
    ts = TYPE_TRAITS[kern.type].type_size
    batch_size = params.wsize // (knl_n * ts + c_out * 4)
    per_batch = (batch_size // 8) * 8 if batch_size > 8 else batch_size
    ggml_assert(per_batch > 0 and batch_size >= 1, "patches_per_batch > 0 && batch_size >= 1", fn)
    weights = to_f32(view4(kern), kern.type).reshape(c_out, knl_n)
    x4, d4 = view4(src), view4(dst)  # (N, C, H, W) and (N, OC, OH, OW)
    done = []
    for start in range(0, patch_total, per_batch):
        end = min(start + per_batch, patch_total)
        a, b = thread_range(end - start, params.ith, params.nth)
        done.append(Interval(start + a, start + b))
        if a >= b:
            continue
        p = np.arange(start + a, start + b)
        n, oy, ox = p // (ow * oh), (p // ow) % oh, p % ow
        sy = oy[:, None] * s1 + np.arange(kh)[None, :] * d1 - p1  # (P, KH)
        sx = ox[:, None] * s0 + np.arange(kw)[None, :] * d0 - p0  # (P, KW)
        oky, okx = (sy >= 0) & (sy < x4.shape[2]), (sx >= 0) & (sx < x4.shape[3])
        g = x4[n[:, None, None, None], np.arange(c_in)[None, :, None, None],
               np.where(oky, sy, 0)[:, None, :, None], np.where(okx, sx, 0)[:, None, None, :]]
        patches = np.where(oky[:, None, :, None] & okx[:, None, None, :], g, F32(0))
        patches = patches.reshape(len(p), knl_n)
        if kern.type == GGMLType.F16:
            patches = fp16_round(patches)
        out = (patches.astype(np.float64) @ weights.astype(np.float64).T).astype(F32)
        d4[n[:, None], np.arange(c_out)[None, :], oy[:, None], ox[:, None]] = out
    params.took(ShareKind.ROWS, *done,
                note=(Note.of("conv_patches", n=per_batch), Note("conv_gemm")))


@kernel(GGMLOp.CONV_2D_DW, n_tasks=all_threads, work=no_work)
def compute_forward_conv_2d_dw(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_2d_dw: each output pixel of each channel the sum over the kernel's
    taps inside the image, in tap order (row by row), as a chain of fused multiply-adds. A
    contiguous (WHCN) image: the threads split the (channel, image) planes; a channels-first
    (CWHN) one: the (output row, image) rows."""
    knl, src = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_conv_2d_dw"
    if src.type != GGMLType.F32 or knl.type != GGMLType.F32:
        raise not_supported(dst)
    c, n = int(src.ne[2]), int(src.ne[3])
    ggml_assert(int(knl.ne[3]) == c, "kernel->ne[3] == p.channels", fn)
    ggml_assert(int(dst.ne[3]) == n, "dst->ne[3] == p.batch", fn)
    sx, sy, px, py, dx, dy = (int(v) for v in dst.op_params[:6])
    kw, kh = int(knl.ne[0]), int(knl.ne[1])
    w, h, ow, oh = int(src.ne[0]), int(src.ne[1]), int(dst.ne[0]), int(dst.ne[1])
    whcn = ggml_is_contiguous(src)
    ggml_assert(whcn or ggml_is_contiguous_channels(src), "contiguous or channels-first src", fn,
                "non-contiguous memory layout not supported")
    if not whcn:  # the kernel must have its channels most contiguous too
        ggml_assert(int(knl.nb[0]) >= int(knl.nb[2]) and int(knl.nb[1]) >= int(knl.nb[0]),
                    "kernel->nb[0] >= kernel->nb[2] && kernel->nb[1] >= kernel->nb[0]", fn)
    src4, k4, d4 = view4(src), view4(knl), view4(dst)  # (N, C, H, W), (C, 1, KH, KW), (N, C, OH, OW)
    if whcn:
        total = c * n
        per = -(-total // params.nth)
        start, end = params.ith * per, min(params.ith * per + per, total)
        planes = [(i // c, i % c) for i in range(start, end)]
        rows = None
    else:
        total = oh * n
        per = -(-total // params.nth)
        start, end = params.ith * per, min(params.ith * per + per, total)
        planes, rows = None, [(r // oh, r % oh) for r in range(start, end)]
    ys = np.arange(oh)[:, None] * sy
    xs = np.arange(ow)[None, :] * sx
    for img, ch in planes or []:  # WHCN: whole planes
        acc = np.zeros((oh, ow), np.float32)
        for ky in range(kh):
            y = ys + ky * dy - py
            for kx in range(kw):
                x = xs + kx * dx - px
                ok = (y >= 0) & (y < h) & (x >= 0) & (x < w)
                val = src4[img, ch][np.clip(y, 0, h - 1), np.clip(x, 0, w - 1)]
                acc = np.where(ok, fmaf(k4[ch, 0, ky, kx], val, acc), acc)
        d4[img, ch] = acc
    for img, oy in rows or []:  # CWHN: one output row of every channel
        acc = np.zeros((c, ow), np.float32)
        for ky in range(kh):
            iy = oy * sy + ky * dy - py
            if iy < 0 or iy >= h:
                continue
            for kx in range(kw):
                x = xs[0] + kx * dx - px
                ok = (x >= 0) & (x < w)
                val = src4[img, :, iy][:, np.clip(x, 0, w - 1)]
                acc = np.where(ok, fmaf(k4[:, 0, ky, kx][:, None], val, acc), acc)
        d4[img, :, oy] = acc
    params.took(ShareKind.ROWS, Interval(start, max(start, end)))


def _conv_transpose_1d_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's CONV_TRANSPOSE_1D: the kernel as (C_out, K, C_in) and the input
    transposed, in 16-bit floats for an F16 or BF16 kernel, else in floats."""
    w, x = node.source(0), node.source(1)
    size = 2 if w.type in (GGMLType.F16, GGMLType.BF16) else 4
    return size * (ggml_nelements(w) + int(x.ne[0]) * int(x.ne[1]))


@kernel(GGMLOp.CONV_TRANSPOSE_1D, n_tasks=all_threads, work=_conv_transpose_1d_work)
def compute_forward_conv_transpose_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_transpose_1d_f32/f16: thread 0 lays the kernel out as (C_out, K,
    C_in) and the input as (L, C_in) in the work buffer (F16 for an F16 kernel) and zeroes dst;
    barrier; then each thread its output channels: for input position l and tap k, the vec_dot over
    C_in is added to dst[l·s0 + k], l by l."""
    w, x = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_conv_transpose_1d"
    if x.type != GGMLType.F32 or w.type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst)
    ggml_assert(int(w.nb[0]) == TYPE_TRAITS[w.type].type_size, "nb00 == ggml_type_size(src0)", fn)
    ggml_assert(int(x.nb[0]) == 4, "nb10 == sizeof(float)", fn)
    k, c_out, c_in = (int(v) for v in w.ne[:3])
    length = int(x.ne[0])
    half = w.type == GGMLType.F16
    kern = view4(w)[0].transpose(1, 2, 0)  # (C_out, K, C_in)
    inp = view4(x)[0, 0].T  # (L, C_in)
    if params.ith == 0:
        store = np.float16 if half else np.float32
        nk = k * c_out * c_in
        buf = params.wdata[:params.wsize].view(store)
        buf[:nk] = np.ascontiguousarray(kern, store).reshape(-1)
        buf[nk:nk + length * c_in] = np.asarray(inp, np.float32).astype(store).reshape(-1)
        view4(dst)[...] = 0
    params.barrier()
    s0 = int(dst.op_params[0])
    ir0, ir1 = thread_range(int(dst.ne[1]), params.ith, params.nth)
    d = view4(dst)[0, 0]  # (C_out, OL)
    xs = np.asarray(inp, np.float32)
    if half:
        xs = xs.astype(np.float16).astype(np.float32)  # the input rounded to F16, as ggml converts it
    for i1 in range(ir0, ir1):
        kw = np.asarray(kern[i1], np.float32)  # (K, C_in)
        v = vec_dot_f16(kw, xs) if half else vec_dot_f32(kw, xs)  # (L, K)
        row = d[i1]
        for i10 in range(length):
            row[i10 * s0:i10 * s0 + k] += v[i10]
    params.took(ShareKind.ROWS, Interval(ir0, ir1))


def _conv_transpose_2d_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's CONV_TRANSPOSE_2D: the kernel and the image, channels innermost, in the
    kernel's type."""
    w, x = node.source(0), node.source(1)
    return TYPE_TRAITS[w.type].type_size * (ggml_nelements(w)
                                            + int(x.ne[0]) * int(x.ne[1]) * int(x.ne[2]))


@kernel(GGMLOp.CONV_TRANSPOSE_2D, n_tasks=all_threads, work=_conv_transpose_2d_work)
def compute_forward_conv_transpose_2d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_transpose_2d: thread 0 lays the kernel (C_in innermost) and the
    first image (C_in innermost; F16 for an F16 kernel) out in the work buffer and zeroes dst;
    barrier; each thread its output channels: for each input pixel, in order, each tap's vec_dot
    over C_in is added to dst[y·s + ky, x·s + kx]. (ggml computes the first image only.)"""
    w, x = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_conv_transpose_2d"
    if x.type != GGMLType.F32 or w.type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst)
    ggml_assert(int(w.nb[0]) == TYPE_TRAITS[w.type].type_size, "nb00 == ggml_type_size(src0->type)", fn)
    ggml_assert(int(x.nb[0]) == 4, "nb10 == sizeof(float)", fn)
    kw, kh, c_out, c_in = (int(v) for v in w.ne)
    iw, ih = int(x.ne[0]), int(x.ne[1])
    half = w.type == GGMLType.F16
    kern = view4(w).transpose(1, 2, 3, 0)  # (C_out, KH, KW, C_in)
    img = view4(x)[0].transpose(1, 2, 0)  # (H, W, C_in): the first image
    if params.ith == 0:
        store = np.float16 if half else np.float32
        nk = kw * kh * c_out * c_in
        buf = params.wdata[:params.wsize].view(store)
        buf[:nk] = np.ascontiguousarray(kern, store).reshape(-1)
        buf[nk:nk + ih * iw * c_in] = np.asarray(img, np.float32).astype(store).reshape(-1)
        view4(dst)[...] = 0
    params.barrier()
    s = int(dst.op_params[0])
    ip0, ip1 = thread_range(c_out, params.ith, params.nth)
    pixels = np.asarray(img, np.float32).reshape(ih * iw, c_in)
    if half:
        pixels = pixels.astype(np.float16).astype(np.float32)
    d = view4(dst)[0]  # (C_out, OH, OW)
    for oc in range(ip0, ip1):
        taps = np.asarray(kern[oc], np.float32).reshape(kh * kw, c_in)
        v = (vec_dot_f16(taps, pixels) if half else vec_dot_f32(taps, pixels)).reshape(ih, iw, kh, kw)
        plane = d[oc]
        for y in range(ih):
            for xx in range(iw):
                plane[y * s:y * s + kh, xx * s:xx * s + kw] += v[y, xx]
    params.took(ShareKind.ROWS, Interval(ip0, ip1))


@kernel(GGMLOp.COL2IM_1D, n_tasks=all_threads, work=no_work)
def compute_forward_col2im_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_col2im_1d: each thread its stretch of output times (dr = ceil(T/nth));
    out[t, oc] = the taps (t_in, k) with t_in·s0 + k = t + p0, summed in t_in order (in float,
    then stored in the tensor's type)."""
    col = dst.source(0)
    fn = "ggml_compute_forward_col2im_1d"
    if col.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        raise not_supported(dst)
    ggml_assert(ggml_is_contiguous(col), "ggml_is_contiguous(src)", fn)
    ggml_assert(ggml_is_contiguous(dst), "ggml_is_contiguous(dst)", fn)
    s0, oc, p0 = (int(v) for v in dst.op_params[:3])
    k_oc, t_in = int(col.ne[0]), int(col.ne[1])
    k, t_out = k_oc // oc, int(dst.ne[0])
    it0, it1 = thread_range(t_out, params.ith, params.nth)
    x = to_f32(view4(col)[0, 0], col.type).reshape(t_in, oc, k)  # [t_in][oc][k]
    out = np.zeros((oc, max(it1 - it0, 0)), np.float32)
    for j, t in enumerate(range(it0, it1)):
        t_abs = t + p0
        lo, hi = max(0, -(-(t_abs - k + 1) // s0)), min(t_abs // s0, t_in - 1)
        acc = np.zeros(oc, np.float32)
        for ti in range(lo, hi + 1):
            kk = t_abs - ti * s0
            if 0 <= kk < k:
                acc = acc + x[ti, :, kk]
        out[:, j] = acc
    if it1 > it0:
        view4(dst)[0, 0, :, it0:it1] = from_f32(out, dst.type)
    params.took(ShareKind.ROWS, Interval(it0, max(it0, it1)))


@kernel(GGMLOp.IM2COL_3D, n_tasks=all_threads, work=no_work)
def compute_forward_im2col_3d(params, dst: Tensor) -> None:
    """ggml_compute_forward_im2col_3d_f32/f16: threads take input channels in turn (ic = ith,
    ith + nth, ...); each output position's patch [IC, KD, KH, KW], zeros outside the volume."""
    knl, src = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_im2col_3d"
    ggml_assert(src.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
    if dst.type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst)
    ggml_assert(int(src.nb[0]) == 4, "nb10 == sizeof(float)", fn)
    s0, s1, s2, p0, p1, p2, d0, d1, d2, ic = (int(v) for v in dst.op_params[:10])
    kw, kh, kd = int(knl.ne[0]), int(knl.ne[1]), int(knl.ne[2])
    iw, ih, idd = int(src.ne[0]), int(src.ne[1]), int(src.ne[2])
    n = int(src.ne[3]) // ic
    ow, oh, od = int(dst.ne[1]), int(dst.ne[2]), int(dst.ne[3]) // n
    vol = view4(src)  # (N·IC, D, H, W)
    out = view4(dst).reshape(n, od, oh, ow, ic, kd, kh, kw)
    zz, okz = _taps(od, kd, s2, d2, p2, idd)  # (OD, KD)
    yy, oky = _taps(oh, kh, s1, d1, p1, ih)
    xx, okx = _taps(ow, kw, s0, d0, p0, iw)
    chans = list(range(params.ith, ic, params.nth))
    for b in range(n):
        for c in chans:
            v = vol[b * ic + c]
            g = v[zz[:, None, None, :, None, None], yy[None, :, None, None, :, None], xx[None, None, :, None, None, :]]
            ok = (okz[:, None, None, :, None, None] & oky[None, :, None, None, :, None]
                  & okx[None, None, :, None, None, :])
            out[b, :, :, :, c] = from_f32(np.where(ok, g, np.float32(0)), dst.type)
    params.took(ShareKind.INTERLEAVED, *chans)


@kernel(GGMLOp.CONV_3D, n_tasks=all_threads, work=_im2col_work)
def compute_forward_conv_3d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_3d: the output positions ("patches") in batches sized by the work
    buffer; in each batch each thread gathers its share of patches (in the kernel's type), then the
    batch is one mul_mat with the kernels (ggml's vec_dot, F32 or F16) and each thread scatters its
    share into dst."""
    knl, src = dst.source(0), dst.source(1)
    fn = "ggml_compute_forward_conv_3d_impl"
    ggml_assert(ggml_is_contiguous(knl), "ggml_is_contiguous(kernel)", fn)
    ggml_assert(knl.type in (GGMLType.F16, GGMLType.F32),
                "kernel_type == GGML_TYPE_F16 || kernel_type == GGML_TYPE_F32", fn)
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc = (int(v) for v in dst.op_params[:12])
    kw, kh, kd = int(knl.ne[0]), int(knl.ne[1]), int(knl.ne[2])
    sw, sh, sd = int(src.ne[0]), int(src.ne[1]), int(src.ne[2])
    ow, oh, od = int(dst.ne[0]), int(dst.ne[1]), int(dst.ne[2])
    k_total = kw * kh * kd * c
    total = n * ow * oh * od
    ts = TYPE_TRAITS[knl.type].type_size
    batch_size = params.wsize // (k_total * ts + oc * 4)
    per_batch = (batch_size // 8) * 8 if batch_size > 8 else batch_size
    ggml_assert(per_batch > 0 and batch_size >= 1, "patches_per_batch > 0 && batch_size >= 1", fn)
    half = knl.type == GGMLType.F16
    weights = to_f32(view4(knl), knl.type).reshape(oc, k_total)
    vol, d4 = view4(src), view4(dst)  # (C·N, D, H, W), (OC·N, OD, OH, OW)
    done = []
    for start in range(0, total, per_batch):
        end = min(start + per_batch, total)
        a, b = thread_range(end - start, params.ith, params.nth)
        done.append(Interval(start + a, start + max(a, b)))
        if a >= b:
            continue
        p = np.arange(start + a, start + b)
        img, rem = p // (ow * oh * od), p % (ow * oh * od)
        z, y, x = rem // (ow * oh), rem % (ow * oh) // ow, rem % ow
        zz = z[:, None] * s2 + np.arange(kd)[None, :] * d2 - p2  # (P, KD)
        yy = y[:, None] * s1 + np.arange(kh)[None, :] * d1 - p1
        xx = x[:, None] * s0 + np.arange(kw)[None, :] * d0 - p0
        ok = (((zz >= 0) & (zz < sd))[:, None, :, None, None] & ((yy >= 0) & (yy < sh))[:, None, None, :, None]
              & ((xx >= 0) & (xx < sw))[:, None, None, None, :])
        g = vol[(img[:, None] * c + np.arange(c)[None, :])[:, :, None, None, None],
                np.clip(zz, 0, sd - 1)[:, None, :, None, None], np.clip(yy, 0, sh - 1)[:, None, None, :, None],
                np.clip(xx, 0, sw - 1)[:, None, None, None, :]]
        patches = np.where(ok, g, np.float32(0)).reshape(len(p), k_total)
        if half:
            patches = patches.astype(np.float16).astype(np.float32)
        out = vec_dot_f16(weights, patches) if half else vec_dot_f32(weights, patches)  # (P, OC)
        d4[(img[:, None] * oc + np.arange(oc)[None, :]), z[:, None], y[:, None], x[:, None]] = out
    params.took(ShareKind.ROWS, *done)


def _pool_src_rows(dst: Tensor, src: Tensor, n_rows: int, row_stride: int) -> np.ndarray:
    """Rows of src as the pool kernels read them: n_rows rows row_stride bytes apart, packed."""
    es = TYPE_TRAITS[src.type].type_size
    if int(src.nb[0]) != es or (n_rows - 1) * row_stride + int(src.ne[0]) * es > ggml_nbytes(src):
        raise not_supported(dst, "the pool kernels read rows as packed and evenly spaced")
    x = strided(src, (n_rows, int(src.ne[0])), (row_stride, es), dtype=NUMPY_DTYPE[GGMLType(src.type)])
    return to_f32(x, src.type)


def _pool_taps(x: np.ndarray, idx: np.ndarray, ok: np.ndarray, op: int):
    """Apply the taps one at a time, in kernel order, over the last axis of x."""
    res = np.full(x.shape[:-1] + (idx.shape[0],), F32(0) if op == GGML_OP_POOL_AVG else -FLT_MAX,
                  F32)
    n = np.zeros(idx.shape[0], np.int64)
    for k in range(idx.shape[1]):
        v = x[..., idx[:, k]]
        if op == GGML_OP_POOL_AVG:
            res = np.where(ok[:, k], res + v, res)
        else:  # std::max(v, res)
            res = np.where(ok[:, k] & ~(v < res), v, res)
        n += ok[:, k]
    return res, n


@kernel(GGMLOp.POOL_1D, n_tasks=one_thread, work=no_work)
def compute_forward_pool_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_pool_1d: thread 0 pools every row."""
    src = dst.source(0)
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    op, k, s, p = (int(x) for x in dst.op_params[:4])
    if op not in (GGML_OP_POOL_MAX, GGML_OP_POOL_AVG) or src.type not in (GGMLType.F32,
                                                                          GGMLType.F16):
        raise not_supported(dst, "pool op MAX/AVG of F32/F16 only (ggml aborts otherwise)")
    nr, iw, ow = ggml_nrows(src), int(src.ne[0]), int(dst.ne[0])
    x = _pool_src_rows(dst, src, nr, int(src.nb[1]))
    idx, ok = _taps(ow, k, s, 1, p, iw)
    res, n = _pool_taps(x, idx, ok, op)
    if op == GGML_OP_POOL_AVG:
        with np.errstate(invalid="ignore", divide="ignore"):
            res = np.where(n > 0, res / n.astype(F32), F32(0))
    strided(dst, (nr, ow), (int(dst.nb[1]), 4), dtype=F32)[:] = res
    params.took(ShareKind.ALL)


@kernel(GGMLOp.POOL_2D, n_tasks=one_thread, work=no_work)
def compute_forward_pool_2d(params, dst: Tensor) -> None:
    """ggml_compute_forward_pool_2d: thread 0 pools every plane (planes nb[2] apart)."""
    src = dst.source(0)
    if params.ith != 0:
        params.took(ShareKind.IDLE)
        return
    op, k0, k1, s0, s1, p0, p1 = (int(x) for x in dst.op_params[:7])
    if op not in (GGML_OP_POOL_MAX, GGML_OP_POOL_AVG) or src.type not in (GGMLType.F32,
                                                                          GGMLType.F16):
        raise not_supported(dst, "pool op MAX/AVG of F32/F16 only (ggml aborts otherwise)")
    ne0, ne1 = int(src.ne[0]), int(src.ne[1])
    nb1, nb2 = int(src.nb[1]), int(src.nb[2])
    n_planes = -(-ggml_nbytes(src) // nb2)  # the kernel walks planes until the data ends
    if n_planes != int(src.ne[2]) * int(src.ne[3]):
        raise not_supported(dst, "pool_2d walks planes nb[2] apart to the end of the data")
    px, py = int(dst.ne[0]), int(dst.ne[1])
    es = TYPE_TRAITS[src.type].type_size
    if int(src.nb[0]) != es:
        raise not_supported(dst, "pool_2d reads rows as packed")
    x = to_f32(strided(src, (n_planes, ne1, ne0), (nb2, nb1, es),
                       dtype=NUMPY_DTYPE[GGMLType(src.type)]), src.type)
    iy, oky = _taps(py, k1, s1, 1, p1, ne1)  # (py, k1)
    ix, okx = _taps(px, k0, s0, 1, p0, ne0)  # (px, k0)
    res = np.full((n_planes, py, px), F32(0) if op == GGML_OP_POOL_AVG else -FLT_MAX, F32)
    for ky in range(k1):
        for kx in range(k0):
            v = x[:, iy[:, ky][:, None], ix[:, kx][None, :]]
            ok = oky[:, ky][:, None] & okx[:, kx][None, :]
            if op == GGML_OP_POOL_AVG:
                res = np.where(ok, res + v, res)
            else:
                res = np.where(ok & ~(v < res), v, res)
    if op == GGML_OP_POOL_AVG:
        res = res / F32(k0 * k1)
    strided(dst, (n_planes, py, px), (py * px * 4, px * 4, 4), dtype=F32)[:] = res
    params.took(ShareKind.ALL)
