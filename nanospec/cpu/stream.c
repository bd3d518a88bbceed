/* One decode step of the dynamic-vocabulary streams on the CPU: torch_ops.extend's algorithm, lane for
 * lane, as loops over a request's C candidates instead of about 80 tensor operations.
 *
 * Built and loaded by nanospec/cpu/stream.py (see its docstring for why). Every quantity below is the
 * one of the same name in nanospec/kernels/torch_ops.py, computed for one request row at a time, and
 * the writes go in the same order, so the state, the rows to gather and the columns chosen are the
 * twin's bit for bit (tests/test_cpu_stream.py). Column, count, ring and stack entries are int16
 * (state.col_dtype for W <= 32767; the caller keeps the twin otherwise).
 */
#include <stdint.h>
#include <string.h>

#define CMAX 1024 /* candidates per request; the caller keeps the twin for more */

/* Returns 0, or -1 (nothing written) when a slot lies outside [0, R) or a valid candidate outside
 * [0, V): the twin's indexing raises there, and a C write there would corrupt memory. */
int nanospec_stream_extend(int16_t *col_of, int32_t *col_tok, int16_t *count, int16_t *ring, int16_t *stack,
                           int32_t *nfree, int64_t *pos, int64_t *gathered, const int64_t *reqs,
                           const int64_t *cand_all, const unsigned char *valid_all, int64_t *dst_all,
                           long B, long C, long W, long V, long R) {
    if (C > CMAX) return -1;
    for (long b = 0; b < B; b++) {
        if (reqs[b] < 0 || reqs[b] >= R) return -1;
        for (long i = 0; i < C; i++)
            if (valid_all[b * C + i] && (cand_all[b * C + i] < 0 || cand_all[b * C + i] >= V)) return -1;
    }
    unsigned char uniq[CMAX], kept[CMAX], had_old[CMAX], active[CMAX], fresh[CMAX], first_e[CMAX],
        freed[CMAX], reused[CMAX], leftover[CMAX];
    long k[CMAX], slot[CMAX], old_col[CMAX], cur_col[CMAX], cnt_e[CMAX], cnt_i[CMAX], old_tok[CMAX],
        fr[CMAX], nr[CMAX], new_col[CMAX], final_col[CMAX], inc_e[CMAX];
    for (long b = 0; b < B; b++) {
        const int64_t r = reqs[b], *cand = cand_all + b * C;
        const unsigned char *valid = valid_all + b * C;
        int64_t *dst = dst_all + b * C;
        int16_t *cnt = count + r * W, *rng = ring + r * W, *stk = stack + r * W, *cof = col_of + r * V;
        int32_t *ctok = col_tok + r * W;

        long n = 0;
        for (long i = 0; i < C; i++) {
            uniq[i] = valid[i];
            for (long j = 0; j < i && uniq[i]; j++)
                if (valid[j] && cand[j] == cand[i]) uniq[i] = 0;
            n += uniq[i];
            k[i] = n - 1;
        }
        const long pos0 = pos[r];
        for (long i = 0; i < C; i++) {
            kept[i] = uniq[i] && k[i] >= n - W;
            slot[i] = kept[i] ? (pos0 + k[i]) % W : 0;
            had_old[i] = kept[i] && (pos0 >= W || slot[i] < pos0);
            old_col[i] = had_old[i] ? rng[slot[i]] : -1;
            cur_col[i] = kept[i] ? cof[cand[i]] : -1;
            active[i] = kept[i] && cur_col[i] >= 0;
            fresh[i] = kept[i] && cur_col[i] < 0; /* torch_ops' "new" */
        }
        long nf = 0, nn = 0;
        for (long i = 0; i < C; i++) {
            long n_dec = 0, dec_i = 0;
            first_e[i] = had_old[i];
            inc_e[i] = 0;
            for (long j = 0; j < C; j++) {
                if (had_old[j] && old_col[j] == old_col[i]) {
                    n_dec++;
                    if (j < i) first_e[i] = 0;
                }
                if (active[j] && cur_col[j] == old_col[i]) inc_e[i]++;
                if (had_old[j] && old_col[j] == cur_col[i]) dec_i++;
            }
            cnt_e[i] = (had_old[i] ? cnt[old_col[i]] : 0) + inc_e[i] - n_dec;
            freed[i] = first_e[i] && cnt_e[i] == 0;
            cnt_i[i] = (active[i] ? cnt[cur_col[i]] : 0) + 1 - dec_i;
            old_tok[i] = freed[i] ? ctok[old_col[i]] : 0;
            fr[i] = nf + freed[i] - 1;
            nr[i] = nn + fresh[i] - 1;
            nf += freed[i];
            nn += fresh[i];
        }
        const long nfree0 = nfree[r];
        for (long i = 0; i < C; i++) {
            new_col[i] = 0;
            if (fresh[i] && nr[i] < nf) { /* this step's freed column of the same rank */
                for (long j = 0; j < C; j++)
                    if (freed[j] && fr[j] == nr[i]) new_col[i] = old_col[j];
            } else {
                long at = nfree0 - 1 - (nr[i] - nf);
                at = at < 0 ? 0 : (at > W - 1 ? W - 1 : at);
                new_col[i] = stk[at];
            }
            reused[i] = freed[i] && fr[i] < nn;
            leftover[i] = freed[i] && !reused[i];
            final_col[i] = active[i] ? cur_col[i] : new_col[i];
        }
        /* The writes, in torch_ops.extend's order. */
        for (long i = 0; i < C; i++)
            if (first_e[i] && inc_e[i] == 0 && !reused[i]) cnt[old_col[i]] = (int16_t)cnt_e[i];
        for (long i = 0; i < C; i++)
            if (active[i]) cnt[cur_col[i]] = (int16_t)cnt_i[i];
        for (long i = 0; i < C; i++)
            if (fresh[i]) cnt[new_col[i]] = 1;
        for (long i = 0; i < C; i++)
            if (freed[i]) cof[old_tok[i]] = -1;
        for (long i = 0; i < C; i++)
            if (fresh[i]) cof[cand[i]] = (int16_t)new_col[i];
        for (long i = 0; i < C; i++)
            if (leftover[i]) ctok[old_col[i]] = -1;
        for (long i = 0; i < C; i++)
            if (fresh[i]) ctok[new_col[i]] = (int32_t)cand[i];
        for (long i = 0; i < C; i++)
            if (kept[i]) rng[slot[i]] = (int16_t)final_col[i];
        for (long i = 0; i < C; i++)
            if (leftover[i]) stk[nfree0 + fr[i] - nn] = (int16_t)old_col[i];
        nfree[r] = (int32_t)(nfree0 + nf - nn);
        pos[r] += n;
        gathered[r] += nn;
        for (long i = 0; i < C; i++) dst[i] = fresh[i] ? r * W + new_col[i] : -1;
    }
    return 0;
}

