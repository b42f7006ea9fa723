/* Host staging blocks (host_pool.h): size classes, reuse of a given-back block, page alignment,
 * the bound on cached bytes, and take/give from several threads at once with the counters
 * consistent afterwards. No plugin needed. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/host_pool.h"

static void *churn(void *arg) {
  const size_t seed = (size_t)(uintptr_t)arg;
  for (int i = 0; i < 2000; i++) {
    const size_t n = 1 + ((seed * 7919 + (size_t)i * 104729) % 40000);
    void *p;
    size_t cap;
    OK(pj_host_pool_take(n, &p, &cap));
    EXPECT(cap >= n && cap == pj_host_pool_class(n));
    memset(p, (int)(i & 0xff), n); /* the whole requested size is writable */
    pj_host_pool_give(p, cap);
  }
  return NULL;
}

int main(void) {
  EXPECT(pj_host_pool_class(0) == 4096);
  EXPECT(pj_host_pool_class(1) == 4096);
  EXPECT(pj_host_pool_class(4096) == 4096);
  EXPECT(pj_host_pool_class(4097) == 8192);
  EXPECT(pj_host_pool_class(SIZE_MAX) == 0);

  void *p, *q;
  size_t cap, cap2;
  OK(pj_host_pool_take(100, &p, &cap));
  EXPECT(cap == 4096 && ((uintptr_t)p % PJ_HOST_POOL_PAGE) == 0);
  size_t allocated, cached;
  pj_host_pool_stats(&allocated, &cached);
  EXPECT(allocated == 4096 && cached == 0);
  pj_host_pool_give(p, cap);
  pj_host_pool_stats(&allocated, &cached);
  EXPECT(allocated == 4096 && cached == 4096);
  OK(pj_host_pool_take(3000, &q, &cap2)); /* the same class: the same block back */
  EXPECT(q == p && cap2 == 4096);
  pj_host_pool_stats(&allocated, &cached);
  EXPECT(allocated == 4096 && cached == 0);
  OK(pj_host_pool_take(5000, &p, &cap)); /* another class: a new block */
  EXPECT(p != q && cap == 8192);
  pj_host_pool_give(p, cap);
  pj_host_pool_give(q, cap2);

  /* too large for any class: an error, not a crash */
  pj_status_t *st = pj_host_pool_take(SIZE_MAX, &p, &cap);
  EXPECT(st && pj_status_code(st) == PJ_ERR_OOM && !p && cap == 0);
  pj_status_free(st);

  /* the bound: blocks given back beyond PJ_HOST_POOL_MAX_CACHED are freed (untouched 512 MiB
   * blocks cost address space only) */
  void *big[3];
  size_t bigcap[3];
  size_t before_alloc, before_cached;
  pj_host_pool_stats(&before_alloc, &before_cached);
  for (int i = 0; i < 3; i++) OK(pj_host_pool_take((size_t)512 << 20, &big[i], &bigcap[i]));
  for (int i = 0; i < 3; i++) pj_host_pool_give(big[i], bigcap[i]);
  pj_host_pool_stats(&allocated, &cached);
  EXPECT(cached <= PJ_HOST_POOL_MAX_CACHED);
  EXPECT(allocated - before_alloc == cached - before_cached); /* what was freed is uncounted */
  EXPECT(cached - before_cached <= PJ_HOST_POOL_MAX_CACHED);
  EXPECT(allocated - before_alloc < (size_t)3 * (512 << 20));
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  pj_host_pool_stats(&allocated, &cached);
  /* everything was given back (with the pool at its bound, the small blocks freed on the way
   * back) and the counters agree: nothing alive but what is cached */
  EXPECT(allocated == cached);
  CTEST_DONE();
}
