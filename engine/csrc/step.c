/* The one-call step: every decoder layer of a step, and greedy sampling's lm_head + argmax. */
#include "zg_simd.h"

/* A whole step's decoder layers in one call (one ctypes crossing instead of ~9 per layer: at
   batch 1 the Python/ctypes overhead around the kernels was ~3-4 ms of a 14 ms int8 SmolLM2
   token). Every row is one query: a decode, or one position of a prompt chunk, attending over
   its own sequence's paged KV up to its own position (tables/lens per row; all rows' K and V are
   written before any row attends, so a chunk's rows see each other causally). Exactly the
   kernels and order of LlamaModel._forward_fused_norms, so the result is bit-identical to it. */
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

int64_t nonfinite_rows(const float *x, int64_t M, int64_t N, int64_t *rows) {
    const __m256 inf = _mm256_set1_ps(INFINITY);
    int64_t nbad = 0;
    for (int64_t m = 0; m < M; m++) {
        const float *r = x + m * N;
        __m256 bad = _mm256_setzero_ps();
        int64_t v = 0;
        /* |x| < inf is false for +-inf and for NaN (an unordered compare) */
        for (; v + 8 <= N; v += 8) {
            __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.f), _mm256_loadu_ps(r + v));
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
        }
        int any = _mm256_movemask_ps(bad) != 0;
        for (; v < N; v++) any |= !(fabsf(r[v]) < INFINITY);
        if (any) rows[nbad++] = m;
    }
    return nbad;
}
