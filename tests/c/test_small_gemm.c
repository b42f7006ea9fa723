/* pj_small_gemm_f32 against a double-accumulated reference: many shapes (row groups, column
 * tails, k == 0, threaded and single-threaded sizes, unaligned pointers), two threads calling at
 * once, and (on x86-64) the AVX2 and scalar variants too, each in a forked child that caps the
 * instruction set with TORCH_PJRT_GEMM_ISA before its first call. No plugin needed. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctest.h"
#include "../../csrc/runtime/small_gemm.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rnd(void) { /* uniform in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* count floats at an offset of `skew` floats from malloc's alignment; the block ends exactly at
 * the last element so AddressSanitizer sees any access past it. *base is what to free. */
static float *alloc_floats(int64_t count, int skew, void **base) {
  float *p = malloc((size_t)(count + skew) * sizeof(float) + 1); /* +1: never malloc(0) */
  *base = p;
  return p + skew;
}

/* ref = x @ b in double; scale = sum_p |x[i,p] * b[p,j]| (the error bound's size) */
static void reference(const float *x, const float *b, double *ref, double *scale, int64_t m,
                      int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; i++) {
    double *r = ref + i * n, *s = scale + i * n;
    for (int64_t j = 0; j < n; j++) r[j] = s[j] = 0.0;
    for (int64_t p = 0; p < k; p++) {
      const double xv = x[i * k + p];
      const float *bp = b + p * n;
      for (int64_t j = 0; j < n; j++) {
        r[j] += xv * bp[j];
        s[j] += fabs(xv * bp[j]);
      }
    }
  }
}

/* float32 accumulation error grows like sqrt(k) ulps of the sum of magnitudes */
static int close_enough(float got, double ref, double scale, int64_t k) {
  const double tol = 1e-5 * sqrt((double)k + 1.0) * scale + 1e-30;
  return fabs((double)got - ref) <= tol; /* false for NaN */
}

static int check_shape(int64_t m, int64_t k, int64_t n, int skew) {
  void *xb, *bb, *ob;
  float *x = alloc_floats(m * k, skew, &xb), *b = alloc_floats(k * n, skew, &bb);
  float *out = alloc_floats(m * n, skew, &ob);
  double *ref = malloc((size_t)(m * n) * sizeof(double) + 1);
  double *scale = malloc((size_t)(m * n) * sizeof(double) + 1);
  for (int64_t i = 0; i < m * k; i++) x[i] = rnd();
  for (int64_t i = 0; i < k * n; i++) b[i] = rnd();
  for (int64_t i = 0; i < m * n; i++) out[i] = NAN; /* every element must be written */
  reference(x, b, ref, scale, m, k, n);
  pj_small_gemm_f32(x, b, out, m, k, n);
  int bad = 0;
  for (int64_t i = 0; i < m * n; i++) {
    if (k == 0 ? out[i] != 0.0f : !close_enough(out[i], ref[i], scale[i], k)) {
      if (bad++ < 3)
        fprintf(stderr, "m=%lld k=%lld n=%lld skew=%d: out[%lld, %lld] = %g, want %g\n",
                (long long)m, (long long)k, (long long)n, skew, (long long)(i / n),
                (long long)(i % n), (double)out[i], ref[i]);
    }
  }
  free(xb), free(bb), free(ob), free(ref), free(scale);
  return bad == 0;
}

static void test_shapes(void) {
  static const int64_t ks[] = {0, 1, 7, 64, 768, 1000};
  static const int64_t ns[] = {1, 15, 16, 17, 33, 64, 100, 2048, 2051};
  /* every row count 1..17 in the plain build; under AddressSanitizer (several times slower)
   * the counts that reach each code path: 1, a full group of 8, a remainder, two groups */
#if defined(__SANITIZE_ADDRESS__)
  static const int64_t ms[] = {1, 3, 8, 9, 17};
#else
  static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
#endif
  for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
    for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
      for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
        EXPECT(check_shape(ms[mi], ks[a], ns[c], (int)((ms[mi] + a + c) % 3)));
  /* a wide one (many chunks per thread) and empty ones (nothing written, nothing read) */
  EXPECT(check_shape(8, 64, 32000, 0));
  EXPECT(check_shape(1, 96, 32001, 1));
  pj_small_gemm_f32(NULL, NULL, NULL, 0, 5, 5);
  pj_small_gemm_f32(NULL, NULL, NULL, 5, 5, 0);
}

