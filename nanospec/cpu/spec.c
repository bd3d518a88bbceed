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

/* First node p in [0, D - 1) of request row sel whose selected index equals tok, or -1. */
static long tree_find(const int64_t *sel, long D, int64_t tok) {
    for (long p = 0; p < D - 1; p++)
        if (sel[p] == tok) return p;
    return -1;
}

/* SGLang's build_tree_kernel_efficient as one loop per request, instead of the 30-odd tensor operations
 * of ops_spec's twin (build_tree_kernel_efficient_torch), which cost about 1.8 ms in every drafting
 * cycle inside a server: a 1-step chain's parent list is empty, which the twin's chain shortcut does
 * not take. Node i (1..D-1) is sel[b, i - 1]; its parent is the root when sel // topk == 0, else the
 * first node whose selected index equals parents[b, sel // topk]. Writes retrieval links (ridx, and
 * rnext / rsib where a link exists: the rest keep their values), positions (seq_len + depth) and
 * each mask row's tree part: the root and the node's ancestors up to `depth` levels, itself included,
 * other tree columns cleared; mode 0 (FULL_MASK) rows are seq_len + D long with the caller's prefix
 * left as is, mode 1 (QLEN_ONLY) rows D long. Returns 0, or -1 (nothing written) for a selected index
 * below 0, a parent column outside [0, P), a seq_len below 0, fewer than D - 1 selected columns or a
 * mask shorter than the rows. */
int nanospec_build_tree(const int64_t *parents, long P, const int64_t *sel, long n_sel, const int64_t *seq_lens,
                        uint8_t *mask, long n_mask, int64_t *positions, int64_t *ridx, int64_t *rnext,
                        int64_t *rsib, long B, long D, long topk, long depth, int mode) {
    if (D < 1 || topk < 1 || n_sel < D - 1 || (mode != 0 && mode != 1)) return -1;
    long need = D * D * B;
    for (long b = 0; b < B; b++) {
        if (seq_lens[b] < 0) return -1;
        if (mode == 0) need += seq_lens[b] * D;
        for (long i = 0; i < D - 1; i++) {
            const int64_t s = sel[b * n_sel + i], ptb = s / topk;
            if (s < 0 || (ptb != 0 && ptb >= P)) return -1;
        }
    }
    if (need > n_mask) return -1;
    long prefix = 0;
    long up[D]; /* parent node of each node: 0 the root, -1 none found (node 0: unused) */
    for (long b = 0; b < B; b++) {
        const int64_t *s = sel + b * n_sel, *par = parents + b * P, seq = seq_lens[b];
        int64_t *rn = rnext + b * D, *rs = rsib + b * D;
        for (long i = 1; i < D; i++) {
            const int64_t ptb = s[i - 1] / topk;
            const long p = ptb == 0 ? 0 : tree_find(s, D, par[ptb]);
            up[i] = ptb == 0 ? 0 : p < 0 ? -1 : p + 1;
        }
        for (long i = D - 1; i > 0; i--) {
            ridx[b * D + i] = b * D + i;
            if (up[i] < 0) continue;
            const int64_t next = rn[up[i]];
            rn[up[i]] = i;
            if (next != -1) rs[i] = next;
        }
        ridx[b * D] = b * D;
        for (long x = 0; x < D; x++) {
            const long t = mode == 0 ? D * D * b + prefix * D + (seq + D) * x + seq + 1 : D * D * b + D * x + 1;
            mask[t - 1] = 1;
            for (long c = 0; c < D - 1; c++) mask[t + c] = 0;
            long node = x, level = 0;
            for (long it = 0; x > 0 && it < depth; it++) {
                level++;
                mask[t + node - 1] = 1;
                if (up[node] <= 0) break; /* the root, or no parent found */
                node = up[node];
            }
            positions[b * D + x] = seq + level;
        }
        prefix += seq;
    }
    return 0;
}
