/* engine._lanes (c/lanes.c): ggml's quantized dot products (AVX2 builds) of raw weight blocks
 * with raw activation blocks, in portable C and with AVX2 intrinsics (the same bits), the weight
 * rows shared out between the pool's threads (c/pool.c).
 *
 * Each block's integers are decoded once per weight row and multiplied with each activation row
 * (n1 of them): lane l of a block sums the products of bytes 4l..4l+3 of every run of 32 elements
 * (exact 32-bit integers, so their order is free), then acc[l] = fmaf((float)lane, x.d * y.d,
 * acc[l]) block after block, and the row's result is hsum_float_8(acc):
 *   Q4_0  nibbles (low: elements 0-15, high: 16-31) minus 8, multiplied as ggml's
 *         mul_sum_i8_pairs_float does, |q| * sign(y, q): where q < 0 and y = -128 the product is
 *         q * 128 (the int8 negation wraps)
 *   Q5_0  nibbles plus 16 * their qh bit, minus 16, multiplied as Q4_0's
 *   Q8_0  the int8 quants, multiplied as Q4_0's
 *   Q4_1  the nibbles (unsigned); the offsets apart: summs = fmaf(x.m, y.s, summs), added to the
 *         result
 *   Q5_1  the nibbles plus 16 * their qh bit (unsigned); the offsets as Q4_1's
 *   Q2_K  16 sub-blocks of 16 2-bit quants (element 128c + 32k + l at bits 2k of qs[32c + l]),
 *         each times its 4-bit scale; the mins in 8 lanes of their own, lane l = m[2l] *
 *         bsums[2l] + m[2l+1] * bsums[2l+1], fma'd into the same accumulators first: acc[l] =
 *         fmaf(lane, -y.d * x.dmin, acc[l]), then the block's quants
 *   Q3_K  as Q2_K's quants, minus 4 where their hmask bit (bit r of hmask[l] for element 32r + l)
 *         is clear, times the six-bit scale (minus 32) of their 16; no mins
 *   Q4_K  8 runs of 32 (run 2j in the low nibbles of qs[32j..], 2j+1 in the high ones), each
 *         times its six-bit scale; the mins apart: 4 lanes, lane l = m[2l] * (bsums 4l, 4l+1) +
 *         m[2l+1] * (bsums 4l+2, 4l+3), acc_m[l] = fmaf(lane, -y.d * x.dmin, acc_m[l]), added
 *         to the result as (m0 + m2) + (m1 + m3)
 *   Q5_K  as Q4_K, the nibble of run r plus 16 * bit r of qh[e]; its 4 lanes of mins summed
 *         into one integer, summs = fmaf(it, -y.d * x.dmin, summs), added to the result
 *   Q6_K  the unsigned 6-bit values times the int8 scale of their 16, minus 32 * (bsums[2l] *
 *         sc[2l] + bsums[2l+1] * sc[2l+1]) in lane l
 *   IQ4_NL kvalues_iq4nl[nibble], multiplied as ggml's mul_add_epi8 does, |q| * sign(y, q):
 *         where q < 0 and y = -128 the product is q * 128 (the int8 negation wraps); the even
 *         blocks into one accumulator, the odd ones into a second, hsum_float_8(acc1 + acc2); a
 *         row's odd last block by ggml's scalar loop (the true products): fmaf(d, sum, result);
 *         with `tiny` (llamafile's tinyBLAS, which takes it in llama.cpp's build for 2 or more
 *         activation rows) one accumulator for every block, as the other types
 *   IQ4_XS 8 runs of 32 of IQ4_NL's values (run r: the nibbles of qs[16r..16r+15]), multiplied
 *         as IQ4_NL's, each run times its six-bit scale minus 32; one accumulator
 *   TQ2_0, TQ1_0, MXFP4 and IQ1_M: engine/c/tq.c
 * Activations are Q8_0 blocks (fp16 d, 32 int8) for Q4_0, Q5_0, Q8_0 and IQ4_NL, Q8_1 (fp16 d, fp16 s,
 * 32 int8) for Q4_1 and Q5_1, Q8_K (f32 d, 256 int8, 16 int16 block sums) for the K-quants.
 * The IQ grid types IQ3_XXS, IQ3_S and IQ2_S (Q8_K activations) are c/iq.c's.
 * With AVX2 and two or more activation rows, Q4_0, Q5_0 and Q8_0 go by tiles of 4 weight rows by
 * 3 activation rows, as llamafile's tinyBLAS multiplies: each block loaded (and unpacked) once
 * for the tile's outputs, each output still its own accumulator, block after block; with AVX-512
 * VNNI the lane sums by its byte dot product. One activation row (decoding) goes row by row: four
 * weight rows read side by side stream from memory at about half the speed of one (a 178 MB
 * Q8_0 head: 25 ms against 11 here), and there is nothing to reuse. */
#include "lanes.h"