/* Three threads at once, each on its own buffers, repeatedly: some usually find the pool busy
 * and run alone; all must always be right. */
typedef struct {
  int64_t m, k, n;
  float *x, *b, *out;
  double *ref, *scale;
  int failures;
} conc_job_t;

static pthread_barrier_t conc_start;

static void *conc_main(void *arg) {
  conc_job_t *j = arg;
  pthread_barrier_wait(&conc_start);
  for (int it = 0; it < 40; it++) {
    for (int64_t i = 0; i < j->m * j->n; i++) j->out[i] = NAN;
    pj_small_gemm_f32(j->x, j->b, j->out, j->m, j->k, j->n);
    for (int64_t i = 0; i < j->m * j->n; i++)
      if (!close_enough(j->out[i], j->ref[i], j->scale[i], j->k)) {
        j->failures++;
        break;
      }
  }
  return NULL;
}

static void test_concurrent(void) {
  /* the third is one row: the matrix-vector form, whose partial sums are per-thread scratch */
  enum { NJ = 3 };
  conc_job_t jobs[NJ] = {{.m = 8, .k = 768, .n = 2048}, {.m = 3, .k = 1000, .n = 2051},
                         {.m = 1, .k = 2048, .n = 770}};
  for (int t = 0; t < NJ; t++) {
    conc_job_t *j = &jobs[t];
    j->x = malloc((size_t)(j->m * j->k) * sizeof(float));
    j->b = malloc((size_t)(j->k * j->n) * sizeof(float));
    j->out = malloc((size_t)(j->m * j->n) * sizeof(float));
    j->ref = malloc((size_t)(j->m * j->n) * sizeof(double));
    j->scale = malloc((size_t)(j->m * j->n) * sizeof(double));
    for (int64_t i = 0; i < j->m * j->k; i++) j->x[i] = rnd();
    for (int64_t i = 0; i < j->k * j->n; i++) j->b[i] = rnd();
    reference(j->x, j->b, j->ref, j->scale, j->m, j->k, j->n);
  }
  pthread_barrier_init(&conc_start, NULL, NJ);
  pthread_t th[NJ];
  for (int t = 0; t < NJ; t++) EXPECT(pthread_create(&th[t], NULL, conc_main, &jobs[t]) == 0);
  for (int t = 0; t < NJ; t++) pthread_join(th[t], NULL);
  pthread_barrier_destroy(&conc_start);
  for (int t = 0; t < NJ; t++) {
    EXPECT(jobs[t].failures == 0);
    free(jobs[t].x), free(jobs[t].b), free(jobs[t].out), free(jobs[t].ref), free(jobs[t].scale);
  }
}

static void test_threads(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long want = cpus < 1 ? 1 : cpus > 16 ? 16 : cpus;
  int t = pj_small_gemm_threads();
  EXPECT(t >= 1 && t <= want); /* fewer only if a worker could not be created */
}

static int run_all(void) {
  test_threads();
  test_shapes();
  test_concurrent();
  return ctest_failures;
}

int main(void) {
  unsetenv("TORCH_PJRT_GEMM_THREADS"); /* the default thread count */
  unsetenv("TORCH_PJRT_GEMM_ISA");
#if defined(__x86_64__)
  /* The narrower variants, each in a child forked before this process's first call (so the
   * child reads its own environment when it sets the kernel up). */
  static const char *const isas[] = {"avx2", "scalar"};
  for (int v = 0; v < 2; v++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      setenv("TORCH_PJRT_GEMM_ISA", isas[v], 1);
      int f = run_all();
      if (f) fprintf(stderr, "(in the %s variant)\n", isas[v]);
      exit(f ? 1 : 0);
    }
    int status = 0;
    EXPECT(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0);
  }
#endif
  run_all();
  CTEST_DONE();
}
