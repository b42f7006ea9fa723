/* Small-m float32 matrix product: out[m, n] = x[m, k] @ b[k, n] (see small_gemm.h).
 *
 * Shape of the work. m is tiny (1..8 rows of activations) and b is a weight matrix of megabytes,
 * so every element of b is used m times only: the product is bound by the speed at which b comes
 * from memory (and, at m = 8 on a core with one 512-bit FMA per cycle, by the 8 FMAs per element
 * about as much), and the one rule that matters is "read b once". The kernels keep a tile of out
 * (up to 8 rows x W columns) in vector registers while they run down a block of KB_ROWS rows of
 * b: for each p they load one W-wide piece of b's row p, broadcast x[i, p] and do one FMA per row
 * and vector. Between blocks the tile goes back to out, which stays in L1 (see range_blocked).
 *
 * Threads split the columns: chunks of a multiple of 64 columns are claimed dynamically from a
 * shared counter by the caller and the pool's workers, so each thread streams its own part of b
 * and a worker that wakes late simply finds less (or nothing) left to do. One row (m == 1, a
 * matrix-vector product) splits b's rows instead (gemv below). The same pool runs
 * pj_host_parallel_for's jobs (ranges of any independent work: paged attention's grid
 * rows), one job at a time with the products. */
#include "small_gemm.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define PJ_X86 1
#else
#define PJ_X86 0
#endif

#define PJ_INLINE static inline __attribute__((always_inline))

/* Columns [j0, j1) of out, all m rows. Every variant has this signature. */
typedef void (*range_fn)(const float *x, const float *b, float *out, int64_t m, int64_t k,
                         int64_t n, int64_t j0, int64_t j1);

/* Blocking of the vector variants (see range_blocked): rows of b per p-block, and the size of the
 * block of out accumulated across p-blocks (kept in L1; it fixes the panel width). Tuned on Zen 4
 * (32 KiB L1d): 16 rows balance the out reload per block (M * NV loads and stores per tile)
 * against the number of row streams in flight. (A standalone C loop over the 48 products of a
 * 768-wide decoder at 8 rows ran faster with 48 rows per block and one chunk per thread, 7.3
 * against 11 ms; inside the programs, beside XLA's own threads, neither change was measurably
 * faster on this noisy 2-core machine, so the setting stayed.) */
#define KB_ROWS 16
#define ACC_BYTES 16384

/* ------------------------------------------------------------------------------------------ */
/* Portable fallback (non-x86, or no AVX2): b read once per group of 8 rows, plain C on a
 * 64-column accumulator block that lives in L1; the compiler vectorizes the inner loop as it can.
 * Correct everywhere, not tuned. */
static void range_scalar(const float *x, const float *b, float *out, int64_t m, int64_t k,
                         int64_t n, int64_t j0, int64_t j1) {
  enum { BW = 64 };
  float acc[8][BW];
  for (int64_t j = j0; j < j1; j += BW) {
    const int64_t w = j1 - j < BW ? j1 - j : BW;
    for (int64_t i0 = 0; i0 < m; i0 += 8) {
      const int64_t mr = m - i0 < 8 ? m - i0 : 8;
      for (int64_t i = 0; i < mr; i++) memset(acc[i], 0, sizeof acc[i]);
      for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * n + j;
        for (int64_t i = 0; i < mr; i++) {
          const float xi = x[(i0 + i) * k + p];
          for (int64_t c = 0; c < w; c++) acc[i][c] += xi * bp[c];
        }
      }
      for (int64_t i = 0; i < mr; i++) memcpy(out + (i0 + i) * n + j, acc[i], (size_t)w * sizeof(float));
    }
  }
}

#if PJ_X86
/* ------------------------------------------------------------------------------------------ */
/* AVX-512F. 32 zmm registers: a tile of M rows x NV vectors takes M * NV accumulators plus NV
 * for b's row piece and one broadcast; M * NV <= 16 leaves room and keeps enough independent
 * FMA chains (>= 4) to hide the FMA latency even at M = 1. */
#define AVX512 __attribute__((target("avx512f")))

/* One register tile, one p-block: rows [0, M) of x (row stride k, already offset to the block's
 * first p) against rows [0, kb) and columns [0, 16 * NV) of b (row stride n); out (row stride n)
 * is set (first block) or accumulated into. MASKED (then NV == 1): only the lanes set in `mask`
 * exist; loads and stores are masked, so memory past the end of a row is never touched.
 * If PF, also prefetch the same columns of the next p-block (PF rows below). */
