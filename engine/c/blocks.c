/* engine._lanes (c/lanes.c): the block converters, ggml's to_float of Q8_0, Q4_K, Q5_K and TQ1_0
 * blocks and quantize_row_q8_0, block by block without the GIL. */
#include "lanes.h"

/* to_float (dequantize_row_*) for the types whose numpy form cost most: block by block, the
 * same float operations in the same order as ggml's C (each product and difference rounded to
 * float; nothing fused):
 *   Q8_0   y = q * d
 *   Q4_K   y = (d * sc) * q - (dmin * m), sub-block j of 32 from get_scale_min_k4(j)
 *   Q5_K   the same with q = nibble + 16 * (bit j of qh[e])
 *   TQ1_0  y = (trit - 1) * d; trit n of byte q is ((uint8_t)(q * 3^n) * 3) >> 8: elements
 *          32n + m from qs[m] (n < 5), 160 + 16n + m from qs[32 + m], 240 + 4n + m from qh[m] */

static void dequantize_blocks(int type, const void *raw_, void *y_, Py_ssize_t nb)
{
    const uint8_t *raw = raw_;
    float *y = y_;
    static const uint8_t pow3[6] = {1, 3, 9, 27, 81, 243};
    for (Py_ssize_t b = 0; b < nb; b++) {
        switch (type) {
        case Q8_0: {
            const uint8_t *blk = raw + b * 34;
            const float d = half_to_float(u16(blk));
            const int8_t *qs = (const int8_t *)(blk + 2);
            for (int e = 0; e < 32; e++)
                y[32 * b + e] = (float)qs[e] * d;
            break;
        }
        case Q4_K:
        case Q5_K: {
            const int five = type == Q5_K;
            const uint8_t *blk = raw + b * (five ? 176 : 144);
            const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            const float d = half_to_float(u16(blk)), dmin = half_to_float(u16(blk + 2));
            float *out = y + 256 * b;
            for (int j = 0; j < 8; j++) {
                int sc, m;
                scale_min_k4(blk + 4, j, &sc, &m);
                const float d1 = d * (float)sc, m1 = dmin * (float)m;
                const uint8_t *run = qs + 32 * (j / 2);
                const int shift = (j & 1) * 4;
                for (int e = 0; e < 32; e++) {
                    int q = (run[e] >> shift) & 0x0F;
                    if (five)
                        q += ((qh[e] >> j) & 1) << 4;
                    out[32 * j + e] = d1 * (float)q - m1;
                }
            }
            break;
        }
        default: { /* TQ1_0 */
            const uint8_t *blk = raw + b * 54, *qs = blk, *qh = blk + 48;
            const float d = half_to_float(u16(blk + 52));
            float *out = y + 256 * b;
#define TRIT(byte, n) ((float)((int)(((unsigned)(uint8_t)((byte) * pow3[n]) * 3) >> 8) - 1) * d)
            for (int n = 0; n < 5; n++)
                for (int m = 0; m < 32; m++)
                    out[32 * n + m] = TRIT(qs[m], n);
            for (int n = 0; n < 5; n++)
                for (int m = 0; m < 16; m++)
                    out[160 + 16 * n + m] = TRIT(qs[32 + m], n);
            for (int n = 0; n < 4; n++)
                for (int m = 0; m < 4; m++)
                    out[240 + 4 * n + m] = TRIT(qh[m], n);
#undef TRIT
            break;
        }
        }
    }
}

/* The block converters' shared part: `in` holds whole blocks of in_size bytes, `out` room for as
 * many of out_size; convert(type, in, out, nb) runs without the GIL. */
