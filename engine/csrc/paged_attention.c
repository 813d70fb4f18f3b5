/* Decode attention over paged K/V, reading every page in place, once.

   The torch path gathers each sequence's pages into a contiguous buffer and then runs
   two batched matmuls: the K/V bytes cross memory three times. Here each sequence's
   pages come from memory once: a first sweep scores the keys of all KV heads (whole
   pages prefetched ahead), a softmax, then a second sweep sums the values, by then in
   L2. Each KV head's G query heads (grouped-query attention) share its reads.

   Layouts (fp32):
     q, out       [batch, heads, head_dim]; out contiguous, q rows q_stride floats apart
     one page     K [kv_heads, head_dim, page_size] then V [kv_heads, page_size, head_dim];
                  k_pool/v_pool point at page 0's K and V, page_stride floats apart per page
     page_table   [batch, table_width] int32; row b lists sequence b's pages in order
     context_lens [batch] int32; keys 0 .. context_lens[b] - 1 are attended to
   Why this layout: pages are scattered over the pool, and this CPU streams scattered 4 KB
   blocks at about half the rate of 16-64 KB ones, so one page holds K and V of all heads
   (24 KB for SmolLM2). K is stored dimension-major so that q.k for 16 keys is broadcast
   FMAs into one vector (no horizontal sums); V stays token-major for the weighted sum.
   Compiled with -fopenmp after torch is loaded, so the loop below runs on torch's own
   OpenMP thread pool (the same libgomp) and follows torch.set_num_threads.
   K/V in bf16 (kv_dtype bf16: half the bytes): paged_attention_bf16.c compiles this file
   again with KV_BF16, the pages' values widened to fp32 as they are loaded. K/V in int8
   (kv_dtype int8: a quarter, plus the scales): paged_attention_int8.c, with KV_INT8. Each
   page then ends with fp32 [3, kv_heads, page_size]: per token and KV head, K's scale and
   offset (k = scale * int8 + offset: keys sit off zero, and min..max spends all 256 steps
   on them), then V's scale (v = scale * int8). They factor out of both sums, so the kernel
   widens the int8 values as loaded; a key's score is scale * (q . int8) + offset * sum(q)
   for 16 keys at once, and a value's scale goes into its softmax weight. */

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec.h"

#if defined(KV_INT8)
typedef int8_t kv_t;
#define KV_LOAD load_i8
#define KV_GET(x) ((float)(x))
/* in key_scores: key j's score from q . int8 (16 keys, one key), its scale and offset */
#define KEY_SCORE(dot, j) ((dot) * load(k_scale + (j)) + splat(q_sum) * load(k_offset + (j)))
#define KEY_SCORE_ONE(dot, j) ((dot) * k_scale[j] + q_sum * k_offset[j])
#define WEIGHT(p, scales, j) ((p)[j] * (scales)[j]) /* a value's softmax weight, scaled */
#define ROW_SCALES(scales, row, page_size) ((scales) + (row) * (page_size))
#define ENTRY paged_decode_attention_int8
#elif defined(KV_BF16)
typedef uint16_t kv_t;
#define KV_LOAD load_bf16
#define KV_GET bf16_to_f32
#define ENTRY paged_decode_attention_bf16
#else
typedef float kv_t;
#define KV_LOAD load
#define KV_GET(x) (x)
#define ENTRY paged_decode_attention
#endif
#ifndef KV_INT8 /* fp32 and bf16 pages carry no scales */
#define KEY_SCORE(dot, j) ((void)k_scale, (void)k_offset, (void)q_sum, (dot))
#define KEY_SCORE_ONE(dot, j) (dot)
#define WEIGHT(p, scales, j) ((void)(scales), (p)[j])
#define ROW_SCALES(scales, row, page_size) ((void)(scales), (const float *)0)
#endif

/* A page's int8 scales (after its K and V), NULL for other pages: KV head h's K scales at
   ROW_SCALES(scales, h, page_size), its K offsets at ROW_SCALES(scales, kv_heads + h, ...),
   its V scales at ROW_SCALES(scales, 2 * kv_heads + h, ...). */
static const float *page_scales(const kv_t *page, int64_t kv_heads, int64_t head_floats) {
#ifdef KV_INT8
    return (const float *)(page + 2 * kv_heads * head_floats);
#else
    (void)page, (void)kv_heads, (void)head_floats;
    return 0;
#endif
}

/* Pages requested ahead of the one being scored: enough misses in flight to cover DRAM
   latency (measured: 1 page ahead 15 GB/s, 3 ahead 24 GB/s on 2 cores, random pages). */
#define PREFETCH_PAGES 3

static void prefetch(const kv_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 64 / sizeof(kv_t)) __builtin_prefetch(p + i);
}

