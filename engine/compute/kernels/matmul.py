"""MUL_MAT: dst = src0 · src1ᵀ per matrix, split into chunks taken from a shared counter.

Mirrors ggml_compute_forward_mul_mat (ggml-cpu.c): src1 is first converted to src0's vec_dot_type
into the work buffer (each thread converts its block range of every row), thread 0 sets the chunk
counter to nth, barrier; then each thread starts with chunk `ith` and takes the next free chunk until
none is left, and writes that chunk of dst.

The arithmetic is laid out differently from the chunks, so that an output's value never depends
on how many threads ran (as in ggml, where each output is one vec_dot). Before the chunks, the
node's products are computed in units -- up to UNIT_ROWS weight rows of one matrix against all
of its src1 rows -- and the threads share the units out statically (unit u to thread u % nth),
each writing its units straight into dst.
A unit is one BLAS product (float weights) or one block product of dequantized weights (quantized
weights; engine.quants.matmul), and its shape never depends on nth. Products that emulate ggml's
vec_dot instead (kernels/vecdot*.py) go in units of about ne01/nth rows: each output's value is
then fixed whatever the units. The chunk loop then takes ggml's chunks from the shared counter,
which is what the trace shows as each thread's share (the values are already in place).

    dst[i, j, k, l] = Σ_t src0[t, i, k / r2, l / r3] · src1[t, j, k, l]     (r2 = ne12/ne02, ...)

Numerics: which products emulate ggml's vec_dot operation by operation (ggml's bits on every CPU:
F32, F16 and BF16 weights, and the quantized types of vecdot.EXACT_QUANT, within the sizes it
sets; in llama.cpp's build, float weights that llamafile_takes by tinyBLAS's order) and which
are BLAS products (ggml's result to rounding, their last bits the CPU's BLAS kernel's) is
emulates_vec_dot's rule, stated there; the trace marks the BLAS nodes.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Callable

import numpy as np

from engine.backend.buffer import tensor_bytes
from engine.backend.repack import repacked_layout
from engine.compute.kernels import CACHE_LINE_SIZE, all_threads, kernel, not_supported
from engine.compute.kernels import hadamard, repack, tiled
from engine.compute.kernels.common import chunks_taken, from_f32, to_f32, view4
from engine.compute.kernels.vecdot import EXACT_QUANT, bound_quant_product, vec_dot_quant
from engine.compute.kernels.vecdot_float import bound_float_product, f32_product, f32_products, \
    float_product, vec_dot_bf16, vec_dot_f16, vec_dot_f32, vec_dot_tinyblas
from engine.compute.shares import Interval, ShareKind, Tile
from engine.core.errors import ggml_assert
from engine.core.notes import Note
from engine.core.optable import GGMLOp
from engine.quants import from_float
from engine.quants.matmul import activation_values, mul_mat_values
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_nelements
from engine.core.tensor_data import tensor_view
from engine.core.types import NUMPY_DTYPE, GGMLType, TYPE_TRAITS, ggml_row_size
from engine.lanes import lanes

F32 = np.float32

_FLOAT = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
UNIT_ROWS = 256  # weight rows per unit of products: float32 weights of a unit stay in cache
EXACT_UNIT_PAIRS = 1 << 17  # (weight row, src1 row) pairs per unit of vec_dot emulation
EXACT_MACS = 1 << 25  # multiply-adds (see emulates_vec_dot)
DECODE_ROWS = 8  # activation rows (see emulates_vec_dot)
SMALL_MACS = 1 << 21  # exact products up to this many multiply-adds are one unit of work
SMALL_CONVERSION = 1 << 16  # src1 elements: below this, one thread converts src1 (the others
# would only wait for the interpreter lock)
SMALL_MUL_MAT = 1 << 23  # multiply-adds: a node of at most this many is computed by thread 0
# alone when several threads run (its products take less time than waking the others for them)
MMID_ROW_MAPPING_SIZE = 8  # struct mmid_row_mapping {int32 i1 (expert slot); int32 i2 (token)}


def vec_dot_type(type_: int) -> GGMLType:
    """The type src1 is converted to for a src0 of this type (type_traits_cpu's vec_dot_type;
    a float type without one keeps its own)."""
    vdt = TYPE_TRAITS[type_].vec_dot_type
    return GGMLType(type_) if vdt is None else vdt


def _mul_mat_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's MUL_MAT: a repacked src0's traits say (ggml_cpu_extra_work_size); else
    src1 converted to src0's vec_dot_type, when it is not already."""
    src0, src1 = node.source(0), node.source(1)
    layout = repacked_layout(src0)
    if layout is not None:
        return repack.work_size(node, layout)
    vdt = vec_dot_type(src0.type)
    cur = ggml_row_size(vdt, ggml_nelements(src1)) if src1.type != vdt else 0
    from engine.compute.plan import TILED  # (plan.py imports the kernels)
    if TILED.get():  # llama.cpp's plan: padded to 64, then the tiled path's workspace
        cur = -(-cur // 64) * 64 + tiled.wdata_size(node, n_tasks)
    return cur


def _mul_mat_id_work(node: Tensor, n_tasks: int) -> int:
    """ggml_graph_plan's MUL_MAT_ID: a repacked src0's traits say; else src1 converted (as for
    MUL_MAT), then per expert its row count, its row mappings and its chunk counter (a cache line
    each), each part padded."""
    src0, src1, ids = node.source(0), node.source(1), node.source(2)
    layout = repacked_layout(src0)
    if layout is not None:
        return repack.work_size(node, layout)
    vdt, n_as = vec_dot_type(src0.type), int(src0.ne[2])
    cur = ggml_row_size(vdt, ggml_nelements(src1)) + 8 if src1.type != vdt else 0
    cur += n_as * 8 + 8
    cur += n_as * int(ids.ne[0]) * int(ids.ne[1]) * MMID_ROW_MAPPING_SIZE + 8
    cur += CACHE_LINE_SIZE * n_as + CACHE_LINE_SIZE
    from engine.compute.plan import TILED  # (plan.py imports the kernels)
    if TILED.get():  # llama.cpp's plan: padded to 64, then the tiled path's workspace
        cur = -(-cur // 64) * 64 + tiled.wdata_size(node, n_tasks)
    return cur


def chunking(nr0: int, nr1: int, nth: int) -> tuple[int, int, int, int]:
    """ggml's chunk grid for mul_mat: (nchunk0, nchunk1, dr0, dr1)."""
    chunk_size = 64 if nr0 == 1 or nr1 == 1 else 16
    nchunk0 = (nr0 + chunk_size - 1) // chunk_size
    nchunk1 = (nr1 + chunk_size - 1) // chunk_size
    if nchunk0 * nchunk1 < nth * 4:  # too few chunks: one chunk per thread along the longer side
        nchunk0 = nth if nr0 > nr1 else 1
        nchunk1 = 1 if nr0 > nr1 else nth
    return nchunk0, nchunk1, (nr0 + nchunk0 - 1) // nchunk0, (nr1 + nchunk1 - 1) // nchunk1


def _convert_src1(params, src1: Tensor, vdt: GGMLType) -> np.ndarray:
    """Convert this thread's block range of every src1 row to vdt in the work buffer; returns
    the whole converted buffer as rows (after the barrier everyone's part is there)."""
    ne10, ne11, ne12, ne13 = (int(x) for x in src1.ne)
    row_bytes = ggml_row_size(vdt, ne10)
    nrows = ne11 * ne12 * ne13
    rows = params.wdata[:row_bytes * nrows].reshape(nrows, row_bytes)
    blck = TYPE_TRAITS[vdt].blck_size
    nblk = ne10 // blck
    b0, b1 = params.ith * nblk // params.nth, (params.ith + 1) * nblk // params.nth
    if params.alone or ne10 * nrows <= SMALL_CONVERSION:  # thread 0 converts it all: the same
        b0, b1 = (0, nblk) if params.ith == 0 else (0, 0)  # bytes, block by block
    if b0 < b1:
        x = view4(src1).reshape(nrows, ne10) if ggml_is_contiguous(src1) else \
            np.ascontiguousarray(view4(src1)).reshape(nrows, ne10)
        bs = TYPE_TRAITS[vdt].type_size
        convert_rows(x[:, b0 * blck:b1 * blck].astype(np.float32), vdt, rows[:, b0 * bs:b1 * bs])
    return rows


def convert_rows(x: np.ndarray, vdt: GGMLType, out: np.ndarray) -> None:
    """float32 rows x (whole blocks) converted to vdt into out (their bytes): floats rounded as
    ggml rounds, or the CPU's activation quantizer (Q8_0, Q8_1, Q8_K); Q8_0's and Q8_K's C loops
    write straight into out when both are packed (Q8_1, Q4_1's and Q5_1's, has no C loop:
    from_float, quantize_row_q8_1's AVX2 form)."""
    if vdt in _FLOAT:
        out[...] = from_f32(x, vdt).view(np.uint8).reshape(out.shape)
    elif vdt in (GGMLType.Q8_0, GGMLType.Q8_K) and x.flags.c_contiguous and out.flags.c_contiguous:
        (lanes.quantize_q8_0 if vdt == GGMLType.Q8_0 else lanes.quantize_q8_k)(x, out)
    else:
        out[...] = from_float(vdt, x).reshape(out.shape)


def blas_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x · wᵀ by numpy's BLAS: ggml's products to rounding, their last bits the BLAS kernel's.
    One row of x is w · x (a gemv through np.dot, which lets go of the interpreter lock while
    it runs, where `x @ w.T` holds it for a single row)."""
    if x.shape[0] == 1:
        return np.dot(w, x[0])[None, :]
    return np.dot(x, w.T)


def emulates_vec_dot(src0: Tensor, n_src1_rows: int) -> bool:
    """Are this node's products ggml's vec_dot emulated operation by operation (kernels/vecdot*.py:
    ggml's bits on every CPU), rather than BLAS products (ggml's result to rounding, their last
    bits the CPU's BLAS kernel's)? It takes

    - the quantized types of vecdot.EXACT_QUANT, at any size: their raw blocks are read by C
      about as fast as BLAS multiplies the dequantized rows, and a model's long prompt gives
      llama.cpp's logits only this way;
    - F32, F16 and BF16 weights: any size for at most DECODE_ROWS activation rows (a model's
      token-by-token decoding: one C loop per matrix is faster than BLAS converting the weights),
      else rows of at most 1024 elements, up to EXACT_MACS multiply-adds (for a batch the float
      emulation costs more than BLAS);
    - no other type.

    (src1 of an F32 src0 is F32; of another src0, its vec_dot_type after the conversion.)"""
    if src0.type in EXACT_QUANT:
        return True
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    macs = ne00 * ne01 * n_src1_rows
    return src0.type in _FLOAT and (n_src1_rows <= DECODE_ROWS or (ne00 <= 1024 and macs <= EXACT_MACS))


def llamafile_takes(src0: Tensor, src1: Tensor) -> bool:
    """Would llamafile_sgemm (GGML_USE_LLAMAFILE, AVX2 + F16C + FMA) compute this product
    instead of ggml's vec_dot loop? For float weights: two or more src1 rows per matrix, K a
    multiple of 8, rows a multiple of 4; F32 weights only with a contiguous F32 src1 (the call
    before the conversion), F16 and BF16 weights with an F32 src1 converted to their type (the
    call after it) or a contiguous src1 of their type (the call before). Its quantized
    kernels (Q8_0, Q4_0, Q5_0 by Q8_0) sum in vec_dot's order, so they need nothing of their
    own; IQ4_NL's (two or more rows of Q8_0, converted or contiguous) has one accumulator where
    ggml_vec_dot_iq4_nl_q8_0 has two (vecdot.quant_dot's `tiny`); K-quants and the other types
    (IQ3_XXS, IQ2_S, MXFP4, TQ1_0, TQ2_0, IQ1_M...) it leaves to ggml."""
    ne00, ne01, ne11 = int(src0.ne[0]), int(src0.ne[1]), int(src1.ne[1])
    if src0.type == GGMLType.IQ4_NL:
        return ne11 >= 2 and (src1.type != GGMLType.Q8_0 or ggml_is_contiguous(src1))
    if ne11 < 2 or ne00 % 8 or ne01 % 4:
        return False
    if src0.type == GGMLType.F32:
        return src1.type == GGMLType.F32 and ggml_is_contiguous(src1)
    return src0.type in (GGMLType.F16, GGMLType.BF16) and (
        src1.type == GGMLType.F32 or (src1.type == src0.type and ggml_is_contiguous(src1)))


def _mul_mat_uses_blas(dst: Tensor) -> bool:
    src1 = dst.source(1)
    if repacked_layout(dst.source(0)) is not None or hadamard.takes(dst, False):
        return False
    return not emulates_vec_dot(dst.source(0), int(src1.ne[1]) * int(src1.ne[2]) * int(src1.ne[3]))


def _small_mul_mat(dst: Tensor) -> bool:
    return int(dst.source(0).ne[0]) * ggml_nelements(dst) <= SMALL_MUL_MAT


def _prepare_mul_mat(params, dst: Tensor):
    """The node's products when they emulate ggml's vec_dot (decoding's products, the attention's
    small ones): src1 converted into the work buffer as _convert_src1 converts it, then one C
    loop per matrix writing straight into dst, the weight rows shared out between the compute's
    threads (each output is one row's own sum: the same bits however they are shared). BLAS
    products keep the general path (their units fix their shapes, and BLAS is most of their
    time), as do the cases below that it alone handles."""
    src0, src1 = dst.source(0), dst.source(1)
    t0 = TYPE_TRAITS[src0.type]
    vdt = vec_dot_type(src0.type)
    layout = repacked_layout(src0)
    if layout is not None:  # the CPU_REPACK traits' own path: a call per plane
        repack.check(dst)
        return repack.plane_calls(dst, layout, tensor_bytes(src0, 0, ggml_nbytes(src0),
                                                            "forward_mul_mat"), params.cores)
    if hadamard.takes(dst, params.use_ref):  # (the transform's own path)
        return None
    if params.tiled and tiled.takes(src0, src1, params.use_ref):  # (llama.cpp's tiled path)
        return tiled.prepare_mul_mat_tiled(params, dst, _prepared_conversion)
    if (src0.type not in _FLOAT and src0.type not in EXACT_QUANT) or dst.type != GGMLType.F32 \
            or int(dst.nb[0]) != 4 or int(src0.nb[0]) != t0.type_size \
            or int(src1.nb[0]) != TYPE_TRAITS[src1.type].type_size \
            or (src1.type != vdt and src1.type != GGMLType.F32) \
            or TYPE_TRAITS[src1.type].is_quantized:
        return None
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ne10, ne11, ne12, ne13 = (int(x) for x in src1.ne)
    tiny = params.llamafile and llamafile_takes(src0, src1)
    if not (tiny or emulates_vec_dot(src0, ne11 * ne12 * ne13)):
        return None
    xtype = src1.type
    convert = None
    if src1.type != vdt:
        convert, xtype = _prepared_conversion(params, src1, vdt), vdt
        x4 = params.wdata[:ggml_row_size(vdt, ne10) * ne11 * ne12 * ne13].reshape(ne13, ne12, ne11, -1)
        if vdt in _FLOAT:
            x4 = x4.view(NUMPY_DTYPE[vdt])
            if ggml_is_contiguous(src1):
                # rounded to halves (or bf16) into the work buffer as _convert_src1 rounds them,
                # and widened again at once into floats the products read where they lie
                rounded = np.empty(x4.shape, F32)
                convert = partial(lanes.round_floats, view4(src1).reshape(-1),
                                  x4.view(np.uint16).reshape(-1), rounded.reshape(-1),
                                  vdt == GGMLType.BF16)
                x4, xtype = rounded, GGMLType.F32
    else:
        x4 = view4(src1)
    d4 = view4(dst)
    r2, r3 = ne12 // ne02, ne13 // ne03
    if src0.type == GGMLType.F32 and convert is None and ne12 * ne13 > 1:  # (attention heads)
        every = f32_products(view4(src0), d4, r2, r3, tiny)
        return lambda: every(x4)
    widen = not t0.is_quantized and xtype != GGMLType.F32  # (half activations, once a node)
    # the r2 matrices of src1 that share a matrix of src0 (the attention's heads sharing a KV
    # head) go as one product of all their rows when dst holds them packed: the weight rows
    # read (and widened) once for them all, each output still its own pair's vec_dot
    group = r2 if r2 > 1 and all(d4[i13, i12:i12 + r2].flags.c_contiguous
                                 for i13 in range(ne13) for i12 in range(0, ne12, r2)) else 1

    def rows_of(x: np.ndarray, i13: int, i12: int) -> np.ndarray:
        return x[i13, i12] if group == 1 else x[i13, i12:i12 + group].reshape(-1, x.shape[-1])

    # (i13, i12, the product: on those rows of x, or bound to them unless widened)
    products: list[tuple[int, int, Callable[..., None]]] = []
    product: Callable[..., None]
    for i13 in range(ne13):
        for i12 in range(0, ne12, group):
            # (the C loops write straight into dst, or through a buffer)
            out = d4[i13, i12] if group == 1 else d4[i13, i12:i12 + group].reshape(-1, ne01)
            if t0.is_quantized:  # (its activations are converted into the work buffer: they stay)
                w = quant_rows(src0, i13 // r3, i12 // r2, slice(0, ne01))
                product = bound_quant_product(src0.type, w, out, rows_of(x4, i13, i12),
                                              params.cores, tiny)
            elif src0.type == GGMLType.F32 and not tiny:
                product = partial(f32_product(view4(src0)[i13 // r3, i12 // r2], out),
                                  rows_of(x4, i13, i12))  # (f32 weights: x4 is floats)
            elif widen:
                product = float_product(view4(src0)[i13 // r3, i12 // r2], out, tiny, params.cores)
            else:
                product = bound_float_product(view4(src0)[i13 // r3, i12 // r2], out,
                                              rows_of(x4, i13, i12), tiny, params.cores)
            products.append((i13, i12, product))
    if not widen:  # x4 is read as it lies: every product bound to its rows, run in turn
        return tuple(product for _i13, _i12, product in products) if convert is None \
            else (convert, *(product for _i13, _i12, product in products))

    def call() -> None:
        if convert is not None:
            convert()
        x = np.ascontiguousarray(to_f32(x4, xtype))
        for i13, i12, product in products:
            product(rows_of(x, i13, i12))
    return call


def _prepared_conversion(params, src1: Tensor, vdt: GGMLType):
    """_convert_src1 for one thread converting every row, ready to run: src1's rows (f32) to vdt,
    into the work buffer."""
    ne10, ne11, ne12, ne13 = (int(x) for x in src1.ne)
    nrows = ne11 * ne12 * ne13
    rows = params.wdata[:ggml_row_size(vdt, ne10) * nrows].reshape(nrows, -1)
    x4 = view4(src1)
    x = x4.reshape(nrows, ne10) if ggml_is_contiguous(src1) else None
    if x is not None and vdt in (GGMLType.Q8_0, GGMLType.Q8_K) and x.dtype == np.float32 \
            and rows.flags.c_contiguous:  # (convert_rows' call, bound once)
        return partial(lanes.quantize_q8_0 if vdt == GGMLType.Q8_0 else lanes.quantize_q8_k, x, rows)

    def run() -> None:
        convert_rows(x if x is not None else np.ascontiguousarray(x4).reshape(nrows, ne10), vdt, rows)
    return run


@kernel(GGMLOp.MUL_MAT, n_tasks=all_threads, work=_mul_mat_work, alone_when=_small_mul_mat,
        blas=_mul_mat_uses_blas, prepare=_prepare_mul_mat)
def compute_forward_mul_mat(params, dst: Tensor) -> None:
    """ggml_compute_forward_mul_mat."""
    src0, src1 = dst.source(0), dst.source(1)
    layout = repacked_layout(src0)
    if layout is not None:  # ggml_cpu_extra_compute_forward: the CPU_REPACK buffer type's traits
        packed = tensor_bytes(src0, 0, ggml_nbytes(src0), "forward_mul_mat")
        repack.forward_mul_mat(params, dst, layout, packed)
        return
    if hadamard.takes(dst, params.use_ref):  # src0 a Hadamard matrix: ggml_compute_forward_fwht
        hadamard.compute_forward_fwht(params, dst)
        return
    if params.tiled and tiled.takes(src0, src1, params.use_ref):
        # ggml_compute_forward_mul_mat_tiled (llama.cpp's build, GGML_CPU_TILED_MM): kernels/tiled.py
        tiled.compute_forward_mul_mat_tiled(params, dst, _convert_src1)
        return
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ne10, ne11, ne12, ne13 = (int(x) for x in src1.ne)
    ne0, ne1, ne2, ne3 = (int(x) for x in dst.ne)
    t0, t1 = TYPE_TRAITS[src0.type], TYPE_TRAITS[src1.type]
    assert int(src0.nb[0]) == t0.type_size and int(src1.nb[0]) == t1.type_size
    assert dst.type == GGMLType.F32 and int(dst.nb[0]) == 4
    vdt = vec_dot_type(src0.type)
    if src0.type not in _FLOAT and not t0.is_quantized:
        raise not_supported(dst)
    if src1.type != vdt and src1.type != GGMLType.F32:
        raise not_supported(dst, f"src1 must be f32 or {TYPE_TRAITS[vdt].type_name}")

    converted = None
    if src1.type != vdt:
        converted = _convert_src1(params, src1, vdt)
    if params.ith == 0:
        params.shared["chunk"] = itertools.count(params.nth)  # atomic under the GIL
    if not params.alone:  # (alone, share 0 has converted it all before share 1 starts)
        params.barrier()

    if converted is None:
        x4 = view4(src1)
    else:  # converted rows: float elements, or raw blocks for quantized weights
        x4 = converted.reshape(ne13, ne12, ne11, -1)
        if vdt in _FLOAT:
            x4 = x4.view(NUMPY_DTYPE[vdt])
    nr0, nr1 = ne0, ne1 * ne2 * ne3
    tiny = params.llamafile and llamafile_takes(src0, src1)
    _products(params, src0, x4, vdt if converted is not None else src1.type, view4(dst), tiny)
    if not params.watched:  # the values are in place; the chunks only tell who took which
        return

    nchunk0, nchunk1, dr0, dr1 = chunking(nr0, nr1, params.nth)
    total = nchunk0 * nchunk1
    taken = np.array(chunks_taken(params, total), dtype=np.int64)
    done = _chunks(taken, nchunk0, dr0, dr1, nr0, nr1)
    params.took(ShareKind.CHUNKS, *done, note=Note.of("mm_chunks_tinyblas" if tiny else "mm_chunks",
                                                      n0=nchunk0, n1=nchunk1, d0=dr0, d1=dr1))


def _chunks(chunks: np.ndarray, nchunk0: int, dr0: int, dr1: int, nr0: int, nr1: int) -> list[Tile]:
    """Each chunk as a Tile: its rows of src0 and of src1."""
    ir0, ir1 = dr0 * (chunks % nchunk0), dr1 * (chunks // nchunk0)
    rows = map(Interval, ir0.tolist(), np.minimum(ir0 + dr0, nr0).tolist())
    cols = map(Interval, ir1.tolist(), np.minimum(ir1 + dr1, nr1).tolist())
    return list(map(Tile, chunks.tolist(), rows, cols))


def _products(params, src0: Tensor, x4: np.ndarray, xtype: int, out: np.ndarray,
              tiny: bool = False) -> None:
    """This thread's units of the node's products, written into out (dst as (ne3, ne2, ne1,
    ne0) = (ne13, ne12, ne11, ne01)).

    x4 holds src1 as the products read it: floats of xtype, or raw vec_dot_type blocks; `tiny`:
    float products in llamafile's tinyBLAS order.
    """
    ne00, ne01, ne02, ne03 = (int(x) for x in src0.ne)
    ne13, ne12, ne11 = x4.shape[:3]
    exact = tiny or emulates_vec_dot(src0, x4.shape[2] * x4.shape[1] * x4.shape[0])
    r2, r3 = ne12 // ne02, ne13 // ne03
    # an exact output does not depend on the units, so there they are simply one per thread
    # (bounded in size), or one for a small product (its cost is the Python around it, which
    # threads cannot share); BLAS results depend on the shapes multiplied, so there they are fixed
    share = ne01 if ne00 * ne01 * ne11 <= SMALL_MACS else -(-ne01 // params.nth)
    unit = min(share, max(1, EXACT_UNIT_PAIRS // ne11)) if exact else UNIT_ROWS
    units = [(i13, i12, r) for i13 in range(ne13) for i12 in range(ne12)
             for r in range(0, ne01, unit)]
    # fewer units than threads (a small node, or one computed by thread 0 alone): the exact
    # quantized products share their rows out between the compute's threads in C instead
    threads = params.cores if len(units) < params.nth or params.alone else 1
    acts: dict = {}  # dequantized src1 of a matrix, for this thread
    for i13, i12, r in units[params.ith::params.nth]:
        rows = slice(r, min(r + unit, ne01))
        out[i13, i12, :, rows] = _rows_products(src0, i13 // r3, i12 // r2, rows, x4[i13, i12], xtype,
                                                exact, tiny, acts, (i13, i12), threads)


def _rows_products(src0: Tensor, i03: int, i02: int, rows: slice, x: np.ndarray, xtype: int,
                   exact: bool, tiny: bool, acts: dict, key, threads: int = 1,
                   w: np.ndarray | None = None) -> np.ndarray:
    """Rows `rows` of matrix (i02, i03) of src0 times each row of x: (len(x), rows) float32.
    x: floats of xtype, or raw vec_dot_type blocks; `acts` caches x's dequantized values by `key`;
    `threads`: how many threads exact quantized products may share their rows out to in C;
    `w`: those rows of src0 already taken (exact products: raw blocks, or float elements)."""
    ne00 = int(src0.ne[0])
    quantized = TYPE_TRAITS[src0.type].is_quantized
    if exact or tiny:
        if w is None:
            w = quant_rows(src0, i03, i02, rows) if quantized else view4(src0)[i03, i02, rows]
        if tiny and not quantized:
            return vec_dot_tinyblas(w, to_f32(x, xtype))
        if exact:
            if quantized:
                return vec_dot_quant(src0.type, w, x, threads=threads, tiny=tiny)
            if src0.type == GGMLType.F16:
                return vec_dot_f16(w, to_f32(x, xtype))
            if src0.type == GGMLType.BF16:
                return vec_dot_bf16(w, to_f32(x, xtype))
            return vec_dot_f32(w, x)
    if quantized:
        if key not in acts:
            acts[key] = activation_values(xtype, x, ne00)
        a, s_y = acts[key]
        return mul_mat_values(src0.type, quant_rows(src0, i03, i02, rows), a, s_y, ne00)
    return blas_product(to_f32(x, xtype), to_f32(view4(src0)[i03, i02, rows], src0.type))


def quant_rows(src0: Tensor, i03: int, i02: int, rows: slice) -> np.ndarray:
    """Raw block bytes of src0 rows `rows` of matrix (i02, i03): (rows, row_bytes) uint8."""
    nb1, nb2, nb3 = int(src0.nb[1]), int(src0.nb[2]), int(src0.nb[3])
    row_bytes = ggml_row_size(src0.type, int(src0.ne[0]))
    return tensor_view(src0, (rows.stop - rows.start, row_bytes), (nb1, 1), np.uint8,
                       i03 * nb3 + i02 * nb2 + rows.start * nb1, "quant_rows")


# --- MUL_MAT_ID --------------------------------------------------------------------------------

def _mul_mat_id_uses_blas(dst: Tensor) -> bool:
    src0 = dst.source(0)
    return repacked_layout(src0) is None and not emulates_vec_dot(src0, _most_rows_per_expert(dst))


def _most_rows_per_expert(dst: Tensor) -> int:
    """The products' exactness is decided per node, from the largest expert group it could
    have (every token to one expert)."""
    ids = dst.source(2)
    return int(ids.ne[0]) * int(ids.ne[1])


def expert_rows(ids: Tensor, n_as: int) -> list[list[tuple[int, int]]]:
    """ggml's grouping of rows by expert: for each expert, the (slot, token) pairs that use it,
    in token order then slot order (matrix_rows and matrix_row_counts)."""
    v = view4(ids)[0, 0]  # (tokens, slots) int32
    groups: list[list[tuple[int, int]]] = [[] for _ in range(n_as)]
    for token in range(v.shape[0]):
        for slot in range(v.shape[1]):
            e = int(v[token, slot])
            ggml_assert(0 <= e < n_as, "i02 >= 0 && i02 < n_as", "ggml_compute_forward_mul_mat_id",
                        f"token {token} asks for expert {e} of {n_as}")
            groups[e].append((slot, token))
    return groups


def _write_row_groups(params, groups: list[list[tuple[int, int]]], start: int, n_ids: int, n_tok: int) -> None:
    """Thread 0 writes matrix_row_counts (int64 per expert) and matrix_rows ({int32 slot, int32
    token} per row, n_ids·n_tokens per expert) into the work buffer, where ggml keeps them."""
    n_as = len(groups)
    at = (start + 7) // 8 * 8
    params.wdata[at:at + 8 * n_as] = np.array([len(g) for g in groups], np.int64).view(np.uint8)
    at = (at + 8 * n_as + 7) // 8 * 8
    rows = np.zeros((n_as, n_ids * n_tok, 2), np.int32)
    for e, g in enumerate(groups):
        if g:
            rows[e, :len(g)] = g
    params.wdata[at:at + rows.nbytes] = rows.view(np.uint8).reshape(-1)


@kernel(GGMLOp.MUL_MAT_ID, n_tasks=all_threads, work=_mul_mat_id_work,
        blas=_mul_mat_id_uses_blas)
def compute_forward_mul_mat_id(params, dst: Tensor) -> None:
    """ggml_compute_forward_mul_mat_id: src1 converted to the vec_dot type as for mul_mat; thread 0
    groups the (slot, token) rows by expert; then expert by expert, the chunks of that expert's
    product (chunked as mul_mat chunks, its rows being the tokens that chose it) taken from the
    expert's own counter: first chunk ith, then the next free one."""
    src0, src1, ids = dst.source(0), dst.source(1), dst.source(2)
    layout = repacked_layout(src0)
    if layout is not None:  # ggml_cpu_extra_compute_forward: the CPU_REPACK buffer type's traits
        repack.forward_mul_mat_id(params, dst, layout, tensor_bytes(src0, 0, ggml_nbytes(src0), "forward_mul_mat_id"))
        return
    fn = "ggml_compute_forward_mul_mat_id"
    ne00, ne01, n_as = int(src0.ne[0]), int(src0.ne[1]), int(src0.ne[2])
    ne10, ne11, ne12 = int(src1.ne[0]), int(src1.ne[1]), int(src1.ne[2])
    n_ids, n_tok = int(ids.ne[0]), int(ids.ne[1])
    ggml_assert(int(src0.nb[0]) == TYPE_TRAITS[src0.type].type_size, "nb00 == ggml_type_size(type)", fn)
    ggml_assert(int(src1.nb[0]) == TYPE_TRAITS[src1.type].type_size, "nb10 == ggml_type_size(src1->type)", fn)
    ggml_assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)", fn)
    vdt = vec_dot_type(src0.type)
    if src0.type not in _FLOAT and not TYPE_TRAITS[src0.type].is_quantized:
        raise not_supported(dst)
    converted = None
    if src1.type != vdt:
        ggml_assert(src1.type == GGMLType.F32, "src1->type == GGML_TYPE_F32", fn)
        converted = _convert_src1(params, src1, vdt)
    groups = expert_rows(ids, n_as)
    if params.ith == 0:
        start = 0 if converted is None else ggml_row_size(vdt, ne10 * ne11 * ne12)
        _write_row_groups(params, groups, start, n_ids, n_tok)
    for e in range(params.ith, n_as, params.nth):
        params.shared[("chunk", e)] = itertools.count(params.nth)  # atomic under the GIL
    params.barrier()

    if converted is None:
        x3 = view4(src1)[0]  # (tokens, n_b, row) of src1's type
        xtype = src1.type
    else:
        x3 = converted.reshape(ne12, ne11, -1)
        xtype = vdt
        if vdt in _FLOAT:
            x3 = x3.view(NUMPY_DTYPE[vdt])
    exact = emulates_vec_dot(src0, _most_rows_per_expert(dst))
    # the products, expert by expert: units of weight rows shared out statically (see _products)
    products = params.shared.setdefault("products", [None] * n_as)
    units = []
    for e, g in enumerate(groups):
        if g:
            if params.ith == 0:
                products[e] = np.empty((len(g), ne01), np.float32)
            unit = ne01 if exact and ne00 * ne01 * len(g) <= SMALL_MACS else (
                -(-ne01 // params.nth) if exact else UNIT_ROWS)
            units += [(e, r, min(r + unit, ne01)) for r in range(0, ne01, unit)]
    params.barrier()
    acts: dict = {}
    tiled_e = [params.tiled and tiled.takes_expert(src0, src1, len(g), params.use_ref) for g in groups]
    for e, r0, r1 in units[params.ith::params.nth]:
        x = np.stack([x3[token, slot % ne11] for slot, token in groups[e]])
        if tiled_e[e]:  # ggml_compute_forward_mul_mat_id_tiled (llama.cpp's build): kernels/tiled.py
            products[e][:, r0:r1] = tiled.expert_product(src0, e, r0, r1, x)
            continue
        products[e][:, r0:r1] = _rows_products(src0, 0, e, slice(r0, r1), x, xtype, exact, False,
                                               acts, e)
    params.barrier()

    d4 = view4(dst)
    done = []
    for e, g in enumerate(groups):
        if not g:
            continue
        if tiled_e[e]:  # the tiled expert's groups of weight rows, split statically
            for tile in tiled.expert_tiles(e, ne01, len(g), params.ith, params.nth):
                for k in range(*tile.cols):
                    d4[0, g[k][1], g[k][0], tile.rows.start:tile.rows.end] = \
                        products[e][k, tile.rows.start:tile.rows.end]
                done.append(tile)
            continue
        nchunk0, nchunk1, dr0, dr1 = chunking(ne01, len(g), params.nth)
        chunk = params.ith
        while chunk < nchunk0 * nchunk1:
            ith0, ith1 = chunk % nchunk0, chunk // nchunk0
            ir0a, ir0b = dr0 * ith0, min(dr0 * ith0 + dr0, ne01)
            ir1a, ir1b = dr1 * ith1, min(dr1 * ith1 + dr1, len(g))
            for k in range(ir1a, ir1b):
                slot, token = g[k]
                d4[0, token, slot, ir0a:ir0b] = products[e][k, ir0a:ir0b]
            done.append(Tile(f"e{e}.{chunk}", Interval(ir0a, ir0b), Interval(ir1a, ir1b)))
            if params.nth >= nchunk0 * nchunk1:
                break
            chunk = next(params.shared[("chunk", e)])
    params.took(ShareKind.CHUNKS, *done)
