#define _POSIX_C_SOURCE 200809L
/* The per-device check state of device-side index checks and its reports (see
 * torch_pjrt/index_checks.h). */
#include "torch_pjrt/index_checks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torch_pjrt/dtype.h"
#include "torch_pjrt/transfer.h"

#define MAX_DEVICES 64

/* One execution with checks: its sites, as one allocation (names and lines copied in). */
typedef struct {
  uint64_t seq; /* 0: unused */
  int n;
  pj_check_site_t *sites; /* strings point into the same block */
} ring_entry_t;

typedef struct {
  struct PJRT_Buffer *state; /* NULL: none (a fresh one is made on first use) */
  /* executions with checks on the device so far: never reset, so sequence numbers stay
   * unique; a fresh state starts its counter ([8]) here */
  uint64_t launched;
  ring_entry_t *ring; /* PJ_CHECK_RING entries, made on first use, kept for the process */
} device_checks_t;

/* g_lock guards g_dev; g_dirty[d] (atomic, so a report with nothing to read takes no lock) is
 * set by a release and cleared by the report that takes the state. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static device_checks_t g_dev[MAX_DEVICES];
static atomic_bool g_dirty[MAX_DEVICES];

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static atomic_bool g_enabled = true;
static void read_env(void) {
  const char *v = getenv("TORCH_PJRT_CHECK_BOUNDS");
  atomic_store(&g_enabled, !(v && (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off"))));
}

bool pj_checks_enabled(void) {
  pthread_once(&g_env_once, read_env);
  return atomic_load(&g_enabled);
}

void pj_checks_set_enabled(bool on) {
  pthread_once(&g_env_once, read_env);
  atomic_store(&g_enabled, on);
}

pj_status_t *pj_checks_acquire(int device, struct PJRT_Buffer **state) {
  *state = NULL;
  pthread_mutex_lock(&g_lock);
  if (device < 0 || device >= MAX_DEVICES)
    return pj_status_new(PJ_ERR_RUNTIME, "index checks: device %d out of range", device);
  device_checks_t *d = &g_dev[device];
  if (!d->state) {
    int64_t fresh[PJ_CHECK_STATE_LEN] = {0}, n = PJ_CHECK_STATE_LEN;
    fresh[8] = (int64_t)d->launched;
    pj_status_t *st = pj_transfer_to_device(device, fresh, PJ_I64, &n, 1, &d->state);
    if (st) {
      d->state = NULL;
      return st;
    }
  }
  *state = d->state;
  return NULL;
}

/* Copies sites into one block: the entry owns it. */
static pj_check_site_t *copy_sites(const pj_check_site_t *sites, int n) {
  size_t bytes = sizeof(pj_check_site_t) * (size_t)n;
  for (int i = 0; i < n; i++)
    bytes += strlen(sites[i].op ? sites[i].op : "") + strlen(sites[i].where ? sites[i].where : "") + 2;
  pj_check_site_t *out = malloc(bytes ? bytes : 1);
  if (!out) return NULL;
  char *p = (char *)(out + n);
  for (int i = 0; i < n; i++) {
    out[i].op_index = sites[i].op_index;
    const char *op = sites[i].op ? sites[i].op : "", *where = sites[i].where ? sites[i].where : "";
    size_t a = strlen(op) + 1, b = strlen(where) + 1;
    memcpy(p, op, a);
    out[i].op = p;
    p += a;
    memcpy(p, where, b);
    out[i].where = p;
    p += b;
  }
  return out;
}

void pj_checks_release(int device, struct PJRT_Buffer *new_state, const pj_check_site_t *sites,
                       int nsites) {
  if (device < 0 || device >= MAX_DEVICES) {
    pthread_mutex_unlock(&g_lock);
    return;
  }
  device_checks_t *d = &g_dev[device];
  /* the donated buffer's handle is destroyed in either case (its memory went to the launch) */
  if (d->state) pj_buffer_destroy(d->state);
  d->state = new_state;
  if (!new_state) { /* the launch failed: the state it held (and its failures) is gone */
    pthread_mutex_unlock(&g_lock);
    return;
  }
  uint64_t seq = ++d->launched;
  if (!d->ring) d->ring = calloc(PJ_CHECK_RING, sizeof *d->ring);
  if (d->ring) { /* without it a failure is reported without its line */
    ring_entry_t *e = &d->ring[seq % PJ_CHECK_RING];
    free(e->sites);
    e->sites = copy_sites(sites, nsites);
    e->n = e->sites ? nsites : 0;
    e->seq = seq;
  }
  atomic_store(&g_dirty[device], true);
  pthread_mutex_unlock(&g_lock);
}

