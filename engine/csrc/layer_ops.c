/* The small per-layer steps around the matmuls, fused: each is one pass over its rows
   instead of several torch ops (each a dispatch, an OpenMP fork/join and a temporary).
   fp32, rows contiguous. Parallel over rows only when there are enough of them: at a
   decode step's few dozen rows the fork/join costs more than the work. Fewer rows take a
   plain loop, not an OpenMP region with an `if` clause: entering a region costs ~5 us
   even on one thread once a decode step's weight stream has evicted libgomp from the
   caches (7% of a SmolLM2 single-stream step went to region entries, py-spy --native). */

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "vec.h"

#define PARALLEL_FLOATS 65536

static void add_rms_norm_row(float *o, float *r, const float *a, const float *weight,
                             int64_t dim, float eps) {
    vec sq = {0};
    int64_t d = 0;
    for (; d + LANES <= dim; d += LANES) {
        vec v = load(r + d);
        if (a) {
            v += load(a + d);
            store(r + d, v);
        }
        sq += v * v;
    }
    float ss = sum_lanes(sq);
    for (; d < dim; d++) {
        if (a) r[d] += a[d];
        ss += r[d] * r[d];
    }
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (d = 0; d + LANES <= dim; d += LANES)
        store(o + d, load(r + d) * splat(inv) * load(weight + d));
    for (; d < dim; d++) o[d] = r[d] * inv * weight[d];
}

/* residual += x (when x is not NULL), then out = residual / rms(residual) * weight */
void add_rms_norm(float *out, float *residual, const float *x, const float *weight,
                  int64_t rows, int64_t dim, float eps) {
    if (rows * dim < PARALLEL_FLOATS) { /* no OpenMP region: see the top */
        for (int64_t t = 0; t < rows; t++)
            add_rms_norm_row(out + t * dim, residual + t * dim, x ? x + t * dim : 0, weight, dim,
                             eps);
        return;
    }
#pragma omp parallel for
    for (int64_t t = 0; t < rows; t++)
        add_rms_norm_row(out + t * dim, residual + t * dim, x ? x + t * dim : 0, weight, dim, eps);
}

static void silu_mul_row(float *o, const float *g, int64_t inter) {
    const float *u = g + inter;
    int64_t i = 0;
    for (; i + LANES <= inter; i += LANES) {
        vec x = load(g + i);
        store(o + i, x / (splat(1.0f) + vexp(-x)) * load(u + i));
    }
    for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* out[t] = silu(gate[t]) * up[t], gate_up[t] = [gate (inter) | up (inter)] */
void silu_mul(float *out, const float *gate_up, int64_t rows, int64_t inter) {
    if (rows * inter < PARALLEL_FLOATS) { /* no OpenMP region: see the top */
        for (int64_t t = 0; t < rows; t++)
            silu_mul_row(out + t * inter, gate_up + t * 2 * inter, inter);
        return;
    }
#pragma omp parallel for
    for (int64_t t = 0; t < rows; t++) silu_mul_row(out + t * inter, gate_up + t * 2 * inter, inter);
}

/* n values as int8 (dst[i * stride]) with one scale, returned: absmax / 127, rounded to
   nearest even; as engine/kv/pages.py's quantize_kv_int8, bit for bit */
static float quantize_int8(int8_t *dst, int64_t stride, const float *x, int64_t n) {
    float top = 0.0f;
    for (int64_t i = 0; i < n; i++) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    const float scale = top / 127.0f, safe = scale > 0.0f ? scale : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        const float v = nearbyintf(x[i] / safe);
        dst[i * stride] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    return scale;
}

/* n values as int8 (dst[i * stride]) over their min..max: x = scale * int8 + offset, both
   returned; as engine/kv/pages.py's quantize_kv_int8_offset, bit for bit. All equal: scale
   0, int8 -128, offset the value. */
static void quantize_int8_offset(int8_t *dst, int64_t stride, const float *x, int64_t n,
                                 float *scale, float *offset) {
    float lo = x[0], hi = x[0];
    for (int64_t i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *scale = (hi - lo) / 255.0f;
    const float safe = *scale > 0.0f ? *scale : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        const float v = nearbyintf((x[i] - lo) / safe) - 128.0f;
        dst[i * stride] = (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v);
    }
    *offset = lo + 128.0f * *scale; /* exact: a power of two times the scale */
}

/* one token's K and V heads into its page (kv_kind: 0 fp32, 1 bf16, 2 int8 + scales:
   K's scale and offset, V's scale, laid out as paged_attention.c reads them) */
static void store_kv(const float *k, const float *v, int64_t kv_heads, int64_t head_dim,
                     void *k_pool, void *v_pool, int64_t page_size, int64_t at, int64_t page,
                     int64_t kv_kind) {
    if (kv_kind == 2) {
        int8_t *kp = (int8_t *)k_pool + page, *vp = (int8_t *)v_pool + page;
        float *scales = (float *)(kp + 2 * kv_heads * head_dim * page_size) + at;
        for (int64_t h = 0; h < kv_heads; h++) {
            quantize_int8_offset(kp + h * head_dim * page_size + at, page_size, k + h * head_dim,
                                 head_dim, scales + h * page_size,
                                 scales + (kv_heads + h) * page_size);
            scales[(2 * kv_heads + h) * page_size] = quantize_int8(
                vp + (h * page_size + at) * head_dim, 1, v + h * head_dim, head_dim);
        }
        return;
    }
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t d = 0; d < head_dim; d++) {
            const int64_t ki = page + (h * head_dim + d) * page_size + at;
            const int64_t vi = page + (h * page_size + at) * head_dim + d;
            if (kv_kind == 1) {
                ((uint16_t *)k_pool)[ki] = f32_to_bf16(k[h * head_dim + d]);
                ((uint16_t *)v_pool)[vi] = f32_to_bf16(v[h * head_dim + d]);
            } else {
                ((float *)k_pool)[ki] = k[h * head_dim + d];
                ((float *)v_pool)[vi] = v[h * head_dim + d];
            }
        }
}

