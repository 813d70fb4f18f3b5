/* Matmuls on int8 weights and int8 activations ("w8a8"): out[M, N] = x[M, K] @ W[N, K]^T.

   Both sides are quantized symmetric in groups of G = 32 consecutive k values, each group
   with its own fp32 scale, as llama.cpp's Q8_0: the weights at load (engine/quantization/quant.py,
   scales [N / 16][K / G][16]), each row of x on entry (xq = round(x * 127 / max|x|) per
   group, xs = max|x| / 127). One scale per whole row of x cost SmolLM2 +3.7% perplexity
   (a few outlier channels set every token's scale); groups of 32 on both sides +0.4%.
   The weights' layout serves 4-byte dot products, [N / 16][K / 4][16][4]: one 64-byte
   load holds 4 k values of 16 output columns, what one AVX512-VNNI vpdpbusd multiplies
   and sums into 16 int32 lanes. A group's int32 sums are exact; each group then adds
   sum * xs * scale into fp32 accumulators.

   path: 3 AMX tiles (gemm_amx.c), 2 AVX512-VNNI, 1 AVX2 (vpmaddubsw), 0 portable C (each compiled for its
   instruction set whatever -march says, called only where engine/cpu_features.py found
   it). N must be a multiple of 32, K of G. Returns 0, or 1 when the activation buffers
   could not be had. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define G 32 /* k values per scale, activations and weights alike */

/* the arguments every row kernel takes: out rows and their stride; quantized rows, their
   group scales and group sums (xs, xsum: [rows][K / G]); K; one panel pair (w0, w1 =
   w0 + 16 K) and its group scales (sc0, sc1: [K / G][16] each); bias */
#define ROW_ARGS                                                                           \
    float *out, int64_t ldo, const int8_t *xq, const float *xs, const int32_t *xsum,      \
        int64_t K, const int8_t *w0, const float *sc0, const float *sc1, const float *bias

typedef void (*rows_fn)(ROW_ARGS);

static void w8a8_quantize_rows(int8_t *xq, float *xs, int32_t *xsum, const float *x,
                               int64_t M, int64_t K) {
    const int64_t groups = K / G;
#pragma omp parallel for schedule(static) if (M * K > (1 << 16))
    for (int64_t r = 0; r < M * groups; r++) {
        const float *v = x + r * G;
        float amax = 0.0f;
        for (int k = 0; k < G; k++) amax = fmaxf(amax, fabsf(v[k]));
        /* (1 / amax) * 127 as torch computes 127 / amax (quant.py's reference): values that
           land on n + 0.5 (frequent in real activations) then round alike */
        /* (1 / amax) * 127, as torch computes 127 / amax in quant.py's reference: values
           that land on n + 0.5 (frequent in real activations) then round alike; rounding
           them otherwise cost SmolLM2 +0.98% perplexity where the reference has +0.49% */
        const float inv = amax > 0.0f ? (1.0f / amax) * 127.0f : 0.0f;
        int32_t sum = 0;
        for (int k = 0; k < G; k++) {
            xq[r * G + k] = (int8_t)nearbyintf(v[k] * inv);
            sum += xq[r * G + k];
        }
        xs[r] = amax / 127.0f;
        xsum[r] = sum;
    }
}

/* one row, 32 columns, plain int32 sums per group: the portable path */
static void generic_1(ROW_ARGS) {
    (void)xsum;
    (void)ldo;
    for (int half = 0; half < 2; half++) {
        const int8_t *w = w0 + half * K * 16;
        const float *sc = half ? sc1 : sc0;
        float acc[16] = {0};
        for (int64_t g = 0; g < K / G; g++) {
            int32_t dot[16] = {0};
            for (int64_t k = g * G; k < (g + 1) * G; k += 4)
                for (int j = 0; j < 16; j++)
                    for (int t = 0; t < 4; t++) dot[j] += xq[k + t] * w[k * 16 + j * 4 + t];
            for (int j = 0; j < 16; j++) acc[j] += (float)dot[j] * (xs[g] * sc[g * 16 + j]);
        }
        for (int j = 0; j < 16; j++) out[half * 16 + j] = acc[j] + (bias ? bias[half * 16 + j] : 0);
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* vpdpbusd takes unsigned bytes first: the weights enter as w + 128 (w ^ 0x80), and each
   group's sums start at -128 * sum(xq) of that group to take the 128s back out */
#define VNNI_ROWS(MR)                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vnni"))) static void vnni_##MR(ROW_ARGS) { \
        const int8_t *w1 = w0 + K * 16;                                                    \
        const int64_t groups = K / G;                                                      \
        const __m512i flip = _mm512_set1_epi8((char)0x80);                                 \
        __m512 f0[MR], f1[MR];                                                             \
        for (int m = 0; m < MR; m++) f0[m] = f1[m] = _mm512_setzero_ps();                  \
        for (int64_t g = 0; g < groups; g++) {                                             \
            __m512i c0[MR], c1[MR];                                                        \
            for (int m = 0; m < MR; m++)                                                   \
                c0[m] = c1[m] = _mm512_set1_epi32(-128 * xsum[m * groups + g]);            \
            for (int64_t k = g * G; k < (g + 1) * G; k += 4) {                             \
                const __m512i b0 = _mm512_xor_si512(_mm512_loadu_si512(w0 + k * 16), flip); \
                const __m512i b1 = _mm512_xor_si512(_mm512_loadu_si512(w1 + k * 16), flip); \
                for (int m = 0; m < MR; m++) {                                             \
                    int32_t a;                                                             \
                    memcpy(&a, xq + m * K + k, 4);                                         \
                    const __m512i av = _mm512_set1_epi32(a);                               \
                    c0[m] = _mm512_dpbusd_epi32(c0[m], b0, av);                            \
                    c1[m] = _mm512_dpbusd_epi32(c1[m], b1, av);                            \
                }                                                                          \
            }                                                                              \
            const __m512 s0 = _mm512_loadu_ps(sc0 + g * 16), s1 = _mm512_loadu_ps(sc1 + g * 16); \
            for (int m = 0; m < MR; m++) {                                                 \
                const __m512 a = _mm512_set1_ps(xs[m * groups + g]);                       \
                f0[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0[m]), _mm512_mul_ps(a, s0), f0[m]); \
                f1[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1[m]), _mm512_mul_ps(a, s1), f1[m]); \
            }                                                                              \
        }                                                                                  \
        const __m512 z0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();              \
        const __m512 z1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();         \
        for (int m = 0; m < MR; m++) {                                                     \
            _mm512_storeu_ps(out + m * ldo, _mm512_add_ps(f0[m], z0));                     \
            _mm512_storeu_ps(out + m * ldo + 16, _mm512_add_ps(f1[m], z1));                \
        }                                                                                  \
    }
