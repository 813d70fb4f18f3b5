/* The kernels' entry points (what engine/native.py loads), declared once. */
#ifndef TIERGATE_KERNELS_H
#define TIERGATE_KERNELS_H

#include <stdint.h>

int paged_decode_attention(float *out, const float *q, int64_t q_stride, const float *k_pool,
                           const float *v_pool, int64_t page_stride,
                           const int32_t *page_table, int64_t table_width,
                           const int32_t *context_lens, int64_t batch, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t page_size, float scale);
int paged_decode_attention_bf16(float *out, const float *q, int64_t q_stride,
                                const uint16_t *k_pool, const uint16_t *v_pool,
                                int64_t page_stride, const int32_t *page_table,
                                int64_t table_width, const int32_t *context_lens,
                                int64_t batch, int64_t heads, int64_t kv_heads,
                                int64_t head_dim, int64_t page_size, float scale);
int paged_decode_attention_int8(float *out, const float *q, int64_t q_stride,
                                const int8_t *k_pool, const int8_t *v_pool, int64_t page_stride,
                                const int32_t *page_table, int64_t table_width,
                                const int32_t *context_lens, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, int64_t page_size,
                                float scale);
void gemm_panels(float *out, const float *x, const float *panels, const float *bias, int64_t M,
                 int64_t N, int64_t K);
void gemm_pair_rows(float *out, int64_t ldo, const float *x, int64_t M, int64_t K,
                    const float *pair, const float *bias);
int gemm_int8_panels(float *out, const float *x, const int8_t *panels, const float *scale,
                     const float *bias, int64_t M, int64_t N, int64_t K, int64_t path);
int gemm_w8a8_panels(float *out, const float *x, const int8_t *panels, const float *scale,
                     const float *bias, int64_t M, int64_t N, int64_t K, int64_t path);
/* int8 activations per row and group of 32 (gemm_w8a8.c), in one allocation to free once:
   the values [M][K], then their scales and group sums [M][K / 32]; NULL when out of memory */
int8_t *w8a8_quantized(const float *x, int64_t M, int64_t K, float **xs, int32_t **xsum);
/* gemm_amx.c: w8a8 on AMX tiles from quantized x (path 3 of gemm_w8a8_panels); 0, 1 out of
   memory, 2 not compiled (w8a8_amx_compiled() == 0) */
int w8a8_amx_compiled(void);
int gemm_w8a8_amx(float *out, const int8_t *xq, const float *xs, const int8_t *panels,
                  const float *scale, const float *bias, int64_t M, int64_t N, int64_t K);
/* gemm_amx.c: bf16 on AMX tiles from x rounded to bf16 (path 2 of gemm_bf16_panels); 0, 1
   out of memory, 2 not compiled or K no multiple of 32 */
int gemm_bf16_amx(float *out, const uint16_t *xb, const uint16_t *panels, const float *bias,
                  int64_t M, int64_t N, int64_t K);
int gemm_blocks(float *out, const float *x, const uint8_t *data, const int64_t *panels,
                const float *bias, int64_t M, int64_t N, int64_t K, int64_t path);
int gemm_bf16_panels(float *out, const float *x, const uint16_t *panels, const float *bias,
                     int64_t M, int64_t N, int64_t K, int64_t path);
void add_rms_norm(float *out, float *residual, const float *x, const float *weight,
                  int64_t rows, int64_t dim, float eps);
void silu_mul(float *out, const float *gate_up, int64_t rows, int64_t inter);
void rope_store_kv(float *qkv, const float *cos, const float *sin, int64_t rows, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, void *k_pool, void *v_pool,
                   int64_t page_stride, int64_t page_size, const int64_t *slot_pages,
                   const int64_t *slot_offsets, int64_t kv_kind);

#endif
