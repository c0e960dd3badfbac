/* engine._lanes: ggml's hottest inner loops, which numpy can only run a block at a time.
 *
 * The float and quantized dot products of mul_mat (ggml_vec_dot_f32, _f16, llamafile's tinyBLAS,
 * and the AVX2 vec_dot of Q4_0/Q5_0/Q8_0 by Q8_0 and Q4_K/Q6_K by Q8_K: integer lane sums, one
 * fused multiply-add per block and lane, acc[l] = fmaf((float)lane[l], d, acc[l])), ggml_v_expf
 * and ggml_v_silu, the soft_max rows, quantize_row_q8_0, a few to_float converters, and fmaf over
 * whole buffers (the fused multiply-adds of ggml's -mfma build, element by element). Each
 * function here has a numpy twin beside the kernel that calls it (engine/lanes.py registers
 * them; tests/unit/engine/test_twins.py holds them equal bit for bit), which says the same
 * thing for reading and runs in pure-numpy mode. fmaf is correctly rounded by definition, so the
 * results are the same on every CPU; the hardware instruction is used where the CPU has it. The
 * loops run without the GIL, so the compute threads run them at once on their own rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* ggml's quantized dot products (AVX2 builds) of raw weight blocks with raw activation blocks.
 * Each block's integers are decoded once per weight row and multiplied with each activation row
 * (n1 of them): lane l of a block sums the products of bytes 4l..4l+3 of every run of 32 elements
 * (exact 32-bit integers, so their order is free), then acc[l] = fmaf((float)lane, x.d * y.d,
 * acc[l]) block after block, and the row's result is hsum_float_8(acc):
 *   Q4_0  nibbles (low: elements 0-15, high: 16-31) minus 8
 *   Q5_0  nibbles plus 16 * their qh bit, minus 16
 *   Q8_0  the int8 quants
 *   Q4_K  8 runs of 32 (run 2j in the low nibbles of qs[32j..], 2j+1 in the high ones), each
 *         times its six-bit scale; the mins apart: 4 lanes, lane l = m[2l] * (bsums 4l, 4l+1) +
 *         m[2l+1] * (bsums 4l+2, 4l+3), acc_m[l] = fmaf(lane, -y.d * x.dmin, acc_m[l]), added
 *         to the result as (m0 + m2) + (m1 + m3)
 *   Q6_K  the unsigned 6-bit values times the int8 scale of their 16, minus 32 * (bsums[2l] *
 *         sc[2l] + bsums[2l+1] * sc[2l+1]) in lane l
 * Activations are Q8_0 blocks (fp16 d, 32 int8) for the first three, Q8_K (f32 d, 256 int8,
 * 16 int16 block sums) for the K-quants. */
enum { Q4_0 = 2, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };
#define INLINE static inline __attribute__((always_inline))

static float half_to_float(uint16_t h);

INLINE uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

INLINE float hsum8(const float *a)
{
    float r[4];
    for (int l = 0; l < 4; l++)
        r[l] = a[l + 4] + a[l];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

/* the 8 lane sums of `runs` runs of 32 weight integers q and activation bytes y */
INLINE void lane_sums(const int16_t *q, const int8_t *y, int runs, int32_t *lane)
{
    int32_t s[32] = {0};
    for (int r = 0; r < runs; r++)
        for (int e = 0; e < 32; e++)
            s[e] += (int32_t)q[32 * r + e] * (int32_t)y[32 * r + e];
    for (int l = 0; l < 8; l++)
        lane[l] = (s[4 * l] + s[4 * l + 1]) + (s[4 * l + 2] + s[4 * l + 3]);
}

/* get_scale_min_k4: the six-bit scale and min of sub-block j from a K-quant's 12 scale bytes */
INLINE void scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    *sc = j < 4 ? (s[j] & 63) : ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
}

/* block b of a weight row decoded: its integers q (scales folded in), d, and for Q4_K dmin and
 * the mins, for Q6_K the scales */
