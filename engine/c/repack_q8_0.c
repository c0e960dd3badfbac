/* engine._lanes (c/lanes.c): the products of ggml-cpu's repacked 4-bit layouts q4_0_8x8,
 * iq4_nl_8x8 and mxfp4_8x8 (CPU_REPACK, engine/quants/repack_legacy.py) with Q8_0 activations:
 * ggml_gemv_<type>_8x8_q8_0 (plain Q8_0 activation rows) and ggml_gemm_<type>_8x8_q8_0
 * (block_q8_0x4: 4 rows interleaved 8 bytes at a time), as arch/x86/repack.cpp's AVX2 loops
 * compute them (gemv_q4_b32_8x8_q8_0_lut_avx and gemm_q4_b32_8x8_q8_0_lut_avx), in portable C
 * and with AVX2 intrinsics (the same bits).
 *
 * Every output (activation row r, weight row c) is one chain of fused multiply-adds over the
 * row's blocks, in order: acc = fmaf((float)isum_b, d_w[c] * d_a[r], acc), where isum_b is the
 * block's 32 products of weight values (the nibbles through the type's table: Q4_0's signed
 * nibbles, kvalues_iq4nl, kvalues_mxfp4) and activation bytes, an exact 32-bit integer (so the
 * order of its terms is free), d_w the weight block's half (MXFP4: 2^(e - 128), its E8M0 exponent
 * halved as its doubled table needs) and d_a the activation block's half. No horizontal sum: each
 * of the 8 lanes of ggml's accumulator is one weight row. The one difference between the two
 * loops is how a product is formed: gemv makes maddubs(|w|, sign(a, w)), where a = -128 against
 * w < 0 counts as +128 (the int8 negation wraps: the product is -128 * |w|), gemm makes
 * maddubs(|a|, sign(w, a)), always the true a * w (no weight value is -128).
 *
 * The column groups (8 weight rows) are shared out between the pool's threads (c/pool.c);
 * each output is its own chain, so the split changes no bit, as ggml's chunks change none. */
#include "lanes.h"

enum { GROUP = 8, QS = 128, ACT_BYTES = 34, ACT4_BYTES = 136, ROW_TILE = 16 };

/* each type's 16 nibble values: Q4_0's stored nibbles are q ^ 8 (repack's XOR 0x88), read as
 * signed 4-bit numbers; IQ4_NL's and MXFP4's index ggml's tables */
static const int8_t Q4_0_SIGNED[16] = {0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1};
static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

INLINE const int8_t *nibble_values(int type)
{
    return type == Q4_0 ? Q4_0_SIGNED : type == IQ4_NL ? IQ4_NL_VALUES : MXFP4_VALUES;
}

INLINE Py_ssize_t scale_bytes(int type) { return type == MXFP4 ? 1 : 2; }

/* the bytes of one interleaved block (8 scales, 128 quant bytes) */
INLINE Py_ssize_t x8_bytes(int type) { return GROUP * scale_bytes(type) + QS; }

/* ggml_e8m0_to_fp32_half: 2^(e - 128), subnormal for e < 2 */
INLINE float e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* the 8 weight rows' scales of an interleaved block */
INLINE void column_scales(int type, const uint8_t *blk, float *dw)
{
    for (int c = 0; c < GROUP; c++)
        dw[c] = type == MXFP4 ? e8m0_half(blk[c]) : half_to_float(u16(blk + 2 * c));
}

/* activation row r's block b: its half scale (*d) and its quants, element e at
 * p[stride * (e / 8) + e % 8]: gemv's plain Q8_0 rows (stride 8), gemm's block_q8_0x4 (row r % 4
 * of group r / 4, its 8-byte runs 32 bytes apart) */
INLINE const uint8_t *activation(int gemm, const uint8_t *x, Py_ssize_t nb, Py_ssize_t r,
                                 Py_ssize_t b, const uint8_t **d)
{
    if (gemm) {
        const uint8_t *blk = x + ((r / 4) * nb + b) * ACT4_BYTES;
        *d = blk + 2 * (r % 4);
        return blk + 8 + 8 * (r % 4);
    }
    const uint8_t *blk = x + (r * nb + b) * ACT_BYTES;
    *d = blk;
    return blk + 2;
}

