/* Matmuls on a GGUF's own quantized blocks, kept compact ("blocks"): out[M, N] = x[M, K] @ W^T.

   W is stored per panel of 16 output columns, each panel with its own block type, in
   records of one group of G = 32 k values (engine/quantization/block_weights.py builds them; a record
   holds exactly the file's bytes for those 16 x 32 weights, re-laid, Q4_K's widened,
   Q6_K's super-block d repeated in each of its 8 records):
     Q4_0  d[16] fp16, codes (4 bits)                    288 bytes, w = d * (q - 8)
     Q4_1  d[16] fp16, m[16] fp16, codes (4 bits)        320 bytes, w = d * q + m
     Q5_0  d[16] fp16, high bits[8] u64, codes (4 bits)  352 bytes, w = d * (q - 16)
     Q8_0  d[16] fp16, codes (int8)                      544 bytes, w = d * q
     Q4_K  d[16] fp32, m[16] fp32, codes (4 bits)        384 bytes, w = d * q + m
           (a Q4_K sub-block of 32: d = super-block d * 6-bit scale, m = -dmin * 6-bit
           min, both exact in fp32)
     Q6_K  d[16] fp16, sc[2][16] int8, high bits[128],    448 bytes, w = d * sc * (q - 32)
           codes (low 4 bits)
           (sc[0] for k 0..15, sc[1] for k 16..31: the file's super-block d and sub-block
           scales, 7 bits a weight where the file has 6.5625; d * sc is exact in fp32)
   4-bit codes: four 64-byte chunks of 8 k each, byte [j][t] = q(k + t) | q(k + 4 + t) << 4
   for column j: the low nibbles are 4 k values of 16 columns, what one AVX512-VNNI
   vpdpbusd multiplies, and so are the high ones. Q5_0's fifth bits: one 64-bit mask per
   half chunk, bit j * 4 + t. Q8_0 codes: eight chunks [j][t] of int8. Q6_K's two high
   bits: byte [j][t] of high[ch / 2] holds them for chunk ch's low nibble at bits
   4 * (ch % 2), for its high nibble two bits above.
   Activations are quantized per row and group as gemm_w8a8.c does (xq, xs, xsum). A
   group's dot is then d * xs * sum(q * xq) + m * xs * sum(xq), with m = -8 d (Q4_0),
   -16 d (Q5_0): the integer offset goes into the exact int32 sum, so Q4_0 / Q5_0 / Q8_0
   give what gemm_w8a8_panels gives on the same blocks expanded to int8, bit for bit.
   Q6_K has a scale per 16 k: two int32 sums per group, k 0..15 and 16..31, each with
   its -32 offset times that half's sum(xq) and then its own scale. The halves' sums are
   computed once per call, beside xsum (xlow: k 0..15; the other half is xsum - xlow),
   not in the row kernels, which would redo them for every panel.
   sum(q * xq) is unsigned x signed bytes: vpdpbusd, or AVX2 vpmaddubsw (4-, 5- and
   6-bit q cannot saturate its 16-bit pair sums: 2 * 63 * 127 < 32767) and vpmaddwd.

   panels[p] = byte offset of panel p's first record << 4 | its type. path: 2 AVX512-VNNI,
   1 AVX2, 0 portable C (as gemm_w8a8.c). N must be a multiple of 16, K of G. Returns 0,
   or 1 when the activation buffers could not be had. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define G 32
enum { Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, TYPES };
static const int64_t RECORD[TYPES] = {288, 320, 352, 544, 384, 448};
static const int32_t OFFSET[TYPES] = {-8, 0, -16, 0, 0, -32}; /* integer part of m / d */

/* out rows (stride ldo), quantized rows (xq [rows][K], xs, xsum and xlow [rows][K / G]),
   K, one panel's records and its bias (16 or none) */
#define ROW_ARGS                                                                           \
    float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,      \
        const int32_t *xlow, int64_t K, const uint8_t *rec, const float *bias
