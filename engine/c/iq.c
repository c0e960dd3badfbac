/* engine._lanes (c/lanes.c): ggml's AVX2 dot products of the IQ grid types with Q8_K activations,
 * for quant_dot (c/quant.c hands these types here), in portable C and with AVX2 intrinsics
 * (the same bits):
 *   IQ3_XXS (ggml_vec_dot_iq3_xxs_q8_K) per run of 32: 8 grid indices (qs[8r..8r+7], 4 values
 *           each, iq3xxs_grid) and a word of 4 seven-bit sign fields and a 4-bit scale ls (the
 *           8th sign of each 8 makes their parity even); the result 0.25f * hsum_float_8(acc)
 *   IQ3_S   (ggml_vec_dot_iq3_s_q8_K) per run: 8 nine-bit indices (qs[8r + j] and bit j of
 *           qh[r], iq3s_grid), a sign bit per element (bit e % 8 of signs[4r + e / 8]), ls the
 *           nibble r % 2 of scales[r / 2]; the result hsum_float_8(acc)
 *   IQ2_S   (ggml_vec_dot_iq2_s_q8_K) per run: 4 ten-bit indices (qs[4r + k] and bits 2k, 2k+1
 *           of qh[r], 8 values each, iq2s_grid), sign bits as IQ3_S's (from qs[32..63]), ls the
 *           low nibble of scales[r] for the first 16 elements and the high one for the last;
 *           the result 0.125f * hsum_float_8(acc)
 * Each value (unsigned) meets its activation byte with the sign applied to the activation,
 * ggml's _mm256_sign_epi8 or xor-and-subtract: where the sign is negative and y = -128 the
 * negation wraps, so the product is value * -128, not value * 128. maddubs cannot saturate (the
 * values are at most 62). Lane l sums elements 4l..4l+3 of every run times 2 * ls + 1 (exact
 * integers), acc[l] = fmaf((float)lane, x.d * y.d, acc[l]) block after block. */
#include "lanes.h"
#include "iq_grids.h"

#define IQ_ACT 292  /* bytes of a Q8_K activation block: float d, 256 int8, 16 int16 sums */

LANES_HIDDEN Py_ssize_t lanes_iq_size(int type)
{
    switch (type) {
    case IQ3_XXS: case IQ3_S: case IQ2_S: return lanes_block_bytes(type);
    default: return 0;
    }
}

INLINE uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* run r (elements 32r..32r+31) of a block: the 32 unsigned grid values g, 4 bytes of sign bits
 * (bit e % 8 of sg[e / 8]: element e negative) and the scales 2 * ls + 1 of its two halves */
INLINE void iq_run(int type, const uint8_t *blk, int r, uint8_t *g, uint8_t *sg, int16_t *sc)
{
    if (type == IQ3_XXS) {
        const uint32_t aux = u32(blk + 66 + 4 * r);
        for (int j = 0; j < 8; j++)
            memcpy(g + 4 * j, &iq3xxs_grid[blk[2 + 8 * r + j]], 4);
        for (int k = 0; k < 4; k++) {
            const uint8_t s7 = (aux >> (7 * k)) & 127;
            sg[k] = (uint8_t)(s7 | (__builtin_parity(s7) << 7));
        }
        sc[0] = sc[1] = (int16_t)(2 * (aux >> 28) + 1);
    } else if (type == IQ3_S) {
        const uint8_t qh = blk[66 + r];
        for (int j = 0; j < 8; j++)
            memcpy(g + 4 * j, &iq3s_grid[blk[2 + 8 * r + j] | (((qh >> j) & 1) << 8)], 4);
        memcpy(sg, blk + 74 + 4 * r, 4);
        sc[0] = sc[1] = (int16_t)(2 * ((blk[106 + r / 2] >> (4 * (r % 2))) & 0x0F) + 1);
    } else {  /* IQ2_S */
        const uint8_t qh = blk[66 + r];
        for (int k = 0; k < 4; k++)
            memcpy(g + 8 * k, &iq2s_grid[blk[2 + 4 * r + k] | (((qh >> (2 * k)) & 3) << 8)], 8);
        memcpy(sg, blk + 34 + 4 * r, 4);
        sc[0] = (int16_t)(2 * (blk[74 + r] & 0x0F) + 1);
        sc[1] = (int16_t)(2 * (blk[74 + r] >> 4) + 1);
    }
}

/* what ggml multiplies hsum_float_8(acc) by */
INLINE float iq_result(int type, float h)
{
    return type == IQ3_XXS ? 0.25f * h : type == IQ2_S ? 0.125f * h : h;
}

INLINE float hsum8_iq(const float *a)
{
    float r[4];
    for (int l = 0; l < 4; l++)
        r[l] = a[l + 4] + a[l];
    return (r[0] + r[2]) + (r[1] + r[3]);
}

