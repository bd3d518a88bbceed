/* Few-row float32 linear layer for x86-64 CPUs with AVX2 and FMA (AVX-512 where the build enables it):
 * y[m, n] = dot(w[n, :], x[m, :]) (+ b[n]) for M = 1 to a few rows.
 *
 * Built and loaded by nanospec/cpu/gemv.py (see its docstring for why). A decode step multiplies one row
 * by every weight matrix and a target-verify a few rows, so both should cost about one read of the
 * weights from memory. Two things keep a few rows at that cost:
 * - Tiles of NB outputs by up to RMAX rows of x (NB x RMAX accumulators in registers): each vector of x
 *   loaded from L1 serves NB outputs, each vector of w serves R rows. With one output at a time (the
 *   earlier kernel) a load of x fed one FMA: on a Zen 4 EPYC 4 rows against a cached weight ran
 *   at 31-42 GMAC/s on two cores, against 66-88 with 4 x 4 tiles, and through a model's weights took
 *   1.5x the time of one row, against about 1x with tiles (measured at commit c6e3544).
 * - A tile reads NB rows of w at once, short streams that the hardware prefetcher follows badly (one
 *   row of x through such tiles ran 16-43 % slower than through one row of w at a time), so each tile
 *   prefetches, in order and into L2, the weight rows of the tile PF_TILES ahead. One row of x (a decode
 *   step) takes tiles of one output, a single sequential stream, the fastest pattern for one row; so do
 *   two rows (a verify of one draft token) where that measured faster (STREAM_ROWS).
 *
 * Every y[m, n] is summed in the same order whatever M, N, m, the tiling and the thread count: one
 * accumulator of L lanes over the L-float blocks of the row in order, a fixed horizontal sum, then the
 * last K % L products in order. So a decode step (1 row) and a verify (k rows) give the same bits for the
 * same input row, and greedy speculative decoding keeps plain decoding's choice at an exact tie. The
 * tiles of outputs are split across the OpenMP threads of the caller's runtime (the loader checks that
 * it is the one PyTorch uses).
 */
#include "simd.h"

/* Tiles ahead that the weight prefetch reads: 2 tiles into L2 was the best of 1 tile into L1, L2 or L3,
 * 2 into L2, and 8 KB ahead of each row into L1 (the one-output kernel's prefetch). */
#define PF_TILES 2

#ifdef __AVX512F__
#define NB 4   /* 16 accumulators + 4 of w + 1 of x of the 32 vector registers; 4 x 6 measured no faster */
#define RMAX 4
/* Wide tiles: 3 x 8 = 24 accumulators + 3 of w + 1 of x. The 8 rows of x (at 4,096 floats 128 KB, read
 * from L2) stream once per tile: once per 3 weight rows instead of 2. The packed head's 8 draft rows per
 * request at Llama-3.1-8B dims (4 requests, one thread, Zen 4) went from 1.35-1.69x one row to
 * 1.14-1.22x (python -m nanospec.bench.head --rows-only --threads 1, three runs each). */
#define NBW 3
/* Rows of x up to which the weight is read as one sequential stream, tiles of one output. Two rows
 * (the target-verify of a 1-step chain, the controller's usual choice) through Qwen2.5-0.5B's 24
 * layers and head, weights from DRAM, took 1.096x one row with NB-output tiles and 1.025x with
 * one-output tiles (Intel Xeon with AVX-512, one thread; inside the server the verify's linear layers
 * took 1.125x the decode step's); at 3 and 4 rows the NB-output tiles were as fast or faster. */
#define STREAM_ROWS 2
#define WIDE_R RW
#else
#define NB 2   /* 8 accumulators + 2 + 1 of the 16 registers */
#define RMAX 4
/* Wide tiles: 3 outputs by at most 4 rows of x, 12 accumulators + 3 of w + 1 of x, the 5 to 8 rows in
 * two groups. The packed head's 8 draft rows per request at Llama-3.1-8B dims (4 requests of 3,072 x
 * 4,096 floats, one thread, AMD EPYC Zen 3 with AVX2 only) took 1.86-1.92x one row in one group of 8
 * rows and one output (9 loads for 8 FMAs; the 8 rows of x, 128 KB, read from L2 once per weight row)
 * and 1.24-1.33x in 3 x 4 tiles, which read the tile's weight rows again from L2 for the second group
 * (python -m nanospec.bench.head --rows-only --threads 1, three runs). */
#define NBW 3
#define WIDE_R RMAX
/* Two rows through the same layers took 1.11-1.16x one row with these 2-output tiles and 1.14-1.20x as
 * one stream (AMD EPYC Zen 3 with AVX2 only, one and two threads; in the server the verify took
 * 1.03-1.05x the decode step against 1.09-1.21x): the tiles stay from 2 rows up. */
#define STREAM_ROWS 1
#endif
/* Wide tiles: 5 to RW rows, in groups of at most WIDE_R. With AVX-512, one group, so a weight row is read
 * once for all of them: in two groups of 4 the second re-read the tile's weight rows, which at 4 x 4096
 * floats no longer sit in L1, and the packed draft head's 8 draft rows of a request (4096-wide, 3072
 * rows) took 2.0x one row, against about 1x for 4 rows. */
#define RW 8
#define PMAX (NB > NBW ? NB : NBW)  /* most outputs in a tile */

/* How a tile prefetches the weight rows of the tile PF_TILES ahead: front to back, P lines per 16 floats
 * of k; or each row at the same k as the tile's own rows (AVX2's wide tiles: 8 rows took 1.5-1.6x one
 * row with the walk front to back in both groups, 1.3-1.4x with one stream per row in the first group
 * only; Zen 3, Llama-3.1-8B head dims, a standalone C loop); or not at all (a later group of rows of a
 * tile whose first group prefetched). */
