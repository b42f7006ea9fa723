/* Programs: compile StableHLO text to a loaded executable, cache executables under a key that is
 * computed before any text is built, execute asynchronously. */
#ifndef TORCH_PJRT_EXEC_H
#define TORCH_PJRT_EXEC_H
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif
struct PJRT_Buffer;
struct PJRT_LoadedExecutable;
typedef struct pj_program pj_program_t;

/* Where a program runs. Portable (ndev == 0, devices NULL): compiled for one replica, it runs
 * on whichever device pj_program_execute names. Bound (ndev >= 1): compiled for ndev replicas,
 * replica r on runtime device devices[r], all launched together by pj_program_execute_multi
 * (multi_exec.h). Every cache key includes the placement (cache.c, disk_cache.c): one text
 * compiled portable and for two devices gives two entries. */
typedef struct {
  int ndev;
  const int *devices;
} pj_placement_t;

/* Compiles `text` (StableHLO, MLIR text) for one replica and one partition, portable. */
pj_status_t *pj_program_compile(const char *text, size_t len, pj_program_t **out);
void pj_program_free(pj_program_t *p);
size_t pj_program_num_outputs(const pj_program_t *p);
/* The program's placement; devices points into p (valid while p lives). */
pj_placement_t pj_program_placement(const pj_program_t *p);
/* The plugin's executable, owned by `p` (for measuring the bare PJRT call against ours). */
struct PJRT_LoadedExecutable *pj_program_loaded(const pj_program_t *p);
/* Serialized executable (tied to the plugin build): malloc'd bytes owned by the caller. */
pj_status_t *pj_program_serialize(const pj_program_t *p, void **bytes, size_t *len);
/* A program serialized from a bound one comes back bound to the devices its executable names. */
pj_status_t *pj_program_deserialize(const void *bytes, size_t len, pj_program_t **out);

/* Runs a portable program on `device` (a bound one is refused: pj_program_execute_multi). args[i] for i in donate (bitmask-like array of bools, may be NULL)
 * are donated: the caller must not use them afterwards (they are consumed even on failure of the
 * program itself, but not on a failed launch). outs receives num_outputs new buffers. */
pj_status_t *pj_program_execute(pj_program_t *p, int device, struct PJRT_Buffer *const *args,
                                size_t nargs, const bool *donate, struct PJRT_Buffer **outs);

/* In-memory executable cache. Keys are byte strings plus a placement (the full key, not only
 * its hash, is compared); the functions without a placement argument mean portable, and an
 * insert files a program under its own placement. The cache owns stored programs.
 * Thread-safe. */
uint64_t pj_hash_bytes(const void *data, size_t len, uint64_t seed);
pj_program_t *pj_cache_lookup(const void *key, size_t keylen);
/* The same with the key's hash given: hash must be pj_hash_bytes(key, keylen, 0). For callers
 * that look one long key up again and again (a compiled graph's plan on every run). */
pj_program_t *pj_cache_lookup_hashed(uint64_t hash, const void *key, size_t keylen);
/* Inserts (takes ownership of p). If the key is already present, frees p and returns the
 * existing one. */
pj_program_t *pj_cache_lookup_placed(const pj_placement_t *pl, const void *key, size_t keylen);
pj_program_t *pj_cache_insert(const void *key, size_t keylen, pj_program_t *p);
size_t pj_cache_size(void);
void pj_cache_clear(void);

#ifdef __cplusplus
}
#endif
#endif
