"""UPSCALE (interpolate), PAD, PAD_REFLECT_1D, ROLL and TIMESTEP_EMBEDDING, F32 (ggml-cpu/ops.cpp).

upscale: threads take dst planes i2 in turn, for every i3. With sf = ne/ne_src per dim (float),
nearest reads src[(int)(i/sf)]; bilinear samples at (i + 0.5)/sf - 0.5 (pixel_offset 0 and
sf = (ne-1)/(ne_src-1) with ALIGN_CORNERS) from the clamped 2x2 neighbours; bicubic uses the
a = -0.75 kernel on the clamped 4x4 neighbours. Dims 2 and 3 are always nearest.
pad: threads take rows i1 in turn in every (i2, i3); zero outside [lp, ne - rp), or wrap around
when circular. pad_reflect_1d takes rows i1 = ith, ith + nth, ... of every (i2, i3), each row
mirrored on both sides.
roll: rows split with per_thread = (rows + nth) / nth; each row comes from the row shifted back
(wrapped) in dims 1-3, rotated by the shift in dim 0.
timestep_embedding: for each timestep t, freq_j = exp(-ln(max_period)·j/half),
dst[j] = cos(t·freq_j), dst[j + half] = sin(t·freq_j); threads take j in turn.
Leaves out: bilinear with GGML_SCALE_FLAG_ANTIALIAS.

Numerics: TIMESTEP_EMBEDDING calls the C library's expf, logf, cosf and sinf (engine.libm), as
ggml does; interpolation and padding are IEEE operations: the same bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported
from engine.compute.kernels.common import view4
from engine.compute.kernels.nn_util import cosf, expf, logf, sinf
from engine.compute.kernels.views import strided
from engine.compute.shares import Interval, ShareKind
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.ops.nn import GGML_SCALE_FLAG_ALIGN_CORNERS, GGML_SCALE_FLAG_ANTIALIAS, \
    GGML_SCALE_MODE_BICUBIC, GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_NEAREST
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor
from engine.core.types import GGMLType

F32 = np.float32


def _nearest(n: int, sf: np.float32) -> np.ndarray:
    """(int64)(i / sf) for i < n, the division in float."""
    return (np.arange(n).astype(F32) / sf).astype(np.int64)


def _linear_coords(n: int, n_src: int, sf, po):
    """Bilinear: clamped lower/upper source index and the clamped fraction, per output index."""
    x = (np.arange(n).astype(F32) + po) / sf - po
    x0 = np.floor(x).astype(np.int64)
    x1 = x0 + 1
    x0, x1 = np.clip(x0, 0, n_src - 1), np.clip(x1, 0, n_src - 1)
    dx = np.clip(x - x0.astype(F32), F32(0), F32(1))
    return x0, x1, dx


def _bicubic_weights(t: np.ndarray):
    """Weights of the 4 taps at offsets -1, 0, 1, 2 for fraction t (a = -0.75, as PyTorch)."""
    a = F32(-0.75)

    def w1(x):
        return ((a + F32(2)) * x - (a + F32(3))) * x * x + F32(1)

    def w2(x):
        return ((a * x - F32(5) * a) * x + F32(8) * a) * x - F32(4) * a
    return w2(t + F32(1)), w1(t), w1(F32(1) - t), w2(F32(2) - t)


@kernel(GGMLOp.UPSCALE, n_tasks=all_threads, work=no_work)
def compute_forward_upscale(params, dst: Tensor) -> None:
    """ggml_compute_forward_upscale_f32."""
    src0 = dst.source(0)
    ggml_assert(src0.type == GGMLType.F32, "src0->type == GGML_TYPE_F32",
                "ggml_compute_forward_upscale_f32")
    ne0, ne1, ne2, ne3 = (int(x) for x in dst.ne)
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    sf = [F32(n) / F32(m) for n, m in ((ne0, ne00), (ne1, ne01), (ne2, ne02), (ne3, ne03))]
    po = F32(0.5)
    flags = int(dst.op_params[0])
    mode = flags & 0xFF
    if flags & GGML_SCALE_FLAG_ALIGN_CORNERS:
        po = F32(0)
        if ne0 > 1 and ne00 > 1:
            sf[0] = F32(ne0 - 1) / F32(ne00 - 1)
        if ne1 > 1 and ne01 > 1:
            sf[1] = F32(ne1 - 1) / F32(ne01 - 1)
    if mode == GGML_SCALE_MODE_BILINEAR and flags & GGML_SCALE_FLAG_ANTIALIAS:
        raise not_supported(dst, "antialiased bilinear is not implemented here")
    if mode not in (GGML_SCALE_MODE_NEAREST, GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_BICUBIC):
        raise not_supported(dst, "unsupported upscale mode (ggml aborts)")
    planes = np.arange(params.ith, ne2, params.nth)
    if len(planes):
        i03 = _nearest(ne3, sf[3])[:, None, None, None]
        i02 = (planes.astype(F32) / sf[2]).astype(np.int64)[None, :, None, None]
        s4 = view4(src0)
        out = view4(dst)[:, params.ith::params.nth]  # (ne3, planes, ne1, ne0)

        def px(iy, ix):
            return s4[i03, i02, iy[None, None, :, None], ix[None, None, None, :]]
        if mode == GGML_SCALE_MODE_NEAREST:
            out[...] = px(_nearest(ne1, sf[1]), _nearest(ne0, sf[0]))
        elif mode == GGML_SCALE_MODE_BILINEAR:
            y0, y1, dy = _linear_coords(ne1, ne01, sf[1], po)
            x0, x1, dx = _linear_coords(ne0, ne00, sf[0], po)
            dy, dx = dy[:, None], dx[None, :]
            one = F32(1)
            out[...] = (px(y0, x0) * (one - dx) * (one - dy) + px(y0, x1) * dx * (one - dy)
                        + px(y1, x0) * (one - dx) * dy + px(y1, x1) * dx * dy)
        else:
            y = (np.arange(ne1).astype(F32) + po) / sf[1] - po
            x = (np.arange(ne0).astype(F32) + po) / sf[0] - po
            y0, x0 = np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)
            dy, dx = y - y0.astype(F32), x - x0.astype(F32)
            wx = _bicubic_weights(dx)
            wy = _bicubic_weights(dy)
            rows = []
            for oy in range(-1, 3):
                iy = np.clip(y0 + oy, 0, ne01 - 1)
                acc = None
                for k, ox in enumerate(range(-1, 3)):
                    term = px(iy, np.clip(x0 + ox, 0, ne00 - 1)) * wx[k][None, :]
                    acc = term if acc is None else acc + term
                rows.append(acc)
            out[...] = (rows[0] * wy[0][:, None] + rows[1] * wy[1][:, None]
                        + rows[2] * wy[2][:, None] + rows[3] * wy[3][:, None])
    params.took(ShareKind.INTERLEAVED, *planes.tolist(), note=Note("dst_planes"))


@kernel(GGMLOp.PAD, n_tasks=all_threads, work=no_work)
def compute_forward_pad(params, dst: Tensor) -> None:
    """ggml_compute_forward_pad (f32; zeros or circular)."""
    src0 = dst.source(0)
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml pads F32 only")
    lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular = (int(x) for x in dst.op_params[:9])
    ne = [int(x) for x in dst.ne]
    ne_src = [int(x) for x in src0.ne]
    rows = np.arange(params.ith, ne[1], params.nth)
    if len(rows):
        index, valid = [], []
        for d, (lp, rp) in enumerate(((lp0, rp0), (lp1, rp1), (lp2, rp2), (lp3, rp3))):
            i = rows if d == 1 else np.arange(ne[d])
            if circular:
                index.append(np.fmod(i - lp + ne_src[d], ne_src[d]))  # C's % keeps the sign
                valid.append(np.ones(len(i), bool))
            else:
                ok = (i >= lp) & (i < ne[d] - rp)
                index.append(np.where(ok, i - lp, 0))
                valid.append(ok)
        s4 = view4(src0)
        vals = s4[np.ix_(index[3], index[2], index[1], index[0])]
        mask = (valid[3][:, None, None, None] & valid[2][None, :, None, None]
                & valid[1][None, None, :, None] & valid[0][None, None, None, :])
        out = strided(dst, (ne[3], ne[2], ne[1], ne[0]),
                      (4 * ne[0] * ne[1] * ne[2], 4 * ne[0] * ne[1], 4 * ne[0], 4), dtype=F32)
        out[:, :, params.ith::params.nth, :] = np.where(mask, vals, F32(0))
    params.took(ShareKind.INTERLEAVED, *rows.tolist(), note=Note("rows_i1"))


@kernel(GGMLOp.PAD_REFLECT_1D, n_tasks=all_threads, work=no_work)
def compute_forward_pad_reflect_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_pad_reflect_1d: the row copied in after p0, mirrored on both sides."""
    src = dst.source(0)
    fn = "ggml_compute_forward_pad_reflect_1d"
    ggml_assert(src.type == GGMLType.F32, "src0->type == GGML_TYPE_F32", fn)
    ggml_assert(dst.type == GGMLType.F32, "dst->type == GGML_TYPE_F32", fn)
    p0, p1 = int(dst.op_params[0]), int(dst.op_params[1])
    s4, d4 = view4(src), view4(dst)
    n, ne0 = int(src.ne[0]), int(dst.ne[0])
    rows = list(range(params.ith, int(dst.ne[1]), params.nth))
    for i1 in rows:
        row = s4[:, :, i1]
        d4[:, :, i1, p0:p0 + n] = row
        d4[:, :, i1, :p0] = row[:, :, p0 - np.arange(p0)]  # dst[p0 - k] = row[k]
        d4[:, :, i1, ne0 - p1:] = row[:, :, n - 2 - np.arange(p1)]  # dst[p0 + n - 1 + k] = row[n - 1 - k]
    params.took(ShareKind.INTERLEAVED, *rows)