PJ_INLINE AVX512 void tile_avx512(const float *x, const float *b, float *out, int64_t k, int64_t n,
                                  int64_t kb, int first, int64_t pf, const int M, const int NV,
                                  const int MASKED, __mmask16 mask) {
  __m512 acc[8][4];
#pragma GCC unroll 8
  for (int i = 0; i < M; i++) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      if (first) acc[i][v] = _mm512_setzero_ps();
      else if (MASKED) acc[i][v] = _mm512_maskz_loadu_ps(mask, out + i * n + 16 * v);
      else acc[i][v] = _mm512_loadu_ps(out + i * n + 16 * v);
    }
  }
  for (int64_t p = 0; p < kb; p++) {
    const float *bp = b + p * n;
    if (pf) { /* into L2: the block is needed only after a sweep across the panel */
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm_prefetch((const char *)(bp + pf * n + 16 * v), _MM_HINT_T1);
    }
    __m512 bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      bv[v] = MASKED ? _mm512_maskz_loadu_ps(mask, bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < M; i++) {
      const __m512 xi = _mm512_set1_ps(x[i * k + p]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(xi, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < M; i++) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      if (MASKED) _mm512_mask_storeu_ps(out + i * n + 16 * v, mask, acc[i][v]);
      else _mm512_storeu_ps(out + i * n + 16 * v, acc[i][v]);
    }
  }
}

/* Columns [0, cols) of one p-block for M rows: 64-column tiles up to 4 rows, 32 beyond, then
 * whole vectors, then one masked vector. */
PJ_INLINE AVX512 void strip_avx512_m(const float *x, const float *b, float *out, int64_t k,
                                     int64_t n, int64_t kb, int first, int64_t pf, int64_t cols,
                                     const int M) {
  const int NV = M <= 4 ? 4 : 2;
  int64_t j = 0;
  for (; j + 16 * NV <= cols; j += 16 * NV)
    tile_avx512(x, b + j, out + j, k, n, kb, first, pf, M, NV, 0, 0);
  for (; j + 16 <= cols; j += 16) tile_avx512(x, b + j, out + j, k, n, kb, first, pf, M, 1, 0, 0);
  if (j < cols)
    tile_avx512(x, b + j, out + j, k, n, kb, first, pf, M, 1, 1,
                (__mmask16)((1u << (cols - j)) - 1));
}

/* Each case is its own fully unrolled instance (constant M, NV): accumulators stay in registers. */
static AVX512 void strip_avx512(const float *x, const float *b, float *out, int64_t k, int64_t n,
                                int64_t kb, int first, int64_t pf, int64_t mr, int64_t cols) {
  switch (mr) {
  case 1: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 1); break;
  case 2: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 2); break;
  case 3: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 3); break;
  case 4: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 4); break;
  case 5: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 5); break;
  case 6: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 6); break;
  case 7: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 7); break;
  default: strip_avx512_m(x, b, out, k, n, kb, first, pf, cols, 8); break;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 + FMA. 16 ymm registers: M * NV accumulators + NV + 1 <= 16, so 16 columns (NV = 2) up
 * to 6 rows and 8 columns (NV = 1) for 7 or 8 rows. Same contract as tile_avx512. */
#define AVX2 __attribute__((target("avx2,fma")))

PJ_INLINE AVX2 void tile_avx2(const float *x, const float *b, float *out, int64_t k, int64_t n,
                              int64_t kb, int first, int64_t pf, const int M, const int NV,
                              const int MASKED, __m256i mask) {
  __m256 acc[8][2];
#pragma GCC unroll 8
  for (int i = 0; i < M; i++) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) {
      if (first) acc[i][v] = _mm256_setzero_ps();
      else if (MASKED) acc[i][v] = _mm256_maskload_ps(out + i * n + 8 * v, mask);
      else acc[i][v] = _mm256_loadu_ps(out + i * n + 8 * v);
    }
  }
  for (int64_t p = 0; p < kb; p++) {
    const float *bp = b + p * n;
    if (pf) _mm_prefetch((const char *)(bp + pf * n), _MM_HINT_T1);
    __m256 bv[2];
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++)
      bv[v] = MASKED ? _mm256_maskload_ps(bp + 8 * v, mask) : _mm256_loadu_ps(bp + 8 * v);