typedef void (*rows_fn)(ROW_ARGS);

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | man << 13;
    } else if (exp) {
        u = sign | (exp + 112) << 23 | man << 13;
    } else { /* zero or subnormal: man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* one record's 16 x 32 codes (0..31, Q8_0 signed: all fit int8) as q[j][k] */
static inline __attribute__((always_inline)) void codes(int8_t q[16][G], const uint8_t *rec,
                                                        const int type) {
    if (type == Q8_0) {
        const int8_t *c = (const int8_t *)(rec + 32);
        for (int ch = 0; ch < 8; ch++)
            for (int j = 0; j < 16; j++)
                for (int t = 0; t < 4; t++) q[j][ch * 4 + t] = c[ch * 64 + j * 4 + t];
        return;
    }
    const uint8_t *c = rec + RECORD[type] - 256;
    if (type == Q6_K) {
        for (int ch = 0; ch < 4; ch++)
            for (int i = 0; i < 64; i++) { /* i = j * 4 + t */
                const int h2 = rec[64 + ch / 2 * 64 + i] >> (ch % 2 * 4);
                q[i / 4][ch * 8 + i % 4] = (int8_t)((c[ch * 64 + i] & 15) | (h2 & 3) << 4);
                q[i / 4][ch * 8 + 4 + i % 4] = (int8_t)((c[ch * 64 + i] >> 4) | (h2 >> 2 & 3) << 4);
            }
        return;
    }
    uint64_t high[8] = {0};
    if (type == Q5_0) memcpy(high, rec + 32, 64);
    for (int ch = 0; ch < 4; ch++)
        for (int j = 0; j < 16; j++)
            for (int t = 0; t < 4; t++) {
                const uint8_t b = c[ch * 64 + j * 4 + t];
                const int bit = j * 4 + t;
                q[j][ch * 8 + t] = (int8_t)((b & 15) | (int)(high[2 * ch] >> bit & 1) << 4);
                q[j][ch * 8 + 4 + t] = (int8_t)((b >> 4) | (int)(high[2 * ch + 1] >> bit & 1) << 4);
            }
}

/* MR rows, the portable path: the same sums and float operations as the vector paths,
   each record's codes unpacked once for all MR rows */
static inline __attribute__((always_inline)) void generic_rows(ROW_ARGS, const int type,
                                                               const int MR) {
    const int64_t groups = K / G;
    float acc[4][16] = {{0}};
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *r = rec + g * RECORD[type];
        int8_t q[16][G];
        codes(q, r, type);
        for (int j = 0; j < 16; j++) {
            float d, m = 0.0f;
            if (type == Q4_K) {
                memcpy(&d, r + 4 * j, 4);
                memcpy(&m, r + 64 + 4 * j, 4);
            } else {
                uint16_t h[2];
                memcpy(h, r + 2 * j, 2);
                memcpy(h + 1, r + 32 + 2 * j, 2);
                d = half_to_float(h[0]);
                m = type == Q4_1 ? half_to_float(h[1]) : 0.0f;
            }
            if (type == Q6_K) { /* d * sc of k 0..15 and of k 16..31 */
                m = d * (float)(int8_t)r[48 + j];
                d *= (float)(int8_t)r[32 + j];
            }
            for (int row = 0; row < MR; row++) {
                const int64_t rg = row * groups + g;
                const int8_t *a = xq + row * K + g * G;
                if (type == Q6_K) { /* a sum and a scale per half */
                    int32_t low = -32 * xlow[rg], high = -32 * (xsum[rg] - xlow[rg]);
                    for (int k = 0; k < 16; k++) low += q[j][k] * a[k];
                    for (int k = 16; k < G; k++) high += q[j][k] * a[k];
                    acc[row][j] += ((float)high * m + (float)low * d) * xs[rg];
                    continue;
                }
                int32_t dot = OFFSET[type] * xsum[rg];
                for (int k = 0; k < G; k++) dot += q[j][k] * a[k];
                acc[row][j] += (float)dot * (xs[rg] * d);
                if (type == Q4_1 || type == Q4_K) acc[row][j] += (xs[rg] * (float)xsum[rg]) * m;
            }
        }
    }
    for (int row = 0; row < MR; row++)
        for (int j = 0; j < 16; j++) out[row * ldo + j] = acc[row][j] + (bias ? bias[j] : 0);
}