/* the arguments every loop takes: nb blocks a row; the packed weights w from the first column
 * group of the share; activation rows [0, nr) of x; out (nr rows of ldo floats) from the share's
 * first column; groups: the share's column groups */
#define LOOP_ARGS int type, int gemm, const uint8_t *w, const uint8_t *x, float *out, \
                  Py_ssize_t ldo, Py_ssize_t nb, Py_ssize_t nr, Py_ssize_t groups

/* The portable loop: a block's 8 x 32 weight values decoded once for a tile of activation rows,
 * each (row, column) sum a plain loop over 16-bit integers (which -O3 vectorises), then its
 * fmaf. gemv's wrapped products are put right afterwards, where a row's block has a -128. */
INLINE void decode_x8(int type, const uint8_t *blk, int16_t q[GROUP][32])
{
    const int8_t *v = nibble_values(type);
    const uint8_t *qs = blk + GROUP * scale_bytes(type);
    for (int c = 0; c < GROUP; c++)
        for (int j = 0; j < 16; j++) {  /* byte j of row c: 8 bytes of each row in turn */
            const uint8_t byte = qs[64 * (j / 8) + 8 * c + j % 8];
            q[c][j] = v[byte & 0x0F];
            q[c][j + 16] = v[byte >> 4];
        }
}

INLINE int32_t dot32(const int16_t *q, const int16_t *a)
{
    int32_t s = 0;
    for (int e = 0; e < 32; e++)
        s += (int32_t)q[e] * a[e];
    return s;
}

static void rows_portable(LOOP_ARGS)
{
    const Py_ssize_t bsize = x8_bytes(type), stride = gemm ? 32 : 8;
    int16_t q[GROUP][32], a[32];
    float dw[GROUP], acc[ROW_TILE][GROUP];
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + g * nb * bsize;
        for (Py_ssize_t r0 = 0; r0 < nr; r0 += ROW_TILE) {
            const Py_ssize_t rt = nr - r0 < ROW_TILE ? nr - r0 : ROW_TILE;
            memset(acc, 0, sizeof acc);
            for (Py_ssize_t b = 0; b < nb; b++) {
                decode_x8(type, wg + b * bsize, q);
                column_scales(type, wg + b * bsize, dw);
                for (Py_ssize_t r = 0; r < rt; r++) {
                    const uint8_t *dp;
                    const int8_t *p = (const int8_t *)activation(gemm, x, nb, r0 + r, b, &dp);
                    int wraps = 0;
                    for (int e = 0; e < 32; e++) {
                        a[e] = p[stride * (e / 8) + e % 8];
                        wraps |= a[e] == -128;
                    }
                    const float da = half_to_float(u16(dp));
                    for (int c = 0; c < GROUP; c++) {
                        int32_t s = dot32(q[c], a);
                        if (!gemm && wraps)  /* sign(a, w) leaves -128 where w < 0: -128 * |w| */
                            for (int e = 0; e < 32; e++)
                                s += a[e] == -128 && q[c][e] < 0 ? 256 * q[c][e] : 0;
                        acc[r][c] = fmaf((float)s, dw[c] * da, acc[r][c]);
                    }
                }
            }
            for (Py_ssize_t r = 0; r < rt; r++)
                memcpy(out + (r0 + r) * ldo + g * GROUP, acc[r], sizeof acc[r]);
        }
    }
}

