/* Matmuls on int8 weights: out[M, N] = (x[M, K] @ Q[N, K]^T) * scale[N] (+ bias).

   Q is the weight requantized per output row at load (symmetric: W[n] ~ Q[n] * scale[n]),
   packed like the fp32 panels, [N / 16][K][16] int8 (engine/quantization/quant.py). A decode step reads
   every weight once and is bound by memory bandwidth, so a quarter of fp32's bytes is the
   gain. Weights are widened to fp32 in registers and meet x in fp32 FMAs (fp32
   accumulation); the row scale factors out of the K sum and is applied once per output.

   path: 2 AVX-512, 1 AVX2 (each compiled for its instruction set whatever -march says,
   called only where engine/cpu_features.py found it), 0 portable C vectors. Beyond
   SMALL_M rows the widening would repeat for every row block, so the first row block
   keeps each panel pair it widens, scaled, in an fp32 buffer that gemm.c's row kernels
   then read from L2 for the other rows.
   N must be a multiple of 32. Returns 0, or 1 when a thread's buffer could not be had. */

#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "vec.h"

#define SMALL_M 16

typedef int8_t i8x16 __attribute__((vector_size(16)));

/* int8 -> int32 -> fp32: GCC turns a direct int8 -> fp32 conversion into 16 scalar ones */
static inline vec widen(const int8_t *p) {
    i8x16 q;
    memcpy(&q, p, sizeof q);
    return __builtin_convertvector(__builtin_convertvector(q, ivec), vec);
}

/* pf_lines cache lines from pf are prefetched, spread evenly over the K steps */
#define PREFETCH_STEP(k)                                                                   \
    for (; line * K < ((k) + 1) * pf_lines; line++) __builtin_prefetch(pf + line * 64)

#define GENERIC_ROWS(MR)                                                                   \
    static void generic_##MR(float *out, int64_t ldo, const float *x, int64_t K,          \
                             const int8_t *w0, const float *s, const float *bias,         \
                             const int8_t *pf, int64_t pf_lines, float *keep) {           \
        const int8_t *w1 = w0 + K * LANES;                                                 \
        vec c0[MR], c1[MR];                                                                \
        for (int m = 0; m < MR; m++) c0[m] = c1[m] = (vec){0};                             \
        int64_t line = 0;                                                                  \
        for (int64_t k = 0; k < K; k++) {                                                  \
            PREFETCH_STEP(k);                                                              \
            const vec b0 = widen(w0 + k * LANES), b1 = widen(w1 + k * LANES);              \
            if (keep) {                                                                    \
                store(keep + k * LANES, b0 * load(s));                                     \
                store(keep + (K + k) * LANES, b1 * load(s + LANES));                       \
            }                                                                              \
            for (int m = 0; m < MR; m++) {                                                 \
                c0[m] += splat(x[m * K + k]) * b0;                                         \
                c1[m] += splat(x[m * K + k]) * b1;                                         \
            }                                                                              \
        }                                                                                  \
        const vec z0 = bias ? load(bias) : (vec){0}, z1 = bias ? load(bias + LANES) : (vec){0}; \
        for (int m = 0; m < MR; m++) {                                                     \
            store(out + m * ldo, c0[m] * load(s) + z0);                                    \
            store(out + m * ldo + LANES, c1[m] * load(s + LANES) + z1);                    \
        }                                                                                  \
    }
GENERIC_ROWS(4)
GENERIC_ROWS(1)

typedef void (*rows_fn)(float *, int64_t, const float *, int64_t, const int8_t *, const float *,
                        const float *, const int8_t *, int64_t, float *);

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512_ROWS(MR)                                                                    \
    __attribute__((target("avx512f"))) static void avx512_##MR(                            \
        float *out, int64_t ldo, const float *x, int64_t K, const int8_t *w0,             \
        const float *s, const float *bias, const int8_t *pf, int64_t pf_lines,            \
        float *keep) {                                                                     \
        const int8_t *w1 = w0 + K * 16;                                                    \
        const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + 16);                \
        __m512 c0[MR], c1[MR];                                                             \
        for (int m = 0; m < MR; m++) c0[m] = c1[m] = _mm512_setzero_ps();                  \
        int64_t line = 0;                                                                  \
        for (int64_t k = 0; k < K; k++) {                                                  \
            PREFETCH_STEP(k);                                                              \
            const __m512 b0 = _mm512_cvtepi32_ps(                                          \
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w0 + k * 16))));    \
            const __m512 b1 = _mm512_cvtepi32_ps(                                          \
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w1 + k * 16))));    \
            if (keep) {                                                                    \
                _mm512_storeu_ps(keep + k * 16, _mm512_mul_ps(b0, s0));                    \
                _mm512_storeu_ps(keep + (K + k) * 16, _mm512_mul_ps(b1, s1));              \
            }                                                                              \
            for (int m = 0; m < MR; m++) {                                                 \
                const __m512 a = _mm512_set1_ps(x[m * K + k]);                             \
                c0[m] = _mm512_fmadd_ps(a, b0, c0[m]);                                     \
                c1[m] = _mm512_fmadd_ps(a, b1, c1[m]);                                     \
            }                                                                              \
        }                                                                                  \
        const __m512 z0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();              \
        const __m512 z1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();         \
        for (int m = 0; m < MR; m++) {                                                     \
            _mm512_storeu_ps(out + m * ldo, _mm512_fmadd_ps(c0[m], s0, z0));               \
            _mm512_storeu_ps(out + m * ldo + 16, _mm512_fmadd_ps(c1[m], s1, z1));          \
        }                                                                                  \
    }