#define WRAP(body, name, T, ...)                                                           \
    static void name(ROW_ARGS) { body(out, ldo, xq, xs, xsum, xlow, K, rec, bias, T, ##__VA_ARGS__); }
#define GENERIC_MR(T, MR) WRAP(generic_rows, generic_##T##_##MR, T, MR)
#define GENERIC_ALL(T) GENERIC_MR(T, 4) GENERIC_MR(T, 2) GENERIC_MR(T, 1)
GENERIC_ALL(Q4_0) GENERIC_ALL(Q4_1) GENERIC_ALL(Q5_0) GENERIC_ALL(Q8_0) GENERIC_ALL(Q4_K)
GENERIC_ALL(Q6_K)

#if defined(__x86_64__)
#include <immintrin.h>

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,f16c")))
#define INLINE static inline __attribute__((always_inline))

VNNI_TARGET INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Q6_K: the 16 columns' scales of k 16 * half .. 16 * half + 15 */
VNNI_TARGET INLINE __m512 vnni_q6k_scales(const uint8_t *r, const int half) {
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + 32 + 16 * half))));
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r)), sc);
}

/* MR rows, one panel: every record's codes are unpacked once for all MR rows (8 at a
   decode batch's width: the unpacking is then a small share of the dot products). Q8_0
   enters vpdpbusd (unsigned first) as q + 128, its sums starting at -128 * sum(xq) */
VNNI_TARGET INLINE void vnni_rows(ROW_ARGS, const int type, const int MR) {
    const int64_t groups = K / G, size = RECORD[type];
    const __m512i low4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 f[8], low[8]; /* low: Q6_K's k 0..15 sums times their scales, xs not yet */
    for (int m = 0; m < MR; m++) f[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *r = rec + g * size;
        const int8_t *a = xq + g * G;
        const int32_t *first = type == Q6_K ? xlow : xsum; /* the sum the first int32 sums cover */
        __m512i c[8];
        for (int m = 0; m < MR; m++)
            c[m] = _mm512_set1_epi32((type == Q8_0 ? -128 : OFFSET[type]) * first[m * groups + g]);
        if (type == Q8_0) {
            for (int ch = 0; ch < 8; ch++) {
                const __m512i b = _mm512_xor_si512(_mm512_loadu_si512(r + 32 + ch * 64), flip);
                for (int m = 0; m < MR; m++)
                    c[m] = _mm512_dpbusd_epi32(c[m], b, bcast4(a + m * K + ch * 4));
            }
        } else {
            const uint8_t *cd = r + size - 256;
            for (int ch = 0; ch < 4; ch++) {
                if (type == Q6_K && ch == 2) { /* k 0..15 done: their sums times their scales */
                    const __m512 d0 = vnni_q6k_scales(r, 0);
                    for (int m = 0; m < MR; m++) {
                        const int64_t rg = m * groups + g;
                        low[m] = _mm512_mul_ps(_mm512_cvtepi32_ps(c[m]), d0);
                        c[m] = _mm512_set1_epi32(-32 * (xsum[rg] - xlow[rg]));
                    }
                }
                const __m512i raw = _mm512_loadu_si512(cd + ch * 64);
                __m512i lo = _mm512_and_si512(raw, low4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
                if (type == Q5_0) {
                    __mmask64 h[2];
                    memcpy(h, r + 32 + ch * 16, 16);
                    lo = _mm512_mask_add_epi8(lo, h[0], lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, h[1], hi, sixteen);
                }
                if (type == Q6_K) { /* the two high bits into bits 4 and 5: lo | (h & 0x30) */
                    const __m512i h2 = _mm512_loadu_si512(r + 64 + ch / 2 * 64);
                    const __m512i bits45 = _mm512_set1_epi8(0x30);
                    const __m512i h_lo = ch % 2 ? h2 : _mm512_slli_epi16(h2, 4);
                    const __m512i h_hi = ch % 2 ? _mm512_srli_epi16(h2, 2) : _mm512_slli_epi16(h2, 2);
                    lo = _mm512_ternarylogic_epi32(lo, h_lo, bits45, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, h_hi, bits45, 0xF8);
                }
                for (int m = 0; m < MR; m++) {
                    c[m] = _mm512_dpbusd_epi32(c[m], lo, bcast4(a + m * K + ch * 8));
                    c[m] = _mm512_dpbusd_epi32(c[m], hi, bcast4(a + m * K + ch * 8 + 4));
                }
            }
        }
        if (type == Q6_K) { /* xs * (low + k 16..31 sums times their scales) */
            const __m512 d1 = vnni_q6k_scales(r, 1);
            for (int m = 0; m < MR; m++) {
                const __m512 both = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[m]), d1, low[m]);
                f[m] = _mm512_fmadd_ps(both, _mm512_set1_ps(xs[m * groups + g]), f[m]);
            }
            continue;
        }
        const __m512 d = type == Q4_K ? _mm512_loadu_ps(r)
                                      : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r));
        for (int m = 0; m < MR; m++) {
            const __m512 s = _mm512_set1_ps(xs[m * groups + g]);
            f[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[m]), _mm512_mul_ps(s, d), f[m]);
        }
        if (type == Q4_1 || type == Q4_K) {
            const __m512 mins = type == Q4_K
                                    ? _mm512_loadu_ps(r + 64)
                                    : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 32)));
            for (int m = 0; m < MR; m++) {
                const float sum = xs[m * groups + g] * (float)xsum[m * groups + g];
                f[m] = _mm512_fmadd_ps(_mm512_set1_ps(sum), mins, f[m]);
            }
        }
    }
    const __m512 z = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int m = 0; m < MR; m++) _mm512_storeu_ps(out + m * ldo, _mm512_add_ps(f[m], z));
}