INLINE void decode(int type, const uint8_t *blk, int16_t *q, float *d, float *dmin, int16_t *aux)
{
    switch (type) {
    case Q4_0: {
        const uint8_t *qs = blk + 2;
        for (int e = 0; e < 16; e++) {
            q[e] = (int16_t)((qs[e] & 0x0F) - 8);
            q[e + 16] = (int16_t)((qs[e] >> 4) - 8);
        }
        *d = half_to_float(u16(blk));
        break;
    }
    case Q5_0: {
        const uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 |
                            (uint32_t)blk[5] << 24;
        const uint8_t *qs = blk + 6;
        for (int e = 0; e < 16; e++) {
            q[e] = (int16_t)((qs[e] & 0x0F) + 16 * (int)((qh >> e) & 1) - 16);
            q[e + 16] = (int16_t)((qs[e] >> 4) + 16 * (int)((qh >> (e + 16)) & 1) - 16);
        }
        *d = half_to_float(u16(blk));
        break;
    }
    case Q8_0: {
        const int8_t *qs = (const int8_t *)(blk + 2);
        for (int e = 0; e < 32; e++)
            q[e] = qs[e];
        *d = half_to_float(u16(blk));
        break;
    }
    case Q4_K: {
        const uint8_t *qs = blk + 16;
        for (int j = 0; j < 8; j++) {
            int s, m;
            scale_min_k4(blk + 4, j, &s, &m);
            aux[j] = (int16_t)m;
            const uint8_t *run = qs + 32 * (j / 2);
            for (int e = 0; e < 32; e++)
                q[32 * j + e] = (int16_t)(s * ((j & 1) ? run[e] >> 4 : run[e] & 0x0F));
        }
        *d = half_to_float(u16(blk));
        *dmin = half_to_float(u16(blk + 2));
        break;
    }
    default: { /* Q6_K */
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int h = 0; h < 2; h++) {
            const uint8_t *l = ql + 64 * h, *hb = qh + 32 * h;
            int16_t *o = q + 128 * h;
            for (int t = 0; t < 32; t++) {
                o[t] = (int16_t)((l[t] & 0x0F) | ((hb[t] & 0x03) << 4));
                o[t + 32] = (int16_t)((l[t + 32] & 0x0F) | ((hb[t] & 0x0C) << 2));
                o[t + 64] = (int16_t)((l[t] >> 4) | (hb[t] & 0x30));
                o[t + 96] = (int16_t)((l[t + 32] >> 4) | ((hb[t] & 0xC0) >> 2));
            }
        }
        for (int e = 0; e < 256; e++)
            q[e] = (int16_t)(q[e] * sc[e / 16]);
        for (int j = 0; j < 16; j++)
            aux[j] = sc[j];
        *d = half_to_float(u16(blk + 208));
        break;
    }
    }
}

/* out[i1 * ldo + i0] for weight rows i0 < n0 (row i0 at w + i0 * ldw) and activation
 * rows i1 < n1 (row i1 at x + i1 * ldx), nb blocks a row; acc: room for n1 * 12 floats */
INLINE void quant_dot_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                           Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1,
                           Py_ssize_t nb, float *acc)
{
    const int k_quant = type == Q4_K || type == Q6_K;
    const int runs = k_quant ? 8 : 1;
    const Py_ssize_t wsize = type == Q4_0 ? 18 : type == Q5_0 ? 22 : type == Q8_0 ? 34 : type == Q4_K ? 144 : 210;
    const Py_ssize_t ysize = k_quant ? 292 : 34;
    int16_t q[256], aux[16];
    int32_t lane[8];
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        memset(acc, 0, (size_t)n1 * 12 * sizeof(float));
        const uint8_t *wr = w + i0 * ldw;
        for (Py_ssize_t b = 0; b < nb; b++) {
            float xd, xdmin = 0.0f;
            decode(type, wr + b * wsize, q, &xd, &xdmin, aux);
            for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
                const uint8_t *yb = x + i1 * ldx + b * ysize;
                float yd;
                if (k_quant)
                    memcpy(&yd, yb, 4);
                else
                    yd = half_to_float(u16(yb));
                const int8_t *yq = (const int8_t *)(yb + (k_quant ? 4 : 2));
                lane_sums(q, yq, runs, lane);
                float *a = acc + i1 * 12;
                if (type == Q6_K)
                    for (int l = 0; l < 8; l++) {
                        const uint8_t *bs = yb + 260 + 4 * l;
                        const int32_t s0 = (int16_t)u16(bs), s1 = (int16_t)u16(bs + 2);
                        lane[l] -= 32 * (s0 * aux[2 * l] + s1 * aux[2 * l + 1]);
                    }
                const float scale = yd * xd;
                for (int l = 0; l < 8; l++)
                    a[l] = fmaf((float)lane[l], scale, a[l]);
                if (type == Q4_K) {
                    const uint8_t *bs = yb + 260;
                    int16_t q8s[8];  /* hadd_epi16 of the block sums */
                    for (int h = 0; h < 8; h++)
                        q8s[h] = (int16_t)((int16_t)u16(bs + 4 * h) + (int16_t)u16(bs + 4 * h + 2));
                    const float mscale = -yd * xdmin;
                    for (int l = 0; l < 4; l++) {
                        const int32_t s = (int32_t)aux[2 * l] * q8s[2 * l] +
                                          (int32_t)aux[2 * l + 1] * q8s[2 * l + 1];
                        a[8 + l] = fmaf((float)s, mscale, a[8 + l]);
                    }
                }
            }
        }
        for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
            const float *a = acc + i1 * 12;
            float r = hsum8(a);
            if (type == Q4_K)
                r += (a[8] + a[10]) + (a[9] + a[11]);
            out[i1 * ldo + i0] = r;
        }
    }
}

