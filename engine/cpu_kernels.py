"""Small AVX2 C kernels for the CPU engine, compiled once with the system C compiler into the
user cache (~/.cache/zgtool/kernels/, keyed by a hash of source and flags; ~1 s with gcc) and
called through ctypes on tensors' data pointers. No torch headers, so no torch C++ extension
build (minutes on this box). Unavailable (KernelsUnavailable) without a C compiler, AVX2+FMA or
a writable cache, or with ZGTOOL_NO_KERNELS set: fp32 then runs on torch ops alone (the
previous engine) and --dtype int8 fails at load with the reason.

w8_gemm: y[m, n] = scale[n] * sum_k x[m, k] * w[n, k] (+ bias[n]) with w int8 [N, K] (symmetric
per-output-channel quantization), x/y fp32: weight-only int8, activations never quantized, so
rows never influence each other (each output is the same FMA sequence whatever the batch).
Four rows x two output channels per register block; int8 -> fp32 converted in registers.

paged_decode_attention: one query per sequence attends to its KV read in place through its
block table (no gather into padded buffers, no mask): scores, exact softmax (max-subtracted,
expf), weighted sum of V; one (sequence, head) at a time, so batch-invariant.

add_rms_norm: the residual add and the next RMSNorm in one pass over a row (F.rms_norm on CPU
is a composite of 5-6 ops: ~60-150 us per call at 1-16 rows of 576, ~4 ms of a SmolLM2 token).

silu_mul and rope_kv_write: the glue between the GEMMs of a layer (silu(gate) * up; RoPE on q
and k plus the KV write into the paged pool) as one pass each instead of ~10 torch ops per layer
(SmolLM2 int8 step: -15% at batch 1, -26% at batch 16).

Threads: the GEMMs (split by output channel) and the attention (split by sequence x KV head)
use torch.get_num_threads() threads through a small claim-based pool (parallel_chunks): the
caller posts a job and works through its chunks itself while workers claim the rest, and it
waits only for chunks a worker actually claimed. OpenMP's barrier waits for every thread of the
team instead: with one core taken by another process, a 2-thread SmolLM2 step went from 78 ms
to 600+ ms (torch's own MKL GEMMs show the same: 68 -> 14 GFLOP/s at 2 threads with a
single-core neighbour). Which thread computes an output never changes its arithmetic, so results
are bit-identical for any thread count.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <x86intrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#define W8_LINE 64   /* int8 weights per 64-byte cache line */
#define F32_LINE 16  /* fp32 weights per line */

/* A work-sharing pool that never waits for a thread the OS has not scheduled. The caller posts
   a job of `nchunks` chunks, then claims chunks itself; workers that wake in time claim the
   rest. The caller waits only for chunks a worker has CLAIMED, so a worker that is descheduled
   (a 2-core box with a client and an I/O loop beside the engine) costs nothing: the caller does
   its share. OpenMP's team barrier instead waits for every thread of the team, one scheduler
   slice per parallel region when a core is busy (measured: steps 5-20x slower under load).
   state = generation (16 bits) | threads (8) | nchunks (20) | next chunk (20): a claim is one
   CAS that also proves the job is still the one the claimer saw. */
typedef void (*chunk_fn)(void *args, int64_t chunk, int tid);

#define POOL_MAX 63
/* ~240 us at 2.5 GHz spinning for the next job, then a futex sleep: long enough to bridge the
   Python between a step's two calls and between steps, so a worker is awake for the next job
   (dummy:small served at c=1, ITL p50 over 3 alternating pairs: 80 us 7.41/7.56/7.64 ms, this
   7.03/7.43/7.62; 600 us cost TTFT: 13.9-16.3 vs 11.1-11.9 ms, the spinner beside the request's
   own Python on 2 cores) */
#define SPIN_CYCLES 600000ULL

static struct {
    _Atomic uint64_t state;
    _Atomic int32_t gen_word;     /* futex word: the generation of the job posted last */
    _Atomic int64_t done;
    _Atomic int32_t sleepers;
    chunk_fn fn;
    void *args;
    uint32_t gen;
    int nworkers;
    pthread_mutex_t busy;         /* one job at a time; a second caller runs serially */
    pthread_mutex_t grow;
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .grow = PTHREAD_MUTEX_INITIALIZER};

static inline uint64_t pack(uint64_t gen, uint64_t nt, uint64_t n, uint64_t next) {
    return (gen & 0xffff) << 48 | (nt & 0xff) << 40 | (n & 0xfffff) << 20 | (next & 0xfffff);
}

/* claim the next chunk of the job whose state had generation gen; -1 when none is left */
static inline int64_t claim(uint32_t gen, int tid) {
    uint64_t v = atomic_load_explicit(&pool.state, memory_order_acquire);
    for (;;) {
        if ((v >> 48) != (gen & 0xffff) || (int64_t)((v >> 40) & 0xff) <= tid) return -1;
        uint64_t n = (v >> 20) & 0xfffff, next = v & 0xfffff;
        if (next >= n) return -1;
        if (atomic_compare_exchange_weak_explicit(&pool.state, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int64_t)next;
    }
}

static void *pool_worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    int32_t seen = atomic_load_explicit(&pool.gen_word, memory_order_acquire);
    for (;;) {
        int32_t g;
        uint64_t t0 = __rdtsc();
        while ((g = atomic_load_explicit(&pool.gen_word, memory_order_acquire)) == seen) {
            if (__rdtsc() - t0 < SPIN_CYCLES) { _mm_pause(); continue; }
            atomic_fetch_add(&pool.sleepers, 1);
            if (atomic_load(&pool.gen_word) == seen)
                syscall(SYS_futex, &pool.gen_word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_fetch_sub(&pool.sleepers, 1);
            t0 = __rdtsc();
        }
        seen = g;
        int64_t c;
        while ((c = claim((uint32_t)g, tid)) >= 0) {
            pool.fn(pool.args, c, tid);  /* fn/args stay valid: the job cannot end before this chunk is done */
            atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        }
    }
    return NULL;
}

static int pool_grow(int want) {
    pthread_mutex_lock(&pool.grow);
    while (pool.nworkers < want && pool.nworkers < POOL_MAX) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, pool_worker, (void *)(intptr_t)(pool.nworkers + 1));
        pthread_attr_destroy(&at);
        if (rc) break;
        pool.nworkers++;
    }
    int have = pool.nworkers;
    pthread_mutex_unlock(&pool.grow);
    return have;
}

/* fn(args, chunk, tid) for chunk in [0, nchunks), tid in [0, nt): tid 0 is the caller */
static void parallel_chunks(chunk_fn fn, void *args, int64_t nchunks, int64_t nt) {
    if (nt > POOL_MAX + 1) nt = POOL_MAX + 1;
    if (nt > 1 && nchunks > 1 && nchunks < 0xfffff - POOL_MAX && pthread_mutex_trylock(&pool.busy) == 0) {
        int have = pool_grow((int)nt - 1);
        if (have + 1 < nt) nt = have + 1;
        if (nt > 1) {
            pool.fn = fn;
            pool.args = args;
            atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
            uint32_t gen = ++pool.gen;
            atomic_store_explicit(&pool.state, pack(gen, (uint64_t)nt, (uint64_t)nchunks, 0), memory_order_release);
            atomic_store_explicit(&pool.gen_word, (int32_t)gen, memory_order_release);
            if (atomic_load(&pool.sleepers) > 0)
                syscall(SYS_futex, &pool.gen_word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
            int64_t c, mine = 0;
            while ((c = claim(gen, 0)) >= 0) { fn(args, c, 0); mine++; }
            atomic_fetch_add_explicit(&pool.done, mine, memory_order_acq_rel);
            while (atomic_load_explicit(&pool.done, memory_order_acquire) < nchunks) _mm_pause();
            pthread_mutex_unlock(&pool.busy);
            return;
        }
        pthread_mutex_unlock(&pool.busy);
    }
    for (int64_t c = 0; c < nchunks; c++) fn(args, c, 0);
}

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

static inline __m256 load_w8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* R rows x C output channels (both compile-time constants once inlined): one accumulator per
   output, FMAs over k in order, then hsum * scale (+ bias). Every path below computes an output
   with exactly this sequence, so an output never depends on the block (hence the batch, the
   rows around it or the thread) that computed it. x rows K apart (L1-resident), w rows K apart;
   with `pf`, the weights of the block two ahead are prefetched (the first pass over a chunk's
   weights streams them from DRAM; later row blocks find them in L2). */
static inline __attribute__((always_inline)) void w8_blk(const float *x, int64_t K, const int8_t *w,
                                                         const float *scale, const float *bias, float *y,
                                                         int64_t ldy, const int R, const int C, int pf) {
    __m256 acc[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const int8_t *pfp = w + 2 * C * K;
    for (int64_t k = 0; k < K; k += 8) {
        if (pf)
            for (int e = 0; e < 8 * C; e += W8_LINE) _mm_prefetch((const char *)(pfp + C * k + e), _MM_HINT_T0);
        __m256 wv[4];
        for (int c = 0; c < C; c++) wv[c] = load_w8(w + c * K + k);
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * K + k);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[r * ldy + c] = hsum(acc[r][c]) * scale[c] + (bias ? bias[c] : 0.f);
}

/* rows [0, R) of x against every output channel [0, N): blocks of C channels, the rest one by one */
static inline __attribute__((always_inline)) void w8_rows(const float *x, int64_t K, const int8_t *w,
                                                          const float *scale, const float *bias, float *y,
                                                          int64_t ldy, int64_t N, const int R, const int C, int pf) {
    int64_t n = 0;
    for (; n + C <= N; n += C)
        w8_blk(x, K, w + n * K, scale + n, bias ? bias + n : NULL, y + n, ldy, R, C, pf);
    for (; n < N; n++)
        w8_blk(x, K, w + n * K, scale + n, bias ? bias + n : NULL, y + n, ldy, R, 1, pf);
}

/* K must be a multiple of 8 (checked by the caller). Output channels [0, N) of w/scale/bias
   (already offset to the chunk), y rows ldy apart. Rows in blocks of four against three
   channels (12 accumulators + 3 weight vectors + 1 row vector: the 16 ymm registers; 7 loads per
   12 FMAs), the last 1-3 rows against four channels. SmolLM2's projections x 30 layers, 2
   threads, ms, fp32 / int8 (old 4x2 blocks + single-row tail -> these; interleaved, noisy box):
   7 rows 45 / 48 -> 19-24 / 17-20; 16 rows 75 / 41 -> 38-43 / 27-29; 64 rows 290 / 194 ->
   142-156 / 115-122 (6x2 and 3x4 main blocks measured slower). */
static void w8_gemm_part(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale,
                         const float *bias, float *y, int64_t ldy, int64_t N) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) w8_rows(x + m * K, K, w, scale, bias, y + m * ldy, ldy, N, 4, 3, m == 0);
    const float *xr = x + m * K;
    float *yr = y + m * ldy;
    int pf = m == 0;
    switch (M - m) {
    case 3: w8_rows(xr, K, w, scale, bias, yr, ldy, N, 3, 4, pf); break;
    case 2: w8_rows(xr, K, w, scale, bias, yr, ldy, N, 2, 4, pf); break;
    case 1: w8_rows(xr, K, w, scale, bias, yr, ldy, N, 1, 4, 1); break;
    default: break;
    }
}

/* The output channels split into chunks of 16+ (multiples of 4) shared out by the pool: every
   output is computed by one thread with exactly the FMA sequence one thread would use, so
   results do not depend on the thread count (nor on the batch). */
typedef struct { const float *x; int64_t M, K; const int8_t *w; const float *scale, *bias; float *y;
                 int64_t N, chunk; } w8_job;

static void w8_chunk(void *a, int64_t c, int tid) {
    (void)tid;
    const w8_job *j = a;
    int64_t n0 = c * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
    w8_gemm_part(j->x, j->M, j->K, j->w + n0 * j->K, j->scale + n0, j->bias ? j->bias + n0 : NULL, j->y + n0, j->N,
                 n1 - n0);
}

void w8_gemm(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale,
             const float *bias, float *y, int64_t N, int64_t nt) {
    int64_t chunk = (N / (nt * 8) + 3) & ~(int64_t)3;
    if (M >= 8) {  /* a chunk's weights stay in L2 while every row block passes over them */
        int64_t cap = 96 * 1024 / (K * (int64_t)sizeof(*w)) / 12 * 12;
        if (chunk > cap) chunk = cap;
    }
    if (chunk < 16) chunk = 16;
    w8_job j = {x, M, K, w, scale, bias, y, N, chunk};
    parallel_chunks(w8_chunk, &j, (N + chunk - 1) / chunk, nt);
}

static inline float dot(const float *a, const float *b, int64_t D) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc2);
    }
    for (; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    return hsum(_mm256_add_ps(acc, acc2));
}

/* [sum(a0), ..., sum(a7)] in one register */
static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                           __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* e^x for x <= 0 (Cephes' expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp) */
static inline __m256 exp_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* One (sequence, KV head) pair: the `group` query heads sharing that KV head. Scores of 8
   consecutive positions of a block come out of one register (hsum8); the softmax is exact
   (max-subtracted) with a vectorised exp. */
static void attend_pair(const float *q0, const float *kc, const float *vc, const int64_t *tab, int64_t len,
                        int64_t KVH, int64_t kvh, int64_t group, int64_t D, int64_t bs, float scale,
                        float *out0, float *scratch) {
    int64_t nblk = (len + bs - 1) / bs, rs = KVH * D;
    __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t j = 0; j < nblk; j++) {
        int64_t n = len - j * bs < bs ? len - j * bs : bs;
        const float *kb = kc + (tab[j] * bs * KVH + kvh) * D;
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q0 + g * D;
            float *sc = scratch + g * len + j * bs;
            int64_t o = 0;
            for (; o + 8 <= n; o += 8) {
                const float *k0 = kb + o * rs;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
                for (int64_t d = 0; d < D; d += 8) {
                    __m256 qv = _mm256_loadu_ps(qg + d);
                    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
                    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + rs + d), a1);
                    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * rs + d), a2);
                    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * rs + d), a3);
                    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 4 * rs + d), a4);
                    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 5 * rs + d), a5);
                    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 6 * rs + d), a6);
                    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 7 * rs + d), a7);
                }
                _mm256_storeu_ps(sc + o, _mm256_mul_ps(hsum8(a0, a1, a2, a3, a4, a5, a6, a7), vscale));
            }
            for (; o < n; o++) sc[o] = dot(qg, kb + o * rs, D) * scale;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *sc = scratch + g * len;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        int64_t p = 0;
        for (; p + 8 <= len; p += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sc + p));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float m = _mm_cvtss_f32(m4);
        for (; p < len; p++) m = sc[p] > m ? sc[p] : m;
        __m256 mm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
        for (p = 0; p + 8 <= len; p += 8) {
            __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(sc + p), mm));
            _mm256_storeu_ps(sc + p, e);
            vs = _mm256_add_ps(vs, e);
        }
        float sum = hsum(vs);
        for (; p < len; p++) { float e = expf(sc[p] - m); sc[p] = e; sum += e; }
        float *o = out0 + g * D;
        float inv = 1.f / sum;
        if (D == 64) {  /* the common head size: eight accumulators stay in registers */
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int64_t j = 0; j < nblk; j++) {
                int64_t n = len - j * bs < bs ? len - j * bs : bs;
                const float *vb = vc + (tab[j] * bs * KVH + kvh) * D;
                const float *w = sc + j * bs;
                for (int64_t t = 0; t < n; t++) {
                    const float *vp = vb + t * rs;
                    __m256 x = _mm256_set1_ps(w[t]);
                    a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp), a0);
                    a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 8), a1);
                    a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 16), a2);
                    a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 24), a3);
                    a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 32), a4);
                    a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 40), a5);
                    a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 48), a6);
                    a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(vp + 56), a7);
                }
            }
            __m256 iv = _mm256_set1_ps(inv);
            _mm256_storeu_ps(o, _mm256_mul_ps(a0, iv)); _mm256_storeu_ps(o + 8, _mm256_mul_ps(a1, iv));
            _mm256_storeu_ps(o + 16, _mm256_mul_ps(a2, iv)); _mm256_storeu_ps(o + 24, _mm256_mul_ps(a3, iv));
            _mm256_storeu_ps(o + 32, _mm256_mul_ps(a4, iv)); _mm256_storeu_ps(o + 40, _mm256_mul_ps(a5, iv));
            _mm256_storeu_ps(o + 48, _mm256_mul_ps(a6, iv)); _mm256_storeu_ps(o + 56, _mm256_mul_ps(a7, iv));
            continue;
        }
        for (int64_t d = 0; d < D; d += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t j = 0; j < nblk; j++) {
                int64_t n = len - j * bs < bs ? len - j * bs : bs;
                const float *vb = vc + (tab[j] * bs * KVH + kvh) * D + d;
                for (int64_t t = 0; t < n; t++)
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(sc[j * bs + t]), _mm256_loadu_ps(vb + t * rs), acc);
            }
            _mm256_storeu_ps(o + d, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
        }
    }
}

/* One query token per sequence over its paged KV, read in place (no gather, no padding).
   q/out [B, H, D]; kc/vc [slots, KVH, D]; tables [B, width] block ids; lens [B] context
   lengths; scratch >= nt * H / KVH * width * bs floats (one slice per thread). D must be a
   multiple of 8 (checked by the caller). The (sequence, KV head) pairs are shared out among nt
   threads; each pair's result is the same whichever thread computes it and whatever else is in
   the batch: batch-invariant. */
typedef struct { const float *q, *kc, *vc; const int64_t *tables, *lens; int64_t width, H, KVH, D, bs;
                 float scale; float *out, *scratch; } attn_job;

static void attn_chunk(void *a, int64_t i, int tid) {
    const attn_job *j = a;
    int64_t group = j->H / j->KVH, b = i / j->KVH, kvh = i % j->KVH;
    attend_pair(j->q + (b * j->H + kvh * group) * j->D, j->kc, j->vc, j->tables + b * j->width, j->lens[b], j->KVH,
                kvh, group, j->D, j->bs, j->scale, j->out + (b * j->H + kvh * group) * j->D,
                j->scratch + tid * group * j->width * j->bs);
}

void paged_decode_attention(const float *q, const float *kc, const float *vc, const int64_t *tables,
                            int64_t width, const int64_t *lens, int64_t B, int64_t H, int64_t KVH,
                            int64_t D, int64_t bs, float scale, float *out, float *scratch, int64_t nt) {
    attn_job j = {q, kc, vc, tables, lens, width, H, KVH, D, bs, scale, out, scratch};
    parallel_chunks(attn_chunk, &j, B * KVH, nt);
}

/* x [rows, n] += delta (if not NULL), then out = w * x / sqrt(mean(x^2) + eps), row by row.
   n must be a multiple of 8. */
void add_rms_norm(float *x, const float *delta, const float *w, float eps, int64_t rows, int64_t n, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * n;
        float *orow = out + r * n;
        __m256 ss = _mm256_setzero_ps(), ss2 = _mm256_setzero_ps();
        int64_t d = 0;
        for (; d + 16 <= n; d += 16) {
            __m256 v = _mm256_loadu_ps(xr + d), v2 = _mm256_loadu_ps(xr + d + 8);
            if (delta) {
                v = _mm256_add_ps(v, _mm256_loadu_ps(delta + r * n + d));
                v2 = _mm256_add_ps(v2, _mm256_loadu_ps(delta + r * n + d + 8));
                _mm256_storeu_ps(xr + d, v); _mm256_storeu_ps(xr + d + 8, v2);
            }
            ss = _mm256_fmadd_ps(v, v, ss); ss2 = _mm256_fmadd_ps(v2, v2, ss2);
        }
        for (; d < n; d += 8) {
            __m256 v = _mm256_loadu_ps(xr + d);
            if (delta) { v = _mm256_add_ps(v, _mm256_loadu_ps(delta + r * n + d)); _mm256_storeu_ps(xr + d, v); }
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        float inv = 1.f / sqrtf(hsum(_mm256_add_ps(ss, ss2)) / (float)n + eps);
        __m256 iv = _mm256_set1_ps(inv);
        for (d = 0; d < n; d += 8)
            _mm256_storeu_ps(orow + d, _mm256_mul_ps(_mm256_loadu_ps(w + d), _mm256_mul_ps(_mm256_loadu_ps(xr + d), iv)));
    }
}

/* e^x over the whole float range (inputs clamped to +-87.3: 0 and inf stay 0 and huge) */
static inline __m256 exp_any(__m256 x) {
    return exp_neg(_mm256_min_ps(x, _mm256_set1_ps(87.3f)));
}

/* gu [rows, 2I] (gate | up, one fused projection) -> out [rows, I] = silu(gate) * up,
   silu(g) = g / (1 + e^-g). I must be a multiple of 8. */
void silu_mul(const float *gu, int64_t rows, int64_t I, float *out) {
    __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        for (int64_t i = 0; i < I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 sig = _mm256_div_ps(gv, _mm256_add_ps(one, exp_any(_mm256_sub_ps(zero, gv))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
        }
    }
}

/* One pass over a step's fused q|k|v rows [T, (H + 2 KVH) * D]: RoPE on q (into q_out [T, H, D])
   and on k, k and v written to their slots of the paged caches [slots, KVH, D].
   rotated = x * cos + flip_halves(x) * sin_signed (the tables [P, D] of LlamaModel). */
void rope_kv_write(const float *qkv, int64_t T, int64_t H, int64_t KVH, int64_t D, const float *cos_t,
                   const float *sin_t, const int64_t *positions, const int64_t *slots, float *kc, float *vc,
                   float *q_out) {
    int64_t half = D / 2, row = (H + 2 * KVH) * D;
    for (int64_t t = 0; t < T; t++) {
        const float *x = qkv + t * row, *c = cos_t + positions[t] * D, *sn = sin_t + positions[t] * D;
        for (int64_t h = 0; h < H + KVH; h++) {
            const float *xh = x + h * D;
            float *o = h < H ? q_out + (t * H + h) * D : kc + (slots[t] * KVH + (h - H)) * D;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                __m256 lo = _mm256_loadu_ps(xh + i), hi = _mm256_loadu_ps(xh + half + i);
                _mm256_storeu_ps(o + i, _mm256_fmadd_ps(hi, _mm256_loadu_ps(sn + i),
                                                        _mm256_mul_ps(lo, _mm256_loadu_ps(c + i))));
                _mm256_storeu_ps(o + half + i, _mm256_fmadd_ps(lo, _mm256_loadu_ps(sn + half + i),
                                                               _mm256_mul_ps(hi, _mm256_loadu_ps(c + half + i))));
            }
            for (; i < half; i++) {
                o[i] = xh[half + i] * sn[i] + xh[i] * c[i];
                o[half + i] = xh[i] * sn[half + i] + xh[half + i] * c[half + i];
            }
        }
        const float *v = x + (H + KVH) * D;
        float *vo = vc + slots[t] * KVH * D;
        for (int64_t i = 0; i < KVH * D; i++) vo[i] = v[i];
    }
}

/* out [N, K] = w [N, K] * scale[n] (K a multiple of 8): int8 weights back to fp32 for MKL */
void w8_dequant(const int8_t *w, const float *scale, int64_t N, int64_t K, float *out) {
    for (int64_t n = 0; n < N; n++) {
        __m256 sc = _mm256_set1_ps(scale[n]);
        for (int64_t k = 0; k < K; k += 8)
            _mm256_storeu_ps(out + n * K + k, _mm256_mul_ps(load_w8(w + n * K + k), sc));
    }
}
"""