enum prefetch { PF_WALK, PF_ROWS, PF_NONE };

/* Weights are float32, or bfloat16 (bf = 1: a draft's layers stored at half the bytes, widened to
 * float32 as they are loaded; the products and sums stay float32). bf is a constant where inlined. */
static inline __attribute__((always_inline)) vec wvec(const void *w, long i, int bf) {
    return bf ? vload_bf16((const unsigned short *)w + i) : vload((const float *)w + i);
}
static inline __attribute__((always_inline)) float wone(const void *w, long i, int bf) {
    return bf ? bf16_to_f32(((const unsigned short *)w)[i]) : ((const float *)w)[i];
}
static inline __attribute__((always_inline)) const char *wat(const void *w, long i, int bf) {
    return (const char *)w + i * (bf ? 2 : 4);
}

/* y[r * N + i] = dot(w[i * K :], x[r * K :]) (+ b[i]) for i < P outputs, r < R rows; P, R and bf are
 * constants where this is inlined. */
static inline __attribute__((always_inline)) void tile(const void *w, const float *x, const float *b,
                                                       float *y, long N, long K, int P, int R,
                                                       enum prefetch pf, int bf) {
    vec a[PMAX][RW];
    for (int i = 0; i < P; i++)
        for (int r = 0; r < R; r++)
            a[i][r] = vzero();
    long k = 0;
    for (; k + L <= K; k += L) {
        vec wv[PMAX];
        for (int i = 0; i < P; i++) {
            if (k % 16 == 0 && pf == PF_WALK)
                _mm_prefetch(wat(w, PF_TILES * P * K + P * k + i * 16, bf), _MM_HINT_T1);
            else if (k % 16 == 0 && pf == PF_ROWS)
                _mm_prefetch(wat(w, PF_TILES * P * K + i * K + k, bf), _MM_HINT_T1);
            wv[i] = wvec(w, i * K + k, bf);
        }
        for (int r = 0; r < R; r++) {
            vec xv = vload(x + r * K + k);
            for (int i = 0; i < P; i++)
                a[i][r] = vfma(wv[i], xv, a[i][r]);
        }
    }
    for (int i = 0; i < P; i++)
        for (int r = 0; r < R; r++) {
            float s = sum8(half(a[i][r]));
            for (long t = k; t < K; t++)
                s = __builtin_fmaf(wone(w, i * K + t, bf), x[r * K + t], s);
            y[r * N + i] = b ? s + b[i] : s;
        }
}

#define CASE(P, R) case R: tile(wp, xg, bp, yp, N, K, P, R, pf, bf); break
#define TILES(P) switch (R) { CASE(P, 1); CASE(P, 2); CASE(P, 3); CASE(P, 4); default: break; }
#define WIDE(P) switch (R) { CASE(P, 1); CASE(P, 2); CASE(P, 3); CASE(P, 4); \
                            CASE(P, 5); CASE(P, 6); CASE(P, 7); CASE(P, 8); default: break; }

/* 5 to RW rows: wide tiles in groups of at most WIDE_R (see RW and NBW). Else NB-output tiles. The rows go
 * in the fewest groups, as even as they go (9 rows: 3 + 3 + 3, not 4 + 4 + 1). */
static inline int wide_rows(long M) { return M > RMAX && M <= RW; }
static inline long tile_outputs(long M) { return wide_rows(M) ? NBW : NB; }

/* The outputs [blk * nb, (blk + 1) * nb) of every row. */
static inline __attribute__((always_inline)) void block(const float *x, const void *w, const float *b,
                                                        float *y, long M, long N, long K, long blk, int bf) {
    int wide = wide_rows(M), rows_pf = wide && WIDE_R < RW;
    long rmax = wide ? WIDE_R : RMAX, nb = tile_outputs(M), groups = (M + rmax - 1) / rmax;
    long n0 = blk * nb;
    for (long g = 0, m = 0, R; g < groups; g++, m += R) {
        R = M / groups + (g < M % groups);
        const float *xg = x + m * K;
        enum prefetch pf = !rows_pf ? PF_WALK : g == 0 ? PF_ROWS : PF_NONE;
        if (n0 + nb <= N && M > STREAM_ROWS) {
            const void *wp = wat(w, n0 * K, bf);
            const float *bp = b ? b + n0 : 0;
            float *yp = y + m * N + n0;
            if (wide) { WIDE(NBW) } else { TILES(NB) }
        } else {
            for (long n = n0; n < N && n < n0 + nb; n++) {
                const void *wp = wat(w, n * K, bf);
                const float *bp = b ? b + n : 0;
                float *yp = y + m * N + n;
                if (wide) { WIDE(1) } else { TILES(1) }
            }
        }
    }
}

/* x [M, K], w [N, K], b [N] or NULL, y [M, N]; all row-major float32, no aliasing. */
void nanospec_linear(const float *x, const float *w, const float *b, float *y, long M, long N, long K) {
    long blocks = (N + tile_outputs(M) - 1) / tile_outputs(M);
    #pragma omp parallel for schedule(static)
    for (long blk = 0; blk < blocks; blk++) block(x, w, b, y, M, N, K, blk, 0);
}

/* The same with w [N, K] bfloat16: every y[m, n] is the float32 product with the widened weights, summed
 * in the order above. */
void nanospec_linear_bf16(const float *x, const unsigned short *w, const float *b, float *y, long M, long N,
                          long K) {
    long blocks = (N + tile_outputs(M) - 1) / tile_outputs(M);
    #pragma omp parallel for schedule(static)
    for (long blk = 0; blk < blocks; blk++) block(x, w, b, y, M, N, K, blk, 1);
}