#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#define AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The AVX2 loop. A block's 128 quant bytes are 4 loads of 32: rows 0-3 bytes 0-7, rows 4-7
 * bytes 0-7, rows 0-3 bytes 8-15, rows 4-7 bytes 8-15. Their low nibbles are elements 0-7 (the
 * first two) and 8-15 (the last two), their high nibbles elements 16-23 and 24-31, each through
 * the type's table by one shuffle: wv[k] (rows 0-3) and wv[4 + k] (rows 4-7) meet activation
 * elements 8k .. 8k+7, broadcast to the 4 rows' 8-byte runs. madd with ones leaves each row two
 * 32-bit halves; hadd joins them, the rows coming out as lanes 0 1 4 5 2 3 6 7 (hadd works within
 * 128-bit halves), which the scales follow and the store undoes (the order is its own inverse). */
AVX2 void decode_x8_avx2(int type, const uint8_t *qs, __m256i lut, __m256i *wv)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    (void)type;
    for (int h = 0; h < 2; h++) {  /* rows 0-3, then 4-7 */
        const __m256i lo = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(qs + 64 + 32 * h));
        wv[4 * h + 0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(lo, m4));
        wv[4 * h + 1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(hi, m4));
        wv[4 * h + 2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4));
        wv[4 * h + 3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4));
    }
}

/* the 8 rows' block sums (lanes 0 1 4 5 2 3 6 7) of weights wv (|wv| in aw) and the activation
 * run p (element e at p[stride * (e / 8) + e % 8]) */
AVX2 __m256i block_sums(int gemm, const __m256i *wv, const __m256i *aw, const uint8_t *p,
                        Py_ssize_t stride)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int k = 0; k < 4; k++) {
        int64_t run;
        memcpy(&run, p + stride * k, 8);
        const __m256i a = _mm256_set1_epi64x(run);
        const __m256i aa = gemm ? _mm256_sign_epi8(a, a) : a;
        for (int h = 0; h < 2; h++) {
            const __m256i wk = wv[4 * h + k];
            const __m256i pairs =
                gemm ? _mm256_maddubs_epi16(aa, _mm256_sign_epi8(wk, a))
                     : _mm256_maddubs_epi16(aw[4 * h + k], _mm256_sign_epi8(a, wk));
            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(pairs, ones));
        }
    }
    return _mm256_hadd_epi32(s[0], s[1]);
}

AVX2 void rows_avx2_body(LOOP_ARGS)
{
    const Py_ssize_t bsize = x8_bytes(type), stride = gemm ? 32 : 8;
    const __m256i lut =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nibble_values(type)));
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    __m256i wv[GROUP], aw[GROUP];
    __m256 acc[ROW_TILE];
    for (Py_ssize_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + g * nb * bsize;
        for (Py_ssize_t r0 = 0; r0 < nr; r0 += ROW_TILE) {
            const Py_ssize_t rt = nr - r0 < ROW_TILE ? nr - r0 : ROW_TILE;
            for (Py_ssize_t r = 0; r < rt; r++)
                acc[r] = _mm256_setzero_ps();
            for (Py_ssize_t b = 0; b < nb; b++) {
                const uint8_t *blk = wg + b * bsize;
                decode_x8_avx2(type, blk + GROUP * scale_bytes(type), lut, wv);
                if (!gemm)
                    for (int k = 0; k < GROUP; k++)
                        aw[k] = _mm256_sign_epi8(wv[k], wv[k]);
                float d[GROUP];
                if (type == MXFP4)
                    for (int c = 0; c < GROUP; c++)
                        d[c] = e8m0_half(blk[c]);
                else
                    _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)));
                const __m256 dw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(d), order);
                for (Py_ssize_t r = 0; r < rt; r++) {
                    const uint8_t *dp;
                    const uint8_t *p = activation(gemm, x, nb, r0 + r, b, &dp);
                    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(u16(dp))));
                    const __m256i s = block_sums(gemm, wv, aw, p, stride);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r]);
                }
            }
            for (Py_ssize_t r = 0; r < rt; r++)
                _mm256_storeu_ps(out + (r0 + r) * ldo + g * GROUP,
                                 _mm256_permutevar8x32_ps(acc[r], order));
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void rows_avx2(LOOP_ARGS)
{
    /* a copy per type and loop, their constants folded in */
    if (gemm) {
        switch (type) {
        case Q4_0: rows_avx2_body(Q4_0, 1, w, x, out, ldo, nb, nr, groups); break;
        case IQ4_NL: rows_avx2_body(IQ4_NL, 1, w, x, out, ldo, nb, nr, groups); break;
        default: rows_avx2_body(MXFP4, 1, w, x, out, ldo, nb, nr, groups); break;
        }
    } else {
        switch (type) {
        case Q4_0: rows_avx2_body(Q4_0, 0, w, x, out, ldo, nb, nr, groups); break;
        case IQ4_NL: rows_avx2_body(IQ4_NL, 0, w, x, out, ldo, nb, nr, groups); break;
        default: rows_avx2_body(MXFP4, 0, w, x, out, ldo, nb, nr, groups); break;
        }
    }
}
#endif