#pragma GCC unroll 8
    for (int i = 0; i < M; i++) {
      const __m256 xi = _mm256_broadcast_ss(x + i * k + p);
#pragma GCC unroll 2
      for (int v = 0; v < NV; v++) acc[i][v] = _mm256_fmadd_ps(xi, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < M; i++) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) {
      if (MASKED) _mm256_maskstore_ps(out + i * n + 8 * v, mask, acc[i][v]);
      else _mm256_storeu_ps(out + i * n + 8 * v, acc[i][v]);
    }
  }
}

PJ_INLINE AVX2 void strip_avx2_m(const float *x, const float *b, float *out, int64_t k, int64_t n,
                                 int64_t kb, int first, int64_t pf, int64_t cols, const int M) {
  const int NV = M <= 6 ? 2 : 1;
  const __m256i all = _mm256_set1_epi32(-1);
  int64_t j = 0;
  for (; j + 8 * NV <= cols; j += 8 * NV)
    tile_avx2(x, b + j, out + j, k, n, kb, first, pf, M, NV, 0, all);
  for (; j + 8 <= cols; j += 8) tile_avx2(x, b + j, out + j, k, n, kb, first, pf, M, 1, 0, all);
  if (j < cols) { /* lanes below the count get the sign bit: the ones that exist */
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(cols - j)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    tile_avx2(x, b + j, out + j, k, n, kb, first, pf, M, 1, 1, mask);
  }
}

