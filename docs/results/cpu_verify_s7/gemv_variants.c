#include <immintrin.h>
#ifndef PFD
#define PFD 1
#endif
#ifndef ONEROW
#define ONEROW 0
#endif
#ifndef PFHINT
#define PFHINT _MM_HINT_T0
#endif
#ifndef PREFETCH
#define PREFETCH 2048
#endif
#ifdef __AVX512F__
typedef __m512 vec;
#define L 16
#ifndef NB
#define NB 4
#endif
#ifndef RMAX
#define RMAX 6
#endif
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vfma _mm512_fmadd_ps
static inline __m256 half(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(v), hi);
}
#else
typedef __m256 vec;
#define L 8
#define NB 2
#define RMAX 4
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vfma _mm256_fmadd_ps
static inline __m256 half(__m256 v) { return v; }
#endif
static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* y[r, n0 + i] for i < P outputs, r < R rows */
static inline __attribute__((always_inline)) void tile(const float *w, const float *x, const float *b,
        float *y, long N, long K, int P, int R) {
    vec a[NB][RMAX];
    for (int i = 0; i < P; i++)
        for (int r = 0; r < R; r++)
            a[i][r] = vzero();
    long k = 0;
    for (; k + L <= K; k += L) {
        vec wv[NB];
        for (int i = 0; i < P; i++) {
            if (k % 16 == 0) {
#ifdef PFNEXT
                _mm_prefetch((const char *)(w + PFD * P * K + P * k + i * 16), PFHINT);
#else
                _mm_prefetch((const char *)(w + i * K + k + PREFETCH), _MM_HINT_T0);
#endif
            }
            wv[i] = vload(w + i * K + k);
        }
        for (int r = 0; r < R; r++) {
            vec xv = vload(x + r * K + k);
            for (int i = 0; i < P; i++)
                a[i][r] = vfma(wv[i], xv, a[i][r]);
        }
    }
    for (int i = 0; i < P; i++)
        for (int r = 0; r < R; r++) {
            float s = sum8(half(a[i][r]));
            for (long t = k; t < K; t++)
                s = __builtin_fmaf(w[i * K + t], x[r * K + t], s);
            y[r * N + i] = b ? s + b[i] : s;
        }
}
#define CASE(P, R) case R: tile(wn, xm, bn, ym, N, K, P, R); break
#define TILES(P) switch (R) { CASE(P, 1); CASE(P, 2); CASE(P, 3); CASE(P, 4); R5(P) R6(P) default: break; }
#if RMAX >= 5
#define R5(P) CASE(P, 5);
#else
#define R5(P)
#endif
#if RMAX >= 6
#define R6(P) CASE(P, 6);
#else
#define R6(P)
#endif
void nanospec_linear(const float *x, const float *w, const float *b, float *y, long M, long N, long K) {
    long groups = (M + RMAX - 1) / RMAX, blocks = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static)
    for (long blk = 0; blk < blocks; blk++) {
        long n0 = blk * NB;
        for (long g = 0, m = 0; g < groups; g++) {
            int R = (int)(M / groups + (g < M % groups));
            const float *xm = x + m * K;
            float *ym0 = y + m * N;
            if (n0 + NB <= N && !(ONEROW && M == 1)) {
                const float *wn = w + n0 * K, *bn = b ? b + n0 : 0;
                float *ym = ym0 + n0;
                TILES(NB)
            } else {
                for (long n = n0; n < N && n < n0 + NB; n++) {
                    const float *wn = w + n * K, *bn = b ? b + n : 0;
                    float *ym = ym0 + n;
                    TILES(1)
                }
            }
            m += R;
        }
    }
}
