/* engine._lanes (c/lanes.c): the products of ggml-cpu's repacked Q4_K weights (q4_K_8x8, the
 * CPU_REPACK buffer) with Q8_K activations, as llama.cpp's AVX2 build computes them
 * (arch/x86/repack.cpp): ggml_quantize_mat_q8_K_4x8, ggml_gemv_q4_K_8x8_q8_K and
 * ggml_gemm_q4_K_8x8_q8_K. engine/compute/kernels/repack_q8_k.py holds their numpy twins and says
 * what the layouts are.
 *
 * ggml's vector code is integer arithmetic up to one float per weight row and sub-block pair:
 * the 16-bit lane sums (maddubs, 16 products a lane at most: no saturation) and their 32-bit
 * sums times the six-bit scales are exact, so any order gives them; only the int16 sums of two
 * bsums (hadd_epi16) wrap, as they do here. What is kept exactly is where the floats are made
 * and fused: the gemv multiply-adds once per super-block, acc = fmaf((float)isum, d * y.d, acc),
 * the gemm once per pair of sub-blocks (4 times a super-block); the mins in accumulators of
 * their own, subtracted at the end. The weights' 8 rows run side by side (ggml's 8 lanes); the
 * weight groups are shared out between the pool's threads (each output is its own sum: the
 * split changes no bit). Compiled twice: with the FMA instruction where the CPU has it, else
 * with libm's fmaf (the same bits). */
#include "lanes.h"

enum {
    QK = 256,              /* QK_K */
    XB = 16 + 16 + 96 + 1024,  /* block_q4_Kx8 */
    YB = 4 + 256 + 32,     /* block_q8_K */
    Y4B = 16 + 1024 + 128, /* block_q8_Kx4 */
    TILE = 16,             /* activation rows that share one decoding of a weight block */
};

/* --- ggml_quantize_mat_q8_K_4x8 --------------------------------------------------------------- */

/* _mm256_max_ps's lane: the first operand if it is greater, else the second (NaN: the second) */
static inline float max_ps(float a, float b)
{
    return a > b ? a : b;
}

/* _mm256_round_ps(p, nearest even), _mm256_cvtps_epi32 (out of range or NaN: INT32_MIN), then
 * the two saturating packs to int8 */
static inline int8_t quant_of(float p)
{
    const float r = rintf(p);
    const int32_t i = r >= -2147483648.0f && r < 2147483648.0f ? (int32_t)r : INT32_MIN;
    return (int8_t)(i < -128 ? -128 : i > 127 ? 127 : i);
}

/* iscale of one row's block of 256, as the AVX2 loop finds it: the 8 lanes' largest |x| (max_ps
 * vector after vector), whether a positive x equal to it was seen in a lane (maskAbs: reset in a
 * lane whose maximum grew, set where x equals the new maximum), the lanes' maximum by max_ps's
 * tree; -127/max if a lane holding the maximum saw it positive, else 127/max (0 for 0) */
static float row_iscale(const float *v, float *d)
{
    float m[8];
    int seen[8];
    for (int l = 0; l < 8; l++) {
        m[l] = fabsf(v[l]);
        for (int j = 1; j < 4; j++)
            m[l] = max_ps(m[l], fabsf(v[8 * j + l]));
        seen[l] = m[l] == v[l] || m[l] == v[8 + l] || m[l] == v[16 + l] || m[l] == v[24 + l];
    }
    for (int sb = 1; sb < 8; sb++) {
        const float *u = v + 32 * sb;
        for (int l = 0; l < 8; l++) {
            const float prev = m[l];
            for (int j = 0; j < 4; j++)
                m[l] = max_ps(m[l], fabsf(u[8 * j + l]));
            const int now = m[l] == u[l] || m[l] == u[8 + l] || m[l] == u[16 + l] || m[l] == u[24 + l];
            seen[l] = (seen[l] && prev == m[l]) || now;
        }
    }
    float h[4];
    for (int l = 0; l < 4; l++)
        h[l] = max_ps(m[l + 4], m[l]);
    const float mx = max_ps(max_ps(h[0], h[2]), max_ps(h[1], h[3]));
    int positive = 0;
    for (int l = 0; l < 8; l++)
        positive |= seen[l] && mx == m[l];
    float iscale = mx != 0.0f ? 127.0f / mx : 0.0f;
    if (positive)
        iscale = mx != 0.0f ? -127.0f / mx : 0.0f;
    *d = mx != 0.0f ? 1.0f / iscale : 0.0f;
    return iscale;
}

