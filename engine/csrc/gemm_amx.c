/* w8a8 matmuls on AMX tiles (gemm_w8a8.c's path 3): out[M, N] = x[M, K] @ W[N, K]^T with
   the same int8 values, group scales and float sums as the AVX512-VNNI path.

   The w8a8 panels [N / 16][K / 4][16][4] are already what a tile multiply takes as its
   right operand: one group of 32 k values of a panel is 8 rows of 64 bytes (16 columns x 4
   k values), contiguous. _tile_dpbssd multiplies 16 rows of x's int8 group (16 x 32 bytes)
   by it into 16 x 16 exact int32 sums; each group's sums are stored and added into fp32
   accumulators times xs * scale, as the VNNI path does, so both give the same bits.

   Compiled only where the compiler takes -mamx-tile -mamx-int8 (engine/native.py then
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
#define TILES "amx-tile,amx-int8,avx512f"
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

__attribute__((target(TILES))) static void tiles_on(void) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[T_X] = TR, cfg.colsb[T_X] = G;        /* 16 rows x 32 int8 of x */
    cfg.rows[T_W] = G / 4, cfg.colsb[T_W] = 64;    /* 8 rows x (16 columns x 4 k) */
    cfg.rows[T_SUM] = TR, cfg.colsb[T_SUM] = 64;   /* 16 x 16 int32 */
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
        tiles_on(); /* the tile configuration is per thread */
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
#else
int w8a8_amx_compiled(void) { return 0; }

int gemm_w8a8_amx(float *out, const int8_t *xq, const float *xs, const int8_t *panels,
                  const float *scale, const float *bias, int64_t M, int64_t N, int64_t K) {
    (void)out, (void)xq, (void)xs, (void)panels, (void)scale, (void)bias, (void)M, (void)N;
    (void)K;
    return 2; /* not compiled here: engine/quantization/amx.py never picks this path */
}
#endif