/* CPU's exception and message for a failed check: its code, the text in buf. */
static pj_code_t cpu_error(const int64_t *s, char *buf, size_t cap) {
  long long v = (long long)s[4], dim = (long long)s[5], size = (long long)s[6], pos = (long long)s[7];
  switch ((pj_check_kind_t)s[3]) {
    case PJ_CHECK_DIM:
    case PJ_CHECK_DIM_RUNTIME:
      snprintf(buf, cap, "index %lld is out of bounds for dimension %lld with size %lld", v, dim,
               size);
      return s[3] == PJ_CHECK_DIM ? PJ_ERR_INDEX : PJ_ERR_RUNTIME;
    case PJ_CHECK_SELF: snprintf(buf, cap, "index out of range in self"); return PJ_ERR_INDEX;
    case PJ_CHECK_INDEX_COPY:
      snprintf(buf, cap, "index_copy_(): index %lld is out of bounds for dimension %lld with size "
               "%lld", v, dim, size);
      return PJ_ERR_INDEX;
    case PJ_CHECK_TAKE:
      snprintf(buf, cap, "out of range: tried to access index %lld on a tensor of %lld elements.",
               v, size);
      return PJ_ERR_INDEX;
    case PJ_CHECK_TARGET: snprintf(buf, cap, "Target %lld is out of bounds.", v); return PJ_ERR_INDEX;
    case PJ_CHECK_EMBEDDING_BAG:
      snprintf(buf, cap, "Index %lld of input takes value %lld which is not in the valid range "
               "[0, %lld)", pos, v, size);
      return PJ_ERR_RUNTIME;
    case PJ_CHECK_MASKED_SCATTER:
      snprintf(buf, cap, "Number of elements of source < number of ones in mask");
      return PJ_ERR_RUNTIME;
    case PJ_CHECK_DATA_BOUNDS:
      snprintf(buf, cap, "INDICES element is out of DATA bounds, id=%lld axis_dim=%lld", v, size);
      return PJ_ERR_RUNTIME;
    default:
      snprintf(buf, cap, "index %lld is out of range (check kind %lld)", v, (long long)s[3]);
      return PJ_ERR_RUNTIME;
  }
}

/* Reads the device's state outside the lock (the transfer waits for the checking executions).
 * A clean state is put back for the next launches (no upload of a fresh one per sync) unless
 * a launch made a new one meanwhile; a failed one is dropped, so the error is raised once. */
static pj_status_t *report_one(int device) {
  if (!atomic_load(&g_dirty[device])) return NULL;
  pthread_mutex_lock(&g_lock);
  device_checks_t *d = &g_dev[device];
  struct PJRT_Buffer *state = d->state;
  /* Invariant: the state's counter ([8]) is the host's count of the launches that produced it
   * (a fresh state starts at d->launched; each launch adds one on both sides). */
  const uint64_t launched = d->launched;
  d->state = NULL;
  atomic_store(&g_dirty[device], false);
  pthread_mutex_unlock(&g_lock);
  if (!state) return NULL;
  int64_t s[PJ_CHECK_STATE_LEN];
  pj_status_t *st = pj_transfer_to_host(state, s, sizeof s);
  if (st) {
    pj_buffer_destroy(state);
    return pj_status_wrap(st, "reading the device-side index checks: ");
  }
  char msg[256], op[64] = "", where[512] = "";
  bool named = false;
  pj_code_t code = PJ_OK;
  if (s[0]) code = cpu_error(s, msg, sizeof msg);
  /* Should the counts ever disagree, the ring could name another execution's op: the state is
   * then not reused (the next launch starts a fresh one at the host's count) and a failure is
   * reported without a name rather than with a wrong one. */
  const bool aligned = (uint64_t)s[8] == launched;
  pthread_mutex_lock(&g_lock);
  if (!s[0] && !d->state && aligned) {
    d->state = state; /* clean: reused */
    state = NULL;
  } else if (s[0] && aligned) {
    const uint64_t seq = (uint64_t)s[1];
    const ring_entry_t *e = d->ring ? &d->ring[seq % PJ_CHECK_RING] : NULL;
    for (int i = 0; e && e->seq == seq && i < e->n; i++)
      if (e->sites[i].op_index == (int)s[2]) {
        snprintf(op, sizeof op, "%s", e->sites[i].op);
        snprintf(where, sizeof where, "%s", e->sites[i].where);
        named = true;
      }
  }
  pthread_mutex_unlock(&g_lock);
  if (state) pj_buffer_destroy(state);
  if (!s[0]) return NULL;
  if (named)
    return pj_status_new(code, "%s\n(device-side index check of aten::%s%s, reported at the "
                         "next synchronization; TORCH_PJRT_CHECK_BOUNDS=0 turns the checks off)",
                         msg, op, where);
  return pj_status_new(code, "%s\n(device-side index check, reported at the next "
                       "synchronization; %s)", msg,
                       aligned ? "the op is too far back to name"
                               : "the op can not be named: the check counts disagree");
}

pj_status_t *pj_checks_report(int device) {
  if (device >= MAX_DEVICES) return NULL;
  if (device >= 0) return report_one(device);
  pj_status_t *first = NULL;
  for (int i = 0; i < MAX_DEVICES; i++) {
    pj_status_t *st = report_one(i);
    if (!first) first = st;
    else pj_status_free(st);
  }
  return first;
}