/* s[j] = scale * q . k_j for one KV head's page_size keys (k_page: [head_dim, page_size];
   int8: key j is k_scale[j] * int8 + k_offset[j], and q_sum the sum of q). Slots past the
   sequence's end hold finite stale values; the caller ignores them. */
static void key_scores(float *s, const float *q, const kv_t *k_page, const float *k_scale,
                       const float *k_offset, float q_sum, int64_t head_dim, int64_t page_size,
                       float scale) {
    int64_t j = 0;
    for (; j + LANES <= page_size; j += LANES) {
        vec a[4] = {{0}, {0}, {0}, {0}}; /* independent chains: FMA latency binds otherwise */
        int64_t d = 0;
        for (; d + 4 <= head_dim; d += 4)
            for (int c = 0; c < 4; c++)
                a[c] += splat(q[d + c]) * KV_LOAD(k_page + (d + c) * page_size + j);
        for (; d < head_dim; d++) a[0] += splat(q[d]) * KV_LOAD(k_page + d * page_size + j);
        store(s + j, KEY_SCORE(a[0] + a[1] + a[2] + a[3], j) * splat(scale));
    }
    for (; j < page_size; j++) {
        float sum = 0.0f;
        for (int64_t d = 0; d < head_dim; d++) sum += q[d] * KV_GET(k_page[d * page_size + j]);
        s[j] = KEY_SCORE_ONE(sum, j) * scale;
    }
}

/* acc += sum_j p[j] * v_j over len keys (v_page: [page_size, head_dim]; int8: value j's
   scale v_scale[j]) */
static void add_values(float *acc, const float *p, const kv_t *v_page, const float *v_scale,
                       int64_t len, int64_t head_dim) {
    int64_t d = 0;
    for (; d + LANES <= head_dim; d += LANES) {
        vec a[4] = {load(acc + d), {0}, {0}, {0}};
        int64_t j = 0;
        for (; j + 4 <= len; j += 4)
            for (int c = 0; c < 4; c++)
                a[c] += splat(WEIGHT(p, v_scale, j + c)) *
                        KV_LOAD(v_page + (j + c) * head_dim + d);
        for (; j < len; j++)
            a[0] += splat(WEIGHT(p, v_scale, j)) * KV_LOAD(v_page + j * head_dim + d);
        store(acc + d, a[0] + a[1] + a[2] + a[3]);
    }
    for (; d < head_dim; d++) {
        float sum = acc[d];
        for (int64_t j = 0; j < len; j++)
            sum += WEIGHT(p, v_scale, j) * KV_GET(v_page[j * head_dim + d]);
        acc[d] = sum;
    }
}

/* Softmax of row[0..n) in place, unnormalised; returns the sum of its exps. */
static float exp_row(float *row, int64_t n) {
    vec top_v = splat(-INFINITY);
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES) top_v = vmax(top_v, load(row + t));
    float top = max_lanes(top_v);
    for (; t < n; t++) top = row[t] > top ? row[t] : top;
    vec sum_v = {0};
    for (t = 0; t + LANES <= n; t += LANES) {
        vec e = vexp(load(row + t) - splat(top));
        store(row + t, e);
        sum_v += e;
    }
    float sum = sum_lanes(sum_v);
    for (; t < n; t++) {
        row[t] = expf(row[t] - top);
        sum += row[t];
    }
    return sum;
}

/* One sequence, all heads, in two sweeps over its pages: scores from the keys, softmax,
   then the weighted values. The first sweep prefetches whole pages (K and V), so the
   second finds the values in L2 (a sequence's pages of one layer: 24 KB per 16 tokens). */