#define VNNI(T, MR) VNNI_TARGET WRAP(vnni_rows, vnni_##T##_##MR, T, MR)
#define VNNI_ALL(T) VNNI(T, 8) VNNI(T, 4) VNNI(T, 1)
VNNI_ALL(Q4_0) VNNI_ALL(Q4_1) VNNI_ALL(Q5_0) VNNI_ALL(Q8_0) VNNI_ALL(Q4_K) VNNI_ALL(Q6_K)

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

AVX2_TARGET INLINE __m256i bcast4_256(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Q6_K: 8 columns' (h: which 8) scales of k 16 * half .. 16 * half + 15 */
AVX2_TARGET INLINE __m256 avx2_q6k_scales(const uint8_t *r, const int half, const int h) {
    const __m256 sc = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(r + 32 + 16 * half + 8 * h))));
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * h))), sc);
}

/* 32 bits -> 32 bytes, 16 where the bit is set */
AVX2_TARGET INLINE __m256i sixteens(uint32_t bits) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0101010101010101, 0);
    const __m256i select = _mm256_set1_epi64x((int64_t)0x8040201008040201);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)bits), spread);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, select), select),
                            _mm256_set1_epi8(16));
}

/* unsigned codes times 4 signed bytes of x, per column: 8 int32 lanes */
AVX2_TARGET INLINE __m256i udot4(__m256i q, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}

