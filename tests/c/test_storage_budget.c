/* The per-device budget of storage.c (torch.tpu.set_per_process_memory_fraction): an allocation
 * past it fails with PJ_ERR_OOM and counts nothing; freeing makes room; a 0-byte budget still
 * admits empty storages; threads racing for the last bytes never pass the budget together.
 * Needs no plugin: storages get their buffers only when written. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/storage.h"

#define DEV 3 /* a device index no other test uses; the counters are per index */

static _Atomic int granted;

static void *grab(void *arg) {
  (void)arg;
  pj_storage_t *s = NULL;
  pj_status_t *st = pj_storage_new(DEV, 100, &s);
  if (!st) {
    atomic_fetch_add(&granted, 1);
    return s; /* released by main */
  }
  pj_status_free(st);
  return NULL;
}

int main(void) {
  EXPECT(pj_storage_limit(DEV) == -1); /* no budget by default */
  pj_storage_t *a = NULL, *b = NULL, *z = NULL;
  int64_t base = pj_storage_bytes_in_use(DEV);
  pj_storage_set_limit(DEV, base + 1000);
  EXPECT(pj_storage_limit(DEV) == base + 1000);
  OK(pj_storage_new(DEV, 600, &a));
  pj_status_t *st = pj_storage_new(DEV, 600, &b);
  EXPECT(st && pj_status_code(st) == PJ_ERR_OOM && b == NULL);
  if (st) {
    EXPECT(strstr(pj_status_message(st), "Tried to allocate 600 bytes") != NULL);
    pj_status_free(st);
  }
  EXPECT(pj_storage_bytes_in_use(DEV) == base + 600); /* the failed one counted nothing */
  EXPECT(pj_storage_oom_count(DEV) == 1);
  pj_storage_release(a);
  OK(pj_storage_new(DEV, 600, &b)); /* room again */
  pj_storage_release(b);

  pj_storage_set_limit(DEV, 0);
  OK(pj_storage_new(DEV, 0, &z)); /* empty storages always fit */
  st = pj_storage_new(DEV, 1, &a);
  EXPECT(st && pj_status_code(st) == PJ_ERR_OOM);
  pj_status_free(st);
  pj_storage_release(z);

  /* 16 threads, room for 5 storages of 100 bytes */
  pj_storage_set_limit(DEV, pj_storage_bytes_in_use(DEV) + 550);
  pthread_t th[16];
  void *got[16];
  for (int i = 0; i < 16; i++) pthread_create(&th[i], NULL, grab, NULL);
  for (int i = 0; i < 16; i++) pthread_join(th[i], &got[i]);
  EXPECT(atomic_load(&granted) == 5);
  EXPECT(pj_storage_oom_count(DEV) == 2 + 11);
  EXPECT(pj_storage_bytes_in_use(DEV) == base + 500);
  for (int i = 0; i < 16; i++) pj_storage_release(got[i]);
  EXPECT(pj_storage_bytes_in_use(DEV) == base);

  pj_storage_set_limit(DEV, -1);
  EXPECT(pj_storage_limit(DEV) == -1);
  CTEST_DONE();
}