static void attend_seq(float *out, const float *q, const kv_t *k_pool, const kv_t *v_pool,
                       int64_t page_stride, const int32_t *pages, int64_t n, int64_t kv_heads,
                       int64_t group, int64_t head_dim, int64_t page_size, float scale,
                       float *scores, float *acc, const int32_t *next_pages, int64_t next_n) {
    const int64_t rows = kv_heads * group, head_floats = head_dim * page_size;
    const int64_t num = (n + page_size - 1) / page_size;
    const int64_t stride = num * page_size; /* scores row per query head */
    for (int64_t i = 0; i < PREFETCH_PAGES && i < num; i++)
        prefetch(k_pool + (int64_t)pages[i] * page_stride, page_stride);
    float q_sums[rows]; /* int8 keys' offsets multiply them */
    for (int64_t r = 0; r < rows; r++) {
        q_sums[r] = 0.0f;
        for (int64_t d = 0; d < head_dim; d++) q_sums[r] += q[r * head_dim + d];
    }
    for (int64_t i = 0; i < num; i++) {
        if (i + PREFETCH_PAGES < num)
            prefetch(k_pool + (int64_t)pages[i + PREFETCH_PAGES] * page_stride, page_stride);
        const kv_t *k_page = k_pool + (int64_t)pages[i] * page_stride;
        const float *scales = page_scales(k_page, kv_heads, head_floats);
        for (int64_t r = 0; r < rows; r++)
            key_scores(scores + r * stride + i * page_size, q + r * head_dim,
                       k_page + r / group * head_floats, ROW_SCALES(scales, r / group, page_size),
                       ROW_SCALES(scales, kv_heads + r / group, page_size), q_sums[r], head_dim,
                       page_size, scale);
    }
    float sums[rows];
    for (int64_t r = 0; r < rows; r++) sums[r] = exp_row(scores + r * stride, n);
    memset(acc, 0, sizeof(float) * rows * head_dim);
    /* this thread's next sequence: its first pages arrive while these values are summed */
    for (int64_t i = 0; next_pages && i < PREFETCH_PAGES && i * page_size < next_n; i++)
        prefetch(k_pool + (int64_t)next_pages[i] * page_stride, page_stride);
    for (int64_t i = 0; i < num; i++) {
        const int64_t len = n - i * page_size < page_size ? n - i * page_size : page_size;
        const kv_t *v_page = v_pool + (int64_t)pages[i] * page_stride;
        const float *scales = page_scales(k_pool + (int64_t)pages[i] * page_stride, kv_heads,
                                          head_floats);
        for (int64_t r = 0; r < rows; r++)
            add_values(acc + r * head_dim, scores + r * stride + i * page_size,
                       v_page + r / group * head_floats,
                       ROW_SCALES(scales, 2 * kv_heads + r / group, page_size), len, head_dim);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float inv = 1.0f / sums[r];
        for (int64_t d = 0; d < head_dim; d++) out[r * head_dim + d] = acc[r * head_dim + d] * inv;
    }
}

static int by_key_descending(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* order[0..batch): row indices, longest context first (a prefill chunk brings ~1,000
   rows, so a real sort) */
static void longest_first(int64_t *order, const int32_t *context_lens, int64_t batch) {
    for (int64_t i = 0; i < batch; i++) order[i] = ((int64_t)context_lens[i] << 32) | i;
    qsort(order, batch, sizeof(int64_t), by_key_descending);
    for (int64_t i = 0; i < batch; i++) order[i] &= 0xffffffff;
}

/* Rows order[first], order[first + stride], ... of the batch (one thread's share); 1 when
   its scratch could not be had. */
static int attend_share(float *out, const float *q, int64_t q_stride, const kv_t *k_pool,
                        const kv_t *v_pool, int64_t page_stride, const int32_t *page_table,
                        int64_t table_width, const int32_t *context_lens, int64_t batch,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t page_size,
                        float scale, const int64_t *order, int64_t padded, int64_t first,
                        int64_t stride) {
    float *work = malloc(sizeof(float) * heads * (padded + head_dim));
    if (work == NULL) return 1;
    for (int64_t i = first; i < batch; i += stride) {
        const int64_t b = order[i];
        const int32_t *next = 0;
        int64_t next_n = 0;
        if (i + stride < batch) {
            next = page_table + order[i + stride] * table_width;
            next_n = context_lens[order[i + stride]];
        }
        attend_seq(out + b * heads * head_dim, q + b * q_stride, k_pool, v_pool, page_stride,
                   page_table + b * table_width, context_lens[b], kv_heads, heads / kv_heads,
                   head_dim, page_size, scale, work, work + heads * padded, next, next_n);
    }
    free(work);
    return 0;
}

int ENTRY(float *out, const float *q, int64_t q_stride, const kv_t *k_pool, const kv_t *v_pool,
          int64_t page_stride,
                           const int32_t *page_table, int64_t table_width,
                           const int32_t *context_lens, int64_t batch, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t page_size, float scale) {
    int64_t *order = malloc(sizeof(int64_t) * batch);
    if (order == NULL) return 1;
    longest_first(order, context_lens, batch);
    const int64_t longest = batch ? context_lens[order[0]] : 0;
    const int64_t padded = (longest + page_size - 1) / page_size * page_size;
    int failed = 0;
    /* Longest first, dealt round-robin: the threads' loads come out even, and each
       thread knows which sequence it takes next (to prefetch it). One sequence (a single
       stream's decode) or one thread: no OpenMP region, whose entry costs ~5 us once a
       decode step's weight stream has evicted libgomp from the caches (layer_ops.c). */
    if (batch == 1 || omp_get_max_threads() == 1) {
        failed = attend_share(out, q, q_stride, k_pool, v_pool, page_stride, page_table,
                              table_width, context_lens, batch, heads, kv_heads, head_dim,
                              page_size, scale, order, padded, 0, 1);
    } else {
#pragma omp parallel
        if (attend_share(out, q, q_stride, k_pool, v_pool, page_stride, page_table, table_width,
                         context_lens, batch, heads, kv_heads, head_dim, page_size, scale, order,
                         padded, omp_get_thread_num(), omp_get_num_threads()))
            failed = 1;
    }
    free(order);
    return failed;
}