#define TOPK_KMAX 64 /* topk.c's KMAX */
int nanospec_topk(const float *x, long nrows, long stride, const int64_t *rows, long n, long vocab, long k,
                  int64_t *out);

/* A draft row for target id t: t itself without a map (t2d NULL), else t2d[t], -1 where there is none. */
static inline int64_t draft_row(int64_t t, const int64_t *t2d, long n_t2d) {
    if (!t2d) return t;
    return t >= 0 && t < n_t2d ? t2d[t] : -1;
}

/* One verify's candidates and what it emitted, per request, before the streams' update: Proposer's
 * tensor path (streams.emitted_tokens, verify_candidates and to_draft_space; DynamicVocab.contains and
 * active_sizes) as one loop over each request's tree and accepted path, in place of about 40 tensor
 * operations.
 *
 * Per request b (slot reqs[b]): tree [B * T] draft tokens, root first; accept [B * S1] rows of logits on
 * the accepted path (-1 padded); accept_lens [B]; predict [B * P] verified tokens, accepted path first;
 * logits [n_logits rows, stride floats apart]. Writes cand [B * C] / valid [B * C] with C = S1 (context:
 * the emitted tokens) or T + S1 * k (the tree, then the top-k of each accepted row), in draft rows; and
 * stats [B * 3]: active vocabulary size, tokens emitted, emitted tokens active. Entries with valid 0 hold
 * 0 (the twin leaves other values there; no caller reads them). Returns 0, or -1 (nothing written)
 * where the twin's indexing raises: a slot outside [0, R), an accepted row at or past n_logits, or k
 * outside topk.c's range. */
