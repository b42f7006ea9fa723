/* In-memory executable cache: an open hash table keyed by the full key bytes. Guarded by
 * `lock` because PyTorch may dispatch from several threads.
 *
 * Bounded: every loaded executable holds code mappings, and a process that compiles many
 * thousands of programs (a long conformance run, a model at many shapes) would run out of
 * them (the kernel's map count limit) and crash inside the compiler. Above PJ_CACHE_MAX
 * programs (TORCH_PJRT_PROGRAM_CACHE_MAX, default 4096) the least recently used quarter is
 * freed; the persistent cache still holds them, so a later use reloads instead of compiling.
 * The count alone is not enough: an executable holds from 2 to more than 12 mappings (one set
 * per compiled kernel; PyTorch's index_reduce tests reached 51,000 of the 65,530 allowed with
 * 4096 scatter programs and died in the compiler's mmap). So every MAP_CHECK_EVERY inserts the
 * process's mappings are counted too (Linux: /proc/self/maps), and above half the kernel's
 * limit (vm.max_map_count, or TORCH_PJRT_MAP_BUDGET mappings) a quarter is freed as well.
 * Callers use a program only while holding the call machinery's run lock, under which inserts
 * (and so evictions) also happen; evicted programs are freed after the device finished
 * everything launched, as an execution may still reference its executable. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "torch_pjrt/exec.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/multi_exec.h"
#include "torch_pjrt/stream.h"

/* An entry's identity is (key bytes, placement of its program): the same text compiled portable
 * and for two devices is two programs under one key. The placement is read from the stored
 * program itself, so an insert can never file a program under another placement; `hash` is the
 * key's hash mixed with it (pj_placement_hash: unchanged for portable programs). */
typedef struct entry {
  struct entry *next;
  uint64_t hash;
  uint64_t last_use; /* value of use_clock at the last lookup or insert */
  size_t keylen;
  pj_program_t *prog;
  unsigned char key[];
} entry_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t **buckets;
static size_t nbuckets, nentries;
static uint64_t use_clock;

static size_t cache_max(void) {
  static size_t max;
  if (!max) {
    const char *v = getenv("TORCH_PJRT_PROGRAM_CACHE_MAX");
    long n = v ? strtol(v, NULL, 10) : 0;
    max = n >= 16 ? (size_t)n : 4096;
  }
  return max;
}

#define MAP_CHECK_EVERY 32

/* Half of the kernel's per-process mapping limit (0 where there is none to read), or
 * TORCH_PJRT_MAP_BUDGET (mappings; for tests). */
static long map_budget(void) {
  static long budget = -1;
  if (budget < 0) {
    const char *v = getenv("TORCH_PJRT_MAP_BUDGET");
    if (v && strtol(v, NULL, 10) > 0) return budget = strtol(v, NULL, 10);
    long limit = 0;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
      if (fscanf(f, "%ld", &limit) != 1) limit = 0;
      fclose(f);
    }
    budget = limit > 0 ? limit / 2 : 0;
  }
  return budget;
}

/* The process's memory mappings now (lines of /proc/self/maps), or -1 when unknown. */
static long count_maps(void) {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[65536];
  long lines = 0;
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n; i++) lines += buf[i] == '\n';
  close(fd);
  return n < 0 ? -1 : lines;
}

/* Whether this insert should also free programs for the map budget (checked every
 * MAP_CHECK_EVERY inserts; called without the lock: reading the maps takes a while). */
static bool over_map_budget(void) {
  static atomic_uint inserts;
  if (atomic_fetch_add(&inserts, 1) % MAP_CHECK_EVERY != MAP_CHECK_EVERY - 1) return false;
  long budget = map_budget();
  return budget > 0 && count_maps() > budget;
}

/* 64-bit multiply-mix finalizer (splitmix64's): every input bit affects every output bit. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t pj_hash_bytes(const void *data, size_t len, uint64_t seed) {
  /* Eight bytes per step (a compiled graph's key is tens of kilobytes and is hashed on every
   * run; a byte-wise hash cost more than the rest of the run's host work). Deterministic across
   * processes and hosts of either endianness reading the same bytes little-endian, which the
   * persistent cache's file names rely on; the full key stored with each entry settles
   * collisions. */
  const unsigned char *p = data;
  uint64_t h = mix64(seed ^ ((uint64_t)len * 0x9e3779b97f4a7c15ull));
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w = 0;
    for (int b = 0; b < 8; b++) w |= (uint64_t)p[i + (size_t)b] << (8 * b);
    h = (h ^ (w * 0xff51afd7ed558ccdull)) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  for (int b = 0; i < len; i++, b++) tail |= (uint64_t)p[i] << (8 * b);
  return mix64(h ^ (tail * 0xff51afd7ed558ccdull));
}

static const pj_placement_t kPortable = {0, NULL};