/* signed codes (Q8_0): |q| times x carrying q's sign, as gemm_w8a8.c's dot4 */
AVX2_TARGET INLINE __m256i sdot4(__m256i q, __m256i x) {
    return udot4(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
}

/* MR rows, one panel as two 8-column halves, each half's codes unpacked once */
AVX2_TARGET INLINE void avx2_rows(ROW_ARGS, const int type, const int MR) {
    const int64_t groups = K / G, size = RECORD[type];
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 f[4][2], low[4][2]; /* low: as vnni_rows' */
    for (int m = 0; m < MR; m++) f[m][0] = f[m][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *r = rec + g * size;
        const int8_t *a = xq + g * G;
        const int32_t *first = type == Q6_K ? xlow : xsum; /* the sum the first int32 sums cover */
        __m256i c[4][2];
        for (int m = 0; m < MR; m++)
            c[m][0] = c[m][1] = _mm256_set1_epi32(OFFSET[type] * first[m * groups + g]);
        if (type == Q8_0) {
            for (int ch = 0; ch < 8; ch++)
                for (int h = 0; h < 2; h++) {
                    const __m256i w =
                        _mm256_loadu_si256((const __m256i *)(r + 32 + ch * 64 + h * 32));
                    for (int m = 0; m < MR; m++)
                        c[m][h] = _mm256_add_epi32(c[m][h], sdot4(w, bcast4_256(a + m * K + ch * 4)));
                }
        } else {
            const uint8_t *cd = r + size - 256;
            for (int ch = 0; ch < 4; ch++) {
                if (type == Q6_K && ch == 2) /* k 0..15 done: their sums times their scales */
                    for (int h = 0; h < 2; h++) {
                        const __m256 d0 = avx2_q6k_scales(r, 0, h);
                        for (int m = 0; m < MR; m++) {
                            const int64_t rg = m * groups + g;
                            low[m][h] = _mm256_mul_ps(_mm256_cvtepi32_ps(c[m][h]), d0);
                            c[m][h] = _mm256_set1_epi32(-32 * (xsum[rg] - xlow[rg]));
                        }
                    }
                uint64_t bits[2];
                if (type == Q5_0) memcpy(bits, r + 32 + ch * 16, 16);
                for (int h = 0; h < 2; h++) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(cd + ch * 64 + h * 32));
                    __m256i lo = _mm256_and_si256(raw, low4);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                    if (type == Q5_0) {
                        lo = _mm256_add_epi8(lo, sixteens((uint32_t)(bits[0] >> (32 * h))));
                        hi = _mm256_add_epi8(hi, sixteens((uint32_t)(bits[1] >> (32 * h))));
                    }
                    if (type == Q6_K) { /* the two high bits into bits 4 and 5 */
                        const __m256i h2 = _mm256_loadu_si256((const __m256i *)(r + 64 + ch / 2 * 64 + h * 32));
                        const __m256i bits45 = _mm256_set1_epi8(0x30);
                        const __m256i h_lo = ch % 2 ? h2 : _mm256_slli_epi16(h2, 4);
                        const __m256i h_hi = ch % 2 ? _mm256_srli_epi16(h2, 2) : _mm256_slli_epi16(h2, 2);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(h_lo, bits45));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(h_hi, bits45));
                    }
                    for (int m = 0; m < MR; m++) {
                        const int8_t *am = a + m * K + ch * 8;
                        c[m][h] = _mm256_add_epi32(c[m][h], udot4(lo, bcast4_256(am)));
                        c[m][h] = _mm256_add_epi32(c[m][h], udot4(hi, bcast4_256(am + 4)));
                    }
                }
            }
        }
        if (type == Q6_K) { /* xs * (low + k 16..31 sums times their scales) */
            for (int h = 0; h < 2; h++) {
                const __m256 d1 = avx2_q6k_scales(r, 1, h);
                for (int m = 0; m < MR; m++) {
                    const __m256 both = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[m][h]), d1, low[m][h]);
                    f[m][h] = _mm256_fmadd_ps(both, _mm256_set1_ps(xs[m * groups + g]), f[m][h]);
                }
            }
            continue;
        }
        for (int h = 0; h < 2; h++) {
            const __m256 d = type == Q4_K ? _mm256_loadu_ps((const float *)r + 8 * h)
                                          : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * h)));
            __m256 mins = _mm256_setzero_ps();
            if (type == Q4_1 || type == Q4_K)
                mins = type == Q4_K
                           ? _mm256_loadu_ps((const float *)(r + 64) + 8 * h)
                           : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 32 + 16 * h)));
            for (int m = 0; m < MR; m++) {
                const int64_t rg = m * groups + g;
                const __m256 s = _mm256_set1_ps(xs[rg]);
                f[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[m][h]), _mm256_mul_ps(s, d), f[m][h]);
                if (type == Q4_1 || type == Q4_K)
                    f[m][h] = _mm256_fmadd_ps(_mm256_set1_ps(xs[rg] * (float)xsum[rg]), mins, f[m][h]);
            }
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m256 z = bias ? _mm256_loadu_ps(bias + 8 * h) : _mm256_setzero_ps();
        for (int m = 0; m < MR; m++) _mm256_storeu_ps(out + m * ldo + 8 * h, _mm256_add_ps(f[m][h], z));
    }
}

