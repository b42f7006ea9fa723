#define _POSIX_C_SOURCE 200809L
/* Completion tracking behind torch.tpu.synchronize(), Stream and Event.
 *
 * Every execution's device-complete event is tracked as an entry with a per-device sequence
 * number. PJRT_Event_OnReady calls back (on a plugin thread, or inline when the event is already
 * ready) and the callback timestamps the completion with CLOCK_MONOTONIC. A marker recorded at
 * sequence S covers the entries with seq <= S that were still pending at record time; it counts
 * them down as they complete and takes its time from the one that completes last.
 *
 * Locking: one process-wide mutex `g_lock` guards every field below and every entry/marker's
 * mutable fields; `g_done` is broadcast on each completion. Contention is low (one lock/unlock
 * per execution and per completion), so per-device locks are not worth the complexity.
 * PJRT calls (OnReady, Event_Destroy, Error_*) are never made while holding g_lock: OnReady may
 * run the callback inline, and the callback takes g_lock.
 *
 * Entry lifetime: an entry belongs to its pending callback until the callback moves it to the
 * `g_reap` list; the PJRT event is destroyed (and the entry freed) later on a caller's thread
 * by reap(), never inside the callback, because destroying an event from its own ready callback
 * is not promised to be safe by the C API. Each track/record/synchronize reaps, so the number of
 * completed-but-unreaped entries stays bounded by the executions between two such calls. */
#include "torch_pjrt/stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_check.h"
#include "torch_pjrt/exec_profile.h"
#include "torch_pjrt/runtime.h"

#define PJ_STREAM_MAX_DEVICES 64

typedef struct entry {
  PJRT_Event *ev;
  int device;
  uint64_t seq;
  int64_t issued_ns;                    /* profiled entries only (label[0] != 0) */
  char label[PJ_EXEC_PROFILE_LABEL];    /* "" when the execution is not profiled */
  struct entry *next; /* reap list link, once complete */
} entry_t;

struct pj_marker {
  int device;
  uint64_t seq;          /* covers entries with seq <= this */
  int64_t remaining;     /* covered entries not yet complete */
  int64_t done_ns;       /* valid once remaining == 0 */
  pj_status_t *error;    /* copy of the first error among covered entries, owned */
  bool listed;           /* in the device's marker list (only while remaining > 0) */
  struct pj_marker *prev, *next;
};

typedef struct {
  uint64_t seq;            /* last sequence number handed out */
  int64_t pending;         /* tracked entries not yet complete */
  pj_marker_t *markers;    /* incomplete markers, any order */
  pj_status_t *error;      /* first device error since the last synchronize, owned */
} device_state_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;
static device_state_t g_dev[PJ_STREAM_MAX_DEVICES];
static entry_t *g_reap; /* completed entries whose events still need destroying */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool valid_device(int device) { return device >= 0 && device < PJ_STREAM_MAX_DEVICES; }

static pj_status_t *copy_status(const pj_status_t *st) {
  return pj_status_new(pj_status_code(st), "%s", pj_status_message(st));
}

static void destroy_event(PJRT_Event *ev) {
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  if (st) { /* unreachable in practice: an event implies a live runtime */
    pj_status_free(st);
    return;
  }
  PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = ev};
  pj_status_free(pj_runtime_take_error(rt, pj_runtime_api(rt)->PJRT_Event_Destroy(&d),
                                       "destroy event"));
}

/* Destroys the events of completed entries. Called without g_lock. */
static void reap(void) {
  pthread_mutex_lock(&g_lock);
  entry_t *list = g_reap;
  g_reap = NULL;
  pthread_mutex_unlock(&g_lock);
  while (list) {
    entry_t *next = list->next;
    destroy_event(list->ev);
    free(list);
    list = next;
  }
}

static void unlist_marker_locked(pj_marker_t *m) {
  if (!m->listed) return;
  device_state_t *d = &g_dev[m->device];
  if (m->prev) m->prev->next = m->next; else d->markers = m->next;
  if (m->next) m->next->prev = m->prev;
  m->listed = false;
}

/* Keeps err (owned, may be NULL) as the device's first error since the last synchronize.
 * Caller holds g_lock. */
static void keep_first_error_locked(device_state_t *d, pj_status_t *err) {
  if (!err) return;
  if (!d->error) d->error = err; else pj_status_free(err);
}

