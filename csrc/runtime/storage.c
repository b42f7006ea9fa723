/* Refcounted device storages and the per-device byte accounting behind
 * torch.tpu.memory_allocated(). Accounting counts storage capacity (nbytes) from creation to
 * destruction, as CUDA's caching allocator reports requested bytes. */
#include "torch_pjrt/storage.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
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

/* Per-device budgets (torch.tpu.set_per_process_memory_fraction), stored as budget + 1 so that
 * 0, the initial value, is "no budget" and a budget of 0 bytes stays expressible. */
static _Atomic int64_t limit_plus1[PJ_MAX_ACCOUNTED_DEVICES];
static _Atomic int64_t oom_count[PJ_MAX_ACCOUNTED_DEVICES]; /* refusals by the budget */

static void raise_peak(int device, int64_t now) {
  int64_t peak = atomic_load(&peak_bytes[device]);
  while (now > peak && !atomic_compare_exchange_weak(&peak_bytes[device], &peak, now)) {
  }
}

/* Adds a new storage's bytes to its device's count unless that would pass the device's budget
 * (then nothing is counted and false is returned). The check and the add are one atomic step,
 * so threads allocating at once can never pass the budget together. */
static bool reserve(int device, int64_t nbytes) {
  atomic_fetch_add(&live_count, 1);
  if (device < 0 || device >= PJ_MAX_ACCOUNTED_DEVICES) return true;
  int64_t limit = atomic_load(&limit_plus1[device]) - 1;
  int64_t cur = atomic_load(&bytes_in_use[device]);
  do {
    if (limit >= 0 && nbytes > 0 && cur + nbytes > limit) {
      atomic_fetch_sub(&live_count, 1);
      atomic_fetch_add(&oom_count[device], 1);
      return false;
    }
  } while (!atomic_compare_exchange_weak(&bytes_in_use[device], &cur, cur + nbytes));
  atomic_fetch_add(&live_on[device], 1);
  raise_peak(device, cur + nbytes);
  return true;
}

static void unreserve(int device, int64_t nbytes) {
  atomic_fetch_sub(&live_count, 1);
  if (device < 0 || device >= PJ_MAX_ACCOUNTED_DEVICES) return;
  atomic_fetch_sub(&live_on[device], 1);
  atomic_fetch_sub(&bytes_in_use[device], nbytes);
}

static void put_bytes(char *buf, size_t n, int64_t b) {
  const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
  if (u == 0) snprintf(buf, n, "%lld bytes", (long long)b);
  else snprintf(buf, n, "%.2f %s", v, unit[u]);
}

pj_status_t *pj_storage_new(int device, size_t nbytes, pj_storage_t **out) {
  *out = NULL;
  if (nbytes > (size_t)INT64_MAX)
    return pj_status_new(PJ_ERR_OOM, "tpu out of memory: tried to allocate %zu bytes", nbytes);
  if (!reserve(device, (int64_t)nbytes)) {
    char want[32], have[32], lim[32];
    put_bytes(want, sizeof want, (int64_t)nbytes);
    put_bytes(have, sizeof have, atomic_load(&bytes_in_use[device]));
    put_bytes(lim, sizeof lim, pj_storage_limit(device));
    return pj_status_new(PJ_ERR_OOM,
                         "tpu out of memory. Tried to allocate %s. Device %d has a per-process "
                         "limit of %s (torch.tpu.set_per_process_memory_fraction), of which %s "
                         "is allocated by live tensors",
                         want, device, lim, have);
  }
  pj_storage_t *s = calloc(1, sizeof *s);
  if (!s) {
    unreserve(device, (int64_t)nbytes);
    return pj_status_new(PJ_ERR_OOM, "out of host memory for a storage descriptor");
  }
  s->refs = 1;
  s->device = device;
  s->nbytes = nbytes;
  s->capacity = nbytes;
  s->dtype = PJ_U8;
  s->id = atomic_fetch_add(&next_id, 1);
  s->addr = (uintptr_t)atomic_fetch_add(&next_addr, ((nbytes + 255) & ~(uint64_t)255) + 256);
  *out = s;
  return NULL;
}

