/* A float32 matrix product for few rows (decode-time linear layers): out = x @ b with x [m, k]
 * small (m <= 8 is the fast case) and b [k, n] large, so the cost is reading b once from memory.
 * Register-blocked AVX-512 / AVX2+FMA kernels picked at run time (portable scalar code
 * elsewhere); the columns are split across a small persistent thread pool.
 *
 * Environment, read once on first use:
 *   TORCH_PJRT_GEMM_THREADS=N   threads to use, caller included (default: online CPUs, at most 16)
 *   TORCH_PJRT_GEMM_ISA=scalar|avx2|avx512   cap the instruction set (testing; never raises it
 *                                            above what the CPU supports; the one-row form is
 *                                            compiled per instruction set by GCC and picks by
 *                                            the CPU alone) */
#ifndef TORCH_PJRT_SMALL_GEMM_H
#define TORCH_PJRT_SMALL_GEMM_H
#include <stdint.h>

/* out[i, j] = sum_p x[i, p] * b[p, j] for i < m, j < n, p < k. x is row-major [m, k] (row stride k),
 * b row-major [k, n] (row stride n), out row-major [m, n] (row stride n), all float32, no aliasing
 * between out and the inputs. Any m, k, n >= 0 (k == 0: out is zeros). Fast for m <= 8.
 * Safe to call from several threads at once (a call that finds the pool busy runs on its own
 * thread alone). */
void pj_small_gemm_f32(const float *x, const float *b, float *out, int64_t m, int64_t k, int64_t n);
/* The same product with b given transposed: w row-major [n, k] (out = x @ w^T), as a torch
 * Linear's weight is stored. */
void pj_small_gemm_nt_f32(const float *x, const float *w, float *out, int64_t m, int64_t k,
                          int64_t n);
/* Runs fn(ctx, i0, i1) over disjoint ranges covering [0, n), in chunks of at least `grain`
 * indices, on the same pool (the caller included; the caller alone when the pool is busy or has
 * one thread). Returns when every range has run. fn must be safe to run on several threads at
 * once for disjoint ranges. */
void pj_host_parallel_for(void (*fn)(void *ctx, int64_t i0, int64_t i1), void *ctx, int64_t n,
                          int64_t grain);
/* threads the kernel uses (the caller's included) */
int pj_small_gemm_threads(void);

#endif
