/* engine._lanes: ggml's hottest inner loops, which numpy can only run a block at a time.
 *
 * The float and quantized dot products of mul_mat (ggml_vec_dot_f32, _f16, llamafile's tinyBLAS,
 * and the AVX2 vec_dot of the EXACT_QUANT types (engine/c/quant.c): integer lane sums, one
 * fused multiply-add per block and lane, acc[l] = fmaf((float)lane[l], d, acc[l])), ggml_v_expf
 * and ggml_v_silu, the soft_max and norm rows, quantize_row_q8_0, a few to_float converters, and
 * fmaf over whole buffers (the fused multiply-adds of ggml's -mfma build, element by element). Each
 * function has a numpy twin beside the kernel that calls it (engine/lanes.py registers
 * them; tests/unit/engine/test_twins.py holds them equal bit for bit), which says the same
 * thing for reading and runs in pure-numpy mode. fmaf is correctly rounded by definition, so the
 * results are the same on every CPU; the hardware instruction is used where the CPU has it. The
 * loops run without the GIL, so the compute threads run them at once on their own rows.
 *
 * This file is the module (its method table); the loops are in c/quant.c, c/float.c
 * and c/blocks.c, and c/lanes.h holds what they share.
 */
#include "lanes.h"

LANES_HIDDEN int lanes_check(Py_buffer *buf, Py_ssize_t want, const char *what)
{
    if (buf->len != want) {
        PyErr_Format(PyExc_ValueError, "_lanes: %s has %zd bytes, not %zd", what, buf->len, want);
        return -1;
    }
    return 0;
}

static int optional_buffer(PyObject *o, Py_buffer *view, int flags)
{
    if (o == NULL) {  /* the parse failed after this argument: release it */
        lanes_release_optional(view);
        return 1;
    }
    view->obj = NULL;
    if (o != Py_None && PyObject_GetBuffer(o, view, flags) < 0)
        return 0;
    return Py_CLEANUP_SUPPORTED;
}

LANES_HIDDEN int lanes_optional_buffer(PyObject *o, void *view)
{
    return optional_buffer(o, view, PyBUF_SIMPLE);
}

LANES_HIDDEN int lanes_optional_writable(PyObject *o, void *view)
{
    return optional_buffer(o, view, PyBUF_WRITABLE);
}