/* by the type of a quant_dot type's activations (c/types.h): Q8_K's, Q8_1's */
#define K_QUANT(type) (lanes_vec_dot_type(type) == Q8_K)
#define OFFSET_QUANT(type) (lanes_vec_dot_type(type) == Q8_1)
#define ACC 20  /* floats of a row pair's accumulators in the portable loop */
enum { TILE_W = 4, TILE_X = 3 };  /* the AVX2 loop's tiles: weight rows by activation rows */

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1, 13, 25, 38, 53, 69, 89, 113};

/* ==== block sizes and the integer lanes ====================================================== */

/* bytes of a weight block of type (0: not a quant_dot type), and of its activation block */
INLINE Py_ssize_t weight_size(int type)
{
    return lanes_vec_dot_type(type) < 0 ? 0 : lanes_block_bytes(type);
}

INLINE Py_ssize_t activation_size(int type) { return lanes_block_bytes(lanes_vec_dot_type(type)); }

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

/* the signed types' lanes (Q4_0, Q5_0, Q8_0, the IQ4 types): q times y as _mm256_sign_epi8 and
 * maddubs make them (y = -128 against q < 0 counts as +128), run r's times sc[r] */
INLINE void signed_lane_sums(const int16_t *q, const int16_t *sc, const int8_t *y, int runs,
                             int32_t *lane)
{
    int32_t s[32] = {0};
    for (int r = 0; r < runs; r++)
        for (int e = 0; e < 32; e++) {
            const int32_t v = q[32 * r + e], w = y[32 * r + e] == -128 && v < 0 ? 128 : y[32 * r + e];
            s[e] += sc[r] * v * w;
        }
    for (int l = 0; l < 8; l++)
        lane[l] = (s[4 * l] + s[4 * l + 1]) + (s[4 * l + 2] + s[4 * l + 3]);
}

static const int16_t ONE[1] = {1};  /* the legacy types' one run's scale */

/* the 16 six-bit scales of a Q3_K block, minus 32, from its 12 scale bytes (ggml's kmask1/2) */
INLINE void q3_k_scales(const uint8_t *s, int8_t *sc)
{
    uint32_t a[3], w[4];
    memcpy(a, s, 12);
    w[0] = (a[0] & 0x0F0F0F0F) | (((a[2] >> 0) & 0x03030303) << 4);
    w[1] = (a[1] & 0x0F0F0F0F) | (((a[2] >> 2) & 0x03030303) << 4);
    w[2] = ((a[0] >> 4) & 0x0F0F0F0F) | (((a[2] >> 4) & 0x03030303) << 4);
    w[3] = ((a[1] >> 4) & 0x0F0F0F0F) | (((a[2] >> 6) & 0x03030303) << 4);
    for (int j = 0; j < 16; j++)
        sc[j] = (int8_t)(((w[j / 4] >> (8 * (j % 4))) & 0xFF) - 32);
}

/* ==== each type's blocks decoded as vec_dot reads them ======================================= */