/* the portable loop: each weight block decoded once (q = +-g * scale), then every activation
 * row's lanes; acc: room for n1 * 8 floats */
INLINE void iq_dot_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,
                        float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb,
                        float *acc)
{
    const Py_ssize_t wsize = lanes_iq_size(type);
    int16_t q[256];
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        memset(acc, 0, (size_t)n1 * 8 * sizeof(float));
        for (Py_ssize_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + i0 * ldw + b * wsize;
            for (int r = 0; r < 8; r++) {
                uint8_t g[32], sg[4];
                int16_t sc[2];
                iq_run(type, blk, r, g, sg, sc);
                for (int e = 0; e < 32; e++)
                    q[32 * r + e] = (int16_t)((sg[e / 8] >> (e % 8) & 1 ? -g[e] : g[e]) * sc[e / 16]);
            }
            const float xd = half_to_float(u16(blk));
            for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
                const uint8_t *yb = x + i1 * ldx + b * IQ_ACT;
                const int8_t *yq = (const int8_t *)(yb + 4);
                float yd, *a = acc + i1 * 8;
                memcpy(&yd, yb, 4);
                int32_t s[32] = {0};
                for (int r = 0; r < 8; r++)
                    for (int e = 0; e < 32; e++) {  /* -(-128) wraps: the product q * 128 */
                        const int32_t v = q[32 * r + e], y = yq[32 * r + e] == -128 && v < 0 ? 128 : yq[32 * r + e];
                        s[e] += v * y;
                    }
                const float d = xd * yd;
                for (int l = 0; l < 8; l++)
                    a[l] = fmaf((float)((s[4 * l] + s[4 * l + 1]) + (s[4 * l + 2] + s[4 * l + 3])), d, a[l]);
            }
        }
        for (Py_ssize_t i1 = 0; i1 < n1; i1++)
            out[i1 * ldo + i0] = iq_result(type, hsum8_iq(acc + i1 * 8));
    }
}

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#define AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* a block's 8 lanes as ggml's AVX2 loop makes them: the signs applied to the activations
 * (xor with the mask, minus the mask: the wrapping negation), maddubs with the unsigned grid
 * values, madd with each half's scale, the runs summed */
AVX2 __m256i iq_lanes(int type, const uint8_t *blk, const int8_t *yq)
{
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                             0x0101010101010101LL, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i sum = _mm256_setzero_si256();
    for (int r = 0; r < 8; r++) {
        uint8_t g[32], sg[4];
        int16_t sc[2];
        iq_run(type, blk, r, g, sg, sc);
        const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u32(sg)), spread);
        const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(bits, bit), bit);
        const __m256i y = _mm256_loadu_si256((const __m256i *)(yq + 32 * r));
        const __m256i ys = _mm256_sub_epi8(_mm256_xor_si256(y, neg), neg);
        const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)g), ys);
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, s));
    }
    return sum;
}

AVX2 void iq_dot_avx2_body(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,
                           float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb)
{
    const Py_ssize_t wsize = lanes_iq_size(type);
    for (Py_ssize_t i0 = 0; i0 < n0; i0++)
        for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
            __m256 acc = _mm256_setzero_ps();
            for (Py_ssize_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + i0 * ldw + b * wsize, *yb = x + i1 * ldx + b * IQ_ACT;
                float yd;
                memcpy(&yd, yb, 4);
                const float d = _cvtsh_ss(u16(blk)) * yd;
                const __m256i lanes = iq_lanes(type, blk, (const int8_t *)(yb + 4));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
            }
            float a[8];
            _mm256_storeu_ps(a, acc);
            out[i1 * ldo + i0] = iq_result(type, hsum8_iq(a));
        }
}

__attribute__((target("avx2,fma,f16c"))) static void iq_dot_fma(int type, const uint8_t *w,
    Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
    Py_ssize_t n1, Py_ssize_t nb)
{
    switch (type) {
    case IQ3_XXS: iq_dot_avx2_body(IQ3_XXS, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case IQ3_S: iq_dot_avx2_body(IQ3_S, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case IQ2_S: iq_dot_avx2_body(IQ2_S, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    }
}
#endif

LANES_HIDDEN void lanes_iq_dot(int type, int hw, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                               Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1,
                               Py_ssize_t nb, float *acc)
{
#ifdef HAVE_FMA_TARGET
    if (hw) {
        iq_dot_fma(type, w, ldw, x, ldx, out, ldo, n0, n1, nb);
        return;
    }
#endif
    (void)hw;
    switch (type) {  /* one copy of the loop per type, its constants folded in */
    case IQ3_XXS: iq_dot_body(IQ3_XXS, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case IQ3_S: iq_dot_body(IQ3_S, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case IQ2_S: iq_dot_body(IQ2_S, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    }
}
