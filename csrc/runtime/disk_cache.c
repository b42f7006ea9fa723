/* Persistent executable cache (see disk_cache.h for the format and the concurrency rules). */
#define _GNU_SOURCE
#include "torch_pjrt/disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "torch_pjrt/metrics.h"

#define MAGIC "PJX1"

typedef struct {
  char magic[4];
  uint32_t reserved;
  uint64_t keylen, bloblen, checksum;
} header_t;

/* Configuration: written by pj_disk_cache_configure, read by lookups/stores under `lock`. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char g_dir[4096];
static int64_t g_max_bytes;
static int64_t g_written_since_scan;

static int mkdirs(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

pj_status_t *pj_disk_cache_configure(const char *dir, int64_t max_bytes) {
  pthread_mutex_lock(&lock);
  pj_status_t *st = NULL;
  if (!dir || !dir[0]) {
    g_dir[0] = 0;
  } else if (mkdirs(dir) != 0) {
    st = pj_status_new(PJ_ERR_RUNTIME, "cannot create the compile cache directory %s: %s", dir,
                       strerror(errno));
    g_dir[0] = 0;
  } else {
    snprintf(g_dir, sizeof g_dir, "%s", dir);
  }
  g_max_bytes = max_bytes;
  pthread_mutex_unlock(&lock);
  return st;
}

const char *pj_disk_cache_dir(void) { return g_dir; }

static uint64_t checksum(const void *key, size_t keylen, const void *blob, size_t bloblen) {
  return pj_hash_bytes(blob, bloblen, pj_hash_bytes(key, keylen, 0x5eed));
}

/* Entry path for a key: two independent 64-bit hashes keep collisions out of the file name;
 * the key stored inside settles any that remain. */
static void entry_path(const void *key, size_t keylen, char *out, size_t cap) {
  snprintf(out, cap, "%s/%016llx%016llx.pjx", g_dir,
           (unsigned long long)pj_hash_bytes(key, keylen, 0),
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

void pj_disk_cache_lookup(const void *key, size_t keylen, pj_program_t **out) {
  *out = NULL;
  char path[4600];
  pthread_mutex_lock(&lock);
  bool enabled = g_dir[0] != 0;
  if (enabled) entry_path(key, keylen, path, sizeof path);
  pthread_mutex_unlock(&lock);
  if (!enabled) return;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    pj_metric_add(PJ_METRIC_DISK_MISSES, 1);
    return;
  }
  struct stat sb;
  header_t h;
  void *blob = NULL, *stored_key = NULL;
  bool ok = fstat(fd, &sb) == 0 && read_all(fd, &h, sizeof h) &&
            memcmp(h.magic, MAGIC, 4) == 0 && h.keylen == keylen &&
            (uint64_t)sb.st_size == sizeof h + h.keylen + h.bloblen && h.bloblen > 0;
  if (ok) {
    stored_key = malloc(keylen ? keylen : 1);
    blob = malloc(h.bloblen);
    ok = stored_key && blob && read_all(fd, stored_key, keylen) &&
         read_all(fd, blob, h.bloblen) &&
         checksum(stored_key, keylen, blob, h.bloblen) == h.checksum;
  }
  close(fd);
  bool same_key = ok && memcmp(stored_key, key, keylen) == 0;
  pj_program_t *p = NULL;
  if (same_key) {
    pj_status_t *st = pj_program_deserialize(blob, h.bloblen, &p);
    if (st) {
      pj_status_free(st);
      ok = false; /* e.g. written by another plugin build: treat as corrupt */
    }
  }
  if (!ok) {
    /* Truncated, damaged or unloadable: remove it so the recompiled program replaces it. */
    pj_metric_add(PJ_METRIC_DISK_CORRUPT, 1);
    unlink(path);
  }
  if (p) {
    pj_metric_add(PJ_METRIC_DISK_HITS, 1);
    pj_metric_add(PJ_METRIC_DISK_BYTES_READ, (int64_t)(sizeof h + keylen + h.bloblen));
    utimensat(AT_FDCWD, path, NULL, 0); /* recently used: evicted last */
    *out = p;
  } else {
    pj_metric_add(PJ_METRIC_DISK_MISSES, 1);
  }
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
 * Another process may delete the same file first: unlink failures are ignored. */
static void evict(const char *dir, int64_t max_bytes) {
  DIR *d = opendir(dir);
  if (!d) return;
  size_t n = 0, cap = 256;
  dir_entry_t *es = malloc(cap * sizeof *es);
  int64_t total = 0;
  struct dirent *de;
  while (es && (de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len < 5 || strcmp(de->d_name + len - 4, ".pjx") != 0 || len >= sizeof es->name) continue;
    char path[4600];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (stat(path, &sb) != 0) continue;
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
      char path[4600];
      snprintf(path, sizeof path, "%s/%s", dir, es[i].name);
      if (unlink(path) == 0) pj_metric_add(PJ_METRIC_DISK_EVICTIONS, 1);
      total -= es[i].size;
    }
  }
  free(es);
}

void pj_disk_cache_store(const void *key, size_t keylen, const pj_program_t *p) {
  char dir[4096], path[4600], tmp[4700];
  pthread_mutex_lock(&lock);
  bool enabled = g_dir[0] != 0;
  int64_t max_bytes = g_max_bytes;
  if (enabled) {
    snprintf(dir, sizeof dir, "%s", g_dir);
    entry_path(key, keylen, path, sizeof path);
  }
  pthread_mutex_unlock(&lock);
  if (!enabled) return;
  void *blob = NULL;
  size_t bloblen = 0;
  pj_status_t *st = pj_program_serialize(p, &blob, &bloblen);
  if (st) {
    pj_status_free(st);
    return;
  }
  static _Atomic uint64_t counter;
  snprintf(tmp, sizeof tmp, "%s/.tmp-%ld-%llu", dir, (long)getpid(),
           (unsigned long long)__atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
  header_t h = {.keylen = keylen, .bloblen = bloblen,
                .checksum = checksum(key, keylen, blob, bloblen)};
  memcpy(h.magic, MAGIC, 4);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write_all(fd, &h, sizeof h) && write_all(fd, key, keylen) &&
            write_all(fd, blob, bloblen) && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  ok = ok && rename(tmp, path) == 0;
  if (!ok) {
    unlink(tmp);
  } else {
    int64_t n = (int64_t)(sizeof h + keylen + bloblen);
    pj_metric_add(PJ_METRIC_DISK_STORES, 1);
    pj_metric_add(PJ_METRIC_DISK_BYTES_WRITTEN, n);
    /* Scanning the directory costs a stat per entry: do it when the bytes written since the
     * last scan could have crossed the bound (or on the first store of the process). */
    pthread_mutex_lock(&lock);
    bool scan = max_bytes > 0 && (g_written_since_scan == 0 || (g_written_since_scan += n) > max_bytes / 16);
    if (scan) g_written_since_scan = 1;
    pthread_mutex_unlock(&lock);
    if (scan) evict(dir, max_bytes);
  }
  free(blob);
}
