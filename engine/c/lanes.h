/* engine/c/lanes.h: what the C files of the engine._lanes extension share (not a public API).
 *
 * The module is c/lanes.c (its method table); the loops are by family: c/quant.c (ggml's
 * quantized dot products; c/tq.c those of TQ2_0, TQ1_0, MXFP4 and IQ1_M), c/float.c (the float dot products, ggml_v_expf and ggml_v_silu,
 * the soft_max and norm rows, fmaf over buffers), c/blocks.c (the block converters), and
 * c/pool.c (the threads that share a product's rows). A function one
 * file defines and another calls is hidden (LANES_HIDDEN) and named lanes_*: nothing but
 * PyInit__lanes leaves the shared object, and no name can meet one of libm's or numpy's.
 */
#ifndef GGML_LENS_LANES_H
#define GGML_LENS_LANES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES_HIDDEN __attribute__((visibility("hidden")))
#define INLINE static inline __attribute__((always_inline))

/* the ggml types (enum ggml_type), their block sizes and vec_dot partners, written from the
 * engine's records of the quantized types (engine/quants/types_c.py) */
#include "types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_FMA_TARGET 1
#endif

/* fn's FMA build where the CPU has the instruction, else fn (the same bits) */
#ifdef HAVE_FMA_TARGET
#define PICK(fn, hw) ((hw) ? fn##_fma : fn)
#else
#define PICK(fn, hw) fn
#endif

INLINE uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* IEEE half -> float (every half is exactly a float) */
static inline float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* GGML_FP32_TO_FP16: round to nearest even, through the subnormals; overflow to infinity; a NaN
 * becomes the quiet NaN 0x7E00 with its sign (engine.types.fp32_to_fp16_bits) */
static inline uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000)
        return sign | 0x7E00;
    if (ax >= 0x477FF000)  /* 65520 and up (infinity too) round to infinity */
        return sign | 0x7C00;
    if (ax < 0x38800000) {  /* below 2^-14: a subnormal half, in units of 2^-24 (exact scaling) */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)rintf(a * 16777216.0f);
    }
    uint32_t h = ((ax >> 23) - 112) << 10 | (ax & 0x7FFFFF) >> 13;
    const uint32_t rest = ax & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;  /* a carry into the exponent is the right result */
    return sign | (uint16_t)h;
}

/* ggml_compute_fp32_to_bf16: round to nearest even; a NaN made quiet (engine.types.fp32_to_bf16_bits) */
static inline uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFF) > 0x7F800000)
        return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7FFF + ((u >> 16) & 1))) >> 16);
}

/* bf16 bits to float: the float's top half (exact, NaNs as they are) */
static inline float bf16_to_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* get_scale_min_k4: the six-bit scale and min of sub-block j from a K-quant's 12 scale bytes */
INLINE void scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    *sc = j < 4 ? (s[j] & 63) : ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
}