static void quant_dot(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,
                      float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb,
                      float *acc)
{
    switch (type) {  /* one copy of the loop per type, its constants folded in */
    case Q4_0: quant_dot_body(Q4_0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q5_0: quant_dot_body(Q5_0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q8_0: quant_dot_body(Q8_0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q4_K: quant_dot_body(Q4_K, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    default: quant_dot_body(Q6_K, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    }
}
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_FMA_TARGET 1
#include <immintrin.h>
#define AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The same products with AVX2: the lane sums by vector integer instructions (exact, so equal
 * to the scalar ones: unsigned 4- and 6-bit weights by maddubs, which cannot saturate on them;
 * signed 8-bit ones widened to 16 bits first), the fma and the sums in the same order. For the
 * 32-element types the 8 lane sums come out as lanes 0 1 4 5 2 3 6 7 (hadd works within
 * halves); their accumulators stay in that order and are put back before the final sum. */
AVX2 __m256i legacy_weights(int type, const uint8_t *blk)
{
    if (type == Q8_0)
        return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i t = _mm_loadu_si128((const __m128i *)(blk + (type == Q5_0 ? 6 : 2)));
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(t, 4), m4), _mm_and_si128(t, m4));
    if (type == Q4_0)
        return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
    uint32_t qh;  /* Q5_0: or 0xF0 (minus 16) into each element whose bit is clear */
    memcpy(&qh, blk + 2, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nib, _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0)));
}

AVX2 __m256i legacy_lanes(__m256i qx, const uint8_t *yq)
{
    const __m256i qy = _mm256_loadu_si256((const __m256i *)yq);
    const __m256i lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(qx)),
                                         _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qy)));
    const __m256i hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(qx, 1)),
                                         _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qy, 1)));
    return _mm256_hadd_epi32(lo, hi);  /* lanes 0 1 4 5 2 3 6 7 */
}

AVX2 __m256i q4_k_lanes(const uint8_t *qs, const int16_t *sc, const int8_t *yq)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(bits, m4),
                                                _mm256_loadu_si256((const __m256i *)(yq + 64 * j)));
        const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                                                _mm256_loadu_si256((const __m256i *)(yq + 64 * j + 32)));
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_set1_epi16(sc[2 * j])),
                                                     _mm256_madd_epi16(hi, _mm256_set1_epi16(sc[2 * j + 1]))));
    }
    return sum;
}

AVX2 __m256i q6_k_lanes(const uint8_t *blk, const int8_t *yq, const uint8_t *bsums)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int8_t *sc = (const int8_t *)(blk + 192);
    __m256i sum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(0x03)), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(0x0C)), 2));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_srli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8((char)0xC0)), 2));
        for (int r = 0; r < 4; r++) {
            const int run = 4 * h + r;
            const __m256i p = _mm256_maddubs_epi16(q[r], _mm256_loadu_si256((const __m256i *)(yq + 32 * run)));
            const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * run + 1]), _mm_set1_epi16(sc[2 * run]));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, s));
        }
    }
    const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums),
                                           _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
    return _mm256_sub_epi32(sum, _mm256_slli_epi32(corr, 5));
}

AVX2 float half_f16c(const uint8_t *p) { return _cvtsh_ss(u16(p)); }