/* 4 rows of k floats (k apart) -> k / 256 block_q8_Kx4: d[4], the quants 8 at a time (row 0's
 * elements 8j..8j+7, row 1's, row 2's, row 3's, then j + 1), bsums[16 (e / 64) + 4 row +
 * (e / 16) % 4] the sum of the 16 quants from e */
static void quantize_group(const float *x, Py_ssize_t k, uint8_t *y)
{
    for (Py_ssize_t i = 0; i < k / QK; i++, y += Y4B) {
        float iscale[4];
        for (int row = 0; row < 4; row++) {
            float d;
            iscale[row] = row_iscale(x + row * k + i * QK, &d);
            memcpy(y + 4 * row, &d, 4);
        }
        int8_t *qs = (int8_t *)(y + 16);
        int16_t bsums[64] = {0};
        for (int row = 0; row < 4; row++) {
            const float *v = x + row * k + i * QK;
            for (int e = 0; e < QK; e++) {
                const int8_t q = quant_of(v[e] * iscale[row]);
                qs[32 * (e / 8) + 8 * row + e % 8] = q;
                bsums[16 * (e / 64) + 4 * row + (e / 16) % 4] += q;
            }
        }
        memcpy(y + 16 + 1024, bsums, sizeof bsums);
    }
}

LANES_HIDDEN PyObject *lanes_quantize_mat_q8_k_4x8(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer x, out;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "y*w*n", &x, &out, &k))
        return NULL;
    const Py_ssize_t groups = k > 0 ? x.len / (16 * k) : 0;
    int ok = k > 0 && k % QK == 0 && x.len == groups * 16 * k &&
             lanes_check(&out, groups * (k / QK) * Y4B, "out") == 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t g = 0; g < groups; g++)
            quantize_group((const float *)x.buf + 4 * k * g, k, (uint8_t *)out.buf + g * (k / QK) * Y4B);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: x is not groups of 4 rows of k (a multiple of 256) floats");
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* --- gemv and gemm ------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *w, *y;  /* nc / 8 rows of nb block_q4_Kx8; nr activation rows */
    float *out;            /* (nr, nc) */
    Py_ssize_t nb, nc, nr;
    int gemm;              /* activations in block_q8_Kx4 (the gemm's), else block_q8_K */
} RepackJob;

/* One weight block of 8 rows, decoded: the nibbles of sub-block 2sb + h of row r as
 * q[sb][h][r][32] (element 8k + e lies at qs[256 sb + 64 k + 8 r + e], low nibble for h = 0),
 * the rows' six-bit scales and mins by sub-block, d and dmin */
typedef struct {
    int8_t q[4][2][8][32];
    int32_t sc[8][8], mn[8][8];  /* [sub-block][row] */
    float d[8], dmin[8];
} WeightBlock;

INLINE void decode_block(const uint8_t *blk, WeightBlock *wb)
{
    for (int r = 0; r < 8; r++) {
        wb->d[r] = half_to_float(u16(blk + 2 * r));
        wb->dmin[r] = half_to_float(u16(blk + 16 + 2 * r));
    }
    for (int j = 0; j < 8; j++)
        for (int r = 0; r < 8; r++) {
            int sc, m;
            scale_min_k4(blk + 32 + 12 * j, r, &sc, &m);  /* rows packed as a Q4_K's sub-blocks */
            wb->sc[j][r] = sc;
            wb->mn[j][r] = m;
        }
    const uint8_t *qs = blk + 128;
    for (int sb = 0; sb < 4; sb++)
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < 8; r++)
                for (int e = 0; e < 8; e++) {
                    const uint8_t b = qs[256 * sb + 64 * k + 8 * r + e];
                    wb->q[sb][0][r][8 * k + e] = (int8_t)(b & 15);
                    wb->q[sb][1][r][8 * k + e] = (int8_t)(b >> 4);
                }
}

