/* engine._lanes (_lanes_quant.c's quant_dot): ggml's AVX2 vec_dot of the types below, in
 * portable C and with AVX2 intrinsics (the same bits), for the rows _lanes_quant.c hands over.
 *
 *   TQ2_0  (Q8_K activations) the 2-bit quants t = value + 1 (0..2; 3 if a byte says so) as
 *          maddubs multiplies them, unsigned (element 128c + 32k + l at bits 2k of qs[32c + l]):
 *          16 int16 lanes, lane m summing t * y over bytes 2m and 2m+1 of every run of 32, less
 *          bsums[m] (the -1 of every value), wrapping as int16; lane l = m[2l] + m[2l+1] in
 *          int32; acc[l] = fmaf(lane, y.d * x.d, acc[l]) (the oracle fuses ggml's mul and add:
 *          vfmadd231ps), the result hsum_float_8(acc)
 *   TQ1_0  the same lanes of its trits t = value + 1: trit n of a byte q is ((uint8_t)(q * 3^n)
 *          * 3) >> 8 (ggml's AVX2 code takes the top two bits of 3q by two byte averages: the
 *          same trit for every byte), element 32n + m from qs[m], 160 + 16n + m from qs[32 + m],
 *          240 + 4n + m from qh[m]
 *   MXFP4  (Q8_0 activations) kvalues_mxfp4[nibble] (low: elements 0-15, high: 16-31) by
 *          ggml's mul_add_epi8, |q| * sign(y, q), so that y = -128 against q < 0 counts as +128
 *          (the int8 negation wraps), madd with ones: 8 lanes; the even blocks into one
 *          accumulator, the odd ones into a second, hsum_float_8(acc1 + acc2); a row's odd last
 *          block by ggml's scalar loop (the true products): fmaf(d, sum, result) (vfmadd231ss);
 *          d = y.d * 2^(e - 128) (ggml_e8m0_to_fp32_half, subnormal for e < 2)
 *
 * Activations: Q8_K blocks (float d, 256 int8, 16 int16 block sums), MXFP4's Q8_0 (fp16 d, 32
 * int8). */
#include "_lanes.h"

enum { BATCH = 8 };  /* activation rows the portable loop takes with each decoded weight block */

static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

LANES_HIDDEN Py_ssize_t lanes_tq_sizes(int type, Py_ssize_t *ysize)
{
    switch (type) {
    case TQ2_0: *ysize = 292; return 66;
    case TQ1_0: *ysize = 292; return 54;
    case MXFP4: *ysize = 34; return 17;
    default: return 0;
    }
}

/* ggml_e8m0_to_fp32_half: 2^(e - 128) */
INLINE float e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

INLINE int16_t trit(uint8_t q, int pow3) { return (int16_t)(((uint8_t)(q * pow3) * 3) >> 8); }

/* a weight block decoded: q the integers the lanes multiply (TQ2_0, TQ1_0: the unsigned quants;
 * MXFP4: the values), d */
