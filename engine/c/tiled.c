/* engine._lanes (c/lanes.c): llama.cpp's tiled K-quant products (ggml-cpu/tiled/, the AVX2
 * build), for engine/compute/kernels/tiled.py, whose numpy twin tiled_mul_mat says the same
 * thing for reading.
 *
 * Each weight block is decoded as tiled.cpp's tiled_unpack_src0 decodes it into its tile: 256
 * integers w (the tile's codes less the format's BIAS: Q6_K's 6-bit codes less 32, Q3_K's
 * 3-bit ones less 4, the IQ types' signed grid values, IQ4_XS's kvalues; Q4_K, Q5_K and Q2_K
 * keep their unsigned codes), one integer scale per sub-block of 16 or 32, the mins of Q4_K,
 * Q5_K and Q2_K, and the floats d and dmin (the IQ2 and IQ1 types' d times 0.125f, IQ3_XXS's
 * times 0.25f). The AVX2 microtile's integer sum of a block, sum over sub-blocks of scale times
 * the sub-block's byte products, is exact: maddubs cannot saturate for these ranges, and the
 * +128 the activations carry on the act-bias formats (Q6_K, Q3_K, the IQ grids) is taken back
 * exactly by the weight sums tiled_repack_src0 precomputes. So it is computed here as one dot
 * product of the 256 activation bytes with w times its scale (int16), in any order. One
 * exception: IQ4_XS's sign trick (|w| times sign(y, w)) wraps where y is -128 and w is
 * negative, counting +128 * w where the exact product is -128 * w.
 *
 * Then per block, in float: res = d * (float)s1; with mins, res = fmaf(-dmin, (float)s2, res)
 * where s2 sums each sub-block's min times its activation sums (Q8_K's bsums); and
 * acc = fmaf(res, y.d, acc), block after block from +0.0f, acc being the output. Every output
 * is its own chain, so the rows may be shared out between threads in any way.
 */
#include "lanes.h"

#define QK 256
#define Q8K_BYTES 292  /* block_q8_K: float d, 256 int8, 16 int16 sums of 16 */
#define PANEL 16       /* weight rows decoded together: tiled.cpp's microtile edge */

/* one weight row's block, as the tile holds it */
typedef struct {
    int16_t ws[QK];  /* w times its sub-block's scale */
    int8_t w[QK];    /* w alone (IQ4_XS's sign trick reads its sign) */
    int32_t mn[16];  /* the mins of Q4_K, Q5_K (8) and Q2_K (16) */
    float d, dmin;
} TiledRow;

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1, 13, 25, 38, 53, 69, 89, 113};

/* the sub-block width (16 or 32) and whether it has mins; 0: not a tiled type */
static int tiled_subblk(int type, int *has_min)
{
    *has_min = type == Q4_K || type == Q5_K || type == Q2_K;
    switch (type) {
    case Q4_K: case Q5_K: case IQ4_XS: case IQ2_XXS: case IQ3_XXS: case IQ3_S: case IQ1_S:
        return 32;
    case Q6_K: case Q3_K: case Q2_K: case IQ2_XS: case IQ2_S: case IQ1_M:
        return 16;
    default:
        return 0;
    }
}

/* the bytes of the grid table a type's blocks index (0: none) */
static Py_ssize_t tiled_grid_bytes(int type)
{
    switch (type) {
    case IQ2_XXS: return 256 * 8;
    case IQ2_XS: return 512 * 8;
    case IQ2_S: return 1024 * 8;
    case IQ3_XXS: return 256 * 4;
    case IQ3_S: return 512 * 4;
    case IQ1_S: case IQ1_M: return 2048 * 8;
    default: return 0;
    }
}

INLINE uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
INLINE uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* ksigns_iq2xs[s7]: the 7 stored sign bits, the 8th making their parity even */
INLINE uint8_t ksign(uint32_t s7) { return (uint8_t)(s7 | (uint32_t)__builtin_parity(s7) << 7); }