/* One activation row's block: d, the quants of each sub-block in order (32 a sub-block), and
 * the int16 sums (wrapping, as hadd_epi16) of the two bsums of each sub-block */
typedef struct {
    float d;
    int8_t q[8][32];
    int32_t bs[8];
} RowBlock;

INLINE int16_t i16_at(const uint8_t *p)
{
    int16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* row a's block b: a block_q8_K (gemv), or lane a % 4 of a block_q8_Kx4 (gemm) */
INLINE void row_block(const RepackJob *j, Py_ssize_t a, Py_ssize_t b, RowBlock *rb)
{
    if (!j->gemm) {
        const uint8_t *blk = j->y + (a * j->nb + b) * YB;
        memcpy(&rb->d, blk, 4);
        memcpy(rb->q, blk + 4, 256);
        for (int s = 0; s < 8; s++)
            rb->bs[s] = (int16_t)(i16_at(blk + 260 + 4 * s) + i16_at(blk + 262 + 4 * s));
        return;
    }
    const int l = (int)(a % 4);
    const uint8_t *blk = j->y + ((a / 4) * j->nb + b) * Y4B;
    memcpy(&rb->d, blk + 4 * l, 4);
    for (int jj = 0; jj < 32; jj++)  /* elements 8jj .. 8jj + 7 */
        memcpy(&rb->q[jj / 4][8 * (jj % 4)], blk + 16 + 32 * jj + 8 * l, 8);
    const uint8_t *bsums = blk + 16 + 1024;
    for (int s = 0; s < 8; s++) {
        const uint8_t *p = bsums + 2 * (16 * (s / 2) + 4 * l + 2 * (s % 2));
        rb->bs[s] = (int16_t)(i16_at(p) + i16_at(p + 2));
    }
}

/* the 8 rows' integer sums of sub-blocks 2sb and 2sb + 1: each sub-block's dot product times
 * its scale, and the mins times the activation's sums */
INLINE void pair_sums(const WeightBlock *wb, const RowBlock *rb, int sb, int32_t isum[8],
                      int32_t imin[8])
{
    for (int r = 0; r < 8; r++) {
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 32; i++) {
            lo += wb->q[sb][0][r][i] * rb->q[2 * sb][i];
            hi += wb->q[sb][1][r][i] * rb->q[2 * sb + 1][i];
        }
        isum[r] = wb->sc[2 * sb][r] * lo + wb->sc[2 * sb + 1][r] * hi;
        imin[r] = wb->mn[2 * sb][r] * rb->bs[2 * sb] + wb->mn[2 * sb + 1][r] * rb->bs[2 * sb + 1];
    }
}

