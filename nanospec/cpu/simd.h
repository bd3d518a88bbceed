/* The vector type and the few operations NanoSpec's C kernels (gemv.c, attention.c) share: AVX-512 where
 * the build enables it (16 lanes), else AVX2 (8 lanes). Built by nanospec/cpu/native.py. */
#ifndef NANOSPEC_SIMD_H
#define NANOSPEC_SIMD_H
#include <immintrin.h>

#ifdef __AVX512F__
typedef __m512 vec;
#define L 16
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vfma _mm512_fmadd_ps
#define vmul _mm512_mul_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmax _mm512_max_ps
#define vmin _mm512_min_ps
/* Sum of the two 8-lane halves, the first step of every horizontal sum. */
static inline __m256 half(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(v), hi);
}
/* L bfloat16 values widened to float32 (exact: a bfloat16 is a float32's upper 16 bits). */
static inline __m512 vload_bf16(const unsigned short *p) {
    __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}
#else
typedef __m256 vec;
#define L 8
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vfma _mm256_fmadd_ps
#define vmul _mm256_mul_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmax _mm256_max_ps
#define vmin _mm256_min_ps
static inline __m256 half(__m256 v) { return v; }
static inline __m256 vload_bf16(const unsigned short *p) {
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
#endif

/* One bfloat16 widened to float32. */
static inline float bf16_to_f32(unsigned short h) {
    union { unsigned int u; float f; } v = {(unsigned int)h << 16};
    return v.f;
}

/* A fixed horizontal sum of 8 lanes. */
static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
