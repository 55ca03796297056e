/* w8a8_gemm: int8 weights (per-output-channel scales) times activations quantised per row on
   the fly (symmetric, round-to-nearest, max-abs / 127), int32 dot products, fp32 out. Where the
   variant is built with AVX512-VNNI the dot products are vpdpbusd (u8 x s8 -> s32, 64 pairs an
   instruction): the activations travel as u8 = q + 128, and each output subtracts 128 x its
   weights' sum, accumulated beside the products with a second vpdpbusd on a vector of ones. Every
   other variant (and K % 64 != 0) computes the same quantised products in fp32 on the weight-only
   int8 GEMM (exact products; sums rounded as fp32), so the opt-in path runs everywhere. Lossy in
   the activations on top of int8's weights; rows never mix (each row has its own scale). */
#include <stdlib.h>

#include "zg_simd.h"

/* row m of x [M, K] quantised: q[k] = round(x[k] / s) in [-127, 127], s = max|x| / 127 (1 for a zero row) */
static float quantise_row(const float *r, int64_t K, float *q) {
    float amax = 0.f;
    for (int64_t k = 0; k < K; k++) amax = fabsf(r[k]) > amax ? fabsf(r[k]) : amax;
    float s = amax > 0.f ? amax / 127.f : 1.f, inv = 1.f / s;
    for (int64_t k = 0; k < K; k++) {
        float v = nearbyintf(r[k] * inv);
        q[k] = v > 127.f ? 127.f : v < -127.f ? -127.f : v;
    }
    return s;
}

/* every row quantised as fp32 integers into xf [M, K], scales into sx */
static void quantise_rows_f32(const float *x, int64_t M, int64_t K, float *xf, float *sx) {
    for (int64_t m = 0; m < M; m++) sx[m] = quantise_row(x + m * K, K, xf + m * K);
}

#ifdef __AVX512VNNI__
/* every row quantised into q [M, K] as u8 = q + 128 (a K-float scratch row), scales into sx */
static int quantise_rows_u8(const float *x, int64_t M, int64_t K, uint8_t *q, float *sx) {
    float *row = malloc(sizeof(float) * (size_t)K);
    if (!row) return 0;
    for (int64_t m = 0; m < M; m++) {
        sx[m] = quantise_row(x + m * K, K, row);
        for (int64_t k = 0; k < K; k++) q[m * K + k] = (uint8_t)(int)(row[k] + 128.f);
    }
    free(row);
    return 1;
}

typedef struct { const uint8_t *q; const float *sx; int64_t M, K; const int8_t *w; const float *scale, *bias; float *y;
                 int64_t N, chunk; } vnni_job;

/* [sum(a), sum(b), sum(c), sum(d)] of four int32 vectors */
static inline __m128i reduce4(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m256i a2 = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m256i b2 = _mm256_add_epi32(_mm512_castsi512_si256(b), _mm512_extracti64x4_epi64(b, 1));
    __m256i c2 = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
    __m256i d2 = _mm256_add_epi32(_mm512_castsi512_si256(d), _mm512_extracti64x4_epi64(d, 1));
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a2, b2), _mm256_hadd_epi32(c2, d2));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* R rows x C (4 or 1) channels from n: 4R accumulators; comp[c] = 128 x the channel's weight sum
   (precomputed per chunk); with pf, the weights two blocks ahead are prefetched (the first row
   block streams them from DRAM) */
static inline __attribute__((always_inline)) void vnni_blk(const vnni_job *j, const int32_t *comp, int64_t m,
                                                           int64_t n, const int R, const int C, int pf) {
    int64_t K = j->K;
    __m512i acc[4][4];
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) acc[r][c] = _mm512_setzero_si512();
    const int8_t *w0 = j->w + n * K;
    for (int64_t k = 0; k < K; k += 64) {
        __m512i wv[4];
        for (int c = 0; c < C; c++) {
            if (pf) _mm_prefetch((const char *)(w0 + (2 * C + c) * K + k), _MM_HINT_T0);
            wv[c] = _mm512_loadu_si512((const void *)(w0 + c * K + k));
        }
        for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_loadu_si512((const void *)(j->q + (m + r) * K + k));
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv[c]);
        }
    }
    for (int r = 0; r < R; r++) {
        int32_t dots[4];
        if (C == 4) _mm_storeu_si128((__m128i *)dots, reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        else dots[0] = _mm512_reduce_add_epi32(acc[r][0]);
        for (int c = 0; c < C; c++)
            j->y[(m + r) * j->N + n + c] = (float)(dots[c] - comp[c]) * (j->sx[m + r] * j->scale[n + c]) +
                                           (j->bias ? j->bias[n + c] : 0.f);
    }
}