/* block b of a weight row decoded: its integers q (scales folded in), d, and for Q2_K, Q4_K and
 * Q5_K dmin and the mins, for Q4_1 and Q5_1 m (in dmin), for Q6_K the scales */
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
    case Q4_1:
    case Q5_1: {
        uint32_t qh = 0;
        const uint8_t *qs = blk + (type == Q5_1 ? 8 : 4);
        if (type == Q5_1)
            qh = (uint32_t)blk[4] | (uint32_t)blk[5] << 8 | (uint32_t)blk[6] << 16 |
                 (uint32_t)blk[7] << 24;
        for (int e = 0; e < 16; e++) {
            q[e] = (int16_t)((qs[e] & 0x0F) + 16 * (int)((qh >> e) & 1));
            q[e + 16] = (int16_t)((qs[e] >> 4) + 16 * (int)((qh >> (e + 16)) & 1));
        }
        *d = half_to_float(u16(blk));
        *dmin = half_to_float(u16(blk + 2));
        break;
    }
    case Q8_0: {
        const int8_t *qs = (const int8_t *)(blk + 2);
        for (int e = 0; e < 32; e++)
            q[e] = qs[e];
        *d = half_to_float(u16(blk));
        break;
    }
    case IQ4_NL: {
        const uint8_t *qs = blk + 2;
        for (int e = 0; e < 16; e++) {
            q[e] = kvalues_iq4nl[qs[e] & 0x0F];
            q[e + 16] = kvalues_iq4nl[qs[e] >> 4];
        }
        aux[0] = 1;
        *d = half_to_float(u16(blk));
        break;
    }
    case Q2_K: {
        const uint8_t *qs = blk + 16;
        for (int c = 0; c < 2; c++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    const int e = 128 * c + 32 * k + l;
                    q[e] = (int16_t)((blk[e / 16] & 0x0F) * ((qs[32 * c + l] >> (2 * k)) & 3));
                }
        for (int j = 0; j < 16; j++)
            aux[j] = (int16_t)(blk[j] >> 4);
        *d = half_to_float(u16(blk + 80));
        *dmin = half_to_float(u16(blk + 82));
        break;
    }
    case IQ4_XS: {
        const uint8_t *qs = blk + 8;
        const int sh = u16(blk + 2);
        for (int r = 0; r < 8; r++) {
            for (int e = 0; e < 16; e++) {
                q[32 * r + e] = kvalues_iq4nl[qs[16 * r + e] & 0x0F];
                q[32 * r + e + 16] = kvalues_iq4nl[qs[16 * r + e] >> 4];
            }
            aux[r] = (int16_t)((((blk[4 + r / 2] >> (4 * (r % 2))) & 0x0F) | (((sh >> (2 * r)) & 3) << 4)) - 32);
        }
        *d = half_to_float(u16(blk));
        break;
    }
    case Q3_K: {
        int8_t sc[16];
        q3_k_scales(blk + 96, sc);
        for (int c = 0; c < 2; c++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    const int e = 128 * c + 32 * k + l;
                    const int v = ((blk[32 + 32 * c + l] >> (2 * k)) & 3) - ((blk[l] >> (4 * c + k)) & 1 ? 0 : 4);
                    q[e] = (int16_t)(sc[e / 16] * v);
                }
        *d = half_to_float(u16(blk + 108));
        break;
    }
    case Q4_K:
    case Q5_K: {
        const uint8_t *qs = blk + (type == Q5_K ? 48 : 16), *qh = blk + 16;
        for (int j = 0; j < 8; j++) {
            int s, m;
            scale_min_k4(blk + 4, j, &s, &m);
            aux[j] = (int16_t)m;
            const uint8_t *run = qs + 32 * (j / 2);
            for (int e = 0; e < 32; e++) {
                int v = (j & 1) ? run[e] >> 4 : run[e] & 0x0F;
                if (type == Q5_K)
                    v += 16 * ((qh[e] >> j) & 1);
                q[32 * j + e] = (int16_t)(s * v);
            }
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

/* ==== quant_dot: vec_dot of whole tiles, in ggml's accumulation order ======================== */

/* out[i1 * ldo + i0] for weight rows i0 < n0 (row i0 at w + i0 * ldw) and activation
 * rows i1 < n1 (row i1 at x + i1 * ldx), nb blocks a row; acc: room for n1 * ACC floats */
INLINE void quant_dot_body(int type, int paired, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                           Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1,
                           Py_ssize_t nb, float *acc)
{
    const int k_quant = K_QUANT(type);
    const int runs = k_quant ? 8 : 1;
    const Py_ssize_t wsize = weight_size(type), ysize = activation_size(type);
    int16_t q[256], aux[16];
    int32_t lane[8];
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        memset(acc, 0, (size_t)n1 * ACC * sizeof(float));
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
                const int8_t *yq = (const int8_t *)(yb + (k_quant || OFFSET_QUANT(type) ? 4 : 2));
                float *a = acc + i1 * ACC;
                if (type == Q4_0 || type == Q5_0 || type == Q8_0) {
                    signed_lane_sums(q, ONE, yq, 1, lane);
                } else if (type == IQ4_NL) {
                    if (paired && b == nb - 1 && nb % 2) {  /* ggml's scalar loop: the true products */
                        int32_t s = 0;
                        for (int e = 0; e < 32; e++)
                            s += q[e] * yq[e];
                        a[16] = yd * xd;
                        a[17] = (float)s;
                        continue;
                    }
                    signed_lane_sums(q, aux, yq, 1, lane);
                    if (paired)
                        a += 8 * (b % 2);  /* the odd blocks' accumulators */
                } else if (type == IQ4_XS) {
                    signed_lane_sums(q, aux, yq, 8, lane);
                } else {
                    lane_sums(q, yq, runs, lane);
                }
                if (type == Q6_K)
                    for (int l = 0; l < 8; l++) {
                        const uint8_t *bs = yb + 260 + 4 * l;
                        const int32_t s0 = (int16_t)u16(bs), s1 = (int16_t)u16(bs + 2);
                        lane[l] -= 32 * (s0 * aux[2 * l] + s1 * aux[2 * l + 1]);
                    }
                if (type == Q2_K) {  /* the mins first, into the same accumulators */
                    const float mscale = -yd * xdmin;
                    for (int l = 0; l < 8; l++) {
                        const uint8_t *bs = yb + 260 + 4 * l;
                        const int32_t m = aux[2 * l] * (int16_t)u16(bs) + aux[2 * l + 1] * (int16_t)u16(bs + 2);
                        a[l] = fmaf((float)m, mscale, a[l]);
                    }
                }
                const float scale = yd * xd;
                for (int l = 0; l < 8; l++)
                    a[l] = fmaf((float)lane[l], scale, a[l]);
                if (type == Q4_K || type == Q5_K) {
                    const uint8_t *bs = yb + 260;
                    int16_t q8s[8];  /* hadd_epi16 of the block sums */
                    for (int h = 0; h < 8; h++)
                        q8s[h] = (int16_t)((int16_t)u16(bs + 4 * h) + (int16_t)u16(bs + 4 * h + 2));
                    const float mscale = -yd * xdmin;
                    int32_t s[4];
                    for (int l = 0; l < 4; l++)
                        s[l] = (int32_t)aux[2 * l] * q8s[2 * l] + (int32_t)aux[2 * l + 1] * q8s[2 * l + 1];
                    if (type == Q4_K)
                        for (int l = 0; l < 4; l++)
                            a[8 + l] = fmaf((float)s[l], mscale, a[8 + l]);
                    else
                        a[8] = fmaf((float)((s[0] + s[1]) + (s[2] + s[3])), mscale, a[8]);
                }
                if (OFFSET_QUANT(type))
                    a[8] = fmaf(xdmin, half_to_float(u16(yb + 2)), a[8]);
            }
        }
        for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
            float *a = acc + i1 * ACC;
            if (paired)
                for (int l = 0; l < 8; l++)
                    a[l] += a[8 + l];
            float r = hsum8(a);
            if (paired && nb % 2)
                r = fmaf(a[16], a[17], r);
            if (type == Q4_K)
                r += (a[8] + a[10]) + (a[9] + a[11]);
            else if (type == Q5_K || OFFSET_QUANT(type))
                r += a[8];
            out[i1 * ldo + i0] = r;
        }
    }
}

