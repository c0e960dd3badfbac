/* engine._lanes (c/lanes.c): the float loops, the dot products of mul_mat (ggml_vec_dot_f32,
 * _f16, _bf16 and llamafile's tinyBLAS), ggml_v_expf and ggml_v_silu, the soft_max and norm
 * rows, and fmaf over whole buffers; most also built for the FMA instruction, picked where the
 * CPU has it. */
#include "lanes.h"

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#endif

/* Float dot products of rows a and b of k floats, as ggml's AVX2 builds compute them:
 * lanes32: ggml's SIMD loop over the first np = k & ~31 elements: 4 accumulators of 8 lanes, one
 *   fmaf per element, reduced (a0 + a2) + (a1 + a3), then lanes (l + l+4), then
 *   (r0 + r1) + (r2 + r3).
 * f32_row: ggml_vec_dot_f32: lanes32, then the leftovers as gcc compiled `sumf += x[i]*y[i]`: a
 *   run of 8 (or one of 4) as a vector product, each product rounded, added to sumf in order;
 *   the last ones (up to 3) by fmaf.
 * f16_row: ggml_vec_dot_f16 of the F16C build (the halves widened to float): lanes32, then the
 *   leftover products, each rounded to float, summed in double; half_bits_row the same on the
 *   halves as they lie, each widened as it is read.
 * bf16_bits_row: ggml_vec_dot_bf16 of the AVX2 build (each bf16 widened to float as it is read):
 *   lanes32's accumulators (gcc fuses its mul and add into one fma), reduced (a0 + a2) +
 *   (a1 + a3), then hsum as tiny_row's; then f16_row's leftovers in double.
 * tiny_row: llamafile's tinyBLAS (k a multiple of 8): one accumulator of 8 lanes, one fmaf per
 *   element, then hsum: (hi + lo), (r0 + r2) + (r1 + r3).
 * ALL_PAIRS makes, from a row function, NAME(w, x, out, n0, n1, k): out[i1, i0] = row(w[i0],
 * x[i1]) for every pair of rows of w (n0, k) and x (n1, k); ROW_PAIRS NAME(a, b, out, n, k):
 * out[i] = row(a[i], b[i]); FLOAT_JOB the same as ALL_PAIRS for some weight rows of a float_dot,
 * which the pool shares out (c/pool.c). */

/* NAME(a, b, np, v): the 4 accumulators of 8 lanes over the first np elements of rows a (of
 * type T, element i read as VALUE(a[i])) and b, reduced into v */
#define ACC32(NAME, T, VALUE, ATTR)                                                          \
    ATTR static inline void NAME(const T *a, const float *b, Py_ssize_t np, float *v)        \
    {                                                                                        \
        float acc[4][8] = {{0}};                                                             \
        for (Py_ssize_t s = 0; s < np; s += 32)                                              \
            for (int j = 0; j < 4; j++)                                                      \
                for (int l = 0; l < 8; l++)                                                  \
                    acc[j][l] = fmaf(VALUE(a[s + 8 * j + l]), b[s + 8 * j + l], acc[j][l]);  \
        for (int l = 0; l < 8; l++)                                                          \
            v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);                        \
    }
/* ==== the dot products of mul_mat: vec_dot_f32, _f16, _bf16, tinyBLAS ======================== */

#define AS_IS(x) (x)

/* lanes32's reduction of the 8 lanes: (l + l+4), then (r0 + r1) + (r2 + r3) */
static inline float lanes_sum(const float *v)
{
    float t[4];
    for (int l = 0; l < 4; l++)
        t[l] = v[l] + v[l + 4];
    return (t[0] + t[1]) + (t[2] + t[3]);
}

/* NAME(a, b, k): ACC's lanes over the first k & ~31 elements reduced by SUM, then the leftover
 * products (element i of a read as VALUE(a[i])), each rounded to float, summed in double */
#define ROW_IN_DOUBLE(NAME, T, ACC, VALUE, SUM, ATTR)                                        \
    ATTR static inline float NAME(const T *a, const float *b, Py_ssize_t k)                  \
    {                                                                                        \
        const Py_ssize_t np = k & ~(Py_ssize_t)31;                                           \
        float v[8];                                                                          \
        ACC(a, b, np, v);                                                                    \
        double sumf = (double)SUM(v);                                                        \
        for (Py_ssize_t i = np; i < k; i++) {                                                \
            const float p = VALUE(a[i]) * b[i];                                              \
            sumf += (double)p;                                                               \
        }                                                                                    \
        return (float)sumf;                                                                  \
    }

/* the row functions of one build (S: its suffix; HALF: how it widens a half, HALF_ACC: its
 * ACC32 of half rows) */