/* Marks `e` complete at time t with error `err` (owned, may be NULL). Caller holds g_lock. */
static void complete_locked(entry_t *e, int64_t t, pj_status_t *err) {
  device_state_t *d = &g_dev[e->device];
  d->pending--;
  for (pj_marker_t *m = d->markers, *next; m; m = next) {
    next = m->next;
    if (m->seq < e->seq) continue;
    if (err && !m->error) m->error = copy_status(err);
    if (--m->remaining == 0) {
      m->done_ns = t;
      unlist_marker_locked(m);
    }
  }
  keep_first_error_locked(d, err);
  e->next = g_reap;
  g_reap = e;
  pthread_cond_broadcast(&g_done);
}

/* PJRT_Event_OnReady callback: owns `error`; must not touch `arg` after releasing g_lock. */
static void on_ready(PJRT_Error *error, void *arg) {
  int64_t t = now_ns();
  entry_t *e = arg;
  if (e->label[0]) pj_exec_profile_record(e->device, e->label, e->issued_ns, t);
  pj_status_t *err = NULL;
  if (error) {
    pj_runtime_t *rt;
    pj_status_t *st = pj_runtime_get(&rt);
    if (st) err = st; /* cannot destroy the error without the api; leak it rather than crash */
    else err = pj_runtime_take_error(rt, error, "device execution");
  }
  pthread_mutex_lock(&g_lock);
  complete_locked((entry_t *)arg, t, err);
  pthread_mutex_unlock(&g_lock);
}

void pj_stream_track(int device, PJRT_Event *ev) { pj_stream_track_timed(device, ev, 0, NULL); }

void pj_stream_track_timed(int device, PJRT_Event *ev, int64_t issued_ns, const char *label) {
  if (!ev) return;
  reap();
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  if (st) { /* no runtime means no event could exist; nothing to track */
    pj_status_free(st);
    return;
  }
  const PJRT_Api *api = pj_runtime_api(rt);
  /* Fast path: the CPU client runs cheap programs inline, so the event is often ready already.
   * Then it is completed and destroyed here: no entry, no callback registration. Its sequence
   * number is still taken, so the markers' counting is the same as for a tracked entry that
   * completed at once. */
  if (valid_device(device) && PJ_API_HAS(api, PJRT_Event_IsReady) &&
      PJ_API_HAS(api, PJRT_Event_Error)) {
    PJRT_Event_IsReady_Args r = {.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE, .event = ev};
    PJRT_Error *rerr = api->PJRT_Event_IsReady(&r);
    if (!rerr && r.is_ready) {
      PJRT_Event_Error_Args ea = {.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE, .event = ev};
      PJRT_Error *failed = api->PJRT_Event_Error(&ea);
      pj_status_t *err = failed ? pj_runtime_take_error(rt, failed, "device execution") : NULL;
      destroy_event(ev);
      if (label) pj_exec_profile_record(device, label, issued_ns, now_ns());
      pthread_mutex_lock(&g_lock);
      device_state_t *d = &g_dev[device];
      ++d->seq;
      keep_first_error_locked(d, err);
      pthread_mutex_unlock(&g_lock);
      return;
    }
    if (rerr) pj_status_free(pj_runtime_take_error(rt, rerr, "event is ready"));
  }
  entry_t *e = calloc(1, sizeof *e);
  if (!e || !valid_device(device)) {
    /* Cannot track: order the host after the execution instead, so synchronize() stays
     * truthful (it only ever waits for tracked work). */
    free(e);
    PJRT_Event_Await_Args a = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = ev};
    pj_status_free(pj_runtime_take_error(rt, api->PJRT_Event_Await(&a), "device execution"));
    destroy_event(ev);
    if (label) pj_exec_profile_record(device, label, issued_ns, now_ns());
    return;
  }
  e->ev = ev;
  e->device = device;
  if (label) {
    e->issued_ns = issued_ns;
    strncpy(e->label, label[0] ? label : "eager", PJ_EXEC_PROFILE_LABEL - 1);
  }
  pthread_mutex_lock(&g_lock);
  device_state_t *d = &g_dev[device];
  e->seq = ++d->seq;
  d->pending++;
  pthread_mutex_unlock(&g_lock);

  PJRT_Event_OnReady_Args o = {.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE,
                               .event = ev,
                               .callback = on_ready,
                               .user_arg = e};
  pj_status_t *reg = PJ_API_HAS(api, PJRT_Event_OnReady)
                         ? pj_runtime_take_error(rt, api->PJRT_Event_OnReady(&o), "on ready")
                         : pj_status_new(PJ_ERR_PLUGIN, "no PJRT_Event_OnReady");
  if (reg) {
    /* No callback will come: wait here and complete the entry ourselves. */
    pj_status_free(reg);
    PJRT_Event_Await_Args a = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = ev};
    pj_status_t *err = pj_runtime_take_error(rt, api->PJRT_Event_Await(&a), "device execution");
    int64_t t = now_ns();
    if (e->label[0]) pj_exec_profile_record(e->device, e->label, e->issued_ns, t);
    pthread_mutex_lock(&g_lock);
    complete_locked(e, t, err);
    pthread_mutex_unlock(&g_lock);
  }
}