static void quant_dot(int type, int tiny, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                      Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1,
                      Py_ssize_t nb, float *acc)
{
    switch (type) {  /* one copy of the loop per type, its constants folded in */
    case IQ3_XXS: case IQ3_S: case IQ2_S: lanes_iq_dot(type, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q4_0: quant_dot_body(Q4_0, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q4_1: quant_dot_body(Q4_1, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q5_0: quant_dot_body(Q5_0, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q5_1: quant_dot_body(Q5_1, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q8_0: quant_dot_body(Q8_0, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case IQ4_NL:
        if (tiny)
            quant_dot_body(IQ4_NL, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc);
        else
            quant_dot_body(IQ4_NL, 1, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc);
        break;
    case Q2_K: quant_dot_body(Q2_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q3_K: quant_dot_body(Q3_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case IQ4_XS: quant_dot_body(IQ4_XS, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q4_K: quant_dot_body(Q4_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    case Q5_K: quant_dot_body(Q5_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    default: quant_dot_body(Q6_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb, acc); break;
    }
}
#ifdef HAVE_FMA_TARGET
#include <immintrin.h>
#define AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The same products with AVX2: the lane sums by vector integer instructions (exact, so equal
 * to the scalar ones: unsigned 4- and 6-bit weights by maddubs, which cannot saturate on them;
 * signed 8-bit ones widened to 16 bits first), the fma and the sums in the same order. For the
 * 32-element types the 8 lane sums come out as lanes 0 1 4 5 2 3 6 7 (hadd works within
 * halves); their accumulators stay in that order and are put back before the final sum. Q4_1's
 * and Q5_1's (unsigned) by maddubs and a madd with ones, in order. */
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

/* Q4_1's and Q5_1's 32 unsigned quants: the nibbles, Q5_1's plus 16 where their qh bit is set */
AVX2 __m256i offset_weights(int type, const uint8_t *blk)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i t = _mm_loadu_si128((const __m128i *)(blk + (type == Q5_1 ? 8 : 4)));
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(t, 4), m4), _mm_and_si128(t, m4));
    if (type == Q4_1)
        return nib;
    uint32_t qh;
    memcpy(&qh, blk + 4, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

/* lane l: the products of unsigned quants qx and activation bytes 4l..4l+3, in order */
AVX2 __m256i offset_lanes(__m256i qx, const uint8_t *yq)
{
    const __m256i p = _mm256_maddubs_epi16(qx, _mm256_loadu_si256((const __m256i *)yq));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* the IQ4 types' 32 non-linear values of a run (16 bytes of nibbles) times 32 activation bytes, as
 * ggml's mul_add_epi8: maddubs(|q|, sign(y, q)), 16 int16 pair sums */
AVX2 __m256i iq4_pairs(const uint8_t *qs, const uint8_t *yq)
{
    const __m128i values = _mm_loadu_si128((const __m128i *)kvalues_iq4nl), m4b = _mm_set1_epi8(0x0F);
    const __m128i bits = _mm_loadu_si128((const __m128i *)qs);
    const __m256i q = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4b)),
                                       _mm_shuffle_epi8(values, _mm_and_si128(bits, m4b)));
    const __m256i y = _mm256_loadu_si256((const __m256i *)yq);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
}

/* ggml_vec_dot_q2_K_q8_K's: the 2-bit quants by maddubs, each run's two halves times their
 * 4-bit scales by madd; its mins: madd of the 16 mins with the 16 block sums (8 lanes) */
AVX2 __m256i q2_k_lanes(const uint8_t *blk, const int8_t *yq)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));
        for (int k = 0; k < 4; k++) {
            const int sb = 8 * j + 2 * k;  /* the sub-blocks of run 4j + k's two halves */
            const __m256i p = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3),
                                                   _mm256_loadu_si256((const __m256i *)(yq + 128 * j + 32 * k)));
            const __m256i s = _mm256_set_m128i(_mm_set1_epi16(blk[sb + 1] & 0x0F), _mm_set1_epi16(blk[sb] & 0x0F));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s, p));
        }
    }
    return sum;
}

