/* The staged transport's transfers (staged_transfer.h) on the CPU plugin: an upload from a
 * host-pool block makes a buffer with the block's values and gives the block back to the pool
 * once PJRT is done with it (on this plugin, which aliases the block, when the buffer is freed);
 * a failed upload leaves the block with the caller; a download started under pj_run_lock and
 * the on-thread copy read a storage's bytes; a never-written storage reads as zeros; a size
 * mismatch and a failed storage are errors, not reads. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "ctest_device.h"
#include "torch_pjrt/host_pool.h"
#include "torch_pjrt/staged_transfer.h"

extern pthread_mutex_t pj_run_lock;

static size_t cached_bytes(void) {
  size_t allocated, cached;
  pj_host_pool_stats(&allocated, &cached);
  return cached;
}

/* The pool's free bytes reach `want` within a few seconds (PJRT releases on its own thread). */
static int cached_reaches(size_t want) {
  for (int i = 0; i < 500; i++) {
    if (cached_bytes() >= want) return 1;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

/* A download of storage s into dst, started under pj_run_lock as the transport does, and
 * awaited; its error, or NULL. */
static pj_status_t *download(pj_storage_t *s, void *dst, size_t nbytes) {
  struct PJRT_Event *ev = NULL;
  pthread_mutex_lock(&pj_run_lock);
  pj_status_t *st = pj_staged_download_start_locked(s, PJ_F32, dst, nbytes, &ev);
  pthread_mutex_unlock(&pj_run_lock);
  return st ? st : pj_event_await(ev, "test download");
}

/* The on-thread copy, under pj_run_lock as the transport calls it. */
static bool copy_here(pj_storage_t *s, void *dst, size_t nbytes) {
  pthread_mutex_lock(&pj_run_lock);
  const bool done = pj_staged_copy_ready_locked(s, dst, nbytes);
  pthread_mutex_unlock(&pj_run_lock);
  return done;
}

int main(void) {
  CTEST_REQUIRE_PLUGIN();
  const int64_t n = 1000;
  void *block;
  size_t cap;
  OK(pj_host_pool_take((size_t)n * sizeof(float), &block, &cap));
  for (int64_t i = 0; i < n; i++) ((float *)block)[i] = (float)i * 0.5f;
  const size_t before = cached_bytes();

  /* upload: the buffer holds the block's values */
  struct PJRT_Buffer *buf = NULL;
  bool zero_copy = false;
  OK(pj_staged_upload(0, block, cap, PJ_F32, n, &buf, &zero_copy));
  EXPECT(buf != NULL);
  float back[1000];
  OK(pj_transfer_to_host(buf, back, sizeof back));
  for (int64_t i = 0; i < n; i++) EXPECT(back[i] == (float)i * 0.5f);
  /* the CPU plugin makes the block itself the buffer, so the block comes back to the pool
   * only once the buffer is freed */
  EXPECT(zero_copy);
  EXPECT(cached_bytes() == before);
  pj_buffer_destroy(buf);
  EXPECT(cached_reaches(before + cap));
  pj_staged_reap();

  /* a failed upload (no such device) leaves the block with the caller */
  OK(pj_host_pool_take((size_t)n * sizeof(float), &block, &cap));
  pj_status_t *st = pj_staged_upload(1 << 20, block, cap, PJ_F32, n, &buf, &zero_copy);
  EXPECT(st != NULL && strstr(pj_status_message(st), "invalid device index"));
  pj_status_free(st);
  memset(block, 0, cap); /* still ours to write */
  /* more elements than the block holds: refused */
  st = pj_staged_upload(0, block, cap, PJ_F32, (int64_t)(cap / sizeof(float)) + 1, &buf,
                        &zero_copy);
  EXPECT(st != NULL);
  pj_status_free(st);
  pj_host_pool_give(block, cap);

  /* downloads of a storage, asynchronous and on this thread */
  float src[1000], dst[1000];
  for (int64_t i = 0; i < n; i++) src[i] = (float)(3 * i - 7);
  pj_storage_t *s = ctest_f32_storage(src, n);
  OK(pj_buffer_await(s->buf));
  memset(dst, 0, sizeof dst);
  OK(download(s, dst, sizeof dst));
  EXPECT(memcmp(src, dst, sizeof dst) == 0);
  memset(dst, 0, sizeof dst);
  EXPECT(copy_here(s, dst, sizeof dst)); /* the CPU plugin's memory is host memory */
  EXPECT(memcmp(src, dst, sizeof dst) == 0);
  /* the wrong size: an error, nothing started */
  st = download(s, dst, sizeof dst - 4);
  EXPECT(st != NULL && !copy_here(s, dst, sizeof dst - 4));
  pj_status_free(st);
  /* a failed storage (a recorded op that failed): its error, never its bytes */
  pj_status_t *why = pj_status_new(PJ_ERR_RUNTIME, "an earlier op failed");
  pj_storage_set_failed(s, why, "test op");
  pj_status_free(why);
  st = download(s, dst, sizeof dst);
  EXPECT(st != NULL && !copy_here(s, dst, sizeof dst));
  pj_status_free(st);
  pj_storage_release(s);

  /* a never-written storage reads as zeros of the given type */
  pj_storage_t *fresh;
  OK(pj_storage_new(0, sizeof dst, &fresh));
  memset(dst, 0xff, sizeof dst);
  OK(download(fresh, dst, sizeof dst));
  for (int64_t i = 0; i < n; i++) EXPECT(dst[i] == 0.0f);
  pj_storage_release(fresh);
  CTEST_DONE();
}
