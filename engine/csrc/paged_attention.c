/* Decode attention over paged K/V, reading every page in place.

   The torch path gathers each sequence's pages into a contiguous buffer and then runs
   two batched matmuls: the K/V bytes cross memory three times. Here each (sequence,
   KV head) pair reads its keys and values once, straight from the pool, and its G
   query heads (grouped-query attention) share that read.

   Layouts (fp32, contiguous):
     q, out       [batch, heads, head_dim]
     k/v pool     [kv_heads, num_pages, page_size, head_dim]
     page_table   [batch, table_width] int32; row b lists sequence b's pages in order
     context_lens [batch] int32; keys 0 .. context_lens[b] - 1 are attended to
   Compiled with -fopenmp after torch is loaded, so the loop below runs on torch's own
   OpenMP thread pool (the same libgomp) and follows torch.set_num_threads. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static void attend_one(float *out, const float *q, const float *k_head, const float *v_head,
                       const int32_t *pages, int64_t n, int64_t group, int64_t head_dim,
                       int64_t page_size, float scale, float *scores, float *acc) {
    const int64_t page_stride = page_size * head_dim;
    /* scores[g * n + t] = q_g . k_t * scale */
    for (int64_t start = 0; start < n; start += page_size) {
        const float *k_page = k_head + (int64_t)pages[start / page_size] * page_stride;
        int64_t len = n - start < page_size ? n - start : page_size;
        for (int64_t t = 0; t < len; t++) {
            const float *k = k_page + t * head_dim;
            for (int64_t g = 0; g < group; g++) {
                const float *qg = q + g * head_dim;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < head_dim; d++) s += qg[d] * k[d];
                scores[g * n + start + t] = s * scale;
            }
        }
    }
    /* softmax per query head, left unnormalised until the end */
    float sums[group];
    for (int64_t g = 0; g < group; g++) {
        float *row = scores + g * n, top = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < n; t++) top = row[t] > top ? row[t] : top;
        for (int64_t t = 0; t < n; t++) {
            row[t] = expf(row[t] - top);
            sum += row[t];
        }
        sums[g] = sum;
    }
    for (int64_t i = 0; i < group * head_dim; i++) acc[i] = 0.0f;
    for (int64_t start = 0; start < n; start += page_size) {
        const float *v_page = v_head + (int64_t)pages[start / page_size] * page_stride;
        int64_t len = n - start < page_size ? n - start : page_size;
        for (int64_t t = 0; t < len; t++) {
            const float *v = v_page + t * head_dim;
            for (int64_t g = 0; g < group; g++) {
                float p = scores[g * n + start + t], *a = acc + g * head_dim;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; d++) a[d] += p * v[d];
            }
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float inv = 1.0f / sums[g];
        for (int64_t d = 0; d < head_dim; d++) out[g * head_dim + d] = acc[g * head_dim + d] * inv;
    }
}

int paged_decode_attention(float *out, const float *q, const float *k_pool, const float *v_pool,
                           const int32_t *page_table, int64_t table_width,
                           const int32_t *context_lens, int64_t batch, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t num_pages,
                           int64_t page_size, float scale) {
    const int64_t group = heads / kv_heads;
    const int64_t head_stride = num_pages * page_size * head_dim;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t item = 0; item < batch * kv_heads; item++) {
        int64_t b = item / kv_heads, h = item % kv_heads;
        int64_t n = context_lens[b];
        float *scratch = malloc(sizeof(float) * group * (n + head_dim));
        if (scratch == NULL) {
            failed = 1;
            continue;
        }
        int64_t at = (b * heads + h * group) * head_dim;
        attend_one(out + at, q + at, k_pool + h * head_stride, v_pool + h * head_stride,
                   page_table + b * table_width, n, group, head_dim, page_size, scale, scratch,
                   scratch + group * n);
        free(scratch);
    }
    return failed;
}