/* a product's column groups shared out by the pool: groups [a, b) of every activation row */
typedef struct {
    int type, gemm, hw;
    const uint8_t *w, *x;
    float *out;
    Py_ssize_t nb, nr, nc;
} RepackJob;

static void repack_groups(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const RepackJob *j = ctx;
    (void)worker;
    const uint8_t *w = j->w + a * j->nb * x8_bytes(j->type);
    float *out = j->out + a * GROUP;
#ifdef HAVE_FMA_TARGET
    if (j->hw) {
        rows_avx2(j->type, j->gemm, w, j->x, out, j->nc, j->nb, j->nr, b - a);
        return;
    }
#endif
    rows_portable(j->type, j->gemm, w, j->x, out, j->nc, j->nb, j->nr, b - a);
}

/* gemv_q4_b32_8x8 and gemm_q4_b32_8x8: (type, w, x, out, n, nr, nc, portable=0, threads=1) */
static PyObject *repack_product(PyObject *args, int gemm)
{
    Py_buffer w, x, out;
    int type, portable = 0, threads = 1;
    Py_ssize_t n, nr, nc;
    if (!PyArg_ParseTuple(args, "iy*y*w*nnn|ii", &type, &w, &x, &out, &n, &nr, &nc, &portable,
                          &threads))
        return NULL;
    const Py_ssize_t nb = n / 32;
    int ok = (type == Q4_0 || type == IQ4_NL || type == MXFP4) && n >= 0 && n % 32 == 0 &&
             nr >= 0 && nc >= 0 && nc % GROUP == 0 && (!gemm || nr % 4 == 0);
    if (ok)
        ok = lanes_check(&w, nc * nb * (x8_bytes(type) / GROUP), "w") == 0 &&
             lanes_check(&x, nr * nb * ACT_BYTES, "x") == 0 &&
             lanes_check(&out, nr * nc * 4, "out") == 0;
    else
        PyErr_SetString(PyExc_ValueError, "_lanes: not Q4_0, IQ4_NL or MXFP4, or n not whole "
                        "blocks, nc not whole groups of 8, or (gemm) nr not whole groups of 4");
    if (ok) {
        const Py_ssize_t groups = nc / GROUP;
        Py_ssize_t parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
        while (parts > 1 && (groups < parts || groups * GROUP * nr * n / parts < LANES_SPLIT_MACS))
            parts--;
        const Py_ssize_t chunk = parts > 1 ? (groups + 4 * parts - 1) / (4 * parts) : groups;
        RepackJob job = {type, gemm, !portable && fma_hw(), w.buf, x.buf, out.buf, nb, nr, nc};
        Py_BEGIN_ALLOW_THREADS
        lanes_pool_run(repack_groups, &job, groups, chunk > 0 ? chunk : 1, (int)parts);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

LANES_HIDDEN PyObject *lanes_gemv_q4_b32_8x8(PyObject *self, PyObject *args)
{
    (void)self;
    return repack_product(args, 0);
}

LANES_HIDDEN PyObject *lanes_gemm_q4_b32_8x8(PyObject *self, PyObject *args)
{
    (void)self;
    return repack_product(args, 1);
}
