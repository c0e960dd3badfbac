/* engine._lanes (_lanes_quant.c's quant_dot): ggml's AVX2 vec_dot of the types below, in
 * portable C and with AVX2 intrinsics (the same bits), for the rows _lanes_quant.c hands over.
 *
 *   TQ2_0  (Q8_K activations) the 2-bit quants t = value + 1 (0..2; 3 if a byte says so) as
 *          maddubs multiplies them, unsigned (element 128c + 32k + l at bits 2k of qs[32c + l]):
 *          16 int16 lanes, lane m summing t * y over bytes 2m and 2m+1 of every run of 32, less
 *          bsums[m] (the -1 of every value), wrapping as int16; lane l = m[2l] + m[2l+1] in
 *          int32; acc[l] = fmaf(lane, y.d * x.d, acc[l]) (the oracle fuses ggml's mul and add:
 *          vfmadd231ps), the result hsum_float_8(acc)
 *
 * Activations: Q8_K blocks (float d, 256 int8, 16 int16 block sums). */
#include "_lanes.h"

enum { BATCH = 8 };  /* activation rows the portable loop takes with each decoded weight block */

LANES_HIDDEN Py_ssize_t lanes_tq_sizes(int type, Py_ssize_t *ysize)
{
    switch (type) {
    case TQ2_0: *ysize = 292; return 66;
    default: return 0;
    }
}

/* a weight block decoded: q the integers the lanes multiply (TQ2_0: the unsigned quants), d */
INLINE void decode_tq(int type, const uint8_t *blk, int16_t *q, float *d)
{
    switch (type) {
    default: { /* TQ2_0 */
        for (int c = 0; c < 2; c++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++)
                    q[128 * c + 32 * k + l] = (int16_t)((blk[32 * c + l] >> (2 * k)) & 3);
        *d = half_to_float(u16(blk + 64));
        break;
    }
    }
}

/* TQ2_0's 8 lanes: int16 lane m sums t * y over bytes 2m, 2m+1 of every run of 32 (it cannot
 * overflow: 16 products of at most 3 * 128), less bsums[m], wrapping; then pairs in int32 */
INLINE void ternary_lanes(const int16_t *t, const int8_t *y, const uint8_t *bsums, int32_t *lane)
{
    int32_t s[16] = {0};
    for (int r = 0; r < 8; r++)
        for (int m = 0; m < 16; m++)
            s[m] += t[32 * r + 2 * m] * y[32 * r + 2 * m] + t[32 * r + 2 * m + 1] * y[32 * r + 2 * m + 1];
    int16_t h[16];
    for (int m = 0; m < 16; m++)
        h[m] = (int16_t)(uint16_t)(s[m] - (int16_t)u16(bsums + 2 * m));
    for (int l = 0; l < 8; l++)
        lane[l] = h[2 * l] + h[2 * l + 1];
}

/* The portable loop: each weight block decoded once for BATCH activation rows at a time. */
INLINE void tq_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,
                    float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb)
{
    Py_ssize_t ysize;
    const Py_ssize_t wsize = lanes_tq_sizes(type, &ysize);
    int16_t q[256];
    int32_t lane[8];
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        const uint8_t *wr = w + i0 * ldw;
        for (Py_ssize_t i1a = 0; i1a < n1; i1a += BATCH) {
            const int nr = (int)(n1 - i1a < BATCH ? n1 - i1a : BATCH);
            float acc[BATCH][8];
            memset(acc, 0, sizeof acc);
            for (Py_ssize_t b = 0; b < nb; b++) {
                float xd;
                decode_tq(type, wr + b * wsize, q, &xd);
                for (int r = 0; r < nr; r++) {
                    const uint8_t *yb = x + (i1a + r) * ldx + b * ysize;
                    float yd;
                    memcpy(&yd, yb, 4);
                    ternary_lanes(q, (const int8_t *)(yb + 4), yb + 260, lane);
                    const float d = yd * xd;
                    for (int l = 0; l < 8; l++)
                        acc[r][l] = fmaf((float)lane[l], d, acc[r][l]);
                }
            }
            for (int r = 0; r < nr; r++)
                out[(i1a + r) * ldo + i0] = hsum8(acc[r]);
        }
    }
}

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#define AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* ggml_vec_dot_tq2_0_q8_K's lanes: each 2-bit field by maddubs, summed in int16, less the
 * block sums, pairs by madd */
AVX2 __m256i tq2_lanes(const uint8_t *qs, const int8_t *yq, const uint8_t *bsums)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i s = _mm256_setzero_si256();
    for (int c = 0; c < 2; c++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        for (int k = 0; k < 4; k++)
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3),
                                                         _mm256_loadu_si256((const __m256i *)(yq + 128 * c + 32 * k))));
    }
    s = _mm256_sub_epi16(s, _mm256_loadu_si256((const __m256i *)bsums));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

AVX2 void tq_avx2_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,
                       float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb)
{
    Py_ssize_t ysize;
    const Py_ssize_t wsize = lanes_tq_sizes(type, &ysize);
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        const uint8_t *wr = w + i0 * ldw;
        for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
            const uint8_t *yr = x + i1 * ldx;
            __m256 acc = _mm256_setzero_ps();
            for (Py_ssize_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * wsize, *yb = yr + b * ysize;
                float yd;
                memcpy(&yd, yb, 4);
                const __m256i lanes = tq2_lanes(blk, (const int8_t *)(yb + 4), yb + 260);
                const float d = yd * half_to_float(u16(blk + 64));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d), acc);
            }
            float a[8];
            _mm256_storeu_ps(a, acc);
            out[i1 * ldo + i0] = hsum8(a);
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void tq_fma(int type, const uint8_t *w,
    Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
    Py_ssize_t n1, Py_ssize_t nb)
{
    switch (type) {
    default: tq_avx2_body(TQ2_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    }
}
#endif

LANES_HIDDEN int lanes_tq_dot(int type, int hw, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                              Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
                              Py_ssize_t n1, Py_ssize_t nb)
{
    Py_ssize_t ysize;
    if (lanes_tq_sizes(type, &ysize) == 0)
        return 0;
#ifdef HAVE_FMA_TARGET
    if (hw) {
        tq_fma(type, w, ldw, x, ldx, out, ldo, n0, n1, nb);
        return 1;
    }
#endif
    switch (type) {  /* one copy of the loop per type, its constants folded in */
    default: tq_body(TQ2_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    }
    return 1;
}
