/* A whole decode step of a llama-family model (llama, qwen2) in one call: embedding,
   every layer, final norm and LM head, for a batch of sequences decoding one token each.

   The same kernels and the same order as engine/models/llama.py runs them one by one
   from Python (so the logits are bit-identical); what this saves is ~30 Python-level
   calls per layer and their tensor bookkeeping, ~1 ms of a ~40 ms step.
   Steps that carry prefill chunks take the Python path (their attention is torch SDPA).
   Each projection and the LM head carry a scale pointer and a group: both 0 for fp32
   panels (gemm_panels), a scale for int8 weights (gemm_int8_panels on int8_path), both
   for w8a8 weights (gemm_w8a8_panels on w8a8_path), group -1 for bf16 panels
   (gemm_bf16_panels on bf16_path), group -2 for a GGUF's compact blocks (gemm_blocks on
   w8a8_path, the scale pointer its panel index); formats may mix (weights: auto, blocks). */

#include <stdint.h>
#include <string.h>

#include "kernels.h"

enum {
    IN_NORM, QKV, QKV_BIAS, O_PROJ, POST_NORM, GATE_UP, DOWN, K_POOL, V_POOL,
    QKV_SCALE, O_SCALE, GATE_UP_SCALE, DOWN_SCALE,
    QKV_GROUP, O_GROUP, GATE_UP_GROUP, DOWN_GROUP, PER_LAYER
};

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    int64_t page_size, page_stride;
    float eps, attn_scale;
    const int64_t *layer_ptrs; /* [layers][PER_LAYER] addresses; QKV_BIAS 0 when none */
    const float *embed;        /* [vocab, hidden] */
    const float *final_norm;   /* [hidden] */
    const float *head;         /* LM head panels */
    const float *head_scale;   /* int8 head: its row scales; fp32: 0 */
    int64_t head_group;        /* w8a8 head: its scale group; else 0 */
    int64_t int8_path;         /* gemm_int8_panels' path; -1 with fp32 weights */
    int64_t w8a8_path;         /* gemm_w8a8_panels' path */
    int64_t bf16_path;         /* gemm_bf16_panels' path */
    int64_t kv_kind;           /* K/V pools: 0 fp32, 1 bf16, 2 int8 (rope_store_kv's) */
} DecodeModel;

#define P(l, what) ((float *)(intptr_t)m->layer_ptrs[(l) * PER_LAYER + (what)])
#define GROUP(l, what) (m->layer_ptrs[(l) * PER_LAYER + (what)])

/* weights w: blocks when group is -2, bf16 panels when -1, fp32 panels when scale is 0,
   else int8 panels with these scales, on int8 activations too when they have a group */
static int matmul(const DecodeModel *m, float *out, const float *x, const void *w,
                  const float *scale, int64_t group, const float *bias, int64_t M, int64_t N,
                  int64_t K) {
    if (group == -2)
        return gemm_blocks(out, x, w, (const int64_t *)scale, bias, M, N, K, m->w8a8_path);
    if (group < 0) return gemm_bf16_panels(out, x, w, bias, M, N, K, m->bf16_path);
    if (!scale) {
        gemm_panels(out, x, w, bias, M, N, K);
        return 0;
    }
    if (group) return gemm_w8a8_panels(out, x, w, scale, bias, M, N, K, m->w8a8_path);
    return gemm_int8_panels(out, x, w, scale, bias, M, N, K, m->int8_path);
}

/* decode attention over this model's K/V pools, fp32, bf16 or int8 */
static int attention(const DecodeModel *m, float *out, const float *q, int64_t q_stride,
                     const void *k_pool, const void *v_pool, const int32_t *page_table,
                     int64_t table_width, const int32_t *context_lens, int64_t B) {
    if (m->kv_kind == 2)
        return paged_decode_attention_int8(out, q, q_stride, k_pool, v_pool, m->page_stride,
                                           page_table, table_width, context_lens, B, m->heads,
                                           m->kv_heads, m->head_dim, m->page_size,
                                           m->attn_scale);
    if (m->kv_kind == 1)
        return paged_decode_attention_bf16(out, q, q_stride, k_pool, v_pool, m->page_stride,
                                           page_table, table_width, context_lens, B, m->heads,
                                           m->kv_heads, m->head_dim, m->page_size,
                                           m->attn_scale);
    return paged_decode_attention(out, q, q_stride, k_pool, v_pool, m->page_stride, page_table,
                                  table_width, context_lens, B, m->heads, m->kv_heads,
                                  m->head_dim, m->page_size, m->attn_scale);
}

/* work: 3 * B * hidden + B * (heads + 2 kv_heads) * head_dim + B * heads * head_dim
   + 3 * B * inter floats. Returns 0, or 1 when a kernel could not allocate. */
int decode_step(const DecodeModel *m, const int64_t *tokens, const float *cos, const float *sin,
                int64_t batch, const int64_t *slot_pages, const int64_t *slot_offsets,
                const int32_t *page_table, int64_t table_width, const int32_t *context_lens,
                float *logits, float *work) {
    const int64_t H = m->hidden, D = m->head_dim, B = batch;
    const int64_t qkv_width = (m->heads + 2 * m->kv_heads) * D;
    float *x = work, *residual = x + B * H, *h = residual + B * H, *qkv = h + B * H;
    float *attn = qkv + B * qkv_width, *gate_up = attn + B * m->heads * D;
    float *act = gate_up + B * 2 * m->inter;
    int failed = 0;
    for (int64_t b = 0; b < B; b++) memcpy(residual + b * H, m->embed + tokens[b] * H, H * 4);
    for (int64_t l = 0; l < m->layers; l++) {
        add_rms_norm(h, residual, l ? x : 0, P(l, IN_NORM), B, H, m->eps);
        failed |= matmul(m, qkv, h, P(l, QKV), P(l, QKV_SCALE), GROUP(l, QKV_GROUP), P(l, QKV_BIAS),
                         B, qkv_width, H);
        rope_store_kv(qkv, cos, sin, B, m->heads, m->kv_heads, D, P(l, K_POOL), P(l, V_POOL),
                      m->page_stride, m->page_size, slot_pages, slot_offsets, m->kv_kind);
        failed |= attention(m, attn, qkv, qkv_width, P(l, K_POOL), P(l, V_POOL), page_table,
                            table_width, context_lens, B);
        failed |= matmul(m, x, attn, P(l, O_PROJ), P(l, O_SCALE), GROUP(l, O_GROUP), 0, B, H,
                         m->heads * D);
        add_rms_norm(h, residual, x, P(l, POST_NORM), B, H, m->eps);
        failed |= matmul(m, gate_up, h, P(l, GATE_UP), P(l, GATE_UP_SCALE), GROUP(l, GATE_UP_GROUP),
                         0, B, 2 * m->inter, H);
        silu_mul(act, gate_up, B, m->inter);
        failed |= matmul(m, x, act, P(l, DOWN), P(l, DOWN_SCALE), GROUP(l, DOWN_GROUP), 0, B, H,
                         m->inter);
    }
    add_rms_norm(h, residual, x, m->final_norm, B, H, m->eps);
    failed |= matmul(m, logits, h, m->head, m->head_scale, m->head_group, 0, B, m->vocab, H);
    return failed;
}
