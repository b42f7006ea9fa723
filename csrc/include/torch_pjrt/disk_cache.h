/* Persistent executable cache: serialized executables in a directory that many processes (and
 * hosts, on a shared filesystem) may use at once. An entry is one file named by two hashes of
 * the full key (the program's placement, exec.h, as pj_placement_key bytes, then the caller's
 * key); it holds a header, that key itself (compared on load, so a hash collision is a miss)
 * and the serialized executable, with a checksum and, when a secret is configured, an
 * HMAC-SHA256 tag. Writers write a private temporary file and rename it into place (atomic),
 * so readers see whole entries or none; an entry that fails a check is counted as corrupt,
 * removed and recompiled. A size bound evicts the least recently used entries (file
 * modification time, refreshed on every hit). Disabled until pj_disk_cache_configure is
 * called with a directory.
 *
 * Trust: an entry is deserialized into native code, so whoever can write an entry can run
 * code in every process that loads it. By default the directory is created 0700 and entries
 * 0600, and an entry is loaded only when (checked with fstat on the opened descriptors, never
 * on paths, so a file swapped between check and read is not what gets loaded):
 *  - the directory (the one opened at configure time) is owned by this process's effective
 *    user and is not writable by group or others;
 *  - the entry is a regular file (a symlink is refused: O_NOFOLLOW) owned by this user and not
 *    writable by group or others.
 * `shared` (TORCH_PJRT_CACHE_SHARED=1) drops these ownership and mode checks (a directory
 * kept by a team or a service account) and creates files by the process umask instead of
 * 0600/0700; symlinks stay refused. With a secret (TORCH_PJRT_CACHE_KEY) every stored entry
 * carries HMAC-SHA256(secret, le64(keylen) || le64(bloblen) || key || blob) and an entry
 * without a valid tag is refused; that is what makes a shared directory safe against its
 * other writers. A refused entry is a miss (recompiled), is never removed, is counted
 * (disk_cache_refused_entries) and reported through the warning handler, naming the file.
 * `readonly` (TORCH_PJRT_CACHE_READONLY=1): lookups only; nothing is created, written,
 * touched or removed. */
#ifndef TORCH_PJRT_DISK_CACHE_H
#define TORCH_PJRT_DISK_CACHE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "torch_pjrt/exec.h"
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *dir;     /* NULL or "": disabled */
  int64_t max_bytes;   /* <= 0: no size bound */
  bool shared;         /* accept entries/directories of other users, group/world-writable */
  bool readonly;       /* never create, write, touch or remove anything */
  const void *secret;  /* HMAC key of the integrity tags; NULL or secret_len 0: none */
  size_t secret_len;
} pj_disk_cache_options_t;

/* Opens (creating it unless readonly) the directory. The secret is copied (only its HMAC
 * state is kept). On failure the cache is disabled and the status says why. */
pj_status_t *pj_disk_cache_configure_options(const pj_disk_cache_options_t *o);
/* The defaults: private, writable, no secret. */
pj_status_t *pj_disk_cache_configure(const char *dir, int64_t max_bytes);
/* The configured directory ("" when disabled). */
const char *pj_disk_cache_dir(void);
/* *out = the stored program for key, or NULL on a miss (also for unreadable, corrupt or
 * refused entries). */
void pj_disk_cache_lookup(const void *key, size_t keylen, pj_program_t **out);
/* The same for a program of placement `pl` (pj_disk_cache_lookup: portable). A stored program
 * that does not run where pl says is an unusable entry (counted corrupt and replaced). */
void pj_disk_cache_lookup_placed(const pj_placement_t *pl, const void *key, size_t keylen,
                                 pj_program_t **out);
/* Stores p under key and p's own placement (best effort: failures are counted, never
 * reported). */
void pj_disk_cache_store(const void *key, size_t keylen, const pj_program_t *p);

/* Receives each warning (a refused entry, naming its file; a directory stores are skipped
 * for). NULL restores the default, a line on stderr. Called without the cache's lock held,
 * from whichever thread looked up or stored; at most a few dozen times per process (further
 * refusals are only counted). */
typedef void (*pj_disk_cache_warn_fn)(const char *message);
void pj_disk_cache_set_warning_handler(pj_disk_cache_warn_fn fn);
/* The last warning's text ("" if none) into out (truncated to cap, always terminated). */
void pj_disk_cache_last_warning(char *out, size_t cap);
/* The configuration in effect (cache_stats reports it). */
void pj_disk_cache_mode(bool *shared, bool *readonly, bool *keyed);

#ifdef __cplusplus
}
#endif
#endif
