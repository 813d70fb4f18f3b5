/* Decode attention over paged K/V, reading every page in place, once.

   The torch path gathers each sequence's pages into a contiguous buffer and then runs
   two batched matmuls: the K/V bytes cross memory three times. Here each sequence walks
   its pages once, in one pass (online softmax), reading each page's keys and values for
   all KV heads together; each KV head's G query heads (grouped-query attention) share
   that read.

   Layouts (fp32):
     q, out       [batch, heads, head_dim], contiguous
     one page     K [kv_heads, head_dim, page_size] then V [kv_heads, page_size, head_dim];
                  k_pool/v_pool point at page 0's K and V, page_stride floats apart per page
     page_table   [batch, table_width] int32; row b lists sequence b's pages in order
     context_lens [batch] int32; keys 0 .. context_lens[b] - 1 are attended to
   Why this layout: pages are scattered over the pool, and this CPU streams scattered 4 KB
   blocks at about half the rate of 16-64 KB ones, so one page holds K and V of all heads
   (24 KB for SmolLM2). K is stored dimension-major so that q.k for 16 keys is broadcast
   FMAs into one vector (no horizontal sums); V stays token-major for the weighted sum.
   Compiled with -fopenmp after torch is loaded, so the loop below runs on torch's own
   OpenMP thread pool (the same libgomp) and follows torch.set_num_threads. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

static void prefetch(const float *p, int64_t floats) {
    for (int64_t i = 0; i < floats; i += 64 / sizeof(float)) __builtin_prefetch(p + i);
}

/* s[j] = scale * q . k_j for one KV head's page_size keys (k_page: [head_dim, page_size]).
   Slots past the sequence's end hold finite stale values; the caller ignores them. */
static void key_scores(float *s, const float *q, const float *k_page, int64_t head_dim,
                       int64_t page_size, float scale) {
    int64_t j = 0;
    for (; j + LANES <= page_size; j += LANES) {
        vec a[4] = {{0}, {0}, {0}, {0}}; /* independent chains: FMA latency binds otherwise */
        int64_t d = 0;
        for (; d + 4 <= head_dim; d += 4)
            for (int c = 0; c < 4; c++)
                a[c] += splat(q[d + c]) * load(k_page + (d + c) * page_size + j);
        for (; d < head_dim; d++) a[0] += splat(q[d]) * load(k_page + d * page_size + j);
        store(s + j, (a[0] + a[1] + a[2] + a[3]) * splat(scale));
    }
    for (; j < page_size; j++) {
        float sum = 0.0f;
        for (int64_t d = 0; d < head_dim; d++) sum += q[d] * k_page[d * page_size + j];
        s[j] = sum * scale;
    }
}

/* acc = acc * rescale + sum_j p[j] * v_j over len keys (v_page: [page_size, head_dim]) */
static void add_values(float *acc, float rescale, const float *p, const float *v_page,
                       int64_t len, int64_t head_dim) {
    int64_t d = 0;
    for (; d + LANES <= head_dim; d += LANES) {
        vec a[4] = {load(acc + d) * splat(rescale), {0}, {0}, {0}};
        int64_t j = 0;
        for (; j + 4 <= len; j += 4)
            for (int c = 0; c < 4; c++) a[c] += splat(p[j + c]) * load(v_page + (j + c) * head_dim + d);
        for (; j < len; j++) a[0] += splat(p[j]) * load(v_page + j * head_dim + d);
        store(acc + d, a[0] + a[1] + a[2] + a[3]);
    }
    for (; d < head_dim; d++) {
        float sum = acc[d] * rescale;
        for (int64_t j = 0; j < len; j++) sum += p[j] * v_page[j * head_dim + d];
        acc[d] = sum;
    }
}

/* One sequence, all heads. Per query head r: running max top[r], running sum of
   exp(score - top) sums[r], unnormalised output acc[r] (online softmax). */
static void attend_seq(float *out, const float *q, const float *k_pool, const float *v_pool,
                       int64_t page_stride, const int32_t *pages, int64_t n, int64_t kv_heads,
                       int64_t group, int64_t head_dim, int64_t page_size, float scale,
                       float *work) {
    const int64_t rows = kv_heads * group, head_floats = head_dim * page_size;
    float *acc = work, *s = work + rows * head_dim, *top = s + page_size, *sums = top + rows;
    for (int64_t r = 0; r < rows; r++) top[r] = -INFINITY, sums[r] = 0.0f;
    memset(acc, 0, sizeof(float) * rows * head_dim);
    const int64_t num = (n + page_size - 1) / page_size;
    for (int64_t i = 0; i < num; i++) {
        if (i + 1 < num) { /* the next page's K and V: one contiguous block */
            prefetch(k_pool + (int64_t)pages[i + 1] * page_stride, 2 * kv_heads * head_floats);
        }
        const float *k_page = k_pool + (int64_t)pages[i] * page_stride;
        const float *v_page = v_pool + (int64_t)pages[i] * page_stride;
        const int64_t len = n - i * page_size < page_size ? n - i * page_size : page_size;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t h = r / group;
            key_scores(s, q + r * head_dim, k_page + h * head_floats, head_dim, page_size, scale);
            float page_top = top[r];
            for (int64_t j = 0; j < len; j++) page_top = s[j] > page_top ? s[j] : page_top;
            const float rescale = expf(top[r] - page_top); /* 0 on the first page */
            float sum = 0.0f;
            int64_t j = 0;
            for (; j + LANES <= len; j += LANES) {
                vec e = vexp(load(s + j) - splat(page_top));
                store(s + j, e);
                sum += sum_lanes(e);
            }
            for (; j < len; j++) {
                s[j] = expf(s[j] - page_top);
                sum += s[j];
            }
            sums[r] = sums[r] * rescale + sum;
            top[r] = page_top;
            add_values(acc + r * head_dim, rescale, s, v_page + h * head_floats, len, head_dim);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const float inv = 1.0f / sums[r];
        for (int64_t d = 0; d < head_dim; d++) out[r * head_dim + d] = acc[r * head_dim + d] * inv;
    }
}

int paged_decode_attention(float *out, const float *q, const float *k_pool, const float *v_pool,
                           int64_t page_stride, const int32_t *page_table, int64_t table_width,
                           const int32_t *context_lens, int64_t batch, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t page_size, float scale) {
    const int64_t group = heads / kv_heads;
    const int64_t work_floats = heads * head_dim + page_size + 2 * heads;
    int failed = 0;
#pragma omp parallel
    {
        float *work = malloc(sizeof(float) * work_floats);
        if (work == NULL) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < batch; b++) {
            if (work == NULL) continue;
            attend_seq(out + b * heads * head_dim, q + b * heads * head_dim, k_pool, v_pool,
                       page_stride, page_table + b * table_width, context_lens[b], kv_heads,
                       group, head_dim, page_size, scale, work);
        }
        free(work);
    }
    return failed;
}
