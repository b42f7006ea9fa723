/* Persistent executable cache (see disk_cache.h for the format, the concurrency rules and the
 * trust rules). */
#define _GNU_SOURCE
#include "torch_pjrt/disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "program.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/multi_exec.h"
#include "torch_pjrt/sha256.h"

/* PJX2: PJX1 plus flags and the integrity tag. A PJX1 file fails the magic check and is
 * replaced as corrupt (its key names an older build anyway). */
#define MAGIC "PJX2"
#define FLAG_TAGGED 1u /* tag holds the HMAC of the entry under the writer's secret */

typedef struct {
  char magic[4];
  uint32_t flags;
  uint64_t keylen, bloblen, checksum;
  uint8_t tag[PJ_SHA256_DIGEST]; /* zeros unless FLAG_TAGGED */
} header_t;

/* Warnings beyond this many per process are only counted (a directory of thousands of
 * foreign entries must not flood the log); the last one says so. */
#define MAX_WARNINGS 32

/* Configuration: written by pj_disk_cache_configure_options, read by lookups/stores under
 * `lock`. g_dirfd is the directory opened at configure time: entries are opened relative to
 * it, so renaming another directory into the configured path later changes nothing, and its
 * fstat is the directory check. Operations use a dup of it (taken under the lock), so a
 * reconfiguration closing it never leaves an operation with a stale or reused number. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char g_dir[4096];
static int g_dirfd = -1;
static int64_t g_max_bytes;
static int64_t g_written_since_scan;
static bool g_shared, g_readonly, g_keyed;
static pj_hmac_sha256_t g_hmac; /* keyed with the secret; copied per entry */
static pj_disk_cache_warn_fn g_warn;
static char g_last_warning[1024];
static int g_warnings;
static bool g_warned_dir; /* the skipped-stores warning is given once per configuration */

/* Creates path and its missing parents with `mode` (0700 by default: a parent created here,
 * e.g. ~/.cache, is private too). Existing directories keep their modes. */
static int mkdirs(const char *path, mode_t mode) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(tmp, mode) != 0 && errno != EEXIST ? -1 : 0;
}

pj_status_t *pj_disk_cache_configure_options(const pj_disk_cache_options_t *o) {
  pj_status_t *st = NULL;
  const char *dir = o && o->dir ? o->dir : "";
  int fd = -1;
  if (dir[0]) {
    if (!o->readonly && mkdirs(dir, o->shared ? 0777 : 0700) != 0)
      st = pj_status_new(PJ_ERR_RUNTIME, "cannot create the compile cache directory %s: %s",
                         dir, strerror(errno));
    else if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
      st = pj_status_new(PJ_ERR_RUNTIME, "cannot open the compile cache directory %s: %s", dir,
                         strerror(errno));
  }
  pthread_mutex_lock(&lock);
  if (g_dirfd >= 0) close(g_dirfd);
  g_dirfd = fd;
  snprintf(g_dir, sizeof g_dir, "%s", fd >= 0 ? dir : "");
  g_max_bytes = o ? o->max_bytes : 0;
  g_shared = o && o->shared;
  g_readonly = o && o->readonly;
  g_keyed = o && o->secret && o->secret_len > 0;
  if (g_keyed)
    pj_hmac_sha256_init(&g_hmac, o->secret, o->secret_len);
  else
    memset(&g_hmac, 0, sizeof g_hmac);
  g_written_since_scan = 0;
  g_warned_dir = false;
  pthread_mutex_unlock(&lock);
  return st;
}

pj_status_t *pj_disk_cache_configure(const char *dir, int64_t max_bytes) {
  pj_disk_cache_options_t o = {.dir = dir, .max_bytes = max_bytes};
  return pj_disk_cache_configure_options(&o);
}

const char *pj_disk_cache_dir(void) { return g_dir; }

void pj_disk_cache_mode(bool *shared, bool *readonly, bool *keyed) {
  pthread_mutex_lock(&lock);
  *shared = g_shared;
  *readonly = g_readonly;
  *keyed = g_keyed;
  pthread_mutex_unlock(&lock);
}

void pj_disk_cache_set_warning_handler(pj_disk_cache_warn_fn fn) {
  pthread_mutex_lock(&lock);
  g_warn = fn;
  pthread_mutex_unlock(&lock);
}

