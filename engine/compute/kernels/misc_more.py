"""CUMSUM, DIAG, TRI, FILL, ROLL, ADD_ID, PAD_REFLECT_1D, SOLVE_TRI, Segment Anything's window and
relative-position ops, CONV_TRANSPOSE_1D/2D, CONV_2D_DW, COL2IM_1D, IM2COL_3D and CONV_3D (ggml-cpu/ops.cpp).

cumsum, tri, fill and add_id split rows as get_thread_range does (rows [dr·ith, dr·ith + dr),
dr = ceil(nrows/nth)); roll splits its rows with per_thread = (rows + nth) / nth; pad_reflect_1d
takes rows i1 = ith, ith + nth, ... of every (i2, i3); diag runs on thread 0 alone.

Numerics: copies, float32 additions one element at a time (a row's running sum in order, as
ggml_vec_cumsum_f32 adds), solve_tri's sums as the oracle's build compiles them: ggml's bits on
every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import kernel, not_supported
from engine.compute.kernels.common import from_f32, thread_range, to_f32, view4
from engine.compute.kernels.floatmath import fmaf, mac_in_order
from engine.compute.kernels.vecdot import vec_dot_f16, vec_dot_f32
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_is_contiguous_channels, ggml_nrows
from engine.core.types import GGMLType, TYPE_TRAITS


def _rows(t: Tensor) -> np.ndarray:
    """t's rows as (nrows, ne0), a strided view."""
    v = view4(t)
    return v.reshape(-1, v.shape[-1]) if v.flags.c_contiguous else v


def _row_index(ir: int, t: Tensor) -> tuple[int, int, int]:
    ne1, ne2 = int(t.ne[1]), int(t.ne[2])
    return ir // (ne2 * ne1), ir // ne1 % ne2, ir % ne1


@kernel(GGMLOp.CUMSUM)
def compute_forward_cumsum(params, dst: Tensor) -> None:
    """ggml_compute_forward_cumsum_f32: y[i] = y[i-1] + x[i] along each row."""
    src = dst.src[0]
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(int(src.nb[0]) == 4, "src0->nb[0] == sizeof(float)", "ggml_compute_forward_cumsum_f32")
    ggml_assert(int(dst.nb[0]) == 4, "dst->nb[0] == sizeof(float)", "ggml_compute_forward_cumsum_f32")
    ir0, ir1 = thread_range(ggml_nrows(src), params.ith, params.nth)
    s4, d4 = view4(src), view4(dst)
    for ir in range(ir0, ir1):
        i3, i2, i1 = _row_index(ir, src)
        d4[i3, i2, i1] = np.add.accumulate(s4[i3, i2, i1], dtype=np.float32)
    params.took("rows", (ir0, ir1))


@kernel(GGMLOp.DIAG)
def compute_forward_diag(params, dst: Tensor) -> None:
    """ggml_compute_forward_diag_f32: thread 0 writes each [n, n] matrix, src's row on its
    diagonal and zeros elsewhere."""
    src = dst.src[0]
    fn = "ggml_compute_forward_diag_f32"
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    if params.ith != 0:
        params.took("idle")
        return
    n = int(src.ne[0])
    ggml_assert(int(dst.ne[0]) == n and int(dst.ne[1]) == n, "ne00 == ne0 && ne00 == ne1", fn)
    ggml_assert(int(src.nb[0]) == 4, "nb00 == sizeof(float)", fn)
    ggml_assert(int(dst.nb[0]) == 4, "nb0  == sizeof(float)", fn)
    s4, d4 = view4(src), view4(dst)
    d4[...] = 0
    idx = np.arange(n)
    d4[:, :, idx, idx] = s4[:, :, 0, :]
    params.took("all")


_KEEP = {0: np.greater_equal, 1: np.greater, 2: np.less_equal, 3: np.less}  # (i0, i01) -> kept?


@kernel(GGMLOp.TRI)
def compute_forward_tri(params, dst: Tensor) -> None:
    """ggml_compute_forward_tri_f32: element i0 of row i01 kept where the triangle holds it."""
    src = dst.src[0]
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(ggml_is_contiguous(src), "ggml_is_contiguous(src0)", "ggml_compute_forward_tri_f32")
    keep = _KEEP.get(int(dst.op_params[0]))
    ggml_assert(keep is not None, "tri type", "ggml_compute_forward_tri_f32", "invalid tri type")
    ir0, ir1 = thread_range(ggml_nrows(src), params.ith, params.nth)
    s4, d4 = view4(src), view4(dst)
    i0 = np.arange(int(dst.ne[0]))
    for ir in range(ir0, ir1):
        i3, i2, i1 = _row_index(ir, src)
        d4[i3, i2, i1] = np.where(keep(i0, i1), s4[i3, i2, i1], np.float32(0))
    params.took("rows", (ir0, ir1))


