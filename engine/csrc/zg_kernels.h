/* The ABI of zgtool's CPU kernels: every function the Python binding (engine/cpu_kernels.py)
   calls, and nothing else. tests/engine/test_kernel_abi.py parses these prototypes and checks
   them against the ctypes argtypes/restype, so a change here that the binding does not follow
   fails a test instead of corrupting arguments. One prototype per line group, ending in ");". */
#ifndef ZG_KERNELS_H
#define ZG_KERNELS_H

#include <stdint.h>

/* The projections' weight element (step_args.wtype, lm_head_argmax's wtype) */
#define ZG_W_F32 0
#define ZG_W_INT8 1
#define ZG_W_BF16 2
#define ZG_W_INT8A8 3   /* int8 weights, activations quantised per row (w8a8_gemm) */

/* One decoder layer's weights and KV cache for step_layers (fp32, int8 or bf16 weights as the
   step's wtype says, per-channel scales: ones for fp32 and bf16; qkv_bias may be NULL). */
typedef struct {
    const float *input_norm, *post_norm;
    const void *qkv; const float *qkv_scale, *qkv_bias;
    const void *o; const float *o_scale;
    const void *gate_up; const float *gate_up_scale;
    const void *down; const float *down_scale;
    float *kc, *vc;
} layer_ptrs;

/* A whole step's decoder layers (step_layers): the layers, their weight element (ZG_W_*), the
   residual stream x [M, hidden] (updated in place) and the final-normed out [M, hidden], the
   shapes, RoPE tables, each row's position, KV slot, block table (width wide) and context length,
   and the grow-only scratch buffers; nt threads. */
typedef struct {
    const layer_ptrs *layers;
    int64_t nl, wtype;
    float *x;
    int64_t M, hidden, H, KVH, D, inter;
    float eps;
    const float *final_norm;
    float *out;
    const float *cos_t, *sin_t;
    const int64_t *positions, *slots, *tables;
    int64_t width;
    const int64_t *lens;
    int64_t bs;
    float scale;
    float *h, *qkv, *q, *att, *gu, *act, *delta, *attn_scratch;
    int64_t nt;
} step_args;

/* y [M, N] = scale[n] * x [M, K] . w [N, K] (+ bias[n]); K % 8 == 0. bf16 weights are the high
   halves of fp32 (torch.bfloat16's bits) */
void w8_gemm(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale, const float *bias, float *y, int64_t N, int64_t nt);
void f32_gemm(const float *x, int64_t M, int64_t K, const float *w, const float *scale, const float *bias, float *y, int64_t N, int64_t nt);
void bf16_gemm(const float *x, int64_t M, int64_t K, const uint16_t *w, const float *scale, const float *bias, float *y, int64_t N, int64_t nt);

/* w8_gemm's weights times x quantised per row to int8 on the fly (lossy); vpdpbusd where the
   variant has AVX512-VNNI and K % 64 == 0 (w8a8_vnni(K) says whether), else the same quantised
   products in fp32 */
void w8a8_gemm(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale, const float *bias, float *y, int64_t N, int64_t nt);
int64_t w8a8_vnni(int64_t K);

/* the instruction-set variant this library was built for: "avx2", "avx512" or "avx512bf16" */
const char *kernel_isa(void);

/* one query per row over its paged KV; D % 8 == 0, H % KVH == 0 */
void paged_decode_attention(const float *q, const float *kc, const float *vc, const int64_t *tables, int64_t width, const int64_t *lens, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t bs, float scale, float *out, float *scratch, int64_t nt);

/* the glue between a layer's GEMMs */
void add_rms_norm(float *x, const float *delta, const float *w, float eps, int64_t rows, int64_t n, float *out);
void silu_mul(const float *gu, int64_t rows, int64_t I, float *out);
void rope_kv_write(const float *qkv, int64_t T, int64_t H, int64_t KVH, int64_t D, const float *cos_t, const float *sin_t, const int64_t *positions, const int64_t *slots, float *kc, float *vc, float *q_out);
void w8_dequant(const int8_t *w, const float *scale, int64_t N, int64_t K, float *out);

/* a whole step's layers in one call, and greedy sampling's lm_head + argmax */
void step_layers(const step_args *a);
void lm_head_argmax(const float *h, int64_t M, int64_t hidden, const void *w, const float *scale, int64_t wtype, float *logits, int64_t V, int64_t *tokens, int64_t nt);

/* the rows of x [M, N] holding a NaN or an infinity into rows[]; returns how many (one pass, one
   thread: no OpenMP region beside the pool's spinning workers) */
int64_t nonfinite_rows(const float *x, int64_t M, int64_t N, int64_t *rows);

/* the thread pool's counters (per thread id: 0 is the caller): chunks run, jobs in which the
   thread ran at least one chunk, of those the jobs it ran on its caller's CPU (stacked), and the
   jobs at whose start it found itself there and moved off; a state check that every configured
   thread takes work on a core of its own */
int64_t pool_workers(void);
void pool_counters(int64_t *chunks, int64_t *jobs, int64_t *shared, int64_t *moved, int64_t n);
void pool_reset_counters(void);
/* ends the pool's workers (joined); the next multi-threaded job starts a fresh pool, as a new
   process would (tests: many fresh pool starts in one process) */
void pool_stop(void);

#endif
