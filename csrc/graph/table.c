/* Op name -> lowering: a hash table built once from the family tables. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../ops/table.h"
#include "torch_pjrt/exec.h"

#define TABLE_SIZE 4096 /* power of two, well above the number of lowerings */

static const pj_lowering_entry_t *slots[TABLE_SIZE];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const pj_lowering_entry_t *const kFamilies[] = {
#define PJ_FAMILY_PTR(f) pj_lowerings_##f,
    PJ_FAMILIES(PJ_FAMILY_PTR)
#undef PJ_FAMILY_PTR
};

static size_t bucket(const char *name) {
  return (size_t)pj_hash_bytes(name, strlen(name), 0) & (TABLE_SIZE - 1);
}

static void build(void) {
  for (size_t f = 0; f < sizeof kFamilies / sizeof kFamilies[0]; f++)
    for (const pj_lowering_entry_t *e = kFamilies[f]; e->name; e++) {
      size_t b = bucket(e->name);
      while (slots[b] && strcmp(slots[b]->name, e->name) != 0) b = (b + 1) & (TABLE_SIZE - 1);
      if (!slots[b]) slots[b] = e; /* first registration of a name wins */
    }
}

static const pj_lowering_entry_t *find(const char *op) {
  pthread_once(&once, build);
  for (size_t b = bucket(op);; b = (b + 1) & (TABLE_SIZE - 1)) {
    if (!slots[b]) return NULL;
    if (strcmp(slots[b]->name, op) == 0) return slots[b];
  }
}

pj_lower_fn pj_lowering_find(const char *op) {
  const pj_lowering_entry_t *e = find(op);
  return e ? e->fn : NULL;
}

pj_shape_class_t pj_lowering_shape_class(const char *op) {
  const pj_lowering_entry_t *e = find(op);
  return e ? e->shape : PJ_SHAPE_EXACT;
}

void pj_lowering_each(void (*fn)(const char *name, void *user), void *user) {
  pthread_once(&once, build);
  for (size_t b = 0; b < TABLE_SIZE; b++)
    if (slots[b]) fn(slots[b]->name, user);
}
