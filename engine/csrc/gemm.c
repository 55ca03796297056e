/* The weight-only GEMMs: w8_gemm (int8 weights, per-channel scales) and f32_gemm (fp32 weights,
   the same blocking and prefetching: MKL ran SmolLM2's 49152 x 576 lm_head at 16 rows in 34-52
   ms, about a third of its peak). One body, gemm_impl.h, instantiated per weight type. */
#include "zg_simd.h"

#define GEMM(name) w8_##name
#define GEMM_WT int8_t
#define GEMM_LOAD(p) load_w8(p)
#define GEMM_LINE W8_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GEMM_LOAD
#undef GEMM_LINE

#define GEMM(name) f32_##name
#define GEMM_WT float
#define GEMM_LOAD(p) _mm256_loadu_ps(p)
#define GEMM_LINE F32_LINE
#include "gemm_impl.h"
#undef GEMM
#undef GEMM_WT
#undef GEMM_LOAD
#undef GEMM_LINE