void pj_disk_cache_last_warning(char *out, size_t cap) {
  if (!cap) return;
  pthread_mutex_lock(&lock);
  snprintf(out, cap, "%s", g_last_warning);
  pthread_mutex_unlock(&lock);
}

/* Records and reports one warning (the handler runs outside the lock: it may call into
 * Python's warning machinery). */
static void warn(const char *fmt, ...) {
  char msg[sizeof g_last_warning];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&lock);
  snprintf(g_last_warning, sizeof g_last_warning, "%s", msg);
  int n = ++g_warnings;
  pj_disk_cache_warn_fn fn = g_warn;
  pthread_mutex_unlock(&lock);
  if (n > MAX_WARNINGS) return;
  char full[sizeof msg + 160];
  snprintf(full, sizeof full, "%s%s", msg,
           n == MAX_WARNINGS ? " (further compile cache warnings of this process are only "
                               "counted: torch.tpu.cache_stats())"
                             : "");
  if (fn)
    fn(full);
  else
    fprintf(stderr, "torch_pjrt: warning: %s\n", full);
}

/* A refused entry: a miss that is counted and reported, naming the file. It is never removed:
 * it may not be ours to remove, and a store of the recompiled program replaces it. */
static void refuse(const char *dir, const char *name, const char *why) {
  pj_metric_add(PJ_METRIC_DISK_REFUSED, 1);
  warn("compile cache entry %s/%s refused (not loaded; the program is compiled instead): %s",
       dir, name, why);
}

/* Why a directory must not be trusted ("" when it may be), from fstat of its descriptor. */
static void check_dir(int dfd, bool shared, char *why, size_t cap) {
  struct stat sb;
  why[0] = 0;
  if (fstat(dfd, &sb) != 0)
    snprintf(why, cap, "cannot stat its directory: %s", strerror(errno));
  else if (shared)
    return;
  else if (sb.st_uid != geteuid())
    snprintf(why, cap,
             "its directory is owned by uid %u, not this user (uid %u); "
             "TORCH_PJRT_CACHE_SHARED=1 accepts it",
             (unsigned)sb.st_uid, (unsigned)geteuid());
  else if (sb.st_mode & (S_IWGRP | S_IWOTH))
    snprintf(why, cap,
             "its directory is writable by %s (mode %04o), so others could plant entries; "
             "chmod go-w it, or TORCH_PJRT_CACHE_SHARED=1 accepts it",
             sb.st_mode & S_IWOTH ? "everyone" : "its group", (unsigned)(sb.st_mode & 07777));
}

/* Why an opened entry must not be trusted ("" when it may be). */
static void check_entry(int fd, bool shared, char *why, size_t cap) {
  struct stat sb;
  why[0] = 0;
  if (fstat(fd, &sb) != 0)
    snprintf(why, cap, "cannot stat it: %s", strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    snprintf(why, cap, "not a regular file");
  else if (shared)
    return;
  else if (sb.st_uid != geteuid())
    snprintf(why, cap,
             "owned by uid %u, not this user (uid %u); TORCH_PJRT_CACHE_SHARED=1 accepts it",
             (unsigned)sb.st_uid, (unsigned)geteuid());
  else if (sb.st_mode & (S_IWGRP | S_IWOTH))
    snprintf(why, cap, "writable by group or others (mode %04o)",
             (unsigned)(sb.st_mode & 07777));
}

static uint64_t checksum(const void *key, size_t keylen, const void *blob, size_t bloblen) {
  return pj_hash_bytes(blob, bloblen, pj_hash_bytes(key, keylen, 0x5eed));
}

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The integrity tag: the lengths first, so no (key, blob) split of the same bytes shares a
 * tag with another. */
static void entry_tag(const pj_hmac_sha256_t *keyed, const void *key, size_t keylen,
                      const void *blob, size_t bloblen, uint8_t out[PJ_SHA256_DIGEST]) {
  pj_hmac_sha256_t c = *keyed;
  uint8_t lens[16];
  put_le64(lens, keylen);
  put_le64(lens + 8, bloblen);
  pj_hmac_sha256_update(&c, lens, sizeof lens);
  pj_hmac_sha256_update(&c, key, keylen);
  pj_hmac_sha256_update(&c, blob, bloblen);
  pj_hmac_sha256_final(&c, out);
}

/* Entry file name for a key: two independent 64-bit hashes keep collisions out of the name;
 * the key stored inside settles any that remain. */
static void entry_name(const void *key, size_t keylen, char *out, size_t cap) {
  snprintf(out, cap, "%016llx%016llx.pjx", (unsigned long long)pj_hash_bytes(key, keylen, 0),
           (unsigned long long)pj_hash_bytes(key, keylen, 0x9e3779b97f4a7c15ull));
}

static bool read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    p += r;
    n -= (size_t)r;
  }
  return true;
}

