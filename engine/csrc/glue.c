/* The glue between a layer's GEMMs: residual add + RMSNorm, silu * mul, RoPE + KV write, and
   the int8 -> fp32 dequantisation. */
#include "zg_simd.h"

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