static AVX2 void strip_avx2(const float *x, const float *b, float *out, int64_t k, int64_t n,
                            int64_t kb, int first, int64_t pf, int64_t mr, int64_t cols) {
  switch (mr) {
  case 1: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 1); break;
  case 2: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 2); break;
  case 3: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 3); break;
  case 4: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 4); break;
  case 5: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 5); break;
  case 6: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 6); break;
  case 7: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 7); break;
  default: strip_avx2_m(x, b, out, k, n, kb, first, pf, cols, 8); break;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Traversal shared by both vector variants, for columns [j0, j1):
 *   panels of pw columns (out's m x pw block, about ACC_BYTES, stays in L1 across p-blocks)
 *     p-blocks of KB_ROWS rows of b
 *       row groups of <= 8 rows: one strip call across the panel's columns.
 * Within a p-block b is read as KB_ROWS sequential row streams across the panel, each element
 * once; later row groups (m > 8) find the block (KB_ROWS x pw floats) in L1. Each tile also
 * prefetches the next p-block's rows of its columns into L2, one panel sweep ahead. Measured
 * on Zen 4: walking a column tile down all k rows instead (a new 4 KiB page per row when
 * n >= 1024) reached under half the memory bandwidth; without the prefetch, m = 8 lost ~30%. */
typedef void (*strip_fn)(const float *x, const float *b, float *out, int64_t k, int64_t n,
                         int64_t kb, int first, int64_t pf, int64_t mr, int64_t cols);

static inline void range_blocked(strip_fn strip, const float *x, const float *b, float *out,
                                 int64_t m, int64_t k, int64_t n, int64_t j0, int64_t j1) {
  int64_t pw = ACC_BYTES / (4 * m) / 64 * 64; /* panel: out block of about ACC_BYTES */
  if (pw < 64) pw = 64;
  for (int64_t pj = j0; pj < j1; pj += pw) {
    const int64_t cols = j1 - pj < pw ? j1 - pj : pw;
    for (int64_t p0 = 0; p0 < k; p0 += KB_ROWS) {
      const int64_t kb = k - p0 < KB_ROWS ? k - p0 : KB_ROWS;
      /* prefetch the next block's rows (same columns) while this one runs, if they exist */
      const int64_t pf = p0 + KB_ROWS + kb <= k ? KB_ROWS : 0;
      for (int64_t i0 = 0; i0 < m; i0 += 8)
        strip(x + i0 * k + p0, b + p0 * n + pj, out + i0 * n + pj, k, n, kb, p0 == 0, pf,
              m - i0 < 8 ? m - i0 : 8, cols);
    }
  }
}

static void range_avx512(const float *x, const float *b, float *out, int64_t m, int64_t k,
                         int64_t n, int64_t j0, int64_t j1) {
  range_blocked(strip_avx512, x, b, out, m, k, n, j0, j1);
}

static void range_avx2(const float *x, const float *b, float *out, int64_t m, int64_t k, int64_t n,
                       int64_t j0, int64_t j1) {
  range_blocked(strip_avx2, x, b, out, m, k, n, j0, j1);
}
#endif /* PJ_X86 */

/* ------------------------------------------------------------------------------------------ */
/* Thread pool.
 *
 * Job protocol (one job in flight at a time, owned by the caller holding `busy`):
 *  - the owner writes the job fields, resets `done` and then publishes the job with one release
 *    store of `next` = (generation << 32) | nchunks;
 *  - any thread claims a chunk by a CAS that decrements the low half while the high half still
 *    names its generation (chunks are handed out from the last one down); a successful claim
 *    means the job is not finished, so its fields are stable while the chunk runs;
 *  - after a chunk, the thread adds 1 to `done`; the owner returns once done == nchunks.
 * Workers spin WORKER_SPIN_NS for the next generation (consecutive products of a decode step
 * come tens of microseconds apart; a futex wake-up costs several) and then sleep on `work_cv`;
 * the owner spins for `done` and then sleeps on `done_cv`. The sleeper counts and the published
 * values are seq_cst on both sides, so either the waker sees the sleeper or the sleeper sees the
 * new value before it waits (no lost wake-up). A generation counter wrapping after 2^32 calls can
 * at worst make a stalled worker skip one job, which its owner then does alone. */
#define MAX_THREADS 64
#define DEFAULT_MAX_THREADS 16
#define CHUNK_COLS 64         /* chunk widths are multiples of this */
#define CHUNKS_PER_THREAD 4   /* dynamic claiming evens out late or slow threads */
#define MT_MIN_WORK (1 << 16) /* m * k * n below this runs on the caller alone */
#define WORKER_SPIN_NS 20000  /* worker: busy-wait for the next job before sleeping */
#define OWNER_SPIN_NS 200000  /* owner: busy-wait for the last chunks before sleeping */

static struct {
  _Alignas(64) _Atomic uint64_t next; /* (generation << 32) | chunks not yet claimed */
  _Alignas(64) _Atomic int64_t done;  /* chunks finished in the current job */
  _Alignas(64) atomic_flag busy;      /* a caller owns the pool */
  uint32_t gen;                       /* last generation published (owner only) */
  /* the job: written by the owner only while no chunk is claimable */
  const float *x, *b;
  float *out;
  int64_t m, k, n, cw, nchunks;
  range_fn job_fn; /* the job's kernel: fn, or the transposed-b one, or run_generic */
  void (*generic_fn)(void *ctx, int64_t i0, int64_t i1); /* pj_host_parallel_for's job */
  void *generic_ctx;
  /* set once in init */
  range_fn fn;
  int threads;     /* caller included */
  int use_workers; /* 0 in a forked child (the workers did not survive the fork) */
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  _Atomic int sleepers;     /* workers blocked (or about to block) on work_cv */
  _Atomic int owner_asleep; /* the owner blocked (or about to block) on done_cv */
} pool = {.busy = ATOMIC_FLAG_INIT,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .work_cv = PTHREAD_COND_INITIALIZER,
          .done_cv = PTHREAD_COND_INITIALIZER};

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static inline void cpu_relax(void) {
#if PJ_X86
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claim and run chunks of generation g until none is left. */
static void run_chunks(uint32_t g) {
  for (;;) {
    uint64_t v = atomic_load_explicit(&pool.next, memory_order_acquire);
    do {
      if ((uint32_t)(v >> 32) != g || (uint32_t)v == 0) return;
    } while (!atomic_compare_exchange_weak_explicit(&pool.next, &v, v - 1, memory_order_acquire,
                                                    memory_order_acquire));
    /* chunk (uint32_t)v - 1 is ours: the job cannot finish before we report it */
    const int64_t nchunks = pool.nchunks, n = pool.n;
    const int64_t j0 = ((int64_t)(uint32_t)v - 1) * pool.cw;
    const int64_t j1 = j0 + pool.cw < n ? j0 + pool.cw : n;
    pool.job_fn(pool.x, pool.b, pool.out, pool.m, pool.k, n, j0, j1);
    /* no job field may be read after this increment (the owner may start the next job) */
    if (atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel) + 1 == nchunks &&
        atomic_load(&pool.owner_asleep)) {
      pthread_mutex_lock(&pool.mu);
      pthread_cond_signal(&pool.done_cv);
      pthread_mutex_unlock(&pool.mu);
    }
  }
}

static void *worker_main(void *arg) {
  uint32_t seen = 0; /* created before the first job (generation 1) */
  for (;;) {
    uint32_t g = (uint32_t)(atomic_load_explicit(&pool.next, memory_order_acquire) >> 32);
    if (g == seen) {
      const int64_t t0 = now_ns();
      for (int it = 1; g == seen; it++) {
        cpu_relax();
        if ((it & 63) == 0 && now_ns() - t0 > WORKER_SPIN_NS) break;
        g = (uint32_t)(atomic_load_explicit(&pool.next, memory_order_acquire) >> 32);
      }
    }
    if (g == seen) {
      pthread_mutex_lock(&pool.mu);
      atomic_fetch_add(&pool.sleepers, 1);
      while ((g = (uint32_t)(atomic_load(&pool.next) >> 32)) == seen)
        pthread_cond_wait(&pool.work_cv, &pool.mu);
      atomic_fetch_sub(&pool.sleepers, 1);
      pthread_mutex_unlock(&pool.mu);
    }
    seen = g;
    run_chunks(g);
  }
  return NULL;
}

/* After fork() only the forking thread exists: the child runs everything on its caller. */
static void pool_after_fork_child(void) {
  pool.use_workers = 0;
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.work_cv, NULL);
  pthread_cond_init(&pool.done_cv, NULL);
  atomic_flag_clear(&pool.busy);
}

