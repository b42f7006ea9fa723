/* In-memory executable cache: an open hash table keyed by the full key bytes. Guarded by
 * `lock` because PyTorch may dispatch from several threads. Entries live until
 * pj_cache_clear (programs are small next to the tensors they compute). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "torch_pjrt/exec.h"
#include "torch_pjrt/metrics.h"

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  size_t keylen;
  pj_program_t *prog;
  unsigned char key[];
} entry_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t **buckets;
static size_t nbuckets, nentries;

uint64_t pj_hash_bytes(const void *data, size_t len, uint64_t seed) {
  /* FNV-1a, 64-bit: fast enough for keys of a few hundred bytes, and deterministic across
   * processes (the persistent cache relies on that). */
  const unsigned char *p = data;
  uint64_t h = 1469598103934665603ull ^ seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static entry_t *find(uint64_t h, const void *key, size_t keylen) {
  if (!nbuckets) return NULL;
  for (entry_t *e = buckets[h % nbuckets]; e; e = e->next)
    if (e->hash == h && e->keylen == keylen && memcmp(e->key, key, keylen) == 0) return e;
  return NULL;
}

pj_program_t *pj_cache_lookup(const void *key, size_t keylen) {
  uint64_t h = pj_hash_bytes(key, keylen, 0);
  pthread_mutex_lock(&lock);
  entry_t *e = find(h, key, keylen);
  pthread_mutex_unlock(&lock);
  pj_metric_add(e ? PJ_METRIC_CACHE_HITS : PJ_METRIC_CACHE_MISSES, 1);
  return e ? e->prog : NULL;
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

pj_program_t *pj_cache_insert(const void *key, size_t keylen, pj_program_t *p) {
  uint64_t h = pj_hash_bytes(key, keylen, 0);
  pthread_mutex_lock(&lock);
  entry_t *e = find(h, key, keylen);
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
  e->keylen = keylen;
  e->prog = p;
  memcpy(e->key, key, keylen);
  e->next = buckets[h % nbuckets];
  buckets[h % nbuckets] = e;
  nentries++;
  pthread_mutex_unlock(&lock);
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
