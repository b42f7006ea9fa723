/* Transfers of the staged tpu_dist transport (csrc/bridge/distributed.cpp): uploads from host
 * staging blocks (host_pool.h) that hand the block to PJRT and get it back when PJRT is done with
 * it, and downloads started without waiting, which report completion by a PJRT event. The
 * runtime's own copies (transfer.h) are blocking and allocate their host memory; these are not.
 *
 * Thread safety: every function may be called from any thread. PJRT calls the upload's release
 * callback on its own threads; the events it fired are destroyed later on a caller's thread
 * (pj_staged_reap), because the C API does not promise that destroying an event inside its own
 * callback is safe. */
#ifndef TORCH_PJRT_STAGED_TRANSFER_H
#define TORCH_PJRT_STAGED_TRANSFER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "torch_pjrt/dtype.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/storage.h"
#ifdef __cplusplus
extern "C" {
#endif

struct PJRT_Buffer;
struct PJRT_Event;

/* A 1-D buffer of n elements of type dt on `device` holding the first bytes of `block`, a
 * host-pool block of capacity `cap`. On success the block belongs to the runtime: nothing may
 * write it, and it returns to the pool once PJRT is done with it (copied, or, where the plugin
 * made the block itself the buffer, once that buffer is freed). *zero_copy says whether the
 * plugin aliased the block (confirmed through PJRT_Buffer_UnsafePointer; false when it cannot
 * be told). On failure the caller still owns the block. */
pj_status_t *pj_staged_upload(int device, void *block, size_t cap, pj_dtype_t dt, int64_t n,
                              struct PJRT_Buffer **out, bool *zero_copy);

/* Starts copying storage s's whole buffer (nbytes, which must be s's size) into dst and returns
 * in *ev the event that fires when the bytes are on the host (await it with pj_event_await,
 * transfer.h).
 * Bytes are bytes: the buffer may hold another element type than `dt`; a never-written storage
 * is first materialized as zeros of type dt, and a padded one trimmed (bucket.h). The caller
 * holds pj_run_lock: a program run on another thread could otherwise replace (and destroy) the
 * buffer between the lookup and the enqueue; once enqueued, the copy is safe from that. */
pj_status_t *pj_staged_download_start_locked(pj_storage_t *s, pj_dtype_t dt, void *dst,
                                             size_t nbytes, struct PJRT_Event **ev);

/* Where device memory is host memory (the CPU plugin) and s's buffer is already computed,
 * copies its nbytes into dst right here (the caller holds pj_run_lock, as for a download's
 * start): small copies cost less than the hand-off to PJRT's copy threads and back. Returns
 * false when it cannot; the caller then starts a download. */
bool pj_staged_copy_ready_locked(pj_storage_t *s, void *dst, size_t nbytes);

/* Destroys the events of finished uploads (called by pj_staged_upload; callers that wait on
 * downloads call it too, so that events do not pile up between uploads). */
void pj_staged_reap(void);

#ifdef __cplusplus
}
#endif
#endif