static bool write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= (size_t)w;
  }
  return true;
}

/* A snapshot of the configuration for one operation; dfd is the caller's to close. */
typedef struct {
  int dfd;
  char dir[4096];
  int64_t max_bytes;
  bool shared, readonly, keyed;
  pj_hmac_sha256_t hmac;
} snapshot_t;

static bool snapshot(snapshot_t *s) {
  pthread_mutex_lock(&lock);
  s->dfd = g_dirfd >= 0 ? fcntl(g_dirfd, F_DUPFD_CLOEXEC, 0) : -1;
  snprintf(s->dir, sizeof s->dir, "%s", g_dir);
  s->max_bytes = g_max_bytes;
  s->shared = g_shared;
  s->readonly = g_readonly;
  s->keyed = g_keyed;
  s->hmac = g_hmac;
  pthread_mutex_unlock(&lock);
  return s->dfd >= 0;
}

/* The key an entry is filed and checked under: the placement's bytes (pj_placement_key: they
 * start with their own length, so no two (placement, key) pairs give the same bytes) and then
 * the caller's key. A portable and a bound compile of one text are two entries. NULL when the
 * placement cannot be named (no runtime) or memory is short: the caller skips the cache. */
static unsigned char *entry_key(const pj_placement_t *pl, const void *key, size_t keylen,
                                size_t *len) {
  unsigned char head[PJ_PLACEMENT_KEY_MAX];
  size_t n = 0;
  pj_status_t *st = pj_placement_key(pl, head, &n);
  if (st) {
    pj_status_free(st);
    return NULL;
  }
  unsigned char *full = malloc(n + keylen);
  if (!full) return NULL;
  memcpy(full, head, n);
  if (keylen) memcpy(full + n, key, keylen);
  *len = n + keylen;
  return full;
}

static void lookup_entry(const pj_placement_t *pl, const void *key, size_t keylen,
                         pj_program_t **out);

/* Whether a directory is configured: checked before an entry key is built, so a disabled
 * cache costs no copy of the key. (The operation's snapshot decides again, under the lock.) */
static bool enabled(void) {
  pthread_mutex_lock(&lock);
  bool on = g_dirfd >= 0;
  pthread_mutex_unlock(&lock);
  return on;
}

void pj_disk_cache_lookup(const void *key, size_t keylen, pj_program_t **out) {
  const pj_placement_t portable = {0, NULL};
  pj_disk_cache_lookup_placed(&portable, key, keylen, out);
}

void pj_disk_cache_lookup_placed(const pj_placement_t *pl, const void *caller_key,
                                 size_t caller_keylen, pj_program_t **out) {
  *out = NULL;
  if (!enabled()) return;
  size_t keylen = 0;
  unsigned char *key = entry_key(pl, caller_key, caller_keylen, &keylen);
  if (!key) {
    pj_metric_add(PJ_METRIC_DISK_MISSES, 1);
    return;
  }
  lookup_entry(pl, key, keylen, out);
  free(key);
}