#define FLOAT_ROWS(S, ATTR, HALF, HALF_ACC)                                                  \
    ACC32(acc32##S, float, AS_IS, ATTR)                                                      \
    ACC32(acc32_bf16##S, uint16_t, bf16_to_float, ATTR)                                         \
    ROW_IN_DOUBLE(f16_row##S, float, acc32##S, AS_IS, lanes_sum, ATTR)                       \
    ROW_IN_DOUBLE(half_bits_row##S, uint16_t, HALF_ACC, HALF, lanes_sum, ATTR)               \
    ROW_IN_DOUBLE(bf16_bits_row##S, uint16_t, acc32_bf16##S, bf16_to_float, hsum8, ATTR)        \
    ATTR static inline float lanes32##S(const float *a, const float *b, Py_ssize_t np)      \
    {                                                                                        \
        float v[8];                                                                          \
        acc32##S(a, b, np, v);                                                               \
        return lanes_sum(v);                                                                 \
    }                                                                                        \
    ATTR static inline float f32_row##S(const float *a, const float *b, Py_ssize_t k)       \
    {                                                                                        \
        Py_ssize_t i = k & ~(Py_ssize_t)31;                                                  \
        float sumf = lanes32##S(a, b, i);                                                    \
        while (k - i >= 4) {                                                                 \
            const Py_ssize_t step = k - i >= 8 ? 8 : 4;                                      \
            float p[8];                                                                      \
            for (Py_ssize_t e = 0; e < step; e++)                                            \
                p[e] = a[i + e] * b[i + e];                                                  \
            for (Py_ssize_t e = 0; e < step; e++)                                            \
                sumf = sumf + p[e];                                                          \
            i += step;                                                                       \
            if (step == 4)                                                                   \
                break;                                                                       \
        }                                                                                    \
        for (; i < k; i++)                                                                   \
            sumf = fmaf(a[i], b[i], sumf);                                                   \
        return sumf;                                                                         \
    }                                                                                        \
    ATTR static inline float tiny_row##S(const float *a, const float *b, Py_ssize_t k)      \
    {                                                                                        \
        float acc[8] = {0};                                                                  \
        for (Py_ssize_t s = 0; s < k; s += 8)                                                \
            for (int l = 0; l < 8; l++)                                                      \
                acc[l] = fmaf(a[s + l], b[s + l], acc[l]);                                   \
        return hsum8(acc);                                                                   \
    }

#define ALL_PAIRS(NAME, ROW, ATTR)                                                           \
    ATTR static void NAME(const float *w, const float *x, float *out, Py_ssize_t n0,         \
                          Py_ssize_t n1, Py_ssize_t k)                                       \
    {                                                                                        \
        for (Py_ssize_t i1 = 0; i1 < n1; i1++)                                               \
            for (Py_ssize_t i0 = 0; i0 < n0; i0++)                                           \
                out[i1 * n0 + i0] = ROW(w + i0 * k, x + i1 * k, k);                          \
    }
#define ROW_PAIRS(NAME, ROW, ATTR)                                                           \
    ATTR static void NAME(const float *a, const float *b, float *out, Py_ssize_t n,          \
                          Py_ssize_t k)                                                      \
    {                                                                                        \
        for (Py_ssize_t i = 0; i < n; i++)                                                   \
            out[i] = ROW(a + i * k, b + i * k, k);                                           \
    }

/* float_dot's rows: weight rows [a, b) by every activation row */
typedef struct {
    const void *w;         /* floats (n0, k), or halves or bf16, row i0 at element i0 * ldw */
    const float *x;        /* (n1, k) */
    float *out, *buf;      /* out (n1, n0); buf: each worker's room for a widened row (tiny) */
    Py_ssize_t n0, n1, k, ldw;  /* ldw < 0: w holds floats */
    int tiny, bf16, hw;    /* bf16: w holds bf16, and the row is ggml_vec_dot_bf16's */
} FloatJob;

/* NAME: float_dot's rows [a, b). Half and bf16 rows are read as they lie, but for tinyBLAS's
 * rows, whose halves are widened into buf first, a row at a time */
#define FLOAT_JOB(NAME, F16, HALF_BITS, BF16_BITS, TINY, WIDEN, ATTR)                         \
    ATTR static void NAME(const FloatJob *j, float *buf, Py_ssize_t a, Py_ssize_t b)        \
    {                                                                                        \
        const Py_ssize_t k = j->k;                                                           \
        if (!j->tiny && j->ldw >= 0) {                                                       \
            for (Py_ssize_t i0 = a; i0 < b; i0++)                                            \
                for (Py_ssize_t i1 = 0; i1 < j->n1; i1++)                                    \
                    j->out[i1 * j->n0 + i0] = (j->bf16 ? BF16_BITS : HALF_BITS)(             \
                        (const uint16_t *)j->w + i0 * j->ldw, j->x + i1 * k, k);             \
            return;                                                                          \
        }                                                                                    \
        for (Py_ssize_t i0 = a; i0 < b; i0++) {                                              \
            const float *wr = (const float *)j->w + i0 * k;                                  \
            if (j->ldw >= 0) {                                                               \
                const uint16_t *h = (const uint16_t *)j->w + i0 * j->ldw;                    \
                if (j->bf16)                                                                 \
                    widen_bf16(h, buf, k);                                                   \
                else                                                                         \
                    WIDEN(h, buf, k);                                                        \
                wr = buf;                                                                    \
            }                                                                                \
            for (Py_ssize_t i1 = 0; i1 < j->n1; i1++)                                        \
                j->out[i1 * j->n0 + i0] =                                                    \
                    (j->tiny ? TINY : F16)(wr, j->x + i1 * k, k);                     \
        }                                                                                    \
    }

static void widen(const uint16_t *h, float *f, Py_ssize_t k)
{
    for (Py_ssize_t t = 0; t < k; t++)
        f[t] = half_to_float(h[t]);
}

static void widen_bf16(const uint16_t *h, float *f, Py_ssize_t k)
{
    for (Py_ssize_t t = 0; t < k; t++)
        f[t] = bf16_to_float(h[t]);
}

ACC32(acc32_half, uint16_t, half_to_float, )
FLOAT_ROWS(, , half_to_float, acc32_half)
ALL_PAIRS(dot_f32, f32_row, )
ROW_PAIRS(dot_f32_pairs, f32_row, )
FLOAT_JOB(float_rows, f16_row, half_bits_row, bf16_bits_row, tiny_row, widen, )
#ifdef HAVE_FMA_TARGET
#define F16C __attribute__((target("avx2,fma,f16c")))

/* halves to floats by F16C, 8 at a time (every half is exactly a float: the same values) */
F16C static inline void widen_f16c(const uint16_t *h, float *f, Py_ssize_t k)
{
    Py_ssize_t t = 0;
    for (; t + 8 <= k; t += 8)
        _mm256_storeu_ps(f + t, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + t))));
    for (; t < k; t++)
        f[t] = _cvtsh_ss(h[t]);
}

/* ACC32 of half rows, each 8 widened by F16C as the dot reads them (a loop of _cvtsh_ss is not
 * vectorised) */
F16C static inline void acc32_half_f16c(const uint16_t *a, const float *b, Py_ssize_t np, float *v)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (Py_ssize_t s = 0; s < np; s += 32)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + s + 8 * j))),
                                     _mm256_loadu_ps(b + s + 8 * j), acc[j]);
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
}