int nanospec_verify_candidates(const int64_t *reqs, const int64_t *tree, const int64_t *accept,
                               const int64_t *accept_lens, const int64_t *predict, const float *logits,
                               long n_logits, long stride, const int64_t *t2d, long n_t2d,
                               const int16_t *col_of, const int32_t *nfree, long B, long T, long S1, long P,
                               long vocab, long k, int context, long W, long V, long R, int64_t *cand,
                               unsigned char *valid, int64_t *stats) {
    const long C = context ? S1 : T + S1 * k;
    if (!context && (k < 1 || k > TOPK_KMAX || k > vocab)) return -1;
    for (long b = 0; b < B; b++)
        if (reqs[b] < 0 || reqs[b] >= R) return -1;
    for (long i = 0; i < B * S1; i++)
        if (accept[i] >= n_logits) return -1;
    for (long b = 0; b < B; b++) {
        const int16_t *cof = col_of + reqs[b] * V;
        int64_t *cd = cand + b * C;
        unsigned char *ok = valid + b * C;
        long emitted = 0, hits = 0;
        for (long j = 0; j < S1; j++) {
            if (j >= accept_lens[b]) continue;
            const int64_t row = draft_row(predict[b * P + j], t2d, n_t2d);
            emitted++;
            hits += row >= 0 && row < V && cof[row] >= 0;
        }
        stats[b * 3] = W - nfree[reqs[b]];
        stats[b * 3 + 1] = emitted;
        stats[b * 3 + 2] = hits;
        if (context) {
            for (long j = 0; j < S1; j++) {
                const int64_t row = j < accept_lens[b] ? draft_row(predict[b * P + j], t2d, n_t2d) : -1;
                ok[j] = row >= 0;
                cd[j] = row >= 0 ? row : 0;
            }
            continue;
        }
        for (long t = 0; t < T; t++) {
            const int64_t tok = tree[b * T + t];
            const int64_t row = tok >= 0 ? draft_row(tok, t2d, n_t2d) : -1;
            ok[t] = row >= 0;
            cd[t] = row >= 0 ? row : 0;
        }
        for (long j = 0; j < S1; j++) {
            int64_t *top = cd + T + j * k;
            unsigned char *top_ok = ok + T + j * k;
            const int64_t at = accept[b * S1 + j];
            if (at < 0) {
                for (long i = 0; i < k; i++) top[i] = 0, top_ok[i] = 0;
                continue;
            }
            if (nanospec_topk(logits, n_logits, stride, &at, 1, vocab, k, top)) return -1;
            for (long i = 0; i < k; i++) {
                const int64_t row = draft_row(top[i], t2d, n_t2d);
                top_ok[i] = row >= 0;
                top[i] = row >= 0 ? row : 0;
            }
        }
    }
    return 0;
}

/* torch_ops.gather on the CPU: packed row dst[i] = weight row src[i] for every dst[i] >= 0 (rows of
 * row_bytes bytes; weight holds n_src rows, packed n_dst), in place of four tensor operations that
 * run in every verify whether or not a row became active. Returns 0, or -1 (nothing written) for a
 * row outside its array. */
int nanospec_gather_rows(const char *weight, char *packed, const int64_t *dst, const int64_t *src, long n,
                         long row_bytes, long n_src, long n_dst) {
    for (long i = 0; i < n; i++)
        if (dst[i] >= n_dst || (dst[i] >= 0 && (src[i] < 0 || src[i] >= n_src))) return -1;
    for (long i = 0; i < n; i++)
        if (dst[i] >= 0) memcpy(packed + dst[i] * row_bytes, weight + src[i] * row_bytes, row_bytes);
    return 0;
}