/* key: the entry key (entry_key). */
static void lookup_entry(const pj_placement_t *pl, const void *key, size_t keylen,
                         pj_program_t **out) {
  snapshot_t s;
  if (!snapshot(&s)) return;
  char name[64], why[512];
  entry_name(key, keylen, name, sizeof name);
  /* O_NOFOLLOW: a symlink planted under an entry's name is refused, not followed (ELOOP).
   * O_NONBLOCK: a FIFO planted there cannot hang the open; it fails the regular-file check. */
  int fd = openat(s.dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) refuse(s.dir, name, "it is a symbolic link");
    pj_metric_add(PJ_METRIC_DISK_MISSES, 1);
    close(s.dfd);
    return;
  }
  check_dir(s.dfd, s.shared, why, sizeof why);
  if (!why[0]) check_entry(fd, s.shared, why, sizeof why);
  if (why[0]) {
    refuse(s.dir, name, why);
    pj_metric_add(PJ_METRIC_DISK_MISSES, 1);
    close(fd);
    close(s.dfd);
    return;
  }
  struct stat sb;
  header_t h;
  void *blob = NULL, *stored_key = NULL;
  /* Structure first (sizes agree with the file), then the tag when keyed (a tampered entry
   * is refused whether or not its checksum was fixed up), else the checksum (damage). */
  bool ok = fstat(fd, &sb) == 0 && read_all(fd, &h, sizeof h) &&
            memcmp(h.magic, MAGIC, 4) == 0 && h.keylen == keylen && h.bloblen > 0 &&
            h.bloblen <= (uint64_t)sb.st_size &&
            (uint64_t)sb.st_size == sizeof h + h.keylen + h.bloblen;
  if (ok) {
    stored_key = malloc(keylen ? keylen : 1);
    blob = malloc(h.bloblen);
    ok = stored_key && blob && read_all(fd, stored_key, keylen) &&
         read_all(fd, blob, h.bloblen);
  }
  bool refused = false;
  if (ok && s.keyed) {
    uint8_t tag[PJ_SHA256_DIGEST];
    if (!(h.flags & FLAG_TAGGED)) {
      refuse(s.dir, name, "it carries no integrity tag and TORCH_PJRT_CACHE_KEY is set");
      refused = true;
    } else {
      entry_tag(&s.hmac, stored_key, keylen, blob, h.bloblen, tag);
      if (!pj_equal_consttime(tag, h.tag, sizeof tag)) {
        refuse(s.dir, name,
               "its integrity tag does not match TORCH_PJRT_CACHE_KEY (tampered with, or "
               "written under another key)");
        refused = true;
      }
    }
  } else if (ok) {
    ok = checksum(stored_key, keylen, blob, h.bloblen) == h.checksum;
  }
  pj_program_t *p = NULL;
  if (ok && !refused && memcmp(stored_key, key, keylen) == 0) {
    pj_status_t *st = pj_program_deserialize_placed(blob, h.bloblen, pl, &p);
    if (st) {
      pj_status_free(st);
      ok = false; /* e.g. written by another plugin build: treat as corrupt */
    }
  }
  if (!ok) {
    /* Truncated, damaged or unloadable: remove it so the recompiled program replaces it
     * (it passed the trust checks, so it is ours to remove, or the directory is shared). */
    pj_metric_add(PJ_METRIC_DISK_CORRUPT, 1);
    if (!s.readonly) unlinkat(s.dfd, name, 0);
  }
  if (p) {
    pj_metric_add(PJ_METRIC_DISK_HITS, 1);
    pj_metric_add(PJ_METRIC_DISK_BYTES_READ, (int64_t)(sizeof h + keylen + h.bloblen));
    if (!s.readonly) futimens(fd, NULL); /* recently used: evicted last */
    *out = p;
  } else {
    pj_metric_add(PJ_METRIC_DISK_MISSES, 1);
  }
  close(fd);
  close(s.dfd);
  free(blob);
  free(stored_key);
}

typedef struct {
  char name[300];
  time_t mtime;
  off_t size;
} dir_entry_t;