FLOAT_ROWS(_fma, F16C, _cvtsh_ss, acc32_half_f16c)
ALL_PAIRS(dot_f32_fma, f32_row_fma, F16C)
ROW_PAIRS(dot_f32_pairs_fma, f32_row_fma, F16C)
FLOAT_JOB(float_rows_fma, f16_row_fma, half_bits_row_fma, bf16_bits_row_fma, tiny_row_fma, widen_f16c, F16C)
#endif

static void float_job(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const FloatJob *j = ctx;
    float *buf = j->buf ? j->buf + (Py_ssize_t)worker * j->k : NULL;
#ifdef HAVE_FMA_TARGET
    if (j->hw) {
        float_rows_fma(j, buf, a, b);
        return;
    }
#endif
    float_rows(j, buf, a, b);
}

LANES_HIDDEN PyObject *lanes_float_dot(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *names[] = {"w", "x", "out", "n0", "n1", "k", "tiny", "ldw", "threads", "bf16",
                            "portable", NULL};
    Py_buffer w, x, out;
    Py_ssize_t n0, n1, k, ldw = -1;
    int tiny, threads = 1, bf16 = 0, portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*w*nnnp|nipp", names, &w, &x, &out, &n0,
                                     &n1, &k, &tiny, &ldw, &threads, &bf16, &portable))
        return NULL;
    /* ldw >= 0: w holds halves (bf16: bf16), row i0 at element i0 * ldw (widened a row at a
     * time); bf16 asks for them. portable: the loop of CPUs without FMA and F16C (the same
     * bits, tested) */
    int ok = n0 >= 0 && n1 >= 0 && k >= 0 && (!tiny || k % 8 == 0) && (!bf16 || ldw >= 0) &&
             (ldw < 0 ? lanes_check(&w, n0 * k * 4, "w") == 0
                      : (ldw >= k && w.len >= ((n0 > 0 ? (n0 - 1) * ldw : 0) + k) * 2)) &&
             lanes_check(&x, n1 * k * 4, "x") == 0 && lanes_check(&out, n0 * n1 * 4, "out") == 0;
    Py_ssize_t parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
    while (parts > 1 && (n0 < parts || n0 * n1 * k / parts < LANES_SPLIT_MACS))
        parts--;
    float *buf = NULL;
    if (ok && ldw >= 0 && tiny && !(buf = PyMem_RawMalloc((size_t)(parts * k + 1) * sizeof(float)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        FloatJob job = {w.buf, x.buf, out.buf, buf, n0, n1, k, ldw, tiny, bf16,
                        !portable && fma_hw()};
        Py_BEGIN_ALLOW_THREADS
        lanes_pool_run(float_job, &job, n0, parts > 1 ? (n0 + 4 * parts - 1) / (4 * parts) : n0,
                       (int)parts);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes");
    }
    PyMem_RawFree(buf);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

LANES_HIDDEN PyObject *lanes_dot_f32(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, x, out;
    Py_ssize_t n0, n1, k;
    int pairs = 0;
    if (!PyArg_ParseTuple(args, "y*y*w*nnn|p", &w, &x, &out, &n0, &n1, &k, &pairs))
        return NULL;
    /* pairs: w and x both (n0, k), out (n0) */
    int ok = n0 >= 0 && n1 >= 0 && k >= 0 && (!pairs || n1 == n0) &&
             lanes_check(&w, n0 * k * 4, "w") == 0 && lanes_check(&x, n1 * k * 4, "x") == 0 &&
             lanes_check(&out, (pairs ? n0 : n0 * n1) * 4, "out") == 0;
    if (ok) {
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        if (pairs)
            PICK(dot_f32_pairs, hw)(w.buf, x.buf, out.buf, n0, k);
        else
            PICK(dot_f32, hw)(w.buf, x.buf, out.buf, n0, n1, k);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ggml_v_expf and ggml_v_silu, ggml's AVX2 polynomial, one lane at a time: exp(x) as 2^n * p(b)
 * with n = round(x * log2 e) (by adding and subtracting 1.5 * 2^23), b = x - n * ln 2 in two
 * parts, p a degree-5 polynomial in b, and 2^n built in the exponent bits; where |n| > 126 the
 * scale is split in two factors (s1, s2) so that it neither overflows nor underflows early, and
 * where |n| > 192 the result is s1 * s1 (0 or infinity). Each vector operation is one IEEE
 * operation on each lane, so a lane alone gives the vector's bits; the fused multiply-adds are
 * fmaf (one rounding), the integer operations wrap as the vector instructions do. */
#define V_EXPF_LANE(NAME, ATTR)                                                              \
    ATTR static inline float NAME(float x)                                                   \
    {                                                                                        \
        const float shift = 0x1.8p23f;                                                       \
        const float z = fmaf(x, 0x1.715476p+0f, shift);                                      \
        const float n = z - shift;                                                           \
        const float b = fmaf(n, -0x1.7f7d1cp-20f, fmaf(n, -0x1.62e4p-1f, x));                \
        uint32_t zb;                                                                         \
        memcpy(&zb, &z, 4);                                                                  \
        const uint32_t e = zb << 23, kb = e + 0x3f800000u;                                   \
        const float u = b * b;                                                               \
        const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,                \
                                  fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),                  \
                             u, 0x1.ffffecp-1f * b);                                         \
        const float an = fabsf(n);                                                           \
        const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;                                     \
        const uint32_t s1b = g + 0x7f000000u, s2b = e - g;                                   \
        float k, s1, s2;                                                                     \
        memcpy(&k, &kb, 4);                                                                  \
        memcpy(&s1, &s1b, 4);                                                                \
        memcpy(&s2, &s2b, 4);                                                                \
        /* the three results, then the one |n| picks (as the vector code's masks do) */      \
        const float normal = fmaf(k, j, k), scaled = fmaf(s2, j, s2) * s1, huge = s1 * s1;   \
        return an > 192.0f ? huge : an > 126.0f ? scaled : normal;                           \
    }

/* ==== ggml_v_expf and ggml_v_silu ============================================================ */

V_EXPF_LANE(v_expf_1, )

static void v_expf(const float *x, float *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = v_expf_1(x[i]);
}

static void v_silu(const float *x, float *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = x[i] / (1.0f + v_expf_1(0.0f - x[i]));
}

/* ==== soft_max rows ========================================================================== */

/* ggml_vec_soft_max_f32 on `rows` rows of n: y = exp(w - max), v_expf on whole groups of 8 and
 * libm's expf on the rest; each group's lanes summed in float as the SSE shuffles add them,
 * ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), then every group's sum and every tail value added in
 * double, left to right */
static void v_softmax(const float *w, const float *mx, float *y, double *sums, Py_ssize_t rows,
                      Py_ssize_t n)
{
    const Py_ssize_t n8 = n - n % 8;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *wr = w + r * n, m = mx[r];
        float *yr = y + r * n;
        for (Py_ssize_t i = 0; i < n8; i++)
            yr[i] = v_expf_1(wr[i] - m);
        double sum = 0.0;
        for (Py_ssize_t i = 0; i < n8; i += 8) {
            const float *v = yr + i;
            const float h0 = v[0] + v[4], h1 = v[1] + v[5], h2 = v[2] + v[6], h3 = v[3] + v[7];
            sum += (double)((h0 + h2) + (h1 + h3));
        }
        for (Py_ssize_t i = n8; i < n; i++) {
            yr[i] = expf(wr[i] - m);
            sum += (double)yr[i];
        }
        sums[r] = sum;
    }
}

#ifdef HAVE_FMA_TARGET
#define AVX2_FMA __attribute__((target("avx2,fma")))
V_EXPF_LANE(v_expf_1_fma, AVX2_FMA)

/* The same lanes 8 at a time with AVX2 and FMA intrinsics, as ggml's vector code runs them:
 * when no lane's |n| exceeds 126 (nearly always) only the plain result is computed. Each
 * instruction is the scalar lane's operation (the fma's operands in the same order), so the
 * bits are v_expf_1's; a tail shorter than 8 goes through v_expf_1_fma. */
AVX2_FMA static inline __m256 v_expf8(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fmadd_ps(n, _mm256_set1_ps(-0x1.7f7d1cp-20f),
                                     _mm256_fmadd_ps(n, _mm256_set1_ps(-0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)),
                        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(k, j, k);
    const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(an, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    if (!_mm256_movemask_ps(big))
        return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    const __m256 huge = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    return _mm256_blendv_ps(_mm256_blendv_ps(normal, scaled, big), _mm256_mul_ps(s1, s1), huge);
}

AVX2_FMA static void v_expf_fma(const float *x, float *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, v_expf8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        out[i] = v_expf_1_fma(x[i]);
}

AVX2_FMA static void v_silu_fma(const float *x, float *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = v_expf8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(out + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    for (; i < n; i++)
        out[i] = x[i] / (1.0f + v_expf_1_fma(0.0f - x[i]));
}

AVX2_FMA static void v_softmax_fma(const float *w, const float *mx, float *y, double *sums,
                                   Py_ssize_t rows, Py_ssize_t n)
{
    const Py_ssize_t n8 = n - n % 8;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *wr = w + r * n;
        float *yr = y + r * n;
        const __m256 m = _mm256_set1_ps(mx[r]);
        double sum = 0.0;
        for (Py_ssize_t i = 0; i < n8; i += 8) {
            const __m256 v = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(wr + i), m));
            _mm256_storeu_ps(yr + i, v);
            const __m128 h = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
            const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));  /* h0 + h2, h1 + h3 */
            sum += (double)_mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
        }
        for (Py_ssize_t i = n8; i < n; i++) {
            yr[i] = expf(wr[i] - mx[r]);
            sum += (double)yr[i];
        }
        sums[r] = sum;
    }
}
#endif


