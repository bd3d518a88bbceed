/* Few-row float32 linear layer for x86-64 CPUs with AVX2 and FMA (AVX-512 where the build enables it):
 * y[m, n] = dot(w[n, :], x[m, :]) (+ b[n]) for M = 1 to a few rows.
 *
 * Built and loaded by nanospec/cpu/gemv.py (see its docstring for why). A decode step multiplies one row
 * by every weight matrix and a target-verify a few rows, so both are bound by reading the weights from
 * memory: each thread reads its share of the rows of w front to back, one row at a time, which keeps
 * one sequential stream per core for the hardware prefetcher (four interleaved row streams measured
 * 10-15% slower on an AVX2 EPYC), and multiplies each row of w with up to RMAX rows of x while it is in
 * registers and L1 (RMAX rows of x, four accumulators each, fill the vector registers).
 *
 * Every y[m, n] is summed in the same order whatever M, N, m and the thread count: four accumulators of
 * L lanes over the 4L-float blocks of the row, then L-float blocks into the first, a fixed horizontal
 * sum, then the last K % L products in order. So a decode step (1 row) and a verify (k rows) give the
 * same bits for the same input row, and greedy speculative decoding keeps plain decoding's choice at
 * an exact tie. The rows of w are split across the OpenMP threads of the caller's runtime (the loader
 * checks that it is the one PyTorch uses).
 */
#include <immintrin.h>

/* Floats of w read ahead with software prefetches: the hardware prefetcher alone fell behind once each
 * line of w meets several rows of x (4 and 8 rows of a 545 MB LM head read 18 and 15 GB/s without, 22
 * and 18 with, one row 25 either way; 2048 was the best of 0, 256, 1024, 2048 and two rows ahead). */
#define PREFETCH 2048

#ifdef __AVX512F__
typedef __m512 vec;
#define L 16
#define RMAX 6
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
static inline __m256 half(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(v), hi);
}
#else
typedef __m256 vec;
#define L 8
#define RMAX 3
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps
static inline __m256 half(__m256 v) { return v; }
#endif

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* s[r] = dot(w[:K], x[r * K : (r + 1) * K]) for r < R; R is a constant where this is inlined. */
static inline __attribute__((always_inline)) void dots(const float *w, const float *x, long K, int R,
                                                       float *s) {
    vec a[RMAX][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++)
            a[r][j] = vzero();
    long k = 0;
    for (; k + 4 * L <= K; k += 4 * L)
        for (int j = 0; j < 4; j++) {
            if ((j * L) % 16 == 0)  /* one 64-byte line */
                _mm_prefetch((const char *)(w + k + j * L + PREFETCH), _MM_HINT_T0);
            vec wj = vload(w + k + j * L);
            for (int r = 0; r < R; r++)
                a[r][j] = vfma(wj, vload(x + r * K + k + j * L), a[r][j]);
        }
    for (; k + L <= K; k += L) {
        vec wj = vload(w + k);
        for (int r = 0; r < R; r++)
            a[r][0] = vfma(wj, vload(x + r * K + k), a[r][0]);
    }
    for (int r = 0; r < R; r++) {
        s[r] = sum8(half(vadd(vadd(a[r][0], a[r][1]), vadd(a[r][2], a[r][3]))));
        for (long t = k; t < K; t++)
            s[r] = __builtin_fmaf(w[t], x[r * K + t], s[r]);
    }
}

/* Rows m .. m + R - 1 of y at output n. */
#define ROWS(R) do {                                                 \
        dots(wn, x + m * K, K, R, s);                                \
        for (int r = 0; r < R; r++)                                  \
            y[(m + r) * N + n] = b ? s[r] + b[n] : s[r];             \
        m += R;                                                      \
    } while (0)

/* x [M, K], w [N, K], b [N] or NULL, y [M, N]; all row-major float32, no aliasing. */
void nanospec_linear(const float *x, const float *w, const float *b, float *y, long M, long N, long K) {
    #pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *wn = w + n * K;
        float s[RMAX];
        long m = 0;
        while (M - m >= RMAX)
            ROWS(RMAX);
        switch (M - m) {
#if RMAX > 3
        case 5: ROWS(5); break;
        case 4: ROWS(4); break;
        case 3: ROWS(3); break;
#endif
        case 2: ROWS(2); break;
        case 1: ROWS(1); break;
        default: break;
        }
    }
}
