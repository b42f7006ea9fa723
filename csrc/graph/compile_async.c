/* The background compile pool (compile_async.h). Jobs live in one list (few at a time: a
 * pending graph holds at most TORCH_PJRT_DEFER_MAX_OPS ops) and are found by hash, then key. */
#define _POSIX_C_SOURCE 200809L
#include "torch_pjrt/compile_async.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "torch_pjrt/disk_cache.h"

#define MAX_THREADS 16

typedef struct job {
  struct job *next;     /* in `jobs` (every job not yet taken) */
  struct job *queued;   /* in the queue of jobs no worker has started */
  uint64_t hash;
  size_t keylen;
  unsigned char *key;
  char *text;           /* freed once compiled */
  size_t textlen;
  char *what;
  bool done;
  bool taken;           /* unlinked by a taker; freed by the last thread waiting on it */
  int waiters;          /* takers waiting for it to finish */
  pj_program_t *prog;   /* done: the program, or NULL with st */
  pj_status_t *st;
} job_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER; /* a job was queued */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* a job finished */
static job_t *jobs;
static job_t *queue_head, *queue_tail;
static int busy;        /* jobs being compiled */
static int started;     /* worker threads running */
static int wanted = -1; /* thread count; -1 until read from the environment */

static int default_threads(void) {
  const char *v = getenv("TORCH_PJRT_COMPILE_THREADS");
  if (v && *v) {
    long n = strtol(v, NULL, 10);
    return n < 0 ? 0 : n > MAX_THREADS ? MAX_THREADS : (int)n;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus < 1 ? 1 : cpus > 4 ? 4 : (int)cpus;
}

int pj_async_compile_threads(void) {
  pthread_mutex_lock(&mu);
  if (wanted < 0) wanted = default_threads();
  int n = wanted;
  pthread_mutex_unlock(&mu);
  return n;
}

bool pj_async_compile_enabled(void) { return pj_async_compile_threads() > 0; }

void pj_async_compile_set_threads(int n) {
  pthread_mutex_lock(&mu);
  wanted = n < 0 ? 0 : n > MAX_THREADS ? MAX_THREADS : n;
  pthread_mutex_unlock(&mu);
}

static void job_free(job_t *j) {
  free(j->key);
  free(j->text);
  free(j->what);
  free(j);
}

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!queue_head) pthread_cond_wait(&work_cv, &mu);
    job_t *j = queue_head;
    queue_head = j->queued;
    if (!queue_head) queue_tail = NULL;
    busy++;
    pthread_mutex_unlock(&mu);

    pj_program_t *p = NULL;
    pj_status_t *st = pj_program_compile(j->text, j->textlen, &p);
    if (st && getenv("TORCH_PJRT_DUMP_ON_ERROR"))
      st = pj_status_wrap(st, "program:\n%s\n", j->text);
    if (st && j->what) st = pj_status_wrap(st, "%s: ", j->what);
    if (!st) pj_disk_cache_store(j->key, j->keylen, p);
    free(j->text);
    j->text = NULL;

    pthread_mutex_lock(&mu);
    j->prog = p;
    j->st = st;
    j->done = true;
    busy--;
    pthread_cond_broadcast(&done_cv);
  }
  return NULL;
}

static job_t *find(uint64_t hash, const unsigned char *key, size_t keylen, job_t ***link) {
  for (job_t **l = &jobs; *l; l = &(*l)->next) {
    job_t *j = *l;
    if (j->hash == hash && j->keylen == keylen && memcmp(j->key, key, keylen) == 0) {
      if (link) *link = l;
      return j;
    }
  }
  return NULL;
}

/* At exit: jobs no worker has started are dropped (nobody can run their calls any more) and
 * the compiles in progress are waited for, so no worker is inside the compiler while the
 * process's static destructors run. */