/* 128 x each channel's weight sum, for channels [n0, n1) */
static void weight_sums(const vnni_job *j, int64_t n0, int64_t n1, int32_t *comp) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t n = n0; n < n1; n++) {
        __m512i s = _mm512_setzero_si512();
        for (int64_t k = 0; k < j->K; k += 64)
            s = _mm512_dpbusd_epi32(s, ones, _mm512_loadu_si512((const void *)(j->w + n * j->K + k)));
        comp[n - n0] = 128 * _mm512_reduce_add_epi32(s);
    }
}

static void vnni_chunk(void *a, int64_t c, int tid) {
    (void)tid;
    const vnni_job *j = a;
    int64_t n0 = c * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
    int32_t stack_comp[512], *comp = n1 - n0 <= 512 ? stack_comp : malloc(sizeof(int32_t) * (size_t)(n1 - n0));
    if (!comp) {
        for (int64_t m = 0; m < j->M; m++)
            for (int64_t n = n0; n < n1; n++) j->y[m * j->N + n] = NAN;
        return;
    }
    weight_sums(j, n0, n1, comp);
    for (int64_t m = 0; m < j->M; m += 4) {
        int64_t n = n0;
        int pf = m == 0;
        switch (j->M - m >= 4 ? 4 : j->M - m) {
#define ROWS(R)                                                                                     \
        for (; n + 4 <= n1; n += 4) vnni_blk(j, comp + (n - n0), m, n, R, 4, pf);                    \
        for (; n < n1; n++) vnni_blk(j, comp + (n - n0), m, n, R, 1, pf);                             \
        break;
        case 4: ROWS(4)
        case 3: ROWS(3)
        case 2: ROWS(2)
        default: ROWS(1)
#undef ROWS
        }
    }
    if (comp != stack_comp) free(comp);
}
#endif

void w8a8_gemm(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale, const float *bias,
               float *y, int64_t N, int64_t nt) {
    float *sx = malloc(sizeof(float) * (size_t)(M > 0 ? M : 1));
    if (!sx) { for (int64_t i = 0; i < M * N; i++) y[i] = NAN; return; }  /* non-finite: the caller's check names it */
#ifdef __AVX512VNNI__
    if (K % 64 == 0) {
        uint8_t *q = malloc((size_t)(M * K > 0 ? M * K : 1));
        if (!q || !quantise_rows_u8(x, M, K, q, sx)) {
            free(q);
            free(sx);
            for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
            return;
        }
        int64_t chunk = (N / (nt * 8) + 3) & ~(int64_t)3;
        if (chunk < 16) chunk = 16;
        vnni_job j = {q, sx, M, K, w, scale, bias, y, N, chunk};
        parallel_chunks(vnni_chunk, &j, (N + chunk - 1) / chunk, nt);
        free(q);
        free(sx);
        return;
    }
#endif
    /* the same quantised activations, fp32 products on the weight-only GEMM, then per-row scales */
    float *xf = calloc((size_t)(M * K > 0 ? M * K : 1), sizeof(float));
    if (!xf) { free(sx); for (int64_t i = 0; i < M * N; i++) y[i] = NAN; return; }
    quantise_rows_f32(x, M, K, xf, sx);
    w8_gemm(xf, M, K, w, scale, NULL, y, N, nt);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) y[m * N + n] = y[m * N + n] * sx[m] + (bias ? bias[n] : 0.f);
    free(xf);
    free(sx);
}

int64_t w8a8_vnni(int64_t K) {
#ifdef __AVX512VNNI__
    return K % 64 == 0;
#else
    (void)K;
    return 0;
#endif
}