/* 8 grid values (one uint64, the first lowest) into w, negated where bit j of sign is set */
INLINE void signed8(uint64_t g, uint8_t sign, int8_t *w)
{
    for (int j = 0; j < 8; j++) {
        const int v = (int)((g >> (8 * j)) & 0xFF);
        w[j] = (int8_t)((sign >> j) & 1 ? -v : v);
    }
}

/* 8 ternary grid values (bytes 0, 1, 0xFF) as tiled_unpk_tern8's codes less 128: 8 * v + delta */
INLINE void tern8(uint64_t g, int delta, int8_t *w)
{
    for (int j = 0; j < 8; j++)
        w[j] = (int8_t)(8 * (int8_t)((g >> (8 * j)) & 0xFF) + delta);
}

/* tiled_unpack_src0 of one block: w, the scales sc (one per sub-block), mn, d, dmin */
static void tiled_decode(int type, const uint8_t *b, const void *grid, int8_t *w, int32_t *sc,
                         TiledRow *r)
{
    const uint64_t *g64 = grid;
    const uint32_t *g32 = grid;
    r->dmin = 0.0f;
    switch (type) {
    case Q4_K: case Q5_K: {  /* d, dmin, 12 bytes of 6-bit scales and mins, (qh,) qs */
        r->d = half_to_float(u16(b));
        r->dmin = half_to_float(u16(b + 2));
        for (int j = 0; j < 8; j++) {
            int s, m;
            scale_min_k4(b + 4, j, &s, &m);
            sc[j] = s;
            r->mn[j] = m;
        }
        const uint8_t *qh = b + 16, *qs = type == Q4_K ? b + 16 : b + 48;
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                w[64 * j + l] = (int8_t)(qs[32 * j + l] & 0xF);
                w[64 * j + 32 + l] = (int8_t)(qs[32 * j + l] >> 4);
            }
        if (type == Q5_K)
            for (int k = 0; k < 8; k++)
                for (int l = 0; l < 32; l++)
                    w[32 * k + l] |= (int8_t)(((qh[l] >> k) & 1) << 4);
        break;
    }
    case Q6_K: {  /* ql[128], qh[64], int8 scales[16], d: code 4 low | 2 high bits, less 32 */
        const uint8_t *ql = b, *qh = b + 128;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t a = ql[64 * h + l], c = ql[64 * h + 32 + l], hb = qh[32 * h + l];
                int8_t *o = w + 128 * h + l;
                o[0] = (int8_t)(((a & 0xF) | ((hb & 3) << 4)) - 32);
                o[32] = (int8_t)(((c & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
                o[64] = (int8_t)(((a >> 4) | (((hb >> 4) & 3) << 4)) - 32);
                o[96] = (int8_t)(((c >> 4) | (((hb >> 6) & 3) << 4)) - 32);
            }
        for (int s = 0; s < 16; s++)
            sc[s] = (int8_t)b[192 + s];
        r->d = half_to_float(u16(b + 208));
        break;
    }
    case Q3_K: {  /* hmask[32], qs[64], 12 scale bytes, d: 2 low bits | hmask bit << 2, less 4 */
        const uint8_t *hm = b, *qs = b + 32;
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++)
                    w[128 * h + 32 * g + l] = (int8_t)((((qs[32 * h + l] >> (2 * g)) & 3) |
                                                        (((hm[l] >> (4 * h + g)) & 1) << 2)) - 4);
        uint32_t a[4];
        memcpy(a, b + 96, 12);
        const uint32_t t = a[2];
        a[2] = ((a[0] >> 4) & 0x0f0f0f0f) | (((t >> 4) & 0x03030303) << 4);
        a[3] = ((a[1] >> 4) & 0x0f0f0f0f) | (((t >> 6) & 0x03030303) << 4);
        a[0] = (a[0] & 0x0f0f0f0f) | (((t >> 0) & 0x03030303) << 4);
        a[1] = (a[1] & 0x0f0f0f0f) | (((t >> 2) & 0x03030303) << 4);
        const int8_t *s8 = (const int8_t *)a;
        for (int s = 0; s < 16; s++)
            sc[s] = s8[s] - 32;
        r->d = half_to_float(u16(b + 108));
        break;
    }
    case Q2_K: {  /* scales[16] (scale | min << 4), qs[64], d, dmin */
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++)
                    w[128 * h + 32 * g + l] = (int8_t)((b[16 + 32 * h + l] >> (2 * g)) & 3);
        for (int s = 0; s < 16; s++) {
            sc[s] = b[s] & 0xF;
            r->mn[s] = b[s] >> 4;
        }
        r->d = half_to_float(u16(b + 80));
        r->dmin = half_to_float(u16(b + 82));
        break;
    }
    case IQ4_XS: {  /* d, scales_h, scales_l[4], qs[128]: kvalues of the nibbles */
        const uint16_t sh = u16(b + 2);
        for (int s = 0; s < 8; s++)
            sc[s] = (((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4)) - 32;
        for (int s = 0; s < 8; s++)
            for (int k = 0; k < 16; k++) {
                w[32 * s + k] = kvalues_iq4nl[b[8 + 16 * s + k] & 0xF];
                w[32 * s + 16 + k] = kvalues_iq4nl[b[8 + 16 * s + k] >> 4];
            }
        r->d = half_to_float(u16(b));
        break;
    }
    case IQ2_XXS: {  /* d, per 32: 4 grid bytes, then 4 x 7 sign bits and a 4-bit scale */
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = b + 2 + 8 * ib;
            const uint32_t a1 = rd32(q + 4);
            sc[ib] = (int32_t)(2 * (a1 >> 28) + 1);
            for (int l = 0; l < 4; l++)
                signed8(g64[q[l]], ksign((a1 >> (7 * l)) & 127), w + 32 * ib + 8 * l);
        }
        r->d = half_to_float(u16(b)) * 0.125f;
        break;
    }
    case IQ2_XS: {  /* d, qs[32] (9-bit index | 7 sign bits << 9), scales[8] (two per 32) */
        for (int ib = 0; ib < 8; ib++) {
            sc[2 * ib] = 2 * (b[66 + ib] & 0xF) + 1;
            sc[2 * ib + 1] = 2 * (b[66 + ib] >> 4) + 1;
            for (int l = 0; l < 4; l++) {
                const uint16_t q = u16(b + 2 + 8 * ib + 2 * l);
                signed8(g64[q & 511], ksign(q >> 9), w + 32 * ib + 8 * l);
            }
        }
        r->d = half_to_float(u16(b)) * 0.125f;
        break;
    }
    case IQ2_S: {  /* d, qs[32] and sign bytes[32], qh[8] (2 index bits each 8), scales[8] */
        for (int ib = 0; ib < 8; ib++) {
            sc[2 * ib] = 2 * (b[74 + ib] & 0xF) + 1;
            sc[2 * ib + 1] = 2 * (b[74 + ib] >> 4) + 1;
            const uint8_t qh = b[66 + ib];
            for (int l = 0; l < 4; l++)
                signed8(g64[b[2 + 4 * ib + l] | ((qh << (8 - 2 * l)) & 0x300)], b[34 + 4 * ib + l],
                        w + 32 * ib + 8 * l);
        }
        r->d = half_to_float(u16(b)) * 0.125f;
        break;
    }
    case IQ3_XXS: {  /* d, 64 grid bytes (4 values each), per 32 a word: 4 x 7 signs, scale */
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = b + 2 + 8 * ib;
            const uint32_t a = rd32(b + 66 + 4 * ib);
            sc[ib] = (int32_t)(2 * (a >> 28) + 1);
            for (int l = 0; l < 4; l++)
                signed8((uint64_t)g32[q[2 * l + 1]] << 32 | g32[q[2 * l]], ksign((a >> (7 * l)) & 127),
                        w + 32 * ib + 8 * l);
        }
        r->d = half_to_float(u16(b)) * 0.25f;
        break;
    }
    case IQ3_S: {  /* d, qs[64], qh[8], signs[32], scales[4] (two 4-bit per byte) */
        for (int ib = 0; ib < 8; ib++) {
            sc[ib] = 1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF);
            const uint8_t *q = b + 2 + 8 * ib, qh = b[66 + ib];
            for (int l = 0; l < 4; l++) {
                const uint64_t lo = g32[q[2 * l] | ((qh << (8 - 2 * l)) & 256)];
                const uint64_t hi = g32[q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
                signed8(hi << 32 | lo, b[74 + 4 * ib + l], w + 32 * ib + 8 * l);
            }
        }
        r->d = half_to_float(u16(b));
        break;
    }
    case IQ1_S: {  /* d, qs[32], qh[8] (4 x 3 index bits, 3-bit scale, the shift's sign) */
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t hw = u16(b + 34 + 2 * ib);
            sc[ib] = 2 * ((hw >> 12) & 7) + 1;
            const int delta = hw & 0x8000 ? -1 : 1;
            for (int l = 0; l < 4; l++)
                tern8(g64[b[2 + 4 * ib + l] | (((hw >> (3 * l)) & 7) << 8)], delta, w + 32 * ib + 8 * l);
        }
        r->d = half_to_float(u16(b)) * 0.125f;
        break;
    }
    default: {  /* IQ1_M: qs[32], qh[16], scales[8] (3-bit scales per 16, the fp16 d spread) */
        uint16_t s[4];
        for (int k = 0; k < 4; k++)
            s[k] = u16(b + 48 + 2 * k);
        const uint16_t dbits = (uint16_t)((s[0] >> 12) | ((s[1] >> 8) & 0x00f0) |
                                          ((s[2] >> 4) & 0x0f00) | (s[3] & 0xf000));
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t hw = s[ib / 2];
            const int sh = 6 * (ib % 2);
            sc[2 * ib] = 2 * ((hw >> sh) & 7) + 1;
            sc[2 * ib + 1] = 2 * ((hw >> (sh + 3)) & 7) + 1;
            const uint8_t *q = b + 4 * ib, *qh = b + 32 + 2 * ib;
            const int idx[4] = {q[0] | ((qh[0] << 8) & 0x700), q[1] | ((qh[0] << 4) & 0x700),
                                q[2] | ((qh[1] << 8) & 0x700), q[3] | ((qh[1] << 4) & 0x700)};
            const int delta[4] = {qh[0] & 0x08 ? -1 : 1, qh[0] & 0x80 ? -1 : 1,
                                  qh[1] & 0x08 ? -1 : 1, qh[1] & 0x80 ? -1 : 1};
            for (int l = 0; l < 4; l++)
                tern8(g64[idx[l]], delta[l], w + 32 * ib + 8 * l);
        }
        r->d = half_to_float(dbits) * 0.125f;
        break;
    }
    }
}