VNNI_ROWS(4)
VNNI_ROWS(1)

/* x's 4 bytes times the 4 bytes of each column in w, summed: 8 int32 lanes. |w| times x
   carrying w's sign keeps vpmaddubsw's 16-bit pair sums below 2 * 127 * 127 */
__attribute__((target("avx2"))) static inline __m256i dot4(__m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* one row: a panel pair is four 8-column registers of sums, four of results */
__attribute__((target("avx2,fma"))) static void avx2_1(ROW_ARGS) {
    (void)xsum;
    const int64_t groups = K / G;
    __m256 f[4];
    for (int j = 0; j < 4; j++) f[j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256i c[4];
        for (int j = 0; j < 4; j++) c[j] = _mm256_setzero_si256();
        for (int64_t k = g * G; k < (g + 1) * G; k += 4) {
            int32_t a;
            memcpy(&a, xq + k, 4);
            const __m256i av = _mm256_set1_epi32(a);
            for (int j = 0; j < 4; j++) {
                const int8_t *w = (j < 2 ? w0 : w0 + K * 16) + k * 16 + (j & 1) * 32;
                c[j] = _mm256_add_epi32(c[j], dot4(_mm256_loadu_si256((const __m256i *)w), av));
            }
        }
        const __m256 a = _mm256_set1_ps(xs[g]);
        for (int j = 0; j < 4; j++) {
            const __m256 sj = _mm256_loadu_ps((j < 2 ? sc0 : sc1) + g * 16 + (j & 1) * 8);
            f[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[j]), _mm256_mul_ps(a, sj), f[j]);
        }
    }
    for (int j = 0; j < 4; j++) {
        const __m256 zj = bias ? _mm256_loadu_ps(bias + 8 * j) : _mm256_setzero_ps();
        _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(f[j], zj));
    }
    (void)ldo;
}

static const rows_fn ROWS[3][2] = {{generic_1, generic_1}, {avx2_1, avx2_1}, {vnni_4, vnni_1}};
static const int64_t ROWS_M[3][2] = {{1, 1}, {1, 1}, {4, 1}};
#else
static const rows_fn ROWS[3][2] = {{generic_1, generic_1}, {generic_1, generic_1},
                                   {generic_1, generic_1}};
static const int64_t ROWS_M[3][2] = {{1, 1}, {1, 1}, {1, 1}};
#endif

int8_t *w8a8_quantized(const float *x, int64_t M, int64_t K, float **xs, int32_t **xsum) {
    const int64_t groups = K / G, q_bytes = (M * K + 63) & ~(int64_t)63;
    int8_t *xq = malloc(q_bytes + M * groups * (sizeof(float) + sizeof(int32_t)));
    if (!xq)
        return 0;
    *xs = (float *)(xq + q_bytes);
    *xsum = (int32_t *)(*xs + M * groups);
    w8a8_quantize_rows(xq, *xs, *xsum, x, M, K);
    return xq;
}

int gemm_w8a8_panels(float *out, const float *x, const int8_t *panels, const float *scale,
                     const float *bias, int64_t M, int64_t N, int64_t K, int64_t path) {
    const int64_t groups = K / G;
    float *xs;
    int32_t *xsum;
    int8_t *xq = w8a8_quantized(x, M, K, &xs, &xsum);
    if (!xq)
        return 1;
    if (path == 3) {
        const int status = gemm_w8a8_amx(out, xq, xs, panels, scale, bias, M, N, K);
        free(xq);
        return status;
    }
    const int p_ = path < 0 || path > 2 ? 0 : (int)path;
    const int64_t pairs = N / 32, pair_bytes = 2 * K * 16, panel_scales = groups * 16;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; p++) {
        const int8_t *w = panels + p * pair_bytes;
        const float *sc0 = scale + 2 * p * panel_scales, *sc1 = sc0 + panel_scales;
        const float *b = bias ? bias + p * 32 : 0;
        int64_t m = 0;
        for (int i = 0; i < 2; i++)
            for (const int64_t mr = ROWS_M[p_][i]; m + mr <= M; m += mr)
                ROWS[p_][i](out + m * N + p * 32, N, xq + m * K, xs + m * groups,
                            xsum + m * groups, K, w, sc0, sc1, b);
    }
    free(xq);
    return 0;
}