AVX2 void quant_dot_avx2_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                              Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
                              Py_ssize_t n1, Py_ssize_t nb)
{
    const int k_quant = type == Q4_K || type == Q6_K;
    const Py_ssize_t wsize = type == Q4_0 ? 18 : type == Q5_0 ? 22 : type == Q8_0 ? 34 : type == Q4_K ? 144 : 210;
    const Py_ssize_t ysize = k_quant ? 292 : 34;
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        const uint8_t *wr = w + i0 * ldw;
        for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
            const uint8_t *yr = x + i1 * ldx;
            __m256 acc = _mm256_setzero_ps();
            float acc_m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (Py_ssize_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * wsize, *yb = yr + b * ysize;
                __m256i lanes;
                float d;
                if (!k_quant) {
                    d = half_f16c(yb) * half_f16c(blk);
                    lanes = legacy_lanes(legacy_weights(type, blk), yb + 2);
                } else {
                    float yd;
                    memcpy(&yd, yb, 4);
                    if (type == Q4_K) {
                        const uint8_t *bs = yb + 260;
                        int16_t sc[8], mn[8];
                        for (int j = 0; j < 8; j++) {
                            int s, m;
                            scale_min_k4(blk + 4, j, &s, &m);
                            sc[j] = (int16_t)s;
                            mn[j] = (int16_t)m;
                        }
                        lanes = q4_k_lanes(blk + 16, sc, (const int8_t *)(yb + 4));
                        const float mscale = -yd * half_f16c(blk + 2);
                        for (int l = 0; l < 4; l++) {
                            const int32_t s0 = (int16_t)((int16_t)u16(bs + 8 * l) + (int16_t)u16(bs + 8 * l + 2));
                            const int32_t s1 = (int16_t)((int16_t)u16(bs + 8 * l + 4) + (int16_t)u16(bs + 8 * l + 6));
                            acc_m[l] = fmaf((float)(mn[2 * l] * s0 + mn[2 * l + 1] * s1), mscale, acc_m[l]);
                        }
                        d = yd * half_f16c(blk);
                    } else {
                        lanes = q6_k_lanes(blk, (const int8_t *)(yb + 4), yb + 260);
                        d = yd * half_f16c(blk + 208);
                    }
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
            }
            float a[8];
            _mm256_storeu_ps(a, acc);
            if (!k_quant) {  /* lanes 0 1 4 5 2 3 6 7 back in order */
                float t;
                t = a[2], a[2] = a[4], a[4] = t;
                t = a[3], a[3] = a[5], a[5] = t;
            }
            float r = hsum8(a);
            if (type == Q4_K)
                r += (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
            out[i1 * ldo + i0] = r;
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void quant_dot_fma(int type, const uint8_t *w,
    Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
    Py_ssize_t n1, Py_ssize_t nb)
{
    switch (type) {
    case Q4_0: quant_dot_avx2_body(Q4_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q5_0: quant_dot_avx2_body(Q5_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q8_0: quant_dot_avx2_body(Q8_0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q4_K: quant_dot_avx2_body(Q4_K, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    default: quant_dot_avx2_body(Q6_K, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    }
}
#endif

/* Float dot products of rows a and b of k floats, as ggml's AVX2 builds compute them:
 * lanes32: ggml's SIMD loop over the first np = k & ~31 elements: 4 accumulators of 8 lanes, one
 *   fmaf per element, reduced (a0 + a2) + (a1 + a3), then lanes (l + l+4), then
 *   (r0 + r1) + (r2 + r3).
 * f32_row: ggml_vec_dot_f32: lanes32, then the leftovers as gcc compiled `sumf += x[i]*y[i]`: a
 *   run of 8 (or one of 4) as a vector product, each product rounded, added to sumf in order;
 *   the last ones (up to 3) by fmaf.
 * f16_row: ggml_vec_dot_f16 of the F16C build (the halves widened to float): lanes32, then the
 *   leftover products, each rounded to float, summed in double.
 * tiny_row: llamafile's tinyBLAS (k a multiple of 8): one accumulator of 8 lanes, one fmaf per
 *   element, then hsum: (hi + lo), (r0 + r2) + (r1 + r3).
 * ALL_PAIRS makes, from a row function, NAME(w, x, out, n0, n1, k): out[i1, i0] = row(w[i0],
 * x[i1]) for every pair of rows of w (n0, k) and x (n1, k); ROW_PAIRS NAME(a, b, out, n, k):
 * out[i] = row(a[i], b[i]). */
#define FLOAT_ROWS(S, ATTR)                                                                  \
    ATTR static inline float lanes32##S(const float *a, const float *b, Py_ssize_t np)      \
    {                                                                                        \
        float acc[4][8] = {{0}};                                                             \
        for (Py_ssize_t s = 0; s < np; s += 32)                                              \
            for (int j = 0; j < 4; j++)                                                      \
                for (int l = 0; l < 8; l++)                                                  \
                    acc[j][l] = fmaf(a[s + 8 * j + l], b[s + 8 * j + l], acc[j][l]);         \
        float v[8], t[4];                                                                    \
        for (int l = 0; l < 8; l++)                                                          \
            v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);                        \
        for (int l = 0; l < 4; l++)                                                          \
            t[l] = v[l] + v[l + 4];                                                          \
        return (t[0] + t[1]) + (t[2] + t[3]);                                                \
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
    ATTR static inline float f16_row##S(const float *a, const float *b, Py_ssize_t k)       \
    {                                                                                        \
        const Py_ssize_t np = k & ~(Py_ssize_t)31;                                           \
        double sumf = (double)lanes32##S(a, b, np);                                          \
        for (Py_ssize_t i = np; i < k; i++) {                                                \
            const float p = a[i] * b[i];                                                     \
            sumf += (double)p;                                                               \
        }                                                                                    \
        return (float)sumf;                                                                  \
    }                                                                                        \
    ATTR static inline float tiny_row##S(const float *a, const float *b, Py_ssize_t k)      \
    {                                                                                        \
        float acc[8] = {0};                                                                  \
        for (Py_ssize_t s = 0; s < k; s += 8)                                                \
            for (int l = 0; l < 8; l++)                                                      \
                acc[l] = fmaf(a[s + l], b[s + l], acc[l]);                                   \
        float r[4];                                                                          \
        for (int l = 0; l < 4; l++)                                                          \
            r[l] = acc[l + 4] + acc[l];                                                      \
        return (r[0] + r[2]) + (r[1] + r[3]);                                                \
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

FLOAT_ROWS(, )
ALL_PAIRS(dot_f32, f32_row, )
ROW_PAIRS(dot_f32_pairs, f32_row, )
ALL_PAIRS(dot_f16, f16_row, )
ALL_PAIRS(dot_tiny, tiny_row, )
#ifdef HAVE_FMA_TARGET
#define FMA __attribute__((target("fma")))
FLOAT_ROWS(_fma, FMA)
ALL_PAIRS(dot_f32_fma, f32_row_fma, FMA)
ROW_PAIRS(dot_f32_pairs_fma, f32_row_fma, FMA)
ALL_PAIRS(dot_f16_fma, f16_row_fma, FMA)
ALL_PAIRS(dot_tiny_fma, tiny_row_fma, FMA)
#endif

/* the FMA instruction where the CPU has it; libm's fmaf otherwise (the same bits) */
static int fma_hw(void)
{
#ifdef HAVE_FMA_TARGET
    return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

#ifdef HAVE_FMA_TARGET
#define PICK(fn, hw) ((hw) ? fn##_fma : fn)
#else
#define PICK(fn, hw) fn
#endif

static int check(Py_buffer *buf, Py_ssize_t want, const char *what)
{
    if (buf->len != want) {
        PyErr_Format(PyExc_ValueError, "_lanes: %s has %zd bytes, not %zd", what, buf->len, want);
        return -1;
    }
    return 0;
}

/* One thread's rows [i0, i0 + n0) of a quant_dot: each output is one row's own sum, so how the
 * rows are split between threads never changes a bit. */
typedef struct {
    int type, hw;
    const uint8_t *w, *x;
    Py_ssize_t ldw, ldx, n0, n1, nb;
    float *out, *acc;  /* out: this thread's first column; rows n0 (all threads') apart */
    Py_ssize_t ldo;
} QuantRows;

static void *quant_rows(void *arg)
{
    const QuantRows *j = arg;
#ifdef HAVE_FMA_TARGET
    if (j->hw) {
        quant_dot_fma(j->type, j->w, j->ldw, j->x, j->ldx, j->out, j->ldo, j->n0, j->n1, j->nb);
        return NULL;
    }
#endif
    quant_dot(j->type, j->w, j->ldw, j->x, j->ldx, j->out, j->ldo, j->n0, j->n1, j->nb, j->acc);
    return NULL;
}

enum { MAX_SPLIT = 64 };
/* block products below which a second thread costs more to start than it saves (~100 us) */
#define SPLIT_BLOCKS ((Py_ssize_t)1 << 14)

static PyObject *py_quant_dot(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, x, out;
    int type, portable = 0, threads = 1;
    Py_ssize_t ldw, ldx, n0, n1, nb;
    if (!PyArg_ParseTuple(args, "iy*ny*nw*nnn|pi", &type, &w, &ldw, &x, &ldx, &out, &n0, &n1, &nb,
                          &portable, &threads))
        return NULL;
    const int k_quant = type == Q4_K || type == Q6_K;
    const Py_ssize_t wsize = type == Q4_0 ? 18 : type == Q5_0 ? 22 : type == Q8_0 ? 34
                           : type == Q4_K ? 144 : type == Q6_K ? 210 : 0;
    const Py_ssize_t ysize = k_quant ? 292 : 34;
    /* w: n0 rows of nb blocks, ldw bytes apart (the last one may end the buffer); x likewise */
    int ok = wsize > 0 && n0 >= 0 && n1 >= 0 && nb >= 0 && ldw >= nb * wsize && ldx >= nb * ysize &&
             w.len >= (n0 > 0 ? (n0 - 1) * ldw + nb * wsize : 0) &&
             x.len >= (n1 > 0 ? (n1 - 1) * ldx + nb * ysize : 0) && check(&out, n0 * n1 * 4, "out") == 0;
    /* the rows shared out: as many threads as asked, each with enough work to be worth its start */
    Py_ssize_t parts = threads < 1 ? 1 : threads > MAX_SPLIT ? MAX_SPLIT : threads;
    while (parts > 1 && (n0 < parts || n0 * n1 * nb / parts < SPLIT_BLOCKS))
        parts--;
    float *acc = NULL;
    if (ok && !(acc = PyMem_RawMalloc((size_t)parts * (size_t)(n1 + 1) * 12 * sizeof(float)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const int hw = !portable && fma_hw();
        QuantRows jobs[MAX_SPLIT];
        pthread_t tids[MAX_SPLIT];
        int started[MAX_SPLIT] = {0};
        for (Py_ssize_t p = 0; p < parts; p++) {
            const Py_ssize_t a = p * n0 / parts, b = (p + 1) * n0 / parts;
            jobs[p] = (QuantRows){type, hw, (const uint8_t *)w.buf + a * ldw, x.buf, ldw, ldx, b - a,
                                  n1, nb, (float *)out.buf + a, acc + p * (n1 + 1) * 12, n0};
        }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 1; p < parts; p++)  /* a thread that cannot start: its rows run here */
            started[p] = pthread_create(&tids[p], NULL, quant_rows, &jobs[p]) == 0;
        quant_rows(&jobs[0]);
        for (Py_ssize_t p = 1; p < parts; p++) {
            if (started[p])
                pthread_join(tids[p], NULL);
            else
                quant_rows(&jobs[p]);
        }
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad type, sizes or strides");
    }
    PyMem_RawFree(acc);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* IEEE half -> float (every half is exactly a float) */
static float half_to_float(uint16_t h)
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

/* to_float (dequantize_row_*) for the types whose numpy form cost most: block by block, the
 * same float operations in the same order as ggml's C (each product and difference rounded to
 * float; nothing fused):
 *   Q8_0   y = q * d
 *   Q4_K   y = (d * sc) * q - (dmin * m), sub-block j of 32 from get_scale_min_k4(j)
 *   Q5_K   the same with q = nibble + 16 * (bit j of qh[e])
 *   TQ1_0  y = (trit - 1) * d; trit n of byte q is ((uint8_t)(q * 3^n) * 3) >> 8: elements
 *          32n + m from qs[m] (n < 5), 160 + 16n + m from qs[32 + m], 240 + 4n + m from qh[m] */
enum { Q5_K = 13, TQ1_0 = 34 };

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
    int ok = in_size > 0 && in->len % in_size == 0 && check(out, nb * out_size, "out") == 0;
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

static PyObject *py_dequantize(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer raw, out;
    int type;
    if (!PyArg_ParseTuple(args, "iy*w*", &type, &raw, &out))
        return NULL;
    const Py_ssize_t bsize = type == Q8_0 ? 34 : type == Q4_K ? 144 : type == Q5_K ? 176 : type == TQ1_0 ? 54 : 0;
    const Py_ssize_t belems = type == Q8_0 ? 32 : 256;
    return convert_blocks(type, &raw, &out, bsize, belems * 4, dequantize_blocks,
                          "_lanes: no such type, or not whole blocks");
}

/* GGML_FP32_TO_FP16: round to nearest even, through the subnormals; overflow to infinity; a NaN
 * becomes the quiet NaN 0x7E00 with its sign (engine.types.fp32_to_fp16_bits) */
static uint16_t float_to_half(float f)
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

static PyObject *py_quantize_q8_0(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, out;
    if (!PyArg_ParseTuple(args, "y*w*", &x, &out))
        return NULL;
    return convert_blocks(Q8_0, &x, &out, 32 * 4, 34, quantize_q8_0_blocks,
                          "_lanes: x is not whole blocks of 32 floats");
}

static PyObject *py_float_dot(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, x, out;
    Py_ssize_t n0, n1, k, ldw = -1;
    int tiny;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnp|n", &w, &x, &out, &n0, &n1, &k, &tiny, &ldw))
        return NULL;
    /* ldw >= 0: w holds halves, row i0 at element i0 * ldw (widened here, once) */
    int ok = n0 >= 0 && n1 >= 0 && k >= 0 && (!tiny || k % 8 == 0) &&
             (ldw < 0 ? check(&w, n0 * k * 4, "w") == 0
                      : (ldw >= k && w.len >= ((n0 > 0 ? (n0 - 1) * ldw : 0) + k) * 2)) &&
             check(&x, n1 * k * 4, "x") == 0 && check(&out, n0 * n1 * 4, "out") == 0;
    float *wide = NULL;
    if (ok && ldw >= 0) {
        if (!(wide = PyMem_RawMalloc((size_t)(n0 * k + 1) * sizeof(float)))) {
            PyErr_NoMemory();
            ok = 0;
        } else {
            const uint16_t *h = w.buf;
            for (Py_ssize_t i0 = 0; i0 < n0; i0++)
                for (Py_ssize_t t = 0; t < k; t++)
                    wide[i0 * k + t] = half_to_float(h[i0 * ldw + t]);
        }
    }
    if (ok) {
        const float *wf = wide ? wide : w.buf;
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        (tiny ? PICK(dot_tiny, hw) : PICK(dot_f16, hw))(wf, x.buf, out.buf, n0, n1, k);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes");
    }
    PyMem_RawFree(wide);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_dot_f32(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, x, out;
    Py_ssize_t n0, n1, k;
    int pairs = 0;
    if (!PyArg_ParseTuple(args, "y*y*w*nnn|p", &w, &x, &out, &n0, &n1, &k, &pairs))
        return NULL;
    /* pairs: w and x both (n0, k), out (n0) */
    int ok = n0 >= 0 && n1 >= 0 && k >= 0 && (!pairs || n1 == n0) && check(&w, n0 * k * 4, "w") == 0 &&
             check(&x, n1 * k * 4, "x") == 0 && check(&out, (pairs ? n0 : n0 * n1) * 4, "out") == 0;
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
#define V_MATH(EXPF, SILU, ATTR)                                                             \
    ATTR static inline float EXPF##_1(float x)                                               \
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
        /* every lane's three results, then the one its |n| picks (as the vector code's   */ \
        /* masks do): no branch, so the compiler can run the loop 8 lanes at a time       */ \
        const float normal = fmaf(k, j, k), scaled = fmaf(s2, j, s2) * s1, huge = s1 * s1;   \
        return an > 192.0f ? huge : an > 126.0f ? scaled : normal;                           \
    }                                                                                        \
    ATTR static void EXPF(const float *x, float *out, Py_ssize_t n)        \
    {                                                                                        \
        for (Py_ssize_t i = 0; i < n; i++)                                                   \
            out[i] = EXPF##_1(x[i]);                                                         \
    }                                                                                        \
    ATTR static void SILU(const float *x, float *out, Py_ssize_t n)        \
    {                                                                                        \
        for (Py_ssize_t i = 0; i < n; i++)                                                   \
            out[i] = x[i] / (1.0f + EXPF##_1(0.0f - x[i]));                                  \
    }                                                                                        \
    /* ggml_vec_soft_max_f32 on `rows` rows of n: y = exp(w - max), v_expf on whole groups  \
     * of 8 and libm's expf on the rest; each group's lanes summed in float as the SSE      \
     * shuffles add them, ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), then every group's sum and \
     * every tail value added in double, left to right */                                   \
    ATTR static void EXPF##_softmax(const float *w, const float *mx, float *y, double *sums, \
                                    Py_ssize_t rows, Py_ssize_t n)                           \
    {                                                                                        \
        const Py_ssize_t n8 = n - n % 8;                                                     \
        for (Py_ssize_t r = 0; r < rows; r++) {                                              \
            const float *wr = w + r * n, m = mx[r];                                          \
            float *yr = y + r * n;                                                           \
            for (Py_ssize_t i = 0; i < n8; i++)                                              \
                yr[i] = EXPF##_1(wr[i] - m);                                                 \
            double sum = 0.0;                                                                \
            for (Py_ssize_t i = 0; i < n8; i += 8) {                                         \
                const float *v = yr + i;                                                     \
                const float h0 = v[0] + v[4], h1 = v[1] + v[5], h2 = v[2] + v[6],            \
                            h3 = v[3] + v[7];                                                \
                sum += (double)((h0 + h2) + (h1 + h3));                                      \
            }                                                                                \
            for (Py_ssize_t i = n8; i < n; i++) {                                            \
                yr[i] = expf(wr[i] - m);                                                     \
                sum += (double)yr[i];                                                        \
            }                                                                                \
            sums[r] = sum;                                                                   \
        }                                                                                    \
    }

V_MATH(v_expf, v_silu, )
#ifdef HAVE_FMA_TARGET
V_MATH(v_expf_fma, v_silu_fma, __attribute__((target("avx2,fma"))))
#endif

static PyObject *py_v_math(PyObject *args, int silu)
{
    Py_buffer x, out;
    if (!PyArg_ParseTuple(args, "y*w*", &x, &out))
        return NULL;
    int ok = x.len % 4 == 0 && check(&out, x.len, "out") == 0;
    if (ok) {
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
        (silu ? PICK(v_silu, hw) : PICK(v_expf, hw))(x.buf, out.buf, x.len / 4);
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

static PyObject *py_soft_max(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, mx, y, sums;
    Py_ssize_t rows, n;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nn", &w, &mx, &y, &sums, &rows, &n))
        return NULL;
    int ok = rows >= 0 && n >= 0 && check(&w, rows * n * 4, "w") == 0 && check(&mx, rows * 4, "mx") == 0 &&
             check(&y, rows * n * 4, "y") == 0 && check(&sums, rows * 8, "sums") == 0;
    if (ok) {
        const int hw = fma_hw();
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_FMA_TARGET
        (hw ? v_expf_fma_softmax : v_expf_softmax)(w.buf, mx.buf, y.buf, sums.buf, rows, n);
#else
        (void)hw;
        v_expf_softmax(w.buf, mx.buf, y.buf, sums.buf, rows, n);
#endif
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

#define FMAF_LOOP(name, attr)                                                                  \
    attr static void name(const float *restrict a, const float *restrict b, const float *c,     \
                          float *out, Py_ssize_t n)                                              \
    {                                                                                            \
        for (Py_ssize_t i = 0; i < n; i++)                                                       \
            out[i] = fmaf(a[i], b[i], c[i]);                                                     \
    }

FMAF_LOOP(fmaf_loop, )
#ifdef HAVE_FMA_TARGET
FMAF_LOOP(fmaf_loop_fma, __attribute__((target("avx2,fma"))))  /* vfmadd on 8 lanes at once */
#endif

static void fmaf_nans(const float *a, const float *b, float *out, Py_ssize_t n)
{
    /* (c's NaN, the only one, is the one every fused multiply-add gives: already there) */
    for (Py_ssize_t i = 0; i < n; i++)
        if (isnan(out[i]) && (isnan(a[i]) || isnan(b[i])))
            out[i] = isnan(b[i]) ? quiet(b[i]) : quiet(a[i]);
}

static PyObject *py_fmaf(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer a, b, c, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &a, &b, &c, &out))
        return NULL;
    const Py_ssize_t n = out.len / 4;
    int ok = out.len % 4 == 0 && check(&c, out.len, "c") == 0 && check(&b, a.len, "b") == 0;
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
            PICK(fmaf_loop, hw)(ak, bk, out.buf, out.buf, n);
            fmaf_nans(ak, bk, out.buf, n);
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

static PyObject *py_v_expf(PyObject *self, PyObject *args) { (void)self; return py_v_math(args, 0); }
static PyObject *py_v_silu(PyObject *self, PyObject *args) { (void)self; return py_v_math(args, 1); }

static PyMethodDef methods[] = {
    {"v_expf", py_v_expf, METH_VARARGS,
     "v_expf(x, out): out[i] = ggml_v_expf's lane of x[i] (contiguous float32 buffers)"},
    {"soft_max", py_soft_max, METH_VARARGS,
     "soft_max(w, mx, y, sums, rows, n): ggml_vec_soft_max_f32 of each row of w (rows, n) float32 "
     "less its max mx[r]: y = exp(w - max), sums[r] their sum in double, in ggml's order"},
    {"v_silu", py_v_silu, METH_VARARGS,
     "v_silu(x, out): out[i] = ggml_v_silu's lane of x[i]: x / (1 + v_expf(0 - x))"},
    {"quant_dot", py_quant_dot, METH_VARARGS,
     "quant_dot(type, w, ldw, x, ldx, out, n0, n1, nb, portable=False, threads=1): out[i1, i0] "
     "= ggml's AVX2 vec_dot of weight row i0 (Q4_0, Q5_0, Q8_0, Q4_K or Q6_K blocks at w + i0*ldw) and activation row i1 (Q8_0 or "
     "Q8_K blocks at x + i1*ldx), nb blocks a row, float32; portable: without the vector "
     "instructions (the same bits); threads: the rows shared out between up to that many threads "
     "(the same bits)"},
    {"quantize_q8_0", py_quantize_q8_0, METH_VARARGS,
     "quantize_q8_0(x, out): quantize_row_q8_0 of ggml's AVX2 build: float32 blocks of 32 -> "
     "34-byte blocks (the half d, 32 int8)"},
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(type, raw, out): ggml's to_float of whole Q8_0, Q4_K, Q5_K or TQ1_0 blocks into "
     "float32 out"},
    {"float_dot", py_float_dot, METH_VARARGS,
     "float_dot(w, x, out, n0, n1, k, tiny): out[i1, i0] = ggml_vec_dot_f16 (tiny: llamafile's "
     "tinyBLAS) of row i0 of w (n0, k) and row i1 of x (n1, k), float32"},
    {"fmaf", py_fmaf, METH_VARARGS,
     "fmaf(a, b, c, out): out = c, then out[i] = fmaf(a[k, i], b[k, i], out[i]) for each step k "
     "of a and b (contiguous float32, whole steps of out's size), an operand's NaN (b's, a's, "
     "then c's) quiet"},
    {"dot_f32", py_dot_f32, METH_VARARGS,
     "dot_f32(w, x, out, n0, n1, k, pairs=False): out[i1, i0] = ggml_vec_dot_f32 of row i0 of w "
     "(n0, k) and row i1 of x (n1, k), float32; with pairs (n1 == n0), out[i] of rows i alone"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lanes",
    "The lane loop of ggml's quantized dot products: integer lane sums and one fmaf per block.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lanes(void) { return PyModule_Create(&module); }