INLINE void decode_tq(int type, const uint8_t *blk, int16_t *q, float *d)
{
    static const int pow3[5] = {1, 3, 9, 27, 81};
    switch (type) {
    case MXFP4:
        for (int e = 0; e < 16; e++) {
            q[e] = kvalues_mxfp4[blk[1 + e] & 0x0F];
            q[e + 16] = kvalues_mxfp4[blk[1 + e] >> 4];
        }
        *d = e8m0_half(blk[0]);
        break;
    case TQ1_0:
        for (int n = 0; n < 5; n++) {
            for (int m = 0; m < 32; m++)
                q[32 * n + m] = trit(blk[m], pow3[n]);
            for (int m = 0; m < 16; m++)
                q[160 + 16 * n + m] = trit(blk[32 + m], pow3[n]);
        }
        for (int n = 0; n < 4; n++)
            for (int m = 0; m < 4; m++)
                q[240 + 4 * n + m] = trit(blk[48 + m], pow3[n]);
        *d = half_to_float(u16(blk + 52));
        break;
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

/* TQ2_0's and TQ1_0's 8 lanes: int16 lane m sums t * y over bytes 2m, 2m+1 of every run of 32 (it cannot
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

/* lane l of n values v (runs of 32) and activation bytes y: elements 4l..4l+3 of every run, each
 * product as _mm256_sign_epi8 and maddubs make it (y = -128 against v < 0 counts as +128) */
INLINE void signed_lanes(const int16_t *v, const int8_t *y, int n, int32_t *lane)
{
    memset(lane, 0, 8 * sizeof *lane);
    for (int e = 0; e < n; e++)
        lane[(e % 32) / 4] += v[e] * (y[e] == -128 && v[e] < 0 ? 128 : y[e]);
}

/* The portable loop: each weight block decoded once for BATCH activation rows at a time. */
INLINE void tq_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,
                    float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb)
{
    Py_ssize_t ysize;
    const Py_ssize_t wsize = lanes_tq_sizes(type, &ysize);
    const int paired = type == MXFP4;  /* the odd blocks into a[8..15]; an odd last one apart */
    int16_t q[256];
    int32_t lane[8];
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        const uint8_t *wr = w + i0 * ldw;
        for (Py_ssize_t i1a = 0; i1a < n1; i1a += BATCH) {
            const int nr = (int)(n1 - i1a < BATCH ? n1 - i1a : BATCH);
            float acc[BATCH][18];  /* a row pair's accumulators, [16] [17] MXFP4's last block */
            memset(acc, 0, sizeof acc);
            for (Py_ssize_t b = 0; b < nb; b++) {
                float xd;
                decode_tq(type, wr + b * wsize, q, &xd);
                for (int r = 0; r < nr; r++) {
                    const uint8_t *yb = x + (i1a + r) * ldx + b * ysize;
                    float yd, *a = acc[r];
                    if (ysize == 292)
                        memcpy(&yd, yb, 4);
                    else
                        yd = half_to_float(u16(yb));
                    const int8_t *yq = (const int8_t *)(yb + (ysize == 292 ? 4 : 2));
                    const float d = yd * xd;
                    if (type == MXFP4) {
                        if (b == nb - 1 && nb % 2) {  /* ggml's scalar loop: the true products */
                            int32_t s = 0;
                            for (int e = 0; e < 32; e++)
                                s += q[e] * yq[e];
                            a[16] = d;
                            a[17] = (float)s;
                            continue;
                        }
                        signed_lanes(q, yq, 32, lane);
                        a += 8 * (b % 2);
                    } else {
                        ternary_lanes(q, yq, yb + 260, lane);
                    }
                    for (int l = 0; l < 8; l++)
                        a[l] = fmaf((float)lane[l], d, a[l]);
                }
            }
            for (int r = 0; r < nr; r++) {
                float *a = acc[r];
                if (paired)
                    for (int l = 0; l < 8; l++)
                        a[l] += a[8 + l];
                float res = hsum8(a);
                if (paired && nb % 2)
                    res = fmaf(a[16], a[17], res);
                out[(i1a + r) * ldo + i0] = res;
            }
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

/* ggml_vec_dot_tq1_0_q8_K's trits of 32 bytes q: with x = q - 1 (0 for q = 0), the top two
 * bits of avg(x, avg(x, 0)), about 3x/4 (equal to (q * 3) >> 8 for every byte) */
AVX2 __m256i tq1_trits(__m256i q)
{
    const __m256i x = _mm256_subs_epu8(q, _mm256_set1_epi8(1));
    const __m256i h = _mm256_avg_epu8(x, _mm256_avg_epu8(x, _mm256_setzero_si256()));
    return _mm256_and_si256(_mm256_srli_epi16(h, 6), _mm256_set1_epi8(3));
}

AVX2 __m256i times3(__m256i q) { return _mm256_add_epi8(q, _mm256_add_epi8(q, q)); }

/* ggml_vec_dot_tq1_0_q8_K's lanes: the 5 trits of qs[0..31] (elements 32n + m), then 32-byte
 * vectors of qs[32..47]'s trits 0|1, 2|3, 4 | qh's (byte 4n + m: qh[m] * 3^n), by maddubs,
 * summed in int16, less the block sums, pairs by madd */
AVX2 __m256i tq1_lanes(const uint8_t *blk, const int8_t *yq, const uint8_t *bsums)
{
    __m256i s = _mm256_setzero_si256(), v = _mm256_loadu_si256((const __m256i *)blk);
    for (int n = 0; n < 5; n++, v = times3(v))
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(tq1_trits(v), _mm256_loadu_si256((const __m256i *)(yq + 32 * n))));
    uint8_t h[16];
    for (int n = 0; n < 4; n++)
        for (int m = 0; m < 4; m++)
            h[4 * n + m] = (uint8_t)(blk[48 + m] * (n == 0 ? 1 : n == 1 ? 3 : n == 2 ? 9 : 27));
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 32)));
    const __m256i t3 = times3(t), t9 = times3(t3), t27 = times3(t9);
    const __m256i v01 = _mm256_blend_epi32(t, t3, 0xF0), v23 = _mm256_blend_epi32(t9, t27, 0xF0);
    const __m256i v45 = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)h), _mm256_castsi256_si128(times3(t27)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(tq1_trits(v01), _mm256_loadu_si256((const __m256i *)(yq + 160))));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(tq1_trits(v23), _mm256_loadu_si256((const __m256i *)(yq + 192))));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(tq1_trits(v45), _mm256_loadu_si256((const __m256i *)(yq + 224))));
    s = _mm256_sub_epi16(s, _mm256_loadu_si256((const __m256i *)bsums));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

