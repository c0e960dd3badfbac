"""IM2COL, CONV_2D (direct), POOL_1D and POOL_2D (ggml-cpu/ops.cpp).

im2col:
    dst[n, oh, ow, ic·KH·KW + kh·KW + kw] = src[n, ic, oh·s1 + kh·d1 - p1, ow·s0 + kw·d0 - p0]
(0 outside the image). Threads take input channels in turn (ic = ith, ith + nth, ...). Within a
channel the source plane is read as packed rows of IW elements, from the batch and channel strides
only.

conv_2d (direct): output pixels ("patches") are processed in batches sized by the work buffer;
in each batch thread ith im2cols its dr range of patches (converted to the kernel's type), a GEMM
with the kernel follows (ggml splits it as mul_mat does), then the same thread range scatters the
results to dst. Here each thread computes the GEMM rows of its own patches.

pool_1d / pool_2d: thread 0 alone. Out-of-range taps are skipped; pool_1d averages over the taps
it used, pool_2d divides by k0·k1 always. Max starts from -FLT_MAX.

Numerics: im2col and the pools are copies and IEEE operations (ggml's bits on every CPU);
conv_2d's GEMM is a float64 BLAS product rounded to float: ggml's result to rounding, its last
bits the CPU's BLAS kernel's (registered with blas=True).
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import kernel, not_supported
from engine.compute.kernels.common import from_f32, thread_range, to_f32, view4
from engine.compute.kernels.nn_util import fp16_round
from engine.compute.kernels.views import strided
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.ops.nn import GGML_OP_POOL_AVG, GGML_OP_POOL_MAX
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nrows
from engine.core.types import NUMPY_DTYPE, GGMLType, TYPE_TRAITS

F32 = np.float32
FLT_MAX = np.finfo(F32).max


def _taps(n_out: int, n_k: int, stride: int, dil: int, pad: int, n_in: int):
    """Input index of every (output, tap) pair, clipped, and whether it is inside the input."""
    i = np.arange(n_out)[:, None] * stride + np.arange(n_k)[None, :] * dil - pad
    ok = (i >= 0) & (i < n_in)
    return np.where(ok, i, 0), ok


@kernel(GGMLOp.IM2COL)
def compute_forward_im2col(params, dst: Tensor) -> None:
    """ggml_compute_forward_im2col (f32 and f16 dst)."""
    src0, src1 = dst.src[0], dst.src[1]
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
    params.took("interleaved", *chans.tolist(), note=Note("input_channels"))


@kernel(GGMLOp.CONV_2D, blas=True)
def compute_forward_conv_2d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_2d: im2col by patch batches, GEMM with the kernel, scatter."""
    kern, src = dst.src[0], dst.src[1]
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
        done.append((start + a, start + b))
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
    params.took("rows", *done, note=(Note.of("conv_patches", n=per_batch), Note("conv_gemm")))


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


@kernel(GGMLOp.POOL_1D)
def compute_forward_pool_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_pool_1d: thread 0 pools every row."""
    src = dst.src[0]
    if params.ith != 0:
        params.took("idle")
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
    params.took("all")


@kernel(GGMLOp.POOL_2D)
def compute_forward_pool_2d(params, dst: Tensor) -> None:
    """ggml_compute_forward_pool_2d: thread 0 pools every plane (planes nb[2] apart)."""
    src = dst.src[0]
    if params.ith != 0:
        params.took("idle")
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
    params.took("all")