static range_fn pick_kernel(void) {
  const char *isa = getenv("TORCH_PJRT_GEMM_ISA");
  int cap = 2; /* 0 scalar, 1 avx2, 2 avx512 */
  if (isa && strcmp(isa, "scalar") == 0) cap = 0;
  else if (isa && strcmp(isa, "avx2") == 0) cap = 1;
#if PJ_X86
  __builtin_cpu_init();
  if (cap >= 2 && __builtin_cpu_supports("avx512f")) return range_avx512;
  if (cap >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return range_avx2;
#endif
  (void)cap;
  return range_scalar;
}

/* gemv's per-thread scratch (below): the key is made with the pool */
static pthread_key_t gemv_scratch_key;
static int gemv_scratch_key_ok;
static void gemv_scratch_free(void *p);

static void pool_init(void) {
  pool.fn = pick_kernel();
  gemv_scratch_key_ok = pthread_key_create(&gemv_scratch_key, gemv_scratch_free) == 0;
  long t = sysconf(_SC_NPROCESSORS_ONLN);
  if (t < 1) t = 1;
  if (t > DEFAULT_MAX_THREADS) t = DEFAULT_MAX_THREADS;
  const char *env = getenv("TORCH_PJRT_GEMM_THREADS");
  if (env && *env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end == '\0' && v >= 1) t = v > MAX_THREADS ? MAX_THREADS : v;
  }
  /* Workers: detached (nothing joins them; at exit they are simply blocked) and with every
   * signal blocked, so signals keep going to the application's own threads. */
  int made = 0;
  pthread_attr_t attr;
  if (t > 1 && pthread_attr_init(&attr) == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (long i = 0; i < t - 1; i++) {
      pthread_t th;
      if (pthread_create(&th, &attr, worker_main, NULL) != 0) break; /* fewer threads, not an error */
      made++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
  }
  pool.threads = 1 + made;
  pool.use_workers = made > 0;
  if (made) pthread_atfork(NULL, NULL, pool_after_fork_child);
}

int pj_small_gemm_threads(void) {
  pthread_once(&pool_once, pool_init);
  return pool.use_workers ? pool.threads : 1;
}

/* Run columns [0, n) on the pool, the caller included. The caller owns `busy`. */
static void pool_run(range_fn fn, const float *x, const float *b, float *out, int64_t m, int64_t k,
                     int64_t n, int64_t cw, int64_t nchunks) {
  pool.job_fn = fn;
  pool.x = x, pool.b = b, pool.out = out;
  pool.m = m, pool.k = k, pool.n = n, pool.cw = cw, pool.nchunks = nchunks;
  atomic_store_explicit(&pool.done, 0, memory_order_relaxed); /* ordered by the store below */
  const uint32_t g = ++pool.gen;
  atomic_store(&pool.next, ((uint64_t)g << 32) | (uint64_t)nchunks); /* publish (seq_cst) */
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.mu);
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.mu);
  }
  run_chunks(g);
  if (atomic_load_explicit(&pool.done, memory_order_acquire) != nchunks) {
    const int64_t t0 = now_ns();
    for (int it = 1; atomic_load_explicit(&pool.done, memory_order_acquire) != nchunks; it++) {
      cpu_relax();
      if ((it & 63) == 0 && now_ns() - t0 > OWNER_SPIN_NS) {
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.owner_asleep, 1);
        while (atomic_load(&pool.done) != nchunks) pthread_cond_wait(&pool.done_cv, &pool.mu);
        atomic_store(&pool.owner_asleep, 0);
        pthread_mutex_unlock(&pool.mu);
        break;
      }
    }
  }
}