/* weight rows 8g .. 8g + 7 against activation rows [a0, a0 + nt) */
INLINE void group_tile(const RepackJob *j, Py_ssize_t g, Py_ssize_t a0, int nt, WeightBlock *wb)
{
    float acc[TILE][8], accm[TILE][8];
    memset(acc, 0, sizeof acc);
    memset(accm, 0, sizeof accm);
    RowBlock rb;
    for (Py_ssize_t b = 0; b < j->nb; b++) {
        decode_block(j->w + (g * j->nb + b) * XB, wb);
        for (int t = 0; t < nt; t++) {
            row_block(j, a0 + t, b, &rb);
            float dd[8], dm[8];
            for (int r = 0; r < 8; r++) {
                dd[r] = wb->d[r] * rb.d;
                dm[r] = wb->dmin[r] * rb.d;
            }
            int32_t isum[8], imin[8], bsum[8] = {0}, bmin[8] = {0};
            for (int sb = 0; sb < 4; sb++) {
                pair_sums(wb, &rb, sb, isum, imin);
                if (j->gemm) {  /* one multiply-add per pair of sub-blocks */
                    for (int r = 0; r < 8; r++) {
                        acc[t][r] = fmaf((float)isum[r], dd[r], acc[t][r]);
                        accm[t][r] = fmaf((float)imin[r], dm[r], accm[t][r]);
                    }
                } else {
                    for (int r = 0; r < 8; r++) {
                        bsum[r] += isum[r];
                        bmin[r] += imin[r];
                    }
                }
            }
            if (!j->gemm)  /* one per super-block */
                for (int r = 0; r < 8; r++) {
                    acc[t][r] = fmaf((float)bsum[r], dd[r], acc[t][r]);
                    accm[t][r] = fmaf((float)bmin[r], dm[r], accm[t][r]);
                }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 8; r++)
            j->out[(a0 + t) * j->nc + 8 * g + r] = acc[t][r] - accm[t][r];
}

INLINE void groups(const RepackJob *j, Py_ssize_t g0, Py_ssize_t g1)
{
    WeightBlock wb;
    for (Py_ssize_t g = g0; g < g1; g++)
        for (Py_ssize_t a0 = 0; a0 < j->nr; a0 += TILE)
            group_tile(j, g, a0, (int)(j->nr - a0 < TILE ? j->nr - a0 : TILE), &wb);
}

static void groups_plain(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    (void)worker;
    groups(ctx, a, b);
}

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#define AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The same with AVX2 instructions (the same bits: the integer sums are exact either way, and
 * _mm256_fmadd_ps is fmaf lane by lane). A 32-byte load of the quants holds 4 rows' same 8 bytes;
 * maddubs multiplies their nibbles (unsigned, < 16: no saturation) with the activation's 8 bytes
 * repeated 4 times, and the 16-bit sums of 4 such steps (8 products a lane) are widened by a
 * madd with the rows' scales; hadd then gives the 8 rows' sums as lanes 0 1 4 5 2 3 6 7 (it
 * works within halves), so the mins, d and the accumulators are kept in that order (ORDER) and
 * the results put back as they are stored. */
static const int ORDER[8] = {0, 1, 4, 5, 2, 3, 6, 7};  /* (its own inverse) */

typedef struct {
    __m256i sc[8][2];           /* sub-block j's scales as 16-bit words, each row's 4 times:
                                 * rows 0-3 ([j][0]) and 4-7 ([j][1]), as the quants lie */
    __m256i mn[4];              /* the mins of sub-blocks 2sb and 2sb + 1 as 16-bit pairs, by
                                 * row, lanes in ORDER */
    __m256 d, dmin;             /* lanes in ORDER */
} WeightScales;

typedef struct {
    __m256i q[4][2][4][2];      /* [sb][low, high nibbles][k][rows 0-3, 4-7] */
    WeightScales s;
} WeightVecs;

/* a weight block's d, dmin, scales and mins */
AVX2 void decode_scales(const uint8_t *blk, WeightScales *wv)
{
    const __m256i order = _mm256_setr_epi32(ORDER[0], ORDER[1], ORDER[2], ORDER[3], ORDER[4],
                                            ORDER[5], ORDER[6], ORDER[7]);
    /* the halves by F16C (exact, as half_to_float) */
    wv->d = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)), order);
    wv->dmin = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))),
                                        order);
    /* get_scale_min_k4 of the 8 rows and the 8 sub-blocks at once. Sub-block j's 12 bytes are
     * three words u0 u1 u2 (at 12j): rows 0-3's scales are the low 6 bits of u0's bytes, rows
     * 4-7's the low nibbles of u2's with the top 2 bits of u0's; the mins likewise from u1 and
     * u2's high nibbles. U0, U1, U2 hold the 8 sub-blocks' u0, u1, u2 (lane j), gathered from the
     * 96 bytes by permutes and blends. */
    const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 32));
    const __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 64));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(blk + 96));
