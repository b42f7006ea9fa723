/* Persistent executable cache: serialized executables in a directory that many processes (and
 * hosts, on a shared filesystem) may use at once. An entry is one file named by two hashes of
 * the full key; it holds a header, the key itself (compared on load, so a hash collision is a
 * miss) and the serialized executable, with a checksum. Writers write a private temporary file
 * and rename it into place (atomic), so readers see whole entries or none; an entry that fails
 * any check is counted as corrupt, removed and recompiled. A size bound evicts the least
 * recently used entries (file modification time, refreshed on every hit). Disabled until
 * pj_disk_cache_configure is called with a directory. */
#ifndef TORCH_PJRT_DISK_CACHE_H
#define TORCH_PJRT_DISK_CACHE_H
#include <stddef.h>
#include <stdint.h>
#include "torch_pjrt/exec.h"
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* dir NULL or "" disables the cache. max_bytes <= 0: no size bound. Creates dir if needed. */
pj_status_t *pj_disk_cache_configure(const char *dir, int64_t max_bytes);
/* The configured directory ("" when disabled). */
const char *pj_disk_cache_dir(void);
/* *out = the stored program for key, or NULL on a miss (also for unreadable/corrupt entries). */
void pj_disk_cache_lookup(const void *key, size_t keylen, pj_program_t **out);
/* Stores p under key (best effort: failures are counted, never reported). */
void pj_disk_cache_store(const void *key, size_t keylen, const pj_program_t *p);

#ifdef __cplusplus
}
#endif
#endif
