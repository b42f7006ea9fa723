/* Host staging blocks: page-aligned host memory in power-of-two size classes (4 KiB and up),
 * kept for reuse. Fresh memory costs a page fault per 4 KiB on first touch, about as much as
 * copying into it; a reused block is warm. The staged transport of tpu_dist
 * (csrc/bridge/distributed.cpp) stages collectives' data through these blocks: they leave the
 * pool for the host-side collective and come back after the write-back, or, when a block became
 * a device buffer (a zero-copy upload), when PJRT releases that buffer.
 *
 * Free blocks are kept up to PJ_HOST_POOL_MAX_CACHED bytes in all; a block given back beyond
 * that is freed. The pool lives as long as the process (PJRT may give blocks back from its own
 * threads while the process exits) and is never torn down.
 *
 * Thread safety: every function may be called from any thread, PJRT's callback threads included
 * (pj_host_pool_give never calls into PJRT). */
#ifndef TORCH_PJRT_HOST_POOL_H
#define TORCH_PJRT_HOST_POOL_H
#include <stddef.h>

#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

#define PJ_HOST_POOL_PAGE ((size_t)4096)
#define PJ_HOST_POOL_MAX_CACHED ((size_t)1 << 30)

/* The size class of a block holding nbytes: the smallest power of two >= nbytes, at least one
 * page. 0 when nbytes is too large for any class. */
size_t pj_host_pool_class(size_t nbytes);

/* A block of at least nbytes (its capacity, the size class, in *cap): a free one of that class
 * if the pool has one, else fresh memory. PJ_ERR_OOM when the host has none. */
pj_status_t *pj_host_pool_take(size_t nbytes, void **out, size_t *cap);

/* Gives a block back (cap: the capacity take returned). Keeps it for reuse within the bound,
 * frees it beyond. */
void pj_host_pool_give(void *p, size_t cap);

/* Bytes of blocks alive (in use or free) and of free blocks kept. */
void pj_host_pool_stats(size_t *allocated, size_t *cached);

#ifdef __cplusplus
}
#endif
#endif