/* Columns [j0, j1) of out = x @ w^T with w row-major [n, k]: each row of w (one output column)
 * is read once and dotted with every row of x (m <= 8 rows of k floats stay in L1). Sixteen
 * partial sums per row of x, advanced together: independent chains (the FMA latency hides
 * behind the other rows) that GCC turns into one vector per row without reassociating adds. */
#define NT_ROWS 8
/* one output column j for R rows of x (R a constant where inlined: the accumulators then live
 * in R vector registers) */
static inline __attribute__((always_inline)) void nt_column(const float *x, const float *wj,
                                                            float *out, int64_t k, int64_t n,
                                                            int64_t j, const int R) {
  float acc[NT_ROWS][16] = {{0}}, tail[NT_ROWS] = {0};
  int64_t p = 0;
  for (; p + 16 <= k; p += 16)
    for (int i = 0; i < R; i++)
      for (int l = 0; l < 16; l++) acc[i][l] += x[i * k + p + l] * wj[p + l];
  for (; p < k; p++)
    for (int i = 0; i < R; i++) tail[i] += x[i * k + p] * wj[p];
  for (int i = 0; i < R; i++) {
    float s = tail[i];
    for (int l = 0; l < 16; l++) s += acc[i][l];
    out[i * n + j] = s;
  }
}

#if PJ_X86 && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
__attribute__((optimize("O3")))
static void range_nt(const float *x, const float *w, float *out, int64_t m, int64_t k, int64_t n,
                     int64_t j0, int64_t j1) {
  for (int64_t i0 = 0; i0 < m; i0 += NT_ROWS) {
    const float *xr = x + i0 * k;
    float *o = out + i0 * n;
    switch (m - i0 < NT_ROWS ? m - i0 : NT_ROWS) {
#define NT_CASE(R) \
  case R:          \
    for (int64_t j = j0; j < j1; j++) nt_column(xr, w + j * k, o, k, n, j, R); \
    break;
      NT_CASE(1) NT_CASE(2) NT_CASE(3) NT_CASE(4) NT_CASE(5) NT_CASE(6) NT_CASE(7) NT_CASE(8)
#undef NT_CASE
    }
  }
}

#if PJ_X86
/* range_nt with AVX-512 intrinsics: one accumulator register per row of x (R constant where
 * inlined), w's row streamed 16 floats at a time; the plain form spills its accumulators. */
static inline __attribute__((always_inline)) AVX512 void nt_column_avx512(
    const float *x, const float *wj, float *out, int64_t k, int64_t n, int64_t j, const int R) {
  __m512 acc[NT_ROWS];
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) {
    const __m512 wv = _mm512_loadu_ps(wj + p);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * k + p), wv, acc[i]);
  }
  if (p < k) { /* the last k % 16 columns, masked: nothing past the rows is read */
    const __mmask16 mk = (__mmask16)((1u << (k - p)) - 1);
    const __m512 wv = _mm512_maskz_loadu_ps(mk, wj + p);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
      acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + i * k + p), wv, acc[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) out[i * n + j] = _mm512_reduce_add_ps(acc[i]);
}

static AVX512 void range_nt_avx512(const float *x, const float *w, float *out, int64_t m,
                                   int64_t k, int64_t n, int64_t j0, int64_t j1) {
  for (int64_t i0 = 0; i0 < m; i0 += NT_ROWS) {
    const float *xr = x + i0 * k;
    float *o = out + i0 * n;
    switch (m - i0 < NT_ROWS ? m - i0 : NT_ROWS) {
#define NT_CASE(R) \
  case R:          \
    for (int64_t j = j0; j < j1; j++) nt_column_avx512(xr, w + j * k, o, k, n, j, R); \
    break;
      NT_CASE(1) NT_CASE(2) NT_CASE(3) NT_CASE(4) NT_CASE(5) NT_CASE(6) NT_CASE(7) NT_CASE(8)
#undef NT_CASE
    }
  }
}
#endif

/* pj_host_parallel_for's jobs as the pool's kind of job: [j0, j1) is the range of indices. */
static void run_generic(const float *x, const float *b, float *out, int64_t m, int64_t k,
                        int64_t n, int64_t j0, int64_t j1) {
  (void)x, (void)b, (void)out, (void)m, (void)k, (void)n;
  pool.generic_fn(pool.generic_ctx, j0, j1);
}