static PyObject *convert_blocks(int type, Py_buffer *in, Py_buffer *out, Py_ssize_t in_size,
                                Py_ssize_t out_size, void (*convert)(int, const void *, void *, Py_ssize_t),
                                const char *bad)
{
    const Py_ssize_t nb = in_size > 0 ? in->len / in_size : 0;
    int ok = in_size > 0 && in->len % in_size == 0 && lanes_check(out, nb * out_size, "out") == 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        convert(type, in->buf, out->buf, nb);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, bad);
    }
    PyBuffer_Release(in);
    PyBuffer_Release(out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

LANES_HIDDEN PyObject *lanes_dequantize(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer raw, out;
    int type;
    if (!PyArg_ParseTuple(args, "iy*w*", &type, &raw, &out))
        return NULL;
    const int known = type == Q8_0 || type == Q4_K || type == Q5_K || type == TQ1_0;
    const Py_ssize_t bsize = known ? lanes_block_bytes(type) : 0;
    const Py_ssize_t belems = type == Q8_0 ? 32 : 256;
    return convert_blocks(type, &raw, &out, bsize, belems * 4, dequantize_blocks,
                          "_lanes: no such type, or not whole blocks");
}

/* quantize_row_q8_0 of ggml's AVX2 build, block by block (32 floats -> 34 bytes): amax = max |x|
 * (a NaN anywhere makes it NaN), d = amax / 127, id = 127 / amax (0 when amax is 0), each
 * q = x * id rounded to nearest even, converted as _mm256_cvtps_epi32 does (out of range or NaN:
 * INT_MIN), then saturated to int8 as the packs do; d stored as a half */
static void quantize_q8_0_blocks(int type, const void *x_, void *y_, Py_ssize_t nb)
{
    (void)type;  /* Q8_0: the converters' shared signature */
    const float *x = x_;
    uint8_t *y = y_;
    for (Py_ssize_t b = 0; b < nb; b++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(x[i]);
            if (a != a || amax != amax)
                amax = NAN;
            else if (a > amax)
                amax = a;
        }
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t dh = float_to_half(d);
        memcpy(y, &dh, 2);
        for (int i = 0; i < 32; i++) {
            const float r = rintf(x[i] * id);
            const int32_t q = fabsf(r) < 2147483648.0f ? (int32_t)r : INT32_MIN;
            y[2 + i] = (uint8_t)(int8_t)(q < -128 ? -128 : q > 127 ? 127 : q);
        }
    }
}

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>

/* the same with AVX2, as ggml's own loop: the max of |x| by max_ps (NaNs looked for apart),
 * round_ps to nearest, cvtps_epi32 and the saturating packs, put back in order */
__attribute__((target("avx2,fma,f16c"))) static void quantize_q8_0_blocks_fma(int type,
    const void *x_, void *y_, Py_ssize_t nb)
{
    (void)type;
    const float *x = x_;
    uint8_t *y = y_;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (Py_ssize_t b = 0; b < nb; b++, x += 32, y += 34) {
        __m256 v[4], m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, _mm256_and_ps(v[k], abs_mask));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
        }
        float lanes[8], amax = 0.0f;
        _mm256_storeu_ps(lanes, m);
        for (int l = 0; l < 8; l++)
            amax = lanes[l] > amax ? lanes[l] : amax;
        if (_mm256_movemask_ps(nan))
            amax = NAN;
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t dh = float_to_half(d);
        memcpy(y, &dh, 2);
        const __m256 ids = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(v[k], ids), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(y + 2), _mm256_permutevar8x32_epi32(p, order));
    }
}
#endif

LANES_HIDDEN PyObject *lanes_quantize_q8_0(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, out;
    if (!PyArg_ParseTuple(args, "y*w*", &x, &out))
        return NULL;
    return convert_blocks(Q8_0, &x, &out, 32 * 4, 34, PICK(quantize_q8_0_blocks, fma_hw()),
                          "_lanes: x is not whole blocks of 32 floats");
}

/* quantize_row_q8_K_ref, block by block (256 floats -> 292 bytes: float d, 256 int8, 16 int16
 * sums): max = the first x of the largest |x| (`if (amax < fabsf(v))`, so NaNs are passed by),
 * iscale = -127 / max, q = min(127, nearest_int(iscale * x)) by the 1.5 * 2^23 trick, d = 1 /
 * iscale, and each run of 16 q's sum; an all-zero block is d = 0 and zeros (ggml leaves its
 * sums as they were; here they are zero, engine.quants.kquants.quantize_q8_k) */
/* the largest |x| of a block (NaNs passed by, as `if (amax < a)` passes them) */
static inline float largest_abs(const float *x)
{
    float amax = 0.0f;
    for (int i = 0; i < 256; i++) {
        const float a = fabsf(x[i]);
        if (amax < a)
            amax = a;
    }
    return amax;
}