static void rope_store_kv_row(float *row, const float *c, const float *s, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, void *k_pool, void *v_pool,
                              int64_t page_size, int64_t at, int64_t page, int64_t kv_kind) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads + kv_heads; h++) {
        float *x1 = row + h * head_dim, *x2 = x1 + half;
        for (int64_t i = 0; i < half; i++) {
            const float a = x1[i], b = x2[i];
            x1[i] = a * c[i] - b * s[i];
            x2[i] = b * c[i] + a * s[i];
        }
    }
    const float *k = row + heads * head_dim;
    store_kv(k, k + kv_heads * head_dim, kv_heads, head_dim, k_pool, v_pool, page_size, at, page,
             kv_kind);
}

/* Rotate the Q and K heads of qkv in place (half-split / NEOX rotary embedding with the
   step's cos, sin [rows, head_dim / 2]) and store each token's K and V in its KV page.
   qkv rows: [q (heads * head_dim) | k (kv_heads * head_dim) | v (kv_heads * head_dim)].
   Page layout as in paged_attention.c: K [kv_heads, head_dim, page_size] at k_pool +
   page * page_stride, V [kv_heads, page_size, head_dim] at v_pool + page * page_stride;
   kv_kind 0: fp32 pools; 1: bf16 (values rounded to nearest even, strides in bf16); 2: int8
   (strides in bytes; each page's scales and K offsets after its V, see paged_attention.c). */
void rope_store_kv(float *qkv, const float *cos, const float *sin, int64_t rows, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, void *k_pool, void *v_pool,
                   int64_t page_stride, int64_t page_size, const int64_t *slot_pages,
                   const int64_t *slot_offsets, int64_t kv_kind) {
    const int64_t half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;
#define ROPE_ROW(t)                                                                         \
    rope_store_kv_row(qkv + (t) * width, cos + (t) * half, sin + (t) * half, heads, kv_heads, \
                      head_dim, k_pool, v_pool, page_size, slot_offsets[t],                 \
                      slot_pages[t] * page_stride, kv_kind)
    if (rows * width < PARALLEL_FLOATS) { /* no OpenMP region: see the top */
        for (int64_t t = 0; t < rows; t++) ROPE_ROW(t);
        return;
    }
#pragma omp parallel for
    for (int64_t t = 0; t < rows; t++) ROPE_ROW(t);
#undef ROPE_ROW
}
