/* Greedy verification of draft trees on the CPU: SGLang's verify_tree_greedy as one loop per request
 * instead of the 20-odd tensor operations of its PyTorch twin (ops_spec.verify_tree_greedy_cpu's
 * fallback path), whose dispatch cost about 0.3 ms in every decode cycle, plain ones included.
 *
 * Built and loaded with NanoSpec's other C kernels (nanospec/cpu/native.py). Same reads and writes as
 * the twin: from the root, descend to the first child (in sibling order) whose draft token equals the
 * target's prediction at the current node, until none does; predicts[node] = target[node] for every
 * accepted node and the last one, accept_index[b, 0..n] = their global ids (the rest untouched),
 * accept_num[b] = n (tests/test_patches_ops.py checks both paths against a plain-Python reference).
 */
#include <stdint.h>

/* Returns 0, or -1 (nothing written) when a tree index lies outside its range: ridx outside [0, N) of
 * predicts and target, rnext or rsib outside [-1, D). */
int nanospec_verify_greedy(int32_t *predicts, int32_t *accept_index, int32_t *accept_num,
                           const int64_t *cand, const int64_t *ridx, const int64_t *rnext, const int64_t *rsib,
                           const int64_t *target, long B, long D, long S, long N) {
    for (long i = 0; i < B * D; i++)
        if (ridx[i] < 0 || ridx[i] >= N || rnext[i] < -1 || rnext[i] >= D || rsib[i] < -1 || rsib[i] >= D)
            return -1;
    for (long b = 0; b < B; b++) {
        const int64_t *c = cand + b * D, *ri = ridx + b * D, *rn = rnext + b * D, *rs = rsib + b * D;
        int64_t last = ri[0];
        long cur = 0, n = 0;
        accept_index[b * S] = (int32_t)last;
        for (long j = 1; j < S; j++) {
            const int64_t want = target[last];
            long kid = rn[cur];
            for (long hops = 0; kid != -1 && c[kid] != want && hops < D; hops++) kid = rs[kid];
            if (kid != -1 && c[kid] != want) kid = -1; /* a sibling cycle: no child matched */
            if (kid == -1) break;
            predicts[last] = (int32_t)want;
            n++;
            last = ri[kid];
            accept_index[b * S + j] = (int32_t)last;
            cur = kid;
        }
        accept_num[b] = (int32_t)n;
        predicts[last] = (int32_t)target[last];
    }
    return 0;
}

/* KV-slot bookkeeping of a decode or verify step, as one loop instead of the 6-10 tensor operations of
 * ops_spec's twins: request b's range [start[b], end[b]) of req_to_token row reqs[b] ([R, L] int32)
 * against its packed part of locs (int64, one request after another). to_pool: locs -> req_to_token
 * (assign_req_to_token_pool), else req_to_token -> locs (assign_extend_cache_locs). Returns 0, or -1
 * (nothing written) for a row outside [0, R), a range outside [0, L], or more entries than n_locs. */
int nanospec_kv_segments(int32_t *req_to_token, long R, long L, const int64_t *reqs, const int64_t *start,
                         const int64_t *end, long B, int64_t *locs, long n_locs, int to_pool) {
    long total = 0;
    for (long b = 0; b < B; b++) {
        if (reqs[b] < 0 || reqs[b] >= R || start[b] < 0 || end[b] > L) return -1;
        if (end[b] > start[b]) total += end[b] - start[b];
    }
    if (total > n_locs) return -1;
    long k = 0;
    for (long b = 0; b < B; b++) {
        int32_t *row = req_to_token + reqs[b] * L;
        for (int64_t c = start[b]; c < end[b]; c++, k++) {
            if (to_pool)
                row[c] = (int32_t)locs[k];
            else
                locs[k] = row[c];
        }
    }
    return 0;
}

/* bonus[b] = tokens[stride * b + lens[b] - 1] (fill_bonus_tokens: the last accepted token of each
 * request), int32 throughout. Returns 0, or -1 (nothing written) for an index outside [0, n_tokens). */
int nanospec_fill_bonus(const int32_t *tokens, long n_tokens, const int32_t *lens, int32_t *bonus, long B,
                        long stride) {
    for (long b = 0; b < B; b++) {
        const long i = stride * b + lens[b] - 1;
        if (i < 0 || i >= n_tokens) return -1;
    }
    for (long b = 0; b < B; b++) bonus[b] = tokens[stride * b + lens[b] - 1];
    return 0;
}