#define Q8_K_BLOCKS(NAME, LARGEST, ATTR)                                                    \
    ATTR static void NAME(int type, const void *x_, void *y_, Py_ssize_t nb)                 \
    {                                                                                        \
        (void)type;                                                                          \
        const float *x = x_;                                                                 \
        uint8_t *y = y_;                                                                     \
        for (Py_ssize_t b = 0; b < nb; b++, x += 256, y += 292) {                            \
            const float amax = LARGEST(x);                                                   \
            float max = 0.0f;                                                                \
            for (int i = 0; i < 256 && amax > 0.0f; i++)  /* the first x of that size */    \
                if (fabsf(x[i]) == amax) {                                                   \
                    max = x[i];                                                              \
                    break;                                                                   \
                }                                                                            \
            int8_t *qs = (int8_t *)(y + 4);                                                  \
            int16_t sums[16] = {0};                                                          \
            float d = 0.0f;                                                                  \
            if (amax == 0.0f) {                                                              \
                memset(qs, 0, 256);                                                          \
            } else {                                                                         \
                const float iscale = -127.0f / max;                                          \
                for (int i = 0; i < 256; i++) {                                              \
                    /* (no contraction: -ffp-contract=off) */                                \
                    const float v = iscale * x[i] + 12582912.0f;                             \
                    int32_t bits;                                                            \
                    memcpy(&bits, &v, 4);                                                    \
                    const int32_t q = (bits & 0x007FFFFF) - 0x00400000;                      \
                    qs[i] = (int8_t)(q < 127 ? q : 127);                                     \
                }                                                                            \
                for (int i = 0; i < 256; i++)                                                \
                    sums[i / 16] += qs[i];                                                   \
                d = 1.0f / iscale;                                                           \
            }                                                                                \
            memcpy(y, &d, 4);                                                                \
            memcpy(y + 4 + 256, sums, sizeof sums);                                          \
        }                                                                                    \
    }

Q8_K_BLOCKS(quantize_q8_k_blocks, largest_abs, )
#ifdef HAVE_FMA_TARGET
/* largest_abs 8 lanes at a time: MAXPS(a, m) is `m < a ? a : m`, so NaNs pass by as there; the
 * lanes' maxima are then one exact maximum, in any order */
__attribute__((target("avx2"))) static inline float largest_abs_avx2(const float *x)
{
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 8)
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), magnitude), m);
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++)
        amax = amax < lanes[l] ? lanes[l] : amax;
    return amax;
}
Q8_K_BLOCKS(quantize_q8_k_blocks_fma, largest_abs_avx2, __attribute__((target("avx2,fma"))))
#endif

LANES_HIDDEN PyObject *lanes_quantize_q8_k(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, out;
    if (!PyArg_ParseTuple(args, "y*w*", &x, &out))
        return NULL;
    return convert_blocks(Q8_K, &x, &out, 256 * 4, 292, PICK(quantize_q8_k_blocks, fma_hw()),
                          "_lanes: x is not whole blocks of 256 floats");
}

/* n floats (at any byte) rounded to 16 bits each (at any byte) by `round` */
INLINE void to_16_bits(const uint8_t *x, uint8_t *h, Py_ssize_t n, uint16_t (*round)(float))
{
    for (Py_ssize_t e = 0; e < n; e++) {
        float v;
        memcpy(&v, x + 4 * e, 4);
        const uint16_t b = round(v);
        memcpy(h + 2 * e, &b, 2);
    }
}

/* to halves, as float_to_half rounds them */
static void to_halves(const uint8_t *x, uint8_t *h, Py_ssize_t n)
{
    to_16_bits(x, h, n, float_to_half);
}

/* to bf16, as float_to_bf16 rounds them */
static void to_bf16(const uint8_t *x, uint8_t *h, Py_ssize_t n)
{
    to_16_bits(x, h, n, float_to_bf16);
}

#ifdef HAVE_FMA_TARGET
/* the same by F16C, 8 at a time (its rounding is float_to_half's: to nearest even, through the
 * subnormals, infinity from 65520 up); a group holding a NaN goes through float_to_half, which
 * makes every NaN ggml's 0x7E00 with its sign */