void pj_host_parallel_for(void (*fn)(void *ctx, int64_t i0, int64_t i1), void *ctx, int64_t n,
                          int64_t grain) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int t = pj_small_gemm_threads();
  /* chunks of `grain` indices, at most CHUNKS_PER_THREAD per thread (the counter's low half
   * holds the number of chunks) */
  int64_t cw = grain, cap = (int64_t)t * CHUNKS_PER_THREAD;
  if ((n + cw - 1) / cw > cap) cw = (n + cap - 1) / cap;
  const int64_t nchunks = (n + cw - 1) / cw;
  if (t > 1 && nchunks > 1 && !atomic_flag_test_and_set_explicit(&pool.busy, memory_order_acquire)) {
    pool.generic_fn = fn, pool.generic_ctx = ctx;
    pool_run(run_generic, NULL, NULL, NULL, 0, 0, n, cw, nchunks);
    atomic_flag_clear_explicit(&pool.busy, memory_order_release);
    return;
  }
  fn(ctx, 0, n); /* one thread, or the pool is busy with another caller's job */
}

/* ------------------------------------------------------------------------------------------ */
/* One row against a row-major b: y[n] = x[k] @ b[k, n], a matrix-vector product, where every
 * element of b is used once and the only cost is streaming b. The threads split b's rows, not
 * its columns: each chunk of rows is one contiguous block of memory, which the hardware
 * prefetchers follow at full speed (the column split of the kernels above makes every thread
 * jump from row to row: at one row that read about half the bandwidth, and XLA's own
 * matrix-vector path was faster). Each chunk sums into its own partial vector; the caller adds
 * the partials. Plain C that the compiler vectorizes across columns (no reassociation needed:
 * each column is its own sum), cloned per instruction set where GCC can. Measured on Zen 4 (2
 * threads): the 48 products of a 768-wide decoder stack, 300 MB, in 4.0 ms from a C loop (72
 * GB/s); inside a compiled chain of them as fast as XLA's own one-row dot (4.4-4.5 ms both),
 * and a 768 x 32000 LM head 1.30-1.37 ms against XLA's 1.39-1.42. */
#define GEMV_MIN_ROWS 32 /* rows per chunk at least: smaller chunks cost more partials to add */

#if PJ_X86 && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
__attribute__((optimize("O3")))
static void gemv_rows(const float *restrict x, const float *restrict b, float *restrict y,
                      int64_t n, int64_t p0, int64_t p1) {
  for (int64_t j = 0; j < n; j++) y[j] = 0.0f;
  int64_t p = p0;
  /* eight rows per sweep over y (eight sequential streams of b; y stays in L1 or L2) */
  for (; p + 8 <= p1; p += 8) {
    const float *restrict r0 = b + p * n, *restrict r1 = r0 + n, *restrict r2 = r1 + n,
                          *restrict r3 = r2 + n, *restrict r4 = r3 + n, *restrict r5 = r4 + n,
                          *restrict r6 = r5 + n, *restrict r7 = r6 + n;
    const float x0 = x[p], x1 = x[p + 1], x2 = x[p + 2], x3 = x[p + 3], x4 = x[p + 4],
                x5 = x[p + 5], x6 = x[p + 6], x7 = x[p + 7];
    for (int64_t j = 0; j < n; j++) {
      const float lo = x0 * r0[j] + x1 * r1[j] + x2 * r2[j] + x3 * r3[j];
      const float hi = x4 * r4[j] + x5 * r5[j] + x6 * r6[j] + x7 * r7[j];
      y[j] += lo + hi;
    }
  }
  for (; p < p1; p++) {
    const float *restrict r = b + p * n;
    const float xp = x[p];
    for (int64_t j = 0; j < n; j++) y[j] += xp * r[j];
  }
}

typedef struct {
  const float *x, *b;
  float *partials; /* chunk c's partial at partials + c * stride */
  int64_t k, n, stride, rows;
} gemv_job_t;

static void gemv_chunks(void *ctx, int64_t c0, int64_t c1) {
  const gemv_job_t *j = ctx;
  for (int64_t c = c0; c < c1; c++) {
    const int64_t p0 = c * j->rows, p1 = p0 + j->rows < j->k ? p0 + j->rows : j->k;
    gemv_rows(j->x, j->b, j->partials + c * j->stride, j->n, p0, p1);
  }
}

