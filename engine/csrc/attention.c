/* Paged decode attention: one query per row over its own sequence's KV, read in place. */
#include "zg_simd.h"

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