def _f32_variant(source: str) -> str:
    """f32_gemm: w8_gemm's blocking and prefetching over fp32 weights [N, K] (the fp32 lm_head:
    MKL's GEMM ran SmolLM2's 49152 x 576 at 16 rows in 34-52 ms, about a third of its peak)."""
    start = source.index("/* R rows x C output channels")
    wrapper = source.index("void w8_gemm(", start)  # the part, then its threaded wrapper
    body = source[start:source.index("\n}\n", wrapper) + 3]
    for a, b in (("w8_gemm_part(", "f32_gemm_part("), ("void w8_gemm(", "void f32_gemm("), ("w8_job", "f32_job"),
                 ("w8_chunk", "f32_chunk"), ("w8_blk(", "f32_blk("), ("w8_rows(", "f32_rows("),
                 ("W8_LINE", "F32_LINE")):
        body = body.replace(a, b)
    body = body.replace("const int8_t", "const float")
    body = body.replace("load_w8(", "_mm256_loadu_ps(")
    return source + body


LAYERS_SOURCE = r"""
/* A whole step's decoder layers in one call (one ctypes crossing instead of ~9 per layer: at
   batch 1 the Python/ctypes overhead around the kernels was ~3-4 ms of a 14 ms int8 SmolLM2
   token). Every row is one query: a decode, or one position of a prompt chunk, attending over
   its own sequence's paged KV up to its own position (tables/lens per row; all rows' K and V are
   written before any row attends, so a chunk's rows see each other causally). Exactly the
   kernels and order of LlamaModel._forward_fused_norms, so the result is bit-identical to it. */
typedef struct {
    const float *input_norm, *post_norm;
    const void *qkv; const float *qkv_scale, *qkv_bias;
    const void *o; const float *o_scale;
    const void *gate_up; const float *gate_up_scale;
    const void *down; const float *down_scale;
    float *kc, *vc;
} layer_ptrs;

static void gemm_any(int int8, const float *x, int64_t M, int64_t K, const void *w, const float *scale,
                     const float *bias, float *y, int64_t N, int64_t nt) {
    if (int8) w8_gemm(x, M, K, (const int8_t *)w, scale, bias, y, N, nt);
    else f32_gemm(x, M, K, (const float *)w, scale, bias, y, N, nt);
}

void step_layers(const layer_ptrs *L, int64_t nl, int64_t int8, float *x, int64_t M, int64_t hidden,
                   int64_t H, int64_t KVH, int64_t D, int64_t inter, float eps, const float *final_norm,
                   float *out, const float *cos_t, const float *sin_t, const int64_t *positions,
                   const int64_t *slots, const int64_t *tables, int64_t width, const int64_t *lens, int64_t bs,
                   float scale, float *h, float *qkv, float *q, float *att, float *gu, float *act, float *delta,
                   float *attn_scratch, int64_t nt) {
    int64_t nqkv = (H + 2 * KVH) * D;
    for (int64_t l = 0; l < nl; l++) {
        const layer_ptrs *p = L + l;
        add_rms_norm(x, l ? delta : NULL, p->input_norm, eps, M, hidden, h);
        gemm_any((int)int8, h, M, hidden, p->qkv, p->qkv_scale, p->qkv_bias, qkv, nqkv, nt);
        rope_kv_write(qkv, M, H, KVH, D, cos_t, sin_t, positions, slots, p->kc, p->vc, q);
        paged_decode_attention(q, p->kc, p->vc, tables, width, lens, M, H, KVH, D, bs, scale, att, attn_scratch, nt);
        gemm_any((int)int8, att, M, H * D, p->o, p->o_scale, NULL, delta, hidden, nt);
        add_rms_norm(x, delta, p->post_norm, eps, M, hidden, h);
        gemm_any((int)int8, h, M, hidden, p->gate_up, p->gate_up_scale, NULL, gu, 2 * inter, nt);
        silu_mul(gu, M, inter, act);
        gemm_any((int)int8, act, M, inter, p->down, p->down_scale, NULL, delta, hidden, nt);
    }
    add_rms_norm(x, nl ? delta : NULL, final_norm, eps, M, hidden, out);
}

/* Greedy sampling's tail: logits [M, V] = h [M, hidden] times the lm_head [V, hidden] (fp32 or
   int8, the same GEMM as the logits path), then each row's argmax into tokens[m]: the first
   maximum, or the first NaN (torch.argmax's rule). */
void lm_head_argmax(const float *h, int64_t M, int64_t hidden, const void *w, const float *scale, int64_t int8,
                    float *logits, int64_t V, int64_t *tokens, int64_t nt) {
    gemm_any((int)int8, h, M, hidden, w, scale, NULL, logits, V, nt);
    for (int64_t m = 0; m < M; m++) {
        const float *row = logits + m * V;
        int64_t best = 0;
        float bv = row[0];
        if (bv == bv)
            for (int64_t v = 1; v < V; v++) {
                float x = row[v];
                if (x != x) { best = v; break; }
                if (x > bv) { bv = x; best = v; }
            }
        tokens[m] = best;
    }
}
"""

