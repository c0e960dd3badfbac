"""MUL_MAT of a repacked weight: ggml-cpu's CPU_REPACK tensor_traits::forward_mul_mat (repack.cpp).

When src0 lives in a CPU_REPACK buffer (engine/backend/repack.py), ggml's compute_forward hands the
node to the buffer type's tensor traits before its own MUL_MAT (ggml_cpu_extra_compute_forward),
and the plan asks them for the work size first (ggml_cpu_extra_work_size):

1. Each plane of src1 is quantized into the work buffer as the layout's activation type (Q8_0 or
   Q8_K): rows in groups of 4, interleaved (ggml_quantize_mat_t; thread ith takes groups ith,
   ith + nth, ...), the rows left over one at a time (the type's from_float; rows ith, ith + nth,
   ...). Barrier.
2. src0's rows are cut into chunks (about 4 a thread, none narrower than the layout's 8 rows, their
   bounds rounded up to multiples of 8), times src1's planes; each thread starts with chunk ith and
   takes the next from the shared counter. A chunk multiplies its rows by the plane: gemm for each
   group of 4 activation rows, gemv for the rest.

Every output is one weight row against one activation row, and its value depends only on whether
that activation row went through gemm or gemv (the row's place in its plane), never on the chunks:
so the values are computed plane by plane by the family's `product`
(engine/compute/kernels/repack_q8_0.py, repack_q8_k.py), and the chunks are what the trace shows
as each thread's share.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.compute.kernels.common import view4
from engine.compute.shares import Interval, ShareKind, Tile
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.tensor import Tensor, ggml_n_dims, ggml_nelements
from engine.core.types import GGMLType, ggml_row_size
from engine.quants.repack import RepackLayout

F32 = np.float32


def work_size(node: Tensor, layout: RepackLayout) -> int:
    """The traits' work_size for MUL_MAT: all of src1 as the activation type's rows."""
    return ggml_row_size(layout.vec_dot_type, ggml_nelements(node.src[1]))


def chunks(nr0: int, ne12: int, nth: int, rows: int) -> tuple[int, int]:
    """forward_mul_mat's chunking of src0's nr0 rows: (nchunk0, dr0); times ne12 planes."""
    nchunk0 = -(-nr0 // -(-nr0 // (nth * 4)))  # 4 chunks a thread
    if nchunk0 > 0 and nr0 // nchunk0 < rows and nr0 >= rows:  # none narrower than the layout
        nchunk0 = -(-nr0 // rows)
    dr0 = -(-nr0 // nchunk0)
    if nth == 1 or (nchunk0 < nth and -(-nr0 // nth) >= rows):  # one a thread, if wide enough
        nchunk0 = nth
        dr0 = -(-nr0 // nchunk0)
    return min(nchunk0, -(-nr0 // rows)), dr0


def chunk_rows(chunk: int, nchunk0: int, dr0: int, nr0: int, rows: int) -> Interval:
    """The src0 rows of one chunk, its bounds rounded up to multiples of the layout's rows (may
    be empty: a chunk past the last rows)."""
    start = dr0 * (chunk % nchunk0)
    end = min(start + dr0, nr0)
    start, end = -(-start // rows) * rows, min(-(-end // rows) * rows, nr0)
    return Interval(start, max(start, end))


def product_of(layout: RepackLayout):
    """The family's product(layout, packed, ne00, ne01, x, out) for the layout's activations."""
    if layout.vec_dot_type == GGMLType.Q8_K:
        from engine.compute.kernels.repack_q8_k import product
    else:
        from engine.compute.kernels.repack_q8_0 import product
    return product


def check(dst: Tensor) -> None:
    """forward_mul_mat's asserts: dst not transposed, 3-D at most, F32 activations, 2-D src0."""
    src0, src1 = dst.src[0], dst.src[1]
    fn = "forward_mul_mat"
    ggml_assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)", fn)
    ggml_assert(int(dst.nb[0]) <= int(dst.nb[1]) <= int(dst.nb[2]) <= int(dst.nb[3]), "nb1 <= nb2 <= nb3", fn)
    ggml_assert(int(src0.ne[3]) == 1 and int(src1.ne[3]) == 1, "ne03 == 1 && ne13 == 1", fn)
    ggml_assert(src1.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
    ggml_assert(ggml_n_dims(src0) == 2, "ggml_n_dims(op->src[0]) == 2", fn)


def compute_values(dst: Tensor, layout: RepackLayout, packed: np.ndarray) -> None:
    """Every plane's outputs, as ggml's chunks compute them: (ne11 rows of src1) x ne01."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    product = product_of(layout)
    x4, d4 = view4(src1), view4(dst)
    for i12 in range(int(src1.ne[2])):
        x = np.ascontiguousarray(x4[0, i12], dtype=F32)
        out = d4[0, i12]
        if out.flags.c_contiguous:
            product(layout, packed, ne00, ne01, x, out)
        else:
            tmp = np.empty(out.shape, F32)
            product(layout, packed, ne00, ne01, x, tmp)
            out[...] = tmp


def forward_mul_mat(params, dst: Tensor, layout: RepackLayout, packed: np.ndarray) -> None:
    """One thread's part of the node: thread 0 computes the values (every plane) before the
    barrier, then each thread takes its chunks from the counter, as the trace shows them."""
    check(dst)
    if params.ith == 0:
        compute_values(dst, layout, packed)
        params.shared["chunk"] = itertools.count(params.nth)  # atomic under the GIL
    if not params.alone:
        params.barrier()
    if not params.watched:
        return
    nr0, ne12 = int(dst.src[0].ne[1]), int(dst.src[1].ne[2])
    nchunk0, dr0 = chunks(nr0, ne12, params.nth, layout.rows)
    total = nchunk0 * ne12
    if params.alone or params.nth >= total:
        taken = list(range(params.ith, total, params.nth))
    else:
        taken, chunk = [], params.ith
        while chunk < total:
            taken.append(chunk)
            chunk = next(params.shared["chunk"])
    ne11 = int(dst.src[1].ne[1])
    done = [Tile(c, chunk_rows(c, nchunk0, dr0, nr0, layout.rows),
                 Interval((c // nchunk0) * ne11, (c // nchunk0 + 1) * ne11)) for c in taken]
    params.took(ShareKind.CHUNKS, *done, note=Note.of("repack_chunks", layout=layout.name,
                                                      n0=nchunk0, n1=ne12, d0=dr0))