typedef struct {
    int type, subblk, has_min, hw;
    const uint8_t *w, *x;
    const void *grid;
    Py_ssize_t ldw, ldx, ldo, n0, n1, nb;
    float *out;
    const uint8_t *neg128;  /* IQ4_XS: (n1, nb) flags, an activation block holds a -128 */
    char *scratch;          /* each worker's: PANEL rows, then PANEL * n1 floats */
    size_t scratch_bytes;
} TiledJob;

/* s[r] = the dot products of 4 rows' ws with the activations q (widened), exact */
INLINE void dot256x4(const TiledRow *r, const int16_t *q, int32_t *s)
{
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int e = 0; e < QK; e++) {
        const int32_t v = q[e];
        a0 += r[0].ws[e] * v;
        a1 += r[1].ws[e] * v;
        a2 += r[2].ws[e] * v;
        a3 += r[3].ws[e] * v;
    }
    s[0] = a0;
    s[1] = a1;
    s[2] = a2;
    s[3] = a3;
}

/* weight rows [a, b) of every activation row, PANEL rows at a time */
INLINE void tiled_rows_body(const TiledJob *j, char *scratch, Py_ssize_t a, Py_ssize_t b)
{
    TiledRow *rows = (TiledRow *)scratch;
    float *acc = (float *)(scratch + PANEL * sizeof(TiledRow));
    const int nsub = QK / j->subblk;
    const Py_ssize_t n1 = j->n1;
    for (Py_ssize_t p0 = a; p0 < b; p0 += PANEL) {
        const int np = (int)(b - p0 < PANEL ? b - p0 : PANEL);
        for (Py_ssize_t k = 0; k < np * n1; k++)
            acc[k] = 0.0f;
        for (Py_ssize_t kb = 0; kb < j->nb; kb++) {
            for (int i = 0; i < np; i++) {
                TiledRow *r = &rows[i];
                int32_t sc[16];
                tiled_decode(j->type, j->w + (p0 + i) * j->ldw + kb * lanes_block_bytes(j->type),
                             j->grid, r->w, sc, r);
                for (int sb = 0; sb < nsub; sb++)
                    for (int e = sb * j->subblk; e < (sb + 1) * j->subblk; e++)
                        r->ws[e] = (int16_t)(r->w[e] * sc[sb]);
            }
            for (Py_ssize_t c = 0; c < n1; c++) {
                const uint8_t *xb = j->x + c * j->ldx + kb * Q8K_BYTES;
                float d1;
                memcpy(&d1, xb, 4);
                const int8_t *q = (const int8_t *)(xb + 4);
                int16_t q16[QK];
                for (int e = 0; e < QK; e++)
                    q16[e] = q[e];
                int32_t s1s[PANEL], bs[16];
                for (int i = 0; i < np; i += 4)  /* (the rows past np: zeros or an older panel's) */
                    dot256x4(&rows[i], q16, &s1s[i]);
                if (j->has_min) {
                    int16_t s16[16];
                    memcpy(s16, xb + 260, 32);
                    for (int s = 0; s < nsub; s++)
                        bs[s] = j->subblk == 32 ? (int32_t)s16[2 * s] + s16[2 * s + 1] : s16[s];
                }
                const int quirk = j->neg128 && j->neg128[c * j->nb + kb];
                for (int i = 0; i < np; i++) {
                    const TiledRow *r = &rows[i];
                    int32_t s1 = s1s[i];
                    if (quirk)  /* sign(-128, w < 0) wraps: +128 * w where -128 * w is exact */
                        for (int e = 0; e < QK; e++)
                            if (q[e] == -128 && r->w[e] < 0)
                                s1 += 256 * r->ws[e];
                    float res = r->d * (float)s1;
                    if (j->has_min) {
                        int32_t s2 = 0;
                        for (int s = 0; s < nsub; s++)
                            s2 += r->mn[s] * bs[s];
                        res = fmaf(-r->dmin, (float)s2, res);
                    }
                    float *o = &acc[i * n1 + c];
                    *o = fmaf(res, d1, *o);
                }
            }
        }
        for (int i = 0; i < np; i++)
            for (Py_ssize_t c = 0; c < n1; c++)
                j->out[c * j->ldo + p0 + i] = acc[i * n1 + c];
    }
}