@kernel(GGMLOp.ROLL, n_tasks=all_threads, work=no_work)
def compute_forward_roll(params, dst: Tensor) -> None:
    """ggml_compute_forward_roll_f32: dst row (i1, i2, i3) is src row (i1 - s1, i2 - s2, i3 - s3)
    (wrapped), rotated by s0."""
    src = dst.source(0)
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    s0, s1, s2, s3 = (int(x) for x in dst.op_params[:4])
    ne1, ne2, ne3 = (int(x) for x in dst.ne[1:])
    total = ne1 * ne2 * ne3
    per = (total + params.nth) // params.nth
    start, end = params.ith * per, min(params.ith * per + per, total)
    s4, d4 = view4(src), view4(dst)
    ne00 = int(src.ne[0])
    s = (-s0) % ne00  # ggml_wrap_index(-s0): the source element that comes first
    for i in range(start, end):
        i1, i2, i3 = i % ne1, i // ne1 % ne2, i // (ne2 * ne1)
        row = s4[(i3 - s3) % ne3, (i2 - s2) % ne2, (i1 - s1) % ne1]
        d4[i3, i2, i1] = np.concatenate([row[s:], row[:s]])
    params.took(ShareKind.ROWS, Interval(start, max(start, end)))


@kernel(GGMLOp.TIMESTEP_EMBEDDING, n_tasks=all_threads, work=no_work)
def compute_forward_timestep_embedding(params, dst: Tensor) -> None:
    """ggml_compute_forward_timestep_embedding_f32."""
    src0 = dst.source(0)
    if src0.type != GGMLType.F32:
        raise not_supported(dst, "ggml embeds F32 timesteps only")
    ggml_assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)",
                "ggml_compute_forward_timestep_embedding_f32")
    dim, max_period = int(dst.op_params[0]), int(dst.op_params[1])
    half = dim // 2
    ne00 = int(src0.ne[0])
    js = np.arange(params.ith, half, params.nth)
    t = strided(src0, (ne00,), (4,), dtype=F32)
    out = strided(dst, (ne00, int(dst.ne[0])), (int(dst.nb[1]), 4), dtype=F32)
    if len(js):
        freq = expf(-logf(F32(max_period)) * js.astype(F32) / F32(half))
        arg = t[:, None] * freq[None, :]
        out[:, js] = cosf(arg)
        out[:, js + half] = sinf(arg)
    if dim % 2 != 0 and params.ith == 0:
        out[:, 2 * half] = 0
    params.took(ShareKind.INTERLEAVED, *js.tolist(), note=Note("frequencies"))