/* h: the key's hash already mixed with pl (pj_placement_hash). */
static entry_t *find(uint64_t h, const pj_placement_t *pl, const void *key, size_t keylen) {
  if (!nbuckets) return NULL;
  for (entry_t *e = buckets[h % nbuckets]; e; e = e->next) {
    if (e->hash != h || e->keylen != keylen || memcmp(e->key, key, keylen) != 0) continue;
    const pj_placement_t have = pj_program_placement(e->prog);
    if (pj_placement_equal(&have, pl)) return e;
  }
  return NULL;
}

static pj_program_t *lookup(uint64_t h, const pj_placement_t *pl, const void *key,
                            size_t keylen) {
  pthread_mutex_lock(&lock);
  entry_t *e = find(h, pl, key, keylen);
  if (e) e->last_use = ++use_clock;
  pj_program_t *p = e ? e->prog : NULL;
  pthread_mutex_unlock(&lock);
  pj_metric_add(e ? PJ_METRIC_CACHE_HITS : PJ_METRIC_CACHE_MISSES, 1);
  return p;
}

pj_program_t *pj_cache_lookup(const void *key, size_t keylen) {
  return pj_cache_lookup_hashed(pj_hash_bytes(key, keylen, 0), key, keylen);
}

pj_program_t *pj_cache_lookup_hashed(uint64_t h, const void *key, size_t keylen) {
  return lookup(h, &kPortable, key, keylen);
}

pj_program_t *pj_cache_lookup_placed(const pj_placement_t *pl, const void *key, size_t keylen) {
  return lookup(pj_placement_hash(pl, pj_hash_bytes(key, keylen, 0)), pl, key, keylen);
}

static void grow(void) {
  size_t n = nbuckets ? nbuckets * 2 : 256;
  entry_t **nb = calloc(n, sizeof *nb);
  if (!nb) return; /* keep the old table: lookups stay correct, only slower */
  for (size_t i = 0; i < nbuckets; i++) {
    entry_t *e = buckets[i];
    while (e) {
      entry_t *next = e->next;
      e->next = nb[e->hash % n];
      nb[e->hash % n] = e;
      e = next;
    }
  }
  free(buckets);
  buckets = nb;
  nbuckets = n;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Unlinks the least recently used quarter of the entries onto *dead (caller holds lock). */
static void evict_oldest(entry_t **dead) {
  uint64_t *uses = malloc(sizeof *uses * (nentries + 1));
  if (!uses) return;
  size_t n = 0;
  for (size_t i = 0; i < nbuckets; i++)
    for (entry_t *e = buckets[i]; e; e = e->next) uses[n++] = e->last_use;
  qsort(uses, n, sizeof *uses, cmp_u64);
  uint64_t cut = uses[n / 4];
  free(uses);
  for (size_t i = 0; i < nbuckets; i++)
    for (entry_t **pe = &buckets[i]; *pe;) {
      entry_t *e = *pe;
      if (e->last_use < cut) {
        *pe = e->next;
        e->next = *dead;
        *dead = e;
        nentries--;
      } else {
        pe = &e->next;
      }
    }
}

pj_program_t *pj_cache_insert(const void *key, size_t keylen, pj_program_t *p) {
  const pj_placement_t pl = pj_program_placement(p);
  uint64_t h = pj_placement_hash(&pl, pj_hash_bytes(key, keylen, 0));
  const bool maps_full = over_map_budget();
  pthread_mutex_lock(&lock);
  entry_t *e = find(h, &pl, key, keylen);
  if (e) {
    pthread_mutex_unlock(&lock);
    pj_program_free(p);
    return e->prog;
  }
  if (nentries >= nbuckets) grow();
  e = malloc(sizeof *e + keylen);
  if (!e || !nbuckets) {
    /* Cannot cache: the caller still gets a usable program, leaked deliberately rather than
     * freed under its feet (it is only reachable through this return value). */
    free(e);
    pthread_mutex_unlock(&lock);
    return p;
  }
  e->hash = h;
  e->last_use = ++use_clock;
  e->keylen = keylen;
  e->prog = p;
  memcpy(e->key, key, keylen);
  e->next = buckets[h % nbuckets];
  buckets[h % nbuckets] = e;
  nentries++;
  entry_t *dead = NULL;
  if (nentries > cache_max() || (maps_full && nentries >= 16)) {
    evict_oldest(&dead);
    if (maps_full) pj_metric_add(PJ_METRIC_CACHE_MAP_EVICTIONS, 1);
  }
  pthread_mutex_unlock(&lock);
  if (dead) {
    pj_status_free(pj_stream_synchronize(-1)); /* nothing launched may still use them */
    while (dead) {
      entry_t *next = dead->next;
      pj_program_free(dead->prog);
      free(dead);
      dead = next;
    }
  }
  return p;
}

size_t pj_cache_size(void) {
  pthread_mutex_lock(&lock);
  size_t n = nentries;
  pthread_mutex_unlock(&lock);
  return n;
}

void pj_cache_clear(void) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < nbuckets; i++) {
    entry_t *e = buckets[i];
    while (e) {
      entry_t *next = e->next;
      pj_program_free(e->prog);
      free(e);
      e = next;
    }
    buckets[i] = NULL;
  }
  nentries = 0;
  pthread_mutex_unlock(&lock);
}