/* the FMA instruction where the CPU has it; libm's fmaf otherwise (the same bits) */
static inline int fma_hw(void)
{
#ifdef HAVE_FMA_TARGET
    return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

/* AVX-512 VNNI's byte dot products on 256-bit vectors, where the CPU has them (and fma_hw()) */
static inline int vnni_hw(void)
{
#ifdef HAVE_FMA_TARGET
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* hsum_float_8: the 8 lanes of an accumulator summed as ggml sums them */
INLINE float hsum8(const float *a)
{
    float r[4];
    for (int l = 0; l < 4; l++)
        r[l] = a[l + 4] + a[l];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

/* rows [a, b) of a job, computed by `worker` (0: the calling thread, 1 .. threads - 1: the pool's) */
typedef void (*lanes_rows_fn)(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b);

enum { LANES_POOL_MAX = 64 };  /* threads a job may ask for (more are taken as this many) */

/* multiply-adds a thread's share of a product must have to pay for handing it to a worker:
 * the workers poll between products (c/pool.c), so a share of a few microseconds pays
 * (Gemma's attention products, 256 x 256 halves by 4 rows, gain a third at 2 threads); fewer
 * threads below that */
#define LANES_SPLIT_MACS ((Py_ssize_t)1 << 16)

/* fn over rows [0, n) in chunks of `chunk`, shared between the calling thread and up to
 * threads - 1 parked workers (fewer if the pool is busy or a worker cannot start); returns when
 * every row is done. Called without the GIL. */
LANES_HIDDEN void lanes_pool_run(lanes_rows_fn fn, void *ctx, Py_ssize_t n, Py_ssize_t chunk,
                                 int threads);

/* PyArg "O&" converters of an optional buffer argument: None leaves view->obj NULL, anything
 * else is taken as a buffer (to read, or to write); release it with lanes_release_optional
 * (a failed parse releases it itself) */
LANES_HIDDEN int lanes_optional_buffer(PyObject *o, void *view);
LANES_HIDDEN int lanes_optional_writable(PyObject *o, void *view);
static inline void lanes_release_optional(Py_buffer *view)
{
    if (view->obj)
        PyBuffer_Release(view);
}

/* buf->len == want, else a ValueError naming what (-1) */
LANES_HIDDEN int lanes_check(Py_buffer *buf, Py_ssize_t want, const char *what);

/* c/iq.c: the bytes of a weight block of an IQ grid type that quant_dot takes (0: not one),
 * and quant_dot's loop for them (out, rows and strides as quant_dot's; hw: the AVX2 loop, else
 * the portable one with acc, room for n1 * 8 floats) */
LANES_HIDDEN Py_ssize_t lanes_iq_size(int type);
LANES_HIDDEN void lanes_iq_dot(int type, int hw, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                               Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1,
                               Py_ssize_t nb, float *acc);

/* the methods of the module table (c/lanes.c), each defined in its family's file */
LANES_HIDDEN PyObject *lanes_quant_dot(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_gelu_lookup(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_dequantize(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_quantize_q8_0(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_quantize_q8_k(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_rope_pairs(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_float_dot(PyObject *self, PyObject *args, PyObject *kwargs);
LANES_HIDDEN PyObject *lanes_dot_f32(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_v_expf(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_v_silu(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_soft_max(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_soft_max_heads(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_fmaf(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_norm_rows(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_rms_norm_rows(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_round_floats(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_set_rows(PyObject *self, PyObject *args);
/* c/repack_q8_0.c: the products of the repacked q4_0_8x8, iq4_nl_8x8 and mxfp4_8x8 */
LANES_HIDDEN PyObject *lanes_gemv_q4_b32_8x8(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_gemm_q4_b32_8x8(PyObject *self, PyObject *args);

/* c/repack_q8_k.c: the products of the repacked q4_K_8x8 and their activations */
LANES_HIDDEN PyObject *lanes_quantize_mat_q8_k_4x8(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_gemv_q4_k_8x8(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_pack_q4_k_8x8(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_gemm_q4_k_8x8(PyObject *self, PyObject *args);

/* c/tiled.c: llama.cpp's tiled K-quant products (ggml-cpu/tiled/) */
LANES_HIDDEN PyObject *lanes_tiled_mul_mat(PyObject *self, PyObject *args);

/* c/attn.c: flash attention's online softmax (one_chunk) and simd_gemm (tiled) */
LANES_HIDDEN PyObject *lanes_fa_online(PyObject *self, PyObject *args);
LANES_HIDDEN PyObject *lanes_fa_rows(PyObject *self, PyObject *args);
LANES_HIDDEN float lanes_dot_halves(const uint16_t *a, const float *b, Py_ssize_t k, int hw);
LANES_HIDDEN PyObject *lanes_fa_gemm(PyObject *self, PyObject *args);

/* c/tq.c: quant_dot of the types it holds (TQ2_0, TQ1_0, MXFP4, IQ1_M). The bytes of a
 * weight block of one of them and (in *ysize) of its activation block; 0 for another type */
LANES_HIDDEN Py_ssize_t lanes_tq_sizes(int type, Py_ssize_t *ysize);

/* out[i1 * ldo + i0] = ggml's AVX2 vec_dot of weight row i0 < n0 (at w + i0 * ldw) and
 * activation row i1 < n1 (at x + i1 * ldx), nb blocks a row, with the vector instructions (hw)
 * or the portable loop (the same bits); 1 if type is one of c/tq.c's, else 0 (nothing done) */
LANES_HIDDEN int lanes_tq_dot(int type, int hw, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                              Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
                              Py_ssize_t n1, Py_ssize_t nb);

#endif
