/* engine._lanes (c/lanes.c): flash attention's loops (ggml_compute_forward_flash_attn_ext_f16).
 *
 * fa_online: the one_chunk path's online softmax over a row's keys, in ggml's order: a new maximum
 *   M rescales the accumulator by ms = expf(Mold - M) (ggml_vec_scale_f16/_f32), an older one
 *   weighs the key by vs = expf(s - M); the key's V row is added times vs, one fused multiply-add
 *   per element (ggml_vec_mad_f16/_f32; for an F16 V the accumulator is halves, each result
 *   rounded to a half); the sum S = fmaf(S, ms, vs) (the compiler contracts `S*ms + vs`).
 * fa_rows: the whole one_chunk path of F16 K and V for many query rows, each at its own byte
 *   offsets: K·q by ggml_vec_dot_f16 (float.c's loop), scale, soft cap, mask, fa_online's
 *   softmax, the sink and the division by the sum (decoding's FLASH_ATTN_EXT in one call).
 * fa_gemm: the tiled path's simd_gemm, C += A·B, each output a chain of fused multiply-adds in
 *   the order of the shared dimension.
 * All built for the FMA and F16C instructions, picked where the CPU has them (the same bits). A
 * NaN that an operand brings comes out as the engine's fmaf makes it (b's, then a's, quiet; a
 * half's NaN is 0x7E00 with its sign), whatever the instruction keeps. */
#include "lanes.h"

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#endif

static inline float quiet_nan(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u |= 0x00400000u;
    memcpy(&v, &u, 4);
    return v;
}

/* fmaf(a, b, c), a NaN made from a's or b's NaN that operand's (b's first), quiet */
static inline float fma_nan(float a, float b, float c)
{
    const float r = fmaf(a, b, c);
    if (isnan(r) && (isnan(a) || isnan(b)))
        return quiet_nan(isnan(b) ? b : a);
    return r;
}

/* y = half(half(y) * v) (ggml_vec_scale_f16), or y *= v for floats */
static void scale_halves(uint16_t *y, float v, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        y[d] = float_to_half(half_to_float(y[d]) * v);
}

/* y = half(fmaf(x, v, half(y))) (ggml_vec_mad_f16) */
static void mad_halves(uint16_t *y, const uint16_t *x, float v, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        y[d] = float_to_half(fma_nan(half_to_float(x[d]), v, half_to_float(y[d])));
}

static void scale_floats(float *y, float v, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        y[d] *= v;
}

static void mad_floats(float *y, const float *x, float v, Py_ssize_t n)
{
    for (Py_ssize_t d = 0; d < n; d++)
        y[d] = fma_nan(x[d], v, y[d]);
}

/* C[m x n] += A[m x k]·B[k x n]: c[i][j] = fmaf(a[i][kk], b[kk][j], c[i][j]) for kk in order */
static void gemm(float *c, const float *a, const float *b, Py_ssize_t m, Py_ssize_t k, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < m; i++)
        for (Py_ssize_t kk = 0; kk < k; kk++)
            mad_floats(c + i * n, b + kk * n, a[i * k + kk], n);
}

#ifdef HAVE_FMA_TARGET
#define F16C_FMA __attribute__((target("avx2,fma,f16c")))

F16C_FMA static inline int any_nan(__m256 r)
{
    return _mm256_movemask_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q));
}

F16C_FMA static void scale_halves_fma(uint16_t *y, float v, Py_ssize_t n)
{
    const __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t d = 0;
    for (; d + 8 <= n; d += 8) {
        const __m256 r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + d))), vv);
        if (any_nan(r)) {
            scale_halves(y + d, v, 8);
            continue;
        }
        _mm_storeu_si128((__m128i *)(y + d), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    scale_halves(y + d, v, n - d);
}

F16C_FMA static void mad_halves_fma(uint16_t *y, const uint16_t *x, float v, Py_ssize_t n)
{
    const __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t d = 0;
    for (; d + 8 <= n; d += 8) {
        const __m256 r = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + d))), vv,
                                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + d))));
        if (any_nan(r)) {
            mad_halves(y + d, x + d, v, 8);
            continue;
        }
        _mm_storeu_si128((__m128i *)(y + d), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    mad_halves(y + d, x + d, v, n - d);
}