#define WORDS(i0, i1, i2, i3, i4, i5, i6, i7) _mm256_setr_epi32(i0, i1, i2, i3, i4, i5, i6, i7)
    const __m256i u0 = _mm256_blend_epi32(
        _mm256_blend_epi32(_mm256_permutevar8x32_epi32(a, WORDS(0, 3, 6, 0, 0, 0, 0, 0)),
                           _mm256_permutevar8x32_epi32(b, WORDS(0, 0, 0, 1, 4, 7, 0, 0)), 0x38),
        _mm256_permutevar8x32_epi32(c, WORDS(0, 0, 0, 0, 0, 0, 2, 5)), 0xC0);
    const __m256i u1 = _mm256_blend_epi32(
        _mm256_blend_epi32(_mm256_permutevar8x32_epi32(a, WORDS(1, 4, 7, 0, 0, 0, 0, 0)),
                           _mm256_permutevar8x32_epi32(b, WORDS(0, 0, 0, 2, 5, 0, 0, 0)), 0x18),
        _mm256_permutevar8x32_epi32(c, WORDS(0, 0, 0, 0, 0, 0, 3, 6)), 0xE0);
    const __m256i u2 = _mm256_blend_epi32(
        _mm256_blend_epi32(_mm256_permutevar8x32_epi32(a, WORDS(2, 5, 0, 0, 0, 0, 0, 0)),
                           _mm256_permutevar8x32_epi32(b, WORDS(0, 0, 0, 3, 6, 0, 0, 0)), 0x1C),
        _mm256_permutevar8x32_epi32(c, WORDS(0, 0, 0, 0, 0, 1, 4, 7)), 0xE0);
    const __m256i six = _mm256_set1_epi8(0x3F), four = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    const __m256i s0 = _mm256_and_si256(u0, six), m0 = _mm256_and_si256(u1, six);
    const __m256i s1 = _mm256_or_si256(_mm256_and_si256(u2, four),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), two), 4));
    const __m256i m1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), four),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), two), 4));
    /* sc[j][h]: lane j of s0 (h = 0) or s1, its 4 bytes as 16-bit words, each 4 times */
    const __m256i rep = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1,
                                         2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
    for (int j = 0; j < 8; j++) {
        const __m256i lane = _mm256_set1_epi32(j);
        wv->sc[j][0] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(s0, lane), rep);
        wv->sc[j][1] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(s1, lane), rep);
    }
    /* mn[sb]: 16 bytes [sub-block 2sb's mins of rows 0-3, 2sb + 1's, 2sb's of rows 4-7,
     * 2sb + 1's] in both halves (the 64-bit unpacks give them: sb 0 and 2 from lo, 1 and 3 from
     * hi), then each row's two as a 16-bit pair, lanes in ORDER */
    const __m256i lo = _mm256_unpacklo_epi64(m0, m1), hi = _mm256_unpackhi_epi64(m0, m1);
    const __m256i pair = _mm256_setr_epi8(0, -1, 4, -1, 1, -1, 5, -1, 8, -1, 12, -1, 9, -1, 13, -1,
                                          2, -1, 6, -1, 3, -1, 7, -1, 10, -1, 14, -1, 11, -1, 15, -1);
    wv->mn[0] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(lo, lo, 0x00), pair);
    wv->mn[1] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(hi, hi, 0x00), pair);
    wv->mn[2] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(lo, lo, 0x11), pair);
    wv->mn[3] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(hi, hi, 0x11), pair);
#undef WORDS
}

/* a weight block's quants as nibbles, and its scales */
AVX2 void decode_vecs(const uint8_t *blk, WeightVecs *wv)
{
    decode_scales(blk, &wv->s);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int sb = 0; sb < 4; sb++)
        for (int k = 0; k < 4; k++)
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 128 + 256 * sb + 64 * k + 32 * h));
                wv->q[sb][0][k][h] = _mm256_and_si256(v, m4);
                wv->q[sb][1][k][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
}

/* the 8 rows' dot products (lanes in ORDER) of one sub-block's nibbles q[k][h] with the
 * activation's 32 quants, 8 at a (k * step), times the rows' scales sc[h] (madd widens the 16-bit
 * lane sums and multiplies them at once) */
AVX2 __m256i sub_block_dots(const __m256i q[4][2], const __m256i sc[2], const uint8_t *a,
                            Py_ssize_t step)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        long long run;
        memcpy(&run, a + k * step, 8);
        const __m256i y = _mm256_set1_epi64x(run);
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(q[k][0], y));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(q[k][1], y));
    }
    return _mm256_hadd_epi32(_mm256_madd_epi16(s0, sc[0]), _mm256_madd_epi16(s1, sc[1]));
}

/* the gemm's tile: weight rows 8g .. 8g + 7 against activation rows [a0, a0 + nt) of
 * block_q8_Kx4, each weight block decoded once for the tile */
