/* Attention of decode steps and target-verifies over a float32 KV cache, for x86-64 CPUs with AVX2 and
 * FMA (AVX-512 where the build enables it): SGLang's decode_attention_cpu / extend_attention_cpu for
 * requests of a few new tokens each. Built and loaded by nanospec/cpu/native.py; called by
 * nanospec/cpu/ops_attention.py, whose PyTorch code is the oracle in the tests.
 *
 * Why C: one request's decode or verify of a small model is ~0.1-1M multiply-adds a layer, which the
 * PyTorch version spends mostly in dispatching a dozen ops (SmolLM2-135M: 105 us a layer for a decode,
 * 190 for a verify of 4, measured with NANOSPEC_PROFILE_OPS at commit b467097).
 *
 * Every output row is computed from its own query, and the order of every sum depends only on the keys
 * that row sees: a score is an L-lane accumulator over the head in order, reduced by a network that treats
 * every key alike (score()), the softmax denominator runs over L-lane blocks of keys counted from the
 * row's first key, the weighted values key by key in order. Keys a row does not see are skipped or add
 * exact zeros. So the query of position p gets the same bits in a decode step, in any row of a
 * verify, in any batch and on any thread count, as the linear layers do (gemv.c): greedy speculative
 * decoding breaks an exact tie as plain decoding does.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#ifdef __AVX512F__
static inline vec vround(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vec vscale2(vec y, vec n) { return _mm512_scalef_ps(y, n); } /* y * 2^n */
static inline vec vkeep(vec p, vec s) { /* p where s > -inf, else 0 */
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, vset1(-INFINITY), _CMP_GT_OQ), p);
}
#else
static inline vec vround(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vec vscale2(vec y, vec n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
static inline vec vkeep(vec p, vec s) { return _mm256_and_ps(p, _mm256_cmp_ps(s, vset1(-INFINITY), _CMP_GT_OQ)); }
#endif

/* e^x for x <= 0 (a score minus the row's maximum), to about float32 precision; below -87 it returns about e^-87
 * (1.6e-38, nothing against the maximum's e^0 = 1). Range reduction to r in [-ln2/2, ln2/2] with ln 2 in
 * two parts, a degree-5 polynomial for (e^r - 1 - r) / r^2 (Cephes' expf coefficients), then 2^n. */
static inline vec vexp(vec x) {
    x = vmax(x, vset1(-87.0f));
    vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    vec y = vadd(vfma(p, vmul(r, r), r), vset1(1.0f));
    return vscale2(y, n);
}

/* Keys scored at once: one accumulator (a vector) per key. */
#define KEYS L
/* Read in place of the keys past the last of a block (head sizes up to MAX_HEAD). */
#define MAX_HEAD 1024
static const float ZEROS[MAX_HEAD];

#ifdef __AVX512F__
/* The key of each lane of reduce()'s result (a permutation that is its own inverse). */
static const int KEY_OF_LANE[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
/* The lane sums of 16 vectors in one: lanes i and i + 8 of every vector, then i and i + 4 of those, i and
 * i + 2, i and i + 1; every vector's lanes meet in the same tree, wherever it sits. */
static inline vec reduce(vec *a) {
    vec t[8], u[4], v[2];
    for (int k = 0; k < 8; k++)
        t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[k], a[k + 8], 0x44),
                             _mm512_shuffle_f32x4(a[k], a[k + 8], 0xEE));
    for (int k = 0; k < 4; k++)
        u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(t[k], t[k + 4], 0x88),
                             _mm512_shuffle_f32x4(t[k], t[k + 4], 0xDD));
    for (int k = 0; k < 2; k++)
        v[k] = _mm512_add_ps(_mm512_shuffle_ps(u[k], u[k + 2], 0x44), _mm512_shuffle_ps(u[k], u[k + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
}
static inline vec in_key_order(vec x) {
    return _mm512_permutexvar_ps(_mm512_loadu_si512(KEY_OF_LANE), x);
}
static inline void store_first(float *s, vec x, int n) { _mm512_mask_storeu_ps(s, (__mmask16)((1u << n) - 1), x); }
#else
static const int KEY_OF_LANE[8] = {0, 2, 1, 3, 4, 6, 5, 7};
/* The same for 8 vectors of 8 lanes: i and i + 4, then i and i + 2, i and i + 1. */
static inline vec reduce(vec *a) {
    vec t[4], u[2];
    for (int k = 0; k < 4; k++)
        t[k] = _mm256_add_ps(_mm256_permute2f128_ps(a[k], a[k + 4], 0x20),
                             _mm256_permute2f128_ps(a[k], a[k + 4], 0x31));
    for (int k = 0; k < 2; k++)
        u[k] = _mm256_add_ps(_mm256_shuffle_ps(t[k], t[k + 2], 0x44), _mm256_shuffle_ps(t[k], t[k + 2], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0x88), _mm256_shuffle_ps(u[0], u[1], 0xDD));
}
static inline vec in_key_order(vec x) {
    return _mm256_permutevar8x32_ps(x, _mm256_loadu_si256((const __m256i *)KEY_OF_LANE));
}
static inline void store_first(float *s, vec x, int n) {
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(s, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), x);
}
#endif

/* s[k] = scale * dot(q[0:D], keys[k][0:D]) for the nk <= KEYS keys: each key's products summed in L-lane
 * blocks of the head in order, its lanes by reduce(), then its last D % L products in order. A score thus
 * does not depend on which keys share its call, and a decode step and a verify get the same. (A
 * horizontal sum per key took more instructions than the key's products.) */
static inline void score(const float *q, const float *const *keys, int nk, long D, float scale, float *s) {
    const float *k_[KEYS];
    vec a[KEYS];
    for (int k = 0; k < KEYS; k++) {
        k_[k] = k < nk ? keys[k] : ZEROS;
        a[k] = vzero();
    }
    long d = 0;
    for (; d + L <= D; d += L) {
        vec qv = vload(q + d);
        for (int k = 0; k < KEYS; k++)
            a[k] = vfma(qv, vload(k_[k] + d), a[k]);
    }
    if (d == D) {  /* whole vectors (head sizes 64, 128, ...): scale, put in key order and store at once */
        vec x = in_key_order(vmul(reduce(a), vset1(scale)));
        store_first(s, x, nk);
        return;
    }
    float sums[KEYS];  /* (a scalar read of a vector store waits for it: only for the rare odd head sizes) */
    vstore(sums, reduce(a));
    for (int k = 0; k < nk; k++) {
        float x = sums[KEY_OF_LANE[k]];
        for (long e = d; e < D; e++)
            x = __builtin_fmaf(q[e], k_[k][e], x);
        s[k] = x * scale;
    }
}

/* Where a request's keys and values are. */
typedef struct {
    const float *k_cache, *v_cache, *k_new, *v_new;
    long kn_row, vn_row, hkv, D, Dv;
    const int32_t *slots;  /* the request's row of req_to_token */
    long first_new, P;     /* row of the request's first new token in k_new / v_new; cached keys before it */
} kv_src;

static inline const float *key(const kv_src *c, long j, long kh) {
    if (c->k_new && j >= c->P)
        return c->k_new + (c->first_new + j - c->P) * c->kn_row + kh * c->D;
    return c->k_cache + ((long)c->slots[j] * c->hkv + kh) * c->D;
}

static inline const float *value(const kv_src *c, long j, long kh) {
    if (c->v_new && j >= c->P)
        return c->v_new + (c->first_new + j - c->P) * c->vn_row + kh * c->Dv;
    return c->v_cache + ((long)c->slots[j] * c->hkv + kh) * c->Dv;
}

/* One query vector (a new token's head) of a kv head's group: the keys [lo, hi) it may see (a mask, when
 * given, from key mask_from on), its scores and then weights s (key lo first), its output o [Dv]. */
typedef struct {
    const float *q;
    float *s, *o;
    const uint8_t *mask;
    long row, mask_from, lo, hi;  /* row: the query's token among the request's new ones */
    float m, denom;
} query;

static inline int seen(const query *r, long j) { return !r->mask || j < r->mask_from || r->mask[j - r->mask_from]; }

/* Keys a block: every query of a group reads the block's keys and values while they are in L1 (one pass
 * per query over a whole long sequence ran from L2 at ~7 ns a key and head on the Zen 5 EPYC). */
#define KB 32

/* o[d0 : d0 + NV * L] += p[j - lo] * value_j[same] for keys j in [a, b) in order, for Q = 1 or 2 queries of
 * one row (a kv group's heads of one token: the same keys seen), in registers meanwhile. Two queries share
 * each load of a value and give the FMAs twice the independent chains (one query is bound by the latency
 * of its NV chains); each query's sums are the same either way. */
static inline __attribute__((always_inline)) void weigh(const kv_src *c, query *const *r, int Q, long a, long b,
                                                        long kh, long d0, int NV) {
    vec acc[2][4];
    for (int q = 0; q < Q; q++)
        for (int u = 0; u < NV; u++)
            acc[q][u] = vload(r[q]->o + d0 + u * L);
    long lo = r[0]->lo;
    for (long j = a; j < b; j++) {
        float w = r[0]->s[j - lo];
        if (w == 0.0f)  /* a key the row does not see (a seen key's weight is at least e^-87) */
            continue;
        const float *v = value(c, j, kh) + d0;
        vec w0 = vset1(w), w1 = Q == 2 ? vset1(r[1]->s[j - lo]) : w0;
        for (int u = 0; u < NV; u++) {
            vec x = vload(v + u * L);
            acc[0][u] = vfma(w0, x, acc[0][u]);
            if (Q == 2)
                acc[1][u] = vfma(w1, x, acc[1][u]);
        }
    }
    for (int q = 0; q < Q; q++)
        for (int u = 0; u < NV; u++)
            vstore(r[q]->o + d0 + u * L, acc[q][u]);
}

#define WEIGH(Q, NV) case NV: weigh(c, r, Q, a, b, kh, d0, NV); break
/* weigh() over the whole head of values, in chunks of up to 4 vectors, then the last Dv % L lanes. */
static void weigh_block(const kv_src *c, query *const *r, int Q, long a, long b, long kh) {
    long Dv = c->Dv, d0 = 0;
    while (d0 + L <= Dv) {
        long nv = (Dv - d0) / L;
        nv = nv > 4 ? 4 : nv;
        if (Q == 2)
            switch (nv) { WEIGH(2, 1); WEIGH(2, 2); WEIGH(2, 3); default: weigh(c, r, 2, a, b, kh, d0, 4); }
        else
            switch (nv) { WEIGH(1, 1); WEIGH(1, 2); WEIGH(1, 3); default: weigh(c, r, 1, a, b, kh, d0, 4); }
        d0 += nv * L;
    }
    for (int q = 0; q < Q; q++)
        for (long d = d0; d < Dv; d++)
            for (long j = a; j < b; j++)
                if (r[q]->s[j - r[q]->lo] != 0.0f)
                    r[q]->o[d] = __builtin_fmaf(r[q]->s[j - r[q]->lo], value(c, j, kh)[d], r[q]->o[d]);
}

/* The G queries of kv head kh of one request, over its len keys. */
static void attend_group(const kv_src *c, query *rs, long G, long kh, long len, float scale, float v_scale) {
    for (long g = 0; g < G; g++)
        rs[g].m = -INFINITY;
    for (long jb = 0; jb < len; jb += KB) {
        long je = jb + KB < len ? jb + KB : len;
        for (long g = 0; g < G; g++) {
            query *r = rs + g;
            long a = jb > r->lo ? jb : r->lo, b = je < r->hi ? je : r->hi;
            for (long j = a; j < b; j += KEYS) {
                int nk = b - j < KEYS ? (int)(b - j) : KEYS;
                const float *keys[KEYS];
                for (int k = 0; k < nk; k++)
                    keys[k] = key(c, j + k, kh);
                score(r->q, keys, nk, c->D, scale, r->s + j - r->lo);
            }
            for (long j = a; j < b; j++) {
                if (!seen(r, j))
                    r->s[j - r->lo] = -INFINITY;
                else if (r->s[j - r->lo] > r->m)
                    r->m = r->s[j - r->lo];
            }
        }
    }
    for (long g = 0; g < G; g++) {
        query *r = rs + g;
        memset(r->o, 0, c->Dv * sizeof(float));
        if (r->m == -INFINITY) {  /* nothing seen (padding): zeros, like the PyTorch path */
            r->hi = r->lo;
            continue;
        }
        long n = r->hi - r->lo, nb = (n + L - 1) / L;
        for (long j = n; j < nb * L; j++)
            r->s[j] = -INFINITY;
        vec mv = vset1(r->m), total = vzero();
        for (long b = 0; b < nb; b++) {
            vec x = vload(r->s + b * L);
            vec p = vkeep(vexp(vsub(x, mv)), x);
            vstore(r->s + b * L, p);
            total = vadd(total, p);
        }
        r->denom = sum8(half(total));
    }
    for (long jb = 0; jb < len; jb += KB) {
        long je = jb + KB < len ? jb + KB : len;
        for (long g = 0; g < G; g++) {
            query *r[2] = {rs + g, rs + g + 1};
            int Q = g + 1 < G && r[1]->row == r[0]->row ? 2 : 1;
            long a = jb > r[0]->lo ? jb : r[0]->lo, b = je < r[0]->hi ? je : r[0]->hi;
            if (a < b)
                weigh_block(c, r, Q, a, b, kh);
            g += Q - 1;
        }
    }
    for (long g = 0; g < G; g++) {
        query *r = rs + g;
        if (r->hi > r->lo)
            for (long d = 0; d < c->Dv; d++)
                r->o[d] = r->o[d] / r->denom * v_scale;
    }
}

/* Requests b < B, each with seq_lens[b] tokens of which the last ext_lens[b] (1 each when ext_lens is
 * NULL: a decode step) are new, packed in order into the N rows of q [N, H, D] (row t at q + t * q_row);
 * request b's token positions map to cache slots through req_to_token[req_pool_indices[b], :].
 * Caches k_cache [pool, Hkv, D], v_cache [pool, Hkv, Dv]. k_new / v_new [N, Hkv, D|Dv] (or NULL): the new
 * tokens' keys and values, used instead of the cache's; with store_loc [N] they are first written to those
 * slots. The new token i of a request (position P + i, P its cached tokens) sees keys j <= P + i (all with
 * causal == 0) or, with a mask of mask_numel bytes, the prefix and the new keys its mask row marks (E x E
 * per request, SGLang's QLEN_ONLY layout) or the keys it marks (E x seq_len, FULL_MASK; told apart by the
 * size); with window > 0 only keys j > P + i - window. Scores are scaled by `scale`, outputs by v_scale;
 * out [N, H, Dv] (row stride o_row). The requests' kv heads are shared among the caller's OpenMP threads
 * when parallel_from >= 0 and the work (N * H * longest seq_len * D) is at least parallel_from.
 * Returns 0, or before writing anything: -1 a request's row or lengths outside req_to_token, -2 rows
 * that do not add up to N, -3 a slot outside the cache, -4 a store slot outside the cache, -5 a mask of
 * the wrong size, -6 out of memory (then also after the store, with out incomplete). */
int nanospec_attention(const float *q, long q_row, const float *k_new, long kn_row, const float *v_new,
                       long vn_row, const int64_t *store_loc, float *k_cache, float *v_cache, long pool,
                       const int32_t *req_to_token, long r2t_rows, long r2t_width,
                       const int64_t *req_pool_indices, const int64_t *seq_lens, const int64_t *ext_lens,
                       long B, long N, const uint8_t *mask, long mask_numel, int causal, long window,
                       float *out, long o_row, long H, long Hkv, long D, long Dv, float scale, float v_scale,
                       long parallel_from) {
    long total = 0, qlen_total = 0, full_total = 0, max_len = 0, max_ext = 0;
    for (long b = 0; b < B; b++) {
        long e = ext_lens ? ext_lens[b] : 1, len = seq_lens[b], r = req_pool_indices[b];
        if (r < 0 || r >= r2t_rows || e < 0 || len < e || len > r2t_width)
            return -1;
        const int32_t *slots = req_to_token + r * r2t_width;
        for (long j = 0; j < len; j++)
            if (slots[j] < 0 || slots[j] >= pool)
                return -3;
        total += e;
        qlen_total += e * e;
        full_total += e * len;
        max_len = len > max_len ? len : max_len;
        max_ext = e > max_ext ? e : max_ext;
    }
    if (total != N)
        return -2;
    /* The two layouts agree where they have the same size (no request has a cached prefix). */
    int mask_layout = !mask ? 0 : mask_numel == qlen_total ? 1 : 2;
    if (mask && mask_layout == 2 && mask_numel != full_total)
        return -5;
    if (store_loc)
        for (long t = 0; t < N; t++)
            if (store_loc[t] < 0 || store_loc[t] >= pool)
                return -4;
    long *meta = malloc(sizeof(long) * (2 * B + 1));  /* per request: its first row, its mask's offset */
    if (!meta)
        return -6;
    long *first = meta, *mbase = meta + B;
    for (long b = 0, t = 0, moff = 0; b < B; b++) {
        long e = ext_lens ? ext_lens[b] : 1;
        first[b] = t;
        mbase[b] = moff;
        t += e;
        moff += mask_layout == 1 ? e * e : e * seq_lens[b];
    }
    if (store_loc && k_new && v_new)
        for (long t = 0; t < N; t++) {
            memcpy(k_cache + store_loc[t] * Hkv * D, k_new + t * kn_row, Hkv * D * sizeof(float));
            memcpy(v_cache + store_loc[t] * Hkv * Dv, v_new + t * vn_row, Hkv * Dv * sizeof(float));
        }
    long group = H / Hkv, G_max = group * max_ext;
    int failed = 0;
    int parallel = parallel_from >= 0 && N * H * max_len * D >= parallel_from;
    #pragma omp parallel if (parallel)
    {
        float *s = malloc(sizeof(float) * G_max * (max_len + L));
        query *rs = malloc(sizeof(query) * G_max);
        if (!s || !rs) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (long task = 0; task < B * Hkv; task++) {
            if (!s || !rs)
                continue;
            long b = task / Hkv, kh = task % Hkv;
            long e = ext_lens ? ext_lens[b] : 1, len = seq_lens[b], P = len - e;
            kv_src c = {k_cache, v_cache, k_new, v_new, kn_row, vn_row, Hkv, D, Dv,
                        req_to_token + req_pool_indices[b] * r2t_width, first[b], P};
            for (long i = 0, g = 0; i < e; i++) {
                long qa = P + i, t = first[b] + i;
                for (long u = 0; u < group; u++, g++) {
                    long h = kh * group + u;
                    query *r = rs + g;
                    r->row = i;
                    r->q = q + t * q_row + h * D;
                    r->o = out + t * o_row + h * Dv;
                    r->s = s + g * (max_len + L);
                    r->mask = mask ? mask + mbase[b] + i * (mask_layout == 1 ? e : len) : NULL;
                    r->mask_from = mask_layout == 1 ? P : 0;
                    r->hi = (causal && !mask) ? qa + 1 : len;
                    r->lo = window > 0 && qa + 1 - window > 0 ? qa + 1 - window : 0;
                    if (r->hi < r->lo)
                        r->hi = r->lo;
                }
            }
            attend_group(&c, rs, group * e, kh, len, scale, v_scale);
        }
        free(s);
        free(rs);
    }
    free(meta);
    return failed ? -6 : 0;
}