static PyMethodDef methods[] = {
    {"v_expf", lanes_v_expf, METH_VARARGS,
     "v_expf(x, out): out[i] = ggml_v_expf's lane of x[i] (contiguous float32 buffers)"},
    {"soft_max", lanes_soft_max, METH_VARARGS,
     "soft_max(w, mx, y, sums, rows, n): ggml_vec_soft_max_f32 of each row of w (rows, n) float32 "
     "less its max mx[r]: y = exp(w - max), sums[r] their sum in double, in ggml's order"},
    {"soft_max_heads", lanes_soft_max_heads, METH_VARARGS,
     "soft_max_heads(x, y, m, sinks, slopes, scale, heads, rows, n, xh, xr, yh, yr, mheads, mh, mr, "
     "mf16, threads=1): ggml_compute_forward_soft_max_f32 on rows (h, r) of n float32 at byte "
     "h * xh + r * xr of x (of y): scaled, plus slopes[h] times mask row (h % mheads, r) (m: "
     "floats, or halves if mf16; None: no mask), their max raised to sinks[h] (None: no sinks), "
     "exp(w - max) over its double sum; the rows shared out between up to `threads` threads"},
    {"rms_norm_rows", lanes_rms_norm_rows, METH_VARARGS,
     "rms_norm_rows(x, y, rows, n, ldx, ldy, eps, threads=1): ggml_compute_forward_rms_norm_f32 of "
     "rows of n floats (ldx, ldy bytes apart): the squares summed in double left to right; the "
     "rows shared out between up to `threads` threads (the same bits)"},
    {"norm_rows", lanes_norm_rows, METH_VARARGS,
     "norm_rows(x, y, rows, n, ldx, ldy, eps, portable=False, threads=1): "
     "ggml_compute_forward_norm_f32 of `rows` rows of n float32 (row r at byte r * ldx of x, "
     "r * ldy of y): y = (x - mean) / sqrtf(var + eps), the mean's and the variance's sums in "
     "double in ggml's order; portable: without the vector instructions; threads: the rows "
     "shared out between up to that many threads (the same bits either way)"},
    {"v_silu", lanes_v_silu, METH_VARARGS,
     "v_silu(x, out, g=None, threads=1): out[i] = ggml_v_silu's lane of x[i]: x / (1 + v_expf(0 - "
     "x)), times g[i] with g (ggml_vec_swiglu_f32); the elements shared out between up to "
     "`threads` threads (the same bits)"},
    {"gelu_lookup", lanes_gelu_lookup, METH_VARARGS,
     "gelu_lookup(x, table, out, clamp=True, g=None, threads=1): ggml_vec_gelu_f32 (GGML_GELU_FP16; "
     "clamp: 0 at or below -10, x at or above 10) or ggml_vec_gelu_quick_f32 (no clamp): out[i] = "
     "table[fp16 bits of x[i]], the table ggml's fp16 one widened to 65536 float32 (contiguous "
     "float32 buffers); with g, ggml_vec_geglu_f32: out[i] times g[i], but 0 where x[i] <= -10; "
     "the elements shared out between up to `threads` threads (the same bits)"},
    {"quant_dot", lanes_quant_dot, METH_VARARGS,
     "quant_dot(type, w, ldw, x, ldx, out, n0, n1, nb, portable=False, threads=1, tiny=False): out[i1, i0] "
     "= ggml's AVX2 vec_dot of weight row i0 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, IQ4_XS, Q4_K, Q5_K, Q6_K, TQ1_0, "
     "TQ2_0, IQ1_M, IQ3_XXS, IQ3_S or IQ2_S blocks at w + i0*ldw) and activation row i1 (Q8_0, Q8_1 or Q8_K blocks at x + i1*ldx), nb blocks a row, float32; portable: 1 without the vector "
     "instructions, 2 without AVX-512's (the same bits); threads: the rows shared out between up to that many threads "
     "(the same bits); tiny: IQ4_NL in llamafile's tinyBLAS order (one accumulator)"},
    {"quantize_q8_0", lanes_quantize_q8_0, METH_VARARGS,
     "quantize_q8_0(x, out): quantize_row_q8_0 of ggml's AVX2 build: float32 blocks of 32 -> "
     "34-byte blocks (the half d, 32 int8)"},
    {"rope_pairs", lanes_rope_pairs, METH_VARARGS,
     "rope_pairs(x, y, cs, sn, rows, n, ldx, ldy, h, step, off): ggml's rope rotation of rows of "
     "n floats (ldx, ldy apart): each row copied, then pair k (elements k*step and k*step + off) "
     "rotated by cs[k], sn[k], each output one fused multiply-add"},
    {"quantize_q8_k", lanes_quantize_q8_k, METH_VARARGS,
     "quantize_q8_k(x, out): quantize_row_q8_K_ref: float32 blocks of 256 -> 292-byte blocks "
     "(the float d, 256 int8, 16 int16 sums)"},
    {"dequantize", lanes_dequantize, METH_VARARGS,
     "dequantize(type, raw, out): ggml's to_float of whole Q8_0, Q4_K, Q5_K or TQ1_0 blocks into "
     "float32 out"},
    {"float_dot", (PyCFunction)(void (*)(void))lanes_float_dot, METH_VARARGS | METH_KEYWORDS,
     "float_dot(w, x, out, n0, n1, k, tiny, ldw=-1, threads=1): out[i1, i0] = ggml_vec_dot_f16 "
     "(tiny: llamafile's tinyBLAS) of row i0 of w (n0, k) and row i1 of x (n1, k), float32; "
     "ldw >= 0: w holds halves, row i0 at element i0 * ldw; threads: the rows of w shared out "
     "between up to that many threads (the same bits)"},
    {"fmaf", lanes_fmaf, METH_VARARGS,
     "fmaf(a, b, c, out): out = c, then out[i] = fmaf(a[k, i], b[k, i], out[i]) for each step k "
     "of a and b (contiguous float32, whole steps of out's size), an operand's NaN (b's, a's, "
     "then c's) quiet"},
    {"dot_f32", lanes_dot_f32, METH_VARARGS,
     "dot_f32(w, x, out, n0, n1, k, pairs=False): out[i1, i0] = ggml_vec_dot_f32 of row i0 of w "
     "(n0, k) and row i1 of x (n1, k), float32; with pairs (n1 == n0), out[i] of rows i alone"},
    {"round_floats", lanes_round_floats, METH_VARARGS,
     "round_floats(x, bits, back, bf16): ggml_fp32_to_fp16_row (bf16: ggml_fp32_to_bf16_row) of "
     "float32 x into bits (uint16); unless back is None, the rounded values widened into back "
     "(float32)"},
    {"set_rows", lanes_set_rows, METH_VARARGS,
     "set_rows(x, ldx, idx, ldi, wide, out, ldo, ne1, rows, n, kind) -> -1 or the first bad r: "
     "ggml_compute_forward_set_rows of rows of n float32 (row r at byte r * ldx) into out's row "
     "idx[r] (at byte idx[r] * ldo; idx[r] at byte r * ldi, int64 if wide, else int32) as float32 "
     "(kind 0), f16 (1) or bf16 (2), in order; every index checked against [0, ne1) first"},
    {"gemv_q4_b32_8x8", lanes_gemv_q4_b32_8x8, METH_VARARGS,
     "gemv_q4_b32_8x8(type, w, x, out, n, nr, nc, portable=0, threads=1): ggml_gemv_<type>_8x8_q8_0 "
     "(AVX2) of nc weight rows repacked as q4_0_8x8, iq4_nl_8x8 or mxfp4_8x8 (w) and nr plain Q8_0 "
     "rows (x) of n elements: out (nr, nc) float32; portable: without the vector instructions; "
     "threads: the column groups shared out (the same bits either way)"},
    {"gemm_q4_b32_8x8", lanes_gemm_q4_b32_8x8, METH_VARARGS,
     "gemm_q4_b32_8x8(type, w, x, out, n, nr, nc, portable=0, threads=1): ggml_gemm_<type>_8x8_q8_0 "
     "(AVX2): as gemv_q4_b32_8x8, x nr / 4 groups of block_q8_0x4 rows (4 rows interleaved)"},
    {"quantize_mat_q8_k_4x8", lanes_quantize_mat_q8_k_4x8, METH_VARARGS,
     "quantize_mat_q8_k_4x8(x, out, k): ggml_quantize_mat_q8_K_4x8 (AVX2) of each group of 4 rows "
     "of k float32 (x): k / 256 block_q8_Kx4 a group into out"},
    {"gemv_q4_k_8x8", lanes_gemv_q4_k_8x8, METH_VARARGS,
     "gemv_q4_k_8x8(w, x, out, n, nr, nc, portable=0, threads=1): ggml_gemv_q4_K_8x8_q8_K (AVX2) "
     "of nc weight rows repacked as q4_K_8x8 (w) and nr Q8_K rows (x) of n elements: out (nr, nc) "
     "float32; portable: without the FMA instruction; threads: the column groups shared out (the "
     "same bits either way)"},
    {"pack_q4_k_8x8", lanes_pack_q4_k_8x8, METH_VARARGS,
     "pack_q4_k_8x8(src, dst, nrows, row_bytes, threads=1): repack_q4_K_to_q4_K_8_bl of nrows plain "
     "Q4_K rows (src) into the q4_K_8x8 layout (dst, the same size), the groups of 8 rows shared "
     "out between up to `threads` threads"},
    {"gemm_q4_k_8x8", lanes_gemm_q4_k_8x8, METH_VARARGS,
     "gemm_q4_k_8x8(w, x, out, n, nr, nc, portable=0, threads=1): ggml_gemm_q4_K_8x8_q8_K (AVX2): "
     "as gemv_q4_k_8x8, x nr / 4 groups of block_q8_Kx4 rows (4 rows interleaved)"},
    {"tiled_mul_mat", lanes_tiled_mul_mat, METH_VARARGS,
     "tiled_mul_mat(type, w, ldw, x, ldx, out, ldo, n0, n1, nb, grid, portable=False, threads=1): out[i1 * ldo + i0] "
     "= llama.cpp's tiled product (ggml-cpu/tiled/, AVX2) of weight row i0 (nb blocks at w + i0*ldw: "
     "Q2_K..Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; grid: the IQ type's "
     "grid table, else None) and Q8_K row i1 (x + i1*ldx), float32; portable: without the vector "
     "instructions; threads: the weight rows shared out (the same bits either way)"},
    {"fa_online", lanes_fa_online, METH_VARARGS,
     "fa_online(s, skip, v, fp16, acc, M, S, rows, n, dv): flash attention's online softmax "
     "(one_chunk) of each row of scores s (rows, n) float32 over the keys not skipped (skip: "
     "uint8): M, S and acc (rows, dv) = sum of exp(s - M) times V's rows (v (n, dv): halves, "
     "accumulated in halves, if fp16, else float32), in ggml's order"},
    {"fa_rows", lanes_fa_rows, METH_VARARGS,
     "fa_rows(q, k, v, mask, out, offs, slopes, sinks, M, S, rows, n, dk, dv, nbk1, nbv1, "
     "scale, softcap, mask_f16, finish): flash attention's one_chunk path for F16 K and V, row by "
     "row at the byte offsets offs[r] = (q, k, v, mask, out): K·q, scale, softcap, mask, online "
     "softmax, sink; out the row divided by S (finish) or not, M and S each row's"},
    {"fa_gemm", lanes_fa_gemm, METH_VARARGS,
     "fa_gemm(c, a, b, m, k, n): simd_gemm, c (m, n) += a (m, k) times b (k, n), float32, each "
     "output a chain of fmaf in k's order"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lanes",
    "The lane loop of ggml's quantized dot products: integer lane sums and one fmaf per block.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lanes(void) { return PyModule_Create(&module); }