static int by_mtime(const void *a, const void *b) {
  const dir_entry_t *x = a, *y = b;
  return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* Deletes least recently used entries until the directory holds at most 90% of the bound.
 * Another process may delete the same file first: unlink failures are ignored. Only regular
 * files named *.pjx are counted or removed (lstat semantics: a symlink is neither). */
static void evict(int dfd, int64_t max_bytes) {
  /* A new open file description of the same directory (not a dup, which would share the
   * read position with every other dup: a second scan would start at the end and see
   * nothing). fdopendir takes it over. */
  int scan_fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = scan_fd >= 0 ? fdopendir(scan_fd) : NULL;
  if (!d) {
    if (scan_fd >= 0) close(scan_fd);
    return;
  }
  size_t n = 0, cap = 256;
  dir_entry_t *es = malloc(cap * sizeof *es);
  int64_t total = 0;
  struct dirent *de;
  while (es && (de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len < 5 || strcmp(de->d_name + len - 4, ".pjx") != 0 || len >= sizeof es->name) continue;
    struct stat sb;
    if (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
      continue;
    if (n == cap) {
      dir_entry_t *grown = realloc(es, 2 * cap * sizeof *es);
      if (!grown) break;
      es = grown;
      cap *= 2;
    }
    snprintf(es[n].name, sizeof es[n].name, "%s", de->d_name);
    es[n].mtime = sb.st_mtime;
    es[n].size = sb.st_size;
    total += sb.st_size;
    n++;
  }
  closedir(d);
  if (es && total > max_bytes) {
    qsort(es, n, sizeof *es, by_mtime);
    for (size_t i = 0; i < n && total > max_bytes / 10 * 9; i++) {
      if (unlinkat(dfd, es[i].name, 0) == 0) pj_metric_add(PJ_METRIC_DISK_EVICTIONS, 1);
      total -= es[i].size;
    }
  }
  free(es);
}

static void store_entry(const void *key, size_t keylen, const pj_program_t *p);

void pj_disk_cache_store(const void *caller_key, size_t caller_keylen, const pj_program_t *p) {
  if (!enabled()) return;
  const pj_placement_t pl = pj_program_placement(p);
  size_t keylen = 0;
  unsigned char *key = entry_key(&pl, caller_key, caller_keylen, &keylen);
  if (!key) return;
  store_entry(key, keylen, p);
  free(key);
}

/* key: the entry key (entry_key). */
static void store_entry(const void *key, size_t keylen, const pj_program_t *p) {
  snapshot_t s;
  if (!snapshot(&s)) return;
  if (s.readonly) {
    close(s.dfd);
    return;
  }
  /* Nothing is stored into a directory lookups would refuse: its entries would never be
   * loaded, and others may be able to replace them. */
  char why[512];
  check_dir(s.dfd, s.shared, why, sizeof why);
  if (why[0]) {
    pthread_mutex_lock(&lock);
    bool first = !g_warned_dir;
    g_warned_dir = true;
    pthread_mutex_unlock(&lock);
    if (first) warn("compile cache directory %s: nothing is stored there: %s", s.dir, why);
    close(s.dfd);
    return;
  }
  void *blob = NULL;
  size_t bloblen = 0;
  pj_status_t *st = pj_program_serialize(p, &blob, &bloblen);
  if (st) {
    pj_status_free(st);
    close(s.dfd);
    return;
  }
  char name[64], tmp[128];
  entry_name(key, keylen, name, sizeof name);
  static _Atomic uint64_t counter;
  snprintf(tmp, sizeof tmp, ".tmp-%ld-%llu", (long)getpid(),
           (unsigned long long)__atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
  header_t h = {.keylen = keylen, .bloblen = bloblen,
                .checksum = checksum(key, keylen, blob, bloblen)};
  memcpy(h.magic, MAGIC, 4);
  if (s.keyed) {
    h.flags |= FLAG_TAGGED;
    entry_tag(&s.hmac, key, keylen, blob, bloblen, h.tag);
  }
  /* 0600: only this user reads or replaces it (the umask can only narrow that). Shared: the
   * umask decides, as for any file meant for a group. O_EXCL|O_NOFOLLOW: never write through
   * something planted under the temporary name. */
  int fd = openat(s.dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  s.shared ? 0666 : 0600);
  bool ok = fd >= 0 && write_all(fd, &h, sizeof h) && write_all(fd, key, keylen) &&
            write_all(fd, blob, bloblen) && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  /* rename is atomic: concurrent readers see the old entry or this one, whole. */
  ok = ok && renameat(s.dfd, tmp, s.dfd, name) == 0;
  if (!ok) {
    unlinkat(s.dfd, tmp, 0);
  } else {
    int64_t n = (int64_t)(sizeof h + keylen + bloblen);
    pj_metric_add(PJ_METRIC_DISK_STORES, 1);
    pj_metric_add(PJ_METRIC_DISK_BYTES_WRITTEN, n);
    /* Scanning the directory costs a stat per entry: do it when the bytes written since the
     * last scan could have crossed the bound (or on the first store of the process). */
    pthread_mutex_lock(&lock);
    bool scan = s.max_bytes > 0 &&
                (g_written_since_scan == 0 || (g_written_since_scan += n) > s.max_bytes / 16);
    if (scan) g_written_since_scan = 1;
    pthread_mutex_unlock(&lock);
    if (scan) evict(s.dfd, s.max_bytes);
  }
  close(s.dfd);
  free(blob);
}
