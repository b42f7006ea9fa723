/* Pieces of the call machinery shared by call.c (one program per op) and defer.c (one program
 * per recorded run of ops, the defer_and_fuse eager mode). */
#ifndef TORCH_PJRT_CALL_INTERNAL_H
#define TORCH_PJRT_CALL_INTERNAL_H
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "torch_pjrt/call.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/hlo.h"
#include "torch_pjrt/index_checks.h"

/* A growable byte string for cache keys. */
typedef struct {
  unsigned char *p;
  size_t len, cap;
  bool failed; /* out of memory: the key is unusable */
} pj_keybuf_t;

void pj_key_put(pj_keybuf_t *k, const void *data, size_t n);
void pj_key_int(pj_keybuf_t *k, int64_t v);
void pj_key_str(pj_keybuf_t *k, const char *s);

/* Appends the call's key: everything that shapes its program (identity first, may be ""),
 * nothing that is only a runtime value (scalar values, storage identities). The key is
 * decodable: pj_call_decode rebuilds an equivalent call from it. */
bool pj_call_key(const pj_call_t *c, const char *identity, pj_keybuf_t *k);
/* Rebuilds a call from a key made by pj_call_key. Strings point into `key`, which must outlive
 * the call; slot storages are NULL and scalar values zero. */
bool pj_call_decode(const unsigned char *key, size_t len, int device, pj_call_t *c);

/* Whether the call writes slot s: some destination in it is non-empty. */
bool pj_call_writes_slot(const pj_call_t *c, int s);

/* Emits the call's lowering and its destination writes into h. in[s] is slot s's whole value
 * before the call (read slots only), scalars[i] the call's scalar arguments. On success full[s]
 * holds every slot's value after the call and written[s] says whether the call wrote slot s
 * (a slot is written iff some destination in it is non-empty). */
struct pj_check_emit;
pj_status_t *pj_call_emit(pj_hlo_t *h, const pj_call_t *c, pj_lower_fn fn, const pj_val_t *in,
                          const pj_val_t *scalars, pj_val_t *full, bool *written,
                          struct pj_check_emit *chk);

/* Seed of a key's second hash: with the first (seed 0) it is a 128-bit digest of an op's key,
 * which stands for the key inside a fused graph's key (pj_graph_key). */
#define PJ_KEY_SEED2 0x6a09e667f3bcc909ull
/* A recorded call's index-check site, "op\0where\0" (malloc'd), or NULL when `where` is NULL
 * (or out of memory: the error then names no line). defer.c. */
char *pj_defer_site(const char *op, const char *where);
/* Records a call in the defer_and_fuse graph (defer.c): key (made by pj_call_key with an empty
 * identity; owned by the recorder from here on, freed on failure too) with its two hashes, the
 * slots (storages borrowed), which slots it writes, its scalar values (copied) and its
 * index-check site ("op\0where\0", owned from here on; NULL for none).
 * each: a Strict call queued behind a background compile (compile_async.h; its key may carry
 * the runtime identity): it joins a graph of such calls, run one by one at the flush; a graph
 * of the other kind is flushed first. */
pj_status_t *pj_defer_record(unsigned char *key, size_t keylen, uint64_t hash, uint64_t hash2,
                             int device, const pj_slot_t *slots, int nslots, const bool *writes,
                             const pj_scalar_t *scalars, int nscalars, char *site, bool each);
/* Runs a call as it was recorded: no size-bucket rewrite and no trims (bucket.h), no flush.
 * defer.c's op-by-op replay, whose later calls were sized against the storages' buffers as
 * the recorded calls leave them. pj_call_run is this after those steps. */
pj_status_t *pj_call_run_as_recorded(pj_call_t *c);
/* Whether the pending graph holds Strict calls queued behind background compiles: a later
 * Strict call is queued behind them too, to keep program order. */
bool pj_defer_each_pending(void);
/* Serializes program execution and the scalar-buffer cache. */
extern pthread_mutex_t pj_run_lock;
/* A scalar argument uploaded as a new 0-d buffer of its dtype on `device` (the caller owns it;
 * no lock needed). */
pj_status_t *pj_scalar_buffer(int device, const pj_scalar_t *s, struct PJRT_Buffer **out);

/* Finds the program for a key: memory cache, then the disk cache, then build(ctx, &text, &len)
 * and compile (stored in both caches). `what` names it in errors (NULL: the caller does). */
pj_status_t *pj_program_for_key(const unsigned char *key, size_t len,
                                pj_status_t *(*build)(void *ctx, char **text, size_t *len),
                                void *ctx, const char *what, pj_program_t **out);
/* The same for a key whose hash (pj_hash_bytes(key, len, 0)) the caller keeps. */
pj_status_t *pj_program_for_hashed_key(uint64_t hash, const unsigned char *key, size_t len,
                                       pj_status_t *(*build)(void *ctx, char **text, size_t *len),
                                       void *ctx, const char *what, pj_program_t **out);

/* Executes prog (caller holds pj_run_lock): arguments are bufs[0..nbufs) (donate[i] says
 * whether bufs[i] is donated) followed by a 0-d buffer per scalar. outs gets nouts buffers.
 * A program with index checks has one result more than nouts: it then also takes the device's
 * check state (index_checks.h) as its last argument and returns the new one, committed with
 * `sites` (the program's ops that may check; their names and source lines). */
pj_status_t *pj_run_program(pj_program_t *prog, int device, struct PJRT_Buffer **bufs,
                            const bool *donate, int nbufs, const pj_scalar_t *scalars,
                            int nscalars, struct PJRT_Buffer **outs, int nouts,
                            const pj_check_site_t *sites, int nsites);

#endif
