/* The weight-only GEMMs: w8_gemm (int8 weights, per-channel scales), f32_gemm (fp32 weights) and
   bf16_gemm (bf16 weights), the same blocking and prefetching: MKL ran SmolLM2's 49152 x 576
   lm_head at 16 rows in 34-52 ms, about a third of its peak. One body, gemm_impl.h,
   instantiated per weight type and vector width: 8 fp32 lanes (ymm, every variant), 16 (zmm,
   where the variant is built with AVX-512: K a multiple of 16) and, for bf16 weights where it is
   built with AVX512-BF16, vdpbf16ps on 32 bf16 pairs a step (K a multiple of 32; the
   activations rounded to bf16 in registers, as a bf16 model computes). The public functions
   pick the widest instance the shape allows; a shape never changes instance between calls, so
   an output's arithmetic never depends on the batch. Which variant was built: kernel_isa().
   bf16 weights [3072, 576] (cache-resident: compute, not memory), 2 threads, a loaded 2-core
   EPYC, ms, median of 5 (avx2 / avx512 / avx512bf16): 1 row 0.088 / 0.082 / 0.065; 16 rows
   3.45 / 3.45 / 2.71; 64 rows 14.7 / 12.7 / 7.9 -- vdpbf16ps is why avx512bf16 ranks first. */
#include "zg_simd.h"

/* -- 8 lanes (AVX2) -------------------------------------------------------------------------- */
#define GV __m256
#define GX __m256
#define GW __m256
#define GSTEP 8
#define GV_ZERO _mm256_setzero_ps()
#define GX_LOAD(p) _mm256_loadu_ps(p)
#define GV_FMA(acc, xv, wv) _mm256_fmadd_ps(xv, wv, acc)
#define GV_HSUM(v) hsum(v)

#define GEMM(name) w8y_##name
#define GEMM_WT int8_t
#define GW_LOAD(p) load_w8(p)
#define GEMM_LINE W8_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE

#define GEMM(name) f32y_##name
#define GEMM_WT float
#define GW_LOAD(p) _mm256_loadu_ps(p)
#define GEMM_LINE F32_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE

#define GEMM(name) bf16y_##name
#define GEMM_WT uint16_t
#define GW_LOAD(p) load_bf16(p)
#define GEMM_LINE BF16_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE

#undef GV
#undef GX
#undef GW
#undef GSTEP
#undef GV_ZERO
#undef GX_LOAD
#undef GV_FMA
#undef GV_HSUM

#ifdef __AVX512F__
/* -- 16 lanes (AVX-512) ---------------------------------------------------------------------- */
#define GV __m512
#define GX __m512
#define GW __m512
#define GSTEP 16
#define GV_ZERO _mm512_setzero_ps()
#define GX_LOAD(p) _mm512_loadu_ps(p)
#define GV_FMA(acc, xv, wv) _mm512_fmadd_ps(xv, wv, acc)
#define GV_HSUM(v) _mm512_reduce_add_ps(v)

#define GEMM(name) w8z_##name
#define GEMM_WT int8_t
#define GW_LOAD(p) load_w8_16(p)
#define GEMM_LINE W8_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE

#define GEMM(name) f32z_##name
#define GEMM_WT float
#define GW_LOAD(p) _mm512_loadu_ps(p)
#define GEMM_LINE F32_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE

#define GEMM(name) bf16z_##name
#define GEMM_WT uint16_t
#define GW_LOAD(p) load_bf16_16(p)
#define GEMM_LINE BF16_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE

#undef GX
#undef GW
#undef GSTEP
#undef GX_LOAD
#undef GV_FMA

#ifdef __AVX512BF16__
/* -- vdpbf16ps: 32 bf16 pairs a step into 16 fp32 lanes ------------------------------------- */
#define GX __m512bh
#define GW __m512bh
#define GSTEP 32
#define GX_LOAD(p) _mm512_cvtne2ps_pbh(_mm512_loadu_ps((p) + 16), _mm512_loadu_ps(p))
#define GV_FMA(acc, xv, wv) _mm512_dpbf16_ps(acc, xv, wv)
#define GEMM(name) bf16d_##name
#define GEMM_WT uint16_t
#define GW_LOAD(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define GEMM_LINE BF16_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GW_LOAD
#undef GEMM_LINE
#undef GX
#undef GW
#undef GSTEP
#undef GX_LOAD
#undef GV_FMA
#endif
#undef GV
#undef GV_ZERO
#undef GV_HSUM
#endif

void w8_gemm(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale, const float *bias, float *y,
             int64_t N, int64_t nt) {
#ifdef __AVX512F__
    if (K % 16 == 0) { w8z_gemm(x, M, K, w, scale, bias, y, N, nt); return; }
#endif
    w8y_gemm(x, M, K, w, scale, bias, y, N, nt);
}

void f32_gemm(const float *x, int64_t M, int64_t K, const float *w, const float *scale, const float *bias, float *y,
              int64_t N, int64_t nt) {
#ifdef __AVX512F__
    if (K % 16 == 0) { f32z_gemm(x, M, K, w, scale, bias, y, N, nt); return; }
#endif
    f32y_gemm(x, M, K, w, scale, bias, y, N, nt);
}

void bf16_gemm(const float *x, int64_t M, int64_t K, const uint16_t *w, const float *scale, const float *bias,
               float *y, int64_t N, int64_t nt) {
#ifdef __AVX512BF16__
    if (K % 32 == 0) { bf16d_gemm(x, M, K, w, scale, bias, y, N, nt); return; }
#endif
#ifdef __AVX512F__
    if (K % 16 == 0) { bf16z_gemm(x, M, K, w, scale, bias, y, N, nt); return; }
#endif
    bf16y_gemm(x, M, K, w, scale, bias, y, N, nt);
}

const char *kernel_isa(void) {
#if defined(__AVX512BF16__)
    return "avx512bf16";
#elif defined(__AVX512F__)
    return "avx512";
#else
    return "avx2";
#endif
}