F16C_FMA static void scale_floats_fma(float *y, float v, Py_ssize_t n)
{
    const __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(y + d, _mm256_mul_ps(_mm256_loadu_ps(y + d), vv));
    scale_floats(y + d, v, n - d);
}

F16C_FMA static void mad_floats_fma(float *y, const float *x, float v, Py_ssize_t n)
{
    const __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t d = 0;
    for (; d + 8 <= n; d += 8) {
        const __m256 r = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), vv, _mm256_loadu_ps(y + d));
        if (any_nan(r)) {
            mad_floats(y + d, x + d, v, 8);
            continue;
        }
        _mm256_storeu_ps(y + d, r);
    }
    mad_floats(y + d, x + d, v, n - d);
}

F16C_FMA static void gemm_fma(float *c, const float *a, const float *b, Py_ssize_t m, Py_ssize_t k,
                              Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < m; i++)
        for (Py_ssize_t kk = 0; kk < k; kk++)
            mad_floats_fma(c + i * n, b + kk * n, a[i * k + kk], n);
}
#endif

typedef struct {
    void (*scale_h)(uint16_t *, float, Py_ssize_t);
    void (*mad_h)(uint16_t *, const uint16_t *, float, Py_ssize_t);
    void (*scale_f)(float *, float, Py_ssize_t);
    void (*mad_f)(float *, const float *, float, Py_ssize_t);
} VecOps;

static VecOps vec_ops(int hw)
{
#ifdef HAVE_FMA_TARGET
    if (hw)
        return (VecOps){scale_halves_fma, mad_halves_fma, scale_floats_fma, mad_floats_fma};
#endif
    (void)hw;
    return (VecOps){scale_halves, mad_halves, scale_floats, mad_floats};
}

/* one row's keys: M, S and the accumulator (halves in h when fp16, else floats in acc); V's rows
 * ldv bytes apart */
static void online_row(const VecOps *ops, const float *s, const uint8_t *skip, const void *v, Py_ssize_t ldv,
                       int fp16, float *acc, uint16_t *h, Py_ssize_t n, Py_ssize_t dv, float *Mr, float *Sr)
{
    float M = -INFINITY, S = 0.0f;
    if (fp16)
        memset(h, 0, (size_t)dv * 2);
    else
        memset(acc, 0, (size_t)dv * 4);
    for (Py_ssize_t ic = 0; ic < n; ic++) {
        if (skip[ic])
            continue;
        const float sv = s[ic], Mold = M;
        float ms = 1.0f, vs = 1.0f;
        if (sv > M) {
            M = sv;
            ms = expf(Mold - M);
            if (fp16)
                ops->scale_h(h, ms, dv);
            else
                ops->scale_f(acc, ms, dv);
        } else {
            vs = expf(sv - M);
        }
        const char *vrow = (const char *)v + ic * ldv;
        if (fp16)
            ops->mad_h(h, (const uint16_t *)vrow, vs, dv);
        else
            ops->mad_f(acc, (const float *)vrow, vs, dv);
        S = fma_nan(S, ms, vs);
    }
    if (fp16)
        for (Py_ssize_t d = 0; d < dv; d++)
            acc[d] = half_to_float(h[d]);
    *Mr = M;
    *Sr = S;
}

