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
