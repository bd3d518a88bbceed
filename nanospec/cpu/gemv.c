/* One-row float32 linear layer for x86-64 CPUs with AVX2 and FMA: y[n] = dot(w[n, :], x) (+ b[n]).
 *
 * Built and loaded by nanospec/cpu/gemv.py (see its docstring for why). A decode step multiplies one row
 * by every weight matrix, so it is bound by reading the weights from memory: each thread reads its
 * share of the rows of w front to back, one row at a time, which keeps one sequential stream per core
 * for the hardware prefetcher (four interleaved row streams measured 10-15% slower here).
 *
 * Every y[n] is summed in the same order whatever N and the thread count: four 8-lane accumulators over
 * the 32-float blocks of the row, then 8-float blocks into the first, a fixed horizontal sum, then the
 * last K % 8 products in order. The rows are split across the OpenMP threads of the caller's runtime
 * (the loader checks that it is the one PyTorch uses).
 */
#include <immintrin.h>

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot(const float *w, const float *x, long K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    long k = 0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    float s = sum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; k++)
        s = __builtin_fmaf(w[k], x[k], s);
    return s;
}

/* x [K], w [N, K] row-major, b [N] or NULL, y [N]; all float32, no aliasing. */
void nanospec_gemv(const float *x, const float *w, const float *b, float *y, long N, long K) {
    #pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float s = dot(w + n * K, x, K);
        y[n] = b ? s + b[n] : s;
    }
}