#define AVX2(T, MR) AVX2_TARGET WRAP(avx2_rows, avx2_##T##_##MR, T, MR)
#define AVX2_ALL(T) AVX2(T, 4) AVX2(T, 2) AVX2(T, 1)
AVX2_ALL(Q4_0) AVX2_ALL(Q4_1) AVX2_ALL(Q5_0) AVX2_ALL(Q8_0) AVX2_ALL(Q4_K) AVX2_ALL(Q6_K)

#endif

/* [path][type][widest .. narrowest] kernels and the rows each takes */
#define WIDTHS(p, T, a, b, c) {p##_##T##_##a, p##_##T##_##b, p##_##T##_##c}
#define ALL_TYPES(p, a, b, c)                                                              \
    {WIDTHS(p, Q4_0, a, b, c), WIDTHS(p, Q4_1, a, b, c), WIDTHS(p, Q5_0, a, b, c),           \
     WIDTHS(p, Q8_0, a, b, c), WIDTHS(p, Q4_K, a, b, c), WIDTHS(p, Q6_K, a, b, c)}
#if defined(__x86_64__)
static const rows_fn ROWS[3][TYPES][3] = {
    ALL_TYPES(generic, 4, 2, 1), ALL_TYPES(avx2, 4, 2, 1), ALL_TYPES(vnni, 8, 4, 1)};
static const int64_t ROWS_M[3][3] = {{4, 2, 1}, {4, 2, 1}, {8, 4, 1}};
#else
static const rows_fn ROWS[3][TYPES][3] = {
    ALL_TYPES(generic, 4, 2, 1), ALL_TYPES(generic, 4, 2, 1), ALL_TYPES(generic, 4, 2, 1)};
static const int64_t ROWS_M[3][3] = {{4, 2, 1}, {4, 2, 1}, {4, 2, 1}};
#endif

int gemm_blocks(float *out, const float *x, const uint8_t *data, const int64_t *panels,
                const float *bias, int64_t M, int64_t N, int64_t K, int64_t path) {
    const int64_t groups = K / G;
    float *xs;
    int32_t *xsum;
    int8_t *xq = w8a8_quantized(x, M, K, &xs, &xsum);
    int32_t *xlow = malloc(M * groups * sizeof(int32_t) + 1);
    if (!xq || !xlow) {
        free(xq);
        free(xlow);
        return 1;
    }
    for (int64_t i = 0; i < M * groups; i++) { /* sum(xq) over each group's k 0..15 */
        int32_t sum = 0;
        for (int k = 0; k < 16; k++) sum += xq[i * G + k];
        xlow[i] = sum;
    }
    /* path 3 (w8a8's AMX tiles) has no blocks kernel: every AMX CPU has AVX512-VNNI */
    const int p_ = path == 3 ? 2 : path < 0 || path > 2 ? 0 : (int)path;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < N / 16; p++) {
        const int type = (int)(panels[p] & 15);
        const uint8_t *rec = data + (panels[p] >> 4);
        const float *b = bias ? bias + p * 16 : 0;
        int64_t m = 0;
        for (int i = 0; i < 3; i++)
            for (const int64_t mr = ROWS_M[p_][i]; m + mr <= M; m += mr)
                ROWS[p_][type][i](out + m * N + p * 16, N, xq + m * K, xs + m * groups,
                                  xsum + m * groups, xlow + m * groups, K, rec, b);
    }
    free(xq);
    free(xlow);
    return 0;
}