void pj_storage_retain(pj_storage_t *s) { __atomic_fetch_add(&s->refs, 1, __ATOMIC_RELAXED); }

void pj_storage_release(pj_storage_t *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  pj_buffer_destroy(s->buf);
  unreserve(s->device, (int64_t)s->nbytes);
  free(s->failed_msg);
  free(s);
}

void pj_storage_swap(pj_storage_t *s, struct PJRT_Buffer *buf, pj_dtype_t dt) {
  pj_storage_swap_padded(s, buf, dt, s->nbytes);
}

void pj_storage_swap_padded(pj_storage_t *s, struct PJRT_Buffer *buf, pj_dtype_t dt,
                            size_t capacity) {
  struct PJRT_Buffer *old = s->buf;
  s->buf = buf;
  s->capacity = buf && capacity > s->nbytes ? capacity : s->nbytes;
  s->dtype = dt;
  s->version++;
  if (old && old != buf) pj_buffer_destroy(old);
  /* every write installs a whole buffer; one that depended on the old contents read them
   * first (pj_storage_materialize), which raised while they were undefined */
  s->failed = false;
  free(s->failed_msg);
  s->failed_msg = NULL;
}

void pj_storage_set_failed(pj_storage_t *s, const pj_status_t *why, const char *what) {
  const char *msg = pj_status_message(why);
  size_t n = strlen(what) + strlen(msg) + 1;
  char *m = malloc(n);
  if (m) snprintf(m, n, "%s%s", what, msg);
  free(s->failed_msg);
  s->failed_msg = m;
  s->failed_code = pj_status_code(why) == PJ_OK ? PJ_ERR_RUNTIME : pj_status_code(why);
  s->failed = true;
}

pj_status_t *pj_storage_readable(const pj_storage_t *s) {
  if (!s->failed) return NULL;
  return pj_status_new(s->failed_code, "%s",
                       s->failed_msg ? s->failed_msg
                                     : "a tensor whose producing op failed (defer_and_fuse)");
}

pj_status_t *pj_storage_materialize(pj_storage_t *s, pj_dtype_t dt) {
  return pj_storage_materialize_padded(s, dt, s->nbytes);
}

pj_status_t *pj_storage_materialize_padded(pj_storage_t *s, pj_dtype_t dt, size_t capacity) {
  PJ_TRY(pj_storage_readable(s));
  size_t item = pj_dtype_info(dt)->itemsize;
  /* An empty storage holds no bytes to reinterpret: it reads as empty in any dtype (a fused
   * run can meet one through a dtype view, e.g. x.view(torch.int32) of an empty float32 x). */
  if (s->buf && s->dtype != dt && s->nbytes == 0) pj_storage_swap(s, NULL, dt);
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
  if (capacity < s->nbytes || capacity % item) capacity = s->nbytes;
  void *zeros = calloc(1, capacity ? capacity : 1);
  if (!zeros) return pj_status_new(PJ_ERR_OOM, "out of host memory zero-filling a storage");
  int64_t n = (int64_t)(capacity / item);
  struct PJRT_Buffer *buf = NULL;
  pj_status_t *st = pj_transfer_to_device(s->device, zeros, dt, &n, 1, &buf);
  free(zeros);
  if (st) return st;
  pj_storage_swap_padded(s, buf, dt, capacity);
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
void pj_storage_set_limit(int device, int64_t bytes) {
  if (device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES)
    atomic_store(&limit_plus1[device], bytes < 0 ? 0 : bytes + 1);
}
int64_t pj_storage_limit(int device) {
  return device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES ? atomic_load(&limit_plus1[device]) - 1
                                                          : -1;
}
int64_t pj_storage_oom_count(int device) {
  return device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES ? atomic_load(&oom_count[device]) : 0;
}
int64_t pj_storage_live_count(void) { return atomic_load(&live_count); }
int64_t pj_storage_live_count_on(int device) {
  return device >= 0 && device < PJ_MAX_ACCOUNTED_DEVICES ? atomic_load(&live_on[device]) : 0;
}
