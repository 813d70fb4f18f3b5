/* The AMX tile instructions engine/csrc/gemm_amx.c uses, in plain C (one thread's tile
   state per thread, as the hardware's): tests/test_amx_gemm.py builds the kernel with
   -DTIERGATE_AMX_EMULATE against this header to check its layouts and loops on CPUs
   without AMX. Semantics per Intel's SDM: rows and bytes per row from the last config. */
#ifndef TIERGATE_AMX_EMULATE_H
#define TIERGATE_AMX_EMULATE_H

#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} EmuConfig;

static _Thread_local EmuConfig emu_cfg;
static _Thread_local uint8_t emu_tile[8][16][64];

#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbssd
#undef _tile_dpbf16ps

static inline void emu_loadconfig(const void *cfg) { memcpy(&emu_cfg, cfg, sizeof emu_cfg); }
static inline void emu_release(void) { memset(emu_tile, 0, sizeof emu_tile); }
static inline void emu_zero(int t) { memset(emu_tile[t], 0, sizeof emu_tile[t]); }
static inline void emu_loadd(int t, const void *base, int64_t stride) {
    for (int r = 0; r < emu_cfg.rows[t]; r++)
        memcpy(emu_tile[t][r], (const uint8_t *)base + r * stride, emu_cfg.colsb[t]);
}
static inline void emu_stored(int t, void *base, int64_t stride) {
    for (int r = 0; r < emu_cfg.rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, emu_tile[t][r], emu_cfg.colsb[t]);
}
/* c[m][n] += sum over k of a's bytes 4k..4k+3 in row m times b's row k bytes 4n..4n+3 */
static inline void emu_dpbssd(int c, int a, int b) {
    for (int m = 0; m < emu_cfg.rows[c]; m++)
        for (int n = 0; n < emu_cfg.colsb[c] / 4; n++) {
            int32_t sum;
            memcpy(&sum, &emu_tile[c][m][4 * n], 4);
            for (int k = 0; k < emu_cfg.colsb[a] / 4; k++)
                for (int t = 0; t < 4; t++)
                    sum += (int8_t)emu_tile[a][m][4 * k + t] * (int8_t)emu_tile[b][k][4 * n + t];
            memcpy(&emu_tile[c][m][4 * n], &sum, 4);
        }
}

static inline float emu_bf16(const uint8_t *p) {
    uint32_t bits = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* c[m][n] (fp32) += a's bf16 pairs 2k, 2k + 1 in row m times b's row k pair n */
static inline void emu_dpbf16ps(int c, int a, int b) {
    for (int m = 0; m < emu_cfg.rows[c]; m++)
        for (int n = 0; n < emu_cfg.colsb[c] / 4; n++) {
            float sum;
            memcpy(&sum, &emu_tile[c][m][4 * n], 4);
            for (int k = 0; k < emu_cfg.colsb[a] / 4; k++)
                for (int t = 0; t < 2; t++)
                    sum += emu_bf16(&emu_tile[a][m][4 * k + 2 * t]) *
                           emu_bf16(&emu_tile[b][k][4 * n + 2 * t]);
            memcpy(&emu_tile[c][m][4 * n], &sum, 4);
        }
}

#define _tile_dpbf16ps(c, a, b) emu_dpbf16ps(c, a, b)
#define _tile_loadconfig(cfg) emu_loadconfig(cfg)
#define _tile_release() emu_release()
#define _tile_zero(t) emu_zero(t)
#define _tile_loadd(t, base, stride) emu_loadd(t, base, stride)
#define _tile_stored(t, base, stride) emu_stored(t, base, stride)
#define _tile_dpbssd(c, a, b) emu_dpbssd(c, a, b)

#endif
