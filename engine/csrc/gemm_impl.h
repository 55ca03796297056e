/* The GEMM body, included once per (weight type, vector width) by gemm.c (no text surgery):
   GEMM(name) names the instance's functions, GEMM_WT is the weight element, GEMM_LINE how many
   fit a 64-byte cache line. The vector operations: GV the fp32 accumulator register, GX/GW the
   register an activation/weight step is loaded into (GV itself, or __m512bh for vdpbf16ps),
   GSTEP the k elements one step consumes, GV_ZERO, GX_LOAD(x), GW_LOAD(w), GV_FMA(acc, x, w)
   (acc += x . w lane-wise, or pairwise for vdpbf16ps) and GV_HSUM(v). */
/* R rows x C output channels (both compile-time constants once inlined): one accumulator per
   output, FMAs over k in order, then hsum * scale (+ bias). Every path below computes an output
   with exactly this sequence, so an output never depends on the block (hence the batch, the
   rows around it or the thread) that computed it. x rows K apart (L1-resident), w rows K apart;
   with `pf`, the weights of the block two ahead are prefetched (the first pass over a chunk's
   weights streams them from DRAM; later row blocks find them in L2). */
static inline __attribute__((always_inline)) void GEMM(blk)(const float *x, int64_t K, const GEMM_WT *w,
                                                         const float *scale, const float *bias, float *y,
                                                         int64_t ldy, const int R, const int C, int pf) {
    GV acc[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = GV_ZERO;
    const GEMM_WT *pfp = w + 2 * C * K;
    for (int64_t k = 0; k < K; k += GSTEP) {
        if (pf)
            for (int e = 0; e < GSTEP * C; e += GEMM_LINE) _mm_prefetch((const char *)(pfp + C * k + e), _MM_HINT_T0);
        GW wv[4];
        for (int c = 0; c < C; c++) wv[c] = GW_LOAD(w + c * K + k);
        for (int r = 0; r < R; r++) {
            GX xv = GX_LOAD(x + r * K + k);
            for (int c = 0; c < C; c++) acc[r][c] = GV_FMA(acc[r][c], xv, wv[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[r * ldy + c] = GV_HSUM(acc[r][c]) * scale[c] + (bias ? bias[c] : 0.f);
}

/* rows [0, R) of x against every output channel [0, N): blocks of C channels, the rest one by one */
static inline __attribute__((always_inline)) void GEMM(rows)(const float *x, int64_t K, const GEMM_WT *w,
                                                          const float *scale, const float *bias, float *y,
                                                          int64_t ldy, int64_t N, const int R, const int C, int pf) {
    int64_t n = 0;
    for (; n + C <= N; n += C)
        GEMM(blk)(x, K, w + n * K, scale + n, bias ? bias + n : NULL, y + n, ldy, R, C, pf);
    for (; n < N; n++)
        GEMM(blk)(x, K, w + n * K, scale + n, bias ? bias + n : NULL, y + n, ldy, R, 1, pf);
}

/* K must be a multiple of GSTEP (checked by the dispatcher, gemm.c). Output channels [0, N) of
   w/scale/bias (already offset to the chunk), y rows ldy apart. Rows in blocks of four against
   three channels (12 accumulators + 3 weight vectors + 1 row vector: the 16 ymm registers; 7
   loads per 12 FMAs), the last 1-3 rows against four channels. SmolLM2's projections x 30
   layers, 2 threads, ms, fp32 / int8 (old 4x2 blocks + single-row tail -> these; interleaved,
   noisy box): 7 rows 45 / 48 -> 19-24 / 17-20; 16 rows 75 / 41 -> 38-43 / 27-29; 64 rows 290 /
   194 -> 142-156 / 115-122 (6x2 and 3x4 main blocks measured slower). */
static void GEMM(gemm_part)(const float *x, int64_t M, int64_t K, const GEMM_WT *w, const float *scale,
                         const float *bias, float *y, int64_t ldy, int64_t N) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) GEMM(rows)(x + m * K, K, w, scale, bias, y + m * ldy, ldy, N, 4, 3, m == 0);
    const float *xr = x + m * K;
    float *yr = y + m * ldy;
    int pf = m == 0;
    switch (M - m) {
    case 3: GEMM(rows)(xr, K, w, scale, bias, yr, ldy, N, 3, 4, pf); break;
    case 2: GEMM(rows)(xr, K, w, scale, bias, yr, ldy, N, 2, 4, pf); break;
    case 1: GEMM(rows)(xr, K, w, scale, bias, yr, ldy, N, 1, 4, 1); break;
    default: break;
    }
}

/* The output channels split into chunks of 16+ (multiples of 4) shared out by the pool: every
   output is computed by one thread with exactly the FMA sequence one thread would use, so
   results do not depend on the thread count (nor on the batch). */
typedef struct { const float *x; int64_t M, K; const GEMM_WT *w; const float *scale, *bias; float *y;
                 int64_t N, chunk; } GEMM(job);

static void GEMM(chunk)(void *a, int64_t c, int tid) {
    (void)tid;
    const GEMM(job) *j = a;
    int64_t n0 = c * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
    GEMM(gemm_part)(j->x, j->M, j->K, j->w + n0 * j->K, j->scale + n0, j->bias ? j->bias + n0 : NULL, j->y + n0, j->N,
                 n1 - n0);
}

static void GEMM(gemm)(const float *x, int64_t M, int64_t K, const GEMM_WT *w, const float *scale,
                    const float *bias, float *y, int64_t N, int64_t nt) {
    int64_t chunk = (N / (nt * 8) + 3) & ~(int64_t)3;
    if (M >= 8) {  /* a chunk's weights stay in L2 while every row block passes over them */
        int64_t cap = 96 * 1024 / (K * (int64_t)sizeof(*w)) / 12 * 12;
        if (chunk > cap) chunk = cap;
    }
    if (chunk < 16) chunk = 16;
    GEMM(job) j = {x, M, K, w, scale, bias, y, N, chunk};
    parallel_chunks(GEMM(chunk), &j, (N + chunk - 1) / chunk, nt);
}