LANES_HIDDEN PyObject *lanes_soft_max(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, mx, y, sums;
    Py_ssize_t rows, n;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nn", &w, &mx, &y, &sums, &rows, &n))
        return NULL;
    int ok = rows >= 0 && n >= 0 && lanes_check(&w, rows * n * 4, "w") == 0 &&
             lanes_check(&mx, rows * 4, "mx") == 0 && lanes_check(&y, rows * n * 4, "y") == 0 &&
             lanes_check(&sums, rows * 8, "sums") == 0;
    if (ok) {
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        PICK(v_softmax, hw)(w.buf, mx.buf, y.buf, sums.buf, rows, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&mx);
    PyBuffer_Release(&y);
    PyBuffer_Release(&sums);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* soft_max_heads(x, y, m, sinks, slopes, scale, heads, rows, n, xh, xr, yh, yr, mheads, mh,
 * mr, mf16): ggml_compute_forward_soft_max_f32 on the rows (h, r) of `heads` matrices of `rows`
 * rows of n floats (element i of row (h, r) at byte h * xh + r * xr + 4 * i of x; y likewise):
 * w = x * scale, plus slopes[h] * the mask's row (h % mheads, r) when m is not None (floats,
 * or halves if mf16; at byte (h % mheads) * mh + r * mr), fused, or added when every slope is 1;
 * its max (a NaN if any, as numpy's), raised to sinks[h] when sinks is not None; then
 * ggml_vec_soft_max_f32 (v_softmax), exp(sink - max) added to the double sum, and the row times
 * (float)(1 / sum). */
/* fn over `rows` rows of n elements, shared between up to `threads` threads when each share
 * has enough elements to pay for a wake-up (called without the GIL) */
static void rows_shared(lanes_rows_fn fn, void *job, Py_ssize_t rows, Py_ssize_t n, int threads)
{
    Py_ssize_t parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
    while (parts > 1 && (rows < parts || rows * n / parts < LANES_SPLIT_MACS))
        parts--;
    lanes_pool_run(fn, job, rows, parts > 1 ? (rows + 4 * parts - 1) / (4 * parts) : rows, (int)parts);
}

typedef struct {
    const char *x, *m;
    char *y;
    const float *slopes, *sinks;
    float scale, *w;  /* w: each worker's row of n floats */
    Py_ssize_t rows, n, xh, xr, yh, yr, mheads, mh, mr;
    int mf16, unit, hw;
} SoftMaxJob;

/* soft_max_heads' rows q = h * rows + r for q in [a, b) */
static void soft_max_job(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const SoftMaxJob *j = ctx;
    float *w = j->w + worker * (j->n + 1);
    const Py_ssize_t n = j->n;
    for (Py_ssize_t q = a; q < b; q++) {
        const Py_ssize_t h = q / j->rows, r = q % j->rows;
        const float *xs = (const float *)(j->x + h * j->xh + r * j->xr);
        float *ys = (float *)(j->y + h * j->yh + r * j->yr);
        for (Py_ssize_t i = 0; i < n; i++)
            w[i] = xs[i] * j->scale;
        if (j->m) {
            const char *mrow = j->m + (h % j->mheads) * j->mh + r * j->mr;
            for (Py_ssize_t i = 0; i < n; i++) {
                float v;
                if (j->mf16) {
                    uint16_t bits;
                    memcpy(&bits, mrow + 2 * i, 2);
                    v = half_to_float(bits);
                } else {
                    memcpy(&v, mrow + 4 * i, 4);
                }
                w[i] = j->unit ? w[i] + v : fmaf(j->slopes[h], v, w[i]);
            }
        }
        float mx = -INFINITY;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (isnan(w[i])) {
                mx = w[i];
                break;
            }
            mx = w[i] > mx ? w[i] : mx;
        }
        const float *sk = j->sinks;
        if (sk && !isnan(mx))
            mx = isnan(sk[h]) || sk[h] > mx ? sk[h] : mx;
        double sum;
        PICK(v_softmax, j->hw)(w, &mx, ys, &sum, 1, n);
        if (sk)
            sum += (double)expf(sk[h] - mx);
        const float inv = (float)(1.0 / sum);
        for (Py_ssize_t i = 0; i < n; i++)
            ys[i] = ys[i] * inv;
    }
}

LANES_HIDDEN PyObject *lanes_soft_max_heads(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, y, m, sinks, slopes;
    float scale;
    Py_ssize_t heads, rows, n, xh, xr, yh, yr, mheads, mh, mr;
    int mf16, threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*O&O&y*fnnnnnnnnnnp|i", &x, &y, lanes_optional_buffer, &m,
                          lanes_optional_buffer, &sinks, &slopes, &scale, &heads, &rows, &n, &xh,
                          &xr, &yh, &yr, &mheads, &mh, &mr, &mf16, &threads))
        return NULL;
    const Py_ssize_t last = n * 4, mlast = n * (mf16 ? 2 : 4);
    int ok = heads >= 0 && rows >= 0 && n >= 0 && xh >= 0 && xr >= 0 && yh >= 0 && yr >= 0 &&
         mh >= 0 && mr >= 0 && lanes_check(&slopes, heads * 4, "slopes") == 0 &&
         (heads == 0 || rows == 0 ||
          (x.len >= (heads - 1) * xh + (rows - 1) * xr + last &&
           y.len >= (heads - 1) * yh + (rows - 1) * yr + last &&
           (!m.obj || (mheads > 0 && m.len >= (mheads - 1) * mh + (rows - 1) * mr + mlast)) &&
           (!sinks.obj || sinks.len >= heads * 4)));
    const int parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
    float *w = ok ? PyMem_RawMalloc((size_t)parts * (size_t)(n + 1) * sizeof(float)) : NULL;
    if (ok && !w) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const float *sl = slopes.buf;
        int unit = 1;
        for (Py_ssize_t h = 0; h < heads; h++)
            unit = unit && sl[h] == 1.0f;
        SoftMaxJob job = {x.buf, m.obj ? m.buf : NULL, y.buf, sl, sinks.obj ? sinks.buf : NULL,
                          scale, w, rows, n, xh, xr, yh, yr, mheads, mh, mr, mf16, unit, fma_hw()};
        Py_BEGIN_ALLOW_THREADS
        rows_shared(soft_max_job, &job, heads * rows, n, parts);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes");
    }
    PyMem_RawFree(w);
    lanes_release_optional(&m);
    lanes_release_optional(&sinks);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    PyBuffer_Release(&slopes);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ==== norm and rms_norm rows ================================================================= */

