/* Execution timeline records (see exec_profile.h). */
#include "torch_pjrt/exec_profile.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_bool g_enabled;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pj_exec_record_t *g_records; /* guarded by g_lock */
static size_t g_count, g_cap;
static uint64_t g_dropped;
static _Thread_local char t_label[PJ_EXEC_PROFILE_LABEL];

void pj_exec_profile_enable(bool on) {
  pthread_mutex_lock(&g_lock);
  if (on) {
    g_count = 0;
    g_dropped = 0;
  }
  atomic_store_explicit(&g_enabled, on, memory_order_relaxed);
  pthread_mutex_unlock(&g_lock);
}

bool pj_exec_profile_enabled(void) {
  return atomic_load_explicit(&g_enabled, memory_order_relaxed);
}

void pj_exec_profile_label(const char *label) {
  if (!label) label = "";
  strncpy(t_label, label, PJ_EXEC_PROFILE_LABEL - 1);
  t_label[PJ_EXEC_PROFILE_LABEL - 1] = '\0';
}

const char *pj_exec_profile_current_label(void) { return t_label[0] ? t_label : "eager"; }

void pj_exec_profile_record(int device, const char *label, int64_t issued_ns, int64_t done_ns) {
  pthread_mutex_lock(&g_lock);
  if (g_count == g_cap && g_cap < PJ_EXEC_PROFILE_MAX) {
    size_t cap = g_cap ? g_cap * 2 : 1024;
    if (cap > PJ_EXEC_PROFILE_MAX) cap = PJ_EXEC_PROFILE_MAX;
    pj_exec_record_t *grown = realloc(g_records, cap * sizeof *grown);
    if (grown) {
      g_records = grown;
      g_cap = cap;
    }
  }
  if (g_count < g_cap) {
    pj_exec_record_t *r = &g_records[g_count++];
    r->device = device;
    strncpy(r->label, label ? label : "eager", PJ_EXEC_PROFILE_LABEL - 1);
    r->label[PJ_EXEC_PROFILE_LABEL - 1] = '\0';
    r->issued_ns = issued_ns;
    r->done_ns = done_ns;
  } else {
    g_dropped++;
  }
  pthread_mutex_unlock(&g_lock);
}

pj_exec_record_t *pj_exec_profile_take(size_t *n, uint64_t *dropped) {
  pthread_mutex_lock(&g_lock);
  pj_exec_record_t *out = NULL;
  *n = 0;
  if (g_count) {
    out = malloc(g_count * sizeof *out);
    if (out) {
      memcpy(out, g_records, g_count * sizeof *out);
      *n = g_count;
    } else {
      g_dropped += g_count;
    }
    g_count = 0;
  }
  *dropped = g_dropped;
  g_dropped = 0;
  pthread_mutex_unlock(&g_lock);
  return out;
}
