/* Matmuls on AMX tiles: w8a8 (gemm_w8a8.c's path 3) and bf16 (gemm_bf16.c's path 2),
   out[M, N] = x[M, K] @ W[N, K]^T.

   w8a8: the same int8 values, group scales and float sums as the AVX512-VNNI path.

   The w8a8 panels [N / 16][K / 4][16][4] are already what a tile multiply takes as its
   right operand: one group of 32 k values of a panel is 8 rows of 64 bytes (16 columns x 4
   k values), contiguous. _tile_dpbssd multiplies 16 rows of x's int8 group (16 x 32 bytes)
   by it into 16 x 16 exact int32 sums; each group's sums are stored and added into fp32
   accumulators times xs * scale, as the VNNI path does, so both give the same bits.

   bf16: the panels [N / 16][K / 2][16][2] are _tile_dpbf16ps's right operand as they are
   (32 k values of a panel: 16 rows of 64 bytes); x rounded to bf16 as the avx512_bf16
   path does; the fp32 sums stay in the tile over all of K (no scales), so they equal that
   path's up to the order of the fp32 additions. K a multiple of 32.

   Compiled only where the compiler takes -mamx-tile -mamx-int8 -mamx-bf16 (engine/native.py then
   defines TIERGATE_AMX); called only where engine/cpu_features.py found AMX and Linux
   granted the tile state (arch_prctl), after engine/quantization/amx.py checked it against
   the VNNI path. x's rows are padded to a multiple of 16 with zeros (a tile's rows). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define G 32  /* k values per scale (gemm_w8a8.c's G) */
#define TR 16 /* rows of x per tile */

#if defined(__x86_64__) && defined(TIERGATE_AMX)
#include <immintrin.h>
#ifdef TIERGATE_AMX_EMULATE /* tests/amx_emulate.h: the tile instructions in plain C, to */
#include "amx_emulate.h"    /* check this file's layouts on CPUs without AMX */
#define TILES "avx512f"
#else
#define TILES "amx-tile,amx-int8,amx-bf16,avx512f"
#endif

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* tile registers (literals: gcc's tile intrinsics paste them into the instruction) */
#define T_X 0
#define T_W 1
#define T_SUM 2

/* x's tile: 16 rows of x_bytes; the weights': w_rows of 64 bytes; the sums: 16 x 16 */
__attribute__((target(TILES))) static void tiles_on(int x_bytes, int w_rows) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[T_X] = TR, cfg.colsb[T_X] = (uint16_t)x_bytes;
    cfg.rows[T_W] = (uint8_t)w_rows, cfg.colsb[T_W] = 64;
    cfg.rows[T_SUM] = TR, cfg.colsb[T_SUM] = 64;
    _tile_loadconfig(&cfg);
}

__attribute__((target(TILES))) static void tiles_off(void) { _tile_release(); }

/* one panel (16 columns) times 16 rows of x (rows of them real) */
__attribute__((target(TILES))) static void
panel_rows(float *out, int64_t ldo, int rows, const int8_t *xq, const float *xs, int64_t K,
           const int8_t *w, const float *sc, const float *bias) {
    const int64_t groups = K / G;
    int32_t sums[TR * 16] __attribute__((aligned(64)));
    __m512 acc[TR];
    for (int r = 0; r < TR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        _tile_zero(T_SUM);
        _tile_loadd(T_X, xq + g * G, K);
        _tile_loadd(T_W, w + g * (G / 4) * 64, 64);
        _tile_dpbssd(T_SUM, T_X, T_W);
        _tile_stored(T_SUM, sums, 64);
        const __m512 s = _mm512_loadu_ps(sc + g * 16);
        for (int r = 0; r < rows; r++) {
            const __m512 a = _mm512_set1_ps(xs[r * groups + g]);
            const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(sums + r * 16));
            acc[r] = _mm512_fmadd_ps(c, _mm512_mul_ps(a, s), acc[r]);
        }
    }
    const __m512 z = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(out + r * ldo, _mm512_add_ps(acc[r], z));
}

int w8a8_amx_compiled(void) { return 1; }