/* ggml_compute_forward_norm_f32 on `rows` rows of n floats (row r at byte r * ldx of x, r * ldy
 * of y; x and y may be the same memory): the mean is the row's sum in double, left to right,
 * rounded to float, over (float)n; ggml_vec_cvar_f32 writes y = x - mean and sums its squares:
 * each whole group of 8 squares added in float as the SSE shuffles add them, hi + lo lane by lane
 * (s[l+4] + s[l]), then ((h0 + h2) + (h1 + h3)), each group's sum and then each tail square
 * added in double, left to right; the variance is that sum over n in double, rounded to float;
 * y *= 1.0f / sqrtf(variance + eps). Every step is one IEEE operation on one lane, so this
 * scalar loop gives the bits of ggml's AVX2 one (the compiler may run the lanes as vectors).
 * The sums of NORM_ROWS rows run side by side, each still in its own order: the adds of one
 * wait for each other, those of four rows do not. */
enum { NORM_ROWS = 4 };

static void norm_cvar_scale(const float *x, float *y, Py_ssize_t n, float mean, float eps)
{
    const Py_ssize_t n8 = n - n % 8;
    double sq = 0.0;
    for (Py_ssize_t i = 0; i < n8; i += 8) {
        float s[8];
        for (int l = 0; l < 8; l++) {
            const float v = x[i + l] - mean;
            y[i + l] = v;
            s[l] = v * v;
        }
        const float h0 = s[4] + s[0], h1 = s[5] + s[1], h2 = s[6] + s[2], h3 = s[7] + s[3];
        sq += (double)((h0 + h2) + (h1 + h3));
    }
    for (Py_ssize_t i = n8; i < n; i++) {
        const float v = x[i] - mean;
        y[i] = v;
        sq += (double)(v * v);
    }
    const float variance = (float)(sq / (double)n);
    const float scale = 1.0f / sqrtf(variance + eps);
    for (Py_ssize_t i = 0; i < n; i++)
        y[i] = y[i] * scale;
}

