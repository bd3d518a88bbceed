#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
int nanospec_attention(const float *q, long q_row, const float *k_new, long kn_row, const float *v_new,
                       long vn_row, const int64_t *store_loc, float *k_cache, float *v_cache, long pool,
                       const int32_t *req_to_token, long r2t_rows, long r2t_width,
                       const int64_t *req_pool_indices, const int64_t *seq_lens, const int64_t *ext_lens,
                       long B, long N, const uint8_t *mask, long mask_numel, int causal, long window,
                       float *out, long o_row, long H, long Hkv, long D, long Dv, float scale, float v_scale,
                       long parallel_from);
int main(int argc, char **argv) {
    long H = atol(argv[1]), Hkv = atol(argv[2]), D = 64, E = atol(argv[3]), Lt = atol(argv[4]), reps = atol(argv[5]);
    long pool = Lt + 16;
    float *kc = malloc(4 * pool * Hkv * D), *vc = malloc(4 * pool * Hkv * D), *q = malloc(4 * E * H * D), *o = malloc(4 * E * H * D);
    for (long i = 0; i < pool * Hkv * D; i++) { kc[i] = (rand() % 1000) / 1000.0f - 0.5f; vc[i] = (rand() % 1000) / 1000.0f; }
    for (long i = 0; i < E * H * D; i++) q[i] = (rand() % 1000) / 1000.0f - 0.5f;
    int32_t *r2t = malloc(4 * pool); for (long i = 0; i < pool; i++) r2t[i] = i;
    int64_t rpi = 0, seq = Lt, ext = E;
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < reps; r++)
        nanospec_attention(q, H * D, 0, 0, 0, 0, 0, kc, vc, pool, r2t, 1, pool, &rpi, &seq, &ext, 1, E, 0, 0, 1, 0, o, H * D, H, Hkv, D, D, 0.125f, 1.0f, -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / reps;
    printf("H=%ld Hkv=%ld E=%ld L=%ld: %.1f us/call, %.2f ns per query-key\n", H, Hkv, E, Lt, us, us * 1e3 / (E * H * Lt));
}
