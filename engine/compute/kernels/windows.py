"""Segment Anything's windowed attention ops: WIN_PART and WIN_UNPART (an image cut into w×w
windows and put back), GET_REL_POS and ADD_REL_POS (the decomposed relative positions added to the
attention scores) (ggml-cpu/ops.cpp).

win_part, win_unpart and get_rel_pos run on thread 0 alone (copies); add_rel_pos copies a on
thread 0 unless in place, then the threads split the patches as get_thread_range does.

Numerics: copies, and float32 additions in ggml's order: ggml's bits on every CPU.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels import all_threads, kernel, no_work, not_supported, one_thread
from engine.compute.kernels.common import thread_range, view4
from engine.compute.shares import Interval, ShareKind
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor
from engine.core.types import GGMLType


@kernel(GGMLOp.WIN_PART, n_tasks=one_thread, work=no_work)
def compute_forward_win_part(params, dst: Tensor) -> None:
    """ggml_compute_forward_win_part_f32: window (px, py) of the image, zeros past its edge."""
    src = dst.source(0)
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    npx, npy, w = (int(x) for x in dst.op_params[:3])
    img = view4(src)[0]  # (H, W, C)
    h, wd, c = img.shape
    padded = np.zeros((npy * w, npx * w, c), np.float32)
    padded[:h, :wd] = img
    # (npy, w, npx, w, C) -> windows in row-major order of (py, px)
    view4(dst)[...] = padded.reshape(npy, w, npx, w, c).transpose(0, 2, 1, 3, 4).reshape(npy * npx, w, w, c)
    params.took(ShareKind.ALL)


@kernel(GGMLOp.WIN_UNPART, n_tasks=one_thread, work=no_work)
def compute_forward_win_unpart(params, dst: Tensor) -> None:
    """ggml_compute_forward_win_unpart_f32: the windows laid back side by side, cut to [C, w0, h0]."""
    src = dst.source(0)
    if src.type != GGMLType.F32:
        raise not_supported(dst)
    w = int(dst.op_params[0])
    c, w0, h0 = int(dst.ne[0]), int(dst.ne[1]), int(dst.ne[2])
    npx = (w0 + (w - w0 % w) % w) // w
    npy = -(-h0 // w)
    wins = view4(src)[:npy * npx].reshape(npy, npx, w, w, c)
    view4(dst)[0] = wins.transpose(0, 2, 1, 3, 4).reshape(npy * w, npx * w, c)[:h0, :w0]
    params.took(ShareKind.ALL)


@kernel(GGMLOp.GET_REL_POS, n_tasks=one_thread, work=no_work)
def compute_forward_get_rel_pos(params, dst: Tensor) -> None:
    """ggml_compute_forward_get_rel_pos_f16: row (query i2, key i1) is table row (w - i1 - 1) + i2,
    its 16-bit values copied (F16 or BF16 alike)."""
    src = dst.source(0)
    if src.type not in (GGMLType.F16, GGMLType.BF16):
        raise not_supported(dst)
    table = view4(src)[0, 0].view(np.uint16)  # (2w - 1, C)
    w, qh = int(dst.ne[1]), int(dst.ne[2])
    pos = (w - 1 - np.arange(w))[None, :] + np.arange(qh)[:, None]  # (qh, w)
    view4(dst)[0].view(np.uint16)[...] = table[pos]
    params.took(ShareKind.ALL)


@kernel(GGMLOp.ADD_REL_POS, n_tasks=all_threads, work=no_work)
def compute_forward_add_rel_pos(params, dst: Tensor) -> None:
    """ggml_compute_forward_add_rel_pos_f32: (unless in place, thread 0 first copies a; barrier)
    each thread its patches: block element [r, c] gets ph[r] and pw[c], in ggml's order (the row's
    add first where r <= c)."""
    a, pw, ph = dst.source(0), dst.source(1), dst.source(2)
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
    params.took(ShareKind.ROWS, Interval(ip0, ip1))
