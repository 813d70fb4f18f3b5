/* The small per-layer steps around the matmuls, fused: each is one pass over its rows
   instead of several torch ops (each a dispatch, an OpenMP fork/join and a temporary).
   fp32, rows contiguous. Parallel over rows only when there are enough of them: at a
   decode step's few dozen rows the fork/join costs more than the work. */

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "vec.h"

#define PARALLEL_FLOATS 65536

/* residual += x (when x is not NULL), then out = residual / rms(residual) * weight */
void add_rms_norm(float *out, float *residual, const float *x, const float *weight,
                  int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for if (rows * dim >= PARALLEL_FLOATS)
    for (int64_t t = 0; t < rows; t++) {
        float *r = residual + t * dim, *o = out + t * dim;
        const float *a = x ? x + t * dim : 0;
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
}

/* out[t] = silu(gate[t]) * up[t], gate_up[t] = [gate (inter) | up (inter)] */
void silu_mul(float *out, const float *gate_up, int64_t rows, int64_t inter) {
#pragma omp parallel for if (rows * inter >= PARALLEL_FLOATS)
    for (int64_t t = 0; t < rows; t++) {
        const float *g = gate_up + t * 2 * inter, *u = g + inter;
        float *o = out + t * inter;
        int64_t i = 0;
        for (; i + LANES <= inter; i += LANES) {
            vec x = load(g + i);
            store(o + i, x / (splat(1.0f) + vexp(-x)) * load(u + i));
        }
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* Rotate the Q and K heads of qkv in place (half-split / NEOX rotary embedding with the
   step's cos, sin [rows, head_dim / 2]) and store each token's K and V in its KV page.
   qkv rows: [q (heads * head_dim) | k (kv_heads * head_dim) | v (kv_heads * head_dim)].
   Page layout as in paged_attention.c: K [kv_heads, head_dim, page_size] at k_pool +
   page * page_stride, V [kv_heads, page_size, head_dim] at v_pool + page * page_stride;
   fp32 pools, or bf16 ones (kv_bf16: values rounded to nearest even, strides in bf16). */
void rope_store_kv(float *qkv, const float *cos, const float *sin, int64_t rows, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, void *k_pool, void *v_pool,
                   int64_t page_stride, int64_t page_size, const int64_t *slot_pages,
                   const int64_t *slot_offsets, int64_t kv_bf16) {
    const int64_t half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;
#pragma omp parallel for if (rows * width >= PARALLEL_FLOATS)
    for (int64_t t = 0; t < rows; t++) {
        float *row = qkv + t * width;
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            float *x1 = row + h * head_dim, *x2 = x1 + half;
            for (int64_t i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
        const float *k = row + heads * head_dim, *v = k + kv_heads * head_dim;
        const int64_t at = slot_offsets[t], page = slot_pages[t] * page_stride;
        for (int64_t h = 0; h < kv_heads; h++)
            for (int64_t d = 0; d < head_dim; d++) {
                const int64_t ki = page + (h * head_dim + d) * page_size + at;
                const int64_t vi = page + (h * page_size + at) * head_dim + d;
                if (kv_bf16) {
                    ((uint16_t *)k_pool)[ki] = f32_to_bf16(k[h * head_dim + d]);
                    ((uint16_t *)v_pool)[vi] = f32_to_bf16(v[h * head_dim + d]);
                } else {
                    ((float *)k_pool)[ki] = k[h * head_dim + d];
                    ((float *)v_pool)[vi] = v[h * head_dim + d];
                }
            }
    }
}