static void at_exit(void) {
  pthread_mutex_lock(&mu);
  wanted = 0;
  for (job_t *j = queue_head; j; j = j->queued) {
    j->done = true;
    j->st = pj_status_new(PJ_ERR_RUNTIME, "the process is exiting");
  }
  queue_head = queue_tail = NULL;
  while (busy > 0) pthread_cond_wait(&done_cv, &mu);
  pthread_mutex_unlock(&mu);
}
/* In a child forked while workers existed: none of them survived the fork, and the mutex may
 * have been held by one of them. The child starts with an empty pool (the runtime refuses the
 * child's ops anyway; this keeps it from hanging on the way there). Jobs are leaked. */
static void on_fork_child(void) {
  pthread_mutex_init(&mu, NULL);
  pthread_cond_init(&work_cv, NULL);
  pthread_cond_init(&done_cv, NULL);
  jobs = queue_head = queue_tail = NULL;
  busy = started = 0;
}
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void install_at_exit(void) {
  atexit(at_exit);
  pthread_atfork(NULL, NULL, on_fork_child);
}

pj_status_t *pj_async_compile_submit(uint64_t hash, const unsigned char *key, size_t keylen,
                                     char *text, size_t textlen, const char *what) {
  job_t *j = calloc(1, sizeof *j);
  if (j) {
    j->key = malloc(keylen ? keylen : 1);
    j->what = what ? strdup(what) : NULL;
  }
  if (!j || !j->key || (what && !j->what)) {
    if (j) job_free(j);
    free(text);
    return pj_status_new(PJ_ERR_OOM, "out of host memory queueing a compile");
  }
  memcpy(j->key, key, keylen);
  j->keylen = keylen;
  j->hash = hash;
  j->text = text;
  j->textlen = textlen;
  pthread_once(&exit_once, install_at_exit);
  pthread_mutex_lock(&mu);
  if (wanted < 0) wanted = default_threads();
  /* One more worker when every started one has work: jobs never wait behind a busy thread
   * while the count allows another. */
  int queued = 0;
  for (job_t *q = queue_head; q; q = q->queued) queued++;
  if (started < wanted && started < busy + queued + 1) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, worker, NULL) == 0) started++;
    pthread_attr_destroy(&attr);
  }
  if (started == 0) {
    pthread_mutex_unlock(&mu);
    job_free(j);
    return pj_status_new(PJ_ERR_RUNTIME, "no compile thread could start");
  }
  j->next = jobs;
  jobs = j;
  if (queue_tail) queue_tail->queued = j;
  else queue_head = j;
  queue_tail = j;
  pthread_cond_signal(&work_cv);
  pthread_mutex_unlock(&mu);
  return NULL;
}

bool pj_async_compile_pending(uint64_t hash, const unsigned char *key, size_t keylen) {
  pthread_mutex_lock(&mu);
  bool found = find(hash, key, keylen, NULL) != NULL;
  pthread_mutex_unlock(&mu);
  return found;
}

pj_status_t *pj_async_compile_take(uint64_t hash, const unsigned char *key, size_t keylen,
                                   bool *found, pj_program_t **out) {
  *out = NULL;
  pthread_mutex_lock(&mu);
  job_t **link = NULL;
  job_t *j = find(hash, key, keylen, &link);
  *found = j != NULL;
  if (!j) {
    pthread_mutex_unlock(&mu);
    return NULL;
  }
  j->waiters++;
  while (!j->done) pthread_cond_wait(&done_cv, &mu);
  j->waiters--;
  pj_status_t *st = NULL;
  if (!j->taken) { /* the first taker unlinks it and gets its program or error */
    j->taken = true;
    for (link = &jobs; *link != j; link = &(*link)->next) {
    }
    *link = j->next;
    st = j->st;
    *out = j->prog;
    j->st = NULL;
  } /* else another thread took it: its program is in the memory cache (or its error went
       there): *out stays NULL */
  const bool last = j->waiters == 0;
  pthread_mutex_unlock(&mu);
  if (last) job_free(j);
  return st;
}

void pj_async_compile_wait_idle(void) {
  pthread_mutex_lock(&mu);
  while (queue_head || busy > 0) pthread_cond_wait(&done_cv, &mu);
  pthread_mutex_unlock(&mu);
}