AVX2 void group_tile_vecs(const RepackJob *j, Py_ssize_t g, Py_ssize_t a0, int nt, WeightVecs *wv)
{
    __m256 acc[TILE], accm[TILE];
    for (int t = 0; t < nt; t++)
        acc[t] = accm[t] = _mm256_setzero_ps();
    for (Py_ssize_t b = 0; b < j->nb; b++) {
        decode_vecs(j->w + (g * j->nb + b) * XB, wv);
        for (int t = 0; t < nt; t++) {
            const Py_ssize_t a = a0 + t;
            /* the activation's sub-block s: 4 runs of 8 quants at qs + s * 128, 32 apart */
            const int l = (int)(a % 4);
            const uint8_t *blk = j->y + ((a / 4) * j->nb + b) * Y4B, *qs = blk + 16 + 8 * l;
            float yd;
            memcpy(&yd, blk + 4 * l, 4);
            int32_t bs[8];
            for (int s = 0; s < 8; s++) {
                const uint8_t *p = blk + 16 + 1024 + 2 * (16 * (s / 2) + 4 * l + 2 * (s % 2));
                bs[s] = (int16_t)(i16_at(p) + i16_at(p + 2));
            }
            const __m256 ydv = _mm256_set1_ps(yd);
            const __m256 dd = _mm256_mul_ps(wv->s.d, ydv), dm = _mm256_mul_ps(wv->s.dmin, ydv);
            for (int sb = 0; sb < 4; sb++) {  /* one multiply-add per pair of sub-blocks */
                const __m256i isum = _mm256_add_epi32(
                    sub_block_dots(wv->q[sb][0], wv->s.sc[2 * sb], qs + 2 * sb * 128, 32),
                    sub_block_dots(wv->q[sb][1], wv->s.sc[2 * sb + 1], qs + (2 * sb + 1) * 128, 32));
                const __m256i imin = _mm256_madd_epi16(wv->s.mn[sb], _mm256_set1_epi32(
                    (int)((uint32_t)(uint16_t)bs[2 * sb] | (uint32_t)(uint16_t)bs[2 * sb + 1] << 16)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[t]);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dm, accm[t]);
            }
        }
    }
    const __m256i back = _mm256_setr_epi32(ORDER[0], ORDER[1], ORDER[2], ORDER[3], ORDER[4], ORDER[5],
                                           ORDER[6], ORDER[7]);
    for (int t = 0; t < nt; t++)
        _mm256_storeu_ps(j->out + (a0 + t) * j->nc + 8 * g,
                         _mm256_permutevar8x32_ps(_mm256_sub_ps(acc[t], accm[t]), back));
}

/* the int16 sums of a block_q8_K's bsums, sub-blocks 2sb and 2sb + 1, as one 32-bit pair */
AVX2 __m256i bsum_pair(const uint8_t *blk, int sb)
{
    const int16_t lo = (int16_t)(i16_at(blk + 260 + 8 * sb) + i16_at(blk + 262 + 8 * sb));
    const int16_t hi = (int16_t)(i16_at(blk + 264 + 8 * sb) + i16_at(blk + 266 + 8 * sb));
    return _mm256_set1_epi32((int)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16));
}

/* the gemv: weight rows 8g .. 8g + 7 against activation row a of plain block_q8_K, one
 * multiply-add per super-block; the nibbles taken from each load as it is used (a block is read
 * once a row) */
