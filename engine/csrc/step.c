/* The one-call step: every decoder layer of a step, and greedy sampling's lm_head + argmax. */
#include "zg_simd.h"

/* A whole step's decoder layers in one call (one ctypes crossing instead of ~9 per layer: at
   batch 1 the Python/ctypes overhead around the kernels was ~3-4 ms of a 14 ms int8 SmolLM2
   token). Every row is one query: a decode, or one position of a prompt chunk, attending over
   its own sequence's paged KV up to its own position (tables/lens per row; all rows' K and V are
   written before any row attends, so a chunk's rows see each other causally). Exactly the
   kernels and order of LlamaModel._forward_fused_norms, so the result is bit-identical to it. */
static void gemm_any(int64_t wtype, const float *x, int64_t M, int64_t K, const void *w, const float *scale,
                     const float *bias, float *y, int64_t N, int64_t nt) {
    if (wtype == ZG_W_INT8) w8_gemm(x, M, K, (const int8_t *)w, scale, bias, y, N, nt);
    else if (wtype == ZG_W_INT8A8) w8a8_gemm(x, M, K, (const int8_t *)w, scale, bias, y, N, nt);
    else if (wtype == ZG_W_BF16) bf16_gemm(x, M, K, (const uint16_t *)w, scale, bias, y, N, nt);
    else f32_gemm(x, M, K, (const float *)w, scale, bias, y, N, nt);
}

void step_layers(const step_args *a) {
    int64_t M = a->M, hidden = a->hidden, H = a->H, KVH = a->KVH, D = a->D, inter = a->inter, nt = a->nt;
    int64_t nqkv = (H + 2 * KVH) * D, wt = a->wtype;
    float *x = a->x, *h = a->h, *delta = a->delta;
    for (int64_t l = 0; l < a->nl; l++) {
        const layer_ptrs *p = a->layers + l;
        add_rms_norm(x, l ? delta : NULL, p->input_norm, a->eps, M, hidden, h);
        gemm_any(wt, h, M, hidden, p->qkv, p->qkv_scale, p->qkv_bias, a->qkv, nqkv, nt);
        rope_kv_write(a->qkv, M, H, KVH, D, a->cos_t, a->sin_t, a->positions, a->slots, p->kc, p->vc, a->q);
        paged_decode_attention(a->q, p->kc, p->vc, a->tables, a->width, a->lens, M, H, KVH, D, a->bs, a->scale, a->att,
                               a->attn_scratch, nt);
        gemm_any(wt, a->att, M, H * D, p->o, p->o_scale, NULL, delta, hidden, nt);
        add_rms_norm(x, delta, p->post_norm, a->eps, M, hidden, h);
        gemm_any(wt, h, M, hidden, p->gate_up, p->gate_up_scale, NULL, a->gu, 2 * inter, nt);
        silu_mul(a->gu, M, inter, a->act);
        gemm_any(wt, a->act, M, inter, p->down, p->down_scale, NULL, delta, hidden, nt);
    }
    add_rms_norm(x, a->nl ? delta : NULL, a->final_norm, a->eps, M, hidden, a->out);
}

/* Greedy sampling's tail: logits [M, V] = h [M, hidden] times the lm_head [V, hidden] (fp32, int8
   or bf16 as wtype says: the same GEMM as the logits path), then each row's argmax into tokens[m]: the first
   maximum, or the first NaN (torch.argmax's rule). */
void lm_head_argmax(const float *h, int64_t M, int64_t hidden, const void *w, const float *scale, int64_t wtype,
                    float *logits, int64_t V, int64_t *tokens, int64_t nt) {
    gemm_any(wtype, h, M, hidden, w, scale, NULL, logits, V, nt);
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