AVX512_ROWS(8)
AVX512_ROWS(4)
AVX512_ROWS(1)

/* a pair of 16-column panels is four 8-lane registers: 2 rows fit AVX2's 16 registers */
__attribute__((target("avx2,fma"))) static inline __m256 widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

#define AVX2_ROWS(MR)                                                                      \
    __attribute__((target("avx2,fma"))) static void avx2_##MR(                             \
        float *out, int64_t ldo, const float *x, int64_t K, const int8_t *w0,             \
        const float *s, const float *bias, const int8_t *pf, int64_t pf_lines,            \
        float *keep) {                                                                     \
        const int8_t *w1 = w0 + K * 16;                                                    \
        __m256 c[MR][4];                                                                   \
        for (int m = 0; m < MR; m++)                                                       \
            for (int j = 0; j < 4; j++) c[m][j] = _mm256_setzero_ps();                     \
        int64_t line = 0;                                                                  \
        for (int64_t k = 0; k < K; k++) {                                                  \
            PREFETCH_STEP(k);                                                              \
            const __m256 b[4] = {widen8(w0 + k * 16), widen8(w0 + k * 16 + 8),             \
                                 widen8(w1 + k * 16), widen8(w1 + k * 16 + 8)};            \
            for (int j = 0; keep && j < 4; j++)                                            \
                _mm256_storeu_ps(keep + ((j >> 1) * K + k) * 16 + (j & 1) * 8,             \
                                 _mm256_mul_ps(b[j], _mm256_loadu_ps(s + 8 * j)));         \
            for (int m = 0; m < MR; m++) {                                                 \
                const __m256 a = _mm256_set1_ps(x[m * K + k]);                             \
                for (int j = 0; j < 4; j++) c[m][j] = _mm256_fmadd_ps(a, b[j], c[m][j]);   \
            }                                                                              \
        }                                                                                  \
        for (int j = 0; j < 4; j++) {                                                      \
            const __m256 sj = _mm256_loadu_ps(s + 8 * j);                                  \
            const __m256 zj = bias ? _mm256_loadu_ps(bias + 8 * j) : _mm256_setzero_ps();  \
            for (int m = 0; m < MR; m++)                                                   \
                _mm256_storeu_ps(out + m * ldo + 8 * j, _mm256_fmadd_ps(c[m][j], sj, zj)); \
        }                                                                                  \
    }
AVX2_ROWS(2)
AVX2_ROWS(1)

static const rows_fn ROWS[3][3] = {{generic_4, generic_4, generic_1},
                                   {avx2_2, avx2_2, avx2_1},
                                   {avx512_8, avx512_4, avx512_1}};
static const int64_t ROWS_M[3][3] = {{4, 4, 1}, {2, 2, 1}, {8, 4, 1}};
#else
static const rows_fn ROWS[3][3] = {{generic_4, generic_4, generic_1},
                                   {generic_4, generic_4, generic_1},
                                   {generic_4, generic_4, generic_1}};
static const int64_t ROWS_M[3][3] = {{4, 4, 1}, {4, 4, 1}, {4, 4, 1}};
#endif

/* every row of x against one panel pair; only the first row block prefetches (the next
   pairs, from memory), the later ones read this pair from L1/L2 */
static void small_m(float *o, int64_t N, const float *x, int64_t M, int64_t K,
                    const int8_t *w, const float *s, const float *b, const int8_t *pf,
                    int64_t pf_lines, int path) {
    int64_t m = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t mr = ROWS_M[path][i];
        for (; m + mr <= M; m += mr, pf_lines = 0)
            ROWS[path][i](o + m * N, N, x + m * K, K, w, s, b, pf, pf_lines, 0);
    }
}

int gemm_int8_panels(float *out, const float *x, const int8_t *panels, const float *scale,
                     const float *bias, int64_t M, int64_t N, int64_t K, int64_t path) {
    const int64_t pairs = N / (2 * LANES), pair_bytes = 2 * K * LANES;
    const int p_ = path < 0 || path > 2 ? 0 : (int)path;
    /* prefetch distance in pairs: ~256 KB ahead, as gemm.c */
    int64_t ahead = (256 << 10) / pair_bytes;
    ahead = ahead < 1 ? 1 : ahead > 8 ? 8 : ahead;
    int failed = 0;
#pragma omp parallel
    {
        float *buf = M > SMALL_M ? malloc(pair_bytes * sizeof(float)) : 0;
        if (M > SMALL_M && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const int8_t *w = panels + p * pair_bytes;
            const float *s = scale + p * 2 * LANES, *b = bias ? bias + p * 2 * LANES : 0;
            float *o = out + p * 2 * LANES;
            const int8_t *pf = p + ahead < pairs ? w + ahead * pair_bytes : 0;
            if (M <= SMALL_M) {
                small_m(o, N, x, M, K, w, s, b, pf, pf ? pair_bytes / 64 : 0, p_);
            } else if (buf) {
                /* the first row block widens the pair (streaming it from memory while it
                   computes) and keeps it, scaled, for the fp32 kernels and the other rows */
                const int64_t mr = ROWS_M[p_][0];
                ROWS[p_][0](o, N, x, K, w, s, b, pf, pf ? pair_bytes / 64 : 0, buf);
                gemm_pair_rows(o + mr * N, N, x + mr * K, M - mr, K, buf, b);
            }
        }
        free(buf);
    }
    return failed;
}
