/* Small-batch fp32 matmul for decode steps: out[M, N] = x[M, K] @ W[N, K]^T (+ bias).

   At a few dozen rows a decode step's matmuls are bound by reading the weights (4 bytes
   each, used M times), and oneDNN's packed GEMM streams them at ~25 GB/s here, half of
   what this CPU reads sequentially. W is packed once into panels of 16 output columns,
   [N / 16][K][16] (pack_panels in engine/ops.py); each thread walks a contiguous range of
   panel pairs front to back, prefetching the next pair while it computes this one, and
   every row block reuses the pair from L2. N must be a multiple of 32. */

#include <stdint.h>

#include "kernels.h"
#include "vec.h"

/* pf_lines cache lines from pf are prefetched, spread evenly over the K steps */
#define ROW_KERNEL(MR)                                                                     \
    static void rows_##MR(float *out, int64_t ldo, const float *x, int64_t K,             \
                          const float *w0, const float *pf, int64_t pf_lines,             \
                          const float *bias) {                                            \
        const float *w1 = w0 + K * LANES;                                                  \
        vec c0[MR], c1[MR];                                                                \
        for (int m = 0; m < MR; m++) c0[m] = c1[m] = (vec){0};                             \
        int64_t line = 0;                                                                  \
        for (int64_t k = 0; k < K; k++) {                                                  \
            for (; line * K < (k + 1) * pf_lines; line++)                                  \
                __builtin_prefetch(pf + line * LANES);                                     \
            const vec b0 = load(w0 + k * LANES), b1 = load(w1 + k * LANES);                \
            for (int m = 0; m < MR; m++) {                                                 \
                const vec a = splat(x[m * K + k]);                                         \
                c0[m] += a * b0;                                                           \
                c1[m] += a * b1;                                                           \
            }                                                                              \
        }                                                                                  \
        const vec bias0 = bias ? load(bias) : (vec){0};                                    \
        const vec bias1 = bias ? load(bias + LANES) : (vec){0};                            \
        for (int m = 0; m < MR; m++) {                                                     \
            store(out + m * ldo, c0[m] + bias0);                                           \
            store(out + m * ldo + LANES, c1[m] + bias1);                                   \
        }                                                                                  \
    }

ROW_KERNEL(12)
ROW_KERNEL(8)
ROW_KERNEL(4)
ROW_KERNEL(2)
ROW_KERNEL(1)

void gemm_panels(float *out, const float *x, const float *panels, const float *bias, int64_t M,
                 int64_t N, int64_t K) {
    const int64_t pairs = N / (2 * LANES), pair_lines = 2 * K;
    /* prefetch distance in pairs: ~256 KB ahead (measured best: 2-3 pairs at K = 576,
       where one pair ahead leaves the LM head ~20% slower), within L2 for any K */
    int64_t ahead = (256 << 10) / (pair_lines * 64);
    ahead = ahead < 1 ? 1 : ahead > 3 ? 3 : ahead;
    const int64_t blocks = M / 12 + (M % 12) / 8 + (M % 12 % 8) / 4 + (M % 4) / 2 + M % 2;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; p++) {
        const float *w = panels + p * pair_lines * LANES;
        const float *b = bias ? bias + p * 2 * LANES : 0;
        float *o = out + p * 2 * LANES;
        /* each row block prefetches its share of a pair ahead: the first block reads
           this pair from memory (or L2, when prefetched), the others from L2 */
        const float *pf = p + ahead < pairs ? w + ahead * pair_lines * LANES : 0;
        const int64_t share = pf ? (pair_lines + blocks - 1) / blocks : 0;
        int64_t m = 0, j = 0;
#define PF pf + j * share * LANES, (j + 1) * share <= pair_lines ? share : pair_lines - j * share
        for (; m + 12 <= M; m += 12, j++) rows_12(o + m * N, N, x + m * K, K, w, PF, b);
        for (; m + 8 <= M; m += 8, j++) rows_8(o + m * N, N, x + m * K, K, w, PF, b);
        for (; m + 4 <= M; m += 4, j++) rows_4(o + m * N, N, x + m * K, K, w, PF, b);
        for (; m + 2 <= M; m += 2, j++) rows_2(o + m * N, N, x + m * K, K, w, PF, b);
        for (; m < M; m++, j++) rows_1(o + m * N, N, x + m * K, K, w, PF, b);
#undef PF
    }
}

/* every row of x against one pair of panels (no prefetch): gemm_int8.c's large-M path */
void gemm_pair_rows(float *out, int64_t ldo, const float *x, int64_t M, int64_t K,
                    const float *pair, const float *bias) {
    int64_t m = 0;
    for (; m + 12 <= M; m += 12) rows_12(out + m * ldo, ldo, x + m * K, K, pair, 0, 0, bias);
    for (; m + 8 <= M; m += 8) rows_8(out + m * ldo, ldo, x + m * K, K, pair, 0, 0, bias);
    for (; m + 4 <= M; m += 4) rows_4(out + m * ldo, ldo, x + m * K, K, pair, 0, 0, bias);
    for (; m + 2 <= M; m += 2) rows_2(out + m * ldo, ldo, x + m * K, K, pair, 0, 0, bias);
    for (; m < M; m++) rows_1(out + m * ldo, ldo, x + m * K, K, pair, 0, 0, bias);
}
