/* Refcounted device storages and the per-device byte accounting behind
 * torch.tpu.memory_allocated(). Accounting counts storage capacity (nbytes) from creation to
 * destruction, as CUDA's caching allocator reports requested bytes. */
#include "torch_pjrt/storage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "torch_pjrt/transfer.h"

#define PJ_MAX_ACCOUNTED_DEVICES 64

static _Atomic int64_t bytes_in_use[PJ_MAX_ACCOUNTED_DEVICES];
static _Atomic int64_t peak_bytes[PJ_MAX_ACCOUNTED_DEVICES];
static _Atomic int64_t live_count;
static _Atomic int64_t live_on[PJ_MAX_ACCOUNTED_DEVICES];
static _Atomic uint64_t next_id = 1;
/* Fake address space for DataPtrs: starts high and non-zero, grows by each storage's size
 * rounded up to 256 bytes (plus 256 so even empty storages get distinct addresses). */
static _Atomic uint64_t next_addr = (uint64_t)1 << 44;

/* A storage's bytes and its count on its device: added at creation, removed at destruction
 * (count = +1 / -1). */
static void account(int device, int64_t delta, int count) {
  atomic_fetch_add(&live_count, count);
  if (device < 0 || device >= PJ_MAX_ACCOUNTED_DEVICES) return;
  atomic_fetch_add(&live_on[device], count);
  int64_t now = atomic_fetch_add(&bytes_in_use[device], delta) + delta;
  int64_t peak = atomic_load(&peak_bytes[device]);
  while (now > peak && !atomic_compare_exchange_weak(&peak_bytes[device], &peak, now)) {
  }
}

pj_status_t *pj_storage_new(int device, size_t nbytes, pj_storage_t **out) {
  pj_storage_t *s = calloc(1, sizeof *s);
  if (!s) return pj_status_new(PJ_ERR_OOM, "out of host memory for a storage descriptor");
  s->refs = 1;
  s->device = device;
  s->nbytes = nbytes;
  s->dtype = PJ_U8;
  s->id = atomic_fetch_add(&next_id, 1);
  s->addr = (uintptr_t)atomic_fetch_add(&next_addr, ((nbytes + 255) & ~(uint64_t)255) + 256);
  account(device, (int64_t)nbytes, 1);
  *out = s;
  return NULL;
}

void pj_storage_retain(pj_storage_t *s) { __atomic_fetch_add(&s->refs, 1, __ATOMIC_RELAXED); }

void pj_storage_release(pj_storage_t *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  pj_buffer_destroy(s->buf);
  account(s->device, -(int64_t)s->nbytes, -1);
  free(s);
}

void pj_storage_swap(pj_storage_t *s, struct PJRT_Buffer *buf, pj_dtype_t dt) {
  struct PJRT_Buffer *old = s->buf;
  s->buf = buf;
  s->dtype = dt;
  if (old && old != buf) pj_buffer_destroy(old);
}

pj_status_t *pj_storage_materialize(pj_storage_t *s, pj_dtype_t dt) {
  size_t item = pj_dtype_info(dt)->itemsize;
  if (s->buf) {
    if (s->dtype == dt) return NULL;
    return pj_status_new(PJ_ERR_UNIMPLEMENTED,
                         "reading a storage holding %s as %s (a dtype-reinterpreting view) is "
                         "not supported yet",
                         pj_dtype_info(s->dtype)->name, pj_dtype_info(dt)->name);
  }
  if (s->nbytes % item)
    return pj_status_new(PJ_ERR_RUNTIME, "storage of %zu bytes is not a whole number of %s",
                         s->nbytes, pj_dtype_info(dt)->name);
  /* A never-written storage reads as zeros (torch.empty promises nothing; zeros are the
   * deterministic choice and cost one upload). */
  void *zeros = calloc(1, s->nbytes ? s->nbytes : 1);
  if (!zeros) return pj_status_new(PJ_ERR_OOM, "out of host memory zero-filling a storage");
  int64_t n = (int64_t)(s->nbytes / item);
  struct PJRT_Buffer *buf = NULL;
  pj_status_t *st = pj_transfer_to_device(s->device, zeros, dt, &n, 1, &buf);
  free(zeros);
  if (st) return st;
  pj_storage_swap(s, buf, dt);
  return NULL;
}

int64_t pj_storage_bytes_in_use(int device) {
  return device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES ? atomic_load(&bytes_in_use[device]) : 0;
}
int64_t pj_storage_peak_bytes(int device) {
  return device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES ? atomic_load(&peak_bytes[device]) : 0;
}
void pj_storage_reset_peak(int device) {
  if (device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES)
    atomic_store(&peak_bytes[device], atomic_load(&bytes_in_use[device]));
}
int64_t pj_storage_live_count(void) { return atomic_load(&live_count); }
int64_t pj_storage_live_count_on(int device) {
  return device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES ? atomic_load(&live_on[device]) : 0;
}