/* the norms' rows: x and y span them exactly, (rows - 1) row strides (ldx, ldy bytes) and one
 * row of n floats; 0 with the error set when they do not */
static int row_spans_ok(Py_buffer *x, Py_buffer *y, Py_ssize_t rows, Py_ssize_t n, Py_ssize_t ldx,
                        Py_ssize_t ldy)
{
    if (!(rows >= 0 && n >= 0 && ldx >= 4 * n && ldy >= 4 * n)) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes");
        return 0;
    }
    return lanes_check(x, rows ? (rows - 1) * ldx + 4 * n : 0, "x") == 0 &&
           lanes_check(y, rows ? (rows - 1) * ldy + 4 * n : 0, "y") == 0;
}

typedef void (*norm_cvar_fn)(const float *x, float *y, Py_ssize_t n, float mean, float eps);

static void norm_rows(const char *x, char *y, Py_ssize_t rows, Py_ssize_t n, Py_ssize_t ldx,
                      Py_ssize_t ldy, float eps, norm_cvar_fn cvar_scale)
{
    for (Py_ssize_t r0 = 0; r0 < rows; r0 += NORM_ROWS) {
        const int k = rows - r0 < NORM_ROWS ? (int)(rows - r0) : NORM_ROWS;
        const float *xr[NORM_ROWS];
        double sum[NORM_ROWS] = {0.0};
        for (int j = 0; j < NORM_ROWS; j++)  /* a missing row repeats the last one */
            xr[j] = (const float *)(x + (r0 + (j < k ? j : k - 1)) * ldx);
        for (Py_ssize_t i = 0; i < n; i++)
            for (int j = 0; j < NORM_ROWS; j++)
                sum[j] += (double)xr[j][i];
        for (int j = 0; j < k; j++)
            cvar_scale(xr[j], (float *)(y + (r0 + j) * ldy), n, (float)sum[j] / (float)n, eps);
    }
}

#ifdef HAVE_FMA_TARGET
/* norm_cvar_scale with ggml's own AVX2 instructions: each one the scalar loop's operation on
 * every lane (hi + lo, then h0 + h2 and h1 + h3, then their sum), so the same bits */
AVX2_FMA static void norm_cvar_scale_fma(const float *x, float *y, Py_ssize_t n, float mean,
                                         float eps)
{
    const __m256 m = _mm256_set1_ps(mean);
    Py_ssize_t i = 0;
    double sq = 0.0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
        _mm256_storeu_ps(y + i, v);
        const __m256 s = _mm256_mul_ps(v, v);
        const __m128 h = _mm_add_ps(_mm256_extractf128_ps(s, 1), _mm256_castps256_ps128(s));
        const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        sq += (double)_mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }
    for (; i < n; i++) {
        const float v = x[i] - mean;
        y[i] = v;
        sq += (double)(v * v);
    }
    const float variance = (float)(sq / (double)n);
    const float scale = 1.0f / sqrtf(variance + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
    for (; i < n; i++)
        y[i] = y[i] * scale;
}
#endif

/* the norms' rows shared out between up to `threads` threads of the row pool (each row is
 * its own: the same bits however they are shared) */
typedef struct {
    const char *x;
    char *y;
    Py_ssize_t n, ldx, ldy;
    float eps;
    norm_cvar_fn cvar_scale;  /* (norm's) */
} NormJob;

static void norm_job(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const NormJob *j = ctx;
    (void)worker;
    norm_rows(j->x + a * j->ldx, j->y + a * j->ldy, b - a, j->n, j->ldx, j->ldy, j->eps, j->cvar_scale);
}

static void rms_norm_job(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const NormJob *j = ctx;
    (void)worker;
    for (Py_ssize_t r = a; r < b; r++) {
        const float *xr = (const float *)(j->x + r * j->ldx);
        float *yr = (float *)(j->y + r * j->ldy);
        double sum = 0.0;
        for (Py_ssize_t i = 0; i < j->n; i++) {
            const float sq = xr[i] * xr[i];
            sum += (double)sq;
        }
        const float mean = (float)(sum / (double)j->n);
        const float scale = 1.0f / sqrtf(mean + j->eps);
        for (Py_ssize_t i = 0; i < j->n; i++)
            yr[i] = xr[i] * scale;
    }
}