/* The calling thread's scratch for partials, grown as needed and kept for its next call (the
 * calls of a decode step come one after another on the same threads); freed when the thread
 * exits (the key's destructor). NULL if out of memory. */
typedef struct {
  float *buf;
  size_t cap;
} gemv_scratch_t;
static void gemv_scratch_free(void *p) {
  gemv_scratch_t *sc = p;
  free(sc->buf);
  free(sc);
}

static float *gemv_scratch(size_t floats) {
  if (!gemv_scratch_key_ok) return NULL;
  gemv_scratch_t *sc = pthread_getspecific(gemv_scratch_key);
  if (!sc) {
    sc = calloc(1, sizeof *sc);
    if (!sc || pthread_setspecific(gemv_scratch_key, sc) != 0) {
      free(sc);
      return NULL;
    }
  }
  if (floats > sc->cap) {
    free(sc->buf);
    sc->buf = NULL;
    sc->cap = 0;
    void *p = NULL;
    if (posix_memalign(&p, 64, floats * sizeof(float)) != 0) return NULL;
    sc->buf = p;
    sc->cap = floats;
  }
  return sc->buf;
}

static void gemv(const float *x, const float *b, float *out, int64_t k, int64_t n) {
  const int t = pj_small_gemm_threads();
  int64_t nchunks = (int64_t)t * 2; /* two per thread: a late worker leaves its second */
  if (nchunks > k / GEMV_MIN_ROWS) nchunks = k / GEMV_MIN_ROWS;
  const int64_t stride = (n + 15) / 16 * 16; /* partials on separate cache lines */
  float *partials = t > 1 && nchunks > 1 && (double)k * (double)n >= MT_MIN_WORK
                        ? gemv_scratch((size_t)(nchunks * stride))
                        : NULL;
  if (!partials) { /* one thread (or no memory for partials): straight into out */
    gemv_rows(x, b, out, n, 0, k);
    return;
  }
  gemv_job_t job = {.x = x, .b = b, .partials = partials, .k = k, .n = n, .stride = stride,
                    .rows = (k + nchunks - 1) / nchunks};
  nchunks = (k + job.rows - 1) / job.rows;
  pj_host_parallel_for(gemv_chunks, &job, nchunks, 1);
  memcpy(out, partials, (size_t)n * sizeof(float));
  for (int64_t c = 1; c < nchunks; c++) {
    const float *s = partials + c * stride;
    for (int64_t j = 0; j < n; j++) out[j] += s[j];
  }
}

static void gemm(range_fn fn, const float *x, const float *b, float *out, int64_t m, int64_t k,
                 int64_t n) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    memset(out, 0, (size_t)m * (size_t)n * sizeof(float));
    return;
  }
  const int t = pj_small_gemm_threads(); /* sets the pool up, pool.fn included */
  if (!fn) fn = pool.fn;
  if (t > 1 && (double)m * (double)k * (double)n >= MT_MIN_WORK) {
    /* chunk width: a multiple of CHUNK_COLS, about CHUNKS_PER_THREAD chunks per thread */
    int64_t cw = (n + (int64_t)t * CHUNKS_PER_THREAD - 1) / ((int64_t)t * CHUNKS_PER_THREAD);
    cw = (cw + CHUNK_COLS - 1) / CHUNK_COLS * CHUNK_COLS;
    const int64_t nchunks = (n + cw - 1) / cw; /* <= t * CHUNKS_PER_THREAD: fits the counter */
    if (nchunks > 1 && !atomic_flag_test_and_set_explicit(&pool.busy, memory_order_acquire)) {
      pool_run(fn, x, b, out, m, k, n, cw, nchunks);
      atomic_flag_clear_explicit(&pool.busy, memory_order_release);
      return;
    }
  }
  fn(x, b, out, m, k, n, 0, n);
}

void pj_small_gemm_f32(const float *x, const float *b, float *out, int64_t m, int64_t k, int64_t n) {
  if (m == 1 && k > 0 && n > 0) {
    gemv(x, b, out, k, n);
    return;
  }
  gemm(NULL, x, b, out, m, k, n);
}

void pj_small_gemm_nt_f32(const float *x, const float *w, float *out, int64_t m, int64_t k,
                          int64_t n) {
  pthread_once(&pool_once, pool_init);
  range_fn fn = range_nt; /* the AVX-512 form where the product kernel is AVX-512's */
#if PJ_X86
  if (pool.fn == range_avx512) fn = range_nt_avx512;
#endif
  gemm(fn, x, w, out, m, k, n);
}