AVX2 __m256i q2_k_min_lanes(const uint8_t *blk, const uint8_t *bsums)
{
    const __m128i m = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)blk), 4), _mm_set1_epi8(0x0F));
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(m), _mm256_loadu_si256((const __m256i *)bsums));
}

/* ggml_vec_dot_q3_K_q8_K's: the low 2 bits by maddubs, less 4 (by maddubs too, in int16) where
 * the hmask bit is clear, each half-run times its scale by madd */
AVX2 __m256i q3_k_lanes(const uint8_t *blk, const int8_t *sc, const int8_t *yq)
{
    const __m256i m3 = _mm256_set1_epi8(3), mone = _mm256_set1_epi8(1);
    const __m256i hbits = _mm256_loadu_si256((const __m256i *)blk);
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * j));
        for (int k = 0; k < 4; k++) {
            const int bit = 4 * j + k, sb = 8 * j + 2 * k;
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
            const __m256i hi = _mm256_slli_epi16(
                _mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
            const __m256i y = _mm256_loadu_si256((const __m256i *)(yq + 128 * j + 32 * k));
            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, y), _mm256_maddubs_epi16(hi, y));
            const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[sb + 1]), _mm_set1_epi16(sc[sb]));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s, p));
        }
    }
    return sum;
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

AVX2 __m256i q5_k_lanes(const uint8_t *blk, const int16_t *sc, const int8_t *yq)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 16));
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * j));
        /* bit r of each qh byte, times 16 (the shifts cannot carry a bit into the next byte's) */
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4);
        const __m256i lo = _mm256_maddubs_epi16(_mm256_or_si256(_mm256_and_si256(bits, m4), h0),
                                                _mm256_loadu_si256((const __m256i *)(yq + 64 * j)));
        const __m256i hi = _mm256_maddubs_epi16(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1),
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

/* ==== llamafile's tinyBLAS tiles of the legacy types ========================================= */

/* The legacy types (Q4_0, Q5_0, Q8_0) a tile at a time, as llamafile's tinyBLAS multiplies (each
 * loaded block used for several outputs), each output's sum in the order of the loop below.
 * A block's lanes as ggml's mul_sum_i8_pairs_float makes them: maddubs(|q|, sign(y, q)), then
 * madd with ones, lane l the bytes 4l..4l+3 (exact but where y = -128 meets q < 0: the int8
 * negation wraps, so the product counts y as +128). */
AVX2 __m256i signed_lanes(__m256i aq, __m256i q, __m256i y)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(y, q)), _mm256_set1_epi16(1));
}

/* legacy_tile's lanes with AVX-512 VNNI's byte dot product: dpbusd sums the four products maddubs
 * and madd sum (maddubs cannot saturate here: |q| <= 128, and two products of at most 128 * 128) */
#define VNNI_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define VNNI static inline __attribute__((always_inline, target(VNNI_TARGET)))

VNNI __m256i vnni_lanes(__m256i aq, __m256i q, __m256i y)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(y, q));
}

/* out for weight rows [0, TILE_W) and activation rows [0, nx) (nx <= TILE_X, a constant where
 * it is inlined): per block each weight block's |q| made once and multiplied with every
 * activation block by LANES (signed_lanes, or vnni_lanes); acc = fma(y.d * x.d, lanes, acc),
 * then hsum8. One body for both, defined under each one's target. */
#define LEGACY_TILE(NAME, ATTR, LANES)                                                            \
    ATTR void NAME(int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx,  \
                   float *out, Py_ssize_t ldo, Py_ssize_t nb, const int nx)                      \
    {                                                                                             \
        __m256 acc[TILE_W][TILE_X];                                                               \
        for (int i = 0; i < TILE_W; i++)                                                          \
            for (int j = 0; j < nx; j++)                                                          \
                acc[i][j] = _mm256_setzero_ps();                                                  \
        for (Py_ssize_t b = 0; b < nb; b++) {                                                     \
            __m256i y[TILE_X];                                                                    \
            float yd[TILE_X];                                                                     \
            for (int j = 0; j < nx; j++) {                                                        \
                const uint8_t *yb = x + j * ldx + b * 34;                                         \
                y[j] = _mm256_loadu_si256((const __m256i *)(yb + 2));                             \
                yd[j] = half_f16c(yb);                                                            \
            }                                                                                     \
            for (int i = 0; i < TILE_W; i++) {                                                    \
                const uint8_t *blk = w + i * ldw + b * weight_size(type);                         \
                const __m256i q = legacy_weights(type, blk), aq = _mm256_sign_epi8(q, q);         \
                const float wd = half_f16c(blk);                                                  \
                _mm_prefetch((const char *)blk + TILE_W * ldw, _MM_HINT_T0); /* the next tile */ \
                for (int j = 0; j < nx; j++)                                                      \
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(yd[j] * wd),                       \
                                                _mm256_cvtepi32_ps(LANES(aq, q, y[j])), acc[i][j]); \
            }                                                                                     \
        }                                                                                         \
        for (int i = 0; i < TILE_W; i++)                                                          \
            for (int j = 0; j < nx; j++) {                                                        \
                float a[8];                                                                       \
                _mm256_storeu_ps(a, acc[i][j]);                                                   \
                out[j * ldo + i] = hsum8(a);                                                      \
            }                                                                                     \
    }

