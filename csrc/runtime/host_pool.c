/* Host staging blocks (host_pool.h). Free blocks of one size class form a stack linked through
 * their own first bytes (a block is at least a page), so keeping a block costs no allocation;
 * one mutex guards the stacks and the counters. */
#include "torch_pjrt/host_pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define NCLASSES 64 /* class k holds blocks of 2^k bytes; k < 12 is unused */

typedef struct free_block {
  struct free_block *next;
} free_block_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static free_block_t *free_lists[NCLASSES];
static size_t cached_bytes;    /* free blocks kept */
static size_t allocated_bytes; /* blocks alive, free or in use */

static int class_index(size_t cap) {
  int k = 0;
  while (((size_t)1 << k) < cap) k++;
  return k;
}

size_t pj_host_pool_class(size_t nbytes) {
  size_t c = PJ_HOST_POOL_PAGE;
  while (c < nbytes) {
    if (c > SIZE_MAX / 2) return 0;
    c <<= 1;
  }
  return c;
}

pj_status_t *pj_host_pool_take(size_t nbytes, void **out, size_t *cap) {
  *out = NULL;
  *cap = 0;
  const size_t c = pj_host_pool_class(nbytes);
  if (!c) return pj_status_new(PJ_ERR_OOM, "out of host memory staging %zu bytes", nbytes);
  const int k = class_index(c);
  pthread_mutex_lock(&mu);
  free_block_t *b = free_lists[k];
  if (b) {
    free_lists[k] = b->next;
    cached_bytes -= c;
  } else {
    allocated_bytes += c; /* counted before the allocation: stats never miss a live block */
  }
  pthread_mutex_unlock(&mu);
  if (!b) {
    b = aligned_alloc(PJ_HOST_POOL_PAGE, c);
    if (!b) {
      pthread_mutex_lock(&mu);
      allocated_bytes -= c;
      pthread_mutex_unlock(&mu);
      return pj_status_new(PJ_ERR_OOM, "out of host memory staging %zu bytes", nbytes);
    }
  }
  *out = b;
  *cap = c;
  return NULL;
}

void pj_host_pool_give(void *p, size_t cap) {
  if (!p) return;
  pthread_mutex_lock(&mu);
  if (cached_bytes + cap <= PJ_HOST_POOL_MAX_CACHED) {
    free_block_t *b = p;
    const int k = class_index(cap);
    b->next = free_lists[k];
    free_lists[k] = b;
    cached_bytes += cap;
    pthread_mutex_unlock(&mu);
    return;
  }
  allocated_bytes -= cap;
  pthread_mutex_unlock(&mu);
  free(p);
}

void pj_host_pool_stats(size_t *allocated, size_t *cached) {
  pthread_mutex_lock(&mu);
  *allocated = allocated_bytes;
  *cached = cached_bytes;
  pthread_mutex_unlock(&mu);
}