SOURCE = _f32_variant(SOURCE) + LAYERS_SOURCE


class LayerPtrs(ctypes.Structure):
    """One decoder layer's weights and KV cache for step_layers (pointers into live tensors:
    the owner keeps the tensors alive and rebuilds this when the KV pool moves)."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "input_norm", "post_norm", "qkv", "qkv_scale", "qkv_bias", "o", "o_scale", "gate_up", "gate_up_scale",
        "down", "down_scale", "kc", "vc")]

# -ffp-contract=off: gcc would otherwise fuse an output's epilogue (sum * scale + bias) into an FMA
# in some inlined copies of the GEMM block and not in others, and a row's result would then
# depend on the register block it landed in (every FMA that matters is an explicit intrinsic)
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-pthread", "-shared", "-fPIC", "-fno-math-errno", "-lm")


class KernelsUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zgtool" / "kernels"


def cpu_has_avx2_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"avx2", "fma"} <= flags
    except OSError:
        pass
    return False


def library() -> ctypes.CDLL:
    """The compiled kernels (built on first use; concurrent builders each write a temp file and
    rename it into place, so a reader never sees half a library). ZGTOOL_NO_KERNELS is read on
    every call, so a model built after it is set runs on torch even when the library is loaded."""
    if os.environ.get("ZGTOOL_NO_KERNELS"):
        raise KernelsUnavailable("disabled by ZGTOOL_NO_KERNELS")
    return _built_library()


@functools.cache
def _built_library() -> ctypes.CDLL:
    if not cpu_has_avx2_fma():
        raise KernelsUnavailable("this CPU lacks AVX2/FMA (needed by the int8 kernels)")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise KernelsUnavailable("no C compiler (gcc/cc) found to build the int8 kernels")
    key = hashlib.sha256((SOURCE + " ".join(FLAGS)).encode()).hexdigest()[:16]
    out = cache_dir() / f"zg_kernels-{key}.so"
    try:
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                src = Path(tmp) / "k.c"
                src.write_text(SOURCE)
                so = Path(tmp) / "k.so"
                res = subprocess.run([cc, *FLAGS, str(src), "-o", str(so)], capture_output=True, text=True,
                                     timeout=120)
                if res.returncode != 0:
                    raise KernelsUnavailable(f"building the CPU kernels with {cc} failed: {res.stderr[-2000:]}")
                os.replace(so, out)
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelsUnavailable(f"cannot build or load the CPU kernels in {out.parent}: {exc}") from exc
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.w8_gemm.argtypes = [p, i64, i64, p, p, p, p, i64, i64]
    lib.w8_gemm.restype = None
    lib.paged_decode_attention.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, i64, ctypes.c_float, p, p, i64]
    lib.paged_decode_attention.restype = None
    lib.add_rms_norm.argtypes = [p, p, p, ctypes.c_float, i64, i64, p]
    lib.add_rms_norm.restype = None
    lib.w8_dequant.argtypes = [p, p, i64, i64, p]
    lib.w8_dequant.restype = None
    lib.f32_gemm.argtypes = [p, i64, i64, p, p, p, p, i64, i64]
    lib.f32_gemm.restype = None
    lib.step_layers.argtypes = [p, i64, i64, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, p, p, p, p, p, p, p,
                                  i64, p, i64, ctypes.c_float, p, p, p, p, p, p, p, p, i64]
    lib.step_layers.restype = None
    lib.lm_head_argmax.argtypes = [p, i64, i64, p, p, i64, p, i64, p, i64]
    lib.lm_head_argmax.restype = None
    lib.silu_mul.argtypes = [p, i64, i64, p]
    lib.silu_mul.restype = None
    lib.rope_kv_write.argtypes = [p, i64, i64, i64, i64, p, p, p, p, p, p, p]
    lib.rope_kv_write.restype = None
    return lib


def w8_gemm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 times int8 w [N, K] with fp32 scale [N] (+ bias [N]) -> [M, N] fp32."""
    m, k = x.shape
    n = w.shape[0]
    if k % 8 or w.shape[1] != k or w.dtype != torch.int8 or x.dtype != torch.float32:
        raise ValueError(f"w8_gemm: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype} (K % 8 == 0 needed)")
    x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    library().w8_gemm(x.data_ptr(), m, k, w.data_ptr(), scale.data_ptr(),
                      None if bias is None else bias.data_ptr(), y.data_ptr(), n, torch.get_num_threads())
    return y


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                           lens: torch.Tensor, block_size: int, scale: float,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, D] (one query per sequence), caches [slots, KVH, D] fp32, tables [B, width] int64
    block ids (padding never read past lens), lens [B] int64 -> [B, H, D] fp32."""
    b, h, d = q.shape
    kvh = k_cache.shape[1]
    if d % 8 or h % kvh or q.dtype != torch.float32 or k_cache.dtype != torch.float32:
        raise ValueError(f"paged_decode_attention: q {tuple(q.shape)} {q.dtype}, cache {tuple(k_cache.shape)}")
    q = q.contiguous()
    tables = tables.contiguous()
    if out is None:
        out = torch.empty(b, h, d, dtype=torch.float32)
    nt = torch.get_num_threads()
    scratch = torch.empty(max(1, nt * h // kvh * int(tables.shape[1]) * block_size), dtype=torch.float32)
    library().paged_decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                     tables.shape[1], lens.data_ptr(), b, h, kvh, d, block_size, scale,
                                     out.data_ptr(), scratch.data_ptr(), nt)
    return out


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, n] fp32 contiguous: x += delta in place (if given), then returns rms_norm(x) * w
    as a new tensor. n must be a multiple of 8."""
    rows, n = x.shape
    if n % 8 or not x.is_contiguous() or x.dtype != torch.float32:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} {x.dtype} (contiguous fp32, n % 8 == 0 needed)")
    if delta is not None:
        delta = delta.contiguous()
    out = torch.empty_like(x)
    library().add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(), w.data_ptr(), eps, rows, n,
                           out.data_ptr())
    return out


