/* The k largest logits of chosen rows on the CPU, for the streams' top-K_ver after each verify and the
 * top-K_pre at each prompt position. PyTorch's topk costs 86 us for one SmolLM2 row (49,152 logits) and
 * 0.77 ms for the four rows of a Qwen verify (151,936 each), single-threaded, every decode cycle;
 * here one pass compares a vector of logits at a time with the k-th largest so far and looks closer
 * only where one beats it (rarely, after the first few thousand logits).
 *
 * Built and loaded with NanoSpec's other C kernels (nanospec/cpu/native.py). Order: largest first,
 * equal values by lower id (the twin, torch.topk, agrees wherever the values differ); a NaN counts as
 * -inf. tests/test_cpu_topk.py checks it against the twin.
 */
#include <math.h>
#include <stdint.h>
#include <immintrin.h>

#define KMAX 64

/* Put (v, id) into the descending list val/idx of *n entries (k at most), behind its equals; when the
 * list is full the caller has checked that v beats the last entry, which drops out. */
static inline void insert(float *val, int64_t *idx, long *n, long k, float v, int64_t id) {
    long i = *n < k ? (*n)++ : k - 1;
    while (i > 0 && val[i - 1] < v) {
        val[i] = val[i - 1];
        idx[i] = idx[i - 1];
        i--;
    }
    val[i] = v;
    idx[i] = id;
}

static void row_topk(const float *x, long vocab, long k, int64_t *out) {
    float val[KMAX];
    int64_t idx[KMAX];
    long n = 0, j = 0;
    for (; j < vocab && n < k; j++) insert(val, idx, &n, k, x[j] != x[j] ? -INFINITY : x[j], j);
    float thr = val[k - 1];
#ifdef __AVX512F__
    for (; j + 16 <= vocab; j += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), _mm512_set1_ps(thr), _CMP_GT_OQ);
        while (m) {
            const long l = __builtin_ctz(m);
            m &= m - 1;
            if (x[j + l] > thr) { /* thr may have risen since the compare */
                insert(val, idx, &n, k, x[j + l], j + l);
                thr = val[k - 1];
            }
        }
    }
#else
    for (; j + 8 <= vocab; j += 8) {
        int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), _mm256_set1_ps(thr), _CMP_GT_OQ));
        while (m) {
            const long l = __builtin_ctz(m);
            m &= m - 1;
            if (x[j + l] > thr) {
                insert(val, idx, &n, k, x[j + l], j + l);
                thr = val[k - 1];
            }
        }
    }
#endif
    for (; j < vocab; j++)
        if (x[j] > thr) {
            insert(val, idx, &n, k, x[j], j);
            thr = val[k - 1];
        }
    for (long i = 0; i < k; i++) out[i] = idx[i];
}

/* out[i, :k] = ids of the k largest of x[r, :vocab], r = rows[i] (or i when rows is NULL), for i < n;
 * x holds nrows rows, stride floats apart. Returns 0, or -1 (nothing written) for a row outside
 * [0, nrows) or k outside [1, min(vocab, KMAX)]. */
int nanospec_topk(const float *x, long nrows, long stride, const int64_t *rows, long n, long vocab, long k,
                  int64_t *out) {
    if (k < 1 || k > KMAX || k > vocab) return -1;
    if (rows)
        for (long i = 0; i < n; i++)
            if (rows[i] < 0 || rows[i] >= nrows) return -1;
    if (!rows && n > nrows) return -1;
#pragma omp parallel for schedule(static) if (n >= 16)
    for (long i = 0; i < n; i++) row_topk(x + (rows ? rows[i] : i) * stride, vocab, k, out + i * k);
    return 0;
}
