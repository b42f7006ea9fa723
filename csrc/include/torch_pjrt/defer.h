/* The defer_and_fuse eager mode: lowered op calls are recorded into one pending graph over
 * storages instead of running; a flush turns the whole run into one program (cached under a
 * structural key computed from the recorded call keys, without building text), executes it and
 * installs the results. Storages written by recorded ops are marked pending (see storage.h).
 *
 * Invariants:
 *  - Program order: anything that runs immediately (pj_call_run, transfers started by the
 *    bridge, CPU fallbacks) flushes first, so device effects happen in program order.
 *  - Only storages that a live tensor still references (refcount above the graph's own) are
 *    results of the fused program; other intermediates are never materialized.
 *  - A storage whose old buffer is read and which is rewritten donates that buffer.
 * Thread-safe: one graph per process, guarded by a mutex. */
#ifndef TORCH_PJRT_DEFER_H
#define TORCH_PJRT_DEFER_H
#include <stdbool.h>
#include <stdint.h>
#include "torch_pjrt/call.h"
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Records the call (its storages are retained until the flush). May flush first: when the
 * graph is at its size bound, when the call is on another device, or at a detected loop
 * iteration boundary. */
pj_status_t *pj_call_defer(pj_call_t *c);
/* Runs the pending graph, if any. Cheap when nothing is pending. */
pj_status_t *pj_defer_flush(void);
/* Runs the pending graph if it holds Strict calls queued behind background compiles (see
 * pj_call_run_async), leaving a defer_and_fuse graph alone: what reads counters or memory
 * statistics calls it, so they count what Strict would have run by then. */
pj_status_t *pj_defer_flush_queued(void);
/* Number of recorded ops not yet run in the graph the calling thread records into (the capture
 * it records into, capture.h, else the shared graph). */
int pj_defer_pending_ops(void);
/* The pending graph as text, one recorded op per line (malloc'd; the caller frees it). */
char *pj_defer_graph_text(void);
/* Size bound: a graph is flushed before it exceeds this many ops (default 64, at least 1; see defer.c). */
void pj_defer_set_max_ops(int n);
int pj_defer_max_ops(void);
/* Forgets the learned loop period (tests). */
void pj_defer_reset_detector(void);

#ifdef __cplusplus
}
#endif
#endif