__attribute__((target("avx2,f16c"))) static void to_halves_f16c(const uint8_t *x, uint8_t *h,
                                                               Py_ssize_t n)
{
    Py_ssize_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const __m256 v = _mm256_loadu_ps((const float *)(x + 4 * e));
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            to_halves(x + 4 * e, h + 2 * e, 8);
        else
            _mm_storeu_si128((__m128i *)(h + 2 * e),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    to_halves(x + 4 * e, h + 2 * e, n - e);
}
#define TO_HALVES(hw) ((hw) ? to_halves_f16c : to_halves)
#else
#define TO_HALVES(hw) to_halves
#endif

/* round_floats(x, bits, back, bf16): ggml_fp32_to_fp16_row (bf16: _bf16_row) of n floats into
 * bits, and, unless back is None, the rounded values widened again into back (floats): the
 * activations of a product of half or bf16 weights, as the dot reads them */
LANES_HIDDEN PyObject *lanes_round_floats(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, bits, back;
    int bf16;
    if (!PyArg_ParseTuple(args, "y*w*O&p", &x, &bits, lanes_optional_writable, &back, &bf16))
        return NULL;
    const Py_ssize_t n = x.len / 4;
    const int ok = x.len % 4 == 0 && lanes_check(&bits, n * 2, "bits") == 0 &&
                   (!back.obj || lanes_check(&back, n * 4, "back") == 0);
    if (ok) {
        const uint16_t *hs = bits.buf;
        float *fs = back.obj ? back.buf : NULL;
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        (bf16 ? to_bf16 : TO_HALVES(hw))(x.buf, bits.buf, n);
        for (Py_ssize_t i = 0; fs && i < n; i++)  /* (every half and bf16 is exactly a float) */
            fs[i] = bf16 ? bf16_to_float(hs[i]) : half_to_float(hs[i]);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: x is not whole floats");
    }
    lanes_release_optional(&back);
    PyBuffer_Release(&x);
    PyBuffer_Release(&bits);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* an index of set_rows: int64 (wide) or int32 */
static inline int64_t index_at(const uint8_t *p, int wide)
{
    if (wide) {
        int64_t i;
        memcpy(&i, p, 8);
        return i;
    }
    int32_t i;
    memcpy(&i, p, 4);
    return i;
}

/* set_rows(x, ldx, idx, ldi, wide, out, ldo, ne1, rows, n, kind): ggml_compute_forward_set_rows
 * of `rows` rows of n floats (row r at byte r * ldx of x) into the rows of out (row i at byte
 * i * ldo, ne1 of them) that idx names (index r at byte r * ldi: int64 if wide, else int32), in
 * order (a repeated index: the last row stays), each as floats (kind 0), halves (1) or bf16 (2).
 * Every index is checked before a row is written: returns -1, or the first r whose index lies
 * outside [0, ne1) (then nothing is written). */
LANES_HIDDEN PyObject *lanes_set_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, idx, out;
    Py_ssize_t ldx, ldi, ldo, ne1, rows, n;
    int wide, kind;
    if (!PyArg_ParseTuple(args, "y*ny*npw*nnnni", &x, &ldx, &idx, &ldi, &wide, &out, &ldo, &ne1,
                          &rows, &n, &kind))
        return NULL;
    const Py_ssize_t esize = kind == 0 ? 4 : 2, isize = wide ? 8 : 4;
    int ok = rows >= 0 && n >= 0 && ne1 >= 0 && ldx >= 0 && ldi >= 0 && ldo >= 0 && kind >= 0 &&
             kind <= 2 && (rows == 0 || (x.len >= (rows - 1) * ldx + n * 4 &&
                                         idx.len >= (rows - 1) * ldi + isize)) &&
             (ne1 == 0 || out.len >= (ne1 - 1) * ldo + n * esize);
    Py_ssize_t bad = -1;
    if (ok) {
        const int hw = fma_hw();
        const uint8_t *xb = x.buf, *ib = idx.buf;
        uint8_t *ob = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < rows && bad < 0; r++) {
            const int64_t i = index_at(ib + r * ldi, wide);
            if (i < 0 || i >= ne1)
                bad = r;
        }
        for (Py_ssize_t r = 0; r < rows && bad < 0; r++) {
            const int64_t i = index_at(ib + r * ldi, wide);
            const float *src = (const float *)(xb + r * ldx);
            uint8_t *dst = ob + i * ldo;
            if (kind == 0) {
                memmove(dst, src, (size_t)n * 4);
            } else {
                (kind == 1 ? TO_HALVES(hw) : to_bf16)((const uint8_t *)src, dst, n);
            }
        }
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes");
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&idx);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    return PyLong_FromSsize_t(bad);
}