LANES_HIDDEN PyObject *lanes_fa_online(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer s, skip, v, acc, M, S;
    int fp16;
    Py_ssize_t rows, n, dv;
    if (!PyArg_ParseTuple(args, "y*y*y*pw*w*w*nnn", &s, &skip, &v, &fp16, &acc, &M, &S, &rows, &n, &dv))
        return NULL;
    int ok = rows >= 0 && n >= 0 && dv >= 0 && lanes_check(&s, rows * n * 4, "s") == 0 &&
             lanes_check(&skip, rows * n, "skip") == 0 &&
             lanes_check(&v, n * dv * (fp16 ? 2 : 4), "v") == 0 &&
             lanes_check(&acc, rows * dv * 4, "acc") == 0 && lanes_check(&M, rows * 4, "M") == 0 &&
             lanes_check(&S, rows * 4, "S") == 0;
    uint16_t *h = NULL;
    if (ok && fp16 && dv > 0 && !(h = PyMem_RawMalloc((size_t)dv * 2))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const VecOps ops = vec_ops(fma_hw());
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < rows; r++)
            online_row(&ops, (const float *)s.buf + r * n, (const uint8_t *)skip.buf + r * n, v.buf,
                       dv * (fp16 ? 2 : 4), fp16,
                       (float *)acc.buf + r * dv, h, n, dv, (float *)M.buf + r, (float *)S.buf + r);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(h);
    PyBuffer_Release(&s);
    PyBuffer_Release(&skip);
    PyBuffer_Release(&v);
    PyBuffer_Release(&acc);
    PyBuffer_Release(&M);
    PyBuffer_Release(&S);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

LANES_HIDDEN PyObject *lanes_fa_gemm(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer c, a, b;
    Py_ssize_t m, k, n;
    if (!PyArg_ParseTuple(args, "w*y*y*nnn", &c, &a, &b, &m, &k, &n))
        return NULL;
    int ok = m >= 0 && k >= 0 && n >= 0 && lanes_check(&c, m * n * 4, "c") == 0 &&
             lanes_check(&a, m * k * 4, "a") == 0 && lanes_check(&b, k * n * 4, "b") == 0;
    if (ok) {
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        PICK(gemm, hw)(c.buf, a.buf, b.buf, m, k, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&c);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* fa_rows: the one_chunk path of F16 K and V for many query rows at once, each its own: row r
 * reads its q (dk floats), its K and V heads' n keys (nbk1, nbv1 bytes apart) and its mask row
 * (n halves or floats, or none) at the byte offsets offs[r] = (q, k, v, mask, out). The scores
 * are as the kernel makes them: q rounded to halves, K·q by ggml_vec_dot_f16, times scale, then
 * softcap·tanhf(s) when softcap != 0, plus slope·mask; a key whose slope·mask is -inf is skipped.
 * Then online_row, and the row's sink (if sinks): a larger sink rescales the accumulator and S by
 * expf(M - sink), a smaller one adds expf(sink - M) to S, S = S·ms + vs rounded twice. M and S go
 * to M[r] and S[r]; out gets the accumulator divided by S (0 where S is 0) when finish, else as
 * it is. */
typedef struct {
    const char *q, *k, *v, *m;
    char *out;
    const int64_t *offs;
    const float *slopes, *sinks;
    float *M, *S;
    Py_ssize_t n, dk, dv, nbk1, nbv1;
    float scale, softcap;
    int mask_f16, finish, hw;
} RowsJob;

static void fa_row(const RowsJob *j, const VecOps *ops, Py_ssize_t r, float *qh, float *s, uint8_t *skip,
                   uint16_t *h)
{
    const int64_t *o = j->offs + 5 * r;
    const float *q = (const float *)(j->q + o[0]);
    for (Py_ssize_t d = 0; d < j->dk; d++)
        qh[d] = half_to_float(float_to_half(q[d]));
    const float slope = j->slopes[r];
    for (Py_ssize_t ic = 0; ic < j->n; ic++) {
        float mv = 0.0f;
        if (j->m)
            mv = slope * (j->mask_f16 ? half_to_float(((const uint16_t *)(j->m + o[3]))[ic])
                                      : ((const float *)(j->m + o[3]))[ic]);
        skip[ic] = mv == -INFINITY;
        if (skip[ic])
            continue;
        float sv = lanes_dot_halves((const uint16_t *)(j->k + o[1] + ic * j->nbk1), qh, j->dk, j->hw) *
                   j->scale;
        if (j->softcap != 0.0f)
            sv = j->softcap * tanhf(sv);
        s[ic] = sv + mv;
    }
    float *acc = (float *)(j->out + o[4]);
    float M, S;
    online_row(ops, s, skip, j->v + o[2], j->nbv1, 1, acc, h, j->n, j->dv, &M, &S);
    if (j->sinks) {
        const float sink = j->sinks[r];
        float ms = 1.0f, vs = 1.0f;
        if (sink > M) {
            ms = expf(M - sink);
            for (Py_ssize_t d = 0; d < j->dv; d++)
                acc[d] = acc[d] * ms;
            M = sink;
        } else {
            vs = expf(sink - M);
        }
        const float t = S * ms;
        S = t + vs;
    }
    if (j->finish) {
        const float inv = S == 0.0f ? 0.0f : 1.0f / S;
        for (Py_ssize_t d = 0; d < j->dv; d++)
            acc[d] = acc[d] * inv;
    }
    j->M[r] = M;
    j->S[r] = S;
}

/* does every row's data lie inside its buffers? (the offsets come from the engine's views, but
 * a byte read past a pool would be a crash, not an error) */
static int rows_inside(const RowsJob *j, Py_ssize_t rows, Py_ssize_t qlen, Py_ssize_t klen, Py_ssize_t vlen,
                       Py_ssize_t mlen, Py_ssize_t outlen)
{
    const Py_ssize_t n = j->n, mrow = n * (j->mask_f16 ? 2 : 4);
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *o = j->offs + 5 * r;
        if (o[0] < 0 || o[0] + j->dk * 4 > qlen || o[4] < 0 || o[4] + j->dv * 4 > outlen)
            return 0;
        if (n > 0 && (o[1] < 0 || o[1] + (n - 1) * j->nbk1 + j->dk * 2 > klen || o[2] < 0 ||
                      o[2] + (n - 1) * j->nbv1 + j->dv * 2 > vlen))
            return 0;
        if (j->m && (o[3] < 0 || o[3] + mrow > mlen))
            return 0;
    }
    return 1;
}

LANES_HIDDEN PyObject *lanes_fa_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer q, k, v, m, out, offs, slopes, sinks, M, S;
    Py_ssize_t rows, n, dk, dv, nbk1, nbv1;
    float scale, softcap;
    int mask_f16, finish;
    if (!PyArg_ParseTuple(args, "y*y*y*O&w*y*y*O&w*w*nnnnnnffpp", &q, &k, &v, lanes_optional_buffer, &m, &out,
                          &offs, &slopes, lanes_optional_buffer, &sinks, &M, &S, &rows, &n, &dk, &dv, &nbk1,
                          &nbv1, &scale, &softcap, &mask_f16, &finish))
        return NULL;
    RowsJob job = {q.buf, k.buf, v.buf, m.obj ? m.buf : NULL, out.buf, offs.buf, slopes.buf,
                   sinks.obj ? sinks.buf : NULL, M.buf, S.buf, n, dk, dv, nbk1, nbv1, scale, softcap,
                   mask_f16, finish, fma_hw()};
    int ok = rows >= 0 && n >= 0 && dk >= 0 && dv >= 0 && nbk1 >= 0 && nbv1 >= 0 &&
             lanes_check(&offs, rows * 5 * 8, "offs") == 0 && lanes_check(&slopes, rows * 4, "slopes") == 0 &&
             (!sinks.obj || lanes_check(&sinks, rows * 4, "sinks") == 0) &&
             lanes_check(&M, rows * 4, "M") == 0 && lanes_check(&S, rows * 4, "S") == 0;
    if (ok && !rows_inside(&job, rows, q.len, k.len, v.len, m.obj ? m.len : 0, out.len)) {
        PyErr_SetString(PyExc_ValueError, "_lanes: a row of fa_rows lies outside its buffer");
        ok = 0;
    }
    /* each row's halves of q, scores, skips and the halves' accumulator */
    char *scratch = NULL;
    if (ok && !(scratch = PyMem_RawMalloc((size_t)(dk * 4 + n * 5 + dv * 2 + 16)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const VecOps ops = vec_ops(job.hw);
        float *qh = (float *)scratch, *sc = qh + dk;
        uint16_t *h = (uint16_t *)(sc + n);
        uint8_t *skip = (uint8_t *)(h + dv);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < rows; r++)
            fa_row(&job, &ops, r, qh, sc, skip, h);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(scratch);
    lanes_release_optional(&m);
    lanes_release_optional(&sinks);
    PyBuffer_Release(&q);
    PyBuffer_Release(&k);
    PyBuffer_Release(&v);
    PyBuffer_Release(&out);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&slopes);
    PyBuffer_Release(&M);
    PyBuffer_Release(&S);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}