LANES_HIDDEN PyObject *lanes_norm_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, y;
    Py_ssize_t rows, n, ldx, ldy;
    float eps;
    int portable = 0, threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnf|pi", &x, &y, &rows, &n, &ldx, &ldy, &eps, &portable,
                          &threads))
        return NULL;
    const int ok = row_spans_ok(&x, &y, rows, n, ldx, ldy);
    if (ok) {
        const int hw = !portable && fma_hw();
        NormJob job = {x.buf, y.buf, n, ldx, ldy, eps, PICK(norm_cvar_scale, hw)};
        Py_BEGIN_ALLOW_THREADS
        rows_shared(norm_job, &job, rows, n, threads);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ggml_compute_forward_rms_norm_f32 on `rows` rows of n floats (row r at byte r * ldx of x, at
 * r * ldy of y; y may be x): each square rounded to float and added to a double sum, left to
 * right from 0.0; mean = (float)(sum / n); y = x * (1.0f / sqrtf(mean + eps)) */
LANES_HIDDEN PyObject *lanes_rms_norm_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, y;
    Py_ssize_t rows, n, ldx, ldy;
    float eps;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnf|i", &x, &y, &rows, &n, &ldx, &ldy, &eps, &threads))
        return NULL;
    const int ok = row_spans_ok(&x, &y, rows, n, ldx, ldy);
    if (ok) {
        NormJob job = {x.buf, y.buf, n, ldx, ldy, eps, NULL};
        Py_BEGIN_ALLOW_THREADS
        rows_shared(rms_norm_job, &job, rows, n, threads);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ==== fmaf over buffers ====================================================================== */

/* fmaf over buffers, step after step: out = c, then out[i] = fmaf(a[k][i], b[k][i], out[i]) for
 * each step k, correctly rounded (what the -mfma build's fused multiply-adds compute, as
 * ggml_vec_mad_f32 accumulates). A NaN operand's NaN comes out quiet, b's first, then a's, then
 * c's, whatever the instruction keeps: its numpy twin says the same. */
static inline float quiet(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u |= 0x00400000u;
    memcpy(&v, &u, 4);
    return v;
}

/* the NaN of lane i, where a or b has one: b's first, then a's, quiet */
static inline float operand_nan(float a, float b) { return isnan(b) ? quiet(b) : quiet(a); }

/* one step: out[i] = fmaf(a[i], b[i], out[i]), then each NaN made from a NaN of a or b made
 * that operand's (c's NaN, the only one, is the one every fused multiply-add gives) */
static void fmaf_step(const float *a, const float *b, float *out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = fmaf(a[i], b[i], out[i]);
    for (Py_ssize_t i = 0; i < n; i++)
        if (isnan(out[i]) && (isnan(a[i]) || isnan(b[i])))
            out[i] = operand_nan(a[i], b[i]);
}

#ifdef HAVE_FMA_TARGET
/* the same, 8 lanes an instruction, the NaN lanes looked at only in a vector that has one */
AVX2_FMA static void fmaf_step_fma(const float *a, const float *b, float *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
        const __m256 r = _mm256_fmadd_ps(va, vb, _mm256_loadu_ps(out + i));
        _mm256_storeu_ps(out + i, r);
        if (_mm256_movemask_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q)))
            for (Py_ssize_t l = i; l < i + 8; l++)
                if (isnan(out[l]) && (isnan(a[l]) || isnan(b[l])))
                    out[l] = operand_nan(a[l], b[l]);
    }
    for (; i < n; i++) {
        out[i] = fmaf(a[i], b[i], out[i]);
        if (isnan(out[i]) && (isnan(a[i]) || isnan(b[i])))
            out[i] = operand_nan(a[i], b[i]);
    }
}
#endif

