/* Storages: the device memory behind PyTorch's StorageImpl. A storage is a refcounted object
 * holding one 1-D PJRT buffer of `nbytes / itemsize(dtype)` elements, or no buffer yet (a fresh
 * allocation reads as zeros). Buffers are immutable; writes produce a new buffer that replaces
 * the old one (pj_storage_swap), so every tensor sharing the storage sees the write.
 * Invariant: buf == NULL or buf holds exactly `capacity` bytes of element type `dtype`, where
 * capacity >= nbytes. capacity == nbytes except after a write by a size-bucketed program
 * (csrc/graph/bucket.c), whose buffer is padded to its bucket: the bytes past nbytes are
 * padding no tensor can reach. */
#ifndef TORCH_PJRT_STORAGE_H
#define TORCH_PJRT_STORAGE_H
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include "torch_pjrt/status.h"
#include "torch_pjrt/dtype.h"
#ifdef __cplusplus
extern "C" {
#endif

struct PJRT_Buffer;

typedef struct pj_storage {
  int refs;                 /* atomic; see pj_storage_retain/release */
  int device;
  size_t nbytes;
  size_t capacity;          /* bytes of buf: nbytes, or more for a padded (bucketed) buffer */
  size_t pending_capacity;  /* while pending: bytes of the buffer the recorded write installs */
  pj_dtype_t dtype;         /* element type of buf; meaningful when buf != NULL */
  struct PJRT_Buffer *buf;  /* owned; NULL until first written */
  uint64_t id;              /* unique per storage, for debugging and pending-graph text */
  uint64_t version;         /* bumped by every pj_storage_swap: (id, version) names one buffer
                               and so one content (buffers are immutable), never reused */
  int pending;              /* nonzero while a deferred (defer_and_fuse) op that writes this
                               storage is recorded but not yet run: buf is stale then, and
                               dtype is the element type the recorded write produces */
  uintptr_t addr;           /* fake device address: [addr, addr + nbytes) is disjoint from every
                               other storage's range and never reused; never dereferenced */
  bool failed;              /* the contents are undefined: a recorded (defer_and_fuse) op that
                               was to write them failed or never ran. Reads raise failed_code
                               with failed_msg (pj_storage_readable) until a write replaces the
                               whole contents (pj_storage_swap), as CPU would have raised at
                               that op and never produced them */
  pj_code_t failed_code;
  char *failed_msg;         /* owned; NULL when there was no memory to copy the message */
} pj_storage_t;

pj_status_t *pj_storage_new(int device, size_t nbytes, pj_storage_t **out);
/* The bytes of the buffer the next program reading the storage gets: after the recorded write
 * when pending, else now's (nbytes for a storage without a buffer). */
static inline size_t pj_storage_next_capacity(const pj_storage_t *s) {
  return s->pending ? s->pending_capacity : s->capacity;
}
void pj_storage_retain(pj_storage_t *s);
void pj_storage_release(pj_storage_t *s);
/* Installs `buf` (of element type dt, exactly nbytes) as the storage's contents, destroying the
 * previous one; the storage's contents are defined again (clears `failed`). */
void pj_storage_swap(pj_storage_t *s, struct PJRT_Buffer *buf, pj_dtype_t dt);
/* The same for a buffer of `capacity` bytes (>= nbytes): a padded buffer, whose first nbytes
 * are the contents. */
void pj_storage_swap_padded(pj_storage_t *s, struct PJRT_Buffer *buf, pj_dtype_t dt,
                            size_t capacity);
/* Makes sure the storage has a buffer of element type dt (zeros if it had none); converts the
 * element type by reinterpretation when the storage holds another type of the same byte size
 * is not supported and returns PJ_ERR_UNIMPLEMENTED. */
pj_status_t *pj_storage_materialize(pj_storage_t *s, pj_dtype_t dt);
/* The same where the caller reads the storage as a buffer of `capacity` bytes (>= nbytes; a
 * bucketed program, bucket.h): a never-written storage gets zeros of that size. */
pj_status_t *pj_storage_materialize_padded(pj_storage_t *s, pj_dtype_t dt, size_t capacity);
/* Marks the storage's contents undefined (see `failed`): `why` (a status; not consumed) is the
 * failed op's error, `what` a sentence prefixed to its message. Reads raise until the next
 * whole write. */
void pj_storage_set_failed(pj_storage_t *s, const pj_status_t *why, const char *what);
/* NULL when the storage's contents may be read; else the error its reads raise (pj_storage_
 * materialize checks it first, so every program input and host copy does). */
pj_status_t *pj_storage_readable(const pj_storage_t *s);

/* Bytes held by live storages on a device, and the peak since the last reset. */
int64_t pj_storage_bytes_in_use(int device);
int64_t pj_storage_peak_bytes(int device);
void pj_storage_reset_peak(int device);
/* A per-device budget for the bytes of live storages (negative: none, the default; the getter
 * answers -1 then). pj_storage_new
 * fails with PJ_ERR_OOM, counting nothing, when a storage would take its device past it. A
 * budget below what is already allocated stops new allocations only. */
void pj_storage_set_limit(int device, int64_t bytes);
int64_t pj_storage_limit(int device);
/* How many allocations the budget has refused on a device (torch.tpu.memory_stats' num_ooms). */
int64_t pj_storage_oom_count(int device);
/* Live storages in the process, and on one device (0 for an index out of range). */
int64_t pj_storage_live_count(void);
int64_t pj_storage_live_count_on(int device);

#ifdef __cplusplus
}
#endif
#endif