LEGACY_TILE(legacy_tile, AVX2, signed_lanes)
LEGACY_TILE(legacy_tile_vnni, VNNI, vnni_lanes)

/* weight rows [0, n0) (whole tiles) of a legacy type by every activation row, tile by tile; the
 * activation rows left over by a tile of fewer */
#define LEGACY_TILES(tile)                                                                        \
    for (Py_ssize_t i0 = 0; i0 < n0; i0 += TILE_W) {                                              \
        const uint8_t *wr = w + i0 * ldw;                                                         \
        Py_ssize_t i1 = 0;                                                                        \
        for (; i1 + TILE_X <= n1; i1 += TILE_X)                                                   \
            tile(type, wr, ldw, x + i1 * ldx, ldx, out + i1 * ldo + i0, ldo, nb, TILE_X);         \
        if (n1 - i1 == 2)                                                                         \
            tile(type, wr, ldw, x + i1 * ldx, ldx, out + i1 * ldo + i0, ldo, nb, 2);              \
        else if (n1 - i1 == 1)                                                                    \
            tile(type, wr, ldw, x + i1 * ldx, ldx, out + i1 * ldo + i0, ldo, nb, 1);              \
    }

#define TILES_ARGS int type, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx, \
                   float *out, Py_ssize_t ldo, Py_ssize_t n0, Py_ssize_t n1, Py_ssize_t nb

__attribute__((target("avx2,fma,f16c"))) static void legacy_tiles_fma(TILES_ARGS)
{
    switch (type) {  /* a copy per type, its constants folded in */
    case Q4_0: type = Q4_0; LEGACY_TILES(legacy_tile) break;
    case Q5_0: type = Q5_0; LEGACY_TILES(legacy_tile) break;
    default: type = Q8_0; LEGACY_TILES(legacy_tile) break;
    }
}

__attribute__((target(VNNI_TARGET))) static void legacy_tiles_vnni(TILES_ARGS)
{
    switch (type) {
    case Q4_0: type = Q4_0; LEGACY_TILES(legacy_tile_vnni) break;
    case Q5_0: type = Q5_0; LEGACY_TILES(legacy_tile_vnni) break;
    default: type = Q8_0; LEGACY_TILES(legacy_tile_vnni) break;
    }
}