LANES_HIDDEN PyObject *lanes_fmaf(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer a, b, c, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &a, &b, &c, &out))
        return NULL;
    const Py_ssize_t n = out.len / 4;
    int ok = out.len % 4 == 0 && lanes_check(&c, out.len, "c") == 0 && lanes_check(&b, a.len, "b") == 0;
    if (ok && (n ? a.len % out.len != 0 : a.len != 0)) {
        PyErr_SetString(PyExc_ValueError, "_lanes: a is not whole steps of out's size");
        ok = 0;
    }
    if (ok) {
        const Py_ssize_t steps = n ? a.len / out.len : 0;
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        memmove(out.buf, c.buf, (size_t)out.len);
        for (Py_ssize_t k = 0; k < steps; k++) {
            const float *ak = (const float *)a.buf + k * n, *bk = (const float *)b.buf + k * n;
            PICK(fmaf_step, hw)(ak, bk, out.buf, n);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&c);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

LANES_HIDDEN PyObject *lanes_v_expf(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, out;
    if (!PyArg_ParseTuple(args, "y*w*", &x, &out))
        return NULL;
    int ok = x.len % 4 == 0 && lanes_check(&out, x.len, "out") == 0;
    if (ok) {
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        PICK(v_expf, hw)(x.buf, out.buf, x.len / 4);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: x is not float32");
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* v_silu's elements [a, b), times g's when there is one (ggml_vec_swiglu_f32) */
typedef struct {
    const float *x, *g;
    float *out;
    int hw;
/* ==== SiLU and GELU over buffers ============================================================= */

} SiluJob;

static void silu_job(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const SiluJob *j = ctx;
    (void)worker;
    PICK(v_silu, j->hw)(j->x + a, j->out + a, b - a);
    if (j->g)
        for (Py_ssize_t i = a; i < b; i++)
            j->out[i] = j->out[i] * j->g[i];
}

LANES_HIDDEN PyObject *lanes_v_silu(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, out, g = {0};
    int threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*|O&i", &x, &out, lanes_optional_buffer, &g, &threads))
        return NULL;
    const Py_ssize_t n = x.len / 4;
    const int ok = x.len % 4 == 0 && lanes_check(&out, x.len, "out") == 0 &&
                   (!g.obj || lanes_check(&g, x.len, "g") == 0);
    if (ok) {
        SiluJob job = {x.buf, g.obj ? g.buf : NULL, out.buf, fma_hw()};
        Py_BEGIN_ALLOW_THREADS
        rows_shared(silu_job, &job, n, 1, threads);  /* (each element its own: any share) */
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: x is not float32");
    }
    lanes_release_optional(&g);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ggml's rope rotation (rope_yarn's result applied, ggml-cpu/ops.cpp) on `rows` rows of n floats:
 * each row copied to y, then for each pair k < h the elements i0 = k*step and i1 = i0 + off
 * become (fmaf(x0, c, -(x1*s)), fmaf(x0, s, x1*c)) with c = cs[k], s = sn[k] (the -mfma build
 * contracts each into one fused multiply-add after rounding the other product). Rows lie ldx
 * and ldy floats apart; y may be x (each pair is read before it is written). */
LANES_HIDDEN PyObject *lanes_rope_pairs(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, y, cs, sn;
    Py_ssize_t rows, n, ldx, ldy, h, step, off;
    if (!PyArg_ParseTuple(args, "y*w*y*y*nnnnnnn", &x, &y, &cs, &sn, &rows, &n, &ldx, &ldy, &h,
                          &step, &off))
        return NULL;
    const Py_ssize_t last = h > 0 ? (h - 1) * step + off : 0;  /* the highest element a pair reads */
    int ok = rows >= 0 && n >= 0 && h >= 0 && step >= 1 && off >= 1 && last < (h > 0 ? n : 1) &&
             ldx >= n && ldy >= n &&
             lanes_check(&x, rows > 0 ? ((rows - 1) * ldx + n) * 4 : 0, "x") == 0 &&
             lanes_check(&y, rows > 0 ? ((rows - 1) * ldy + n) * 4 : 0, "y") == 0 &&
             cs.len >= h * 4 && sn.len >= h * 4;
    if (ok) {
        const float *c = cs.buf, *sv = sn.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < rows; r++) {
            const float *xr = (const float *)x.buf + r * ldx;
            float *yr = (float *)y.buf + r * ldy;
            if (xr != yr)
                memmove(yr, xr, (size_t)n * 4);
            for (Py_ssize_t k = 0; k < h; k++) {
                const Py_ssize_t i0 = k * step, i1 = i0 + off;
                const float x0 = xr[i0], x1 = xr[i1];
                yr[i0] = fmaf(x0, c[k], -(x1 * sv[k]));
                yr[i1] = fmaf(x0, sv[k], x1 * c[k]);
            }
        }
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes or strides for rope_pairs");
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    PyBuffer_Release(&cs);
    PyBuffer_Release(&sn);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ggml_vec_gelu_f32 (the GGML_GELU_FP16 build) and ggml_vec_gelu_quick_f32: out[i] = the table
 * entry (ggml's fp16 table widened to float32, 65536 of them) of x[i]'s fp16 bits; with clamp
 * (GELU's) 0 where x <= -10 and x itself where x >= 10 */
INLINE float gelu_lookup_one(float v, const float *t, int clamp)
{
    return clamp && v <= -10.0f ? 0.0f : clamp && v >= 10.0f ? v : t[float_to_half(v)];
}

static void gelu_lookup(const float *x, const float *t, float *o, Py_ssize_t n, int clamp)
{
    for (Py_ssize_t i = 0; i < n; i++)
        o[i] = gelu_lookup_one(x[i], t, clamp);
}

#ifdef HAVE_FMA_TARGET
/* the same, 8 at a time: F16C's conversion (round to nearest even, as float_to_half) but for a
 * NaN, which float_to_half makes 0x7E00 with its sign; the entries gathered */
__attribute__((target("avx2,fma,f16c"))) static void gelu_lookup_fma(const float *x,
    const float *t, float *o, Py_ssize_t n, int clamp)
{
    const __m256i nan_h = _mm256_set1_epi32(0x7E00), sign_h = _mm256_set1_epi32(0x8000);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        __m256i h = _mm256_cvtepu16_epi32(
            _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        h = _mm256_blendv_epi8(h, _mm256_or_si256(_mm256_and_si256(h, sign_h), nan_h), nan);
        __m256 y = _mm256_i32gather_ps(t, h, 4);
        if (clamp) {
            const __m256 high = _mm256_cmp_ps(v, _mm256_set1_ps(10.0f), _CMP_GE_OQ);
            const __m256 low = _mm256_cmp_ps(v, _mm256_set1_ps(-10.0f), _CMP_LE_OQ);
            y = _mm256_blendv_ps(_mm256_blendv_ps(y, v, high), _mm256_setzero_ps(), low);
        }
        _mm256_storeu_ps(o + i, y);
    }
    gelu_lookup(x + i, t, o + i, n - i, clamp);
}
#endif

/* gelu_lookup's elements [a, b), times g's when there is one (ggml_vec_geglu_f32: +0 at or
 * below -10, not 0 * g) */
typedef struct {
    const float *x, *t, *g;
    float *out;
    int clamp, hw;
} GeluJob;

static void gelu_job(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const GeluJob *j = ctx;
    (void)worker;
    PICK(gelu_lookup, j->hw)(j->x + a, j->t, j->out + a, b - a, j->clamp);
    if (j->g)
        for (Py_ssize_t i = a; i < b; i++)
            j->out[i] = j->x[i] <= -10.0f ? 0.0f : j->out[i] * j->g[i];
}

LANES_HIDDEN PyObject *lanes_gelu_lookup(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, table, out, g = {0};
    int clamp = 1, threads = 1;
    if (!PyArg_ParseTuple(args, "y*y*w*|pO&i", &x, &table, &out, &clamp, lanes_optional_buffer, &g,
                          &threads))
        return NULL;
    const Py_ssize_t n = x.len / 4;
    const int ok = x.len % 4 == 0 && lanes_check(&table, 65536 * 4, "table") == 0 &&
                   lanes_check(&out, x.len, "out") == 0 && (!g.obj || lanes_check(&g, x.len, "g") == 0);
    if (ok) {
        GeluJob job = {x.buf, table.buf, g.obj ? g.buf : NULL, out.buf, clamp, fma_hw()};
        Py_BEGIN_ALLOW_THREADS
        rows_shared(gelu_job, &job, n, 1, threads);  /* (each element its own: any share) */
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: x is not whole float32s");
    }
    lanes_release_optional(&g);
    PyBuffer_Release(&x);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* ggml_vec_dot_f16 of a row of halves as they lie and a row of floats (float_dot's half rows),
 * for the loops of other files (flash attention's K·q) */
LANES_HIDDEN float lanes_dot_halves(const uint16_t *a, const float *b, Py_ssize_t k, int hw)
{
#ifdef HAVE_FMA_TARGET
    if (hw)
        return half_bits_row_fma(a, b, k);
#endif
    (void)hw;
    return half_bits_row(a, b, k);
}