/* Snapshot of the entries pending on `device` now. Caller holds g_lock. */
static void init_marker_locked(pj_marker_t *m, int device) {
  device_state_t *d = &g_dev[device];
  m->device = device;
  m->seq = d->seq;
  m->remaining = d->pending;
  if (m->remaining == 0) {
    m->done_ns = now_ns();
    return;
  }
  m->listed = true;
  m->prev = NULL;
  m->next = d->markers;
  if (d->markers) d->markers->prev = m;
  d->markers = m;
}

pj_status_t *pj_marker_record(int device, pj_marker_t **out) {
  if (!valid_device(device))
    return pj_status_new(PJ_ERR_INDEX, "device index %d out of range for markers", device);
  reap();
  pj_marker_t *m = calloc(1, sizeof *m);
  if (!m) return pj_status_new(PJ_ERR_OOM, "out of host memory recording an event");
  pthread_mutex_lock(&g_lock);
  init_marker_locked(m, device);
  pthread_mutex_unlock(&g_lock);
  *out = m;
  return NULL;
}

bool pj_marker_query(pj_marker_t *m) {
  pthread_mutex_lock(&g_lock);
  bool done = m->remaining == 0;
  pthread_mutex_unlock(&g_lock);
  return done;
}

pj_status_t *pj_marker_wait(pj_marker_t *m) {
  pthread_mutex_lock(&g_lock);
  while (m->remaining > 0) pthread_cond_wait(&g_done, &g_lock);
  pj_status_t *err = m->error ? copy_status(m->error) : NULL;
  pthread_mutex_unlock(&g_lock);
  reap();
  return err;
}

pj_status_t *pj_marker_time_ns(pj_marker_t *m, int64_t *out) {
  PJ_TRY(pj_marker_wait(m));
  pthread_mutex_lock(&g_lock);
  *out = m->done_ns;
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

void pj_marker_free(pj_marker_t *m) {
  if (!m) return;
  pthread_mutex_lock(&g_lock);
  unlist_marker_locked(m);
  pthread_mutex_unlock(&g_lock);
  pj_status_free(m->error);
  free(m);
}

/* Waits for the device's currently tracked entries (not ones tracked by other threads while
 * waiting, which could starve us) and hands back the device's sticky error. */
static pj_status_t *synchronize_one(int device) {
  pj_marker_t m = {0};
  pthread_mutex_lock(&g_lock);
  init_marker_locked(&m, device);
  while (m.remaining > 0) pthread_cond_wait(&g_done, &g_lock);
  pj_status_t *err = g_dev[device].error;
  g_dev[device].error = NULL;
  pthread_mutex_unlock(&g_lock);
  pj_status_free(m.error); /* the device error covers it */
  return err;
}

pj_status_t *pj_stream_synchronize(int device) {
  if (device >= PJ_STREAM_MAX_DEVICES)
    return pj_status_new(PJ_ERR_INDEX, "device index %d out of range for synchronize", device);
  pj_status_t *first = NULL;
  int lo = device < 0 ? 0 : device, hi = device < 0 ? PJ_STREAM_MAX_DEVICES : device + 1;
  for (int i = lo; i < hi; i++) {
    pj_status_t *st = synchronize_one(i);
    if (!first) first = st; else pj_status_free(st);
  }
  reap();
  return first;
}

int64_t pj_stream_pending(int device) {
  int64_t n = 0;
  pthread_mutex_lock(&g_lock);
  if (device < 0) {
    for (int i = 0; i < PJ_STREAM_MAX_DEVICES; i++) n += g_dev[i].pending;
  } else if (valid_device(device)) {
    n = g_dev[device].pending;
  }
  pthread_mutex_unlock(&g_lock);
  return n;
}