AVX2 void gemv_group_vecs(const RepackJob *j, Py_ssize_t g, Py_ssize_t a)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    WeightScales ws;
    for (Py_ssize_t b = 0; b < j->nb; b++) {
        const uint8_t *w = j->w + (g * j->nb + b) * XB, *y = j->y + (a * j->nb + b) * YB;
        for (int c = 0; c < XB; c += 64)  /* two blocks ahead (a hint: past the end, no fault) */
            _mm_prefetch((const char *)((uintptr_t)w + 2 * XB + c), _MM_HINT_T0);
        decode_scales(w, &ws);
        float yd;
        memcpy(&yd, y, 4);
        const __m256 ydv = _mm256_set1_ps(yd);
        const __m256 dd = _mm256_mul_ps(ws.d, ydv), dm = _mm256_mul_ps(ws.dmin, ydv);
        __m256i bsum = _mm256_setzero_si256(), bmin = _mm256_setzero_si256();
        for (int sb = 0; sb < 4; sb++) {
            __m256i lo0 = _mm256_setzero_si256(), lo1 = lo0, hi0 = lo0, hi1 = lo0;
            const uint8_t *qs = w + 128 + 256 * sb, *ys = y + 4 + 64 * sb;
            for (int k = 0; k < 4; k++) {
                long long ylo, yhi;
                memcpy(&ylo, ys + 8 * k, 8);
                memcpy(&yhi, ys + 32 + 8 * k, 8);
                const __m256i yl = _mm256_set1_epi64x(ylo), yh = _mm256_set1_epi64x(yhi);
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * k));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * k + 32));
                lo0 = _mm256_add_epi16(lo0, _mm256_maddubs_epi16(_mm256_and_si256(v0, m4), yl));
                lo1 = _mm256_add_epi16(lo1, _mm256_maddubs_epi16(_mm256_and_si256(v1, m4), yl));
                hi0 = _mm256_add_epi16(hi0, _mm256_maddubs_epi16(
                                                _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), yh));
                hi1 = _mm256_add_epi16(hi1, _mm256_maddubs_epi16(
                                                _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), yh));
            }
            const __m256i lo = _mm256_hadd_epi32(_mm256_madd_epi16(lo0, ws.sc[2 * sb][0]),
                                                 _mm256_madd_epi16(lo1, ws.sc[2 * sb][1]));
            const __m256i hi = _mm256_hadd_epi32(_mm256_madd_epi16(hi0, ws.sc[2 * sb + 1][0]),
                                                 _mm256_madd_epi16(hi1, ws.sc[2 * sb + 1][1]));
            bsum = _mm256_add_epi32(bsum, _mm256_add_epi32(lo, hi));
            bmin = _mm256_add_epi32(bmin, _mm256_madd_epi16(ws.mn[sb], bsum_pair(y, sb)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bsum), dd, acc);
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bmin), dm, accm);
    }
    const __m256i back = _mm256_setr_epi32(ORDER[0], ORDER[1], ORDER[2], ORDER[3], ORDER[4], ORDER[5],
                                           ORDER[6], ORDER[7]);
    _mm256_storeu_ps(j->out + a * j->nc + 8 * g, _mm256_permutevar8x32_ps(_mm256_sub_ps(acc, accm), back));
}

__attribute__((target("avx2,fma,f16c"))) static void groups_fma(void *ctx, int worker, Py_ssize_t a,
                                                             Py_ssize_t b)
{
    (void)worker;
    const RepackJob *j = ctx;
    WeightVecs wv;
    if (!j->gemm) {
        for (Py_ssize_t g = a; g < b; g++)
            for (Py_ssize_t r = 0; r < j->nr; r++)
                gemv_group_vecs(j, g, r);
        return;
    }
    for (Py_ssize_t g = a; g < b; g++)
        for (Py_ssize_t a0 = 0; a0 < j->nr; a0 += TILE)
            group_tile_vecs(j, g, a0, (int)(j->nr - a0 < TILE ? j->nr - a0 : TILE), &wv);
}
#endif

