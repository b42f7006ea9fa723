/* Background compiles for Strict mode (issue 34, first-call latency): an op whose program is
 * not cached has its StableHLO built on the calling thread (so a lowering's error is raised at
 * the op, as before) and compiled by a pool of worker threads while Python runs ahead; the op
 * itself is recorded in the pending graph (defer.c, "each" kind) and runs at the next
 * synchronizing point, after its program is ready.
 *
 * A compile job is keyed by the program's full cache key (pj_call_key with the runtime
 * identity). A finished job keeps its program (or its error) until someone takes it: the
 * program then enters the memory cache under the taker's run lock (the cache's inserts and
 * evictions happen under pj_run_lock, which a worker never takes: a thread that waits for a
 * job while holding that lock cannot deadlock with the worker).
 *
 * Threads: TORCH_PJRT_COMPILE_THREADS (default: online CPUs, at most 4; 0 turns background
 * compiles off, every compile then happens in the op, as before). Workers start on first use.
 * Thread-safe. */
#ifndef TORCH_PJRT_COMPILE_ASYNC_H
#define TORCH_PJRT_COMPILE_ASYNC_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "torch_pjrt/exec.h"
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Whether background compiles are on (a thread count above 0). */
bool pj_async_compile_enabled(void);
int pj_async_compile_threads(void);
/* Sets the worker count for later submits (0: off). Workers already started finish their jobs
 * and stay; a lower count only stops new ones from starting. */
void pj_async_compile_set_threads(int n);

/* Queues a compile of `text` (taken: freed by the pool) under key (copied; hash is
 * pj_hash_bytes(key, keylen, 0)). `what` (copied) names the op in a compile error. An error
 * means nothing was queued (out of memory, no thread could start): text is freed and the
 * caller compiles in place. */
pj_status_t *pj_async_compile_submit(uint64_t hash, const unsigned char *key, size_t keylen,
                                     char *text, size_t textlen, const char *what);
/* Whether a job for the key exists (queued, compiling, or finished and not yet taken). */
bool pj_async_compile_pending(uint64_t hash, const unsigned char *key, size_t keylen);
/* Takes the key's job, waiting for it to finish: *found says whether there was one; then either
 * *out is its program (owned by the caller) or the return is its compile error. When another
 * thread took the same job first, *out is NULL with no error: look in the memory cache again. */
pj_status_t *pj_async_compile_take(uint64_t hash, const unsigned char *key, size_t keylen,
                                   bool *found, pj_program_t **out);
/* Waits until no job is queued or compiling (finished ones stay to be taken): counters such as
 * torch.tpu.metrics()'s compiles are then final for everything submitted so far. */
void pj_async_compile_wait_idle(void);

#ifdef __cplusplus
}
#endif
#endif