def w8_dequant(w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [N, K] fp32 contiguous <- w int8 [N, K] * scale[:, None]."""
    n, k = w.shape
    if k % 8 or out.shape != w.shape or not out.is_contiguous() or out.dtype != torch.float32:
        raise ValueError(f"w8_dequant: w {tuple(w.shape)}, out {tuple(out.shape)} {out.dtype}")
    library().w8_dequant(w.data_ptr(), scale.data_ptr(), n, k, out.data_ptr())
    return out


def f32_gemm(x: torch.Tensor, w: torch.Tensor, ones: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] times fp32 w [N, K] (+ bias [N]; rows never mix) -> [M, N]; `ones` is a tensor of
    at least N 1.0s (the kernel's per-channel scale)."""
    m, k = x.shape
    n = w.shape[0]
    if k % 8 or w.shape[1] != k or w.dtype != torch.float32 or x.dtype != torch.float32 or not w.is_contiguous():
        raise ValueError(f"f32_gemm: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}")
    x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    if ones.numel() < n or (bias is not None and (bias.numel() != n or bias.dtype != torch.float32)):
        raise ValueError(f"f32_gemm: {ones.numel()} scales / bias {None if bias is None else tuple(bias.shape)} for N={n}")
    library().f32_gemm(x.data_ptr(), m, k, w.data_ptr(), ones.data_ptr(), None if bias is None else bias.data_ptr(),
                       y.data_ptr(), n, torch.get_num_threads())
    return y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2I] fp32 contiguous (gate | up) -> silu(gate) * up [rows, I]."""
    rows, two_i = gate_up.shape
    if two_i % 16 or not gate_up.is_contiguous() or gate_up.dtype != torch.float32:
        raise ValueError(f"silu_mul: {tuple(gate_up.shape)} {gate_up.dtype} (contiguous fp32, I % 8 == 0 needed)")
    out = torch.empty(rows, two_i // 2, dtype=torch.float32)
    library().silu_mul(gate_up.data_ptr(), rows, two_i // 2, out.data_ptr())
    return out


def rope_kv_write(qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin_signed: torch.Tensor,
                  positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor) -> torch.Tensor:
    """qkv [T, (H + 2 KVH) * D] fp32 -> q rotated [T, H, D]; k (rotated) and v go into their
    slots of the caches [slots, KVH, D]. cos/sin_signed [P, D]; positions/slots [T] int64."""
    t = qkv.shape[0]
    d = k_cache.shape[2]
    if (qkv.dtype != torch.float32 or k_cache.dtype != torch.float32 or qkv.shape[1] != (heads + 2 * kv_heads) * d
            or positions.dtype != torch.int64 or slots.dtype != torch.int64 or d % 2):
        raise ValueError(f"rope_kv_write: qkv {tuple(qkv.shape)} {qkv.dtype}, cache {tuple(k_cache.shape)}")
    qkv = qkv.contiguous()
    q = torch.empty(t, heads, d, dtype=torch.float32)
    library().rope_kv_write(qkv.data_ptr(), t, heads, kv_heads, d, cos.data_ptr(), sin_signed.data_ptr(),
                            positions.data_ptr(), slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                            q.data_ptr())
    return q