@kernel(GGMLOp.FILL)
def compute_forward_fill(params, dst: Tensor) -> None:
    """ggml_compute_forward_fill_f32/f16: every element of this thread's rows set to c."""
    if dst.src[0].type not in (GGMLType.F32, GGMLType.F16):
        raise not_supported(dst)
    c = np.array([dst.op_params[0]], np.int32).view(np.float32)
    value = from_f32(c, dst.type)[0]
    ir0, ir1 = thread_range(ggml_nrows(dst), params.ith, params.nth)
    d4 = view4(dst)
    for ir in range(ir0, ir1):
        i3, i2, i1 = _row_index(ir, dst)
        d4[i3, i2, i1] = value
    params.took("rows", (ir0, ir1))


@kernel(GGMLOp.ROLL)
def compute_forward_roll(params, dst: Tensor) -> None:
    """ggml_compute_forward_roll_f32: dst row (i1, i2, i3) is src row (i1 - s1, i2 - s2, i3 - s3)
    (wrapped), rotated by s0."""
    src = dst.src[0]
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
    params.took("rows", (start, max(start, end)))


@kernel(GGMLOp.ADD_ID)
def compute_forward_add_id(params, dst: Tensor) -> None:
    """ggml_compute_forward_add_id_f32: row (i1, i2) of a plus the row of b that ids[i1, i2] names."""
    a, b, ids = dst.src[0], dst.src[1], dst.src[2]
    fn = "ggml_compute_forward_add_id_f32"
    if a.type != GGMLType.F32:
        raise not_supported(dst)
    ggml_assert(dst.type == GGMLType.F32, "dst->type  == GGML_TYPE_F32", fn)
    ggml_assert(b.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
    ggml_assert(ids.type == GGMLType.I32, "src2->type == GGML_TYPE_I32", fn)
    ggml_assert(int(a.nb[0]) == 4 and int(b.nb[0]) == 4, "src0->nb[0] == sizeof(float)", fn)
    ir0, ir1 = thread_range(ggml_nrows(a), params.ith, params.nth)
    a4, b4, d4, id4 = view4(a), view4(b), view4(dst), view4(ids)
    ne11 = int(b.ne[1])
    for ir in range(ir0, ir1):
        i3, i2, i1 = _row_index(ir, a)
        i11 = int(id4[0, 0, i2, i1])
        ggml_assert(0 <= i11 < ne11, "i11 >= 0 && i11 < ne11", fn, f"id {i11} of {ne11} rows")
        d4[i3, i2, i1] = a4[i3, i2, i1] + b4[0, 0, i11]
    params.took("rows", (ir0, ir1))


@kernel(GGMLOp.PAD_REFLECT_1D)
def compute_forward_pad_reflect_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_pad_reflect_1d: the row copied in after p0, mirrored on both sides."""
    src = dst.src[0]
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
    params.took("interleaved", *rows)


@kernel(GGMLOp.SOLVE_TRI)
def compute_forward_solve_tri(params, dst: Tensor) -> None:
    """ggml_compute_forward_solve_tri_f32: A·X = B by forward substitution (A lower triangular),
    one column of X at a time; the threads split the (batch, column) pairs. Row i's running sum
    of A[i, t]·X[t] is the compiled loop's (floatmath.mac_in_order), then x = (b - sum) / diag."""
    a, b = dst.src[0], dst.src[1]
    fn = "ggml_compute_forward_solve_tri_f32"
    for t, name in ((a, "src0"), (b, "src1"), (dst, "dst")):
        ggml_assert(t.type == GGMLType.F32, f"{name}->type == GGML_TYPE_F32", fn)
    n, k = int(b.ne[1]), int(b.ne[0])
    ne02 = int(a.ne[2])
    nr = ne02 * int(a.ne[3]) * k
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    a4, b4, x4 = view4(a), view4(b), view4(dst)
    units: dict[tuple[int, int], list[int]] = {}
    for ir in range(ir0, ir1):
        units.setdefault((ir // (ne02 * k), ir // k % ne02), []).append(ir % k)
    for (i03, i02), cols in units.items():
        A, B, X = a4[i03, i02], b4[i03, i02], x4[i03, i02]
        for i in range(n):
            s = np.zeros(len(cols), np.float32)
            for t in range(i):
                s = mac_in_order(s, A[i, t], X[t, cols], t, i)
            X[i, cols] = (B[i, cols] - s) / A[i, i]
    params.took("rows", (ir0, ir1))


# --- Segment Anything's windows and relative positions (single-threaded copies, and adds) ------

@kernel(GGMLOp.WIN_PART)
def compute_forward_win_part(params, dst: Tensor) -> None:
    """ggml_compute_forward_win_part_f32: window (px, py) of the image, zeros past its edge."""
    src = dst.src[0]
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    npx, npy, w = (int(x) for x in dst.op_params[:3])
    img = view4(src)[0]  # (H, W, C)
    h, wd, c = img.shape
    padded = np.zeros((npy * w, npx * w, c), np.float32)
    padded[:h, :wd] = img
    # (npy, w, npx, w, C) -> windows in row-major order of (py, px)
    view4(dst)[...] = padded.reshape(npy, w, npx, w, c).transpose(0, 2, 1, 3, 4).reshape(npy * npx, w, w, c)
    params.took("all")


@kernel(GGMLOp.WIN_UNPART)
def compute_forward_win_unpart(params, dst: Tensor) -> None:
    """ggml_compute_forward_win_unpart_f32: the windows laid back side by side, cut to [C, w0, h0]."""
    src = dst.src[0]
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    w = int(dst.op_params[0])
    c, w0, h0 = int(dst.ne[0]), int(dst.ne[1]), int(dst.ne[2])
    npx = (w0 + (w - w0 % w) % w) // w
    npy = -(-h0 // w)
    wins = view4(src)[:npy * npx].reshape(npy, npx, w, w, c)
    view4(dst)[0] = wins.transpose(0, 2, 1, 3, 4).reshape(npy * w, npx * w, c)[:h0, :w0]
    params.took("all")


@kernel(GGMLOp.GET_REL_POS)
def compute_forward_get_rel_pos(params, dst: Tensor) -> None:
    """ggml_compute_forward_get_rel_pos_f16: row (query i2, key i1) is table row (w - i1 - 1) + i2,
    its 16-bit values copied (F16 or BF16 alike)."""
    src = dst.src[0]
    if src.type not in (GGMLType.F16, GGMLType.BF16):
        raise not_supported(dst)
    table = view4(src)[0, 0].view(np.uint16)  # (2w - 1, C)
    w, qh = int(dst.ne[1]), int(dst.ne[2])
    pos = (w - 1 - np.arange(w))[None, :] + np.arange(qh)[:, None]  # (qh, w)
    view4(dst)[0].view(np.uint16)[...] = table[pos]
    params.took("all")


@kernel(GGMLOp.ADD_REL_POS)
def compute_forward_add_rel_pos(params, dst: Tensor) -> None:
    """ggml_compute_forward_add_rel_pos_f32: (unless in place, thread 0 first copies a; barrier)
    each thread its patches: block element [r, c] gets ph[r] and pw[c], in ggml's order (the row's
    add first where r <= c)."""
    a, pw, ph = dst.src[0], dst.src[1], dst.src[2]
    if a.type != GGMLType.F32:
        raise not_supported(dst)
    if not int(dst.op_params[0]):
        if params.ith == 0:
            view4(dst)[...] = view4(a)
        params.barrier()
    k, ne11, ne12, np_ = (int(x) for x in pw.ne)
    ip0, ip1 = thread_range(np_, params.ith, params.nth)
    blocks = view4(dst)[0].reshape(np_, ne12, ne11, k, k)
    w4, h4 = view4(pw), view4(ph)  # (np, ne12, ne11, k)
    r, c = np.arange(k)[:, None], np.arange(k)[None, :]
    rows_first = r <= c
    for i13 in range(ip0, ip1):
        m = blocks[i13]
        add_h = h4[i13][..., :, None]  # ph[r] along each row
        add_w = w4[i13][..., None, :]  # pw[c] along each column
        blocks[i13] = np.where(rows_first, (m + add_h) + add_w, (m + add_w) + add_h)
    params.took("rows", (ip0, ip1))


@kernel(GGMLOp.CONV_TRANSPOSE_1D)
def compute_forward_conv_transpose_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_transpose_1d_f32/f16: thread 0 lays the kernel out as (C_out, K,
    C_in) and the input as (L, C_in) in the work buffer (F16 for an F16 kernel) and zeroes dst;
    barrier; then each thread its output channels: for input position l and tap k, the vec_dot over
    C_in is added to dst[l·s0 + k], l by l."""
    w, x = dst.src[0], dst.src[1]
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
    params.took("rows", (ir0, ir1))


@kernel(GGMLOp.CONV_2D_DW)
def compute_forward_conv_2d_dw(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_2d_dw: each output pixel of each channel the sum over the kernel's
    taps inside the image, in tap order (row by row), as a chain of fused multiply-adds. A
    contiguous (WHCN) image: the threads split the (channel, image) planes; a channels-first
    (CWHN) one: the (output row, image) rows."""
    knl, src = dst.src[0], dst.src[1]
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
            y = oy * sy + ky * dy - py
            if y < 0 or y >= h:
                continue
            for kx in range(kw):
                x = xs[0] + kx * dx - px
                ok = (x >= 0) & (x < w)
                val = src4[img, :, y][:, np.clip(x, 0, w - 1)]
                acc = np.where(ok, fmaf(k4[:, 0, ky, kx][:, None], val, acc), acc)
        d4[img, :, oy] = acc
    params.took("rows", (start, max(start, end)))


@kernel(GGMLOp.CONV_TRANSPOSE_2D)
def compute_forward_conv_transpose_2d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_transpose_2d: thread 0 lays the kernel (C_in innermost) and the
    first image (C_in innermost; F16 for an F16 kernel) out in the work buffer and zeroes dst;
    barrier; each thread its output channels: for each input pixel, in order, each tap's vec_dot
    over C_in is added to dst[y·s + ky, x·s + kx]. (ggml computes the first image only.)"""
    w, x = dst.src[0], dst.src[1]
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
    params.took("rows", (ip0, ip1))


@kernel(GGMLOp.COL2IM_1D)
def compute_forward_col2im_1d(params, dst: Tensor) -> None:
    """ggml_compute_forward_col2im_1d: each thread its stretch of output times (dr = ceil(T/nth));
    out[t, oc] = the taps (t_in, k) with t_in·s0 + k = t + p0, summed in t_in order (in float,
    then stored in the tensor's type)."""
    col = dst.src[0]
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
    params.took("rows", (it0, max(it0, it1)))


@kernel(GGMLOp.IM2COL_3D)
def compute_forward_im2col_3d(params, dst: Tensor) -> None:
    """ggml_compute_forward_im2col_3d_f32/f16: threads take input channels in turn (ic = ith,
    ith + nth, ...); each output position's patch [IC, KD, KH, KW], zeros outside the volume."""
    knl, src = dst.src[0], dst.src[1]
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
    z = np.arange(od)[:, None] * s2 + np.arange(kd)[None, :] * d2 - p2  # (OD, KD)
    y = np.arange(oh)[:, None] * s1 + np.arange(kh)[None, :] * d1 - p1
    x = np.arange(ow)[:, None] * s0 + np.arange(kw)[None, :] * d0 - p0
    okz, oky, okx = (z >= 0) & (z < idd), (y >= 0) & (y < ih), (x >= 0) & (x < iw)
    zz, yy, xx = np.clip(z, 0, idd - 1), np.clip(y, 0, ih - 1), np.clip(x, 0, iw - 1)
    chans = list(range(params.ith, ic, params.nth))
    for b in range(n):
        for c in chans:
            v = vol[b * ic + c]
            g = v[zz[:, None, None, :, None, None], yy[None, :, None, None, :, None], xx[None, None, :, None, None, :]]
            ok = okz[:, None, None, :, None, None] & oky[None, :, None, None, :, None] & okx[None, None, :, None, None, :]
            out[b, :, :, :, c] = from_f32(np.where(ok, g, np.float32(0)), dst.type)
    params.took("interleaved", *chans)


@kernel(GGMLOp.CONV_3D)
def compute_forward_conv_3d(params, dst: Tensor) -> None:
    """ggml_compute_forward_conv_3d: the output positions ("patches") in batches sized by the work
    buffer; in each batch each thread gathers its share of patches (in the kernel's type), then the
    batch is one mul_mat with the kernels (ggml's vec_dot, F32 or F16) and each thread scatters its
    share into dst."""
    knl, src = dst.src[0], dst.src[1]
    fn = "ggml_compute_forward_conv_3d_impl"
    ggml_assert(ggml_is_contiguous(knl), "ggml_is_contiguous(kernel)", fn)
    ggml_assert(knl.type in (GGMLType.F16, GGMLType.F32), "kernel_type == GGML_TYPE_F16 || kernel_type == GGML_TYPE_F32", fn)
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
        done.append((start + a, start + max(a, b)))
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
    params.took("rows", *done)
