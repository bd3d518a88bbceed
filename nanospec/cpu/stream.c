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
