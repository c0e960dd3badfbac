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

MUL_MAT_ID of repacked experts (a MoE layer's 3-D weights: forward_mul_mat_id) is simpler and
slower: every row of src1 is quantized plainly (the type's from_float; thread ith rows ith, ith +
nth, ... of each plane), thread 0 groups the (slot, token) rows by expert, barrier; then expert by
expert each thread multiplies a fixed range of its weight rows ([ith * ne01 / nth, (ith + 1) *
ne01 / nth), both ends rounded up to the layout's 8) by each of the expert's rows, one gemv per
row: no gemm, no chunk counter. A thread whose range is empty does nothing at all.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Callable

import numpy as np

from engine.compute.kernels.common import chunks_taken, view4
from engine.compute.shares import Interval, ShareKind, Tile
from engine.compute.kernels import not_supported
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_n_dims, ggml_nelements
from engine.core.types import GGMLType, TYPE_TRAITS, ggml_row_size
from engine.lanes import lanes
from engine.quants.repack import RepackLayout

F32 = np.float32
# struct mmid_row_mapping: the slot (which of the token's experts) and the token of one src1 row
MMID_ROW_MAPPING = np.dtype([("i1", np.int32), ("i2", np.int32)])


def work_size(node: Tensor, layout: RepackLayout) -> int:
    """The traits' work_size: all of src1 as the activation type's rows; for MUL_MAT_ID padded to
    8 bytes, then per expert an int64 row count and ne12 row mappings (8 bytes each)."""
    size = ggml_row_size(layout.vec_dot_type, ggml_nelements(node.source(1)))
    if node.op == GGMLOp.MUL_MAT_ID:
        n_as, ne12 = int(node.source(0).ne[2]), int(node.source(1).ne[2])
        size = -(-size // 8) * 8 + 8 * n_as * (ne12 + 1)
    return size


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
    src0, src1 = dst.source(0), dst.source(1)
    fn = "forward_mul_mat"
    ggml_assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)", fn)
    ggml_assert(int(dst.nb[0]) <= int(dst.nb[1]) <= int(dst.nb[2]) <= int(dst.nb[3]), "nb1 <= nb2 <= nb3", fn)
    ggml_assert(int(src0.ne[3]) == 1 and int(src1.ne[3]) == 1, "ne03 == 1 && ne13 == 1", fn)
    ggml_assert(src1.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
    ggml_assert(ggml_n_dims(src0) == 2, "ggml_n_dims(op->src[0]) == 2", fn)


def compute_values(dst: Tensor, layout: RepackLayout, packed: np.ndarray, threads: int = 1) -> None:
    """Every plane's outputs, as ggml's chunks compute them: (ne11 rows of src1) x ne01, the
    weight rows shared between `threads` threads inside the C loop (the same bits)."""
    for call in plane_calls(dst, layout, packed, threads):
        call()


def plane_calls(dst: Tensor, layout: RepackLayout, packed: np.ndarray, threads: int = 1
                ) -> tuple[Callable[[], None], ...]:
    """compute_values as one call per plane of src1, their views made once (what the kernel's
    prepare keeps for a graph computed again and again)."""
    src0, src1 = dst.source(0), dst.source(1)
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    product = product_of(layout)
    x4, d4 = view4(src1), view4(dst)

    def through(x: np.ndarray, out: np.ndarray) -> None:
        tmp = np.empty(out.shape, F32)
        product(layout, packed, ne00, ne01, x, tmp, threads)
        out[...] = tmp

    return tuple(partial(product, layout, packed, ne00, ne01, x4[0, i12], d4[0, i12], threads)
                 if d4[0, i12].flags.c_contiguous else partial(through, x4[0, i12], d4[0, i12])
                 for i12 in range(int(src1.ne[2])))


def forward_mul_mat(params, dst: Tensor, layout: RepackLayout, packed: np.ndarray) -> None:
    """One thread's part of the node: thread 0 computes the values (every plane) before the
    barrier, its C loop sharing the rows with the compute's threads (the others wait at the
    barrier), then each thread takes its chunks from the counter, as the trace shows them."""
    check(dst)
    if params.ith == 0:
        compute_values(dst, layout, packed, params.cores)
        params.shared["chunk"] = itertools.count(params.nth)  # atomic under the GIL
    if not params.alone:
        params.barrier()
    if not params.watched:
        return
    nr0, ne12 = int(dst.source(0).ne[1]), int(dst.source(1).ne[2])
    nchunk0, dr0 = chunks(nr0, ne12, params.nth, layout.rows)
    total = nchunk0 * ne12
    taken = chunks_taken(params, total)
    ne11 = int(dst.source(1).ne[1])
    done = [Tile(c, chunk_rows(c, nchunk0, dr0, nr0, layout.rows),
                 Interval((c // nchunk0) * ne11, (c // nchunk0 + 1) * ne11)) for c in taken]
    params.took(ShareKind.CHUNKS, *done, note=Note.of("repack_chunks", layout=layout.name,
                                                      n0=nchunk0, n1=ne12, d0=dr0))


# --- MUL_MAT_ID ----------------------------------------------------------------------------------

def activation_from_float(vdt: GGMLType, x: np.ndarray, out: np.ndarray) -> None:
    """The activation type's from_float of contiguous float32 rows x into out (their bytes):
    quantize_row_q8_0 of the AVX2 build, or quantize_row_q8_K (its reference loop there)."""
    (lanes.quantize_q8_0 if vdt == GGMLType.Q8_0 else lanes.quantize_q8_k)(x.reshape(-1), out.reshape(-1))


def gemv_of(layout: RepackLayout):
    """The family's gemv(layout, packed, ne00, ncols, xq, out, threads): out (nr, ncols) float32 of
    ncols repacked weight rows and nr plain activation rows xq (bytes), each row one gemv."""
    if layout.vec_dot_type == GGMLType.Q8_K:
        return gemv_q4_k
    from engine.compute.kernels.repack_q8_0 import gemv
    return gemv


def gemv_q4_k(layout: RepackLayout, packed: np.ndarray, ne00: int, ne01: int, xq: np.ndarray,
              out: np.ndarray, threads: int = 1) -> None:
    """ggml_gemv_q4_K_8x8_q8_K (engine/compute/kernels/repack_q8_k.py's C loop) of ne01 weight
    rows repacked as q4_K_8x8 and the plain Q8_K rows xq: out (nr, ne01) float32."""
    from engine.quants.repack_kquant import Q4_K_8X8
    assert layout is Q4_K_8X8 and out.dtype == F32 and out.flags.c_contiguous, layout.name
    lanes.gemv_q4_k_8x8(packed.reshape(-1), np.ascontiguousarray(xq).reshape(-1), out.reshape(-1),
                        ne00, len(out), ne01, 0, threads)


def check_id(dst: Tensor) -> None:
    """forward_mul_mat_id's asserts: src0 and src1 not permuted, dst neither, no 4th dimension,
    F32 activations."""
    src0, src1 = dst.source(0), dst.source(1)
    fn = "forward_mul_mat_id"
    ggml_assert(int(src0.nb[0]) == TYPE_TRAITS[src0.type].type_size, "nb00 == ggml_type_size(src0->type)", fn)
    ggml_assert(int(src1.nb[0]) == TYPE_TRAITS[src1.type].type_size, "nb10 == ggml_type_size(src1->type)", fn)
    ggml_assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)", fn)
    ggml_assert(int(dst.nb[0]) <= int(dst.nb[1]) <= int(dst.nb[2]) <= int(dst.nb[3]), "nb1 <= nb2 <= nb3", fn)
    ggml_assert(int(src0.ne[3]) == 1 and int(src1.ne[3]) == 1 and int(dst.ne[3]) == 1,
                "ne03 == 1 && ne13 == 1 && ne3 == 1", fn)
    ggml_assert(src1.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)


def quantize_src1(params, src1: Tensor, vdt: GGMLType) -> np.ndarray:
    """from_float of this thread's rows of src1 (i11 = ith, ith + nth, ... of every plane; alone,
    thread 0 all of them) into the work buffer; returns all the rows there: (ne12, ne11, nbw1)."""
    ne10, ne11, ne12 = (int(n) for n in src1.ne[:3])
    nbw1 = ggml_row_size(vdt, ne10)
    rows = params.wdata[:nbw1 * ne11 * ne12].reshape(ne12, ne11, nbw1)
    first, step = (params.ith, params.nth) if not params.alone else (0 if params.ith == 0 else ne11, 1)
    x = view4(src1)[0, :, first::step]  # (planes, this thread's rows, ne10)
    if x.size:
        q = np.empty((*x.shape[:2], nbw1), np.uint8)
        activation_from_float(vdt, np.ascontiguousarray(x, F32), q)
        rows[:, first::step] = q
    return rows


def write_row_mappings(params, dst: Tensor, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Thread 0's grouping of the rows by expert, written into the work buffer after src1's
    quantized rows (`start` bytes, padded to 8): matrix_row_counts (n_as int64), then matrix_rows
    (n_as * ne12 mmid_row_mapping, expert e's k-th row at e * ne12 + k), token by token, slot by
    slot. Returns both."""
    src0, ids = dst.source(0), dst.source(2)
    n_as, ne12 = int(src0.ne[2]), int(dst.source(1).ne[2])
    v = view4(ids)[0, 0]  # (tokens, slots) int32
    flat = v.reshape(-1).astype(np.int64)
    bad = np.flatnonzero((flat < 0) | (flat >= n_as))
    if bad.size:
        ggml_assert(False, "i02 >= 0 && i02 < n_as", "forward_mul_mat_id",
                    f"token {bad[0] // v.shape[1]} asks for expert {flat[bad[0]]} of {n_as}")
    counts = np.bincount(flat, minlength=n_as).astype(np.int64)
    if counts.max(initial=0) > ne12:  # (ggml's list would run into the next expert's)
        raise not_supported(dst, f"expert {int(counts.argmax())} gets {int(counts.max())} rows, more "
                                 f"than the {ne12} its list in matrix_rows holds")
    order = np.argsort(flat, kind="stable")  # by expert, then token, then slot
    by_e = flat[order]
    mappings = np.zeros(n_as * ne12, MMID_ROW_MAPPING)
    at = by_e * ne12 + np.arange(len(order)) - np.searchsorted(by_e, by_e)
    mappings["i1"][at], mappings["i2"][at] = order % v.shape[1], order // v.shape[1]
    at = -(-start // 8) * 8
    params.wdata[at:at + 8 * n_as] = counts.view(np.uint8)
    params.wdata[at + 8 * n_as:at + 8 * n_as + mappings.nbytes] = mappings.view(np.uint8)
    return counts, mappings


def columns(ith: int, nth: int, ne01: int, rows: int) -> Interval:
    """Thread ith's weight rows of every expert: [ith * ne01 / nth, (ith + 1) * ne01 / nth), both
    ends rounded up to a multiple of the layout's rows (and the end to ne01 at most)."""
    start, end = ith * ne01 // nth, (ith + 1) * ne01 // nth
    return Interval(-(-start // rows) * rows, min(-(-end // rows) * rows, ne01))


def forward_mul_mat_id(params, dst: Tensor, layout: RepackLayout, packed: np.ndarray) -> None:
    """tensor_traits::forward_mul_mat_id: one thread's part of the node (module docstring); the
    values of its weight rows computed expert by expert, each by one gemv of all the expert's
    activation rows at once (each output is its own row's gemv: the same bits)."""
    check_id(dst)
    src0, src1 = dst.source(0), dst.source(1)
    vdt = layout.vec_dot_type
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    ne11, ne12 = int(src1.ne[1]), int(src1.ne[2])
    q = quantize_src1(params, src1, vdt)
    if params.ith == 0:
        params.shared["rows"] = write_row_mappings(params, dst, q.nbytes)
    if not params.alone:
        params.barrier()
    counts, mappings = params.shared["rows"]
    cols = columns(params.ith, params.nth, ne01, layout.rows)
    done = []
    if cols.start < cols.end:
        gemv, nb01 = gemv_of(layout), int(src0.nb[1])
        d3 = view4(dst)[0]  # (tokens, slots, ne01)
        for e in np.flatnonzero(counts).tolist():
            m = mappings[e * ne12:e * ne12 + int(counts[e])]
            out = np.empty((len(m), cols.end - cols.start), F32)
            w = packed[e * int(src0.nb[2]) + cols.start * nb01:e * int(src0.nb[2]) + cols.end * nb01]
            gemv(layout, w, ne00, cols.end - cols.start, q[m["i2"], m["i1"] % ne11], out, params.c_threads)
            d3[m["i2"], m["i1"], cols.start:cols.end] = out
            done.append(Tile(f"e{e}", cols, Interval(0, len(m))))
    if params.watched:
        params.took(ShareKind.CHUNKS, *done)