static PyObject *run_product(PyObject *args, int gemm)
{
    Py_buffer w, y, out;
    Py_ssize_t n, nr, nc;
    int portable = 0, threads = 1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnn|ii", &w, &y, &out, &n, &nr, &nc, &portable, &threads))
        return NULL;
    const Py_ssize_t nb = n / QK;
    int ok = n > 0 && n % QK == 0 && nc >= 0 && nc % 8 == 0 && nr >= 0 && (!gemm || nr % 4 == 0) &&
             lanes_check(&w, nc / 8 * nb * XB, "w") == 0 &&
             lanes_check(&y, nr * nb * YB, "y") == 0 &&  /* (4 rows of block_q8_Kx4: 4 * YB) */
             lanes_check(&out, nr * nc * 4, "out") == 0;
    if (ok) {
        RepackJob job = {w.buf, y.buf, out.buf, nb, nc, nr, gemm};
        const Py_ssize_t units = nc / 8;
        Py_ssize_t parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
        while (parts > 1 && (units < parts || units * 8 * nr * n / parts < LANES_SPLIT_MACS))
            parts--;
        const Py_ssize_t chunk = parts > 1 ? (units + 4 * parts - 1) / (4 * parts) : units;
        lanes_rows_fn fn = groups_plain;
#ifdef HAVE_FMA_TARGET
        if (!portable && fma_hw())
            fn = groups_fma;
#endif
        Py_BEGIN_ALLOW_THREADS
        lanes_pool_run(fn, &job, units, chunk, (int)parts);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes for a q4_K_8x8 product");
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&y);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

LANES_HIDDEN PyObject *lanes_gemv_q4_k_8x8(PyObject *self, PyObject *args)
{
    (void)self;
    return run_product(args, 0);
}

LANES_HIDDEN PyObject *lanes_gemm_q4_k_8x8(PyObject *self, PyObject *args)
{
    (void)self;
    return run_product(args, 1);
}

/* --- repack_q4_K_to_q4_K_8_bl: plain Q4_K rows -> block_q4_Kx8 -------------------------------
 * Each group of 8 rows, block column b: the 8 rows' d and dmin in row order; for each sub-block j,
 * the 8 rows' six-bit scale and min of j packed as one Q4_K block packs its 8 sub-blocks' (rows in
 * place of sub-blocks); the quant bytes 8 at a time, row 0..7, 16 rounds. */

static void scale_min_of(const uint8_t *q, int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void pack_q4_k_group(const uint8_t *src, size_t row_bytes, size_t nb, uint8_t *dst)
{
    for (size_t b = 0; b < nb; b++) {
        uint8_t *o = dst + b * 1152;
        uint8_t sc[8][8], mn[8][8]; /* [row][sub-block] */
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = src + r * row_bytes + b * 144;
            memcpy(o + 2 * r, blk, 2);          /* d */
            memcpy(o + 16 + 2 * r, blk + 2, 2); /* dmin */
            for (int j = 0; j < 8; j++)
                scale_min_of(blk + 4, j, &sc[r][j], &mn[r][j]);
            for (int i = 0; i < 16; i++)
                memcpy(o + 128 + (i * 8 + r) * 8, blk + 16 + 8 * i, 8);
        }
        for (int j = 0; j < 8; j++) {
            uint8_t *s = o + 32 + 12 * j;
            for (int r = 0; r < 4; r++) {
                s[r] = (uint8_t)((sc[r][j] & 63) | ((sc[r + 4][j] >> 4) << 6));
                s[r + 4] = (uint8_t)((mn[r][j] & 63) | ((mn[r + 4][j] >> 4) << 6));
                s[r + 8] = (uint8_t)((sc[r + 4][j] & 15) | ((mn[r + 4][j] & 15) << 4));
            }
        }
    }
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    Py_ssize_t row_bytes;
} PackJob;

/* groups [a, b) of 8 rows (each its own bytes: the pool's threads share them out) */
static void pack_groups(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    (void)worker;
    const PackJob *j = ctx;
    for (Py_ssize_t g = a; g < b; g++)
        pack_q4_k_group(j->src + g * 8 * j->row_bytes, (size_t)j->row_bytes, (size_t)j->row_bytes / 144,
                        j->dst + g * 8 * j->row_bytes);
}

LANES_HIDDEN PyObject *lanes_pack_q4_k_8x8(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer src, dst;
    Py_ssize_t nrows, row_bytes;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*nn|i", &src, &dst, &nrows, &row_bytes, &threads))
        return NULL;
    int ok = nrows >= 0 && nrows % 8 == 0 && row_bytes > 0 && row_bytes % 144 == 0
        && src.len >= nrows * row_bytes && dst.len >= nrows * row_bytes;
    if (ok) {
        PackJob job = {src.buf, dst.buf, row_bytes};
        const Py_ssize_t groups = nrows / 8;
        int parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
        if (groups * 8 * row_bytes < (1 << 20))  /* (a small tensor: one thread) */
            parts = 1;
        Py_BEGIN_ALLOW_THREADS
        lanes_pool_run(pack_groups, &job, groups, parts > 1 ? (groups + 4 * parts - 1) / (4 * parts) : groups,
                       parts);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad sizes for a q4_K_8x8 pack");
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}