AVX2 void quant_dot_avx2_body(int type, int paired, const uint8_t *w, Py_ssize_t ldw, const uint8_t *x,
                              Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
                              Py_ssize_t n1, Py_ssize_t nb)
{
    const int k_quant = K_QUANT(type);
    const Py_ssize_t wsize = weight_size(type), ysize = activation_size(type);
    for (Py_ssize_t i0 = 0; i0 < n0; i0++) {
        const uint8_t *wr = w + i0 * ldw;
        for (Py_ssize_t i1 = 0; i1 < n1; i1++) {
            const uint8_t *yr = x + i1 * ldx;
            __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();  /* IQ4_NL's odd blocks */
            float tail = 0.0f, tail_d = 0.0f;  /* IQ4_NL's odd last block */
            float acc_m[4] = {0.0f, 0.0f, 0.0f, 0.0f};  /* Q4_K's mins; Q5_K, Q4_1, Q5_1: [0] */
            for (Py_ssize_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * wsize, *yb = yr + b * ysize;
                __m256i lanes;
                float d;
                if (type == IQ4_NL) {
                    d = half_f16c(yb) * half_f16c(blk);
                    if (paired && b == nb - 1 && nb % 2) {  /* ggml's scalar loop: the true products */
                        int32_t s = 0;
                        for (int e = 0; e < 16; e++)
                            s += ((const int8_t *)yb)[2 + e] * kvalues_iq4nl[blk[2 + e] & 0x0F] +
                                 ((const int8_t *)yb)[18 + e] * kvalues_iq4nl[blk[2 + e] >> 4];
                        tail = (float)s, tail_d = d;
                        continue;
                    }
                    lanes = _mm256_madd_epi16(iq4_pairs(blk + 2, yb + 2), _mm256_set1_epi16(1));
                    if (paired && b % 2) {
                        acc2 = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc2);
                        continue;
                    }
                } else if (OFFSET_QUANT(type)) {
                    d = half_f16c(yb) * half_f16c(blk);
                    acc_m[0] = fmaf(half_f16c(blk + 2), half_f16c(yb + 2), acc_m[0]);
                    lanes = offset_lanes(offset_weights(type, blk), yb + 4);
                } else if (!k_quant) {
                    d = half_f16c(yb) * half_f16c(blk);
                    const __m256i q = legacy_weights(type, blk);
                    lanes = signed_lanes(_mm256_sign_epi8(q, q), q, _mm256_loadu_si256((const __m256i *)(yb + 2)));
                } else {
                    float yd;
                    memcpy(&yd, yb, 4);
                    if (type == Q2_K) {
                        const float dmin = -yd * half_f16c(blk + 82);
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(q2_k_min_lanes(blk, yb + 260)), acc);
                        lanes = q2_k_lanes(blk, (const int8_t *)(yb + 4));
                        d = yd * half_f16c(blk + 80);
                    } else if (type == IQ4_XS) {  /* ggml_vec_dot_iq4_xs_q8_K's runs, two by two */
                        uint16_t sh = u16(blk + 2);
                        __m256i sumi1 = _mm256_setzero_si256(), sumi2 = _mm256_setzero_si256();
                        for (int r = 0; r < 8; r += 2) {
                            const int16_t ls1 = (int16_t)(((blk[4 + r / 2] & 0x0F) | ((sh << 4) & 0x30)) - 32);
                            const int16_t ls2 = (int16_t)(((blk[4 + r / 2] >> 4) | ((sh << 2) & 0x30)) - 32);
                            sh >>= 4;
                            sumi1 = _mm256_add_epi32(_mm256_madd_epi16(iq4_pairs(blk + 8 + 16 * r, yb + 4 + 32 * r),
                                                                       _mm256_set1_epi16(ls1)), sumi1);
                            sumi2 = _mm256_add_epi32(_mm256_madd_epi16(iq4_pairs(blk + 24 + 16 * r, yb + 36 + 32 * r),
                                                                       _mm256_set1_epi16(ls2)), sumi2);
                        }
                        lanes = _mm256_add_epi32(sumi1, sumi2);
                        d = half_f16c(blk) * yd;
                    } else if (type == Q3_K) {
                        int8_t sc[16];
                        q3_k_scales(blk + 96, sc);
                        lanes = q3_k_lanes(blk, sc, (const int8_t *)(yb + 4));
                        d = yd * half_f16c(blk + 108);
                    } else if (type == Q4_K || type == Q5_K) {
                        const uint8_t *bs = yb + 260;
                        int16_t sc[8], mn[8];
                        for (int j = 0; j < 8; j++) {
                            int s, m;
                            scale_min_k4(blk + 4, j, &s, &m);
                            sc[j] = (int16_t)s;
                            mn[j] = (int16_t)m;
                        }
                        lanes = type == Q4_K ? q4_k_lanes(blk + 16, sc, (const int8_t *)(yb + 4))
                                             : q5_k_lanes(blk, sc, (const int8_t *)(yb + 4));
                        const float mscale = -yd * half_f16c(blk + 2);
                        int32_t m[4];
                        for (int l = 0; l < 4; l++) {
                            const int32_t s0 = (int16_t)((int16_t)u16(bs + 8 * l) + (int16_t)u16(bs + 8 * l + 2));
                            const int32_t s1 = (int16_t)((int16_t)u16(bs + 8 * l + 4) + (int16_t)u16(bs + 8 * l + 6));
                            m[l] = mn[2 * l] * s0 + mn[2 * l + 1] * s1;
                        }
                        if (type == Q4_K)
                            for (int l = 0; l < 4; l++)
                                acc_m[l] = fmaf((float)m[l], mscale, acc_m[l]);
                        else
                            acc_m[0] = fmaf((float)((m[0] + m[1]) + (m[2] + m[3])), mscale, acc_m[0]);
                        d = yd * half_f16c(blk);
                    } else {
                        lanes = q6_k_lanes(blk, (const int8_t *)(yb + 4), yb + 260);
                        d = yd * half_f16c(blk + 208);
                    }
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
            }
            float a[8];
            _mm256_storeu_ps(a, paired ? _mm256_add_ps(acc, acc2) : acc);
            float r = hsum8(a);
            if (paired && nb % 2)
                r = fmaf(tail_d, tail, r);
            if (type == Q4_K)
                r += (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
            else if (type == Q5_K || OFFSET_QUANT(type))
                r += acc_m[0];
            out[i1 * ldo + i0] = r;
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void quant_dot_fma(int type, int tiny, const uint8_t *w,
    Py_ssize_t ldw, const uint8_t *x, Py_ssize_t ldx, float *out, Py_ssize_t ldo, Py_ssize_t n0,
    Py_ssize_t n1, Py_ssize_t nb)
{
    switch (type) {
    case IQ3_XXS: case IQ3_S: case IQ2_S: lanes_iq_dot(type, 1, w, ldw, x, ldx, out, ldo, n0, n1, nb, NULL); break;
    case Q4_0: quant_dot_avx2_body(Q4_0, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q4_1: quant_dot_avx2_body(Q4_1, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q5_0: quant_dot_avx2_body(Q5_0, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q5_1: quant_dot_avx2_body(Q5_1, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q8_0: quant_dot_avx2_body(Q8_0, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case IQ4_NL:
        if (tiny)
            quant_dot_avx2_body(IQ4_NL, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb);
        else
            quant_dot_avx2_body(IQ4_NL, 1, w, ldw, x, ldx, out, ldo, n0, n1, nb);
        break;
    case Q2_K: quant_dot_avx2_body(Q2_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q3_K: quant_dot_avx2_body(Q3_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case IQ4_XS: quant_dot_avx2_body(IQ4_XS, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q4_K: quant_dot_avx2_body(Q4_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    case Q5_K: quant_dot_avx2_body(Q5_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    default: quant_dot_avx2_body(Q6_K, 0, w, ldw, x, ldx, out, ldo, n0, n1, nb); break;
    }
}
#endif

/* A quant_dot's rows shared out by the pool (c/pool.c): weight rows [a, b) of every
 * activation row. Each output is one row's own sum, so the split never changes a bit. */
typedef struct {
    int type, hw, tiny;  /* hw: 0 the portable loop, 1 AVX2, 2 AVX2 and AVX-512 VNNI's tiles */
    const uint8_t *w, *x;
    Py_ssize_t ldw, ldx, n0, n1, nb;
    float *out, *acc;  /* out (n1, n0); acc: each worker's room for n1 * ACC floats */
} QuantJob;

/* ==== rows shared between threads; the module's entry points ================================= */

static void quant_rows(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const QuantJob *j = ctx;
    const uint8_t *w = j->w + a * j->ldw;
    if (lanes_tq_dot(j->type, j->hw, w, j->ldw, j->x, j->ldx, j->out + a, j->n0, b - a, j->n1, j->nb))
        return;
#ifdef HAVE_FMA_TARGET
    if (j->hw) {
        if ((j->type == Q4_0 || j->type == Q5_0 || j->type == Q8_0) && j->n1 > 1) {  /* whole tiles first */
            const Py_ssize_t n = (b - a) - (b - a) % TILE_W;
            (j->hw == 2 ? legacy_tiles_vnni : legacy_tiles_fma)(j->type, w, j->ldw, j->x, j->ldx,
                                                                j->out + a, j->n0, n, j->n1, j->nb);
            a += n;
            w += n * j->ldw;
        }
        quant_dot_fma(j->type, j->tiny, w, j->ldw, j->x, j->ldx, j->out + a, j->n0, b - a, j->n1, j->nb);
        return;
    }
#endif
    quant_dot(j->type, j->tiny, w, j->ldw, j->x, j->ldx, j->out + a, j->n0, b - a, j->n1, j->nb,
              j->acc + (Py_ssize_t)worker * (j->n1 + 1) * ACC);
}

LANES_HIDDEN PyObject *lanes_quant_dot(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, x, out;
    int type, portable = 0, threads = 1, tiny = 0;
    Py_ssize_t ldw, ldx, n0, n1, nb;
    if (!PyArg_ParseTuple(args, "iy*ny*nw*nnn|iip", &type, &w, &ldw, &x, &ldx, &out, &n0, &n1, &nb,
                          &portable, &threads, &tiny))
        return NULL;
    const Py_ssize_t wsize = weight_size(type), ysize = activation_size(type);
    /* w: n0 rows of nb blocks, ldw bytes apart (the last one may end the buffer); x likewise */
    int ok = wsize > 0 && n0 >= 0 && n1 >= 0 && nb >= 0 && ldw >= nb * wsize && ldx >= nb * ysize &&
             w.len >= (n0 > 0 ? (n0 - 1) * ldw + nb * wsize : 0) &&
             x.len >= (n1 > 0 ? (n1 - 1) * ldx + nb * ysize : 0) &&
             lanes_check(&out, n0 * n1 * 4, "out") == 0;
    /* as many threads as asked, each with enough work to pay for its wake-up; ggml's 4 chunks
     * a thread, so that one that runs faster takes more */
    Py_ssize_t parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
    const Py_ssize_t macs = n0 * n1 * nb * (ysize == 292 ? 256 : 32);  /* Q8_K: 256 a block */
    while (parts > 1 && (n0 < parts || macs / parts < LANES_SPLIT_MACS))
        parts--;
    Py_ssize_t chunk = parts > 1 ? (n0 + 4 * parts - 1) / (4 * parts) : n0;
    /* chunks start at whole tiles, so a row is tiled or not (the NaN a row gives, where two
     * meet, is the instruction's choice) whatever the threads */
    if (parts > 1)
        chunk = (chunk + TILE_W - 1) / TILE_W * TILE_W;
    float *acc = NULL;
    if (ok && !(acc = PyMem_RawMalloc((size_t)parts * (size_t)(n1 + 1) * ACC * sizeof(float)))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const int hw = portable == 1 || !fma_hw() ? 0 : portable != 2 && vnni_hw() ? 2 : 1;
        QuantJob job = {type, hw, tiny, w.buf, x.buf, ldw, ldx, n0, n1, nb, out.buf, acc};
        Py_BEGIN_ALLOW_THREADS
        lanes_pool_run(quant_rows, &job, n0, chunk, (int)parts);
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