int gemm_w8a8_amx(float *out, const int8_t *xq, const float *xs, const int8_t *panels,
                  const float *scale, const float *bias, int64_t M, int64_t N, int64_t K) {
    const int64_t groups = K / G, blocks = (M + TR - 1) / TR, padded = blocks * TR;
    int8_t *xp = calloc(padded * K + padded * groups * sizeof(float), 1);
    if (!xp)
        return 1;
    float *sp = (float *)(xp + padded * K);
    memcpy(xp, xq, M * K);
    memcpy(sp, xs, M * groups * sizeof(float));
    const int64_t panels_n = N / 16;
#pragma omp parallel
    {
        tiles_on(G, G / 4); /* per thread: 32 int8 of x, 8 rows of (16 columns x 4 k) */
#pragma omp for schedule(static) collapse(2)
        for (int64_t p = 0; p < panels_n; p++)
            for (int64_t b = 0; b < blocks; b++) {
                const int rows = (int)(M - b * TR < TR ? M - b * TR : TR);
                panel_rows(out + b * TR * N + p * 16, N, rows, xp + b * TR * K,
                           sp + b * TR * groups, K, panels + p * K * 16,
                           scale + p * groups * 16, bias ? bias + p * 16 : 0);
            }
        tiles_off();
    }
    free(xp);
    return 0;
}

/* one panel times 16 rows of x in bf16 (rows of them real), 32 k values a step */
__attribute__((target(TILES))) static void
bf16_panel_rows(float *out, int64_t ldo, int rows, const uint16_t *xb, int64_t K,
                const uint16_t *w, const float *bias) {
    float sums[TR * 16] __attribute__((aligned(64)));
    _tile_zero(T_SUM);
    for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(T_X, xb + k, K * 2);
        _tile_loadd(T_W, w + k * 16, 64);
        _tile_dpbf16ps(T_SUM, T_X, T_W);
    }
    _tile_stored(T_SUM, sums, 64);
    const __m512 z = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++)
        _mm512_storeu_ps(out + r * ldo, _mm512_add_ps(_mm512_load_ps(sums + r * 16), z));
}

int gemm_bf16_amx(float *out, const uint16_t *xb, const uint16_t *panels, const float *bias,
                  int64_t M, int64_t N, int64_t K) {
    if (K % 32)
        return 2;
    const int64_t blocks = (M + TR - 1) / TR, padded = blocks * TR;
    uint16_t *xp = calloc(padded * K, sizeof(uint16_t));
    if (!xp)
        return 1;
    memcpy(xp, xb, M * K * sizeof(uint16_t));
    const int64_t panels_n = N / 16;
#pragma omp parallel
    {
        tiles_on(64, 16); /* 32 bf16 of x; 16 rows of (16 columns x 2 k) */
#pragma omp for schedule(static) collapse(2)
        for (int64_t p = 0; p < panels_n; p++)
            for (int64_t b = 0; b < blocks; b++) {
                const int rows = (int)(M - b * TR < TR ? M - b * TR : TR);
                bf16_panel_rows(out + b * TR * N + p * 16, N, rows, xp + b * TR * K, K,
                                panels + p * K * 16, bias ? bias + p * 16 : 0);
            }
        tiles_off();
    }
    free(xp);
    return 0;
}
#else
int w8a8_amx_compiled(void) { return 0; }

int gemm_bf16_amx(float *out, const uint16_t *xb, const uint16_t *panels, const float *bias,
                  int64_t M, int64_t N, int64_t K) {
    (void)out, (void)xb, (void)panels, (void)bias, (void)M, (void)N, (void)K;
    return 2;
}

int gemm_w8a8_amx(float *out, const int8_t *xq, const float *xs, const int8_t *panels,
                  const float *scale, const float *bias, int64_t M, int64_t N, int64_t K) {
    (void)out, (void)xq, (void)xs, (void)panels, (void)scale, (void)bias, (void)M, (void)N;
    (void)K;
    return 2; /* not compiled here: engine/quantization/amx.py never picks this path */
}
#endif