/* ggml_vec_dot_mxfp4_q8_0's pair sums: the 32 values of 16 bytes of nibbles by a byte shuffle of
 * kvalues_mxfp4, times 32 activation bytes by mul_add_epi8's sign trick */
AVX2 __m256i fp4_pairs(const uint8_t *qs, const uint8_t *yq)
{
    const __m128i values = _mm_loadu_si128((const __m128i *)kvalues_mxfp4), m4b = _mm_set1_epi8(0x0F);
    const __m128i bits = _mm_loadu_si128((const __m128i *)qs);
    const __m256i q = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4b)),
                                       _mm_shuffle_epi8(values, _mm_and_si128(bits, m4b)));
    const __m256i y = _mm256_loadu_si256((const __m256i *)yq);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
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
            __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();  /* MXFP4's odd blocks */
            float tail = 0.0f, tail_d = 0.0f;  /* MXFP4's odd last block */
            for (Py_ssize_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * wsize, *yb = yr + b * ysize;
                if (type == MXFP4) {
                    const float d = half_to_float(u16(yb)) * e8m0_half(blk[0]);
                    if (b == nb - 1 && nb % 2) {  /* ggml's scalar loop: the true products */
                        int32_t s = 0;
                        for (int e = 0; e < 16; e++)
                            s += ((const int8_t *)yb)[2 + e] * kvalues_mxfp4[blk[1 + e] & 0x0F] +
                                 ((const int8_t *)yb)[18 + e] * kvalues_mxfp4[blk[1 + e] >> 4];
                        tail = (float)s, tail_d = d;
                        continue;
                    }
                    const __m256 lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(fp4_pairs(blk + 1, yb + 2),
                                                                              _mm256_set1_epi16(1)));
                    if (b % 2)
                        acc2 = _mm256_fmadd_ps(lanes, _mm256_set1_ps(d), acc2);
                    else
                        acc = _mm256_fmadd_ps(lanes, _mm256_set1_ps(d), acc);
                    continue;
                }
                float yd;
                memcpy(&yd, yb, 4);
                const __m256i lanes = type == TQ2_0 ? tq2_lanes(blk, (const int8_t *)(yb + 4), yb + 260)
                                                    : tq1_lanes(blk, (const int8_t *)(yb + 4), yb + 260);
                const float d = yd * half_to_float(u16(blk + (type == TQ2_0 ? 64 : 52)));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d), acc);
            }
            float a[8];
            _mm256_storeu_ps(a, type == MXFP4 ? _mm256_add_ps(acc, acc2) : acc);
            float r = hsum8(a);
            if (type == MXFP4 && nb % 2)
                r = fmaf(tail_d, tail, r);
            out[i1 * ldo + i0] = r;
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void tq_fma(int type, const uint8_t *w,
    Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
    Py_ssize_t n1, Py_ssize_t nb)
{
    switch (type) {
    case MXFP4: tq_avx2_body(MXFP4, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case TQ1_0: tq_avx2_body(TQ1_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
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
    case MXFP4: tq_body(MXFP4, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case TQ1_0: tq_body(TQ1_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    default: tq_body(TQ2_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    }
    return 1;
}
