/* Matmuls on bf16 weights: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), fp32 accumulation.

   W is rounded to bf16 at load (engine/ops.py: half of fp32's bytes, 8 bits of mantissa)
   and laid out in pairs of k values per column, [N / 16][K / 2][16][2]: one 32-bit lane
   holds (k, k + 1) of one column, what AVX512-BF16 vdpbf16ps multiplies and adds into an
   fp32 lane (32 multiply-adds an instruction, twice fp32 FMA's). That path rounds x to
   bf16 too, once per call (round to nearest even, as torch's x.bfloat16()).
   Without AVX512-BF16 the weights are widened to fp32 in registers (a 16-bit shift) and
   meet x in fp32 FMAs: the same bytes streamed, x kept in fp32.

   path: 2 AMX tiles (gemm_amx.c; K a multiple of 32, else path 1), 1 AVX512-BF16, 0
   portable (GCC vectors). N must be a multiple of 32, K of 2. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec.h"

/* one row against one panel pair, x in fp32: each lane's two bf16 become two fp32 */
static void widen_1(float *out, const float *x, int64_t K, const uint16_t *w0,
                    const float *bias) {
    const uint16_t *w1 = w0 + K * 16;
    vec c0 = {0}, c1 = {0};
    for (int64_t k = 0; k < K; k += 2) {
        uvec p0, p1;
        memcpy(&p0, w0 + k * 16, sizeof p0);
        memcpy(&p1, w1 + k * 16, sizeof p1);
        const uvec hi = (uvec){0} + 0xffff0000u;
        c0 += splat(x[k]) * (vec)(p0 << 16) + splat(x[k + 1]) * (vec)(p0 & hi);
        c1 += splat(x[k]) * (vec)(p1 << 16) + splat(x[k + 1]) * (vec)(p1 & hi);
    }
    store(out, c0 + (bias ? load(bias) : (vec){0}));
    store(out + LANES, c1 + (bias ? load(bias + LANES) : (vec){0}));
}

#if defined(__x86_64__)
#include <immintrin.h>

#define BF16_ROWS(MR)                                                                      \
    __attribute__((target("avx512f,avx512bf16"))) static void bf16_##MR(                   \
        float *out, int64_t ldo, const uint16_t *xb, int64_t K, const uint16_t *w0,       \
        const float *bias) {                                                               \
        const uint16_t *w1 = w0 + K * 16;                                                  \
        __m512 c0[MR], c1[MR];                                                             \
        for (int m = 0; m < MR; m++) c0[m] = c1[m] = _mm512_setzero_ps();                  \
        for (int64_t k = 0; k < K; k += 2) {                                               \
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(w0 + k * 16);                 \
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(w1 + k * 16);                 \
            for (int m = 0; m < MR; m++) {                                                 \
                int32_t a;                                                                 \
                memcpy(&a, xb + m * K + k, 4);                                             \
                const __m512bh av = (__m512bh)_mm512_set1_epi32(a);                        \
                c0[m] = _mm512_dpbf16_ps(c0[m], av, b0);                                   \
                c1[m] = _mm512_dpbf16_ps(c1[m], av, b1);                                   \
            }                                                                              \
        }                                                                                  \
        const __m512 z0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();              \
        const __m512 z1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();         \
        for (int m = 0; m < MR; m++) {                                                     \
            _mm512_storeu_ps(out + m * ldo, _mm512_add_ps(c0[m], z0));                     \
            _mm512_storeu_ps(out + m * ldo + 16, _mm512_add_ps(c1[m], z1));                \
        }                                                                                  \
    }
BF16_ROWS(8)
BF16_ROWS(1)
#define HAVE_BF16_PATH 1
#endif

int gemm_bf16_panels(float *out, const float *x, const uint16_t *panels, const float *bias,
                     int64_t M, int64_t N, int64_t K, int64_t path) {
    const int64_t pairs = N / 32, pair_elems = 2 * K * 16;
#ifdef HAVE_BF16_PATH
    if (path == 1 || path == 2) {
        uint16_t *xb = malloc(M * K * sizeof(uint16_t));
        if (!xb) return 1;
        for (int64_t i = 0; i < M * K; i++) xb[i] = f32_to_bf16(x[i]);
        if (path == 2 && K % 32 == 0) {
            const int status = gemm_bf16_amx(out, xb, panels, bias, M, N, K);
            free(xb);
            return status;
        }
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const uint16_t *w = panels + p * pair_elems;
            const float *b = bias ? bias + p * 32 : 0;
            int64_t m = 0;
            for (; m + 8 <= M; m += 8) bf16_8(out + m * N + p * 32, N, xb + m * K, K, w, b);
            for (; m < M; m++) bf16_1(out + m * N + p * 32, N, xb + m * K, K, w, b);
        }
        free(xb);
        return 0;
    }
#endif
    (void)path;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; p++)
        for (int64_t m = 0; m < M; m++)
            widen_1(out + m * N + p * 32, x + m * K, K, panels + p * pair_elems,
                    bias ? bias + p * 32 : 0);
    return 0;
}
