/* 16-lane fp32 vectors (GCC vector extensions: AVX-512 registers with -march=native on
   this CPU, split into narrower ones elsewhere) and the few helpers the kernels share. */
#ifndef TIERGATE_VEC_H
#define TIERGATE_VEC_H

#include <stdint.h>
#include <string.h>

#define LANES 16
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t))));

static inline vec load(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }

/* bf16 (the top half of an fp32): widening is exact; narrowing rounds to nearest even */
typedef uint16_t bf16x16 __attribute__((vector_size(LANES * sizeof(uint16_t))));
typedef uint32_t uvec __attribute__((vector_size(LANES * sizeof(uint32_t))));

static inline vec load_bf16(const uint16_t *p) {
    bf16x16 h;
    memcpy(&h, p, sizeof h);
    return (vec)(__builtin_convertvector(h, uvec) << 16);
}

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* 16 int8 values widened to fp32 (exact). By hand where the compiler targets AVX-512 or
   AVX2 (-march=native): GCC 12 turns __builtin_convertvector from int8 lanes into ~60
   scalar byte moves; elsewhere a plain loop. */
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static inline vec load_i8(const int8_t *p) {
    vec v;
#if defined(__AVX512F__)
    const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)p)));
    memcpy(&v, &w, sizeof v);
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128((const void *)p);
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
    memcpy(&v, &lo, sizeof lo);
    memcpy((char *)&v + sizeof lo, &hi, sizeof hi);
#else
    for (int i = 0; i < LANES; i++) v[i] = (float)p[i];
#endif
    return v;
}

/* every lane x: one vbroadcastss ("(vec){0} + x" costs a scalar add first); LANES == 16 */
static inline vec splat(float x) { return (vec){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

static inline vec clamp(vec x, float lo, float hi) {
    ivec below = x < splat(lo), above = x > splat(hi);
    x = (vec)((below & (ivec)splat(lo)) | (~below & (ivec)x));
    return (vec)((above & (ivec)splat(hi)) | (~above & (ivec)x));
}

static inline vec vmax(vec a, vec b) {
    ivec greater = a > b;
    return (vec)((greater & (ivec)a) | (~greater & (ivec)b));
}

static inline float max_lanes(vec v) {
    float m = v[0];
    for (int i = 1; i < LANES; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static inline float sum_lanes(vec v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += v[i];
    return s;
}

/* exp(x) as Cephes' expf: 2^n * p(r) with |r| <= ln2 / 2; within 2 ulp of expf.
   x is clamped to [-87, 88]: tiny results are ~1e-38 rather than 0, huge ones ~1.6e38. */
static inline vec vexp(vec x) {
    x = clamp(x, -87.0f, 88.0f);
    const vec shifter = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vec n = (x * splat(1.44269504088896341f) + shifter) - shifter;
    vec r = x - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
    vec p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    ivec scale = (__builtin_convertvector(n, ivec) + 127) << 23;
    return p * (vec)scale;
}

#endif