static void tiled_rows_portable(const TiledJob *j, char *scratch, Py_ssize_t a, Py_ssize_t b)
{
    tiled_rows_body(j, scratch, a, b);
}

#ifdef HAVE_FMA_TARGET
__attribute__((target("avx2,fma,f16c"))) static void tiled_rows_fma(const TiledJob *j, char *scratch,
                                                                   Py_ssize_t a, Py_ssize_t b)
{
    tiled_rows_body(j, scratch, a, b);
}
#endif

static void tiled_rows(void *ctx, int worker, Py_ssize_t a, Py_ssize_t b)
{
    const TiledJob *j = ctx;
    char *scratch = j->scratch + (size_t)worker * j->scratch_bytes;
#ifdef HAVE_FMA_TARGET
    if (j->hw) {
        tiled_rows_fma(j, scratch, a, b);
        return;
    }
#endif
    tiled_rows_portable(j, scratch, a, b);
}

LANES_HIDDEN PyObject *lanes_tiled_mul_mat(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer w, x, out, grid = {0};
    int type, portable = 0, threads = 1, has_min;
    Py_ssize_t ldw, ldx, ldo, n0, n1, nb;
    if (!PyArg_ParseTuple(args, "iy*ny*nw*nnnnO&|pi", &type, &w, &ldw, &x, &ldx, &out, &ldo, &n0,
                          &n1, &nb, lanes_optional_buffer, &grid, &portable, &threads))
        return NULL;
    const int subblk = tiled_subblk(type, &has_min);
    const Py_ssize_t wsize = subblk ? lanes_block_bytes(type) : 0, gbytes = tiled_grid_bytes(type);
    int ok = subblk && n0 >= 0 && n1 >= 0 && nb >= 0 && ldw >= nb * wsize && ldx >= nb * Q8K_BYTES &&
             ldo >= n0 && w.len >= (n0 > 0 ? (n0 - 1) * ldw + nb * wsize : 0) &&
             x.len >= (n1 > 0 ? (n1 - 1) * ldx + nb * Q8K_BYTES : 0) &&
             out.len >= (n0 > 0 && n1 > 0 ? ((n1 - 1) * ldo + n0) * 4 : 0) &&
             (gbytes == 0 || (grid.obj && grid.len == gbytes));
    Py_ssize_t parts = threads < 1 ? 1 : threads > LANES_POOL_MAX ? LANES_POOL_MAX : threads;
    const Py_ssize_t panels = (n0 + PANEL - 1) / PANEL;
    while (parts > 1 && (panels < parts || n0 * n1 * nb * QK / parts < LANES_SPLIT_MACS))
        parts--;
    const Py_ssize_t chunk = parts > 1 ? (panels + 4 * parts - 1) / (4 * parts) * PANEL : (n0 > 0 ? n0 : 1);
    const size_t scratch_bytes = ((PANEL * sizeof(TiledRow) + (size_t)PANEL * (size_t)n1 * 4) + 63) & ~(size_t)63;
    char *scratch = NULL;
    uint8_t *neg128 = NULL;
    if (ok && !(scratch = PyMem_RawCalloc((size_t)parts, scratch_bytes))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok && type == IQ4_XS && n1 * nb > 0) {
        if (!(neg128 = PyMem_RawMalloc((size_t)(n1 * nb)))) {
            PyErr_NoMemory();
            ok = 0;
        } else {
            for (Py_ssize_t c = 0; c < n1; c++)
                for (Py_ssize_t kb = 0; kb < nb; kb++) {
                    const int8_t *q = (const int8_t *)x.buf + c * ldx + kb * Q8K_BYTES + 4;
                    uint8_t f = 0;
                    for (int e = 0; e < QK; e++)
                        f |= q[e] == -128;
                    neg128[c * nb + kb] = f;
                }
        }
    }
    if (ok) {
        TiledJob job = {type, subblk, has_min, !portable && fma_hw(), w.buf, x.buf, grid.obj ? grid.buf : NULL,
                        ldw, ldx, ldo, n0, n1, nb, out.buf, neg128, scratch, scratch_bytes};
        Py_BEGIN_ALLOW_THREADS
        lanes_pool_run(tiled_rows, &job, n0, chunk, (int)parts);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_lanes: bad type, sizes, strides or grid");
    }
    PyMem_RawFree(scratch);
    PyMem_RawFree(neg128);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    lanes_release_optional(&grid);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}
